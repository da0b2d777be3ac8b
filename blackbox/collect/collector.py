"""One collection: every rank's and helper process's evidence gathered in parallel within a time budget, then
redacted, bounded and written as one bundle. Used by `blackbox run` on a trigger and by `blackbox collect PID`.
Order matters (DESIGN.md §7): from outside first (py-spy, /proc), then the rank's own dump, and last the
recorder's own dump signal, only to a process that registered it (never SIGUSR1: that may be the job's).
Imports the stdlib and blackbox's host side; never prints (it reports progress)."""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from .. import heartbeat_reader
from .._recorder import protocol as P
from ..adapters import gpu, host, procfs, proctree, pyspy, slurm, sockdiag, stacks, torchelastic
from ..bundle import evidence
from ..bundle import layout as L
from ..bundle.writer import BundleWriter, Step, Written
from ..detections import Detection, Trigger
from ..events import EventLog
from ..frames import where
from ..heartbeat_reader import HeartbeatState
from ..redact import config_files, redact_argv, redact_config, redact_env, redact_json_text, redact_text
from ..safeopen import RunDir, UnsafeFile, read_file
from . import polled, rank_dumps
from .job import Job, RankTarget, _is_python

CONSOLE_TAIL_BYTES = 256 * 1024
RANK_FILE_CAP = 1024 * 1024
BINARY_FILE_CAP = 64 * 1024 * 1024  # memory snapshots and flight-recorder pickles
CONFIG_FILE_CAP = 256 * 1024
MAX_HELPERS_PER_RANK = 16  # DataLoader workers and other child processes of one rank given py-spy and /proc
MAX_WAITED = 8  # processes a rank waits for (and those below them) described in its proc.json
# What the rank recorder leaves in ranks/<rank>/ (its heartbeat is decoded separately).
RANK_PATTERNS = tuple(L.glob(name) for name in L.RANK_FILES)
EVENTS_CAP = 16 * 1024 * 1024  # the run's events.jsonl: its newest part

Progress = Callable[[str], None]


EXIT_LINE_WAIT_S = 5.0  # at most this long for torchrun's line saying how a dead worker ended


def disk_full(exc: BaseException, out_dir: str) -> Optional[str]:
    """For an error writing a bundle into `out_dir` that is a full disk (or quota): the sentence that says so, where,
    and what was kept (the writer removes its partial file), to end as the caller's sentence; None otherwise."""
    if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return (f"The disk holding `{out_dir}` is full ({os.strerror(exc.errno)}): no bundle was written (its partial "
            "file was removed), what was written there before is kept")  # fmt: skip


def _redact_file(name: str, text: str) -> str:
    """A run-directory file for the bundle: JSON (and each line of JSON Lines) redacted as data, so that it still
    parses; anything else as text."""
    if name.endswith(".json"):
        redacted = redact_json_text(text)
        return text if redacted is None else redacted
    if name.endswith(".jsonl"):
        lines = text.splitlines(keepends=True)
        return "".join(r if (r := redact_json_text(line)) is not None else redact_text(line) for line in lines)
    return redact_text(text)


@dataclass(frozen=True)
class CollectOptions:
    dump_timeout: float = 5.0  # per process: py-spy, and the wait for the ranks' own dumps
    budget: float = 60.0  # the whole collection; what is not done by then is marked and skipped
    native: bool = False  # py-spy --native (C/C++ frames; ~0.5-1 s a process)
    locals: bool = False  # py-spy --locals (values redacted)
    job_ends: bool = False  # the job is about to be ended anyway: ranks may be signalled at once


@dataclass(frozen=True)
class CollectResult:
    written: Written
    steps: list[Step]
    duration_s: float

    @property
    def path(self) -> str:
        return self.written.path


class _Console(Protocol):
    def tail(self, limit: int) -> bytes: ...


class FileTail:
    """The end of a file on disk (console.log of a run, when `blackbox collect` finds one), read safely (see
    blackbox.safeopen): `read(limit)` gives the last `limit` bytes."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self.read = read

    def tail(self, limit: int) -> bytes:
        try:
            return self.read(limit)
        except OSError:
            return b""


@dataclass(frozen=True)
class _Proc:
    """A process to take stacks and /proc state of: a rank, or one of its helpers (DataLoader workers)."""

    rank: Optional[int]  # None: the launcher (torchrun's agent)
    pid: int
    helper: bool
    hb: Optional[HeartbeatState] = None  # a rank's own process: its heartbeat as the collection began
    # why py-spy cannot suspend it as the collection began (stopped; a thread in D state): read without suspending
    unsuspendable: Optional[str] = None

    @property
    def workers_since(self) -> Optional[float]:
        """Its main thread waits for a thread or polls (its heartbeat says): proctree.workers."""
        return self.hb.workers_since if self.hb is not None else None

    @property
    def polling(self) -> bool:
        """Its recorder saw its main thread sleep and check in a loop (collect.polled)."""
        return self.hb is not None and self.hb.waiting == "poll"

    def path(self, what: str) -> str:
        """Where its `what` (py-spy, proc) goes in the bundle (bundle.layout)."""
        return L.process_member(self.rank, what, self.pid if self.helper else None)

    @property
    def own(self) -> bool:
        """A rank's own process (not one of its helpers, not the agent)."""
        return self.rank is not None and not self.helper

    def add(self, w: BundleWriter, what: str, obj: Any) -> None:
        """Its `what` into the bundle: a rank's own in the node's rank table, a helper's or the agent's a member."""
        if self.own and self.rank is not None and what + ".json" in L.TABLED:
            w.add_record(self.rank, what + ".json", obj)
        else:
            w.add_json(self.path(what), obj)


def heartbeat_record(t: RankTarget, now: float, page: Optional[bytes]) -> dict[str, Any]:
    """A heartbeat as the bundle keeps it: the raw fields, wall-clock times and the ages that matter, and the ring
    of its last phase edges read from its page (`page`: the file, read without the rank's help)."""
    hb = t.hb
    assert hb is not None
    record = hb.to_json()
    ring = heartbeat_reader.ring(page) if page is not None else []
    record["ring"] = [{**e.__dict__, "start_wall": hb.wall(e.start)} for e in ring]
    record.update(
        alive=t.alive,
        exit_status=t.exit_status,
        idle_s=round(now - hb.last_progress, 3),
        liveness_age_s=round(now - hb.liveness_time, 3),
        phase_age_s=round(now - hb.phase_start, 3),
        last_progress_wall=hb.wall(hb.last_progress),
        phase_start_wall=hb.wall(hb.phase_start),
        still_s=round(now - hb.last_motion, 3),  # since it last moved in any way its heartbeat shows (DESIGN §3)
        last_motion_wall=hb.wall(hb.last_motion),
    )
    return record


def _helpers(t: RankTarget) -> list[int]:
    """A rank's Python child processes (DataLoader workers, compile workers), nearest first, bounded."""
    if not t.alive:
        return []
    rank_exe = procfs.exe(t.pid)
    return [pid for pid in procfs.descendants(t.pid) if proctree.runs_python(pid, rank_exe)][:MAX_HELPERS_PER_RANK]


def _rank_files(run: RunDir, ranks: Iterable[int]) -> list[tuple[str, str]]:
    """(path in the run directory, path in the bundle) of the recorder's files worth keeping; empty files, and
    files that are links, not regular or not the job's user's, are skipped."""
    out = []
    for rank in ranks:
        names = run.list(f"{P.RANKS_DIR}/{rank}")
        for pattern in RANK_PATTERNS:
            for name in fnmatch.filter(names, pattern):
                if run.size(f"{P.RANKS_DIR}/{rank}/{name}"):
                    out.append((f"{P.RANKS_DIR}/{rank}/{name}", L.rank_member(rank, name)))
    for name in fnmatch.filter(run.list(P.FR_DIR), P.FR_PREFIX + "*"):
        if not name.endswith(".tmp") and run.size(f"{P.FR_DIR}/{name}") is not None:
            out.append((f"{P.FR_DIR}/{name}", L.FLIGHT_RECORDER_DIR + name))
    return out


def _torchelastic_error_file(run_dir: Optional[str], t: RankTarget, owner: Optional[int]) -> Optional[str]:
    """Where the rank's torchelastic error file goes: from its live environment (read at the start of a
    collection: a rank that raised may be gone by the time files are copied), else the recorder's rank.json.
    The file itself may appear only later, while the rank dies."""
    if t.alive:
        try:
            path = torchelastic.error_file(procfs.environ(t.pid))
            if path:
                return path
        except (OSError, procfs.ProcAccessError):
            pass
    if run_dir:
        try:
            data = RunDir(run_dir, owner).read(f"{P.RANKS_DIR}/{t.rank}/{P.RANK_INFO}", RANK_FILE_CAP)
            path = json.loads(data).get("torchelastic_error_file")
            return path if isinstance(path, str) and path else None
        except (OSError, ValueError, AttributeError):
            pass
    return None


def _redact_locals(threads: list[dict[str, Any]]) -> None:
    """py-spy --locals: a value whose name holds a credential is dropped; the others are redacted."""
    from ..redact import redact_named

    for thread in threads:
        for frame in thread.get("frames") or []:
            for local in frame.get("locals") or []:
                if isinstance(local, dict) and isinstance(local.get("repr"), str):
                    local["repr"] = redact_named(str(local.get("name", "")), local["repr"])


class Collector:
    def __init__(
        self, job: Job, table: Optional[rank_dumps.Table], console: Optional[_Console], options: CollectOptions,
        progress: Optional[Progress] = None,
    ) -> None:  # fmt: skip
        self.job = job
        self.table = table
        self.console = console
        self.options = options
        self.progress: Progress = progress or (lambda message: None)

    # --- helpers -----------------------------------------------------------------------------------
    def _left(self, deadline: float, cap: float) -> float:
        return max(0.1, min(cap, deadline - time.monotonic()))

    # --- steps -------------------------------------------------------------------------------------
    def pyspy_stacks(self, procs: list[_Proc], w: BundleWriter, deadline: float) -> dict[int, Any]:
        """Stacks from outside, in parallel: nothing is signalled; a missing py-spy or a refused ptrace is one
        sentence in the manifest (with the fix) and everything else goes on. Returns pid -> py-spy's threads."""
        t = time.monotonic()
        if not procs:
            return {}
        exe, why = pyspy.find()
        if exe is None:
            w.step("py-spy", "failed", t, why)
            return {}
        per_process = self.options.dump_timeout * (3 if self.options.native else 1)
        done = 0
        still: dict[str, list[int]] = {}  # processes read without suspending them, by why
        retried: list[int] = []  # processes py-spy did not finish in time, read once more

        def read(p: _Proc, held: Optional[str], cap: float) -> pyspy.PySpyResult:
            return pyspy.dump(p.pid, native=self.options.native and not held, locals=self.options.locals,
                              timeout=self._left(deadline, cap), exe=exe, nonblocking=held is not None)  # fmt: skip

        def one(p: _Proc) -> pyspy.PySpyResult:
            nonlocal done
            if time.monotonic() >= deadline:
                return pyspy.PySpyResult(p.pid, None, "not started: the collection budget was spent")
            held = p.unsuspendable  # read without suspending it: it cannot be suspended (soon)
            result = read(p, held, per_process)
            if held is None and result.refused and time.monotonic() < deadline:
                # ptrace refused (no CAP_SYS_PTRACE in a pod, a seccomp profile, Yama): its memory may still be
                # readable (/proc/PID/mem), without suspending it
                held = pyspy.REFUSED
                result = read(p, held, per_process)
            if result.timed_out and deadline - time.monotonic() > per_process:
                # a machine too busy for py-spy to finish in time (the job's own ranks on every core): the stack
                # from outside may be the only one, so it gets one more try, twice as long, within the budget
                retried.append(p.pid)
                result = read(p, held, 2 * per_process)
            if held is not None:
                still.setdefault(str(held), []).append(p.pid)
            done += 1
            self.progress(f"py-spy stacks: {done}/{len(procs)} process(es)")
            return result

        self.progress(f"py-spy stacks: 0/{len(procs)} process(es)")
        with ThreadPoolExecutor(max_workers=min(16, len(procs))) as pool:
            results = list(pool.map(one, procs))
        errors: dict[str, list[int]] = {}  # one sentence per distinct failure, with the pids it hit
        got: dict[int, Any] = {}
        for p, result in zip(procs, results):
            if result.threads is not None:
                got[p.pid] = result.threads
                if self.options.locals:
                    _redact_locals(result.threads)
                p.add(w, L.PYSPY, result.threads)
            else:
                errors.setdefault(result.error or "unknown error", []).append(p.pid)
        failed = sum(len(p) for p in errors.values())
        status = "ok" if not errors else ("failed" if failed == len(procs) else "partial")
        detail = f"{len(procs) - failed}/{len(procs)} process(es) with {exe} ({why})"
        if self.options.native:
            detail += ", --native"
        for held, pids in sorted(still.items()):
            detail += f"; pids {sorted(pids)} {held}: read without suspending them (--nonblocking, no native frames)"
        if retried:
            detail += f"; pids {sorted(retried)}: py-spy did not finish within {per_process:g} s, read once more"
        detail += "".join(f"; pids {pids}: {error}" for error, pids in errors.items())
        w.step("py-spy", status, t, detail)
        return got

    def native_where_ambiguous(self, procs: list[_Proc], taken: dict[int, Any], w: BundleWriter,
                               deadline: float) -> None:  # fmt: skip
        """A rank whose main thread ends in a C call that may be a collective wait (autograd's backward under
        DDP, a CUDA sync, no Python frame at all) — or in a user frame that explains nothing (on a GPU the host
        parks at `loss.item()` while an NCCL collective waits) — gets native frames too (`py-spy dump --native`,
        ~1 s, in parallel, within the budget): c10d's, gloo's or a CUDA sync's frames there say it waits, the
        engine's or a kernel's say it computes."""
        if self.options.native:
            return  # every stack already has them
        ambiguous = []
        for p in procs:
            main = stacks.main_thread(pyspy.threads(taken.get(p.pid)))
            at = where(main) if p.own and main is not None else None
            if at is not None and (at.kind == "ambiguous" or at.fallback) and p.unsuspendable is None:
                ambiguous.append(p)  # (a process that cannot be suspended gives no native frames)
        if not ambiguous or time.monotonic() >= deadline:
            return
        t = time.monotonic()
        exe, _ = pyspy.find()
        self.progress(f"native frames of {len(ambiguous)} rank(s) in an ambiguous C call")
        with ThreadPoolExecutor(max_workers=min(16, len(ambiguous))) as pool:
            results = list(pool.map(lambda p: pyspy.dump(p.pid, native=True, exe=exe, timeout=self._left(
                deadline, 3 * self.options.dump_timeout)), ambiguous))  # fmt: skip
        failed = []
        for p, result in zip(ambiguous, results):
            if result.threads is not None:
                w.add_json(p.path(L.PYSPY_NATIVE), result.threads)
            else:
                failed.append(f"rank {p.rank}: {result.error}")
        w.step(
            "native frames",
            "partial" if failed else "ok",
            t,
            f"rank(s) {[p.rank for p in ambiguous]} (their "
            "Python stack ends in a C call that may be a collective wait, or in a user frame that explains nothing)"
            + "".join("; " + f for f in failed),
        )

    def poll_checks(self, procs: list[_Proc], taken: dict[int, Any], w: BundleWriter,
                    deadline: float) -> dict[int, dict[str, Any]]:  # fmt: skip
        """A rank in a poll loop gets its frames' locals read (`py-spy dump --locals`, in parallel, within the
        budget) for what the loop checks (collect.polled): only the strings that name it are kept. pid -> record."""
        polling = [p for p in procs if p.polling]
        if not polling or time.monotonic() >= deadline:
            return {}
        t = time.monotonic()
        exe, _ = pyspy.find()
        self.progress(f"what the poll loop of {len(polling)} rank(s) checks")

        def one(p: _Proc) -> tuple[Optional[dict[str, Any]], Optional[str]]:
            if self.options.locals:  # the stacks taken have them already
                return polled.checks(p.pid, taken.get(p.pid)), None
            left = self._left(deadline, self.options.dump_timeout)
            result = pyspy.dump(p.pid, locals=True, exe=exe, timeout=left, nonblocking=p.unsuspendable is not None)
            return polled.checks(p.pid, result.threads), result.error

        with ThreadPoolExecutor(max_workers=min(16, len(polling))) as pool:
            results = list(pool.map(one, polling))
        got = {p.pid: r for p, (r, _) in zip(polling, results) if r is not None}
        failed = [f"rank {p.rank}: {error}" for p, (_, error) in zip(polling, results) if error]
        # a loop that holds nothing to name is no failure: only a dump that could not be taken is
        w.step("poll loops", "partial" if failed else "ok", t,
               f"rank(s) {[p.rank for p in polling]}: what the loop checks found for {len(got)}"
               + "".join("; " + f for f in failed))  # fmt: skip
        return got

    def proc_state(self, procs: list[_Proc], w: BundleWriter, polls: dict[int, dict[str, Any]]) -> None:
        t = time.monotonic()
        self.progress(f"/proc state of {len(procs)} process(es)")
        gone = []
        sockets = sockdiag.tcp_sockets() or {}  # the host's TCP sockets, read once: each process's with their queues
        for p in procs:
            snap = procfs.snapshot(p.pid)
            if snap.get("state") is None:
                gone.append(p.pid)
                continue
            snap["sockets"] = sockdiag.of_process(p.pid, sockets)
            waited, key = proctree.waited_processes(p.pid), "waits_for"  # what the kernel shows it waits on
            if not waited and p.workers_since is not None:  # a thread or a timer: what it may be waiting for
                waited, key = proctree.workers(p.pid, p.workers_since), "may_wait_for"
            if waited:
                snap[key] = [_waited(c, c in waited) for c in proctree.process_tree(waited)[:MAX_WAITED]]
            if p.pid in polls:
                snap["polls"] = polls[p.pid]
            p.add(w, L.PROC, snap)
        w.step("/proc", "ok" if not gone else "partial", t,
               f"{len(procs) - len(gone)}/{len(procs)} process(es)" + (f"; gone: {gone}" if gone else ""))  # fmt: skip

    def request_dumps(
        self, ranks: list[RankTarget], w: BundleWriter, deadline: float
    ) -> tuple[dict[int, str], dict[int, str]]:
        """Every live recorded rank's own dump, from those that can give it (collect.rank_dumps); where no rank
        runs the recorder, torch's own flight recorder. Returns why each rank that wrote none did not, and the dumps
        torch wrote where the job chose (rank -> path)."""
        t = time.monotonic()
        live = [r for r in ranks if r.alive and r.hb is not None]
        if self.table is None or not live:
            if not ranks:
                return {}, {}
            status, detail, dumps = rank_dumps.from_watchdogs(ranks, self.job.env, self.progress)
            w.step("rank dumps", status, t, detail)
            return {}, dumps
        wait = self._left(deadline, self.options.dump_timeout)
        asking = rank_dumps.Asking(self.table, live, self.job.env, self.options.job_ends, self.progress)
        status, detail = asking.run(wait)
        w.step("rank dumps", status, t, detail)
        return asking.unanswered(), {}

    def rank_files(self, ranks: list[RankTarget], w: BundleWriter, error_files: dict[int, str],
                   torch_dumps: dict[int, str]) -> None:  # fmt: skip
        """The recorder's files in the run dir, and the files the job chose (torchelastic's error file, torch's own
        flight-recorder dumps): only the job's own, read as its user."""
        t = time.monotonic()
        run = RunDir(self.job.run_dir, self.job.owner) if self.job.run_dir else None
        files = [(src, arc, True) for src, arc in _rank_files(run, [r.rank for r in ranks])] if run else []
        for rank, error_file in sorted(error_files.items()):
            if os.path.lexists(error_file):
                files.append((error_file, L.rank_member(rank, L.TORCHELASTIC_ERROR), False))
        files += [(dump, f"{L.FLIGHT_RECORDER_DIR}{P.FR_PREFIX}{rank}", False) for rank, dump in torch_dumps.items()]
        if not files:
            return
        self.progress(f"copying {len(files)} recorder file(s)")
        copied, failed = 0, []
        for src, arc, in_run in files:
            binary = src.endswith(".pickle") or L.is_flight_recorder_dump(arc)
            cap = BINARY_FILE_CAP if binary else RANK_FILE_CAP
            try:
                data = run.read(src, cap + 1) if in_run and run else read_file(src, self.job.owner, cap + 1)
                if binary:  # pickles: kept whole or not at all, not redacted, never unpickled by blackbox
                    w.add_bytes(arc, data, keep="whole", cap=cap)
                else:
                    w.add_bytes(arc, _redact_file(arc, data.decode("utf-8", "replace")).encode())
                copied += 1
            except OSError as exc:
                failed.append(f"{arc}: {exc.strerror}" + (" (not copied)" if isinstance(exc, UnsafeFile) else ""))
        w.step("rank files", "failed" if failed else "ok", t, "; ".join(failed) or f"{copied} file(s)")

    def node_facts(self, pool: ThreadPoolExecutor) -> dict[str, Future[Any]]:
        """Started first, in the background: the slow probes (git, dmesg, the job's packages, the GPUs)."""
        job = self.job
        out_dir = job.run_dir or job.cwd
        probes: dict[str, Callable[[], Any]] = {
            "system": host.system,
            "disk": lambda: host.disk_free(out_dir),
            "gpus": lambda: gpu.query_gpus(self.options.dump_timeout),
            "kernel": lambda: host.kernel_messages(self.options.dump_timeout),
            "git": lambda: (host.git_state(job.cwd, self.options.dump_timeout),
                            host.git_diffstat(job.cwd, self.options.dump_timeout)),
            "packages": lambda: host.interpreter_packages(job.python, job.env, 2 * self.options.dump_timeout)
            if job.python else (None, "the job's interpreter is unknown"),
            "ips": host.ip_addresses,
            "interfaces": host.interfaces,
            "resolves": lambda: host.resolve(job.node),  # in its thread: a resolver that hangs costs the budget only
        }  # fmt: skip
        slurm_job = slurm.job_id_of(job.env)
        if slurm_job is not None:  # the job's Slurm facts: id, partition, nodes, time limit, requeue count
            probes["slurm"] = lambda: slurm.show_job(slurm_job, self.options.dump_timeout, job.env)
        return {name: pool.submit(fn) for name, fn in probes.items()}

    def write_node(self, futures: dict[str, Future[Any]], w: BundleWriter, deadline: float) -> None:
        t = time.monotonic()
        self.progress("node facts: GPUs, kernel messages, git, packages")
        job = self.job
        got: dict[str, Any] = {}
        late: list[str] = []
        for name, fut in futures.items():
            try:
                got[name] = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # a probe that failed or ran out of budget: named, not fatal
                late.append(f"{name}: {'not done within the budget' if isinstance(exc, TimeoutError) else exc!r}")
        gpus, gpu_how = got.get("gpus", ([], "GPU probe not done"))
        kernel, kernel_how = got.get("kernel", (None, "kernel probe not done"))
        git, diffstat = got.get("git", (None, None))
        packages, packages_how = got.get("packages", (None, "package probe not done"))
        slurm_facts, slurm_how = got.get("slurm", (None, None))
        task = slurm.task_of(job.env)
        w.add_json(L.NODE, {
            "hostname": job.node, "ips": got.get("ips"), "interfaces": got.get("interfaces"),
            "hostname_resolves": got.get("resolves"), "collector_pid": os.getpid(), "cwd": job.cwd,
            "command": redact_argv(job.argv), "python": job.python, **(got.get("system") or {}),
            "run_dir_disk": got.get("disk"), "gpus": [g.to_json() for g in gpus], "gpu_source": gpu_how,
            "rank_gpus": {str(r): g for r, g in job.rank_gpus[0].items()}, "rank_gpus_method": job.rank_gpus[1],
            "kernel_messages_source": kernel_how,
            "git": None if git is None else {**git.__dict__, "describe": git.describe()},
            **({"slurm": {**(slurm_facts or {}), "source": slurm_how,
                          **({"step_id": task.step_id, "node_index": task.node_index, "node": task.node,
                              "tasks_on_node": task.tasks_here} if task else {})}}
               if slurm_how is not None else {}),
        })  # fmt: skip
        w.add_json(L.NODE_ENV, redact_env(job.env))
        if kernel:
            w.add_bytes(L.KERNEL_MESSAGES, redact_text("\n".join(kernel) + "\n").encode())
        if diffstat:
            w.add_bytes(L.GIT_DIFFSTAT, (diffstat + "\n").encode())
        if packages is not None:
            w.add_json(L.PACKAGES, packages)
        configs = config_files(job.argv, job.cwd)
        unreadable = []
        for path in configs:
            try:  # a path on the job's command line: only the job's user's own regular file, never through a link
                data = read_file(path, job.owner, CONFIG_FILE_CAP + 1)
            except OSError as exc:
                unreadable.append(f"{path}: {exc.strerror}")
                continue
            text = redact_config(data.decode("utf-8", "replace"))
            w.add_bytes(L.config_member(path), text.encode(), keep="head",
                        cap=CONFIG_FILE_CAP)  # fmt: skip
        notes = late + unreadable + ([] if kernel is not None else [kernel_how])
        detail = f"GPUs: {gpu_how}; {len(configs)} config file(s); packages {packages_how}"
        w.step("node", "partial" if late or unreadable else "ok", t, detail + "".join("; " + n for n in notes))

    def _page(self, rank: int) -> Optional[bytes]:
        """A rank's heartbeat page, read from the run directory (never with the rank's help): None without one."""
        if not self.job.run_dir:
            return None
        try:
            return RunDir(self.job.run_dir, self.job.owner).read(f"{P.RANKS_DIR}/{rank}/{P.RANK_HEARTBEAT}",
                                                                 P.HEARTBEAT_SIZE)  # fmt: skip
        except OSError:
            return None

    def _console_source(self) -> tuple[Optional[_Console], str]:
        """The job's output: blackbox's console.log, else the file the launcher's (or a rank's) stdout or
        stderr is redirected to (a Slurm output file, `> job.log`), when it is a regular file."""
        if self.console is not None:
            return self.console, P.CONSOLE_LOG
        run = RunDir(self.job.run_dir, self.job.owner) if self.job.run_dir else None
        if run is not None and run.size(P.CONSOLE_LOG) is not None:
            return FileTail(lambda limit: run.read(P.CONSOLE_LOG, limit, tail=True)), f"the run's {P.CONSOLE_LOG}"
        pids = ([self.job.agent_pid] if self.job.agent_pid else []) + [r.pid for r in self.job.ranks]
        for pid in pids:
            for fd in (2, 1):
                path = procfs.fd_target(pid, fd)
                if path is not None and path.startswith("/") and os.path.isfile(path):
                    link = f"/proc/{pid}/fd/{fd}"  # the open file itself, not the path (which may have changed)

                    def read(limit: int, link: str = link, owner: Optional[int] = self.job.owner) -> bytes:
                        return read_file(link, owner, limit, tail=True, proc_link=True)

                    return FileTail(read), f"`{path}` (fd {fd} of pid {pid})"
        return None, ""

    def _console_tail(self, console: _Console, ranks: list[RankTarget], deadline: float) -> bytes:
        """The job's output; under torchrun, once it holds torchrun's line for every rank that died ("failed
        (exitcode: 3) local_rank: 1 (pid: N)"), waiting at most EXIT_LINE_WAIT_S for it: a bundle taken the
        moment a rank dies comes before torchrun, which polls its workers, says how it ended (without that line
        a report reads a signal where an exit code is right)."""
        dead = {r.pid for r in ranks if not r.alive and r.exit_status != "exited with code 0"
                and (r.hb is None or r.hb.state != "exited")}  # fmt: skip
        waiting = bool(dead) and self.job.mode == "run" and torchelastic.is_launcher(self.job.argv)
        until = time.monotonic() + min(EXIT_LINE_WAIT_S, max(0.0, deadline - time.monotonic()))
        while True:
            tail = console.tail(CONSOLE_TAIL_BYTES)
            if not waiting or time.monotonic() >= until:
                return tail
            if dead <= set(torchelastic.failures_in_output(tail.decode("utf-8", "replace"))):
                return tail
            time.sleep(0.1)

    # --- the whole collection ----------------------------------------------------------------------
    def collect(
        self, trigger: Trigger, detection: Optional[Detection], events: Optional[EventLog], out_dir: str,
        out_name: Optional[str] = None,
    ) -> CollectResult:  # fmt: skip
        """Collect and write one bundle. Never raises for a process that went away."""
        opts = self.options
        start, started = time.monotonic(), time.time()  # the wall clock: flight-recorder entries are stamped on it
        deadline = start + opts.budget
        job = self.job
        w = BundleWriter(job.run_id, job.node, trigger)
        ranks = job.ranks
        # read while the ranks live: a rank that raised may be gone by the time its files are copied
        error_files = {r.rank: p for r in ranks if (p := _torchelastic_error_file(job.run_dir, r, job.owner))}
        procs = [_Proc(r.rank, r.pid, False, r.hb, procfs.unsuspendable(r.pid)) for r in ranks if r.alive]
        procs += [_Proc(r.rank, pid, True, None, procfs.unsuspendable(pid)) for r in ranks for pid in _helpers(r)]
        if job.agent_pid is not None and job.mode == "collect" and _is_python(job.agent_pid):
            procs.append(_Proc(None, job.agent_pid, False))
        node_pool = ThreadPoolExecutor(max_workers=7, thread_name_prefix="blackbox-node")
        unanswered: dict[int, str] = {}  # why a rank wrote no dump of its own
        torch_dumps: dict[int, str] = {}
        try:
            node = self.node_facts(node_pool)
            taken = self.pyspy_stacks(procs, w, deadline)  # first: from outside, before any signal changes a rank
            self.native_where_ambiguous(procs, taken, w, deadline)
            polls = self.poll_checks(procs, taken, w, deadline)
            self.proc_state(procs, w, polls)
            unanswered, torch_dumps = self.request_dumps(ranks, w, deadline)
            now = time.monotonic()
            t = now
            recorded = [r for r in ranks if r.hb is not None]
            for r in recorded:
                w.add_record(r.rank, L.HEARTBEAT, heartbeat_record(r, now, self._page(r.rank)))
            for rank, samples in job.history.items():
                w.add_record(rank, L.HISTORY, samples)
            if job.gpu_history:
                w.add_json(L.GPU_HISTORY, job.gpu_history)
            if job.coordination is not None:
                w.add_json(L.COORDINATION, job.coordination)
            if recorded:
                w.step("heartbeats", "ok", t, f"{len(recorded)} rank(s)")
            self.rank_files(ranks, w, error_files, torch_dumps)
            t = time.monotonic()
            console, where = self._console_source()
            if console is not None:
                tail = self._console_tail(console, ranks, deadline)
                w.add_bytes(L.CONSOLE_TAIL, redact_text(tail.decode("utf-8", "replace")).encode())
                w.step("console tail", "ok", t, f"last {len(tail)} bytes of {where}")
            if job.run_dir and os.path.lexists(os.path.join(job.run_dir, P.EVENTS_LOG)):
                t = time.monotonic()
                try:
                    data = RunDir(job.run_dir, job.owner).read(P.EVENTS_LOG, EVENTS_CAP, tail=True)
                    if len(data) == EVENTS_CAP:  # the newest events; the first, cut line is dropped
                        data = data[data.find(b"\n") + 1 :]
                    w.add_bytes(L.EVENTS, _redact_file(L.EVENTS, data.decode("utf-8", "replace")).encode())
                    w.step("events", "ok", t)
                except OSError as exc:
                    w.step("events", "failed", t, exc.strerror)
            self.write_node(node, w, deadline)
        finally:
            node_pool.shutdown(wait=False, cancel_futures=True)  # a probe past the budget is left behind
        if detection is not None:
            w.add_json(L.DETECTION, L.detection_record(detection))
        why = {str(rank): why for rank, why in sorted(unanswered.items())}
        elapsed = time.monotonic() - start
        extra = {
            "job": {**job.identity(), "command": redact_argv(job.argv), "notes": job.notes},
            "incident": job.incident,
            "multinode": None if job.coordination is None else {
                k: job.coordination.get(k) for k in ("job_id", "node", "node_rank", "nnodes", "status")},
            "detection": None if detection is None else {
                "rule": detection.rule, "ranks": list(detection.ranks), "reason": detection.reason,
            },
            "collection": {
                "started": round(started, 6), "duration_s": round(elapsed, 3), "budget_s": opts.budget,
                "over_budget": elapsed > opts.budget, "options": opts.__dict__, "unanswered": why,
                "evidence": evidence.of_writer(w, [r.rank for r in ranks], why),
            },
        }  # fmt: skip
        self.progress("writing the bundle")
        written = w.write(out_dir, extra, out_name)
        if events is not None:
            for s in w.steps:
                events.write("collection_step", **s.__dict__)
        return CollectResult(written, list(w.steps), round(elapsed, 3))


def _waited(pid: int, direct: bool) -> dict[str, object]:
    """A process a rank's main thread waits for (`direct`), or one below it: what it is (its command line,
    redacted) and what its main thread is blocked on — the leaf of the rank's wait."""
    st = procfs.proc_stat(pid)
    return {"pid": pid, "waited": direct, "argv": redact_argv(procfs.cmdline(pid))[:32],
            "state": st.state if st is not None else None, "main_thread": procfs.blocked(pid)}  # fmt: skip
