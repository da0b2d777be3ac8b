"""The scenario gallery's training job: a small real model step on the CPU with gloo (a DataLoader, forward,
backward, gradient all_reduce, SGD), in which one rank meets a chosen failure at step 3. The verdict each
scenario must get is in scenarios.json beside this file; tests/integration/test_scenarios.py runs them all
under `blackbox run`.

    torchrun --standalone --nproc-per-node 2 scripts/scenarios/train.py SCENARIO RANK[,RANK...] [MODEL]
    srun --ntasks 2 python scripts/scenarios/train.py SCENARIO RANK   (ranks from SLURM_PROCID, MASTER_ADDR/PORT set)

MODEL is how the gradients are reduced, as real jobs do it: `plain` (the default: the job's own dist.all_reduce
from Python), `ddp` (DistributedDataParallel: the reducer's all_reduce from C++ inside backward()) or `fsdp`
(FSDP2 `fully_shard` on a CPU device mesh: all-gathers in forward, reduce-scatters in backward, from library code).

With BB_FAIL_WHEN=PATH in the environment, steps take 0.1 s and the failure comes once PATH exists rather than
at step 3 (the multi-node tests choose the moment).

The pace scenarios (steady, jitter, data-straggler, compute-straggler) are not failures: every step does PACE_S of
work, for BB_STEPS steps (default 600); `jitter` adds up to 50 ms at random to every rank's step, and from step 3
the straggler rank takes 80 ms more per step in its loader (a slow disk) or in its own compute (a hot GPU).
With BB_MARK=1 the pace scenario's RANK says `rank N: at step S` at step BB_STEP_AT and goes on: the moment the
hang benchmark takes the network between two hosts down.

With BB_EXIT_S=N the `raise` scenario's bad rank takes N seconds to exit after its exception (a non-daemon thread
of its own still working): the launcher tears the survivor down only then.

Two scenarios read their data without a DataLoader, as many real jobs do: `memmap-hang` maps its token shard with
`np.memmap` in a `get_batch()` each step (the nanoGPT shape, written here on its own), and the bad rank's shard
lives on a mount that stopped answering (a FIFO: the open blocks in the kernel); `socket-read` asks a small
service for its learning rate each step over TCP, and the bad rank's service stops answering (a blocked recv).

Scenarios: healthy, straggler, data-hang, data-hang-workers, read-failure, ckpt-hang, spin, gil-hang,
skip-allreduce, collective-hang, mismatch, comm-timeout, raise, oom, cuda-error, segv, sigkill, sigusr1-user,
stopped, kernel-hang, marker-hang, exit-early, exit-code, memmap-hang, socket-read, init-hang; steady, jitter,
data-straggler, compute-straggler."""

import ctypes
import gc
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from models import wrap  # beside this file
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset

SCENARIO, STEP_AT = sys.argv[1], int(os.environ.get("BB_STEP_AT", "3"))  # 0: in the very first batch
BAD_RANKS = {int(r) for r in sys.argv[2].split(",")}
MODELS = ("plain", "ddp", "fsdp")
MODEL = next((a for a in sys.argv[3:] if a in MODELS), "plain")  # other arguments (a config file) are the job's
FAIL_WHEN = os.environ.get("BB_FAIL_WHEN")
PACE = ("steady", "jitter", "data-straggler", "compute-straggler")
PACE_S, SLOWER_S = 0.05, 0.08  # a pace scenario's work per step, and the straggler's extra
STEPS = (30 if SCENARIO in ("healthy", "straggler") else int(os.environ.get("BB_STEPS", "600")) if SCENARIO in PACE
         else 100_000 if FAIL_WHEN else 1000)  # fmt: skip
WORK = tempfile.mkdtemp(prefix="bb-scenario-")
MARKER = os.path.join(WORK, "stage1.done")  # marker-hang: a file nothing writes
FIFO = os.path.join(WORK, "fifo")  # opening it blocks until a peer comes: a dead network filesystem
os.mkfifo(FIFO)
SHARD = os.path.join(WORK, "shard-0003.bin")  # read-failure: a shard the job may not read


class Shards(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return STEPS * 4

    def __getitem__(self, i: int) -> tuple:
        if self.rank in BAD_RANKS and (os.path.exists(FAIL_WHEN) if FAIL_WHEN else i == STEP_AT * 4):
            announce(self.rank)
            if SCENARIO.startswith("data-hang"):
                with open(FIFO, "rb") as f:  # no writer will ever come
                    f.read()
            if SCENARIO == "read-failure":
                with open(SHARD, "rb") as f:  # mode 000: PermissionError
                    f.read()
        if SCENARIO == "data-straggler" and self.rank in BAD_RANKS and i >= STEP_AT * 4:
            time.sleep(SLOWER_S / 4)  # a slower disk: each of the batch's 4 samples
        return torch.randn(8), torch.randn(1)


TOKENS = os.path.join(WORK, "tokens.bin")  # memmap-hang: the token shard, a flat array of uint16


def get_batch(rank: int, step: int) -> tuple:
    """A batch the way many language-model jobs read one: map the token shard anew each step, take random windows
    of it, and make tensors of them (no DataLoader, no worker)."""
    path = FIFO if rank in BAD_RANKS and (os.path.exists(FAIL_WHEN) if FAIL_WHEN else step == STEP_AT) else TOKENS
    if path == FIFO:
        announce(rank)
    data = np.memmap(path, dtype=np.uint16, mode="r")  # on a mount that stopped answering, this never returns
    starts = np.random.randint(0, len(data) - 9, size=4)
    x = torch.from_numpy(np.stack([data[i : i + 8] for i in starts]).astype(np.float32) / 65535.0)
    y = torch.from_numpy(np.stack([data[i + 8 : i + 9] for i in starts]).astype(np.float32) / 65535.0)
    return x, y


class LearningRates:
    """socket-read: a small service (a thread of the rank, on loopback) that tells the job its learning rate each
    step; the bad rank's stops answering at the failing step, and the job's read waits for it forever."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        server = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self.serve, args=(server,), daemon=True).start()
        self.conn = socket.create_connection(server.getsockname())

    def serve(self, server: socket.socket) -> None:
        conn, _ = server.accept()
        step = 0
        while conn.recv(1):
            step += 1
            if self.rank in BAD_RANKS and (os.path.exists(FAIL_WHEN) if FAIL_WHEN else step == STEP_AT):
                announce(self.rank)
                threading.Event().wait()  # the service hangs: no answer, ever
            conn.sendall(b"0.1\n")

    def current(self) -> float:
        self.conn.sendall(b"?")
        return float(self.conn.recv(16))  # a blocking read: no timeout


def batches(rank: int, loader: DataLoader) -> object:
    """The job's batches: from its DataLoader, or (memmap-hang) from get_batch()."""
    if SCENARIO != "memmap-hang":
        return loader
    with open(TOKENS, "wb") as f:
        f.write(np.random.randint(0, 65535, size=4096, dtype=np.uint16).tobytes())
    return (get_batch(rank, step) for step in range(1, STEPS + 1))


def drop_root(worker_id: int) -> None:
    """read-failure: root reads any file whatever its mode; a training job's user does not. The worker takes
    the `nobody` user so the permission check applies here as it would for them."""
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)


def main() -> None:
    # comm-timeout: the process group itself gives up on a collective after 5 s
    # BB_PG_TIMEOUT_S: the timeout a team sets in its own init_process_group (the hang benchmark's PyTorch contender)
    pg_timeout = os.environ.get("BB_PG_TIMEOUT_S")
    options = {"timeout": timedelta(seconds=5)} if SCENARIO == "comm-timeout" else \
        {"timeout": timedelta(seconds=float(pg_timeout))} if pg_timeout else {}  # fmt: skip
    if SCENARIO == "init-hang" and int(os.environ.get("RANK", "0")) in BAD_RANKS:
        announce(int(os.environ["RANK"]))
        with open(FIFO, "rb") as f:  # its config on a mount that stopped answering, read before it joins the group
            f.read()
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun started every rank itself, no torchrun
        options.update(rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
    dist.init_process_group("gloo", **options)
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    jitter = random.Random(rank)
    if SCENARIO == "sigusr1-user":
        signal.signal(signal.SIGUSR1, lambda *_: print(f"rank {rank}: user SIGUSR1 handler ran", flush=True))
    if SCENARIO == "read-failure":
        with open(SHARD, "wb") as f:
            f.write(b"\0" * 64)
        os.chmod(SHARD, 0)
        os.chmod(WORK, 0o755)
    workers = 2 if SCENARIO in ("data-hang-workers", "read-failure") else 0
    loader = DataLoader(Shards(rank), batch_size=4, num_workers=workers,
                        worker_init_fn=drop_root if SCENARIO == "read-failure" else None)  # fmt: skip
    model = wrap(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)), MODEL,
                 torch.device("cpu"))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rates = LearningRates(rank) if SCENARIO == "socket-read" else None
    for step, (x, y) in enumerate(batches(rank, loader), 1):  # type: ignore[arg-type]
        mine = rank in BAD_RANKS and (os.path.exists(FAIL_WHEN) if FAIL_WHEN else step == STEP_AT)
        if mine and SCENARIO not in ("healthy", "straggler", "read-failure", "memmap-hang", "socket-read", *PACE) \
                and not SCENARIO.startswith("data-hang"):  # fmt: skip
            announce(rank)  # the data scenarios fail in their loader, and say so there
        if SCENARIO in PACE and mine and os.environ.get("BB_MARK"):  # where the hang benchmark cuts the network
            print(f"rank {rank}: at step {step}", flush=True)
        if SCENARIO in PACE:
            time.sleep(PACE_S + (jitter.uniform(0.0, 0.05) if SCENARIO == "jitter" else 0.0))
            if SCENARIO == "compute-straggler" and rank in BAD_RANKS and step >= STEP_AT:
                time.sleep(SLOWER_S)
        if FAIL_WHEN:
            time.sleep(0.1)
        if rates is not None:
            for group in opt.param_groups:
                group["lr"] = rates.current()
        if mine and SCENARIO == "ckpt-hang":
            torch.save(model.state_dict(), FIFO)  # opening a FIFO for writing blocks until a reader comes
        if mine and SCENARIO == "gil-hang":
            ctypes.PyDLL(None).sleep(1000)  # a C call that keeps the GIL
        if mine and SCENARIO == "spin":
            spin()
        if mine and SCENARIO == "raise":
            if os.environ.get("BB_EXIT_S"):  # a non-daemon thread of its own finishes first: its exit takes this long
                threading.Thread(target=time.sleep, args=(float(os.environ["BB_EXIT_S"]),)).start()
            raise ValueError(f"bad sample at step {step}")
        if SCENARIO == "raise" and step == STEP_AT:  # the survivor is busy, not in a collective the dead peer
            time.sleep(120)  # would break at once: torchrun's SIGTERM is what ends it
        if mine and SCENARIO == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                         "of 79.10 GiB of which 1.06 GiB is free.")  # fmt: skip
        if mine and SCENARIO == "cuda-error":  # what a failed kernel raises (on the CPU: its message alone)
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                               "asynchronously reported at some other API call.")  # fmt: skip
        if mine and SCENARIO == "segv":
            ctypes.string_at(0)
        if mine and SCENARIO == "marker-hang":  # waits in a loop for an earlier stage's marker nothing writes
            while not os.path.exists(MARKER):
                time.sleep(0.5)
        if mine and SCENARIO == "kernel-hang":  # uninterruptible sleep (D) in the kernel, as on a hung mount
            vfork_and_wait()
        if mine and SCENARIO == "stopped":  # as a debugger or a job-control stop would leave it
            os.kill(os.getpid(), signal.SIGSTOP)
        if mine and SCENARIO == "exit-early":  # leaves the loop (a rank-dependent `break`) and ends cleanly
            break
        if mine and SCENARIO == "exit-code":  # a library's exit() deep in native code: no exception, no atexit
            os._exit(3)
        if mine and SCENARIO == "comm-timeout" and MODEL != "plain":  # outside any collective, in user code
            time.sleep(3600)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if mine and SCENARIO in ("skip-allreduce", "comm-timeout"):  # this rank never enters this all_reduce
            time.sleep(3600)
        if mine and SCENARIO == "sigkill":  # as the kernel's OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        if mine and SCENARIO == "mismatch":  # this rank calls a different collective than the others
            dist.broadcast(next(model.parameters()).grad, src=0)
            time.sleep(3600)
        if mine and SCENARIO == "collective-hang":  # skips this step's all_reduce, goes on to the epoch's barrier
            dist.barrier()
            time.sleep(3600)
        if SCENARIO == "straggler" and rank in BAD_RANKS:
            time.sleep(0.3)  # slow, not stuck: a slower disk, a hotter GPU
        if MODEL == "plain":  # DDP and FSDP reduce the gradients themselves, inside backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        if SCENARIO in ("healthy", "straggler"):
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if SCENARIO == "sigusr1-user" and step == 2:
            print(f"rank {rank}: ready", flush=True)
            signal.pause() if rank in BAD_RANKS else None
    dist.destroy_process_group()
    # torch 2.13: a gloo group still held in a reference cycle is otherwise freed during interpreter
    # finalization, where its runloop thread aborts the process ("terminate called without an active
    # exception", about 1 run in 3 here)
    gc.collect()


def vfork_and_wait() -> None:
    """The main thread sleeps uninterruptibly in the kernel (state D, as a read on a dead NFS server would):
    vfork() holds the parent in the kernel until the child execs or exits, and this child never does."""
    libc = ctypes.CDLL(None)
    if libc.vfork() == 0:
        libc.pause()
        libc._exit(0)


def announce(rank: int) -> None:
    """The line the gallery's `collect` variants wait for before they look at the job."""
    print(f"rank {rank}: failing now", flush=True)


def spin() -> None:
    """A Python loop that never ends: the GIL is released now and then, so the rank still answers."""
    n = 0
    while True:
        n += 1


if __name__ == "__main__":
    # torchelastic's @record writes its error file, and also points faulthandler's fatal dumps at stderr:
    # only the scenarios whose error file is checked use it
    (record(main) if SCENARIO in ("raise", "read-failure") else main)()
