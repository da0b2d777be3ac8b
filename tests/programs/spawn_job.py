"""A job that starts its own ranks with torch.multiprocessing.spawn and sets the rank in code (no RANK in the
environment, no torchrun): 2 gloo ranks; rank 1 stops stepping at step 3 (sleeps), rank 0 waits in
all_reduce. `--steps N` with no misbehaving rank: a healthy run."""

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, port: int, hang: int, steps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, steps + 1):
        if rank == hang and step == 3:
            time.sleep(3600)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
    # torch 2.13: a gloo group still held in a reference cycle is otherwise freed during interpreter
    # finalization, where its runloop thread aborts the process ("terminate called without an active
    # exception", about 1 run in 3 here)
    gc.collect()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    mp.spawn(worker, args=(2, a.port, a.hang_rank, a.steps), nprocs=2, join=True)
    sys.exit(0)
