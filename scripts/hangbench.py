"""The hang benchmark: a ground-truth matrix of real jobs (torchrun, gloo on the CPU; DDP, FSDP2 and plain
all_reduce shapes) run under three contenders side by side in one run, each with its recommended settings:

  blackbox   `blackbox run` with its defaults (`--stall-timeout auto`, `--on-stall kill`)
  pytorch    PyTorch alone: the process group's timeout set short (60 s, in the job's init_process_group, as a team
             would to compete), the flight recorder on (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE,
             TORCH_NCCL_DUMP_ON_TIMEOUT) and PyTorch's analyzer (`torch.distributed.flight_recorder.fr_trace`) on
             whatever dumps it left
  torchrun   what a user has today: torchrun and the process group's default timeout

Each row is an injected fault or a healthy long pause from the galleries (scripts/scenarios/train.py,
tests/programs/quiet_job.py), with its truth beside it: category, culprit rank(s); the onset is the moment the job
prints it (`rank N: failing now`, `rank 0: pausing`). As root, one row runs on two hosts made of network namespaces
(scripts/netns.py), one rank each, and takes the link between them down at node 0's `rank 0: at step 8`: a network
partition, judged on node 0, where the master lives. Measured per contender: hangs detected (recall), healthy jobs
ended or alarmed (false-positive rate), detection latency from onset (median, p90), culprit accuracy (exact suspect
set; category where the tool gives one), evidence completeness (ranks with a stack and their place in the
collectives — a flight-recorder trace or the rank's own ring —, as the report's `evidence` says / world),
and the first line a user reads. One JSON file and a Markdown table.

    python scripts/hangbench.py [--jobs 6] [--out docs/hangbench.json] [--rows a,b] [--contenders blackbox,...]
    python scripts/hangbench.py --quick --check docs/hangbench.json   # CI: blackbox on a subset, no regression

The upload rows put a checkpoint into an S3 server the benchmark starts (SeaweedFS, scripts/s3local.py) through a
slow link; the late-node row starts its second host 120 s after the first.

Imports the stdlib, scripts/netns.py and scripts/s3local.py only (blackbox and torch run in the jobs' processes)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import netns  # noqa: E402  (beside this file)
import s3local  # noqa: E402  (beside this file)

TRAIN = ROOT / "scripts" / "scenarios" / "train.py"
QUIET = ROOT / "tests" / "programs" / "quiet_job.py"
UPLOAD = ROOT / "tests" / "programs" / "upload_job.py"
UPLOAD_RATE = 400_000  # bytes a second through the upload rows' slow link: 30 MiB take about 80 s
SCENARIOS = json.loads((ROOT / "scripts" / "scenarios" / "scenarios.json").read_text())
BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun") if (BIN / "torchrun").exists() else "torchrun"
CONTENDERS = ("blackbox", "pytorch", "torchrun")
PG_TIMEOUT_S = 60  # the PyTorch contender's process-group timeout
CAP_S = 180.0  # a job still running this long after its start is stopped: no detection
ONSET = re.compile(r"rank (\d+): (failing now|pausing|at step \d+)")
STEP_AT = 8  # a fault's step: past `auto`'s first 5 steps, as the quiet job's pause (mid-training)
# CI's check of the harness (a hang, a crash, a healthy pause past the timeout): every row of it, as the woken read and
# the external tool were, also runs with the same defaults in the quiet gallery (tests/integration/test_quiet.py)
QUICK = ("ddp-data-hang", "ddp-raise", "save")


@dataclass(frozen=True)
class Row:
    name: str
    program: list[str]  # the job's own command after torchrun's options
    nproc: int
    truth: str  # "hang" or "crash" (faults), "healthy"
    category: Optional[str]  # blackbox's taxonomy, for the tools that give one
    culprits: list[int]
    shape: str  # plain, ddp, fsdp
    env: dict[str, str] = field(default_factory=dict)
    hosts: int = 1  # 2: two hosts in network namespaces, one rank each, the link cut at the job's mark
    late_s: float = 0.0  # a two-host row: node 1 starts this long after node 0 (a node the scheduler placed late)
    link_rate: Optional[int] = None  # the job uploads to the benchmark's S3 server through a link of this many
    # bytes a second (0: a peer that takes nothing)


def _scenario(name: str, truth: str, step_at: int = STEP_AT, row: Optional[str] = None) -> Row:
    """A scenario-gallery job whose bad rank fails at step `step_at` (the gallery's own step 3 is before `auto`'s
    5 steps, when the start-up timeout still holds: one row keeps it, to show that)."""
    spec = SCENARIOS[name]
    args = [str(a) for a in spec["args"]]
    verdict = spec.get("verdict") or {}
    shape = args[2] if len(args) > 2 else "plain"
    env = {"BB_STEP_AT": str(step_at), **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
    return Row(row or name, [str(TRAIN), *args], int(spec.get("nproc", 2)), truth, verdict.get("category"),
               list(verdict.get("suspect_ranks") or []), shape, env)  # fmt: skip


def _quiet(case: str, truth: str, category: Optional[str] = None, pause_s: Optional[float] = None,
           at_start: bool = False) -> Row:  # fmt: skip
    """A quiet-gallery case: rank 0's pause (75 s unless `pause_s`; before the first batch `at_start`), healthy or
    (the cases that are not quiet) its hang."""
    env = {"BB_PAUSE_S": f"{pause_s:g}"} if pause_s is not None else {}
    if at_start:
        env["BB_PAUSE_STEP"] = "0"
    return Row(case + ("-at-start" if at_start else ""), [str(QUIET), case], 2, truth, category,
               [0] if truth != "healthy" else [], "ddp", env)  # fmt: skip


def _upload(name: str, mode: str, truth: str, rate: int) -> Row:
    """tests/programs/upload_job.py: rank 0 puts a checkpoint into the benchmark's S3 server while rank 1 waits."""
    fault = truth != "healthy"
    return Row(name, [str(UPLOAD), mode], 2, truth, "hang.io" if fault else None, [0] if fault else [], "ddp",
               {"BB_UPLOAD_BYTES": str(30 << 20)}, link_rate=rate)  # fmt: skip


def _pace(name: str) -> Row:
    return Row(name, [str(TRAIN), name, "1", "ddp"], 2, "healthy", None, [], "ddp", {"BB_STEPS": "900"})


def rows(two_hosts: Optional[bool] = None) -> list[Row]:
    """At least 20 faults and 12 healthy jobs, from the galleries as they are (none tuned for this benchmark); the
    two-host row where hosts can be made here (root), or where `two_hosts` says."""
    hangs = ["ddp-data-hang", "ddp-data-hang-workers", "skip-allreduce", "mismatch", "collective-hang", "ddp-gil-hang",
             "ddp-ckpt-hang", "ddp-stopped", "ddp-kernel-hang", "fsdp-data-hang", "fsdp-gil-hang", "fsdp-ckpt-hang",
             "memmap-hang", "socket-read", "init-hang"]  # fmt: skip
    crashes = ["ddp-raise", "ddp-oom", "ddp-segv", "ddp-sigkill", "ddp-exit-early"]
    out = [_scenario(n, "hang") for n in hangs] + [_scenario(n, "crash") for n in crashes]
    out.append(_scenario("ddp-data-hang", "hang", 3, "ddp-data-hang-step3"))  # before auto's 5 steps
    # the whole life: the very first batch (the others wait in the first collective), with a DataLoader and without
    out.append(_scenario("ddp-data-hang", "hang", 0, "ddp-data-hang-step0"))
    out.append(_scenario("ddp-memmap-hang", "hang", 1, "memmap-hang-step1"))
    out += [_quiet(c, "hang", "hang.io") for c in ("final-barrier", "exit-read")]  # after training, at the end
    out += [_quiet(c, "hang", "hang.io") for c in ("stuck", "ema-hang", "woken-read")]
    out += [_quiet(c, "hang", "hang.poll") for c in ("stale-lock", "marker", "slow-marker", "store-poll")]  # polls
    out.append(_quiet("thread-deadlock", "hang"))  # no category of blackbox's is the truth
    out += [_quiet(c, "healthy") for c in ("save", "forward", "loader", "metrics", "index", "dcp", "compile", "tool",
                                           "captured", "workers", "upload", "pool", "oversubscribed", "polled-tool",
                                           "polled-upload", "scoring", "stream")]  # fmt: skip
    out += [_pace(n) for n in ("steady", "data-straggler", "compute-straggler")]
    # a 30 MiB checkpoint put into S3 over plain HTTP (s3fs, botocore: bytes sent with send(), which /proc/PID/io does
    # not count) through a 400 kB/s link, from a thread the main thread waits for and from a non-daemon thread at exit;
    # and to a peer that takes nothing
    out += [_upload("s3-upload", "thread", "healthy", UPLOAD_RATE), _upload("s3-upload-exit", "exit", "healthy",
            UPLOAD_RATE), _upload("s3-upload-dead", "thread", "hang", 0)]  # fmt: skip
    # the whole life, healthy: 150 s of preparation before the group, a retry's 50 s backoff (doubling; full jitter),
    # 50 s in one GIL-held native call, an upload from a non-daemon thread as the interpreter exits
    out += [_quiet("prep", "healthy", pause_s=150), _quiet("backoff", "healthy", pause_s=50),
            _quiet("jittered-backoff", "healthy", pause_s=50), _quiet("profiled-sleep", "healthy", pause_s=50),
            _quiet("gil-native", "healthy", pause_s=50), _quiet("exit-upload", "healthy")]  # fmt: skip
    # ... and before the first batch, the group set up: weights read from a slow server, a pool of workers preparing
    out += [_quiet(c, "healthy", at_start=True) for c in ("index", "scoring")]
    # root: two hosts whose link goes down at step 8; the truth as node 0 (the master's) sees it: the rank beyond it
    if netns.available() if two_hosts is None else two_hosts:
        out.append(Row("partition", [str(TRAIN), "steady", "0", "ddp"], 1, "hang", "hang.network", [1], "ddp",
                       {"BB_STEP_AT": str(STEP_AT), "BB_MARK": "1", "BB_STEPS": "5000"}, hosts=2))  # fmt: skip
        # healthy: the second node starts 120 s after the first, whose launcher waits for it in its own rendezvous
        out.append(Row("late-node", [str(TRAIN), "steady", "0", "ddp"], 1, "healthy", None, [], "ddp",
                       {"BB_STEPS": "200"}, hosts=2, late_s=120))  # fmt: skip
    return out


@dataclass
class Outcome:
    row: str
    contender: str
    truth: str
    detected: bool  # a fault: the tool said so before the cap; a healthy job: it ended or alarmed (a false alarm)
    latency_s: Optional[float]  # from onset to the tool's word
    suspects: Optional[list[int]]
    category: Optional[str]
    culprit_ok: Optional[bool]
    category_ok: Optional[bool]
    evidence: float  # ranks with a stack and their place in the collectives / world
    first_line: str
    exit_code: Optional[int]
    wall_s: float
    note: str = ""


class Lines:
    """A process's output lines, each with the monotonic time it was read."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip("\n")))

    def join(self) -> None:
        self._thread.join(timeout=10)

    def first(self, pattern: re.Pattern[str], after: float = 0.0, until: float = float("inf")) -> Optional[
            tuple[float, str]]:  # fmt: skip
        return next(((t, s) for t, s in self.lines if after <= t <= until and pattern.search(s)), None)


def _env(row: Row, contender: str, work: Path, link: Optional[s3local.Link] = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "TORCH_FR_", "TORCH_NCCL_", "BB_"))}
    env.pop("PYTHONPATH", None)
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(work), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", **row.env)
    env["BLACKBOX_HOME"] = str(work / "home")  # its incident index: never the user's (its bundles are removed after)
    if link is not None and S3 is not None:  # the upload rows: the server's user, through the row's own link
        env.update(S3.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{link.port}"), BB_UPLOAD_KEY=f"{s3local.BUCKET}/"
                   f"{work.name}/ckpt.pt")  # fmt: skip
    if contender == "pytorch":
        (work / "fr").mkdir()
        env.update(BB_PG_TIMEOUT_S=str(PG_TIMEOUT_S), TORCH_FR_BUFFER_SIZE="2000", TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                   TORCH_FR_DUMP_TEMP_FILE=str(work / "fr" / "fr_trace_"))  # fmt: skip
    return env


def _command(row: Row, contender: str, work: Path, node: Optional[tuple[int, str, int]] = None) -> list[str]:
    """The job's command line; `node`: (node rank, master address, port) of a two-host row."""
    where = ["--standalone"] if node is None else ["--nnodes", "2", "--node-rank", str(node[0]), "--master-addr",
                                                   node[1], "--master-port", str(node[2])]  # fmt: skip
    job = [TORCHRUN, *where, "--nproc-per-node", str(row.nproc), *row.program]
    if contender == "blackbox":
        run_dir = work / ("run" if node is None else f"run{node[0]}")
        return [sys.executable, "-m", "blackbox", "run", "--run-dir", str(run_dir), "--", *job]
    return job


def run_one(row: Row, contender: str, scratch: Path) -> Outcome:
    work = Path(tempfile.mkdtemp(prefix=f"{row.name}-{contender}-", dir=scratch))
    os.chmod(work, 0o1777)  # read-failure's loader drops root
    start = time.monotonic()
    run = _two_hosts if row.hosts == 2 else _one_host
    link = s3local.Link(_s3_address(), row.link_rate) if row.link_rate is not None else None
    try:
        code, end, out, err, onset = run(row, contender, work, link)
    finally:
        if link is not None:
            link.close()
        _kill_strays(work)
    judge = _blackbox if contender == "blackbox" else _torch
    o = judge(row, contender, work, err, code, end, onset)
    o.wall_s = round(end - start, 1)
    if row.truth != "healthy" and onset is None:
        o.note = (o.note + "; " if o.note else "") + "no onset line: latency from the job's start"
    return o


Ran = tuple[Optional[int], float, "Lines", "Lines", Optional[float]]  # exit code, end, stdout, stderr, onset
S3: Optional[s3local.S3Server] = None  # the upload rows' server, one for the run (main)
_LIVE: set[subprocess.Popen[bytes]] = set()  # every job started and not yet stopped: none outlives the benchmark
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # the benchmark was interrupted: no job starts any more


def _start(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """A job in a session of its own (its process group is what _stop ends), known until it is stopped."""
    with _LIVE_LOCK:
        if _STOPPING.is_set():
            raise KeyboardInterrupt
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                **kwargs)  # fmt: skip
        _LIVE.add(proc)
    return proc


def _s3_address() -> tuple[str, int]:
    if S3 is None:
        raise RuntimeError("the upload rows need the benchmark's S3 server (SeaweedFS)")
    host, port = S3.endpoint.rsplit("/", 1)[-1].split(":")
    return host, int(port)


def _one_host(row: Row, contender: str, work: Path, link: Optional[s3local.Link] = None) -> Ran:
    proc = _start(_command(row, contender, work), cwd=work, env=_env(row, contender, work, link))
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        code: Optional[int] = proc.wait(timeout=CAP_S)
    except subprocess.TimeoutExpired:
        code = None
    end = time.monotonic()
    _stop(proc)
    out.join()
    err.join()
    hit = out.first(ONSET)
    return code, end, out, err, hit[0] if hit else None


def _two_hosts(row: Row, contender: str, work: Path, link: Optional[s3local.Link] = None) -> Ran:
    """Node 0 and node 1 on hosts of their own (network namespaces), node 1 `row.late_s` after node 0; at node 0's
    mark the link between them goes down (the onset). Judged on node 0, where the master lives: what its tool says,
    when."""
    with netns.two_hosts() as (ns, addrs):
        hosts = work / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n{addrs[0]} bbhost0\n{addrs[1]} bbhost1\n")
        env = _env(row, contender, work)
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env.pop(name, None)
        port = random.randrange(20000, 29000)  # in namespaces of this row's own: nothing else binds there
        argv = [netns.on_host(ns[n], f"bbhost{n}", _command(row, contender, work, (n, addrs[0], port)), str(hosts))
                for n in (0, 1)]  # fmt: skip
        procs = []
        for n, a in enumerate(argv):
            if n and row.late_s:
                time.sleep(row.late_s)
            procs.append(_start(a, cwd=work, env=env))
        streams = [(Lines(p.stdout), Lines(p.stderr)) for p in procs]
        onset: list[float] = []
        cutter = threading.Thread(target=_cut_at_mark, args=(procs[0], streams[0][0], ns[1], onset), daemon=True)
        if row.env.get("BB_MARK"):  # the partition: the link goes down at the job's mark (not in a healthy row)
            cutter.start()
        try:
            code: Optional[int] = procs[0].wait(timeout=CAP_S)
        except subprocess.TimeoutExpired:
            code = None
        end = time.monotonic()
        for p in procs:
            _stop(p)
        if cutter.is_alive():
            cutter.join(timeout=10)
        for out, err in streams:
            out.join()
            err.join()
    return code, end, streams[0][0], streams[0][1], onset[0] if onset else None


def _cut_at_mark(proc: subprocess.Popen[bytes], out: Lines, ns: str, onset: list[float]) -> None:
    deadline = time.monotonic() + CAP_S
    while time.monotonic() < deadline and proc.poll() is None:
        if out.first(ONSET) is not None:
            netns.cut(ns)
            onset.append(time.monotonic())
            return
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                continue
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)


def _kill_strays(under: Path) -> None:
    """SIGKILL to every process left of the jobs whose work directory is `under` or inside it (their TMPDIR says
    which): torchrun starts each rank in a session of its own, out of the group `_stop` ends, and a rank that cannot
    act on the launcher's SIGTERM — the stopped rank of ddp-stopped — outlived every run of the benchmark."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):  # gone, or not ours to read
            tmp = proc.environ().get("TMPDIR", "")
            if tmp == str(under) or tmp.startswith(f"{under}{os.sep}"):
                proc.kill()  # (psutil checks that the pid is still the process it read)


def _stop_all() -> None:
    """Interrupted (Ctrl-C, SIGTERM): every job the benchmark started is ended, and none starts after."""
    with _LIVE_LOCK:
        _STOPPING.set()
        live = list(_LIVE)
    for proc in live:
        _stop(proc)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the jobs are ended and the S3 server stopped on the way out


def _latency(at: Optional[float], onset: Optional[float], fallback: float) -> Optional[float]:
    return None if at is None else round(at - (onset if onset is not None else fallback), 1)


BUNDLE = re.compile(r"^blackbox: evidence bundle: (\S+)")


def _blackbox(row: Row, contender: str, work: Path, err: Lines, code: Optional[int], end: float,
              onset: Optional[float]) -> Outcome:  # fmt: skip
    said = err.first(BUNDLE, until=end)  # not the evidence of our own stop at the cap
    first = err.first(re.compile(r"^blackbox: (?!evidence bundle|run |status:|recording|watching)"),
                      onset or 0.0, end)  # fmt: skip
    report: dict[str, Any] = {}
    evidence = 0.0
    if said:
        path = BUNDLE.match(said[1]).group(1)  # type: ignore[union-attr]
        res = subprocess.run([sys.executable, "-m", "blackbox", "report", "--format", "json", path],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        whole = json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else {}
        report = whole.get("verdict", {})
        complete = {e.get("rank") for e in whole.get("evidence") or [] if e.get("complete")}
        evidence = round(len(complete) / (row.nproc * row.hosts), 2)
    detected = said is not None or (row.truth == "healthy" and code not in (0, None))
    suspects = report.get("suspect_ranks") if said else None
    category = report.get("category") if said else None
    return _outcome(row, contender, detected, _latency(said[0] if said else None, onset, end - CAP_S), suspects,
                    category, evidence, first[1] if first else "", code)  # fmt: skip


ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):")
RANK_LINE = re.compile(r"^\s*rank\s*:\s*(\d+)")
FAILURE = re.compile(r"Traceback|Error|timed out|Timed out|Timeout|exitcode|Signal \d+|failed")


def _torch(row: Row, contender: str, work: Path, err: Lines, code: Optional[int], end: float,
           onset: Optional[float]) -> Outcome:  # fmt: skip
    detected = code not in (0, None)
    suspects: Optional[list[int]] = None
    note = ""
    if detected:
        texts = [s for _, s in err.lines]
        at = next((i for i, s in enumerate(texts) if ROOT_CAUSE.search(s)), None)
        ranks = [int(m.group(1)) for s in texts[at : at + 12] if (m := RANK_LINE.match(s))] if at is not None else []
        suspects = ranks[:1] if ranks else []
        analyzed = _torch_analyzer(work / "fr") if contender == "pytorch" else None
        if analyzed is not None:
            suspects, note = analyzed, "suspects from PyTorch's flight-recorder analyzer"
    first = err.first(FAILURE, onset or 0.0, end)
    traces = len(list((work / "fr").glob("fr_trace_*"))) if (work / "fr").is_dir() else 0
    # a stack: the root cause's traceback (torchrun prints the first failure's error file); a trace: a dump
    evidence = round(min(1, traces) / (row.nproc * row.hosts), 2) if detected and suspects else 0.0
    return _outcome(row, contender, detected, _latency(end if detected else None, onset, end - CAP_S), suspects, None,
                    evidence, first[1] if first else "", code, note)  # fmt: skip


def _torch_analyzer(fr_dir: Path) -> Optional[list[int]]:
    """PyTorch's own analyzer on the dumps the job left (gloo leaves none unless the job dumps): its missing ranks."""
    if not any(fr_dir.glob("fr_trace_*")):
        return None
    res = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(fr_dir)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    m = re.search(r"missing ranks: \{([\d, ]*)\}", res.stdout + res.stderr)
    return sorted(int(r) for r in m.group(1).split(",") if r.strip()) if m else []


def _outcome(row: Row, contender: str, detected: bool, latency: Optional[float], suspects: Optional[list[int]],
             category: Optional[str], evidence: float, first_line: str, code: Optional[int],
             note: str = "") -> Outcome:  # fmt: skip
    fault = row.truth != "healthy"
    culprit_ok = (sorted(suspects or []) == sorted(row.culprits)) if fault and detected else None
    category_ok = (category == row.category) if fault and detected and category and row.category else None
    return Outcome(row.name, contender, row.truth, detected, latency if fault else None, suspects, category,
                   culprit_ok, category_ok, evidence if fault else 0.0, first_line[:200], code, 0.0, note)  # fmt: skip


def summarise(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for c in CONTENDERS:
        mine = [o for o in outcomes if o.contender == c]
        if not mine:
            continue
        faults = [o for o in mine if o.truth != "healthy"]
        healthy = [o for o in mine if o.truth == "healthy"]
        caught = [o for o in faults if o.detected]
        lat = sorted(o.latency_s for o in caught if o.latency_s is not None)
        cats = [o for o in caught if o.category_ok is not None]
        out[c] = {
            "faults": len(faults), "healthy": len(healthy),
            "recall": _ratio(len(caught), len(faults)),
            "false_positive_rate": _ratio(sum(o.detected for o in healthy), len(healthy)),
            "latency_median_s": round(statistics.median(lat), 1) if lat else None,
            "latency_p90_s": round(lat[min(len(lat) - 1, int(0.9 * len(lat)))], 1) if lat else None,
            "culprit_accuracy": _ratio(sum(bool(o.culprit_ok) for o in faults), len(faults)),
            "category_accuracy": _ratio(sum(bool(o.category_ok) for o in cats), len(cats)) if cats else None,
            # (`evidence_completeness` in results before the rings: a stack and a flight-recorder trace, read from
            # the bundle's member names, where a rank's own py-spy record was not counted)
            "evidence_complete": round(sum(o.evidence for o in faults) / len(faults), 2) if faults else None,
        }  # fmt: skip
    return out


def _ratio(a: int, b: int) -> Optional[float]:
    return round(a / b, 2) if b else None


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    cols = [c for c in CONTENDERS if c in s]
    lines = ["| measure | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for key, label in (("recall", "faults detected (recall)"), ("false_positive_rate", "healthy jobs ended or alarmed"),
                       ("latency_median_s", "latency from onset, median (s)"), ("latency_p90_s", "latency p90 (s)"),
                       ("culprit_accuracy", "exact culprit set (of all faults)"),
                       ("category_accuracy", "category right (where given)"),
                       ("evidence_completeness", "evidence: ranks with stack + collective trace / world"),
                       ("evidence_complete", "evidence: ranks with stack + place in the collectives / world"),
                       ):  # fmt: skip
        if not any(key in s[c] for c in cols):
            continue
        lines.append(f"| {label} | " + " | ".join(_cell(s[c].get(key), not key.startswith("latency")) for c in cols)
                     + " |")  # fmt: skip
    lines += ["", "| row | truth | culprit | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    by = {(o["row"], o["contender"]): o for o in result["outcomes"]}
    for r in result["rows"]:
        cells = [_row_cell(by.get((r["name"], c))) for c in cols]
        lines.append(f"| {r['name']} ({r['shape']}) | {r['truth']} {r['category'] or ''} | {r['culprits']} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _cell(v: Any, percent: bool) -> str:
    """A summary's value: a ratio as a percentage, seconds as they are."""
    return "-" if v is None else f"{v:.0%}" if percent else str(v)


def _row_cell(o: Optional[dict[str, Any]]) -> str:
    if o is None:
        return "not run"
    if o["truth"] == "healthy":
        return "**alarm**" if o["detected"] else "quiet"
    if not o["detected"]:
        return "**missed**"
    who = "right" if o["culprit_ok"] else f"**{o['suspects']}**"
    return f"{o['latency_s']} s, {who}" + (f", {o['category']}" if o.get("category") else "")


def check(result: dict[str, Any], committed_path: Path) -> list[str]:
    """blackbox's recall and false-positive rate on these rows against the committed result's on the same rows."""
    committed = json.loads(committed_path.read_text())
    mine = {o["row"]: o for o in result["outcomes"] if o["contender"] == "blackbox"}
    before = {o["row"]: o for o in committed["outcomes"] if o["contender"] == "blackbox" and o["row"] in mine}
    problems = []
    for name, o in sorted(mine.items()):
        b = before.get(name)
        if b is None:
            problems.append(f"{name}: not in {committed_path.name}")
        elif o["truth"] != "healthy" and b["detected"] and not o["detected"]:
            problems.append(f"{name}: a fault blackbox caught in the committed run is missed now")
        elif o["truth"] == "healthy" and o["detected"] and not b["detected"]:
            problems.append(f"{name}: a healthy job is ended or alarmed now (quiet in the committed run)")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=6, help="jobs side by side (default 6)")
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--quick", action="store_true", help=f"blackbox on {', '.join(QUICK)} only (CI)")
    ap.add_argument("--check", type=Path, help="fail if blackbox's recall or false-positive rate regress against it")
    ap.add_argument("--out", type=Path, help="write the JSON result here")
    ap.add_argument("--markdown", type=Path, help="write the Markdown tables here")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    table = rows()
    names = set(QUICK) if args.quick else set(args.rows.split(",")) if args.rows else {r.name for r in table}
    unknown = names - {r.name for r in table}
    if unknown:
        print(f"hangbench: unknown row(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    chosen = [r for r in table if r.name in names]
    contenders = ["blackbox"] if args.quick else [c for c in args.contenders.split(",") if c]
    runs = [(r, c) for r in chosen for c in contenders]
    runs.sort(key=lambda rc: rc[0].truth == "crash")  # the long jobs first
    scratch = Path(tempfile.mkdtemp(prefix="bb-hangbench-"))
    os.chmod(scratch, 0o1777)
    started = time.monotonic()
    global S3
    try:
        with contextlib.ExitStack() as stack:
            if any(r.link_rate is not None for r in chosen):
                S3 = stack.enter_context(s3local.server(scratch / "s3", s3local.any_port))
            outcomes = _run_all(runs, scratch, args.jobs)
    except KeyboardInterrupt:
        print("hangbench: interrupted: its jobs and its S3 server were stopped; no result written", file=sys.stderr)
        return 130
    finally:
        _kill_strays(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.monotonic() - started), "jobs": args.jobs,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "versions": _versions(), "pg_timeout_s": PG_TIMEOUT_S, "cap_s": CAP_S,
        "rows": [asdict(r) | {"program": [Path(p).name if "/" in p else p for p in r.program]} for r in chosen],
        "outcomes": [asdict(o) for o in outcomes],
        "summary": summarise(outcomes),
    }  # fmt: skip
    text = markdown(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    if args.check:
        problems = check(result, args.check)
        for p in problems:
            print(f"hangbench: REGRESSION: {p}", file=sys.stderr)
        return 1 if problems else 0
    return 0


def _run_all(runs: list[tuple[Row, str]], scratch: Path, jobs: int) -> list[Outcome]:
    """Every (row, contender), `jobs` side by side; each outcome said as it comes."""
    outcomes = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, r, c, scratch) for r, c in runs]
        try:
            for f in futures:
                o = f.result()
                outcomes.append(o)
                print(f"hangbench: {o.row:22} {o.contender:9} {'detected' if o.detected else 'quiet':8} "
                      f"{o.latency_s if o.latency_s is not None else '-':>6} {o.suspects} {o.category or ''} "
                      f"({o.wall_s:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        except BaseException:  # interrupted: the jobs running are ended, those waiting never start
            for f in futures:
                f.cancel()
            _stop_all()
            raise
    return outcomes


def _versions() -> dict[str, str]:
    code = "import torch, blackbox; print(torch.__version__, getattr(blackbox, '__version__', '?'))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    torch_v, _, bb_v = res.stdout.strip().partition(" ")
    return {"torch": torch_v, "blackbox": bb_v, "py-spy": _pyspy()}


def _pyspy() -> str:
    """The py-spy the jobs' blackbox finds: beside this interpreter first, as on the jobs' PATH."""
    spy = shutil.which("py-spy", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if spy is None:
        return "none"
    res = subprocess.run([spy, "--version"], capture_output=True, text=True, timeout=30)
    return res.stdout.strip().removeprefix("py-spy ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
