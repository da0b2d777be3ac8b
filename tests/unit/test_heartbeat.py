"""The heartbeat layout: what the rank writes is what the supervisor reads, consistently, and a file from a
newer layout is refused by name."""

from __future__ import annotations

import mmap
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from blackbox._recorder import protocol as P
from blackbox._recorder.heartbeat_writer import HeartbeatWriter
from blackbox.heartbeat_reader import HeartbeatBusy, HeartbeatFormatError, RingEntry, decode, ring


def make_writer(tmp_path: Path) -> HeartbeatWriter:
    return HeartbeatWriter(
        str(tmp_path / "heartbeat"), pid=1234, start_ticks=99, rank=3, local_rank=1, world_size=8, mode="rank"
    )


def test_the_step_hook_writes_the_progress_group_in_the_writers_layout(tmp_path: Path) -> None:
    # GIVEN a rank's recorder (not started: no hooks, no thread) whose step hook writes the group itself
    from blackbox._recorder.recorder import Recorder

    rec = Recorder(str(tmp_path), 2, 0, 4, "rank")
    # WHEN the job marks three steps (the optimizer hook's path)
    for _ in range(3):
        rec.step()
    # THEN the supervisor reads them, cleanly, with their time, length and the slowest
    with open(rec.hb_path, "rb") as f:
        state = decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    assert (state.rank, state.step, state.busy) == (2, 3, False)
    assert (state.last_progress, state.last_step_dt, state.slowest_step_dt) == (
        rec._last_step_time, rec._last_dt, rec._slowest)  # fmt: skip
    assert state.last_step_dt > 0 and state.state == "running"


def test_batches_and_steps_write_the_progress_group_under_one_version_counter(tmp_path: Path) -> None:
    # GIVEN a rank's recorder whose DataLoader batches (HeartbeatWriter.progress) and steps (the step hook's own
    # writes) both write the progress group
    from blackbox._recorder.recorder import Recorder

    rec = Recorder(str(tmp_path), 0, 0, 1, "rank")
    with open(rec.hb_path, "rb") as f:
        q = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)).cast("Q")

    class Iterator:  # what the DataLoader hook passes: the iterator the batch came from
        pass

    it = Iterator()
    versions = []
    # WHEN batches and steps alternate, as in training (a batch, then its step)
    for _ in range(3):
        rec.batch_delivered(rec.enter_phase(P.PHASE_DATA), [1, 2], it)
        versions.append((q[P.W_PROGRESS], q[P.W_PROGRESS_END]))
        rec.step()
        versions.append((q[P.W_PROGRESS], q[P.W_PROGRESS_END]))
    # THEN every write has a version of its own, counted up: a read across two writes never sees matching ends
    assert all(start == end for start, end in versions), versions
    assert [start for start, _ in versions] == list(range(versions[0][0], versions[0][0] + 6)), versions
    q.release()


def test_round_trip(tmp_path: Path) -> None:
    # GIVEN a heartbeat written through every writer entry point
    hb = make_writer(tmp_path)
    hb.progress(7, 100.5, 0.25, 0.75)
    hb.phase(P.PHASE_COLLECTIVE, 101.0, P.COLLECTIVE_OPS.index("all_reduce"), 42)
    hb.state(P.STATE_RUNNING)
    hb.liveness(5, 102.0)
    hb.data(1.5, 10)
    # WHEN the supervisor maps and decodes the file
    with open(tmp_path / "heartbeat", "rb") as f:
        state = decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    # THEN every field reads back
    assert (state.pid, state.start_ticks, state.rank, state.local_rank, state.world_size) == (
        1234,
        99,
        3,
        1,
        8,
    )
    assert (state.step, state.last_progress, state.last_step_dt, state.slowest_step_dt) == (
        7,
        100.5,
        0.25,
        0.75,
    )
    assert (state.phase, state.phase_start, state.collective, state.collective_seq) == (
        "collective", 101.0, "all_reduce", 42)  # fmt: skip
    assert (state.state, state.liveness, state.liveness_time) == ("running", 5, 102.0)
    assert (state.data_wait_total, state.batches, state.mode) == (1.5, 10, "rank")


def test_the_ledger_spent_so_far_and_a_sampled_estimate_moved(tmp_path: Path) -> None:
    # GIVEN a rank 2 s in compute, then 1 s in data, and 0.5 s into compute again
    hb = make_writer(tmp_path)
    t0 = hb.mono0
    hb.phase(P.PHASE_COMPUTE, t0, 0, 0)
    hb.phase(P.PHASE_DATA, t0 + 2.0, 0, 0)
    hb.phase(P.PHASE_COMPUTE, t0 + 3.0, 0, 0)
    # WHEN the stride asks what was spent, then moves 0.75 s of compute to data and 0.25 s to backward
    spent = hb.spent(t0 + 3.5)
    hb.shift(P.PHASE_COMPUTE, [(P.PHASE_DATA, 0.75), (P.PHASE_BACKWARD, 0.25)])
    # THEN the current phase's time counts in what was spent, and a reader sees the moved seconds
    assert spent[P.PHASE_COMPUTE] == pytest.approx(2.5) and spent[P.PHASE_DATA] == pytest.approx(1.0)
    with open(tmp_path / "heartbeat", "rb") as f:
        state = decode(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    after = state.time_spent(t0 + 3.5)
    assert after["compute"] == pytest.approx(1.5) and after["data"] == pytest.approx(1.75)
    assert after["backward"] == pytest.approx(0.25) and sum(after.values()) == pytest.approx(3.5)


def test_motion_round_trip_and_older_layouts(tmp_path: Path) -> None:
    # GIVEN a version-5 page whose liveness thread wrote its motion group (forward calls, stack changes)
    hb = make_writer(tmp_path)
    hb.progress(7, 100.0, 0.25, 0.75)
    hb.motion(42, 103.0, 9, 104.5, P.FORWARDS_COUNTING)
    # THEN it reads back, and the rank's last motion is the newest of its step, forward call and stack change
    state = decode(hb.mm)
    assert state.version == P.HEARTBEAT_VERSION == 5
    assert (state.forwards, state.forwards_time, state.stack_changes, state.stack_time, state.forward_mode) == (
        42, 103.0, 9, 104.5, "counting")  # fmt: skip
    assert state.last_motion == 104.5
    # AND a page of layout 2 or 1 (written by an older recorder) still reads, without motion (and 1 without ledger)
    for version in (2, 1):
        P.HEADER.pack_into(hb.mm, 0, P.MAGIC, version, P.HEARTBEAT_SIZE)
        old = decode(hb.mm)
        assert old.version == version and old.step == 7 and old.last_motion == 100.0
        assert (old.forwards, old.stack_changes, old.forward_mode) == (0, 0, "idle")
        assert bool(old.ledger) == (version == 2)


def test_a_torn_motion_group_keeps_the_last_clean_reading(tmp_path: Path) -> None:
    hb = make_writer(tmp_path)
    hb.motion(5, 10.0, 3, 11.0, P.FORWARDS_IDLE)
    clean = decode(hb.mm)
    words = memoryview(hb.mm).cast("Q")
    words[P.W_MOTION] = words[P.W_MOTION_END] + 1  # an update began and its writer died
    words[P.W_FORWARDS] = 999
    words.release()
    with pytest.raises(HeartbeatBusy):
        decode(hb.mm, patience_s=0.0)
    busy = decode(hb.mm, patience_s=0.0, last=clean)
    assert busy.busy and busy.forwards == 5 and busy.stack_changes == 3


def test_custom_phase_name(tmp_path: Path) -> None:
    hb = make_writer(tmp_path)
    hb.phase(P.PHASE_CUSTOM, 5.0, 0, 0, "warmup-ü".encode())
    assert decode(hb.mm).phase == "warmup-ü"


def test_file_appears_complete(tmp_path: Path) -> None:
    # The writer builds the file under a temporary name: a reader never sees a half-made header.
    make_writer(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["heartbeat"]


WRITER = """
import sys, time
from blackbox._recorder.heartbeat_writer import HeartbeatWriter
hb = HeartbeatWriter(sys.argv[1], pid=1, start_ticks=0, rank=0, local_rank=0, world_size=1, mode="rank")
n, stop = 0, time.monotonic() + float(sys.argv[2])
print("go", flush=True)
while time.monotonic() < stop:
    for _ in range(1000):
        n += 1
        hb.progress(n, float(n), float(2 * n), float(3 * n))
        for _ in range(10):  # a few microseconds between updates (a real step takes milliseconds)
            pass
"""


def test_reads_are_consistent_under_concurrent_writes(tmp_path: Path) -> None:
    # GIVEN another process rewriting the progress group as fast as it can, every field derived from one counter
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "heartbeat"), "2"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"go\n"
        with open(tmp_path / "heartbeat", "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            seen = set()
            last = None
            # WHEN this process decodes it meanwhile, with a patience short enough to run out under load
            while proc.poll() is None:
                for patience in (0.05, 0.0):
                    try:
                        s = decode(mm, patience_s=patience, last=last)
                    except HeartbeatBusy:
                        assert last is None  # only before the first clean reading
                        continue
                    # THEN no reading mixes two updates: a busy one is the last clean reading's
                    assert s.step == 0 or (s.last_progress, s.last_step_dt, s.slowest_step_dt) == (
                        s.step,
                        2 * s.step,
                        3 * s.step,
                    )
                    assert not s.busy or (last is not None and s.step == last.step)
                    if not s.busy:
                        last = s
                    seen.add(s.step)
        assert len(seen) > 100  # it really read while the writer wrote
    finally:
        proc.kill()
        proc.wait()


def test_newer_layout_is_refused(tmp_path: Path) -> None:
    hb = make_writer(tmp_path)
    P.HEADER.pack_into(hb.mm, 0, P.MAGIC, P.HEARTBEAT_VERSION + 1, P.HEARTBEAT_SIZE)
    with pytest.raises(HeartbeatFormatError, match="newer"):
        decode(hb.mm)


def test_not_a_heartbeat(tmp_path: Path) -> None:
    with pytest.raises(HeartbeatFormatError, match="not a blackbox heartbeat"):
        decode(b"\0" * P.HEARTBEAT_SIZE)
    with pytest.raises(HeartbeatFormatError, match="bytes"):
        decode(b"short")


def test_proc_stat_parser_handles_odd_names() -> None:
    text = "42 (my (odd) name) S 7 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 1000 10"
    assert P.parse_proc_stat(text) == ("S", 7, 12345)


def test_a_writer_killed_mid_update_never_yields_a_mixed_reading(tmp_path: Path) -> None:
    # GIVEN a heartbeat with a clean reading, then a progress update left half done (its end version never written)
    hb = make_writer(tmp_path)
    clean = decode(hb.mm)
    words = memoryview(hb.mm).cast("Q")
    words[P.W_PROGRESS] = words[P.W_PROGRESS_END] + 1  # the update began...
    words[P.W_STEP] = 999  # ...and wrote a field, and its writer died
    words.release()
    # THEN without an earlier reading there is none to give; with one, its fields are kept and marked busy
    with pytest.raises(HeartbeatBusy):
        decode(hb.mm, patience_s=0.0)
    busy = decode(hb.mm, patience_s=0.0, last=clean)
    assert busy.busy and busy.step == clean.step != 999


def test_the_ring_keeps_the_last_phase_edges_readable_without_the_rank(tmp_path: Path) -> None:
    # GIVEN a rank that stepped, entered all_reduce #812 (and left it), waited for data, then entered broadcast #3
    hb = make_writer(tmp_path)
    t0 = hb.mono0
    hb.progress(40, t0, 0.1, 0.2)
    hb.phase(P.PHASE_COLLECTIVE, t0 + 1, P.COLLECTIVE_OPS.index("all_reduce"), 812)
    hb.phase(P.PHASE_COMPUTE, t0 + 2, P.COLLECTIVE_OPS.index("all_reduce"), 812)
    hb.progress(41, t0 + 3, 0.1, 0.2)
    hb.phase(P.PHASE_DATA, t0 + 3, P.COLLECTIVE_OPS.index("all_reduce"), 812)
    hb.phase(P.PHASE_COLLECTIVE, t0 + 4, P.COLLECTIVE_OPS.index("broadcast"), 3)
    # WHEN its page is read from the file, as a collector reads a stopped or killed rank's (the writer is gone)
    page = (tmp_path / "heartbeat").read_bytes()
    # THEN every edge is there, oldest first: the collective entered last was never left
    assert ring(page) == [
        RingEntry(1, "startup", "", 0, t0, 0),
        RingEntry(2, "collective", "all_reduce", 812, t0 + 1, 40),
        RingEntry(3, "compute", "", 812, t0 + 2, 40),
        RingEntry(4, "data", "", 812, t0 + 3, 41),
        RingEntry(5, "collective", "broadcast", 3, t0 + 4, 41),
    ]


def test_the_ring_holds_its_newest_entries_and_drops_torn_or_made_up_ones(tmp_path: Path) -> None:
    # GIVEN a rank that wrote more edges than the ring holds
    hb = make_writer(tmp_path)
    for i in range(1, 200):
        hb.phase(P.PHASE_COMPUTE if i % 2 else P.PHASE_DATA, hb.mono0 + i, 0, i)
    entries = ring(hb.mm)
    # THEN the ring holds the newest RING_ENTRIES, in order
    assert [e.n for e in entries] == list(range(200 - P.RING_ENTRIES + 1, 201))
    assert entries[-1].seq == 199 and entries[-1].phase == "compute"
    # WHEN an entry is torn (its writer died between its first and last word), one is overwritten half-way, a slot
    # claims a number it cannot hold, and a hostile page writes an unknown phase code and op, and a time that is not
    # a number
    q = memoryview(hb.mm).cast("Q")
    d = memoryview(hb.mm).cast("d")
    slot = lambda n: P.W_RING + (n - 1) % P.RING_ENTRIES * P.RING_WORDS  # noqa: E731
    q[slot(180)] = 180 + P.RING_ENTRIES  # the next lap began writing over 180
    q[slot(190) + 5] = 7  # torn
    q[slot(191)] = q[slot(191) + 5] = 191 + 1  # a number another slot holds
    q[slot(195) + 1] = 99 | 250 << 8  # an unknown code and op
    d[slot(196) + 4] = float("nan")
    kept = {e.n: e for e in ring(hb.mm)}
    # THEN those entries are dropped or named unknown, the others kept
    assert not {180, 190, 191, 196} & set(kept) and {181, 189, 192, 195, 199} <= set(kept)
    assert kept[195].phase == "unknown"
    # AND a page of an older layout, or one too short, has no ring at all
    P.HEADER.pack_into(hb.mm, 0, P.MAGIC, 3, P.HEARTBEAT_SIZE)
    assert ring(hb.mm) == [] and ring(b"BBHB") == []


def test_the_ring_holds_torchs_count_of_the_collectives_issued_and_a_layout_4_page_is_read_without_it(
        tmp_path: Path) -> None:  # fmt: skip
    # GIVEN a rank whose default group had issued 7 collectives (DDP's, from C++: no Python wrapper saw them) when it
    # entered backward, and 9 when it left it, then a rank whose group is destroyed (the getter fails)
    hb = make_writer(tmp_path)
    counts = iter([7, 9])
    hb.issued = lambda: next(counts)
    hb.phase(P.PHASE_BACKWARD, hb.mono0 + 1, 0, 0)
    hb.phase(P.PHASE_COMPUTE, hb.mono0 + 2, 0, 0)
    hb.phase(P.PHASE_DATA, hb.mono0 + 3, 0, 0)  # the iterator is spent: the getter raises
    hb.phase(P.PHASE_COMPUTE, hb.mono0 + 4, 0, 0)
    # THEN each entry holds the count as its edge was crossed; after the failure none (and the getter is dropped)
    assert [(e.phase, e.issued) for e in ring(hb.mm)][1:] == [("backward", 7), ("compute", 9), ("data", 0),
                                                               ("compute", 0)]  # fmt: skip
    assert hb.issued is None
    # AND a page of layout 4 (5 words an entry, no count), as a recorder of the release before writes it, is read
    old = bytearray(P.HEARTBEAT_SIZE)
    P.HEADER.pack_into(old, 0, P.MAGIC, 4, P.HEARTBEAT_SIZE)
    for n, code in ((1, P.PHASE_STARTUP), (2, P.PHASE_BACKWARD)):
        struct.pack_into("<QQQdQ", old, (P.W_RING + (n - 1) * P.RING_WORDS_4) * 8, n, code | 3 << 16, 0, 5.0 + n, n)
    assert ring(bytes(old)) == [RingEntry(1, "startup", "", 0, 6.0, 3), RingEntry(2, "backward", "", 0, 7.0, 3)]
