"""What counts as a rank moving besides its steps: the main thread's Python stack changing between samples (the
recorder's liveness thread), forward calls counted only during a pause, and I/O read from /proc by the supervisor.
A thread blocked in a C call or sleeping at one line never counts; CPU time is never read."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from blackbox import movers
from blackbox._recorder import motion as M
from blackbox._recorder import protocol as P
from blackbox._recorder.heartbeat_writer import HeartbeatWriter
from blackbox.adapters import procfs
from blackbox.heartbeat_reader import decode
from blackbox.supervisor import iowatch
from tests.conftest import wait_for


class FakeRecorder:
    """What Motion reads of the recorder: steps, batches, torch, failed hooks, and the heartbeat it writes."""

    def __init__(self, tmp_path: Path, torch: Any = None) -> None:
        self.hb = HeartbeatWriter(str(tmp_path / "heartbeat"), pid=1, start_ticks=0, rank=0, local_rank=0,
                                  world_size=1, mode="rank")  # fmt: skip
        self.step_count = 0
        self._batches = 0
        self.torch = torch
        self.rank_dir = str(tmp_path)
        self._failed: set[str] = set()
        self.failures: list[tuple[str, BaseException]] = []

    def fail(self, hook: str, exc: BaseException) -> None:
        self._failed.add(hook)
        self.failures.append((hook, exc))


def sampled(target: Any, tmp_path: Path, samples: int = 12) -> int:
    """Stack changes seen over `samples` ticks of a Motion watching a thread that runs `target`."""
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,), daemon=True)
    thread.start()
    try:
        return watched(thread, tmp_path, samples)
    finally:
        stop.set()
        thread.join(5)


def watched(main: threading.Thread, tmp_path: Path, samples: int) -> int:
    """Stack changes over `samples` ticks, 20 ms apart, of a Motion that takes `main` for the main thread."""
    return watching(main, tmp_path, samples).stack_changes


def watching(main: threading.Thread, tmp_path: Path, samples: int, every: float = 0.02,
             asleep: Optional[list[int]] = None) -> M.Motion:  # fmt: skip
    """The Motion of `watched`, after its samples `every` seconds apart (what the main thread waits for: its
    `waiting`). `asleep`: given, gets the stack changes counted when a sample first found the thread asleep on a
    timer."""
    time.sleep(0.05)
    m = M.Motion(FakeRecorder(tmp_path))
    m.watch(main)
    for _ in range(samples):
        m.tick(time.monotonic())
        if asleep is not None and not asleep and m._slept_at > 0:
            asleep.append(m.stack_changes)
        time.sleep(every)
    return m


def _blocked_in_c(stop: threading.Event) -> None:
    stop.wait()  # a lock acquire in C, as a collective or a read waits


def _sleeping(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.5)  # one line, nearly all the time


def _walking(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():  # an endless Python loop: metrics, a retry storm
        n = (n * 31 + 7) % 1000003
        if n % 3:
            n += sum(i for i in range(5))


def test_a_thread_walking_through_python_moves_one_blocked_or_sleeping_does_not(tmp_path: Path) -> None:
    assert sampled(_blocked_in_c, tmp_path) == 0
    assert sampled(_sleeping, tmp_path) <= 2  # a wake-up between two sleeps may land between samples
    assert sampled(_walking, tmp_path) >= 3  # most samples under no load; a loaded machine runs it less often


def waiting_on(work: Any, tmp_path: Path, how: str = "join", samples: int = 12) -> int:
    """Stack changes seen while a "main" thread waits for a worker thread running `work` (a join, a future's
    result, a queue's get), or while it sleeps in C with the worker beside it (`how` = "sleep": not a thread wait)."""
    return waiting(work, tmp_path, how, samples).stack_changes


def polling(tmp_path: Path, beside: Any = None, samples: int = 25) -> tuple[M.Motion, int]:
    """A Motion over a "main" thread that sleeps and checks in a loop (a lock file's, a marker file's) while the
    thread running `beside` (if any) works, as `while not future.done(): time.sleep(…)` does, and the stack changes
    it counted once a sample had found the loop asleep on its timer. Before that, a change is motion: each sample
    that lands in the check is a new line, as many in a row as chance gives (CI once saw two)."""
    asleep: list[int] = []
    m = waiting(beside or _blocked_in_c, tmp_path, "poll", samples, every=0.1, asleep=asleep)
    assert asleep, "no sample found the loop asleep on its timer"
    return m, m.stack_changes - asleep[0]


def waiting(work: Any, tmp_path: Path, how: str, samples: int, every: float = 0.02,
            asleep: Optional[list[int]] = None) -> M.Motion:  # fmt: skip
    """The Motion of `waiting_on` and `polling`, after its samples."""
    import concurrent.futures
    import queue

    stop = threading.Event()
    worker = threading.Thread(target=work, args=(stop,), daemon=True)
    results: queue.Queue[int] = queue.Queue()
    r, w = os.pipe()

    def main() -> None:
        if how == "join":
            worker.join()
        elif how == "future":
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(work, stop).result()
        elif how == "queue":
            results.get()
        elif how == "poll":
            while not stop.is_set():
                select.select([r], [], [], random.uniform(0.005, 0.015))  # the check: a store's round trip, "not yet"
                time.sleep(random.uniform(0.005, 0.015))  # ... then a sleep on a timer: a sample finds either line
        else:
            os.read(r, 1)  # hung in a C call of its own

    waiter = threading.Thread(target=main, daemon=True)
    if how != "future":
        worker.start()
    waiter.start()
    try:
        return watching(waiter, tmp_path, samples, every, asleep)
    finally:
        stop.set()
        results.put(0)
        os.write(w, b"x")
        waiter.join(5)
        os.close(r)
        os.close(w)


def _uploading(stop: threading.Event) -> None:
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        while not stop.is_set():  # a part on the wire, then the next: the stack stands at the sleep nearly always
            os.write(fd, b"x" * 4096)
            time.sleep(0.05)
    finally:
        os.close(fd)


def test_a_main_thread_waiting_for_a_thread_moves_as_that_thread_does(tmp_path: Path) -> None:
    # GIVEN a main thread that waits for another thread of the job: it moves when that thread runs Python, or moves
    # bytes through its read and write system calls (an upload over TLS, a checkpoint to a pipe)
    for how in ("join", "future", "queue"):
        assert waiting_on(_walking, tmp_path, how) >= 3, how
        assert waiting_on(_uploading, tmp_path, how) >= 3, how
        assert waiting_on(_blocked_in_c, tmp_path, how) == 0, how
        assert waiting_on(_sleeping, tmp_path, how) <= 2, how
    # AND a main thread hung elsewhere (in a C call) does not move because another thread of the job does
    assert waiting_on(_walking, tmp_path, "sleep") == 0


def _polling_a_queue(stop: threading.Event) -> None:
    import queue

    q: queue.Queue[int] = queue.Queue()
    while not stop.is_set():  # a pool's or a writer's handler thread: wakes every 10 ms, finds nothing, waits again
        with contextlib.suppress(queue.Empty):
            q.get(timeout=0.01)


def test_a_poll_loop_is_waiting_not_working(tmp_path: Path) -> None:
    # GIVEN a main thread that sleeps and checks in a loop, nothing beside it: its stack changes between samples,
    # but waking to check is not work (a stale lock file, a marker file or a store key that never comes): once a
    # sample has found it asleep on its timer, no change counts
    m, changes = polling(tmp_path)
    assert changes == 0
    assert m.waiting == P.WAIT_POLL
    # AND a main thread in one long sleep sleeps: it never wakes, so it is no loop (what it may wait for is followed
    # all the same)
    sleeper = threading.Thread(target=time.sleep, args=(5,), daemon=True)
    sleeper.start()
    m = watching(sleeper, tmp_path, 20)
    assert (m.stack_changes, m.waiting) == (0, P.WAIT_SLEEP)
    # AND a thread that only wakes to poll a queue is not work either
    assert polling(tmp_path, _polling_a_queue)[1] == 0
    # BUT the loop moves as the thread it polls does: one that runs Python, or moves bytes (an upload)
    assert polling(tmp_path, _walking)[1] >= 3
    assert polling(tmp_path, _uploading)[1] >= 3


def test_one_long_sleep_after_a_little_work_is_a_sleep_never_a_poll_loop(tmp_path: Path) -> None:
    # GIVEN a main thread blocked in a C call (a collective's wait), then a moment's work (the rest of its step), then
    # one long sleep (a rank that skipped its all_reduce: `time.sleep(3600)`)
    go = threading.Event()

    def main_loop() -> None:
        go.wait()
        sum(range(1000))
        time.sleep(30)

    main = threading.Thread(target=main_loop, daemon=True)
    main.start()
    m = M.Motion(FakeRecorder(tmp_path))
    m.watch(main)
    now = time.monotonic()
    for _ in range(3):  # blocked: no CPU, no timer
        now += 0.5
        m.tick(now)
    go.set()
    syscall, sleeps = f"/proc/self/task/{main.native_id}/syscall", M.TIMER_SLEEPS[os.uname().machine]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(syscall).read_text().split()[0] not in map(str, sleeps):
        time.sleep(0.01)
    # WHEN it is sampled every 0.5 s while it sleeps
    seen = []
    for _ in range(6):
        now += 0.5
        m.tick(now)
        seen.append(m.waiting)
    # THEN it sleeps: it ran between the sample before its sleep and the first one in it, but it never woke between
    # two samples that found it asleep — no loop (a gallery row once named it hang.poll on a loaded machine)
    assert seen == [P.WAIT_SLEEP] * 6, seen
    assert m.stack_changes == 0


def test_a_sleep_first_sampled_on_its_way_in_is_asked_again(tmp_path: Path) -> None:
    # GIVEN a main thread that sleeps at one line (a tool watched with `while p.poll() is None: sleep(0.2)`), whose
    # first still sample finds it "running": on a loaded machine, between the line and the system call, or waiting
    # for a CPU (the quiet gallery's polled-tool was ended as a stall: that answer was kept for good)
    stop = threading.Event()
    main = threading.Thread(target=_sleeping, args=(stop,), daemon=True)
    main.start()
    time.sleep(0.1)
    m = M.Motion(FakeRecorder(tmp_path))
    m.watch(main)
    real = m._syscall
    fake = tmp_path / "syscall"
    fake.write_text("running\n")
    m._syscall = str(fake)
    now = time.monotonic()
    try:
        for _ in range(3):
            now += 0.5
            m.tick(now)
        assert m.waiting == P.WAIT_NONE  # not known yet
        # WHEN the kernel then shows it in its sleep
        m._syscall = real
        for _ in range(3):
            now += 0.5
            m.tick(now)
        # THEN it sleeps: what it may wait for (its child) is followed
        assert m.waiting in (P.WAIT_SLEEP, P.WAIT_POLL), m.waiting
    finally:
        stop.set()


def _hashing(stop: threading.Event) -> None:
    import hashlib

    shard = os.urandom(4 << 20)
    with contextlib.suppress(OSError):  # its share of a CPU is under test: on a loaded machine (the suite's other
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)  # workers) nice 0 got under 25 % (as root)
    while not stop.is_set():  # one GIL-releasing native call after another: every sample finds it in the same call
        hashlib.sha256(shard).digest()


def test_a_loop_of_native_calls_moves_by_its_cpu_time_where_no_accelerator_spins(tmp_path: Path) -> None:
    # GIVEN a main thread hashing shards: the same call at every sample, a CPU busy
    stop = threading.Event()
    main = threading.Thread(target=_hashing, args=(stop,), daemon=True)
    main.start()
    try:
        # THEN on a rank with no accelerator its CPU time inside the call is work
        assert watched(main, tmp_path, 20) >= 3
        # BUT once the rank uses CUDA (whose synchronize spins a core while nothing moves) it is not
        cuda = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
        m = M.Motion(FakeRecorder(tmp_path, cuda))
        m.watch(main)
        for _ in range(20):
            m.tick(time.monotonic())
            time.sleep(0.02)
        assert m.stack_changes == 0
    finally:
        stop.set()
        main.join(5)
    # AND a thread blocked in a C call uses no CPU: still (test_a_thread_walking_through_python_moves_one_blocked_…)


def test_a_loop_of_calls_that_return_with_data_moves(tmp_path: Path) -> None:
    # GIVEN a main thread that waits in one read after another, each answered (requests to a server): it uses
    # little CPU, but it wakes on data, never on a timer, so its stack changing is motion
    feeds = [os.pipe() for _ in range(2)]
    stop = threading.Event()

    def server() -> None:
        while not stop.is_set():
            for _, w in feeds:
                os.write(w, b"x")
                time.sleep(0.004)

    def main() -> None:
        while not stop.is_set():
            os.read(feeds[0][0], 1)  # a request and its answer ...
            os.read(feeds[1][0], 1)  # ... then another one, at another line

    answering = threading.Thread(target=server, daemon=True)
    answering.start()
    waiter = threading.Thread(target=main, daemon=True)
    waiter.start()
    try:
        m = watching(waiter, tmp_path, 40)
        assert m.stack_changes >= 3
        assert m.waiting == P.WAIT_NONE
    finally:
        stop.set()
        answering.join(5)
        for _, w in feeds:  # the end of its input: a read that waits returns, and the loop sees `stop`
            os.close(w)
        waiter.join(5)
        for r, _ in feeds:
            os.close(r)


def test_forward_calls_count_only_from_the_main_thread(tmp_path: Path) -> None:
    torch = fake_torch()
    m = M.Motion(FakeRecorder(tmp_path, torch))
    for t in range(10):  # a pause: the counter is installed
        m.tick(100.0 + t)
    assert m.mode == P.FORWARDS_COUNTING
    ema = threading.Thread(target=forward, args=(torch, 5))  # an EMA or teacher model in a thread of its own
    ema.start()
    ema.join()
    assert m.forwards == 0
    forward(torch, 2)  # the main thread's (this test runs in it)
    assert m.forwards == 2


def test_the_motion_group_reaches_the_heartbeat(tmp_path: Path) -> None:
    rec = FakeRecorder(tmp_path)
    m = M.Motion(rec)
    m.watch(threading.current_thread())  # this thread: its stack differs between the two calls below
    m.tick(10.0)
    m.tick(11.0)
    state = decode(rec.hb.mm)
    assert state.stack_changes == m.stack_changes and state.stack_time in (0.0, 11.0)
    assert state.forward_mode == "idle"


class FakeHandle:
    def __init__(self, hooks: dict[int, Any], key: int) -> None:
        self.hooks, self.key = hooks, key

    def remove(self) -> None:
        self.hooks.pop(self.key, None)


def fake_torch() -> Any:
    """torch as far as Motion uses it: the global forward pre-hook registry, and a `compile` to wrap."""
    hooks: dict[int, Any] = {}

    def register(hook: Any) -> FakeHandle:
        key = len(hooks) + 1
        hooks[key] = hook
        return FakeHandle(hooks, key)

    module = types.SimpleNamespace(register_module_forward_pre_hook=register)
    torch = types.SimpleNamespace(nn=types.SimpleNamespace(modules=types.SimpleNamespace(module=module)),
                                  compile=lambda fn=None, **kw: fn, hooks=hooks)  # fmt: skip
    return torch


def forward(torch: Any, n: int = 1) -> None:
    for _ in range(n):
        for hook in list(torch.hooks.values()):
            hook(object(), ())


def test_forward_calls_are_counted_only_during_a_pause(tmp_path: Path) -> None:
    torch = fake_torch()
    rec = FakeRecorder(tmp_path, torch)
    m = M.Motion(rec)
    # GIVEN a training loop stepping every second: the hook is never installed
    for t in range(10):
        rec.step_count += 1
        m.tick(100.0 + t)
        forward(torch)
    assert not torch.hooks and m.forwards == 0 and m.mode == P.FORWARDS_IDLE
    # WHEN the rank pauses (no step, no batch) for FORWARD_HOOK_AFTER_S, running its model meanwhile
    for t in range(10, 20):
        m.tick(100.0 + t)
        forward(torch, 3)
    # THEN the hook counts the calls from then on, and the heartbeat says when they last moved
    assert len(torch.hooks) == 1 and m.mode == P.FORWARDS_COUNTING and m.forwards > 0
    m.tick(120.0)
    state = decode(rec.hb.mm)
    assert state.forwards == m.forwards and state.forwards_time == 120.0 and state.forward_mode == "counting"
    # AND the next step removes it
    rec.step_count += 1
    m.tick(121.0)
    assert not torch.hooks and m.mode == P.FORWARDS_IDLE


def test_the_forward_counter_stays_off_once_the_job_compiles(tmp_path: Path) -> None:
    torch = fake_torch()
    rec = FakeRecorder(tmp_path, torch)
    m = M.Motion(rec)
    m.watch_compile(torch)
    for t in range(8):  # a pause: installed
        m.tick(100.0 + t)
    assert torch.hooks
    torch.compile(lambda x: x)  # the job compiles: removed for good, even in the next pause
    for t in range(8, 30):
        m.tick(100.0 + t)
    assert not torch.hooks and m.mode == P.FORWARDS_OFF
    assert decode(rec.hb.mm).forward_mode == "off"


def test_a_torch_without_the_hook_api_switches_the_counter_off_once(tmp_path: Path) -> None:
    torch = types.SimpleNamespace(nn=None)
    rec = FakeRecorder(tmp_path, torch)
    m = M.Motion(rec)
    for t in range(12):
        m.tick(100.0 + t)
    assert [h for h, _ in rec.failures] == ["forwards"] and m.mode == P.FORWARDS_OFF


# --- I/O, from /proc ---------------------------------------------------------------------------------------------


class FakeProc:
    def __init__(self) -> None:
        self.proc = procfs.IoCounters(0, 0, 0, 0)
        self.main = procfs.IoCounters(0, 0, 0, 0)

    def __call__(self, pid: int, tid: Optional[int] = None) -> procfs.IoCounters:
        return self.main if tid is not None else self.proc

    def add(self, main: int = 0, storage: int = 0, other_threads: int = 0) -> None:
        """`main`: bytes through the main thread's writes; `storage`: storage bytes any thread wrote;
        `other_threads`: bytes through other threads' writes (a logger, a pipe)."""
        m, p = self.main, self.proc
        self.main = procfs.IoCounters(m.rchar, m.wchar + main, m.read_bytes, m.write_bytes)
        self.proc = procfs.IoCounters(p.rchar, p.wchar + main + other_threads, p.read_bytes,
                                      p.write_bytes + storage)  # fmt: skip


def test_io_motion_main_thread_bytes_and_storage_past_a_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeProc()
    monkeypatch.setattr(procfs, "io_counters", fake)
    monkeypatch.setattr(procfs, "rw_wakeups", lambda pid, tid: None)
    w = iowatch.IoWatch()
    assert w.sample(0, 7, 100.0).moved_at == 0.0  # the first reading is the baseline
    fake.add(main=10)  # the main thread wrote: a checkpoint to a slow pipe, an index read
    assert w.sample(0, 7, 101.0).moved_at == 101.0
    fake.add(other_threads=50_000, storage=8192)  # a logger thread, the heartbeat page written back: not motion
    assert w.sample(0, 7, 102.0).moved_at == 101.0
    fake.add(storage=iowatch.STORAGE_FLOOR)  # a thread writing a checkpoint to disk while the main thread waits
    io = w.sample(0, 7, 103.0)
    assert io.moved_at == 103.0 and io.written == 10 + 50_000
    # AND after a collection (the dump signal made the main thread write its stacks) nothing counts once
    w.rebase()
    fake.add(main=4096)
    assert w.sample(0, 7, 104.0).moved_at == 103.0
    w.end_poll()
    fake.add(main=1)
    assert w.sample(0, 7, 105.0).moved_at == 105.0


def test_a_long_write_moves_while_its_thread_is_woken_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the main thread inside one write system call (its bytes count only when it returns)
    fake, wakeups = FakeProc(), [None, 5, 9, 9, 9]
    monkeypatch.setattr(procfs, "io_counters", fake)
    monkeypatch.setattr(procfs, "rw_wakeups", lambda pid, tid: wakeups.pop(0))
    w = iowatch.IoWatch()
    # THEN it moves while the kernel wakes it (a slow filesystem taking the bytes), not once the wake-ups stop (a
    # hung server)
    assert [w.sample(0, 7, float(t)).moved_at for t in range(5)] == [0.0, 0.0, 2.0, 2.0, 2.0]


def test_a_real_write_to_a_slowly_drained_pipe_wakes_its_thread() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)  # this side never blocks, whatever the writer has done
    tid: list[int] = []

    def writer() -> None:
        tid.append(threading.get_native_id())
        os.write(w, b"x" * (4 << 20))  # far more than the pipe holds: blocks until drained

    def drain() -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(r, 65536)

    def wakeups() -> Optional[int]:
        return procfs.rw_wakeups(os.getpid(), tid[0]) if tid else None

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        before = wakeups()
        while before is None and time.monotonic() < deadline:  # until it is inside write
            time.sleep(0.01)
            before = wakeups()
        assert before is not None
        after: Optional[int] = before
        while (after is None or after <= before) and time.monotonic() < deadline:  # drained a little at a time
            drain()
            time.sleep(0.05)
            after = wakeups()
        assert after is not None and after > before
    finally:
        while t.is_alive():
            drain()
            t.join(0.01)
        os.close(r)
        os.close(w)


def test_io_last_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeProc()
    monkeypatch.setattr(procfs, "io_counters", fake)
    monkeypatch.setattr(procfs, "rw_wakeups", lambda pid, tid: None)
    w = iowatch.IoWatch()
    for t in range(0, 200):
        fake.add(main=1_000_000)
        io = w.sample(0, 7, float(t))
    assert io.last_minute() == (0, 61_000_000)


def test_procfs_reads_this_process_and_its_main_thread() -> None:
    whole = procfs.io_counters(os.getpid())
    main = procfs.io_counters(os.getpid(), threading.main_thread().native_id)
    assert whole is not None and main is not None and whole.rchar > 0 and main.rchar > 0
    assert procfs.io_counters(2**22 + 12345) is None  # no such process
    assert sys.platform.startswith("linux")


# --- the report: what moved before the bundle -------------------------------------------------------------------


def test_the_report_says_who_was_working_without_a_step_and_who_waited(tmp_path: Path) -> None:
    from blackbox.analyze.verdict import analyze
    from blackbox.bundle.reader import read_bundle
    from blackbox.bundle.writer import BundleWriter
    from blackbox.detections import Trigger

    # GIVEN a bundle taken on request while rank 0 wrote a checkpoint (no step for 70 s) and rank 1 waited for it
    now = time.time() - 5  # the manifest's `created` is in whole seconds
    w = BundleWriter("run-1", "node7", Trigger.parse("manual"))
    written = [{"t": now - 70, "at": now - 70 + k * 10, "step": 8, "phase": "checkpoint", "moved_t": now - 70 + k * 10,
                "written_bytes": 1_000_000 + k * 70_000_000, "stack_changes": 3} for k in range(8)]  # fmt: skip
    waiting = [{"t": now - 70, "at": now - 70, "step": 8, "phase": "collective", "moved_t": now - 70,
                "written_bytes": 5000}]  # fmt: skip
    w.add_json("ranks/0/history.json", written)
    w.add_json("ranks/1/history.json", waiting)
    w.add_json("ranks/2/history.json", [{"at": "soon", "moved_t": [1]}, "junk", 7])  # untrusted: ignored
    for rank in (0, 1, 2):
        w.add_json(f"ranks/{rank}/heartbeat.json", {"rank": rank, "pid": 100 + rank, "alive": True, "step": 8})
    local = [{"rank": r, "pid": 100 + r, "local_rank": r, "recorder": True, "alive": True} for r in (0, 1, 2)]
    path = w.write(str(tmp_path), {"job": {"local_ranks": local, "world_size": 3}}).path
    # THEN one finding says it, with the bytes of the last minute
    texts = [f.text for f in analyze(read_bundle(path)).findings if "without a step" in f.text]
    assert len(texts) == 1 and re.fullmatch(
        r"rank 0 was working without a step \(writing 420 MB in the last minute\), "
        r"while rank 1 waited \(still for 7[45] s and more\)",
        texts[0],
    ), texts


def test_an_unreadable_proc_io_is_said_once_per_rank_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a supervisor's watch over a rank whose /proc/PID/io cannot be read
    from blackbox.supervisor.context import RunContext
    from blackbox.supervisor.watch import Watch

    said: list[str] = []
    written: list[tuple[str, dict[str, object]]] = []
    cfg = types.SimpleNamespace(straggler_factor=2.0, straggler_window=10)
    ctx = RunContext([], cfg, {}, said.append, "run", "node", "/nonexistent", "/")  # type: ignore[arg-type]
    ctx.listeners.append(lambda name, fields: written.append((name, fields)))
    watch = Watch(ctx, None)  # type: ignore[arg-type]
    # WHEN it reads the rank three times
    for _ in range(3):
        watch._io_unreadable(0, 4242)
    ctx.close_speech()
    # THEN it said so once, in the events and aloud
    assert written == [("io_unreadable", {"rank": 0, "pid": 4242, "path": "/proc/4242/io"})]
    assert len(said) == 1 and "/proc/4242/io cannot be read" in said[0]


def test_a_rank_in_a_nested_pid_namespace_is_found_by_its_nspid(tmp_path: Path) -> None:
    # GIVEN a /proc tree with a process that is 7 in its own PID namespace and 301 here, and another 7 of another age
    def proc(pid: int, nspid: str, start: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tpython\nNSpid:\t{nspid}\n")
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (py thon) S 1 " + " ".join(["0"] * 17) + f" {start} 0\n")

    proc(7, "7", 555)
    proc(300, "300\t7", 999)
    proc(301, "301\t7", 555)
    (tmp_path / "self").mkdir()
    # THEN the rank that calls itself 7 and started at 555 is 301 here; no other is taken for it
    assert procfs.in_other_pid_namespace(7, 555, root=str(tmp_path)) == 301
    assert procfs.in_other_pid_namespace(7, 123, root=str(tmp_path)) is None
    assert procfs.in_other_pid_namespace(8, 555, root=str(tmp_path)) is None


def test_a_read_of_a_pipe_woken_by_signals_is_not_woken_by_bytes() -> None:
    # GIVEN a process blocked for good in a read of a pipe nobody writes, its interval timer's signal waking it
    # (Python's handler runs and the read starts again) every 20 ms
    code = ("import os, signal; signal.signal(signal.SIGALRM, lambda *_: None); r, w = os.pipe(); "
            "signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02); print(flush=True); os.read(r, 1)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"\n"

        def switches() -> int:
            return int(procfs._fields(procfs.read_text(f"/proc/{proc.pid}/status"))["voluntary_ctxt_switches"])

        deadline = time.monotonic() + 20
        while procfs.thread_syscall(proc.pid, proc.pid)[0] != "read" and time.monotonic() < deadline:
            time.sleep(0.01)
        before = switches()
        time.sleep(0.5)
        # THEN it was woken many times inside the read, yet none of it counts: no byte can have moved. (Sampled: at
        # any instant it may be running its handler, between two reads — CI once caught it there.)
        assert switches() - before >= 5
        inside = 0
        for _ in range(50):
            if procfs.thread_syscall(proc.pid, proc.pid)[0] == "read":
                inside += 1
                assert procfs.rw_wakeups(proc.pid, proc.pid) is None
            time.sleep(0.01)
        assert inside >= 10, inside
    finally:
        proc.kill()
        proc.wait()


def _sending(stop: threading.Event) -> None:
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        while not stop.is_set():  # 64 KiB every 10 ms: about 6 MB/s
            os.write(fd, b"x" * 65536)
            time.sleep(0.01)
    finally:
        os.close(fd)


def test_the_thread_a_waiting_main_thread_is_as_alive_as_is_named(tmp_path: Path) -> None:
    # GIVEN a main thread that waits (a join) for a thread `upload-0` that sends bytes, in a pause (no step)
    stop = threading.Event()
    worker = threading.Thread(target=_sending, args=(stop,), name="upload-0", daemon=True)
    main = threading.Thread(target=worker.join, daemon=True)
    worker.start()
    main.start()
    rec = FakeRecorder(tmp_path)
    rec.rank_dir = str(tmp_path / "ranks" / "0")
    os.makedirs(rec.rank_dir)
    mover = tmp_path / "ranks" / "0" / P.RANK_MOVER
    m = M.Motion(rec)
    m.watch(main)
    try:
        start = time.monotonic()
        # WHEN its recorder samples it: first within a step's reach (no pause yet), then past FORWARD_HOOK_AFTER_S
        while time.monotonic() - start < M.FORWARD_HOOK_AFTER_S - 1:
            m.tick(time.monotonic())
            time.sleep(0.1)
        # THEN a step's waits name nothing (no file written on the training path)
        assert m.stack_changes >= 3 and not mover.exists()
        while time.monotonic() - start < M.FORWARD_HOOK_AFTER_S + 2:
            m.tick(time.monotonic())
            time.sleep(0.1)
        # AND in the pause the thread is named once, with its native id and its bytes then
        record = json.loads(mover.read_text())
        assert (record["tid"], record["name"]) == (worker.native_id, "upload-0"), record
        assert record["written"] > 0 and not rec.failures
        written_at = mover.stat().st_mtime_ns
        for _ in range(5):
            m.tick(time.monotonic())
            time.sleep(0.1)
        assert mover.stat().st_mtime_ns == written_at  # the same mover: not written again
        # AND the supervisor's words for it: the thread and its rate
        time.sleep(0.5)
        said = movers.describe(str(tmp_path), 0, os.getpid(), time.monotonic(), start)
        assert re.fullmatch(rf"waits for its thread `upload-0` \(tid {worker.native_id}\), which works: writing "
                            r"[\d.]+ MB/s", said), said  # fmt: skip
        # AND in a later pause, before its recorder named anyone, an earlier pause's mover is not named
        assert movers.describe(str(tmp_path), 0, os.getpid(), time.monotonic(), time.monotonic()) == ""
    finally:
        stop.set()
        worker.join(5)
    # AND a thread gone keeps nothing alive: no words (gone from the kernel: join() returns as its Python part ends,
    # a moment before its task leaves /proc — under load the words below were once read in that moment)
    wait_for(lambda: not os.path.exists(f"/proc/self/task/{worker.native_id}"), 10, "the thread's task to end")
    assert movers.describe(str(tmp_path), 0, os.getpid(), time.monotonic(), start) == ""


def _trickle(stop: threading.Event, path: str) -> None:
    """A slow upload: a few hundred bytes at a time, far below a disk's speed."""
    with open(path, "wb", buffering=0) as f:
        while not stop.is_set():
            f.write(b"x" * 500)
            time.sleep(0.05)


def _think(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


@pytest.mark.parametrize(("target", "words"), [("trickle", r"writing [\d.]+ k?B/s"), ("think", "running Python code")])
def test_a_movers_bytes_are_named_however_slow(tmp_path: Path, target: str, words: str) -> None:
    # GIVEN a thread its recorder named as the mover: one that sends a trickle of bytes, one that only computes
    stop = threading.Event()
    args = (stop, str(tmp_path / "out")) if target == "trickle" else (stop,)
    worker = threading.Thread(target=_trickle if target == "trickle" else _think, args=args, name="upload-0")
    worker.start()
    try:
        io = procfs.io_counters(os.getpid(), worker.native_id)
        assert io is not None
        (tmp_path / "ranks" / "0").mkdir(parents=True)
        (tmp_path / "ranks" / "0" / P.RANK_MOVER).write_text(json.dumps(
            {"tid": worker.native_id, "name": "upload-0", "at": time.monotonic(), "read": io.rchar,
             "written": io.wchar}))  # fmt: skip
        time.sleep(1.0)
        # WHEN the supervisor says what it does
        said = movers.describe(str(tmp_path), 0, os.getpid(), time.monotonic(), 0.0)
    finally:
        stop.set()
        worker.join(5)
    # THEN a trickle of bytes is named as bytes (10 kB/s, not "running Python code"), and no byte as Python code
    expected = rf"waits for its thread `upload-0` \(tid {worker.native_id}\), which works: {words}"
    assert re.fullmatch(expected, said), said


@pytest.mark.parametrize(
    "record",
    [
        '{"tid": "1", "name": "x", "at": 0, "read": 0, "written": 0}',
        "[]",
        "{",
        "",
        '{"tid": 1, "name": 5, "at": 0, "read": 0, "written": 0}',
    ],
)
def test_a_mover_record_that_does_not_fit_names_nothing(tmp_path: Path, record: str) -> None:
    (tmp_path / "ranks" / "0").mkdir(parents=True)
    (tmp_path / "ranks" / "0" / P.RANK_MOVER).write_text(record)
    assert movers.describe(str(tmp_path), 0, os.getpid(), time.monotonic(), 0.0) == ""


def test_a_loop_whose_wakeups_grow_apart_backs_off_and_sleeps_one_at_a_steady_pace_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN (at a tenth of the production scale: samples 50 ms apart, BACKOFF_MIN_S 0.3 s) a main thread retrying on
    # a doubling timer — a rate-limited service's backoff, an ambiguous wait — whose jittered wait once comes short,
    # then capped; and one that checks a marker at a steady pace, a poll loop: a wait nothing will end
    monkeypatch.setattr(M, "BACKOFF_MIN_S", 0.3)

    def retrying() -> None:
        # its wake-ups 0.3, 0.6 and 1.2 s apart (a sampler that lags 50 ms on a loaded machine still sees 0.6 grow
        # past 1.5 times 0.35), then one jittered short, then capped
        for delay in (0.15, 0.3, 0.6, 1.2, 0.2, 1.2, 1.2):
            time.sleep(delay)
            sum(range(20000))  # the attempt, a moment's CPU

    def checking() -> None:
        for _ in range(24):
            time.sleep(0.1)
            sum(range(20000))

    for target, expected in ((retrying, P.WAIT_SLEEP), (checking, P.WAIT_POLL)):
        seen = _waits(tmp_path, target)
        # THEN once its wake-ups have come further apart than its first two twice, the backoff sleeps — to its end,
        # the short wait too; the steady loop polls
        if expected == P.WAIT_SLEEP:
            polled = seen.index(P.WAIT_POLL)  # its first wake-ups: a loop, not yet known to back off
            backed_off = seen.index(P.WAIT_SLEEP, polled)
            assert set(seen[backed_off:]) == {P.WAIT_SLEEP} and len(seen) - backed_off >= 30, (target.__name__, seen)
        else:
            # (a sample delayed on a loaded machine may make one gap look long for a moment: most of the end, not all)
            assert seen[-8:].count(expected) >= 6, (target.__name__, seen)


def test_a_steady_loop_polls_though_its_sampler_comes_late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN (at a tenth of the production scale) a main thread that checks a marker every 0.3 s — BACKOFF_MIN_S — and a
    # sampler that, as on a loaded machine, comes 0.15 s late every second: a wake-up seen late makes one gap look
    # long and the next short (taken from the samples' times, the loop's closest two come 0.15 s apart, and every
    # steady gap after looks grown)
    monkeypatch.setattr(M, "BACKOFF_MIN_S", 0.3)

    def checking() -> None:
        for _ in range(16):
            time.sleep(0.3)
            sum(range(20000))

    seen = _waits(tmp_path, checking, lambda n: time.sleep(0.2 if n % 20 == 0 else 0.05))
    # THEN from its first wake-up seen to its end, it polls: a late sample widens what is known of a gap, never grows it
    polled = seen.index(P.WAIT_POLL)
    assert set(seen[polled:]) == {P.WAIT_POLL} and len(seen) - polled >= 50, seen


def test_a_wakeup_seen_while_the_thread_waits_for_the_gil_counts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN (at a tenth of the production scale) a main thread that checks every 0.5 s, and a sample taken while it
    # has woken from its sleep but waits for the GIL (the sampler's thread holds it): its frames stand at the sleep's
    # instruction, its CPU time moved
    monkeypatch.setattr(M, "BACKOFF_MIN_S", 0.3)
    started = time.monotonic()

    def checking() -> None:
        for k in range(1, 9):
            time.sleep(max(0.0, started + 0.5 * k - time.monotonic()))
            sum(range(20000))

    held: list[int] = []

    def pause(n: int) -> None:
        time.sleep(0.05)
        if not held and time.monotonic() + 0.05 >= started + 1.47:  # across the third wake-up, then a sample with
            held.append(n)  # the GIL still held
            time.sleep(max(0.0, started + 1.47 - time.monotonic()))
            while time.monotonic() < started + 1.53:
                pass

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # the GIL stays with the sampler's thread while it computes
    try:
        seen = _waits(tmp_path, checking, pause)
    finally:
        sys.setswitchinterval(interval)
    # THEN it polls from its first wake-up seen to its end: the wake-up was not counted twice (two counts 50 ms apart
    # made its closest gap 0.1 s, and each steady gap after looked grown: a backoff)
    polled = seen.index(P.WAIT_POLL)
    assert set(seen[polled:]) == {P.WAIT_POLL} and len(seen) - polled >= 50, seen


def _waits(
    tmp_path: Path, target: Callable[[], None], pause: Callable[[int], None] = lambda n: time.sleep(0.05)
) -> list[int]:
    """What a Motion sampling `target`, run as its main thread, found it waiting for (P.WAIT_*), sample by sample
    (`pause` after sample n: 50 ms), until it ends."""
    main = threading.Thread(target=target, daemon=True)
    main.start()
    m = M.Motion(FakeRecorder(tmp_path))
    m.watch(main)
    seen: list[int] = []
    while main.is_alive() and len(seen) < 150:
        m.tick(time.monotonic())
        seen.append(m.waiting)
        pause(len(seen))
    return seen


def test_one_sleep_a_timer_signal_interrupts_is_no_loop(tmp_path: Path) -> None:
    # GIVEN a main thread in one 3 s sleep, interrupted five times a second by a signal whose handler does nothing
    # (a signal-based sampling profiler's timer): each interruption returns from the system call, uses a moment's
    # CPU and sleeps again to the same deadline (Python >= 3.11: clock_nanosleep with TIMER_ABSTIME)
    if sys.version_info < (3, 11):
        pytest.skip("time.sleep sleeps to an absolute deadline from Python 3.11")
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    stop = threading.Event()
    sleeper: list[threading.Thread] = []

    def sleeping() -> None:
        sleeper.append(threading.current_thread())
        time.sleep(3.0)
        stop.set()

    def interrupt() -> None:
        while not stop.wait(0.2):
            if sleeper:
                with contextlib.suppress(ProcessLookupError):
                    signal.pthread_kill(sleeper[0].ident or 0, signal.SIGALRM)

    try:
        threading.Thread(target=interrupt, daemon=True).start()
        seen = _waits(tmp_path, sleeping)
    finally:
        stop.set()
        signal.signal(signal.SIGALRM, previous)
    # THEN it sleeps, from its first sample to its end: no wake-up of a loop
    assert set(seen[1:]) == {P.WAIT_SLEEP} and len(seen) >= 40, seen
