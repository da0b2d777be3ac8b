"""A flush is a write (issue 33 item 3): a healthy 2-rank DDP job whose rank 0 saves a checkpoint and then spends
longer than its stall timeout in `fsync` while a slow disk takes its pages (a filesystem on a loop device
whose writes the blkio cgroup holds to 4 MB/s) must not be called a stall: blackbox counts the device's sectors
written while the rank is inside the flush. And waking is not writing: a rank whose buffered write the kernel holds
in balance_dirty_pages while its disk takes nothing (the blkio root group holds the device to 1 byte a second, the
flusher's writes too; its bdi is strictly limited to 16 MB of dirty pages) is woken every 200 ms, yet is a stall.
Needs root, losetup, mkfs.ext4, cgroup v1's blkio throttle and a bdi's strict_limit; skipped, saying why, where
those are missing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackbox.events import read_events
from tests.conftest import BLACKBOX, PROGRAMS, ROOT, TORCHRUN, job_env

sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
import runner

# one loop device, its limits set and put back, a test at a time; and apart from the other tests' jobs (`make test`
# runs it beside the Slurm module alone, whose daemons mostly wait and whose jobs write little): those limits are the
# host's (the blkio root group, the dirty limits), and beside other tests' jobs and I/O the dead disk's writer once
# outlived its SIGKILL
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("flush")]
BLKIO = Path("/sys/fs/cgroup/blkio")
RATE = 4 << 20  # bytes a second the throttled disk takes
# The rule under test is the disk's, not a default: the stall timeout is short (STALL_S), the flush past it and past
# the definite leaves' 30 s floor (a rank in D state whose store does not move), so that only its bytes keep it alive
STALL_S = 20
FLUSH_MB = 160  # 40 s of it
DIRTY_MB = 200  # written to the dead disk: well past its 16 MB dirty limit


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root (a loop device, a mount, a blkio cgroup)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not (BLKIO / "blkio.throttle.write_bps_device").exists():
        return "needs cgroup v1's blkio throttle (/sys/fs/cgroup/blkio)"
    return ""


def _job(argv: list[str], env: dict[str, str], tmp_path: Path, disk: Path) -> subprocess.CompletedProcess[str]:
    """Run the job to its end, within 280 s. Its output goes to files, not pipes: a rank the dead disk holds in the
    kernel (uninterruptibly, its SIGKILL pending until the disk takes its pages) outlives blackbox and would hold a
    pipe open; what is left running — blackbox's tree, anything with a file open on the disk — is killed here and
    dies once the fixture lets the disk's writes go."""
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)
        try:
            proc.wait(timeout=280)
        finally:
            runner.kill_tree(proc.pid)
            proc.wait()
            for pid in _holders(disk):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())


def _holders(mnt: Path) -> list[int]:
    """The processes with a file open, or their working directory, on the mount at `mnt`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid() and any(_on(link, mnt) for link in _links(proc)):
            found.append(int(proc.name))
    return found


def _links(proc: Path) -> list[Path]:
    try:
        return [proc / "cwd", *(proc / "fd").iterdir()]
    except OSError:  # gone, or not ours to read
        return []


def _on(link: Path, mnt: Path) -> bool:
    try:
        return Path(os.readlink(link)).is_relative_to(mnt)
    except OSError:
        return False


def _unmount(mnt: Path) -> None:
    """Unmount, waiting (up to 60 s) for the killed processes that held it to die once their writes are let go."""
    for _ in range(120):
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    subprocess.run(["umount", "--lazy", str(mnt)], check=False)


@contextlib.contextmanager
def _disk(tmp_path: Path, name: str, options: str = "defaults") -> Iterator[tuple[Path, str]]:
    """A mounted ext4 on a loop device, and the device's MAJ:MIN; its writes let go before it is unmounted."""
    image, mnt = tmp_path / f"{name}.img", tmp_path / name
    with open(image, "wb") as f:
        f.truncate(1 << 30)
    dev = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=True).stdout
    dev = dev.strip()
    try:
        numbers = Path(f"/sys/block/{os.path.basename(dev)}/dev").read_text().strip()
        subprocess.run(["mkfs.ext4", "-q", dev], check=True)
        mnt.mkdir()
        subprocess.run(["mount", "-o", options, dev, str(mnt)], check=True)
        try:
            yield mnt, numbers
        finally:
            (BLKIO / "blkio.throttle.write_bps_device").write_text(f"{numbers} 0\n")  # let what is left go
            _unmount(mnt)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def dead_disk(tmp_path: Path) -> Iterator[Path]:
    """A mounted ext4 whose device takes (about) nothing: every writer held, the kernel's flusher too."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    # lazytime: a write's time stamps stay in memory, so the job's overwrite of a file written before (its blocks
    # allocated, nothing left to journal) is held only where the test means, at the dirty limit
    with _disk(tmp_path, "dead", "lazytime") as (mnt, numbers):
        with open(mnt / "ckpt.pt", "wb") as f:
            f.write(bytes(DIRTY_MB + 20 << 20))
        subprocess.run(["sync", "-f", str(mnt / "ckpt.pt")], check=True)
        bdi = Path(f"/sys/class/bdi/{numbers}")
        if not (bdi / "strict_limit").exists() or not (bdi / "max_bytes").exists():
            pytest.skip("needs a kernel with a bdi's strict_limit and max_bytes (6.2 or later)")
        before = {name: (bdi / name).read_text() for name in ("strict_limit", "max_ratio")}
        try:
            (bdi / "strict_limit").write_text("1\n")
            (bdi / "max_bytes").write_text(f"{16 << 20}\n")
            (BLKIO / "blkio.throttle.write_bps_device").write_text(f"{numbers} 1\n")
            yield mnt
        finally:  # a loop device outlives its use, its bdi's limits with it: the next test's disk must be plain
            (BLKIO / "blkio.throttle.write_bps_device").write_text(f"{numbers} 0\n")
            for name, value in before.items():
                (bdi / name).write_text(value)


@pytest.fixture
def slow_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a mounted ext4 on a loop device, a blkio cgroup that holds that device's writes to RATE)."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    group = BLKIO / f"blackbox-test-{os.getpid()}"
    with _disk(tmp_path, "slow") as (mnt, numbers):
        group.mkdir(exist_ok=True)
        try:
            (group / "blkio.throttle.write_bps_device").write_text(f"{numbers} {RATE}\n")
            yield mnt, group
        finally:
            (group / "blkio.throttle.write_bps_device").write_text(f"{numbers} 0\n")  # let what is left go
            group.rmdir()


@pytest.mark.timeout(300)
def test_a_long_fsync_to_a_slow_disk_is_a_write_not_a_stall(slow_disk: tuple[Path, Path], tmp_path: Path) -> None:
    mnt, group = slow_disk
    # GIVEN the job under `blackbox run` with a short stall timeout, inside the throttled cgroup: rank 0 writes
    # FLUSH_MB to the page cache in a moment, then waits in fsync while the disk takes them at RATE
    run_dir = tmp_path / "run"
    argv = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", str(STALL_S), "--", TORCHRUN,
            "--standalone", "--nproc-per-node", "2", str(PROGRAMS / "quiet_job.py"), "flush"]  # fmt: skip
    enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
    done = _job(
        ["sh", "-c", enter, "sh", *argv], job_env(BB_FLUSH_DIR=str(mnt), BB_FLUSH_MB=str(FLUSH_MB)), tmp_path, mnt
    )
    # THEN the job ends by itself, exit 0, rank 0's flush really longer than the stall timeout and the 30 s floor
    assert done.returncode == 0, done.stderr[-3000:]
    paused = [float(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("rank 0: paused")]
    assert paused and paused[0] > 31, done.stdout[-2000:]
    # AND blackbox filed nothing, and said once what rank 0 was doing: in fsync, the disk taking its pages
    events = read_events(str(run_dir / "events.jsonl"))
    assert not [e for e in events if e.get("event") in ("stall", "busy", "frozen", "bundle")], done.stderr[-3000:]
    (note,) = [e for e in events if e.get("event") == "slow_phase"]
    doing = next(f["doing"] for f in note["findings"] if f["rank"] == 0)
    assert "in fsync(), its file's pages going out: the disk (" in doing and " MB/s" in doing, doing


@pytest.mark.timeout(300)
def test_a_write_held_at_the_dirty_limit_of_a_dead_disk_is_a_stall(dead_disk: Path, tmp_path: Path) -> None:
    # GIVEN the job under `blackbox run` with a short stall timeout: rank 0 writes a checkpoint through the page
    # cache to a disk that takes nothing; past its dirty limit the kernel holds the write, waking it every 200 ms
    run_dir = tmp_path / "run"
    argv = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--stall-timeout", str(STALL_S), "--kill-grace", "3", "--",
            TORCHRUN, "--standalone", "--nproc-per-node", "2", str(PROGRAMS / "quiet_job.py"), "dirty"]  # fmt: skip
    done = _job(argv, job_env(BB_FLUSH_DIR=str(dead_disk), BB_FLUSH_MB=str(DIRTY_MB)), tmp_path, dead_disk)
    # THEN the wake-ups are not motion: one stall under the stall timeout, about STALL_S after the last motion, and
    # the job ended
    assert done.returncode == 86, done.stderr[-3000:]
    events = read_events(str(run_dir / "events.jsonl"))
    (stall,) = [e for e in events if e.get("event") == "stall" and not e.get("expected")]
    assert {f["timeout_rule"] for f in stall["findings"]} == {"stall"}, stall
    assert STALL_S <= min(f["idle_s"] for f in stall["findings"]) <= STALL_S + 3, stall
    # AND the report blames rank 0, in its checkpoint's write to the dead disk's file, held by the kernel
    (bundle,) = (run_dir / "bundles").glob("*.tar.gz")
    report = json.loads(subprocess.run([*BLACKBOX, "report", str(bundle), "--format", "json"], capture_output=True,
                                       text=True, check=True).stdout)  # fmt: skip
    verdict = report["verdict"]
    assert (verdict["category"], verdict["suspect_ranks"]) == ("hang.checkpoint_io", [0]), verdict
    assert re.match(r"The job stalled: rank 0 is in checkpoint I/O \(dirty \(quiet_job\.py:\d+\): main thread blocked "
                    r"in write\(\) of fd \d+, (/\S+)/ckpt\.pt \(a file on ext4 \(\1\)\), held by the kernel in "
                    r"balance_dirty_pages\), while rank 1 waits for it in barrier #\d+ of group 0\.$",
                    verdict["summary"]), verdict  # fmt: skip
