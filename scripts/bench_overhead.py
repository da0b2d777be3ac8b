"""Benchmark: what the rank recorder costs the job. Run with the project's venv (`make bench`).

1. ns per heartbeat update (the step hook's stores) against an empty loop, in one process;
2. the step time of a small 2-rank gloo training loop (MLP, DataLoader, all_reduce: every phase hook on)
   under `blackbox run` against plain `torchrun`, the two interleaved in one run;
3. interpreter start-up: plain, with the recorder on PYTHONPATH but inactive, and active.
Prints a Markdown table; the README quotes it."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent

TRAIN = r"""
import os, sys, time, torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[1])
data = TensorDataset(torch.randn(steps * 8, 32), torch.randn(steps * 8, 1))
loader = DataLoader(data, batch_size=8)
for i, (x, y) in enumerate(loader):
    if i == 50:
        dist.barrier(); t0 = time.perf_counter()
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
dist.barrier()
if dist.get_rank() == 0:
    print("STEPTIME %.9f" % ((time.perf_counter() - t0) / (steps - 50)), flush=True)
dist.destroy_process_group()
"""


def bench_update(n: int) -> dict[str, float]:
    from blackbox._recorder.heartbeat import HeartbeatWriter
    from blackbox._recorder.recorder import Recorder

    with tempfile.TemporaryDirectory() as d:
        hb = HeartbeatWriter(f"{d}/hb", pid=1, start_ticks=0, rank=0, local_rank=0, world_size=1, mode="rank")
        rec = Recorder(d, 0, 0, 1, "rank")

        class Empty:
            def progress(self, step: int, now: float, dt: float, slowest: float) -> None:
                pass

            def step(self) -> None:
                pass

        def loop(obj: object, method: str) -> float:
            fn = getattr(obj, method)
            t = time.perf_counter_ns()
            if method == "progress":
                for i in range(n):
                    fn(i, 1.0, 0.1, 0.2)
            else:
                for _ in range(n):
                    fn()
            return (time.perf_counter_ns() - t) / n

        best: dict[str, float] = {}
        for _ in range(5):
            for name, obj, method in (("empty progress", Empty(), "progress"), ("heartbeat progress", hb, "progress"),
                                      ("empty step", Empty(), "step"), ("recorder step", rec, "step")):  # fmt: skip
                best[name] = min(best.get(name, float("inf")), loop(obj, method))
        return {
            "heartbeat update (stores only)": best["heartbeat progress"] - best["empty progress"],
            "recorder.step() (clock + stores)": best["recorder step"] - best["empty step"],
        }


HOOK_COSTS = r"""
import sys, time
import torch
rec = sys.modules["_blackbox_recorder.recorder"].ACTIVE
batch = (torch.zeros(8, 32), torch.zeros(8, 1))

class Iterator:
    pass

it = Iterator()

def best_ns(fn, n):
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best

def collective():
    rec.exit_phase(rec.enter_collective(1, None))

def batch_hook():
    rec.batch_delivered(rec.enter_phase(2), batch, it)

print("COLLECTIVE %.1f" % best_ns(collective, 100000))
print("STEP %.1f" % best_ns(rec.step, 100000))
print("BATCH %.1f" % best_ns(batch_hook, 50000))
"""


def bench_hook_costs() -> dict[str, float]:
    """The recorder's own work in one training step, measured in a rank with the recorder active: one
    DataLoader batch (phase change, wait accounting, batch shapes), one optimizer step, and per collective
    a phase change in and out. Whole-job timings on this machine are too noisy to show a few µs."""
    from blackbox.supervisor.supervisor import INJECT_DIR

    base = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "RANK", "LOCAL_RANK"))}
    with tempfile.TemporaryDirectory() as d:
        env = {**base, "PYTHONPATH": INJECT_DIR, "BLACKBOX_RECORD_DIR": d, "RANK": "0", "LOCAL_RANK": "0"}
        out = subprocess.run([sys.executable, "-c", HOOK_COSTS], env=env, capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line[:1].isupper()}


def bench_steps(steps: int, rounds: int) -> tuple[float, float]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as d:
        script = Path(d, "train.py")
        script.write_text(TRAIN)
        torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", str(script), str(steps)]
        plain: list[float] = []
        watched: list[float] = []
        for r in range(rounds):
            for mode in ("plain", "blackbox") if r % 2 == 0 else ("blackbox", "plain"):
                cmd = torchrun if mode == "plain" else ["blackbox", "run", "--run-dir", f"{d}/run{r}", "--", *torchrun]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                value = float(next(line.split()[1] for line in out.splitlines() if line.startswith("STEPTIME")))
                (plain if mode == "plain" else watched).append(value)
        return statistics.median(plain), statistics.median(watched)


def _job_interpreter() -> tuple[str, str]:
    """The base Python (no dev-install hooks), with the recorder's bytecode compiled as a pip install leaves
    it; and the inject directory."""
    import compileall

    from blackbox.supervisor.supervisor import INJECT_DIR

    compileall.compile_dir(str(Path(INJECT_DIR).parent), quiet=1)
    return getattr(sys, "_base_executable", sys.executable), INJECT_DIR


def _interpreter_samples(runs: int, args: list[str], measure: Callable[[str, float], float]) -> dict[str, list[float]]:
    """Run `python ARGS` in each recorder situation, interleaved, `runs` times; `measure(stderr, seconds)` turns
    one run into a sample."""
    python, inject_dir = _job_interpreter()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "RANK", "LOCAL_RANK"))}
    base.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as d:
        rank = {"PYTHONPATH": inject_dir, "BLACKBOX_RECORD_DIR": d, "RANK": "0", "LOCAL_RANK": "0"}
        variants = {
            "plain": base,
            "inactive, not under blackbox": {**base, "PYTHONPATH": inject_dir},
            "inactive, a rank's child": {**base, **rank, "BLACKBOX_RECORDER": "1:rank"},
            "active": {**base, **rank},
        }
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(runs):
            for name, env in variants.items():
                t = time.perf_counter()
                err = subprocess.run([python, *args], env=env, check=True, capture_output=True, text=True).stderr
                samples[name].append(measure(err, time.perf_counter() - t))
                for p in Path(d).glob("ranks/*/*"):
                    p.unlink()
        return samples


def bench_startup(runs: int) -> dict[str, float]:
    """Whole interpreter start-up (ms): the fastest run of each, the least disturbed."""
    samples = _interpreter_samples(runs, ["-c", "pass"], lambda err, seconds: seconds * 1000)
    return {k: min(v) for k, v in samples.items()}


def _sitecustomize_us(importtime: str) -> float:
    """Cumulative µs of the outermost `sitecustomize` import, plus the recorder modules it loads by path
    (`-X importtime` lists those beside it, not under it)."""
    rows = []
    for line in importtime.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].startswith("import time:") and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            rows.append((len(name) - len(name.lstrip()), name.strip(), int(parts[1])))
    ours = [r for r in rows if r[1] == "sitecustomize"]
    if not ours:
        return 0.0
    depth = min(r[0] for r in ours)
    total = sum(r[2] for r in ours if r[0] == depth)
    total += sum(r[2] for r in rows if r[1].startswith("_blackbox_recorder") and r[0] == depth)
    return float(total)


def bench_sitecustomize(runs: int) -> dict[str, float]:
    """The cost of the `sitecustomize` import alone (µs, `-X importtime`, median): far less noisy than whole
    interpreter start-up. "plain" is the interpreter's own sitecustomize, which ours runs in turn."""
    samples = _interpreter_samples(runs, ["-X", "importtime", "-c", "pass"], lambda err, _: _sitecustomize_us(err))
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--updates", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--startup-runs", type=int, default=40)
    ap.add_argument("--skip-steps", action="store_true", help="leave out the (minutes long) step-time part")
    args = ap.parse_args()

    print(f"# blackbox overhead benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})\n")
    print("| what | measured | target |\n| --- | --- | --- |")
    for name, ns in bench_update(args.updates).items():
        print(f"| {name} | {ns:.0f} ns | {'≤ 500 ns' if 'stores only' in name else ''} |")
    site = bench_sitecustomize(args.startup_runs)
    plain_site = site.pop("plain")
    print(f"| `sitecustomize` import, the interpreter's own (median of {args.startup_runs}) | {plain_site:.0f} µs | |")
    for name, us in site.items():
        target = "≤ +15 ms" if name == "active" else "≤ +3 ms"
        print(f"| `sitecustomize` import, blackbox's, recorder {name} | {us:.0f} µs ({us - plain_site:+.0f} µs) "
              f"| {target} |")  # fmt: skip
    startup = bench_startup(args.startup_runs)
    plain_start = startup.pop("plain")
    print(f"| interpreter start, plain (fastest of {args.startup_runs}) | {plain_start:.1f} ms | |")
    for name, ms in startup.items():
        target = "≤ +15 ms" if name == "active" else "≤ +3 ms"
        print(f"| interpreter start, recorder {name} | {ms:.1f} ms ({ms - plain_start:+.1f} ms) | {target} |")
    costs = bench_hook_costs()
    per_step = costs["BATCH"] + costs["STEP"] + 4 * costs["COLLECTIVE"]
    print(f"| recorder work per collective call (phase in and out) | {costs['COLLECTIVE']:.0f} ns | |")
    print(f"| recorder work per DataLoader batch (phase, wait, batch shapes) | {costs['BATCH']:.0f} ns | |")
    print(f"| recorder work per training step (1 batch, 4 collectives, 1 optimizer step) | {per_step / 1000:.1f} µs "
          "| |")  # fmt: skip
    if args.skip_steps:
        return 0
    plain, watched = bench_steps(args.steps, args.rounds)
    ratio = watched / plain
    print(f"| step time, 2-rank gloo MLP ({args.steps} steps, median of {args.rounds}), plain torchrun "
          f"| {plain * 1e6:.0f} µs | |")  # fmt: skip
    print(f"| step time, same job under `blackbox run` | {watched * 1e6:.0f} µs (ratio {ratio:.3f}) | ≤ 1.01 |")
    print(f"| recorder work per step as a share of that step | {per_step / 1e9 / plain * 100:.2f} % | ≤ 1 % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
