"""A healthy 2-rank DDP job (gloo, CPU) with one long, legitimate pause: after a few steps rank 0 alone does CASE for
BB_PAUSE_S seconds (default 75: longer than the `auto` stall timeout, 60 s) while rank 1 waits for it at
`dist.barrier()`; then both take a few more steps and exit 0. With BB_PAUSE_STEP=0 the pause comes before the first
batch, once the group is set up (the start-up: weights read from a slow server, a pool of workers preparing). The
quiet gallery (tests/integration/test_quiet.py) runs every case under `blackbox run` with default options: none may
be called a stall.

    torchrun --standalone --nproc-per-node 2 tests/programs/quiet_job.py CASE

Cases: save (torch.save to slow storage: a FIFO drained by a slow reader process), forward (evaluation: forward
passes under no_grad, each one large matmul), loader (evaluation over a validation DataLoader whose samples take a
moment to load), metrics (metrics in pure Python, no model), index (reading a large file slowly: an index build),
dcp (torch.distributed.checkpoint save to storage whose every write takes a moment), compile (a first step that
takes long to compile: before any optimizer step rank 0 spends the pause in Python, as dynamo and inductor do, while
rank 1 waits for it in backward), tool (an external tool run with subprocess.run: a shell pipeline that compresses
as it goes, `… | gzip -1 > file`), captured (the same tool with capture_output=True: rank 0 polls its silent output
pipes), workers (a DataLoader whose two workers take the whole pause to load the first batch, reading slowly),
upload (an upload in a thread to a slow peer: the main thread waits on its future), polled-upload (the same, the
future checked in a loop with a sleep), polled-tool (the tool of `tool` started with Popen and watched in a loop,
`while p.poll() is None: sleep`), scoring (a process pool whose two workers each score for the whole pause), native
(hashing shards: one GIL-releasing native call after another), stream (the next shard read from a FIFO that a
producer started beside the job makes for the whole pause, compressing as it goes). And six
that are not quiet: stuck (rank 0 waits for a child that waits for input that never comes: a credential prompt),
ema-hang (rank 0's main thread blocks for good in a read while a thread of its own keeps running a module),
woken-read (rank 0 blocks for good in a read of a pipe while an interval timer's signal wakes it five times a
second), stale-lock (a `filelock` another process holds forever: it polls every 50 ms), marker (a loop that waits
for a marker file nothing writes; slow-marker: checking every 5 s) and store-poll (a loop that polls the job's store
for a key no rank sets). And nap:
rank 0 sleeps the pause (with a short --stall-timeout, a stall whose rank moves again while its evidence is
collected). For tests/integration/test_flush.py: flush (a checkpoint fsynced while a throttled disk takes it) and
dirty (a hang: a checkpoint written through the page cache to a disk that takes nothing). For the hang
benchmark (scripts/hangbench.py): pool (scoring in a multiprocessing.Pool for the pause, every CPU busy),
oversubscribed (evaluation while two burning processes take the CPUs), thread-deadlock (a hang: the main thread
and a thread of its own each wait for the other's lock), and the whole life of a rank: prep (rank 0 prepares in
pure Python for the pause before it joins the group, rank 1 waits in rendezvous), backoff (rank 0 sleeps the pause
on a retry's doubling timer), jittered-backoff (the same on a full-jitter timer, as tenacity's
wait_random_exponential and botocore's retries wait: a random share of a doubling wait capped at 20 s — its waits from
a fixed seed, one whose short wait after a long one the rule before 2026-12-07 took for a poll loop), profiled-sleep
(rank 0 sleeps the pause in one call that a sampling profiler's timer signal interrupts five times a second), gil-native
(rank 0 holds the GIL in one native call for the pause), exit-upload (training is over: a non-daemon thread of
rank 0 uploads to a slow peer for the pause while its interpreter exits; rank 1 has exited) — healthy — and two
hangs at the end: exit-read (a non-daemon thread of rank 0 reads a pipe nobody writes: it cannot exit) and
final-barrier (rank 0 writes its final metrics to a pipe nobody reads while rank 1 waits in the final barrier)."""

import contextlib
import gc
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, TensorDataset

CASE = sys.argv[1]
PAUSE_S = float(os.environ.get("BB_PAUSE_S", "75"))
STEPS_BEFORE = 8  # past `auto`'s 5 steps: its 60 s timeout is in force when the pause comes
PAUSE_STEP = int(os.environ.get("BB_PAUSE_STEP", STEPS_BEFORE))  # 0: before the first batch, in the start-up
CHUNK = 1 << 16
AT_END = ("exit-upload", "exit-read", "final-barrier")  # cases whose pause comes after the training loop
WORK = tempfile.mkdtemp(prefix="bb-quiet-")

READER = """
import sys, time
fifo, delay = sys.argv[1], float(sys.argv[2])
with open(fifo, "rb") as f:
    while f.read(65536):
        time.sleep(delay)
"""


def slow_save(deadline: float) -> None:
    """torch.save to a FIFO whose reader (another process: a slow network filesystem) takes 64 KiB at a time."""
    fifo = os.path.join(WORK, "ckpt.pt")
    os.mkfifo(fifo)
    size = int((deadline - time.monotonic()) * 10 * CHUNK)  # at 10 chunks a second
    reader = subprocess.Popen([sys.executable, "-c", READER, fifo, "0.1"])
    torch.save({"weights": torch.zeros(size // 4)}, fifo)
    reader.wait()


def forward(deadline: float) -> None:
    """Evaluation alone: forward passes under no_grad, each one large matmul (nearly all of it in one C call)."""
    evaluator = torch.nn.Sequential(torch.nn.Linear(1536, 1536))
    x = torch.randn(1536, 1536)
    total = 0.0
    with torch.no_grad():
        while time.monotonic() < deadline:
            total += float(evaluator(x)[0, 0])
    print(f"rank 0: eval total {total:.3f}", flush=True)


class SlowSamples(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple:
        time.sleep(0.2)  # a slow disk
        return torch.randn(8), torch.randn(1)


def loader(deadline: float, model: torch.nn.Module) -> None:
    """Evaluation over a validation DataLoader, taking batches the whole time."""
    with torch.no_grad():
        for x, _ in DataLoader(SlowSamples(), batch_size=2):
            model.module(x)
            if time.monotonic() >= deadline:
                break


def metrics(deadline: float) -> None:
    """Metrics in pure Python, without the model: token-level F1 over many pairs."""

    def f1(a: list, b: list) -> float:
        common = len(set(a) & set(b))
        return 0.0 if not common else 2 * common / (len(a) + len(b))

    n, score = 0, 0.0
    while time.monotonic() < deadline:
        pred = [(n * 7 + i) % 50 for i in range(20)]
        gold = [(n * 11 + i) % 50 for i in range(20)]
        score += f1(pred, gold)
        n += 1
    print(f"rank 0: mean f1 {score / max(n, 1):.3f}", flush=True)


def index(deadline: float) -> None:
    """An index build: a large file read 64 KiB at a time, slowly (a checksum per block)."""
    path = os.path.join(WORK, "corpus.bin")
    with open(path, "wb") as f:
        f.truncate(int((deadline - time.monotonic()) * 10 * CHUNK))
    blocks = []
    with open(path, "rb") as f:
        while time.monotonic() < deadline:
            block = f.read(CHUNK)
            if not block:
                f.seek(0)
                continue
            blocks.append(zlib.crc32(block))
            time.sleep(0.1)
    print(f"rank 0: indexed {len(blocks)} blocks", flush=True)


class SlowStream(io.RawIOBase):
    """A file on storage whose every write takes a moment (a busy network filesystem)."""

    def __init__(self, f: io.IOBase, delay: float) -> None:
        self.f, self.delay = f, delay

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:
        view = memoryview(b).cast("B")
        for i in range(0, len(view), CHUNK):
            time.sleep(self.delay)
            self.f.write(view[i : i + CHUNK])
        return len(view)

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()


def dcp(deadline: float, model: torch.nn.Module) -> None:
    """torch.distributed.checkpoint save, on rank 0 alone (no_dist), to slow storage."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

    size = int((deadline - time.monotonic()) * 10 * CHUNK)

    class SlowFS(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):  # type: ignore[no-untyped-def]
            with super().create_stream(path, mode) as f:
                yield SlowStream(f, 0.1) if "w" in mode else f

    writer = FileSystemWriter(os.path.join(WORK, "dcp"))
    writer.fs = SlowFS()
    dcp.save({"model": model.state_dict(), "extra": torch.zeros(size // 4)}, storage_writer=writer, no_dist=True)


TOOL = "while [ $(date +%s) -lt {end} ]; do head -c 65536 /dev/urandom; sleep 0.1; done | gzip -1 > {out}"


def flush(deadline: float) -> None:
    """A checkpoint whose bytes are flushed at the end (`torch.save`, then `os.fsync`, as DCP's `sync_files=True`
    does): written to the page cache in a moment, then the pause in fsync while a slow disk takes them (BB_FLUSH_DIR:
    a filesystem on a throttled device; BB_FLUSH_MB: how much, a whole pause's worth)."""
    with open(os.path.join(os.environ["BB_FLUSH_DIR"], "ckpt.pt"), "wb") as f:
        torch.save(torch.zeros(int(os.environ["BB_FLUSH_MB"]) << 18), f)  # float32: MB << 18 of them, MB MiB
        f.flush()
        os.fsync(f.fileno())


def dirty(deadline: float) -> None:
    """A hang: a checkpoint written through the page cache over the last one (BB_FLUSH_DIR/ckpt.pt) on a store that
    takes nothing (a dead NFS server, a hung disk): past the dirty limit the kernel holds the write in
    balance_dirty_pages, waking it every 200 ms, for good."""
    with open(os.path.join(os.environ["BB_FLUSH_DIR"], "ckpt.pt"), "r+b") as f:
        torch.save(torch.zeros(int(os.environ["BB_FLUSH_MB"]) << 18), f)


def tool(deadline: float, capture: bool = False) -> None:
    """An external tool that works the whole pause, writing as it goes: rank 0 waits in wait4, or polls its
    silent output pipes."""
    end = int(time.time() + deadline - time.monotonic())
    script = TOOL.format(end=end, out=os.path.join(WORK, "ckpt.gz"))
    subprocess.run(["sh", "-c", script], check=True, capture_output=capture)


def stream(deadline: float) -> None:
    """The next shard from a FIFO that a producer started beside the job feeds (not the rank's child: the shell that
    starts it exits at once): the producer makes the shard the whole pause — a pipeline that compresses as it goes,
    which does not hold the FIFO — then writes it. Rank 0's read of the FIFO waits all that while."""
    end = int(time.time() + deadline - time.monotonic())
    fifo = os.path.join(WORK, "stream")
    os.mkfifo(fifo)
    work = TOOL.format(end=end, out=os.path.join(WORK, "shard.gz"))
    subprocess.run(["sh", "-c", f"(exec 3> {fifo}; {{ {work}; }} 3>&-; cat {WORK}/shard.gz >&3) &"], check=True)
    with open(fifo, "rb") as f:
        f.read()


def native(deadline: float) -> None:
    """Hashing shards: one GIL-releasing native call after another (as hashlib, zlib, a tokenizer's batch encode or
    one CPU op an iteration are), every sample finding the main thread in the same call."""
    import hashlib

    shard = os.urandom(32 << 20)
    hashed = 0
    while time.monotonic() < deadline:
        hashed += len(hashlib.sha256(shard).digest())
    print(f"rank 0: hashed {hashed // 32} shards", flush=True)


def polled_tool(deadline: float) -> None:
    """The external tool of `tool`, started and watched in a loop (`while p.poll() is None: sleep`): rank 0 sleeps
    and checks while its child works."""
    end = int(time.time() + deadline - time.monotonic())
    child = subprocess.Popen(["sh", "-c", TOOL.format(end=end, out=os.path.join(WORK, "ckpt.gz"))])
    while child.poll() is None:
        time.sleep(0.2)


class SlowReads(Dataset):
    """Samples read from a file 64 KiB at a time, slowly (a busy network filesystem)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple:
        with open(self.path, "rb") as f:
            f.seek(i % 16 * CHUNK)
            f.read(CHUNK)
        time.sleep(0.1)
        return torch.randn(8), torch.randn(1)


def workers(deadline: float) -> None:
    """A DataLoader whose two workers take the whole pause to load the first batch (an epoch's first, the workers
    just started): the main thread polls their result queue."""
    path = os.path.join(WORK, "shard.bin")
    with open(path, "wb") as f:
        f.truncate(16 * CHUNK)
    size = int((deadline - time.monotonic()) / 0.1)
    batch = next(iter(DataLoader(SlowReads(path), batch_size=size, num_workers=2)))
    print(f"rank 0: first batch of {len(batch[0])}", flush=True)


def upload(deadline: float, poll: bool = False) -> None:
    """An upload in a thread (boto3's transfer manager, huggingface_hub): the main thread waits on its future (or,
    `poll`, checks it in a loop with a sleep) while the thread sends part after part to a slow peer (a pipe drained
    by another process, 64 KiB at a time): the thread's stack stands inside one write while its bytes move."""
    from concurrent.futures import ThreadPoolExecutor

    fifo = os.path.join(WORK, "upload")
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c", READER, fifo, "0.1"])

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(upload_parts, deadline, fifo, reader)
        while poll and not future.done():
            time.sleep(0.5)
        print(f"rank 0: uploaded {future.result()} parts", flush=True)


def upload_parts(deadline: float, fifo: str = "", reader: "subprocess.Popen[bytes] | None" = None) -> int:
    """Part after part to a slow peer (a pipe drained by another process, 64 KiB at a time) until `deadline`."""
    if reader is None:
        fifo = os.path.join(WORK, "upload-at-exit")
        os.mkfifo(fifo)
        reader = subprocess.Popen([sys.executable, "-c", READER, fifo, "0.1"])
    sent = 0
    with open(fifo, "wb", buffering=0) as f:
        while time.monotonic() < deadline:
            sent += f.write(bytes(CHUNK))
    reader.wait()
    return sent // CHUNK


def ema_hang(deadline: float, model: torch.nn.Module) -> None:
    """A hang: rank 0's main thread blocks for good in a read, while a thread of its own keeps running a module
    (an EMA or teacher model)."""
    import threading

    def teacher() -> None:
        with torch.no_grad():
            while True:
                model.module(torch.randn(4, 8))
                time.sleep(0.05)

    threading.Thread(target=teacher, daemon=True).start()
    r, _w = os.pipe()
    os.read(r, 1)


def woken_read(deadline: float) -> None:
    """A hang: rank 0 blocks for good in a read of a pipe nobody writes, while an interval timer (a profiler's, a
    watchdog's) interrupts it five times a second: each signal wakes it, and Python reads again."""
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
    r, _w = os.pipe()
    os.read(r, 1)


def stuck(deadline: float) -> None:
    """A child that waits for input that never comes (a credential prompt): rank 0 waits for it for good."""
    r, _w = os.pipe()
    subprocess.run(["cat"], stdin=r)


HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
open(sys.argv[1] + ".held", "w").close()
time.sleep(10**6)
"""


def stale_lock(deadline: float) -> None:
    """A hang: rank 0 waits for a lock file (the `filelock` of a model cache) that another process took and never
    lets go (a download hung while holding it); the lock polls every 50 ms, forever."""
    from filelock import FileLock

    path = os.path.join(WORK, "model.lock")
    subprocess.Popen([sys.executable, "-c", HOLDER, path])
    while not os.path.exists(path + ".held"):
        time.sleep(0.05)
    FileLock(path).acquire()


def marker(deadline: float, every: float = 0.1) -> None:
    """A hang: rank 0 waits in a loop for a marker file nothing will write (an earlier stage's `DONE` file)."""
    path = os.path.join(WORK, "stage1.done")
    while not os.path.exists(path):
        time.sleep(every)


def slow_marker(deadline: float) -> None:
    """The same, checking every 5 s (a steady pace a loaded machine's late samples made look like a backoff)."""
    marker(deadline, every=5.0)


def store_poll(deadline: float) -> None:
    """A hang: rank 0 polls the job's store for a key no rank sets (`while not store.check([key])`)."""
    store = dist.distributed_c10d._get_default_store()
    while not store.check(["blackbox-test/never-set"]):
        time.sleep(0.2)


def thread_deadlock(deadline: float) -> None:
    """A hang: rank 0's main thread and a prefetch thread of its own each hold one lock and wait for the other."""
    import threading

    first, second = threading.Lock(), threading.Lock()

    def prefetch() -> None:
        with second:
            time.sleep(0.2)
            with first:
                pass

    with first:
        threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
        time.sleep(0.2)
        with second:
            pass


def _score(n: int) -> int:
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        n = (n * 31 + 7) % 1_000_003
    return n


def pool(deadline: float) -> None:
    """Scoring samples in a process pool: one `Pool.map` whose two workers compute for the whole pause while the main
    thread waits for the results."""
    import multiprocessing

    chunks = max(1, int((deadline - time.monotonic()) / 0.5) * 2)
    with multiprocessing.get_context("fork").Pool(2) as workers_pool:
        print(f"rank 0: scored {len(workers_pool.map(_score, range(chunks), chunksize=1))} chunks", flush=True)


def _score_until(deadline: float) -> int:
    n = 0
    while time.monotonic() < deadline:
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            n = (n * 31 + 7) % 1_000_003
        time.sleep(0.18)  # a tenth of a CPU: scoring that waits on a model server now and then
    return n


def scoring(deadline: float) -> None:
    """Scoring in a process pool whose workers each take one long task for the whole pause (`Pool.map` with
    chunksize=1): the main thread waits on the pool's result event while only the workers move (a tenth of a CPU
    each; the pool's threads only wake)."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as workers_pool:
        print(f"rank 0: scored {len(workers_pool.map(_score_until, [deadline] * 2, chunksize=1))} tasks", flush=True)


def oversubscribed(deadline: float) -> None:
    """Evaluation (as `forward`) while two processes of the job's node burn the CPUs it has: everything slower."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        forward(deadline)
    finally:
        for b in burners:
            b.kill()
            b.wait()


def compiling(seconds: float) -> None:
    """What a compiler does for a long while: walk and rewrite graphs in Python."""
    deadline = time.monotonic() + seconds
    graph: dict = {}
    while time.monotonic() < deadline:
        for node in range(200):
            graph[node] = [(node * 31 + k) % 200 for k in range(4)]
        order = sorted(graph, key=lambda n: sum(graph[n]))
        graph = {n: graph[n] for n in order[:100]}


def prep() -> None:
    """Before the group: rank 0 prepares (tokenizing, indexing) in pure Python for the pause; the others wait in
    rendezvous for it."""
    if os.environ.get("RANK") == "0":
        print("rank 0: pausing (prep)", flush=True)
        started = time.monotonic()
        compiling(PAUSE_S)
        print(f"rank 0: paused {time.monotonic() - started:.1f} s (prep)", flush=True)


def backoff(deadline: float) -> None:
    """A retry's backoff: asleep on a doubling timer (a rate-limited service), nothing else to do meanwhile."""
    delay = 2.0
    while time.monotonic() < deadline:
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay *= 2


def profiled_sleep(deadline: float) -> None:
    """One sleep for the pause, interrupted five times a second by a signal-based sampling profiler's timer
    (setitimer; its handler records nothing here)."""
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
    try:
        time.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def jittered_backoff(deadline: float) -> None:
    """A retry's full-jitter backoff: asleep a random share of a doubling wait, capped at 20 s (0.97 s, 0.02, 2.94,
    1.26, 15.78, 0.34, 17.59 ...), nothing else to do meanwhile."""
    import random

    rng = random.Random(15)
    ceiling = 1.0
    while time.monotonic() < deadline:
        time.sleep(min(rng.uniform(0, ceiling), max(0.0, deadline - time.monotonic())))
        ceiling = min(2 * ceiling, 20.0)


def gil_native(deadline: float) -> None:
    """One native call that holds the GIL for the pause (a C extension that never releases it)."""
    import ctypes

    ctypes.PyDLL(None).sleep(max(1, int(deadline - time.monotonic())))


def at_exit(rank: int) -> None:
    """The end of the job's life, after its group is gone: a non-daemon thread the interpreter waits for as it
    exits (exit-upload: a slow upload that moves; exit-read: a read of a pipe nobody writes)."""
    import threading

    if rank != 0 or CASE not in ("exit-upload", "exit-read"):
        return
    print(f"rank 0: pausing ({CASE})", flush=True)
    deadline = time.monotonic() + PAUSE_S
    if CASE == "exit-upload":
        threading.Thread(target=upload_parts, args=(deadline,), name="ckpt-upload").start()
        return
    fifo = os.path.join(WORK, "log-pipe")
    os.mkfifo(fifo)

    def ship() -> None:
        with open(fifo, "rb") as f:  # no writer will ever come
            f.read()

    threading.Thread(target=ship, name="log-shipper").start()


def final_metrics(rank: int) -> None:
    """final-barrier: rank 0 writes its final metrics to a pipe nobody reads (a dead mount), before the barrier."""
    if rank == 0 and CASE == "final-barrier":
        print("rank 0: pausing (final-barrier)", flush=True)
        fifo = os.path.join(WORK, "metrics.json")
        os.mkfifo(fifo)
        with open(fifo, "w") as f:  # opening a FIFO for writing blocks until a reader comes
            f.write("{}")


def main() -> None:
    if CASE == "prep":
        prep()
    # BB_PG_TIMEOUT_S: the timeout a team sets in its own init_process_group (the hang benchmark's PyTorch contender)
    pg_timeout = os.environ.get("BB_PG_TIMEOUT_S")
    dist.init_process_group("gloo", **({"timeout": timedelta(seconds=float(pg_timeout))} if pg_timeout else {}))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn((STEPS_BEFORE + 3) * 4, 8), torch.randn((STEPS_BEFORE + 3) * 4, 1))
    if PAUSE_STEP == 0 and CASE not in ("compile", "prep", *AT_END):  # before the first batch: the start-up's own
        pause(rank, model)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=4), 1):
        if step == 1 and CASE == "compile":  # the first step compiles: rank 0's takes the pause, rank 1's a moment
            if rank == 0:
                print(f"rank 0: pausing ({CASE})", flush=True)
            started = time.monotonic()
            compiling(PAUSE_S if rank == 0 else 1.0)
            if rank == 0:
                print(f"rank 0: paused {time.monotonic() - started:.1f} s ({CASE})", flush=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == PAUSE_STEP and CASE not in ("compile", "prep", *AT_END):
            pause(rank, model)
    final_metrics(rank)
    print(f"rank {rank}: done", flush=True)
    dist.barrier()  # the final barrier
    dist.destroy_process_group()
    gc.collect()  # torch 2.13: a gloo group freed during finalization can abort the process
    at_exit(rank)


def pause(rank: int, model: DistributedDataParallel) -> None:
    """Rank 0 does CASE for the pause while rank 1 waits for it at a barrier."""
    if rank == 0:
        print(f"rank 0: pausing ({CASE})", flush=True)  # the pause's onset, for the hang benchmark
        started = time.monotonic()
        deadline = started + PAUSE_S
        work = {
            "save": slow_save,
            "forward": forward,
            "metrics": metrics,
            "index": index,
            "tool": tool,
            "captured": lambda d: tool(d, capture=True),
            "workers": workers,
            "stuck": stuck,
            "woken-read": woken_read,
            "nap": lambda d: time.sleep(max(0.0, d - time.monotonic())),
            "upload": upload,
            "polled-upload": lambda d: upload(d, poll=True),
            "polled-tool": polled_tool,
            "marker": marker,
            "slow-marker": slow_marker,
            "store-poll": store_poll,
            "stale-lock": stale_lock,
            "thread-deadlock": thread_deadlock,
            "pool": pool,
            "scoring": scoring,
            "native": native,
            "stream": stream,
            "flush": flush,
            "dirty": dirty,
            "oversubscribed": oversubscribed,
            "backoff": backoff,
            "jittered-backoff": jittered_backoff,
            "profiled-sleep": profiled_sleep,
            "gil-native": gil_native,
        }
        if CASE in work:
            work[CASE](deadline)
        else:
            {"loader": loader, "dcp": dcp, "ema-hang": ema_hang}[CASE](deadline, model)
        print(f"rank 0: paused {time.monotonic() - started:.1f} s ({CASE})", flush=True)
    dist.barrier()  # rank 1 waits here for rank 0 the whole pause


if __name__ == "__main__":
    main()
