"""A 1-rank NCCL job (GPU only) whose main thread holds the GIL in a C call after eight optimizer steps: its recorder
cannot answer, torch's NCCL watchdog (a C++ thread) still can, through the debug pipe."""

import ctypes
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    loss = model(torch.randn(32, 64, device="cuda")).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
print("holding the GIL", flush=True)
ctypes.PyDLL(None).sleep(600)  # PyDLL keeps the GIL across the call
