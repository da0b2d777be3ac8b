"""The node-local collection `blackbox run` does on a trigger: heartbeats, the rank recorder's files, the
console tail and the events, redacted and bounded, into one bundle. Imports the stdlib and blackbox."""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Protocol

from ..adapters import host
from ..bundle.writer import BundleWriter
from ..events import EventLog
from ..heartbeat import HeartbeatState
from ..redact import redact_argv, redact_text
from ..supervisor.rules import Detection, RankView

CONSOLE_TAIL_BYTES = 256 * 1024
RANK_FILE_CAP = 1024 * 1024
RANK_FILES = ("recorder.log", "annotations.json", "metrics.json")


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


class LocalCollector:
    def __init__(self, run_dir: str, run_id: str, node: str, argv: list[str], console: _Console) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.node = node
        self.argv = argv
        self.console = console

    def collect(
        self, trigger: str, detection: Optional[Detection], views: list[RankView], events: Optional[EventLog]
    ) -> str:
        now = time.monotonic()
        w = BundleWriter(self.run_id, self.node, trigger)

        t = time.monotonic()
        for view in views:
            w.add_json(f"ranks/{view.rank}/heartbeat.json", heartbeat_record(view, now))
        w.step("heartbeats", "ok", t, f"{len(views)} rank(s)")

        t = time.monotonic()
        copied, failed = 0, []
        ranks_dir = os.path.join(self.run_dir, "ranks")
        for rank in sorted(os.listdir(ranks_dir)) if os.path.isdir(ranks_dir) else []:
            for name in RANK_FILES:
                path = os.path.join(ranks_dir, rank, name)
                if not os.path.exists(path):
                    continue
                try:
                    with open(path, "rb") as f:
                        data = f.read(RANK_FILE_CAP + 1)
                    w.add_bytes(f"ranks/{rank}/{name}", redact_text(data.decode("utf-8", "replace")).encode())
                    copied += 1
                except OSError as exc:
                    failed.append(f"{rank}/{name}: {exc.strerror}")
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
