"""How the gallery's jobs reduce their gradients, as real jobs do it: the model itself (`plain`: the job's own
all_reduce), under DistributedDataParallel (`ddp`), or sharded by FSDP2 (`fsdp`: `fully_shard` on each Linear and the
root). Shared by scripts/scenarios/train.py (gloo, CPU) and scripts/gpu_scenarios.py (CUDA)."""

import torch
import torch.distributed as dist


def wrap(model: torch.nn.Module, kind: str, device: torch.device) -> torch.nn.Module:
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return model
