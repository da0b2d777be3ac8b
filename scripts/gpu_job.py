"""The GPU check's training job (scripts/gpu_check.sh): a small real model on CUDA with NCCL — DDP or FSDP2 — in which
rank 1 (or rank 0) meets a chosen failure at step 3. Unlike the CPU gallery's job, the collectives here are NCCL's:
they return at once and a waiting rank parks at its next host sync (`loss.item()`).

    torchrun --standalone --nproc-per-node N scripts/gpu_job.py SCENARIO MODEL

Scenarios: loader-hang (rank 1's DataLoader __getitem__ blocks opening a FIFO: a dead mount), stopped (rank 1 stops
itself with SIGSTOP), watchdog (rank 1 never enters an all_reduce; the process group times out after 15 s: NCCL's
watchdog fires and dumps the flight recorder), oom (rank 0 asks for more memory than the GPU has), busy (every rank
multiplies matrices for BB_BUSY_S seconds, 60 by default, then exits). MODEL: ddp or fsdp."""

import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios"))
from models import wrap

SCENARIO, MODEL = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "ddp")
STEP_AT = 3
FIFO = os.path.join(tempfile.mkdtemp(prefix="bb-gpu-"), "shard.bin")
os.mkfifo(FIFO)


class Shards(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple:
        if SCENARIO == "loader-hang" and self.rank == 1 and i == STEP_AT * 8:
            print("rank 1: failing now", flush=True)
            with open(FIFO, "rb") as f:  # no writer ever comes
                f.read()
        return torch.randn(256), torch.randn(1)


def busy(device: torch.device) -> None:
    a = torch.randn(4096, 4096, device=device)
    end = time.monotonic() + float(os.environ.get("BB_BUSY_S", "60"))
    step = 0
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device=device))], lr=0.1)
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        opt.step()  # a step blackbox counts
        step += 1


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    timeout = timedelta(seconds=15) if SCENARIO == "watchdog" else timedelta(minutes=10)
    dist.init_process_group("nccl", timeout=timeout, device_id=device)
    rank = dist.get_rank()
    if SCENARIO == "busy":
        busy(device)
        dist.destroy_process_group()
        return
    if SCENARIO == "oom" and rank == 0:
        print("rank 0: failing now", flush=True)
        torch.empty(1 << 44, dtype=torch.uint8, device=device)  # 16 TiB: a real CUDA out-of-memory error
    layers = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(device)
    model = wrap(layers, MODEL, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(DataLoader(Shards(rank), batch_size=8), 1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if rank == 1 and step == STEP_AT and SCENARIO == "stopped":
            print("rank 1: failing now", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if rank == 1 and step == STEP_AT and SCENARIO == "watchdog":
            print("rank 1: failing now", flush=True)
            time.sleep(3600)  # never enters this step's all_reduce
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)  # the host sync where NCCL waits park


if __name__ == "__main__":
    main()
