"""A flush is a write (issue 33 item 3): a healthy 2-rank DDP job whose rank 0 saves a checkpoint and then spends
longer than the `auto` stall timeout in `fsync` while a slow disk takes its pages (a filesystem on a loop device
whose writes the blkio cgroup holds to 4 MB/s) must not be called a stall: blackbox counts the device's sectors
written while the rank is inside the flush. Needs root, losetup, mkfs.ext4 and cgroup v1's blkio throttle; skipped,
saying why, where those are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackbox.events import read_events
from tests.conftest import BLACKBOX, PROGRAMS, TORCHRUN, job_env

BLKIO = Path("/sys/fs/cgroup/blkio")
RATE = 4 << 20  # bytes a second the throttled disk takes
FLUSH_MB = 300  # 75 s of it: past the auto timeout (60 s)


def _missing() -> str:
    if os.geteuid() != 0:
        return "needs root (a loop device, a mount, a blkio cgroup)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not (BLKIO / "blkio.throttle.write_bps_device").exists():
        return "needs cgroup v1's blkio throttle (/sys/fs/cgroup/blkio)"
    return ""


@pytest.fixture
def slow_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a mounted ext4 on a loop device, a blkio cgroup that holds that device's writes to RATE)."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    image, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    with open(image, "wb") as f:
        f.truncate(1 << 30)
    dev = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=True).stdout
    dev = dev.strip()
    group = BLKIO / f"blackbox-test-{os.getpid()}"
    try:
        numbers = Path(f"/sys/block/{os.path.basename(dev)}/dev").read_text().strip()  # before the group is made
        subprocess.run(["mkfs.ext4", "-q", dev], check=True)
        mnt.mkdir()
        subprocess.run(["mount", dev, str(mnt)], check=True)
        group.mkdir(exist_ok=True)
        (group / "blkio.throttle.write_bps_device").write_text(f"{numbers} {RATE}\n")
        yield mnt, group
    finally:
        if group.exists():
            (group / "blkio.throttle.write_bps_device").write_text(f"{numbers} 0\n")  # let what is left go
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)
        if group.exists():
            group.rmdir()


@pytest.mark.timeout(300)
def test_a_long_fsync_to_a_slow_disk_is_a_write_not_a_stall(slow_disk: tuple[Path, Path], tmp_path: Path) -> None:
    mnt, group = slow_disk
    # GIVEN the job under `blackbox run` with default options, inside the throttled cgroup: rank 0 writes FLUSH_MB to
    # the page cache in a moment, then waits in fsync while the disk takes them at RATE
    run_dir = tmp_path / "run"
    argv = [*BLACKBOX, "run", "--run-dir", str(run_dir), "--", TORCHRUN, "--standalone", "--nproc-per-node", "2",
            str(PROGRAMS / "quiet_job.py"), "flush"]  # fmt: skip
    enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
    done = subprocess.run(["sh", "-c", enter, "sh", *argv], env=job_env(BB_FLUSH_DIR=str(mnt), BB_FLUSH_MB=str(
        FLUSH_MB)), capture_output=True, text=True, timeout=280)  # fmt: skip
    # THEN the job ends by itself, exit 0, rank 0's flush really longer than the auto timeout
    assert done.returncode == 0, done.stderr[-3000:]
    paused = [float(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("rank 0: paused")]
    assert paused and paused[0] > 61, done.stdout[-2000:]
    # AND blackbox filed nothing, and said once what rank 0 was doing: in fsync, the disk taking its pages
    events = read_events(str(run_dir / "events.jsonl"))
    assert not [e for e in events if e.get("event") in ("stall", "busy", "frozen", "bundle")], done.stderr[-3000:]
    (note,) = [e for e in events if e.get("event") == "slow_phase"]
    doing = next(f["doing"] for f in note["findings"] if f["rank"] == 0)
    assert "in fsync(), its file's pages going out: the disk (" in doing and " MB/s" in doing, doing
