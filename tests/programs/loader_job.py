"""torchrun job with a 2-worker DataLoader: every process reports whether the recorder is active in it,
so the test can check that ranks record and their loader workers do not."""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

REPORT_DIR = sys.argv[1]
CONTEXT = sys.argv[2]


def report(kind: str) -> None:
    mod = sys.modules.get("_blackbox_recorder.recorder")
    rec = getattr(mod, "ACTIVE", None)
    active = bool(rec is not None and rec.enabled and rec.pid == os.getpid())
    with open(os.path.join(REPORT_DIR, f"{kind}-{os.getpid()}.json"), "w") as f:
        json.dump({"kind": kind, "pid": os.getpid(), "rank": os.environ.get("RANK"), "active": active}, f)


class Data(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        report("worker")
        return torch.full((4,), float(i))


def main() -> None:
    dist.init_process_group("gloo")
    report("rank")
    loader = DataLoader(Data(), batch_size=2, num_workers=2, multiprocessing_context=CONTEXT)
    for batch in loader:
        dist.all_reduce(batch)
    dist.destroy_process_group()
    # torch 2.13: a gloo group still held in a reference cycle is otherwise freed during interpreter
    # finalization, where its runloop thread aborts the process ("terminate called without an active
    # exception", about 1 run in 3 here)
    gc.collect()


if __name__ == "__main__":
    main()
