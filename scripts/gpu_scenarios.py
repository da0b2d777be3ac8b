"""The GPU check's training job (scripts/gpu_check.sh): a small real model on one CUDA GPU in which one rank meets a
chosen failure at step 3. Every case fits one GPU: NCCL refuses two ranks on one device, so the NCCL cases are 1-rank
groups; the 2-rank cases share the GPU over gloo with CUDA tensors (the gradient all_reduce is gloo's, on CUDA).

    torchrun --standalone --nproc-per-node N scripts/gpu_scenarios.py --case CASE [--model plain|ddp|fsdp]

Cases (N ranks, backend):
  nccl-queued    (1, nccl) a long kernel (`torch.cuda._sleep`) then the gradient all_reduce queued behind it; the main
                 thread parks at `loss.item()`: the flight recorder shows the collective scheduled, not completed
  nccl-watchdog  (1, nccl) the same, with a 10 s process-group timeout: NCCL's watchdog fires and dumps the recorder
  gpu-spin       (2, gloo) rank 1 is in a long kernel and its main thread spins in a host sync (`loss.item()`), rank 0
                 waits in the all_reduce
  loader-hang    (2, gloo) rank 1's DataLoader __getitem__ blocks opening a FIFO (a dead mount)
  stopped        (2, gloo) rank 1 stops itself with SIGSTOP
  nccl-gil       (1, nccl) rank 0 holds the GIL in a C call (its recorder cannot answer): torch's NCCL watchdog, asked
                 through the debug pipe, writes its flight recorder
  oom            (1, nccl) rank 0 asks for more memory than the GPU has: a real CUDA out-of-memory error
  busy           (N, nccl) multiplies matrices for BB_BUSY_S seconds (60 by default), then exits
MODEL (default plain) reduces the gradients as scripts/scenarios/models.py does."""

import argparse
import ctypes
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
from models import wrap  # shared with the CPU gallery's job

CASES = ("nccl-queued", "nccl-watchdog", "nccl-gil", "gpu-spin", "loader-hang", "stopped", "oom", "busy")
GLOO = ("gpu-spin", "loader-hang", "stopped")
STEP_AT = 3
KERNEL_S = 300.0  # the long kernel: longer than any row of the check may take
FIFO = os.path.join(tempfile.mkdtemp(prefix="bb-gpu-"), "shard.bin")
os.mkfifo(FIFO)
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, required=True)
parser.add_argument("--model", choices=("plain", "ddp", "fsdp"), default="plain")
ARGS = parser.parse_args()
CASE = ARGS.case


class Shards(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple:
        if CASE == "loader-hang" and self.rank == 1 and i == STEP_AT * 8:
            print("rank 1: failing now", flush=True)
            with open(FIFO, "rb") as f:  # no writer ever comes
                f.read()
        return torch.randn(256), torch.randn(1)


def long_kernel(device: torch.device) -> None:
    """Queue a kernel that keeps the GPU busy for KERNEL_S seconds (the host returns at once)."""
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 2_000_000
    torch.cuda._sleep(int(KERNEL_S * khz * 1000))


def busy(device: torch.device) -> None:
    a = torch.randn(4096, 4096, device=device)
    end = time.monotonic() + float(os.environ.get("BB_BUSY_S", "60"))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device=device))], lr=0.1)
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        opt.step()  # a step blackbox counts


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", 0 if CASE in GLOO else local)  # the gloo cases share GPU 0
    torch.cuda.set_device(device)
    timeout = timedelta(seconds=10) if CASE == "nccl-watchdog" else timedelta(minutes=10)
    if CASE in GLOO:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    rank = dist.get_rank()
    if CASE == "busy":
        busy(device)
        dist.destroy_process_group()
        return
    if CASE == "oom" and rank == 0:
        print("rank 0: failing now", flush=True)
        torch.empty(1 << 44, dtype=torch.uint8, device=device)  # 16 TiB: a real CUDA out-of-memory error
    layers = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(device)
    model = wrap(layers, ARGS.model, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(DataLoader(Shards(rank), batch_size=8), 1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        failing = step == STEP_AT and rank == (0 if CASE.startswith("nccl-") else 1)
        if failing:
            print(f"rank {rank}: failing now", flush=True)
        if failing and CASE == "stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        if failing and CASE == "nccl-gil":
            torch.cuda.synchronize()
            ctypes.PyDLL(None).sleep(int(KERNEL_S))  # PyDLL keeps the GIL across the call
        if failing and CASE in ("nccl-queued", "nccl-watchdog", "gpu-spin"):
            long_kernel(device)  # everything after it on this stream waits, the all_reduce below included
        loss = torch.nn.functional.mse_loss(model(x), y)
        if failing and CASE == "gpu-spin":
            loss.item()  # the host sync, before the all_reduce rank 0 waits in
        opt.zero_grad()
        loss.backward()
        if ARGS.model == "plain":
            for p in model.parameters():
                dist.all_reduce(p.grad)  # NCCL: queued on the GPU; gloo: waits for the peer (CUDA tensors)
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)  # the host sync where a GPU wait parks


if __name__ == "__main__":
    main()
