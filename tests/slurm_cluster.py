"""A real Slurm on this machine for the tests: munged, slurmctld and one or more slurmd (one per simulated node, all
on 127.0.0.1 on ports of their own) from Debian's `slurm-wlm` packages, configured in a temporary directory and
always stopped. `make test` installs the packages (as root, best effort); where they are missing or this is not
root, `start` raises `Unavailable` with the reason, for the tests to skip with.

    python tests/slurm_cluster.py DIR      # start one by hand (Ctrl-C stops it); SLURM_CONF=DIR/slurm.conf

Each slurmd runs under a small reaper of its own (`--reap`): slurmd daemonises every slurmstepd, and a process a
job step leaves behind (srun in a batch script whose shell died first) is handed to the nearest subreaper — the
test process itself, which reaps only between tests. Left a zombie there, it keeps the step's process group alive:
slurmd gives up after 60 s ("Kill task failed") and drains the node."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CPUS_PER_NODE = 8  # declared, not real: jobs side by side on a 2-core machine (config_overrides)
KILL_WAIT_S = 10
CRED_EXPIRE_S = 10


class Unavailable(Exception):
    """Slurm cannot be started here; the message says why."""


def _missing() -> list[str]:
    return [d for d in (*DAEMONS, "sbatch", "srun", "scontrol", "squeue") if shutil.which(d) is None]


def slurm_version() -> tuple[int, ...]:
    """The installed Slurm's release (`scontrol --version`: `slurm 22.05.8`), (0,) where unknown."""
    try:
        out = subprocess.run(["scontrol", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    found = re.search(r"(\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else (0,)


def _plugin_dir() -> str | None:
    for d in ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib/slurm-wlm",
              "/usr/lib64/slurm", "/usr/lib/slurm"):  # fmt: skip
        if os.path.exists(os.path.join(d, "auth_munge.so")):
            return d
    return None


@dataclass
class Cluster:
    root: Path
    nodes: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 30, check: bool = True, **extra: str) -> str:
        res = subprocess.run(list(args), capture_output=True, text=True, env=self.env(**extra), timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for p in sorted(self.root.glob("*.log")):
            out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # slurmstepd processes of jobs still running, and their tasks, are children of no one we hold: end them
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmd = (pid_dir / "cmdline").read_bytes().split(b"\0")
                env = (pid_dir / "environ").read_bytes()
                if (cmd and cmd[0].endswith(b"slurmstepd")) or f"SLURM_CONF={self.conf}".encode() in env:
                    os.kill(int(pid_dir.name), signal.SIGKILL)


def _conf(root: Path, nodes: list[str], ctld_port: int, node_ports: list[int], plugins: str) -> str:
    host = socket.gethostname()
    lines = [
        "ClusterName=bbtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={node_ports[0]}",
        f"PluginDir={plugins}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire: a requeued job waits this long (+1 s) before it may start again (120 s by default)
        f"AuthInfo=socket={root / 'munge.socket'},cred_expire={CRED_EXPIRE_S}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd'}-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # pgid: signals reach the tasks' process group, as proctrack/cgroup signals only the tasks themselves
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        f"KillWait={KILL_WAIT_S}",
        "MinJobAge=600",
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "SlurmctldTimeout=60",
        "MessageTimeout=20",
        "OverTimeLimit=0",
        "SchedulerParameters=sched_interval=1",
        "GresTypes=gpu",
        "DisableRootJobs=NO",
    ]
    for name, port in zip(nodes, node_ports):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={CPUS_PER_NODE} "
                     "RealMemory=1000 Gres=gpu:8 State=UNKNOWN")  # fmt: skip
    lines.append(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"


def start(root: Path, nodes: int = 2, timeout: float = 60) -> Cluster:
    """Start munged, slurmctld and `nodes` slurmd under `root`; wait until every node is idle. Raises Unavailable
    (not root, packages missing) or AssertionError (it would not come up: the logs are in the message)."""
    if os.geteuid() != 0:
        raise Unavailable("a test Slurm needs root (slurmd runs jobs as their user)")
    missing = _missing()
    plugins = _plugin_dir()
    if missing or plugins is None:
        raise Unavailable(f"Slurm is not installed ({', '.join(missing) or 'no auth_munge plugin'} missing): `make "
                          "test` installs Debian's slurmctld, slurmd, slurm-client and munge as root")  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(exist_ok=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    from tests.ports import free_port  # here: this file also runs as a script (--reap), where `tests` is no package

    names = [f"bbn{i}" for i in range(nodes)]
    ports = [free_port() for _ in range(nodes + 1)]
    cluster = Cluster(root, names)
    cluster.conf.write_text(_conf(root, names, ports[0], ports[1:], plugins))
    # GPUs (stand-in device files): jobs may ask for --gpus-per-node as on a GPU cluster
    for n in names:
        (root / "spool" / n).mkdir(exist_ok=True)
        (root / "dev" / n).mkdir(parents=True, exist_ok=True)
        for i in range(8):
            (root / "dev" / n / f"gpu{i}").touch()
    (root / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File={root}/dev/{n}/gpu[0-7]\n" for n in names))
    env = cluster.env()

    def daemon(*cmd: str, reaped: bool = False) -> None:
        argv = [sys.executable, __file__, "--reap", *cmd] if reaped else list(cmd)
        with open(root / f"{Path(cmd[0]).name}-{len(cluster.procs)}.out", "wb") as log:
            cluster.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))  # fmt: skip

    try:
        daemon("munged", "--foreground", "--force", f"--socket={root / 'munge.socket'}", f"--key-file={key}",
               f"--pid-file={root / 'munge' / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
               f"--seed-file={root / 'munge' / 'munged.seed'}")  # fmt: skip
        _wait(lambda: (root / "munge.socket").exists(), 10, "munged's socket", cluster)
        daemon("slurmctld", "-D", "-i", "-f", str(cluster.conf))
        for name in names:
            daemon("slurmd", "-D", "-N", name, "-f", str(cluster.conf), reaped=True)

        def idle() -> bool:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return len(states) == nodes and all(s.startswith("idle") for s in states.values())

        _wait(idle, timeout, "every node to be idle", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ok: object, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(ok) and ok():
            return
        for p in cluster.procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}:\n"
                                     + cluster.log_tail())  # fmt: skip
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}:\n{cluster.log_tail()}")


def reap(argv: list[str]) -> int:
    """Run `argv` as a child subreaper: every orphan below it is waited for at once. SIGTERM and SIGINT are passed
    on; returns when `argv` has ended."""
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    child = subprocess.Popen(argv)
    ended = False

    def forward(sig: int, _frame: object) -> None:
        if not ended:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        if pid == child.pid:
            ended = True
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__" and sys.argv[1:2] == ["--reap"]:
    sys.exit(reap(sys.argv[2:]))
elif __name__ == "__main__":
    c = start(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    print(f"export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    finally:
        c.stop()
