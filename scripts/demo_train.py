"""The built-in demo job: a 2-rank gloo training loop (an MLP, a DataLoader, DDP-style gradient all_reduce).
At step 8, rank 1's dataset read blocks forever (a FIFO nobody writes, like a dead network filesystem),
while rank 0 goes on into the next all_reduce and waits for it."""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

HANG_RANK, HANG_STEP, BATCH = 1, 8, 4


class Shards(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.stuck_shard = os.path.join(tempfile.mkdtemp(prefix="blackbox-demo-"), "shard-0007.bin")
        os.mkfifo(self.stuck_shard)

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rank == HANG_RANK and i == HANG_STEP * BATCH:
            with open(self.stuck_shard, "rb") as f:  # blocks: no writer will ever come
                f.read()
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Shards(rank), batch_size=BATCH)
    for step, (x, y) in enumerate(loader, 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        if rank == 0 and step % 2 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
