"""A small real training job for the tests: a 2-layer MLP on the CPU with gloo, gradients averaged with
dist.all_reduce each step. Flags make one rank misbehave. Writes `<marker-dir>/rank<R>.step<K>` files so
a test can wait for a condition instead of sleeping."""

import argparse
import gc
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--misbehave-rank", type=int, default=-1)
    p.add_argument("--at-step", type=int, default=3)
    p.add_argument("--how", default="sleep", choices=["sleep", "raise", "exit", "no-collective"])
    p.add_argument("--marker-dir", default=None)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument(
        "--own-sigterm", action="store_true", help="its own SIGTERM handling: marks `rank<R>.sigterm`, exits 0"
    )
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.own_sigterm:  # as a job that saves a checkpoint on SIGTERM: the marker says when it came

        def on_sigterm(*_: object) -> None:
            mark(args, rank, "sigterm")
            os._exit(0)

        signal.signal(signal.SIGTERM, on_sigterm)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)

    for step in range(1, args.steps + 1):
        if rank == args.misbehave_rank and step == args.at_step:
            if args.how == "sleep":
                mark(args, rank, "hanging")
                while True:
                    time.sleep(3600)
            if args.how == "raise":
                raise ValueError(f"bad batch at step {step}")
            if args.how == "exit":
                os._exit(3)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if args.how != "no-collective":
            for prm in model.parameters():
                dist.all_reduce(prm.grad)
                prm.grad /= dist.get_world_size()
        opt.step()
        mark(args, rank, f"step{step}")
        if args.step_sleep:
            time.sleep(args.step_sleep)
    print(f"rank {rank} done loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    # torch 2.13: a gloo group still held in a reference cycle is otherwise freed during interpreter
    # finalization, where its runloop thread aborts the process ("terminate called without an active
    # exception", about 1 run in 3 here)
    gc.collect()
    return 0


def mark(args: argparse.Namespace, rank: int, what: str) -> None:
    if args.marker_dir:
        with open(os.path.join(args.marker_dir, f"rank{rank}.{what}"), "w"):
            pass


if __name__ == "__main__":
    sys.exit(main())
