"""A 2-rank gloo training job where one rank meets a chosen end, for the recorder's last-words tests and the
golden bundles: data-hang, data-hang-workers, ckpt-hang, gil-hang, raise, oom, segv, skip-allreduce,
comm-timeout, sigkill, cuda-error, mismatch."""

import ctypes
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset

SCENARIO, RANK_AT, STEP_AT = sys.argv[1], int(sys.argv[2]), 3
FIFO = os.path.join(tempfile.mkdtemp(prefix="bb-lastwords-"), "fifo")
os.mkfifo(FIFO)


class Data(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> tuple:
        if SCENARIO.startswith("data-hang") and self.rank == RANK_AT and i == STEP_AT * 4:
            with open(FIFO, "rb") as f:  # no writer will ever come
                f.read()
        return torch.randn(8), torch.randn(1)


def main() -> None:
    # comm-timeout: the process group itself gives up on a collective after 5 s
    dist.init_process_group("gloo", **({"timeout": timedelta(seconds=5)} if SCENARIO == "comm-timeout" else {}))
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    if SCENARIO == "sigusr1-user":
        signal.signal(signal.SIGUSR1, lambda *_: print(f"rank {rank}: user SIGUSR1 handler ran", flush=True))
    workers = 2 if SCENARIO == "data-hang-workers" else 0
    loader = DataLoader(Data(rank), batch_size=4, num_workers=workers)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader, 1):
        mine = rank == RANK_AT and step == STEP_AT
        if mine and SCENARIO == "ckpt-hang":
            torch.save(model.state_dict(), FIFO)  # opening a FIFO for writing blocks until a reader comes
        if mine and SCENARIO == "gil-hang":
            ctypes.PyDLL(None).sleep(1000)  # a C call that keeps the GIL
        if mine and SCENARIO == "raise":
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
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if mine and SCENARIO in ("skip-allreduce", "comm-timeout"):  # rank 1 never enters this all_reduce
            time.sleep(3600)
        if mine and SCENARIO == "sigkill":  # as the kernel's OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        if mine and SCENARIO == "mismatch":  # rank 1 calls a different collective than the others
            dist.broadcast(model.weight.grad, src=0)
            time.sleep(3600)
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if SCENARIO == "sigusr1-user" and step == 2:
            print(f"rank {rank}: ready", flush=True)
            signal.pause() if rank == RANK_AT else None
    dist.destroy_process_group()


if __name__ == "__main__":
    # torchelastic's @record writes its error file, and also points faulthandler's fatal dumps at stderr:
    # only the scenario that checks the error file uses it
    (record(main) if SCENARIO == "raise" else main)()
