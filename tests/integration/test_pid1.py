"""`blackbox run` as a container's first process (issue 49 item 1), in a PID namespace of its own (`unshare --pid
--fork --mount-proc`, as a pod's container is): it is PID 1, so every orphan of the namespace is handed to it — it
reaps them (no zombie left), passes the kubelet's SIGTERM on to the launcher and exits with the job's code; `blackbox
doctor`'s `init` check says so, and warns where PID 1 is the job's own command. Needs root and unshare; skipped,
saying why, where a PID namespace cannot be made."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import BLACKBOX, job_env, kill_tree

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]

# the job: a shell's background children outlive it (orphans: handed to PID 1), then it counts the zombies left in
# the namespace
ORPHANS = r"""
import os, subprocess, time
for _ in range(8):
    subprocess.run(["sh", "-c", "sleep 0.2 &"])  # the shell exits at once; its sleep is orphaned, and ends soon
time.sleep(3)
zombies = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    zombies.append(entry)
        except OSError:
            pass
print(f"zombies: {len(zombies)}", flush=True)
raise SystemExit(7)
"""

# the job: waits for SIGTERM (a pod deleted: the kubelet signals PID 1), says so and exits 0
TERM = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("job: got SIGTERM", flush=True), sys.exit(0)))
print("job: ready", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module", autouse=True)
def _pid_namespace() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a PID namespace)")
    res = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"a PID namespace cannot be made here: {res.stderr.strip()[:200]}")


def in_namespace(argv: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*UNSHARE, *argv], cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def under_blackbox(code: str, tmp_path: Path) -> list[str]:
    """`blackbox run` of a Python job: what a container's command line would be."""
    return [*BLACKBOX, "run", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c", code]


def finished(argv: list[str], tmp_path: Path) -> tuple[int, str, str]:
    """Run `argv` as PID 1 of a namespace of its own to its end: its exit code, stdout and stderr."""
    proc = in_namespace(argv, tmp_path)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        kill_tree(proc)
    return proc.returncode, out, err


@pytest.mark.timeout(120)
def test_as_pid_1_it_reaps_every_orphan_and_passes_the_jobs_exit_code(tmp_path: Path) -> None:
    code, out, err = finished(under_blackbox(ORPHANS, tmp_path), tmp_path)
    assert "zombies: 0" in out, out + err
    assert code == 7, err[-2000:]


@pytest.mark.timeout(120)
def test_as_pid_1_it_passes_sigterm_on_to_the_launcher(tmp_path: Path) -> None:
    proc = in_namespace(under_blackbox(TERM, tmp_path), tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "job: ready"
        (pid1,) = psutil.Process(proc.pid).children()  # unshare's child: PID 1 inside, blackbox
        assert "blackbox" in " ".join(pid1.cmdline()), pid1.cmdline()
        time.sleep(0.5)
        os.kill(pid1.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert "job: got SIGTERM" in out, out + err
    assert proc.returncode == 0, err[-2000:]


@pytest.mark.timeout(120)
def test_doctor_says_whether_pid_1_reaps(tmp_path: Path) -> None:
    probe = "from blackbox.doctor import check_init; c = check_init(); print(c.status, '|', c.detail)"
    # under blackbox run, PID 1 is blackbox
    _, out, err = finished(under_blackbox(probe, tmp_path), tmp_path)
    assert "ok | PID 1 is `blackbox run`: it reaps" in out, out + err
    # the job's own interpreter as PID 1: a warning, with the fix
    _, out, err = finished([sys.executable, "-c", probe], tmp_path)
    assert out.startswith(f"warn | PID 1 is `{sys.executable} -c from blackbox.doctor"), out + err
    assert "are never reaped" in out, out
