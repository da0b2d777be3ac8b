"""Facts about this node and the job's working tree: hostname, IP addresses, uptime, load, memory, disk, kernel
messages, git state, package versions. May import the stdlib and psutil. Every probe is bounded in time and
never raises."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Any, Optional

import psutil


def hostname() -> str:
    return socket.gethostname()


def ip_addresses() -> list[str]:
    """Non-loopback IPv4 and IPv6 addresses of this node."""
    addrs: list[str] = []
    try:
        for name, entries in sorted(psutil.net_if_addrs().items()):
            if name == "lo":
                continue
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6) and not entry.address.startswith(
                    ("127.", "::1", "fe80")
                ):
                    addrs.append(entry.address.split("%")[0])
    except (OSError, psutil.Error):
        pass
    return addrs


def interfaces() -> dict[str, list[str]]:
    """Each network interface's addresses (`eth0`: ["10.0.0.5"]): what GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name."""
    out: dict[str, list[str]] = {}
    try:
        for name, entries in sorted(psutil.net_if_addrs().items()):
            out[name] = [e.address.split("%")[0] for e in entries if e.family in (socket.AF_INET, socket.AF_INET6)]
    except (OSError, psutil.Error):
        pass
    return out


def resolve(name: str) -> dict[str, Any]:
    """What a host name resolves to here (gloo advertises the address the node's own hostname resolves to): the
    addresses, or why it does not resolve."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return {"name": name, "addresses": [], "error": str(exc)}
    addresses = sorted({str(i[4][0]) for i in infos})
    loopback = bool(addresses) and all(a.startswith("127.") or a == "::1" for a in addresses)
    return {"name": name, "addresses": addresses, "loopback_only": loopback}


@dataclass(frozen=True)
class GitState:
    commit: Optional[str]
    branch: Optional[str]
    dirty: Optional[bool]
    toplevel: Optional[str] = None  # the work tree's root: where the job's files are named from ("seen before")

    def describe(self) -> str:
        if self.commit is None:
            return "not a git work tree"
        dirty = {True: " (dirty)", False: "", None: " (dirty state unknown)"}[self.dirty]
        return f"{self.commit[:12]}{' on ' + self.branch if self.branch else ''}{dirty}"


def _git(cwd: str, *args: str, timeout: float) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(cwd: str, timeout: float = 3.0) -> GitState:
    if shutil.which("git") is None:
        return GitState(None, None, None)
    out = _git(cwd, "rev-parse", "HEAD", "--abbrev-ref", "HEAD", "--show-toplevel", timeout=timeout)
    lines = (out or "").split("\n")
    if len(lines) != 3:
        return GitState(None, None, None)
    commit, branch, toplevel = lines
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no", timeout=timeout)
    return GitState(commit, branch, None if status is None else bool(status), toplevel)


def package_version(name: str) -> Optional[str]:
    """The installed version, read from metadata: never imports the package (torch takes seconds)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_diffstat(cwd: str, timeout: float = 3.0, max_lines: int = 60) -> Optional[str]:
    """`git diff --stat HEAD` of the work tree (what differs from the recorded commit), bounded."""
    if shutil.which("git") is None:
        return None
    out = _git(cwd, "diff", "--stat", "HEAD", timeout=timeout)
    if out is None:
        return None
    lines = out.splitlines()
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], f"... {len(lines) - max_lines} more line(s) ...", lines[-1]]
    return "\n".join(lines)


def system() -> dict[str, Any]:
    """Uptime, load, memory and swap of this node."""
    facts: dict[str, Any] = {}
    try:
        with open("/proc/uptime") as f:
            facts["uptime_s"] = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        facts["uptime_s"] = None
    try:
        facts["loadavg"] = list(os.getloadavg())
    except OSError:
        facts["loadavg"] = None
    facts["cpu_count"] = os.cpu_count()
    try:
        facts["memory"] = psutil.virtual_memory()._asdict()
        facts["swap"] = psutil.swap_memory()._asdict()
    except (OSError, psutil.Error):
        facts["memory"] = facts["swap"] = None
    return facts


def disk_free(path: str) -> dict[str, Any]:
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        return {"path": path, "error": exc.strerror}
    return {"path": path, "total": usage.total, "used": usage.used, "free": usage.free}


# Kernel lines worth a look after a training failure: GPU Xid errors, the OOM killer, hung tasks, segfaults.
_KERNEL_INTEREST = re.compile(
    r"NVRM|Xid|nvidia|out of memory|oom-kill|oom_reaper|Killed process|segfault|hung_task|blocked for more than",
    re.IGNORECASE,
)
DMESG_HINT = "kernel messages need root or kernel.dmesg_restrict=0 (sudo sysctl kernel.dmesg_restrict=0)"


def kernel_messages(timeout: float = 3.0, limit: int = 200) -> tuple[Optional[list[str]], str]:
    """(lines of interest, the last `limit`; None when the kernel log cannot be read, how or why)."""
    exe = shutil.which("dmesg")
    if exe is None:
        return None, "dmesg not found"
    try:
        out = subprocess.run([exe, "--ctime"], capture_output=True, text=True, errors="replace", timeout=timeout,
                             check=False)  # fmt: skip
        if out.returncode != 0:  # busybox dmesg has no --ctime
            out = subprocess.run([exe], capture_output=True, text=True, errors="replace", timeout=timeout,
                                 check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"dmesg failed: {exc}"
    if out.returncode != 0:
        return None, f"dmesg failed: {(out.stderr or out.stdout).strip()[:200]} ({DMESG_HINT})"
    lines = [line for line in out.stdout.splitlines() if _KERNEL_INTEREST.search(line)]
    return lines[-limit:], f"dmesg: {len(lines)} line(s) about GPUs, OOM kills, hung tasks or segfaults"


_PACKAGES_SCRIPT = (
    "import importlib.metadata as m, json, sys\n"
    "d = {}\n"
    "for x in m.distributions():\n"
    "    n = x.metadata['Name']\n"
    "    if n: d.setdefault(n, x.version)\n"
    "print(json.dumps({'python': sys.version.split()[0], 'executable': sys.executable, 'packages': d}))\n"
)


def interpreter_packages(
    python: str, env: dict[str, str], timeout: float = 10.0
) -> tuple[Optional[dict[str, Any]], str]:
    """Installed distributions as seen by the job's own interpreter (`python`, with the job's PATH and
    PYTHONPATH): the job may run in another environment than blackbox. Reads metadata only."""
    names = ("PATH", "PYTHONPATH", "HOME", "VIRTUAL_ENV", "CONDA_PREFIX")
    keep: dict[str, str] = {k: env[k] for k in names if k in env}
    try:
        out = subprocess.run([python, "-c", _PACKAGES_SCRIPT], capture_output=True, text=True, timeout=timeout,
                             env=keep, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run `{python}`: {exc}"
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return None, f"`{python}` did not list its packages (exit code {out.returncode})"
    return (data, f"from `{python}`") if isinstance(data, dict) else (None, "unexpected package listing")
