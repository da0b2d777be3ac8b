"""torch's debug pipe (adapters.nccl_pipe): blackbox writes its byte only into a FIFO the rank itself holds open — never
into a regular file, a symlink or a FIFO of someone else that a job's environment names — and never blocks. Real
FIFOs; this test process plays the rank."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from blackbox.adapters import nccl_pipe
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
