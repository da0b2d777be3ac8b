"""The node-local collection `blackbox run` does on a trigger: ask every rank for its own dump, then bundle
heartbeats, the rank recorder's files, flight-recorder traces, the console tail and the events, redacted and
bounded. Imports the stdlib and blackbox."""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Protocol

from .._recorder import protocol as P
from ..adapters import host, procfs, pyspy
from ..bundle.writer import BundleWriter
from ..events import EventLog
from ..heartbeat import HeartbeatState
from ..redact import redact_argv, redact_text
from ..supervisor.rules import Detection, RankView

CONSOLE_TAIL_BYTES = 256 * 1024
RANK_FILE_CAP = 1024 * 1024
BINARY_FILE_CAP = 64 * 1024 * 1024  # memory snapshots and flight-recorder pickles
# What the rank recorder leaves in ranks/<rank>/ (its heartbeat is decoded separately).
RANK_PATTERNS = (
    "recorder.log", "recorder-events.jsonl", "annotations.json", "metrics.json", "threads.json", "loader.json",
    "rank.json", "exceptions.jsonl", "oom.jsonl", "fatal.txt", "sigterm.txt", "stacks-*.txt", "pydump-*.json",
    "fr_trace.json", "memory-snapshot-*.pickle", "error.json",
)  # fmt: skip


def _loader_workers(loader_json: str) -> list[int]:
    try:
        with open(loader_json) as f:
            pids = json.load(f).get("worker_pids", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [p for p in pids if isinstance(p, int) and p > 1]


def _torchelastic_error_file(rank_json: str) -> Optional[str]:
    try:
        with open(rank_json) as f:
            path = json.load(f).get("torchelastic_error_file")
    except (OSError, ValueError, AttributeError):
        return None
    return path if isinstance(path, str) and os.path.isfile(path) else None


def _evidence_files(run_dir: str) -> list[tuple[str, str]]:
    """(path on disk, path in the bundle) of every recorder file worth keeping; empty files are skipped."""
    out = []
    ranks_dir = os.path.join(run_dir, "ranks")
    for rank in sorted(os.listdir(ranks_dir)) if os.path.isdir(ranks_dir) else []:
        for pattern in RANK_PATTERNS:
            for path in sorted(glob.glob(os.path.join(ranks_dir, glob.escape(rank), pattern))):
                if os.path.isfile(path) and os.path.getsize(path) > 0:
                    out.append((path, f"ranks/{rank}/{os.path.basename(path)}"))
        error_file = _torchelastic_error_file(os.path.join(ranks_dir, rank, "rank.json"))
        if error_file:
            out.append((error_file, f"ranks/{rank}/torchelastic-error.json"))
    fr_dir = os.path.join(run_dir, "flight_recorder")
    for path in sorted(glob.glob(os.path.join(fr_dir, P.FR_PREFIX + "*"))):
        if os.path.isfile(path) and not path.endswith(".tmp"):
            out.append((path, f"flight_recorder/{os.path.basename(path)}"))
    return out


class _Console(Protocol):
    def tail(self, limit: int) -> bytes: ...


def heartbeat_record(view: RankView, now: float) -> dict[str, Any]:
    """A heartbeat as the bundle keeps it: the raw fields, wall-clock times and the ages that matter."""
    hb: HeartbeatState = view.hb
    record = hb.to_json()
    record.update(
        alive=view.alive,
        exit_status=view.exit_status,
        idle_s=round(now - hb.last_progress, 3),
        liveness_age_s=round(now - hb.liveness_time, 3),
        phase_age_s=round(now - hb.phase_start, 3),
        last_progress_wall=hb.wall(hb.last_progress),
        phase_start_wall=hb.wall(hb.phase_start),
    )
    return record


class _Table(Protocol):
    def request_dump(self, rank: int) -> int: ...

    def read(self) -> list[HeartbeatState]: ...


class LocalCollector:
    def __init__(
        self, run_dir: str, run_id: str, node: str, argv: list[str], console: _Console, table: _Table,
        dump_timeout: float,
    ) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.run_id = run_id
        self.node = node
        self.argv = argv
        self.console = console
        self.table = table
        self.dump_timeout = dump_timeout

    def request_dumps(self, views: list[RankView], job_ends: bool, w: BundleWriter) -> None:
        """Ask every live rank for its own dump. SIGUSR1 (faulthandler, from C: it works while a rank holds
        the GIL or is blocked in C) goes at once when the job is about to end anyway; otherwise only to the
        ranks that did not answer the quiet way, and only to a process that has a handler for it."""
        t = time.monotonic()
        live = [v for v in views if v.alive]
        asked: dict[int, int] = {}
        notes: list[str] = []
        for v in live:
            try:
                asked[v.rank] = self.table.request_dump(v.rank)
            except OSError as exc:
                notes.append(f"rank {v.rank}: dump request failed: {exc.strerror}")
        signalled: list[int] = []

        def signal_ranks(ranks: list[RankView]) -> None:
            for v in ranks:
                if not procfs.has_handler(v.hb.pid, signal.SIGUSR1):
                    notes.append(f"rank {v.rank}: no SIGUSR1 handler, not signalled (it would die of it)")
                elif procfs.signal_if_same(v.hb.pid, v.hb.start_ticks, signal.SIGUSR1):
                    signalled.append(v.rank)

        if job_ends:
            signal_ranks(live)
        deadline = t + self.dump_timeout
        quiet_deadline = t + min(2.0, self.dump_timeout / 2)
        pending = dict(asked)
        while pending and time.monotonic() < deadline:
            for hb in self.table.read():
                if hb.rank in pending and hb.dump_ack >= pending[hb.rank]:
                    del pending[hb.rank]
            if not job_ends and not signalled and time.monotonic() > quiet_deadline and pending:
                signal_ranks([v for v in live if v.rank in pending])
                if not signalled:
                    break  # nobody left to reach: do not wait out the rest
            time.sleep(0.05)
        if signalled:
            time.sleep(0.2)  # faulthandler writes from the signal handler: a fraction of a millisecond
        answered = sorted(set(asked) - set(pending))
        detail = (f"{len(answered)}/{len(live)} rank(s) wrote their dump; SIGUSR1 to rank(s) "
                  f"{signalled or 'none'}" + ("; " + "; ".join(notes) if notes else ""))  # fmt: skip
        if pending:
            detail += f"; no answer within {self.dump_timeout:g} s from rank(s) {sorted(pending)}"
        w.step("rank dumps", "ok" if not pending else "partial", t, detail)

    def pyspy_stacks(self, views: list[RankView], w: BundleWriter) -> None:
        """Stacks from outside, in parallel: every live rank and its DataLoader workers (from loader.json).
        Nothing is signalled; a missing py-spy or a refused ptrace is one sentence in the manifest."""
        t = time.monotonic()
        targets: list[tuple[str, int]] = []
        for v in views:
            if not v.alive:
                continue
            targets.append((f"ranks/{v.rank}/py-spy.json", v.hb.pid))
            for pid in _loader_workers(os.path.join(self.run_dir, "ranks", str(v.rank), "loader.json")):
                if procfs.is_alive(pid):
                    targets.append((f"ranks/{v.rank}/py-spy-worker-{pid}.json", pid))
        if not targets:
            return
        exe, why = pyspy.find()
        if exe is None:
            w.step("py-spy", "failed", t, why)
            return
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            results = list(pool.map(lambda tg: pyspy.dump(tg[1], timeout=self.dump_timeout, exe=exe), targets))
        errors: dict[str, list[int]] = {}  # one sentence per distinct failure, with the pids it hit
        for (arc, pid), result in zip(targets, results):
            if result.threads is not None:
                w.add_json(arc, result.threads)
            else:
                errors.setdefault(result.error or "unknown error", []).append(pid)
        failed = sum(len(p) for p in errors.values())
        status = "ok" if not errors else ("failed" if failed == len(targets) else "partial")
        detail = f"{len(targets) - failed}/{len(targets)} process(es) with {exe} ({why})"
        detail += "".join(f"; pids {pids}: {error}" for error, pids in errors.items())
        w.step("py-spy", status, t, detail)

    def collect(
        self, trigger: str, detection: Optional[Detection], views: list[RankView], events: Optional[EventLog],
        job_ends: bool = False,
    ) -> str:  # fmt: skip
        w = BundleWriter(self.run_id, self.node, trigger)
        self.pyspy_stacks(views, w)  # first: from outside, before any signal changes what a rank does
        self.request_dumps(views, job_ends, w)
        now = time.monotonic()
        t = time.monotonic()
        for view in views:
            w.add_json(f"ranks/{view.rank}/heartbeat.json", heartbeat_record(view, now))
        w.step("heartbeats", "ok", t, f"{len(views)} rank(s)")

        t = time.monotonic()
        copied, failed = 0, []
        for src, arc in _evidence_files(self.run_dir):
            binary = src.endswith(".pickle") or os.path.basename(src).startswith(P.FR_PREFIX)
            cap = BINARY_FILE_CAP if binary else RANK_FILE_CAP
            try:
                with open(src, "rb") as f:
                    data = f.read(cap + 1)
                if binary:  # pickles: kept whole or not at all, not redacted, never unpickled by blackbox
                    w.add_bytes(arc, data, keep="whole", cap=cap)
                else:
                    w.add_bytes(arc, redact_text(data.decode("utf-8", "replace")).encode())
                copied += 1
            except OSError as exc:
                failed.append(f"{arc}: {exc.strerror}")
        w.step("rank files", "failed" if failed else "ok", t, "; ".join(failed) or f"{copied} file(s)")

        t = time.monotonic()
        tail = self.console.tail(CONSOLE_TAIL_BYTES)
        w.add_bytes("console-tail.log", redact_text(tail.decode("utf-8", "replace")).encode())
        w.step("console tail", "ok", t, f"last {len(tail)} bytes")

        t = time.monotonic()
        try:
            with open(os.path.join(self.run_dir, "events.jsonl"), "rb") as f:
                w.add_bytes("events.jsonl", f.read())
            w.step("events", "ok", t)
        except OSError as exc:
            w.step("events", "failed", t, exc.strerror)

        w.add_json(
            "node.json",
            {"hostname": self.node, "ips": host.ip_addresses(), "cwd": os.getcwd(), "pid": os.getpid()},
        )
        if detection is not None:
            w.add_json("detection.json", {
                "rule": detection.rule, "ranks": list(detection.ranks), "suspects": list(detection.suspects),
                "reason": detection.reason, "message": detection.message(),
                "findings": [f.__dict__ for f in detection.findings],
            })  # fmt: skip
        world = max((v.hb.world_size for v in views), default=0)
        extra = {
            "job": {"run_id": self.run_id, "node": self.node, "world_size": world,
                    "command": redact_argv(self.argv)},
            "detection": None if detection is None else {
                "rule": detection.rule, "ranks": list(detection.ranks), "suspects": list(detection.suspects),
                "reason": detection.reason,
            },
        }  # fmt: skip
        path = w.write(os.path.join(self.run_dir, "bundles"), extra)
        if events is not None:
            for s in w.steps:
                events.write("collection_step", **s.__dict__)
        return path
