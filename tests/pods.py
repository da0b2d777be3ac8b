"""Pods made of Linux namespaces on this machine, as a container runtime makes them (issue 49's proof): each pod has
its own PID namespace (the container's command is its PID 1), network namespace (an address on a bridge that joins
the job's pods and the host, where the test's services listen), mount namespace (a hosts file with the operators'
service names, which only the pods resolve; its Secrets mounted) and UTS namespace (its hostname); every process of
it, `kubectl exec`'s too, runs without CAP_SYS_PTRACE under a seccomp filter refusing ptrace and process_vm_readv
(tests/programs/pod_init.py). Needs root, iproute2, unshare and nsenter: `unavailable()` says what is missing."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import PROGRAMS

POD_INIT = PROGRAMS / "pod_init.py"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def unavailable() -> str:
    """Why pods cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root (namespaces, a bridge)"
    missing = [t for t in ("ip", "unshare", "nsenter") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    name = f"bbchk{random.randrange(10**6)}"
    try:
        _ip("link", "add", name, "type", "bridge")
        _ip("link", "del", name)
    except subprocess.CalledProcessError as exc:
        return f"cannot make a bridge here: {exc.stderr.decode(errors='replace').strip()[:200]}"
    return ""


@dataclass
class Pod:
    name: str  # its hostname, and the name the other pods resolve it by
    ip: str
    netns: str
    workdir: Path  # its container's working directory (the image's), on the pod's own disk
    proc: Any = None  # the Popen of its first process (unshare's parent, outside the pod)

    def pid1(self) -> int:
        """The host's pid of the pod's PID 1 (the container's command, once executed)."""
        import psutil

        (first,) = psutil.Process(self.proc.pid).children()
        return int(first.pid)


class Pods:
    """The pods of one job and the bridge between them and the host; torn down on exit."""

    def __init__(self, root: Path, names: list[str], services: tuple[str, ...] = ()) -> None:
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        self.bridge = f"bbpods{tag}"[:15]
        net = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.host_ip = f"{net}.1"
        self.pods = {n: Pod(n, f"{net}.{i + 2}", f"bbpod{tag}-{i}", root / n) for i, n in enumerate(names)}
        self.hosts = root / "hosts"  # what every pod resolves: the pods' names and the services' (on the host)
        lines = ["127.0.0.1 localhost", *(f"{p.ip} {p.name}" for p in self.pods.values()),
                 *(f"{self.host_ip} {s}" for s in services)]  # fmt: skip
        self.hosts.write_text("\n".join(lines) + "\n")

    def __enter__(self) -> Pods:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, pod in enumerate(self.pods.values()):
            pod.workdir.mkdir(parents=True, exist_ok=True)
            outside = f"{self.bridge[:11]}v{i}"
            _ip("netns", "add", pod.netns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", pod.netns)
            _ip("link", "set", outside, "master", self.bridge, "up")
            for args in (("addr", "add", f"{pod.ip}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                         ("link", "set", "lo", "up")):  # fmt: skip
                _ip("-n", pod.netns, *args)
        return self

    def __exit__(self, *exc: object) -> None:
        for pod in self.pods.values():
            if pod.proc is not None and pod.proc.poll() is None:
                self.kill(pod.name)
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", pod.netns)  # its veth goes with it
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.bridge)

    def start(self, name: str, argv: list[str], env: Mapping[str, str], secrets: Mapping[str, Path] = {},
              **popen: Any) -> subprocess.Popen[str]:  # fmt: skip
        """The container's command as the pod's PID 1, in the pod's working directory; `secrets`: mount point ->
        the directory of the Secret's files."""
        pod = self.pods[name]
        init = [sys.executable, str(POD_INIT), "--hostname", name, "--hosts", str(self.hosts),
                *(a for target, source in secrets.items() for a in ("--secret", f"{source}:{target}"))]  # fmt: skip
        cmd = ["ip", "netns", "exec", pod.netns, "unshare", "--pid", "--fork", "--mount-proc", "--uts", "--mount",
               *init, "--", *argv]  # fmt: skip
        pod.proc = subprocess.Popen(cmd, cwd=pod.workdir, env=dict(env), text=True, **popen)
        return pod.proc  # type: ignore[no-any-return]

    def exec(self, name: str, argv: list[str], env: Mapping[str, str], timeout: float = 120
             ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """`kubectl exec POD -- argv`: a new process in the pod's namespaces, under the pod's restrictions, that is
        no descendant of the pod's PID 1."""
        pod = self.pods[name]
        cmd = ["nsenter", "--target", str(pod.pid1()), "--pid", "--mount", "--uts", "--net", f"--wd={pod.workdir}",
               sys.executable, str(POD_INIT), "--exec", "--", *argv]  # fmt: skip
        return subprocess.run(cmd, env=dict(env), capture_output=True, text=True, timeout=timeout)

    def kill(self, name: str) -> None:
        """SIGKILL to the pod's PID 1: the kernel kills every other process of its PID namespace."""
        pod = self.pods[name]
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(pod.pid1(), 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            pod.proc.wait(30)


def in_pod_pid(host_pid: int) -> int:
    """A process's pid as its own PID namespace numbers it (the last of /proc/PID/status's NSpid)."""
    with open(f"/proc/{host_pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {host_pid}")
