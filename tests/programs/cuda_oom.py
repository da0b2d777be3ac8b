"""Single-process CUDA job that runs out of memory for real (needs a GPU)."""

import torch

keep = [torch.ones(1024, 1024, device="cuda") for _ in range(4)]  # some live allocations to see in the snapshot
for _batch in torch.utils.data.DataLoader(torch.zeros(8, 3, 32, 32), batch_size=4):
    torch.empty(1 << 45, dtype=torch.uint8, device="cuda")  # 32 TiB: a real CUDA out-of-memory error
