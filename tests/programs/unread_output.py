"""A 2-rank DDP job (gloo, CPU) that takes a few steps, then rank 0 prints LINES numbered lines of 100 bytes (one
write each) while rank 1 waits for it at a barrier: when nothing reads the output, rank 0 blocks in write() until
something does. Usage: torchrun --nproc-per-node 2 unread_output.py LINES"""

import gc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):  # past the first step: --stall-timeout is in force
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
if rank == 0:
    for i in range(int(sys.argv[1])):
        sys.stdout.write(f"line {i:08d} ".ljust(99, ".") + "\n")
    sys.stdout.flush()
dist.barrier()
sys.stdout.write(f"rank {rank} done\n")
sys.stdout.flush()
dist.destroy_process_group()
gc.collect()
