"""A 2-rank DDP job (gloo, CPU) of short steps (a few ms), where the recorder strides: its data and backward hooks
are in for one step in 64. Rank 1's loader is slower (BB_DATA_S a batch). Each rank times its own data and
backward calls and prints them beside what its recorder's ledger says, as one JSON line ("FAST {...}").

    torchrun --standalone --nproc-per-node 2 tests/programs/fast_job.py MODE STEPS

Modes: straggler (train STEPS steps, then rank 0 evaluates alone over a DataLoader for EVAL_BATCHES batches while
rank 1 waits at a barrier), hang (rank 1's loader blocks for good at step STEPS // 2: rank 0 then waits in backward,
in DDP's gradient all_reduce), compiled (straggler's loop with the model under torch.compile: the rank never
strides)."""

import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

MODE, STEPS = sys.argv[1], int(sys.argv[2])
BATCH = 16
DATA_S = float(os.environ.get("BB_DATA_S", "0.002"))
EVAL_BATCHES, EVAL_S = 300, 0.01
WARM = 200  # steps before the timed ones: the stride starts after 64 short steps

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Samples(Dataset):
    def __init__(self, slow_s: float, hang_at: int = -1) -> None:
        self.slow_s, self.hang_at = slow_s, hang_at

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.hang_at:
            print(f"rank {rank}: loader blocked for good", flush=True)
            time.sleep(3600)
        if i % BATCH == 0 and self.slow_s:
            time.sleep(self.slow_s)
        return torch.randn(32), torch.randn(1)


model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
if MODE == "compiled":
    model = torch.compile(model, backend="eager")  # dynamo without inductor: no compiler needed, steps stay short
opt = torch.optim.SGD(model.parameters(), lr=0.01)
hang_at = BATCH * (STEPS // 2) + 3 if MODE == "hang" and rank == 1 else -1
loader = iter(DataLoader(Samples(DATA_S if rank == 1 else 0.0, hang_at), batch_size=BATCH))
rec = sys.modules["_blackbox_recorder.recorder"].ACTIVE
stride = sys.modules["_blackbox_recorder.stride"]
clock = time.perf_counter
data_s = backward_s = 0.0
short = eligible = 0  # short steps in a row; timed steps that came after STRIDE_AFTER of them (the stride's own test)
last = clock()
for i in range(WARM + STEPS):
    if i == WARM:
        ledger0, batches0, t0 = rec.hb.spent(time.monotonic()), rec._batches, clock()
        data_s = backward_s = 0.0
    a = clock()
    short = short + 1 if a - last < stride.STRIDE_STEP_S else 0
    eligible += i > WARM and short > stride.STRIDE_AFTER
    last = a
    x, y = next(loader)
    b = clock()
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    c = clock()
    loss.backward()
    data_s, backward_s = data_s + b - a, backward_s + clock() - c
    opt.step()
ledger1, batches1, wall = rec.hb.spent(time.monotonic()), rec._batches, clock() - t0
samples = rec.samples
eval_batches = None
if rank == 0:
    before = rec._batches
    for _ in DataLoader(Samples(EVAL_S), batch_size=BATCH, sampler=range(BATCH * EVAL_BATCHES)):
        pass
    eval_batches = rec._batches - before
dist.barrier()
spent = {p: b - a for p, a, b in zip(("startup", "compute", "data", "checkpoint", "collective", "eval", "backward",
                                      "other"), ledger0, ledger1)}  # fmt: skip
say = json.dumps({
    "rank": rank, "samples": samples, "wall_s": wall, "data_s": data_s, "backward_s": backward_s,
    "ledger": spent, "batches": batches1 - batches0, "steps": STEPS, "eval_batches": eval_batches, "eligible": eligible,
    "striding_after_eval": rec._striding,
})  # fmt: skip
sys.stdout.write("FAST " + say + "\n")  # one write: the ranks share the terminal (unbuffered, print writes twice)
sys.stdout.flush()
dist.destroy_process_group()
gc.collect()  # torch 2.13: a gloo group freed during interpreter finalization can abort the process
