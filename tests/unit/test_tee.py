"""The tee's pieces on real pipes, no job: the output passes unchanged, a copy never holds it (what its reader
cannot take is lost from the copy, and said so), a closed reader downstream reaches the job as it would have."""

from __future__ import annotations

import os
import threading

from blackbox.supervisor.tee import END, GAP, GAP_INFO, Copy, FrameReader, Tee


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def test_a_copy_whose_reader_stalls_never_blocks_and_says_what_it_lost() -> None:
    # GIVEN a copy into a pipe nobody reads yet, allowed to fall 64 KiB behind
    r, w = os.pipe()
    copy = Copy(w, 64 * 1024)
    # WHEN far more than the pipe and the bound hold is put into it
    for i in range(5000):
        copy.put(1, b"line %05d of the job\n" % i)  # THEN every put returns at once (the test would hang)
    assert copy.lost[1] > 0
    copy.put(2, b"a warning\n")
    # AND once its reader takes it all, the frames say what was lost, where, and go on after it
    t = threading.Thread(target=lambda: setattr(t, "data", read_all(r)))
    t.start()
    copy.finish()
    t.join(10)
    got = FrameReader().feed(t.data)  # type: ignore[attr-defined]
    kinds = [k for k, _ in got]
    assert kinds[0] == 1 and GAP in kinds
    lost = {stream: n for stream, n in (GAP_INFO.unpack(p) for k, p in got if k == GAP)}
    kept = b"".join(p for k, p in got if k == 1)
    assert lost[1] + len(kept) == sum(len(b"line %05d of the job\n" % i) for i in range(5000))
    assert lost[2] == len(b"a warning\n")
    assert kept.startswith(b"line 00000 of the job\n")


def test_the_tee_passes_the_output_unchanged_and_ends_its_copies() -> None:
    # GIVEN a job's stdout and stderr pipes, ours, and a copy
    job_out_r, job_out_w = os.pipe()
    job_err_r, job_err_w = os.pipe()
    our_out_r, our_out_w = os.pipe()
    our_err_r, our_err_w = os.pipe()
    copy_r, copy_w = os.pipe()
    copy = Copy(copy_w, 1 << 20)
    tee = Tee([(job_out_r, our_out_w, 1), (job_err_r, our_err_w, 2)], [copy], copy)
    readers = {fd: threading.Thread(target=lambda fd=fd: setattr(readers[fd], "data", read_all(fd)))
               for fd in (our_out_r, our_err_r, copy_r)}  # fmt: skip
    for t in readers.values():
        t.start()
    runner = threading.Thread(target=tee.run)
    runner.start()
    # WHEN the job writes bytes of every kind, then ends
    blob = bytes(range(256)) * 300 + "ünïcødé\r progress\rdone\n".encode()
    os.write(job_err_w, b"a warning\n")
    for i in range(0, len(blob), 777):
        os.write(job_out_w, blob[i : i + 777])
    os.close(job_out_w)
    os.close(job_err_w)
    runner.join(10)
    os.close(our_out_w)
    os.close(our_err_w)
    for t in readers.values():
        t.join(10)
    # THEN ours got exactly its bytes, and the copy too, framed by stream, with the end last
    assert readers[our_out_r].data == blob and readers[our_err_r].data == b"a warning\n"  # type: ignore[attr-defined]
    frames = FrameReader().feed(readers[copy_r].data)  # type: ignore[attr-defined]
    assert b"".join(p for k, p in frames if k == 1) == blob
    assert b"".join(p for k, p in frames if k == 2) == b"a warning\n"
    assert frames[-1] == (END, b"")


def test_a_closed_reader_downstream_reaches_the_job_as_it_would_have() -> None:
    # GIVEN the tee between a job's stdout and a reader that goes away (`blackbox run ... | head -1`)
    job_r, job_w = os.pipe()
    ours_r, ours_w = os.pipe()
    err_r, err_w = os.pipe()
    os.close(ours_r)
    tee = Tee([(job_r, ours_w, 1), (err_r, err_w, 2)], [])
    runner = threading.Thread(target=tee.run)
    runner.start()
    # WHEN the job writes on
    os.write(job_w, b"first\n")
    runner.join(0.5)
    # THEN it meets the closed pipe (EPIPE), as it would have without blackbox
    try:
        for _ in range(100):
            os.write(job_w, b"x" * 65536)
        raise AssertionError("the job's writes never failed")
    except BrokenPipeError:
        pass
    os.close(job_w)
    os.close(err_w)
    runner.join(10)
    assert not runner.is_alive()
