"""Benchmark: what the rank recorder costs the job. Run with the project's venv (`make bench`).

1. ns per heartbeat update (the step hook's stores) against an empty loop, in one process;
2. interpreter start-up: plain, with the recorder on PYTHONPATH but inactive, and active;
3. the recorder's own work per hook, in a rank with the recorder active;
4. part by part, the step time and the ranks' CPU per step of a 2-rank DDP job on gloo: plain torchrun, with
   the flight recorder on, with the rank recorder's hooks, with its liveness thread, and under `blackbox run`
   (adding the supervisor's polling and tee), in alternated rounds, each ratio with a bootstrap 95 % interval:
   whole-job timings on a shared 2-core machine resolve a few per cent at best, so
5. each part is also measured where it resolves far below 1 %: the hooks in ns per call, the liveness thread's
   CPU from /proc's schedstat, the flight recorder on the cheapest collective (two buffer sizes; each run beside
   an off-run of its round), the supervisor's CPU while the steps run; their sum, as a share of the step, is the
   whole's cost;
6. alternated pairs of plain torchrun and `blackbox run` (in-loop step time, median pair ratio), each run with a
   ledger of every thread and process (/proc schedstat: CPU and wait for a CPU, per step), side by side with the
   part-by-part sum: the recorder in place, the flight recorder in isolation, blackbox's own threads and processes;
7. the recorder in place: under `blackbox run`, blocks of steps alternating between the recorder as it runs and
   every rank-side hook out, in the ranks themselves (separate runs differ by more than the recorder costs).
Prints Markdown tables; docs/benchmarks.md quotes them. `--only-sum` runs only what 6 and 7 need (minutes)."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent

TRAIN = r"""
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, warm = int(sys.argv[1]), 100
data = TensorDataset(torch.randn((steps + warm) * 16, 32), torch.randn((steps + warm) * 16, 1))
loader = DataLoader(data, batch_size=16)
for i, (x, y) in enumerate(loader):
    if i == warm:
        dist.barrier(); t0 = time.perf_counter(); c0 = time.process_time()
        print("TIMED", flush=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if i % 10 == 0:  # the usual loss logging: one collective from Python
        dist.all_reduce(loss.detach())
dist.barrier()
wall, cpu = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
print("STEPTIME %d %.9f %.9f" % (dist.get_rank(), wall, cpu), flush=True)
hold, t1 = os.environ.get("BENCH_HOLD"), time.monotonic()  # wait, idle, while the bench reads every thread's CPU
while hold and not os.path.exists(hold) and time.monotonic() - t1 < 30:
    time.sleep(0.005)
dist.destroy_process_group()
import gc  # torch 2.13: a gloo group still held in a reference cycle is otherwise freed during interpreter
# finalization, where its runloop thread aborts the process ("terminate called without an active
# exception", about 1 run in 3 here)
gc.collect()
"""

# The same job under `blackbox run`, measuring the recorder in place: blocks of BLOCK steps alternate between the
# recorder as it runs and every rank-side hook out (the optimizer hook, the wrapped collectives, the DataLoader and
# backward hooks; the recorder's state kept for the next block), in pairs whose order is drawn at random (the same
# draws in every rank: a fixed on-off-off-on order repeats every 256 steps, the stride's own period). The main
# thread's CPU per step, on against off, per pair. The flight recorder (set up when the process group starts) stays on
# in both.
IN_PLACE = r"""
import json, os, random, sys, time, torch, torch.distributed as dist
import torch.optim.optimizer as optim_module
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, warm, block = int(sys.argv[1]), 512, int(sys.argv[2])
rec = sys.modules["_blackbox_recorder.recorder"].ACTIVE
hooks = dict(optim_module._global_optimizer_post_hooks)
wrapped = {n: f for n, f in vars(dist).items() if getattr(f, "__blackbox_wrapped__", False)}
def hooked(on):
    if on:
        optim_module._global_optimizer_post_hooks.update(hooks)
        for n, f in wrapped.items():
            setattr(dist, n, f)
        rec._set_hooks(hooked.was_in)
        rec._last_step_time = time.monotonic()  # the block out is no gap between steps (it would end the stride)
    else:
        hooked.was_in = rec._hooks_in
        for k in hooks:
            optim_module._global_optimizer_post_hooks.pop(k, None)
        for n, f in wrapped.items():
            setattr(dist, n, f.__wrapped__)
        rec._set_hooks(False)
hooked.was_in = True
data = TensorDataset(torch.randn((steps + warm) * 16, 32), torch.randn((steps + warm) * 16, 1))
loader = DataLoader(data, batch_size=16)
cpu = time.thread_time_ns
pairs, mine, t, order = [], None, cpu(), random.Random(20261202)
for i, (x, y) in enumerate(loader):
    if i >= warm and (i - warm) % block == 0:
        now = cpu()
        k = (i - warm) // block
        if k:
            per_step = (now - t) / block
            if mine is None:
                mine = per_step
            else:
                pairs.append((mine, per_step) if first_on else (per_step, mine))
                mine = None
        if k % 2 == 0:
            first_on = order.random() < 0.5
        hooked(first_on if k % 2 == 0 else not first_on)
        t = cpu()
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if i % 10 == 0:
        dist.all_reduce(loss.detach())
hooked(True)
line = json.dumps({"rank": dist.get_rank(), "pairs": pairs, "samples": rec.samples})
sys.stdout.write("INPLACE " + line + "\n"); sys.stdout.flush()
dist.destroy_process_group()
import gc; gc.collect()
"""


def bench_update(n: int) -> dict[str, float]:
    from blackbox._recorder.heartbeat_writer import HeartbeatWriter
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
import torch.distributed as dist
rec = sys.modules["_blackbox_recorder.recorder"].ACTIVE
# a joined default group (one rank, gloo), as in a job: each phase write asks it for torch's count (the ring)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
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

def backward():  # the phase around autograd's backward (6: PHASE_BACKWARD), time ledger included
    rec.exit_phase(rec.enter_phase(6))

print("COLLECTIVE %.1f" % best_ns(collective, 100000))
print("BACKWARD %.1f" % best_ns(backward, 100000))
print("STEP %.1f" % best_ns(rec.step, 100000))
print("BATCH %.1f" % best_ns(batch_hook, 50000))
print("COUNTED %d" % (getattr(rec.hb, "issued", None) is not None))  # the ring's entries hold torch's count
"""


def bench_hook_costs() -> dict[str, float]:
    """The recorder's own work in one training step, measured in a rank with the recorder active: one
    DataLoader batch (phase change, wait accounting, batch shapes), one optimizer step, and per collective
    a phase change in and out. Whole-job timings on this machine are too noisy to show a few µs."""
    return _in_rank(HOOK_COSTS)


def _in_rank(code: str) -> dict[str, float]:
    """Run `code` in a process with the recorder active, as a rank; its `NAME value` lines."""
    from blackbox.supervisor.rundir import INJECT_DIR

    base = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "RANK", "LOCAL_RANK"))}
    with tempfile.TemporaryDirectory() as d:
        env = {**base, "PYTHONPATH": INJECT_DIR, "BLACKBOX_RECORD_DIR": d, "RANK": "0", "LOCAL_RANK": "0"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line[:1].isupper()}


MOTION_COSTS = r"""
import sys, time
import torch
rec = sys.modules["_blackbox_recorder.recorder"].ACTIVE
motion = rec.motion
motion.watch(__import__("threading").current_thread())  # sample this thread: its own stack, 32 frames deep below

def deep(n, fn):
    return deep(n - 1, fn) if n else fn()

def ticks():
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for i in range(2000):
            motion.tick(100.0 + i)
        best = min(best, (time.perf_counter_ns() - t0) / 2000)
    return best

print("MOTION_TICK %.1f" % deep(30, ticks))
model = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(100)])
x = torch.zeros(1)

def per_call():
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(500):
            model(x)
        best = min(best, (time.perf_counter_ns() - t0) / 500 / 101)
    return best

plain = per_call()
motion._handle = torch.nn.modules.module.register_module_forward_pre_hook(motion._count)
counting = per_call()
motion._unhook()
print("FWD_HOOK %.1f" % (counting - plain))
"""


def bench_motion_costs() -> dict[str, float]:
    """What the recorder adds to see a rank move without a step: one motion sample of its liveness thread (the main
    thread's stack 32 frames deep compared with the last, the forward counter paced, the heartbeat written), and a
    module call while the forward counter counts (only in a pause without a step or batch)."""
    return _in_rank(MOTION_COSTS)


LIVENESS = r"""
import os, sys, threading, time
import torch  # the recorder is active from start-up; its liveness thread runs as in a rank
seconds = float(sys.argv[1])
thread = next(t for t in threading.enumerate() if t.name == "blackbox-liveness")

def cpu_ns():
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[0])  # nanoseconds on a CPU

c0, t0 = cpu_ns(), time.monotonic()
time.sleep(seconds)
print("LIVENESS %.9f" % ((cpu_ns() - c0) / 1e9 / (time.monotonic() - t0)))
"""


def bench_liveness(seconds: float) -> float:
    """The liveness thread's share of one core (its CPU time per second, from /proc's schedstat: exact to the
    nanosecond), in a process with the recorder active."""
    from blackbox._recorder import protocol as P
    from blackbox.supervisor.rundir import INJECT_DIR

    base = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "RANK", "LOCAL_RANK"))}
    with tempfile.TemporaryDirectory() as d:
        env = {**base, "PYTHONPATH": INJECT_DIR, P.ENV_RUN_DIR: d, "RANK": "0", "LOCAL_RANK": "0"}
        out = subprocess.run([sys.executable, "-c", LIVENESS, str(seconds)], env=env, capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    return float(out.split()[-1])


FR_BENCH = r"""
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t, n = torch.zeros(1), int(sys.argv[1])
for _ in range(500):
    dist.all_reduce(t)
dist.barrier(); t0 = time.perf_counter(); c0 = time.thread_time()
for _ in range(n):
    dist.all_reduce(t)
cpu = time.thread_time() - c0  # the calling thread's own work: where the flight recorder records an entry
dist.barrier()
print("PERCALL %.9f %.9f" % ((time.perf_counter() - t0) / n, cpu / n), flush=True)
dist.destroy_process_group()
import gc  # torch 2.13: a gloo group still held in a reference cycle is otherwise freed during interpreter
# finalization, where its runloop thread aborts the process ("terminate called without an active
# exception", about 1 run in 3 here)
gc.collect()
"""


def bench_flight_recorder(calls: int, rounds: int) -> tuple[float, dict[str, tuple[float, float, float]]]:
    """What the flight recorder adds to one collective: 2 gloo ranks doing `calls` one-element all_reduces (the
    cheapest collective there is, so the recorder's share is the largest), off and on at two buffer sizes, in
    rounds of one run each whose order rotates. A run's figure is the calling thread's CPU time per call, the mean
    of its ranks (the recorder's work, an entry and a captured stack, is done by that thread; its wall time per call
    waits on the other rank). Separate processes differ by several µs a call whatever they run, so each on-run is
    compared with the off-run of its own round: the median over rounds of on minus off, with a bootstrap 95 %
    interval. Returns (off's median per call, {entries: (added, low, high)}), in seconds."""
    from blackbox._recorder import protocol as P

    env = _job_env()
    variants = {"off": {}, P.FR_ENTRIES: {"TORCH_FR_BUFFER_SIZE": P.FR_ENTRIES},
                "20000": {"TORCH_FR_BUFFER_SIZE": "20000"}}  # fmt: skip
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        script = Path(d, "fr.py")
        script.write_text(FR_BENCH)
        names = list(variants)
        for r in range(rounds):
            run: dict[str, float] = {}
            for name in names[r % len(names) :] + names[: r % len(names)]:
                out = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "2", str(script), str(calls)],
                                     env={**env, **variants[name]}, capture_output=True, text=True,
                                     check=True).stdout  # fmt: skip
                cpus = [float(cpu) for _, cpu in re.findall(r"PERCALL ([0-9.]+) ([0-9.]+)", out)]
                run[name] = statistics.mean(cpus)
            runs.append(run)
    added = {name: _median_ci([run[name] - run["off"] for run in runs]) for name in names if name != "off"}
    return statistics.median(run["off"] for run in runs), added


Sample = tuple[float, float]  # one run: (wall seconds per step, rank CPU seconds per step), mean of the ranks


def _parts(run_dir: str) -> dict[str, tuple[bool, dict[str, str]]]:
    """The variants of one job, each adding one part of blackbox: (under `blackbox run`?, extra environment).
    The recorder is activated the way the supervisor does it, without the supervisor."""
    from blackbox._recorder import protocol as P
    from blackbox.supervisor.rundir import INJECT_DIR

    recorder = {"PYTHONPATH": INJECT_DIR, P.ENV_RUN_DIR: run_dir}
    return {
        "plain torchrun": (False, {}),
        f"flight recorder on, {P.FR_ENTRIES} entries (blackbox's default)": (
            False,
            {"TORCH_FR_BUFFER_SIZE": P.FR_ENTRIES},
        ),
        "rank recorder, hooks only (liveness thread off)": (False, {**recorder, P.ENV_LIVENESS_INTERVAL: "1e6"}),
        "rank recorder, hooks and liveness thread": (False, recorder),
        "`blackbox run`: all of it, plus the supervisor's polling and tee": (True, {}),
    }


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of one process, all its threads, from /proc's schedstat (nanoseconds; 0 once it is gone)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return total / 1e9


def _run_job(cmd: list[str], env: dict[str, str]) -> tuple[Sample, float]:
    """One run: its per-step sample, and the share of one core the top process itself used while the steps
    were timed (the supervisor's own cost when the top process is `blackbox run`)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    marks: dict[str, tuple[float, float]] = {}
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        for word in ("TIMED", "STEPTIME"):
            if word in line and word not in marks:
                marks[word] = (time.monotonic(), _cpu_seconds(proc.pid))
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}… exited with {proc.returncode}")
    rows = re.findall(r"STEPTIME \d+ ([0-9.]+) ([0-9.]+)", "".join(lines))  # the ranks' lines may interleave
    wall = statistics.mean(float(r[0]) for r in rows)
    rank_cpu = statistics.mean(float(r[1]) for r in rows)
    (t0, c0), (t1, c1) = marks["TIMED"], marks["STEPTIME"]
    return (wall, rank_cpu), (c1 - c0) / max(t1 - t0, 1e-9)


def _median_ci(values: list[float], resamples: int = 4000,
               stat: Callable[[list[float]], float] = statistics.median) -> tuple[float, float, float]:  # fmt: skip
    """The median (or `stat`) and a bootstrap 95 % interval of it."""
    rng = random.Random(0)
    stats = sorted(stat(rng.choices(values, k=len(values))) for _ in range(resamples))
    return stat(values), stats[int(0.025 * resamples)], stats[int(0.975 * resamples) - 1]


# --- the ledger: every thread and process of one run, its CPU and its wait for a CPU, while the steps ran --------

Task = tuple[int, int]  # (pid, tid)
Times = tuple[int, int]  # (ns on a CPU, ns runnable but waiting for one), from /proc/…/schedstat
BLACKBOX_ROLES = ("supervisor", "tee process", "console.log process")


def parse_schedstat(text: str) -> Optional[Times]:
    """One /proc/PID/task/TID/schedstat line ("on-CPU ns, run-queue wait ns, timeslices"); None if unreadable."""
    fields = text.split()
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def _is_torchrun(argv: list[str]) -> bool:
    return any(os.path.basename(a) == "torchrun" or a == "torch.distributed.run" for a in argv[:3])


def classify(root: int, procs: dict[int, tuple[int, list[str], str]]) -> dict[int, str]:
    """Who each process of a run is. `procs`: pid -> (ppid, argv, comm) for the process the bench started and
    its descendants. The torchrun agent's children are the ranks (their own children: "rank's child"); under
    `blackbox run` the root is the supervisor, and whatever else descends from it is blackbox's: the tee, the
    console.log process (named blackbox-log), anything new by its name."""
    agents = {p for p, (ppid, argv, _) in procs.items()
              if _is_torchrun(argv) and not _is_torchrun(procs.get(ppid, (0, [], ""))[1])}  # fmt: skip

    def under(pid: int, ancestors: set[int]) -> Optional[int]:
        seen = set()
        while pid in procs and pid not in seen:
            seen.add(pid)
            if pid in ancestors:
                return pid
            pid = procs[pid][0]
        return None

    out: dict[int, str] = {}
    ranks = {p for p, (ppid, _, _) in procs.items() if ppid in agents}
    for pid, (_, argv, comm) in procs.items():
        if pid in agents:
            out[pid] = "torchrun agent"
        elif pid in ranks:
            out[pid] = "rank"
        elif under(pid, ranks) is not None:
            out[pid] = "rank's child"
        elif under(pid, agents) is not None:
            out[pid] = "torchrun agent's child"
        elif pid == root:
            out[pid] = "supervisor"
        elif any(os.path.basename(a) == "tee.py" for a in argv[:4]):
            out[pid] = "tee process"
        elif comm == "blackbox-log":
            out[pid] = "console.log process"
        else:
            out[pid] = f"blackbox's {comm or '?'}"
    return out


def thread_label(role: str, pid: int, tid: int, comm: str) -> str:
    """A thread's name in the ledger: the main thread by role, others by name, numbers folded (pt_autograd_0
    and _1 are one row); blackbox's liveness thread by its full name (it calls itself blackbox-live there)."""
    if tid == pid:
        return "main thread (the step)" if role == "rank" else "main thread"
    name = re.sub(r"[0-9]+", "N", comm.strip()) or "?"
    return "blackbox-liveness" if name in ("blackbox-live", "blackbox-livene") else name


def is_blackbox(role: str, thread: str) -> bool:
    """blackbox's own CPU: its processes, and its threads inside the job's processes."""
    return role in BLACKBOX_ROLES or role.startswith("blackbox's") or thread.startswith("blackbox")


def ledger(before: dict[Task, tuple[str, str, Times]], after: dict[Task, tuple[str, str, Times]],
           ) -> dict[tuple[str, str], Times]:  # fmt: skip
    """(role, thread) -> the CPU and wait each took between two snapshots, summed over the processes of that role
    (a task started in between counts from zero; one gone by the second snapshot is lost)."""
    out: dict[tuple[str, str], Times] = {}
    for task, (role, thread, (cpu, wait)) in after.items():
        cpu0, wait0 = before[task][2] if task in before else (0, 0)
        c, w = out.get((role, thread), (0, 0))
        out[(role, thread)] = (c + max(cpu - cpu0, 0), w + max(wait - wait0, 0))
    return out


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def snapshot(root: int) -> dict[Task, tuple[str, str, Times]]:
    """Every thread of `root` and its descendants: (pid, tid) -> (role, thread label, schedstat times)."""
    from blackbox.adapters import procfs

    procs: dict[int, tuple[int, list[str], str]] = {}
    for pid in [root, *procfs.descendants(root)]:
        st = procfs.proc_stat(pid)
        if st is not None:
            procs[pid] = (st.ppid, procfs.cmdline(pid), _read_text(f"/proc/{pid}/comm").strip())
    out: dict[Task, tuple[str, str, Times]] = {}
    for pid, role in classify(root, procs).items():
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            times = parse_schedstat(_read_text(f"/proc/{pid}/task/{tid}/schedstat"))
            if times is not None:
                comm = _read_text(f"/proc/{pid}/task/{tid}/comm")
                out[(pid, tid)] = (role, thread_label(role, pid, tid, comm), times)
    return out


Ledger = dict[tuple[str, str], Times]  # per step, ns (the ranks' rows per rank)


def _run_ledgered(cmd: list[str], env: dict[str, str], hold: str) -> tuple[float, Ledger]:
    """One run with its ledger: the ranks' mean step time (s), and each (role, thread)'s CPU and wait per step,
    from snapshots when the timed steps start and when both ranks have ended them (they then wait, idle, for
    `hold` to appear, so that no thread is gone yet)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(hold)
    proc = subprocess.Popen(cmd, env={**env, "BENCH_HOLD": hold}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    snaps: list[tuple[float, dict[Task, tuple[str, str, Times]]]] = []
    text = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        text += line
        if "TIMED" in line and not snaps:
            snaps.append((time.monotonic(), snapshot(proc.pid)))
        if len(snaps) == 1 and text.count("STEPTIME") >= 2:
            snaps.append((time.monotonic(), snapshot(proc.pid)))
            Path(hold).touch()
    if proc.wait() != 0 or len(snaps) != 2:
        raise RuntimeError(f"{' '.join(cmd[:3])}… exited with {proc.returncode}")
    rows = re.findall(r"STEPTIME \d+ ([0-9.]+) ([0-9.]+)", text)
    step = statistics.mean(float(r[0]) for r in rows)
    ranks = len(rows)
    steps_in_window = (snaps[1][0] - snaps[0][0]) / step
    per_step: Ledger = {}
    for (role, thread), (cpu, wait) in ledger(snaps[0][1], snaps[1][1]).items():
        n = steps_in_window * (ranks if role == "rank" else 1)
        per_step[(role, thread)] = (round(cpu / n), round(wait / n))
    return step, per_step


def _job_env() -> dict[str, str]:
    """The environment the benchmark's jobs run in: this venv's tools first, one OpenMP thread, and none of
    blackbox's or the flight recorder's variables from the caller."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    for name in [k for k in env if k.startswith(("BLACKBOX_", "TORCH_FR_", "TORCH_NCCL_"))]:
        env.pop(name)
    return env


def bench_pairs(steps: int, pairs: int, sets: int) -> list[tuple[list[float], list[float], list[Ledger], list[Ledger]]]:
    """The filer's measurement: `pairs` alternated pairs of the same DDP job, plain torchrun and under `blackbox
    run` (which goes first alternates), in-loop step time; `sets` times over. Each run also gives its ledger."""
    env = _job_env()
    out = []
    with tempfile.TemporaryDirectory() as d:
        script = Path(d, "train.py")
        script.write_text(TRAIN)
        torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", str(script), str(steps)]
        for s in range(sets):
            plain: tuple[list[float], list[Ledger]] = ([], [])
            wrapped: tuple[list[float], list[Ledger]] = ([], [])
            for i in range(pairs):
                order = [False, True] if i % 2 == 0 else [True, False]
                for under in order:
                    cmd = ["blackbox", "run", "--run-dir", f"{d}/run{s}-{i}", "--", *torchrun] if under else torchrun
                    step, led = _run_ledgered(cmd, env, f"{d}/hold")
                    into = wrapped if under else plain
                    into[0].append(step)
                    into[1].append(led)
                shutil.rmtree(f"{d}/run{s}-{i}", ignore_errors=True)
            out.append((plain[0], wrapped[0], plain[1], wrapped[1]))
    return out


def bench_in_place(steps: int, block: int) -> tuple[list[float], int]:
    """The recorder in place (IN_PLACE): per pair of blocks, what the ranks' main thread takes more per step with the
    recorder on than with every hook out (s), both ranks' pairs; and the stride's samples in rank 0."""
    env = _job_env()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d, "in_place.py")
        script.write_text(IN_PLACE)
        cmd = ["blackbox", "run", "--run-dir", f"{d}/run", "--", "torchrun", "--standalone", "--nproc-per-node", "2",
               str(script), str(steps), str(block)]  # fmt: skip
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
    import json

    rows = [json.loads(line[8:]) for line in out.stdout.splitlines() if line.startswith("INPLACE ")]
    diffs = [(on - off) / 1e9 for row in rows for on, off in row["pairs"]]
    return diffs, min(row["samples"] for row in rows)


def _median_ledger(runs: list[Ledger]) -> Ledger:
    keys = {k for run in runs for k in run}
    return {k: (round(statistics.median(r.get(k, (0, 0))[0] for r in runs)),
                round(statistics.median(r.get(k, (0, 0))[1] for r in runs))) for k in keys}  # fmt: skip


def print_pairs(results: list[tuple[list[float], list[float], list[Ledger], list[Ledger]]],
                steps: int) -> tuple[float, float, float, str]:  # fmt: skip
    """The pair ratios per set, then the ledger of all runs (median per row); returns the median plain step,
    blackbox's own CPU per step (s), what the ranks' main thread takes more under blackbox (s) and the pooled
    pair ratio."""
    print(f"\n## Plain torchrun vs `blackbox run`, alternated pairs ({steps} steps a run, in-loop step time)\n")
    print("| set | pairs | plain step (median) | `blackbox run` step (median) | pair ratio, median (95 % interval) |")
    print("| --- | ---: | ---: | ---: | --- |")
    all_plain: list[float] = []
    for n, (plain, wrapped, _, _) in enumerate(results, 1):
        m, lo, hi = _median_ci([w / p for p, w in zip(plain, wrapped)])
        p_us, w_us = statistics.median(plain) * 1e6, statistics.median(wrapped) * 1e6
        print(f"| {n} | {len(plain)} | {p_us:.0f} µs | {w_us:.0f} µs | {m:.3f} ({lo:.3f} to {hi:.3f}) |")
        all_plain += plain
    ratios = [w / p for plain, wrapped, _, _ in results for p, w in zip(plain, wrapped)]
    m, lo, hi = _median_ci(ratios)
    ratio = f"{m:.3f} ({lo:.3f} to {hi:.3f})"
    print(f"| all | {len(ratios)} | | | **{ratio}** |")
    step = statistics.median(all_plain)
    plain_led = _median_ledger([led for r in results for led in r[2]])
    bb_led = _median_ledger([led for r in results for led in r[3]])
    print(f"\n## The ledger: CPU and wait for a CPU per step, every thread and process (median of "
          f"{len(ratios)} runs each)\n")  # fmt: skip
    print("| process | thread | plain: CPU | plain: waiting for a CPU | `blackbox run`: CPU | waiting for a CPU "
          "| blackbox's |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    order = ["rank", "rank's child", "torchrun agent", "torchrun agent's child", *BLACKBOX_ROLES]
    keys = sorted(set(plain_led) | set(bb_led), key=lambda k: (order.index(k[0]) if k[0] in order else 99, k))
    for key in keys:
        p, b = plain_led.get(key), bb_led.get(key)
        cells = [f"{v[i] / 1000:.2f} µs" if v else "" for v in (p, b) for i in (0, 1)]
        who = "per rank" if key[0] == "rank" else key[0]
        print(f"| {who} | {key[1]} | {' | '.join(cells)} | {'yes' if is_blackbox(*key) else ''} |")
    own = sum(v[0] for k, v in bb_led.items() if is_blackbox(*k)) / 1e9
    main = ("rank", "main thread (the step)")
    main_delta = (bb_led.get(main, (0, 0))[0] - plain_led.get(main, (0, 0))[0]) / 1e9
    wait_delta = (bb_led.get(main, (0, 0))[1] - plain_led.get(main, (0, 0))[1]) / 1e9
    print(f"| **blackbox's threads and processes** | | | | **{own * 1e6:.2f} µs** | | {own / step * 100:.2f} % of "
          f"the {step * 1e6:.0f} µs step |")  # fmt: skip
    print(f"| ranks' main thread, `blackbox run` minus plain (hooks and flight recorder in place; noisy) | | | "
          f"| {main_delta * 1e6:+.2f} µs CPU, {wait_delta * 1e6:+.2f} µs waiting | | |")  # fmt: skip
    return step, own, main_delta, ratio


def bench_parts(steps: int, rounds: int) -> tuple[dict[str, list[Sample]], float]:
    """Each variant of `_parts` once per round, the order rotated from round to round so that drift on a shared
    machine falls on every variant alike; and the supervisor's CPU share (of one core) during its runs."""
    env = _job_env()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d, "train.py")
        script.write_text(TRAIN)
        torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", str(script), str(steps)]
        parts = _parts(f"{d}/recorder")
        samples: dict[str, list[Sample]] = {name: [] for name in parts}
        supervisor: list[float] = []
        names = list(parts)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wrapped, extra = parts[name]
                cmd = ["blackbox", "run", "--run-dir", f"{d}/run{r}", "--", *torchrun] if wrapped else torchrun
                sample, own_cpu = _run_job(cmd, {**env, **extra})
                samples[name].append(sample)
                if wrapped:
                    supervisor.append(own_cpu)
                shutil.rmtree(f"{d}/recorder", ignore_errors=True)
        return samples, statistics.median(supervisor)


def print_parts(samples: dict[str, list[Sample]], supervisor_cpu: float, steps: int, rounds: int) -> None:
    plain = next(iter(samples.values()))
    print(f"\n## What each part costs: a 2-rank DDP job on gloo ({steps} steps, {rounds} alternated rounds)\n")
    print(
        "| variant | step time | ratio to plain (95 % interval) | rank CPU per step | ratio to plain (95 % interval) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name, runs in samples.items():
        wall = statistics.median(s[0] for s in runs)
        cpu = statistics.median(s[1] for s in runs)
        if runs is plain:
            print(f"| {name} | {wall * 1e6:.0f} µs | | {cpu * 1e6:.0f} µs | |")
            continue
        cells = []
        for i in (0, 1):
            m, lo, hi = _median_ci([s[i] / p[i] for s, p in zip(runs, plain)])
            cells.append(f"{m:.3f} ({lo:.3f} to {hi:.3f})")
        print(f"| {name} | {wall * 1e6:.0f} µs | {cells[0]} | {cpu * 1e6:.0f} µs | {cells[1]} |")
    print(f"| the supervisor process itself (polling, tee) while the steps ran, median of its runs "
          f"| {supervisor_cpu * 100:.2f} % of one core | | | |")  # fmt: skip


def _job_interpreter() -> tuple[str, str]:
    """The base Python (no dev-install hooks), with the recorder's bytecode compiled as a pip install leaves
    it; and the inject directory."""
    import compileall

    from blackbox.supervisor.rundir import INJECT_DIR

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


def print_in_place(diffs: list[float], samples: int, steps: int, block: int) -> tuple[float, str]:
    m, lo, hi = _median_ci(diffs, stat=statistics.fmean)
    print(f"\n## In place: the recorder as it runs against every hook out, in the ranks themselves ({steps} steps, "
          f"blocks of {block})\n")  # fmt: skip
    print("| what | main thread's CPU per step, on minus off: mean (95 % interval) | pairs of blocks "
          "| samples (4 steps each) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: |")
    interval = f"{m * 1e6:.2f} µs ({lo * 1e6:.2f} to {hi * 1e6:.2f})"
    print(f"| the optimizer hook, the collectives, the DataLoader and backward hooks (strided), the ledger | "
          f"{interval} | {len(diffs)} | {samples} (rank 0) |")  # fmt: skip
    return m, interval


def print_sum(in_place: tuple[float, str], fr_per_collective: float, own: float, main_delta: float, step: float,
              ratio: str) -> None:  # fmt: skip
    """The whole, part by part, beside the whole-job ratio of the same run: the recorder's work in the ranks' main
    thread measured in place (blocks on and off in one process), the flight recorder measured in isolation (on
    in both kinds of block), blackbox's own threads and processes (the ledger); the ledger's own figure for the
    main thread (separate runs: noisy) beside."""
    print(f"\n## The whole, part by part, as a share of the DDP job's {step * 1e6:.0f} µs step\n")
    print("| part | cost per step | share of the step |\n| --- | ---: | ---: |")
    collectives = 1.1  # DDP's one gradient bucket a step, and the loop's logged all_reduce one step in ten
    fr = collectives * max(fr_per_collective, 0.0)
    parts = {
        f"the recorder in the ranks' main thread, in place (mean, 95 % interval: {in_place[1]})": in_place[0],
        f"the flight recorder, in isolation: {fr_per_collective * 1e6:+.2f} µs a collective, {collectives} a step "
        "(below 0 read as 0)": fr,
        "blackbox's threads and processes (the ranks' liveness threads, the supervisor, the tee, the console.log "
        "process; the ledger)": own,
    }
    for name, seconds in parts.items():
        print(f"| {name} | {seconds * 1e6:.2f} µs | {seconds / step * 100:.3f} % |")
    total = sum(parts.values())
    print(f"| **all of blackbox, part by part (the three rows above)** | {total * 1e6:.2f} µs | "
          f"**{total / step * 100:.2f} %** (target ≤ 1 %) |")  # fmt: skip
    print(f"| (the ledger's main thread, `blackbox run` minus plain: separate runs, noisy) | "
          f"{main_delta * 1e6:+.2f} µs | {main_delta / step * 100:+.2f} % |")  # fmt: skip
    print(f"| **the whole job, `blackbox run` to plain (median pair ratio, 95 % interval)** | | **{ratio}** |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--updates", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--startup-runs", type=int, default=40)
    ap.add_argument("--liveness-seconds", type=float, default=20.0)
    ap.add_argument("--fr-calls", type=int, default=10000)
    ap.add_argument("--fr-rounds", type=int, default=9)
    ap.add_argument("--pairs", type=int, default=9, help="alternated pairs of plain and `blackbox run` per set")
    ap.add_argument("--pair-sets", type=int, default=2)
    ap.add_argument("--in-place-steps", type=int, default=60000, help="steps of the in-place run (blocks on and off)")
    ap.add_argument("--skip-steps", action="store_true", help="leave out the (minutes long) step-time parts")
    ap.add_argument("--skip-variants", action="store_true", help="leave out the five variants' rounds")
    ap.add_argument(
        "--only-sum",
        action="store_true",
        help="only the whole against the sum: the hooks, the flight recorder, the pairs and their ledger",
    )
    args = ap.parse_args()

    print(f"# blackbox overhead benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})\n")
    print("| what | measured | target |\n| --- | --- | --- |")
    if not args.only_sum:
        print_isolated(args)
    costs = bench_hook_costs()
    per_step = costs["BATCH"] + costs["STEP"] + costs["BACKWARD"] + 4 * costs["COLLECTIVE"]
    print(f"| recorder work per collective call (phase in and out, time ledger) | {costs['COLLECTIVE']:.0f} ns | |")
    print(f"| recorder work per backward pass (phase in and out, time ledger) | {costs['BACKWARD']:.0f} ns | |")
    print(f"| recorder work per DataLoader batch (phase, wait, batch shapes) | {costs['BATCH']:.0f} ns | |")
    print(f"| recorder work per training step (1 batch, 1 backward, 4 collectives, 1 optimizer step) | "
          f"{per_step / 1000:.1f} µs "
          "| |")  # fmt: skip
    fr_off, fr_cost = bench_flight_recorder(args.fr_calls, args.fr_rounds)
    print(f"| one-element gloo all_reduce, flight recorder off: the caller's CPU (median of {args.fr_rounds} runs) "
          f"| {fr_off * 1e6:.1f} µs | |")  # fmt: skip
    for entries, (extra, lo, hi) in fr_cost.items():
        print(f"| flight recorder on, {entries} entries: added per collective, on minus off in the same round "
              f"(median of {args.fr_rounds}, 95 % interval) | {extra * 1e6:+.2f} µs ({lo * 1e6:+.2f} to "
              f"{hi * 1e6:+.2f}) | |")  # fmt: skip
    sys.stdout.flush()
    if args.skip_steps:
        return 0
    if not (args.skip_variants or args.only_sum):
        samples, supervisor_cpu = bench_parts(args.steps, args.rounds)
        print_parts(samples, supervisor_cpu, args.steps, args.rounds)
        sys.stdout.flush()
    from blackbox._recorder import protocol as P

    step, own, main_delta, ratio = print_pairs(bench_pairs(args.steps, args.pairs, args.pair_sets), args.steps)
    block = 64
    diffs, sampled = bench_in_place(args.in_place_steps, block)
    in_place = print_in_place(diffs, sampled, args.in_place_steps, block)
    print_sum(in_place, fr_cost[P.FR_ENTRIES][0], own, main_delta, step, ratio)
    return 0


def print_isolated(args: argparse.Namespace) -> None:
    """The rows measured in one process: heartbeat stores, start-up, the motion sample, the liveness thread."""
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
    motion = bench_motion_costs()
    print(f"| motion sample, once every 0.5 s on the liveness thread (the main thread 32 frames deep) | "
          f"{motion['MOTION_TICK'] / 1000:.1f} µs | |")  # fmt: skip
    print(f"| a module call while the forward counter counts (only in a pause without a step or batch) | "
          f"{motion['FWD_HOOK']:+.0f} ns | |")  # fmt: skip
    liveness = bench_liveness(args.liveness_seconds)
    print(f"| liveness thread, CPU per second ({args.liveness_seconds:g} s, schedstat) | {liveness * 100:.3f} % of "
          "one core | |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
