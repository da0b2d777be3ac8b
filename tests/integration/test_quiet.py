"""The quiet gallery and the `auto` timeout, side by side, with blackbox's default rule options (real torchrun, gloo,
DDP). Quiet: healthy jobs in which rank 0 alone does something ordinary for 75 s — longer than the `auto` stall
timeout (60 s) — while rank 1 waits for it at a barrier (tests/programs/quiet_job.py): a torch.save to slow storage,
an evaluation in a forward loop, one over a validation DataLoader, metrics in pure Python, an index read slowly, a
torch.distributed.checkpoint save, a first step that compiles at length, an external tool (a shell pipeline into
gzip) run with subprocess.run with and without its output captured, and a DataLoader whose workers take the whole
pause to load a first batch (blackbox follows rank 0's wait to the processes it waits for), and an upload in a
thread whose future the main thread waits on. Each must end by itself with exit 0, no bundle, no incident, no stall
line, and its `slow_phase` event naming what rank 0 was doing. Meanwhile real hangs of the scenario gallery (a
loader blocked on a read, a checkpoint blocked on a FIFO, a stopped rank, the GIL held in a native call), failing at
step 8 so that `auto`'s 60 s applies, must each be caught about 60 s after their last progress, with the gallery's
verdict, and so must a rank waiting for a child that waits for input that never comes (its child followed: no byte,
no CPU time), a rank whose main thread hangs in a read while a thread of its own keeps running a module (an EMA
model: forward calls count only from the main thread), and one hung in a read of a pipe that a timer's signal
wakes five times a second (a wake-up is not a byte), and three poll loops for what never comes (a stale `filelock`,
a marker file, a store key: waking to check is not working), while a future or a child checked in such a loop keeps
the rank alive as long as it works, and so do a process pool's workers. A quiet job under SIGUSR1 shows that its
motion is kept in the heartbeat history a bundle carries. Every job runs at once: about three minutes in all."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from blackbox.analyze.verdict import analyze
from blackbox.bundle.reader import read_bundle
from blackbox.events import read_events
from tests.conftest import BLACKBOX, PROGRAMS, ROOT, TORCHRUN, job_env

sys.path.insert(0, str(ROOT / "scripts" / "scenarios"))
import runner

# one set of 26 jobs for every test of the module (its fixture): about 17 GB and both cores, so nothing runs beside it
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("quiet")]
PAUSE_S = 75.0  # rank 0's pause: past the auto timeout (60 s)
QUIET = {  # case -> what its slow-phase line must say rank 0 was doing
    "save": "in a long read or write system call",  # torch.save: one long write to a FIFO drained slowly
    "forward": "running its model (forward calls)",  # each forward one large matmul: the stack never changes
    "loader": "taking batches",
    "metrics": "running Python code",
    "index": "reading",  # 64 KiB, then a sleep: only the I/O moves
    "dcp": "writing",
    "compile": "running Python code",  # before any step: the pause counts from the first batch
    "tool": "waits for its child `sh -c while [ $(date +%s) -lt ",  # in wait4: the tool's bytes and CPU time
    "captured": "waits for its child `sh -c while [ $(date +%s) -lt ",  # in poll on the tool's silent pipes
    "workers": "waits for its 2 child processes (pids ",  # in poll on the result queue: the workers read
    # the main thread waits on a future (or checks it in a sleep loop): the uploading thread's bytes move, 640 kB/s
    "upload": "_0` (tid ",  # "waits for its thread `ThreadPoolExecutor-1_0` (tid N), which works: writing 654 kB/s"
    "polled-upload": "_0` (tid ",
    "polled-tool": "waits for its child `sh -c while [ $(date +%s) -lt ",  # `while p.poll() is None: sleep`
    "scoring": "waits for its 2 child processes (pids ",  # a pool's result event: only its workers move
    "native": "running Python code",  # the same native call at every sample, the main thread's CPU time moving
    "stream": "compute: waits for its FIFO's ",  # a read of a FIFO: its writers (not its children) work
}
POLLS = ("stale-lock", "marker", "store-poll")  # rank 0 sleeps and checks in a loop for what never comes: hangs
EMA_HANG = "ema-hang"  # rank 0's main thread hung in a read while a thread of its own runs a module: a hang
STUCK = "stuck"  # rank 0 waits for a child that waits for input that never comes: a hang
WOKEN = "woken-read"  # rank 0 hung in a read of a pipe that a timer's signal wakes five times a second: a hang
# the gallery's, failing at step 8 under `auto`
HANGS = ("data-hang", "ddp-data-hang-workers", "ckpt-hang", "ddp-stopped", "gil-hang", "init-hang")
# the definite leaf each culprit waits at (supervisor.leaf): judged on the 30 s floor (the DataLoader's rank by its
# workers': one reads the FIFO, the other waits for the rank); the GIL holder is not definite
LEAF_OF = {
    "data-hang": "fifo",
    "ddp-data-hang-workers": "workers",
    "ckpt-hang": "fifo",
    "ddp-stopped": "stopped",
    "init-hang": "fifo",
}
# init-hang fails before init_process_group: rank 0 waits in the rendezvous before its first step, so its own rule is
# the start-up timeout's (30 min) — the culprit's leaf is what ends the job, in 30 s
OTHERS_RULE = {"init-hang": "startup"}
COLLECTED = "dcp-collected"  # the dcp case again, with a manual bundle taken mid-pause (SIGUSR1 to blackbox)


class Job:
    def __init__(self, name: str, argv: list[str], run_dir: Path, cwd: Path, env: dict[str, str]) -> None:
        self.name, self.run_dir = name, run_dir
        with runner.LIVE_LOCK:  # the conftest's reaper spares a job that runs beside the tests
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, start_new_session=True)  # fmt: skip
            runner.LIVE.add(self.proc.pid)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            runner.kill_tree(self.proc.pid)
            out, err = self.proc.communicate()
        finally:
            runner.LIVE.discard(self.proc.pid)
        return self.proc.returncode, out, err

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in read_events(str(self.run_dir / "events.jsonl")) if e.get("event") == name]

    def bundles(self) -> list[Path]:
        return sorted((self.run_dir / "bundles").glob("*.tar.gz"))


def quiet(name: str, case: str, base: Path) -> Job:
    argv = [*BLACKBOX, "run", "--run-dir", str(base / name), "--", TORCHRUN, "--standalone", "--nproc-per-node", "2",
            str(PROGRAMS / "quiet_job.py"), case]  # fmt: skip  # every option at its default
    return Job(name, argv, base / name, base, job_env(BB_PAUSE_S=str(PAUSE_S)))


def hang(name: str, base: Path) -> Job:
    # the stall rule's options at their defaults (auto); a short kill grace so that a stopped rank is gone soon
    argv = [*BLACKBOX, "run", "--run-dir", str(base / name), "--kill-grace", "3", "--", *runner.torchrun_command(name)]
    return Job(name, argv, base / name, base, {**runner.environment(name), "BB_STEP_AT": "8"})


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[tuple[Job, int, str, str]]]]:
    base = tmp_path_factory.mktemp("quiet")
    started = {name: quiet(name, name, base) for name in QUIET}
    started[COLLECTED] = quiet(COLLECTED, "dcp", base)
    started[STUCK] = quiet(STUCK, STUCK, base)
    started[EMA_HANG] = quiet(EMA_HANG, EMA_HANG, base)
    started[WOKEN] = quiet(WOKEN, WOKEN, base)
    started.update({name: quiet(name, name, base) for name in POLLS})
    started.update({name: hang(name, base) for name in HANGS})
    threading.Thread(target=_collect_mid_pause, args=(started[COLLECTED],), daemon=True).start()
    pool = ThreadPoolExecutor(len(started))

    def finish(job: Job) -> tuple[Job, int, str, str]:
        return (job, *job.finish(400))

    try:
        yield {name: pool.submit(finish, job) for name, job in started.items()}
    finally:
        for job in started.values():
            if job.proc.poll() is None:
                runner.kill_tree(job.proc.pid)
        pool.shutdown(wait=True)


def _collect_mid_pause(job: Job) -> None:
    """SIGUSR1 to blackbox ("collect now") 70 s into rank 0's pause: the bundle must carry its motion."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.proc.poll() is None:
        if job.events("slow_phase"):
            time.sleep(10)
            os.kill(job.proc.pid, signal.SIGUSR1)
            return
        time.sleep(0.5)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("case", list(QUIET))
def test_a_long_pause_on_one_rank_is_never_a_stall(jobs: dict[str, Future[tuple[Job, int, str, str]]],
                                                   case: str) -> None:  # fmt: skip
    job, code, out, err = jobs[case].result()
    # THEN the job ends by itself, exit 0, with rank 0's pause really longer than the auto timeout
    assert code == 0, err[-3000:]
    paused = [float(line.split()[3]) for line in out.splitlines() if line.startswith("rank 0: paused")]
    assert paused and paused[0] > 61, out[-2000:]
    # AND blackbox filed nothing: no bundle, no stall, busy or frozen rule, no incident line
    assert not job.bundles(), err[-3000:]
    assert not [e for e in ("stall", "busy", "frozen", "bundle") if job.events(e)], err[-3000:]
    assert "blackbox: stall" not in err and "evidence bundle" not in err, err[-3000:]
    # AND one slow-phase event and line: rank 0 at work (and how), rank 1 waiting for it
    (note,) = job.events("slow_phase")
    assert note["ranks"] == [0] and "rank 1 waits for it" in note["reason"], note
    doing = next(f["doing"] for f in note["findings"] if f["rank"] == 0)
    assert QUIET[case] in doing, (case, doing)
    if case in ("upload", "polled-upload"):  # the thread it waits for, named, and its rate
        assert re.search(r"waits for its thread `ThreadPoolExecutor-\d+_0` \(tid \d+\), which works: writing \d+ kB/s$",
                         doing), doing  # fmt: skip
    lines = [line for line in err.splitlines() if line.startswith("blackbox:")]
    assert len(lines) == 1 and lines[0].startswith("blackbox: slow phase: rank 0 has taken no step for 6"), lines


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", HANGS)
def test_auto_still_catches_a_real_hang_within_60_s_of_its_last_progress(
    jobs: dict[str, Future[tuple[Job, int, str, str]]], name: str
) -> None:
    job, code, _, err = jobs[name].result()
    spec = runner.SCENARIOS[name]
    # THEN the stall rule fired under `auto` 60 s after the job last moved (a poll's slack) — 30 s where the culprit
    # waits at a definite leaf (a FIFO nobody writes, a stopped process), judged by it — and ended the job
    assert code == spec["exit"] == 86, err[-3000:]
    # (a rank still stopped while the job is being ended trips the rule again: an `expected` record of the ending)
    (stall,) = [e for e in job.events("stall") if not e.get("expected")]
    still = min(f["idle_s"] for f in stall["findings"])
    leaf, culprits = LEAF_OF.get(name), spec["verdict"]["suspect_ranks"]
    rules = {f["rank"]: f["timeout_rule"] for f in stall["findings"]}
    others = OTHERS_RULE.get(name, "auto")
    assert rules == {r: f"leaf {leaf}" if leaf and r in culprits else others for r in rules}, stall
    after = 30 if leaf else 60
    assert after <= still <= after + 3, stall
    assert not job.events("slow_phase"), err[-3000:]  # nothing moved: not a pause
    # AND the bundle gets the gallery's verdict
    bundle = job.bundles()[0]
    got, same = runner.compare(name, analyze(read_bundle(str(bundle))).to_json()["verdict"])
    assert same, (got, err[-3000:])


@pytest.mark.timeout(480)
def test_the_heartbeat_history_keeps_what_moved(jobs: dict[str, Future[tuple[Job, int, str, str]]]) -> None:
    job, code, _, err = jobs[COLLECTED].result()
    # GIVEN a manual bundle taken 10 s after the slow-phase note, while rank 0 still wrote its checkpoint
    assert code == 0, err[-3000:]  # a bundle on request never ends the job
    (bundle,) = job.bundles()
    b = read_bundle(str(bundle))
    history = b.json("ranks/0/history.json")
    assert isinstance(history, list)
    # THEN rank 0's history has samples taken while it moved without a step, its written bytes growing, and
    # rank 1's shows it still
    pause = [h for h in history if h["step"] == 8 and h.get("moved_t") and h["moved_t"] > h["t"] + 5]
    assert len(pause) >= 3, json.dumps(history[-5:])
    assert pause[-1]["written_bytes"] - pause[0]["written_bytes"] > 5_000_000, pause
    waiting = b.json("ranks/1/history.json")
    assert isinstance(waiting, list) and waiting[-1]["phase"] == "collective"
    # AND the report says so in words
    texts = [f.text for f in analyze(b).findings if "without a step" in f.text]
    assert texts and texts[0].startswith("rank 0 was working without a step (writing ") and "rank 1 waited" in texts[0]


@pytest.mark.timeout(480)
def test_a_child_that_waits_for_input_that_never_comes_is_a_stall(
    jobs: dict[str, Future[tuple[Job, int, str, str]]],
) -> None:
    # THEN following rank 0's wait to its child (no byte, no CPU time) finds nothing moving: the stall rule fires
    # under `auto` 60 s after the job last moved, and ends the job
    report = caught_by_auto(jobs[STUCK].result())
    # AND the bundle blames rank 0, waiting for I/O at the leaf of its wait: the child, and what the child waits on
    verdict = report["verdict"]
    assert (verdict["category"], verdict["suspect_ranks"]) == ("hang.io", [0]), verdict
    assert re.search(r"rank 0 is waiting for I/O \(main thread waits for its child `cat` \(pid \d+\), which is "
                     r"blocked in read\(\) of fd 0, pipe:\[\d+\] \(a pipe\)\), while rank 1 waits for it",
                     verdict["summary"]), verdict  # fmt: skip
    assert any("a password or confirmation prompt" in a for a in report["next_actions"]), report["next_actions"]


@pytest.mark.timeout(480)
def test_a_hung_main_thread_is_a_stall_while_another_thread_runs_a_module(
    jobs: dict[str, Future[tuple[Job, int, str, str]]],
) -> None:
    # THEN the teacher thread's forward calls do not count (only the main thread's do), its stack does not either
    # (the main thread waits for no thread): the stall rule fires under `auto` about 60 s after the last motion
    verdict = caught_by_auto(jobs[EMA_HANG].result())["verdict"]
    assert (verdict["category"], verdict["suspect_ranks"]) == ("hang.io", [0]), verdict


@pytest.mark.timeout(480)
def test_a_read_woken_by_a_timer_is_a_stall(jobs: dict[str, Future[tuple[Job, int, str, str]]]) -> None:
    # THEN a wake-up that leaves the read of a pipe waiting moved no byte (the read would have returned with the
    # first): the stall rule fires under `auto` about 60 s after the last motion, and the bundle blames the read
    report = caught_by_auto(jobs[WOKEN].result())
    verdict = report["verdict"]
    assert (verdict["category"], verdict["suspect_ranks"]) == ("hang.io", [0]), verdict
    assert re.search(r"rank 0 is waiting for I/O \(main thread blocked in read\(\) of fd \d+, pipe:\[\d+\] \(a pipe\)",
                     verdict["summary"]), verdict  # fmt: skip


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", POLLS)
def test_a_poll_loop_for_what_never_comes_is_a_stall(jobs: dict[str, Future[tuple[Job, int, str, str]]],
                                                     name: str) -> None:  # fmt: skip
    # THEN waking to check is not working: its stack changing between the sleep and the check is not motion, and
    # nothing it could wait for moves: a definite leaf (supervisor.leaf), the stall rule fires under `auto` about
    # 30 s after the last motion (its floor; 60 s before the leaves)
    report = caught_by_auto(jobs[name].result(), "leaf poll", 30.0)
    # AND the report says it polls, where, and what to look for
    verdict = report["verdict"]
    assert (verdict["category"], verdict["suspect_ranks"], verdict["confidence"]) == ("hang.poll", [0], "high"), verdict
    function = name.replace("-", "_")
    # AND what the loop checks: the lock file and who holds it, the marker that does not exist, the store key
    checks = {"stale-lock": r"lock_filename = /\S+/bb-quiet-\w+/model\.lock, held open by `\S+python\S* -c import "
                            r"fcntl[^`]*` \(pid \d+\)",
              "marker": r"`while not os\.path\.exists\(path\)`; path = /\S+/bb-quiet-\w+/stage1\.done, no such file",
              "store-poll": r'`while not store\.check\(\["blackbox-test/never-set"\]\)`'}[name]  # fmt: skip
    assert re.match(rf"The job stalled: rank 0 sleeps and checks in a loop for something that never comes "
                    rf"\({function} \(quiet_job\.py:\d+\): {checks}\), while rank 1 waits for it in barrier #\d+ of "
                    rf"group 0\.$", verdict["summary"]), verdict  # fmt: skip
    assert report["next_actions"][0].startswith("Rank 0 on ") and "a lock file another process holds" in (
        report["next_actions"][0]), report["next_actions"]  # fmt: skip
    # AND it says what the loop may wait for, and that it does not move: for the stale lock, the lock's holder (a
    # child of the rank here), asleep for good; for the others, nothing
    seen = [f["text"] for f in report["findings"] if f["text"].startswith("rank 0: its main thread sleeps and checks")]
    moved = ": its child `" if name == "stale-lock" else " (no thread of its own, no process it started)"
    assert len(seen) == 1 and moved in seen[0], seen


def caught_by_auto(done: tuple[Job, int, str, str], rule: str = "auto", after: float = 60.0) -> dict[str, Any]:
    """The job was ended (exit 86) by one stall under `auto`, `after` s after its last motion (a poll's slack) by the
    timeout `rule` (`auto`; a definite leaf's, `leaf poll`, 30 s), with no slow phase before it: its first bundle's
    report."""
    job, code, _, err = done
    assert code == 86, err[-3000:]
    (stall,) = [e for e in job.events("stall") if not e.get("expected")]
    still = min(f["idle_s"] for f in stall["findings"])
    rules = {f["rank"]: f["timeout_rule"] for f in stall["findings"]}
    assert rules == {0: rule, 1: "auto"} and after <= still <= after + 3, stall  # rank 1 waits in a collective
    assert not job.events("slow_phase"), err[-3000:]
    return analyze(read_bundle(str(job.bundles()[0]))).to_json()
