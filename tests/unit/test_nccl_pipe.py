"""torch's debug pipe (adapters.nccl_pipe): blackbox writes its byte only into a FIFO the rank itself holds open — never
into a regular file, a symlink or a FIFO of someone else that a job's environment names — and never blocks. Real
FIFOs; this test process plays the rank."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from blackbox.adapters import nccl_pipe, procfs
from blackbox.collect import rank_dumps
from blackbox.collect.job import RankTarget
from tests.conftest import wait_for


def test_the_byte_goes_into_a_fifo_the_rank_holds_open(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe_0.pipe"
    os.mkfifo(pipe, 0o600)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # as torch's watchdog opens it
    try:
        assert nccl_pipe.poke(os.getpid(), str(pipe)) is None
        assert os.read(fd, 64) == b"1\n"
    finally:
        os.close(fd)


def test_nothing_is_written_where_the_rank_holds_no_fifo(tmp_path: Path) -> None:
    # a path with nothing there: no NCCL group (or no pipe in this torch) — nothing to say
    assert nccl_pipe.poke(os.getpid(), str(tmp_path / "none.pipe")) == ""
    # a regular file, and a symlink to it, where a job's environment points: left as they are
    planted = tmp_path / "planted"
    planted.write_text("keep\n")
    (tmp_path / "link.pipe").symlink_to(planted)
    assert nccl_pipe.poke(os.getpid(), str(planted)) == "its debug pipe is not a FIFO the rank holds open: not written"
    assert nccl_pipe.poke(os.getpid(), str(tmp_path / "link.pipe")).startswith("its debug pipe is not a FIFO")
    assert planted.read_text() == "keep\n"
    # a FIFO another process reads, not the rank: not written (and the open would not block either way)
    other = tmp_path / "other.pipe"
    os.mkfifo(other, 0o600)
    reader = subprocess.Popen(["sh", "-c", f"exec 3<>{other}; exec sleep 30"])
    try:
        wait_for(lambda: os.path.exists(f"/proc/{reader.pid}/fd/3"), 10, "the other process to open the FIFO")
        assert nccl_pipe.poke(os.getpid(), str(other)).startswith("its debug pipe is not a FIFO the rank holds open")
        assert nccl_pipe.poke(reader.pid, str(other)) is None  # the process that does hold it
    finally:
        reader.kill()
        reader.wait()


def test_names_and_paths_follow_the_torch_release() -> None:
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/run/fr/pipe_"}
    assert nccl_pipe.pipe_path(env, 3) == "/run/fr/pipe_3.pipe"
    assert nccl_pipe.pipe_path({**env, "TORCH_FR_DEBUG_INFO_PIPE_FILE": "/new/p_"}, 3) == "/new/p_3.pipe"
    assert nccl_pipe.pipe_path({}, 3) is None
    assert nccl_pipe.dump_path({}, "/run/fr/fr_trace_", 3) == "/run/fr/fr_trace_3"
    assert nccl_pipe.dump_path({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/t_"}, "/run/fr/fr_trace_", 3) == "/mine/t_3"


def test_a_job_not_under_blackbox_gives_torchs_own_record(tmp_path: Path) -> None:
    # GIVEN ranks that run no recorder: rank 0 (this process) whose torch wrote its dump on a timeout, rank 1 whose
    # path holds a dump from before it started (a previous job's), rank 2 whose watchdog reads its debug pipe
    me = procfs.proc_stat(os.getpid())
    assert me is not None
    (tmp_path / "trace_0").write_bytes(b"dump of rank 0")
    (tmp_path / "trace_1").write_bytes(b"an older job's dump")
    os.utime(tmp_path / "trace_1", (946684800, 946684800))
    pipe = tmp_path / "pipe_2.pipe"
    os.mkfifo(pipe, 0o600)
    watchdog = subprocess.Popen(["sh", "-c", f'exec 3<>"{pipe}"; read -r x <&3; printf "dump of rank 2" > '
                                 f'"{tmp_path}/trace_2"; exec sleep 30'])  # fmt: skip
    try:
        wait_for(lambda: os.path.exists(f"/proc/{watchdog.pid}/fd/3"), 10, "the watchdog to open its pipe")
        other = procfs.proc_stat(watchdog.pid)
        assert other is not None
        ranks = [RankTarget(0, os.getpid(), me.start_ticks, True), RankTarget(1, os.getpid(), me.start_ticks, True),
                 RankTarget(2, watchdog.pid, other.start_ticks, True)]  # fmt: skip
        env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{tmp_path}/trace_",
               "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{tmp_path}/pipe_"}  # fmt: skip
        # WHEN the collection asks torch itself
        said: list[str] = []
        status, detail, dumps = rank_dumps.from_watchdogs(ranks, env, said.append)
    finally:
        watchdog.kill()
        watchdog.wait()
    # THEN rank 2's watchdog was asked and wrote, rank 0's own dump is taken, rank 1's stale one is not
    assert status == "ok" and dumps == {0: f"{tmp_path}/trace_0", 2: f"{tmp_path}/trace_2"}, (detail, dumps)
    assert "the flight recorder of rank(s) [2] written by torch's NCCL watchdog, asked through its debug pipe" in detail
    assert "the flight recorder of rank(s) [0] as torch wrote it before the collection (a timeout's dump)" in detail
    assert said == ["asking the NCCL watchdog of 1 rank(s) for its flight recorder"]
    # AND a job whose flight recorder is off gets the advice, and nothing is asked
    status, detail, dumps = rank_dumps.from_watchdogs(ranks, {}, said.append)
    assert (status, dumps) == ("skipped", {}) and "set TORCH_NCCL_TRACE_BUFFER_SIZE=2000" in detail, detail
