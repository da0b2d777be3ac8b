"""Evidence: one bundle asked of the collector for an incident, then handed on in memory (blackbox.intake) — the
verdict under its path, the alarms, the incident index and "seen before". A failure here is blackbox's: said once,
never the job's. Imports the stdlib and blackbox's host side."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from .._recorder import protocol as P
from ..adapters.pyspy import PTRACE_HINT, REFUSED
from ..alerts import Alerts
from ..analyze.model import Report
from ..bundle.writer import Written
from ..collect.collector import CollectOptions, Collector, disk_full
from ..collect.job import Job, RankTarget, job_python
from ..detections import Detection, Trigger
from ..render import printable
from .context import RunContext
from .process import JobProcess
from .uploads import Outcome, Uploads
from .watch import Watch

if TYPE_CHECKING:
    from ..intake import Intake


class SaidOnce:
    """The incidents said "seen before" after one bundle: an incident that the local index and shared storage both
    know is said once (by whichever answers first), known by its incident id, its bundle's URL or its run, node and
    time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._said: set[str] = set()

    def first(self, names: list[Any]) -> bool:
        """True when none of `names` was said yet; they are said now."""
        keys = {str(n) for n in names if n}
        with self._lock:
            if keys & self._said:
                return False
            self._said |= keys
            return True


def _where(entry: dict[str, Any], time_key: str) -> Optional[str]:
    parts = (entry.get("run_id"), entry.get("node"), entry.get(time_key))
    return "/".join(map(str, parts)) if all(parts) else None


class Evidence:
    def __init__(self, ctx: RunContext, process: JobProcess, watch: Watch) -> None:
        self.ctx = ctx
        self.process = process
        self.watch = watch
        self.alerts = Alerts(ctx.cfg.on_incident, ctx.cfg.notify_url, ctx.event, ctx.say_once)
        self._intakes: list[Intake] = []  # bundles taken in, whose index may still be written
        self.uploads = Uploads(ctx) if ctx.cfg.upload else None
        self.console: Optional[Any] = None  # the console tail to bundle, when not only ctx.console's (Slurm tasks)

    def write(self, trigger: Trigger, detection: Optional[Detection], job_ends: bool, incident: dict[str, object],
              coordination: Optional[dict[str, object]], budget: Optional[float] = None
              ) -> Optional[Written]:  # fmt: skip
        """Bundle this node's evidence; None when the collection failed (blackbox's own error, said once).
        `job_ends`: the job is about to be ended anyway, so the ranks may be signalled freely; otherwise the
        non-invasive ways go first (DESIGN.md §7). `budget`: seconds, when less than the collection budget."""
        ctx = self.ctx
        try:
            views = self.watch.read_views() if ctx.watching else []
            live = [v for v in views if v.alive]
            ctx.say(f"collecting evidence ({trigger.name}) from {len(live)} live rank(s) of {len(views)}")
            launched = self.process.launched
            job = Job(
                run_id=ctx.run_id,
                node=ctx.node,
                argv=ctx.argv,
                cwd=ctx.cwd,
                env=ctx.job_env(),
                python=job_python(live[0].hb.pid) if live else None,
                run_dir=ctx.run_dir,
                ranks=[
                    RankTarget(v.rank, v.hb.pid, v.hb.start_ticks, v.alive, v.hb, v.exit_status, v.hb.local_rank)
                    for v in views
                ],
                world_size=max((v.hb.world_size for v in views), default=0),
                agent_pid=launched.pid if launched else None,
                history={rank: list(samples) for rank, samples in self.watch.history.items()},
                gpu_history=self.watch.gpus.samples(),
                rank_gpus=self.watch.rank_gpus(views),
                incident=incident,
                coordination=coordination,
            )
            cfg = ctx.cfg
            seconds = cfg.collect_budget if budget is None else min(budget, cfg.collect_budget)
            options = CollectOptions(dump_timeout=min(cfg.dump_timeout, seconds), budget=seconds,
                                     native=cfg.pyspy_native, locals=cfg.pyspy_locals, job_ends=job_ends)  # fmt: skip
            collector = Collector(job, self.watch.table, self.console or ctx.console, options)
            out = os.path.join(ctx.run_dir, P.BUNDLES_DIR)
            written = collector.collect(trigger, detection, ctx.events, out).written
            self._say_unread(written.manifest)
            return written
        except Exception as exc:
            full = disk_full(exc, os.path.join(ctx.run_dir, P.BUNDLES_DIR))
            if full is None:
                ctx.internal_error("collect", exc)
            else:  # the machine's state, not blackbox's bug: said as such, once
                ctx.event("error", where="collect", error=repr(exc))
                ctx.say_once("collect:disk-full", f"{full}; the job goes on")
            return None
        finally:
            self.watch.io.rebase()  # the dump signal made the ranks write their stacks: not the job's own I/O

    def _say_unread(self, manifest: dict[str, Any]) -> None:
        """Once a run, where py-spy may not suspend the ranks (no CAP_SYS_PTRACE in a pod, a seccomp profile, Yama):
        it reads them without suspending them where their memory is readable, and their own dumps are bundled."""
        steps = manifest.get("steps")
        details = [str(s.get("detail")) for s in steps or [] if s.get("name") == "py-spy"]
        if any(PTRACE_HINT in d or REFUSED in d for d in details):
            self.ctx.say_once("collect:ptrace", "py-spy may not suspend the ranks here (ptrace refused): it reads "
                              "them without suspending them where it may (no native frames), and their own dumps (a "
                              "dump request, or faulthandler on the dump signal) are in the bundle too. "
                              f"{PTRACE_HINT}.")  # fmt: skip

    def take_in(self, written: Written, trigger: Trigger, alert: bool) -> Optional[Report]:
        """What follows a bundle, on the bundle in memory: the report's one-screen verdict under the bundle path, the
        alarms (`alert`: this node posted the incident, and raises it once for the whole job), then the index in
        the background (a file other nodes and jobs write too: never in the loop's way) and "seen before"."""
        from ..bundle.reader import Bundle
        from ..intake import Intake

        ctx, path = self.ctx, written.path
        once = SaidOnce()

        def said(report: Report) -> None:
            v = report.verdict
            stages = {str(r.rank): r.stage for r in report.ranks if r.rank in v.suspect_ranks}
            ctx.event("verdict", bundle=path, category=v.category, suspect_ranks=v.suspect_ranks, phase=v.phase,
                      confidence=v.confidence, summary=v.summary, stages=stages)  # fmt: skip
            for line in report.headline():
                ctx.say(f"  {printable(line)}")  # it quotes the job's exception: shown, never acted on
            if alert and self.uploads is None:
                self._alert(path, report, trigger)

        def seen(entries: list[dict[str, Any]]) -> None:
            try:
                from ..analyze.model import describe_seen

                for entry in entries[:1]:
                    if once.first([entry.get("incident_id"), entry.get("bundle_url"),
                                   _where(entry, "created")]):  # fmt: skip
                        ctx.say(f"  seen before: {describe_seen(entry)}")
                if entries:
                    ctx.event("seen_before", incidents=[e.get("id") for e in entries])
            except Exception as exc:
                ctx.internal_error("index", exc)

        try:
            taken = Intake(Bundle.of(written), lambda m: ctx.say_once("index", m), env=ctx.env, on_report=said,
                           on_seen=seen, background=True)  # fmt: skip
        except Exception as exc:
            ctx.internal_error("report", exc)
            if alert and self.uploads is None:
                self._alert(path, None, trigger)
            self._upload(written, None, None, trigger, alert, once)  # the alarms follow the upload
            return None
        self._intakes.append(taken)
        self._upload(written, taken, taken.report, trigger, alert, once)
        return taken.report

    def _upload(self, written: Written, taken: Optional[Intake], report: Optional[Report], trigger: Trigger,
                alert: bool, once: SaidOnce) -> None:  # fmt: skip
        """--upload: the bundle copied beside the job's ending; then the alarms (they carry its URL), its URL in
        the incident index, and the incidents seen before under the prefix."""
        if self.uploads is None:
            return
        from ..bundle.reader import Bundle
        from ..storage.remote import describe_remote

        ctx = self.ctx

        def done(outcome: Outcome) -> None:
            if alert:
                self._alert(written.path, report, trigger, outcome)
            if outcome.ok and outcome.url and taken is not None:
                taken.record_url(written.sha256, outcome.url, lambda m: ctx.say_once("index-url", m), ctx.env)
            for entry in outcome.seen[:1]:
                if once.first([entry.get("incident_id"), entry.get("bundle"),
                               _where(entry, "time")]):  # fmt: skip
                    ctx.say(f"  seen before (shared storage): {printable(describe_remote(entry))}")
            if outcome.seen:
                ctx.event("seen_before", shared=[e.get("record") for e in outcome.seen])

        try:
            self.uploads.submit(written, taken.bundle if taken is not None else Bundle.of(written), report, done)
        except Exception as exc:
            ctx.internal_error("upload", exc)

    def _alert(self, path: str, report: Optional[Report], trigger: Trigger, upload: Optional[Outcome] = None) -> None:
        try:
            self.alerts.incident(path, report, self.ctx.run_id, self.ctx.node, trigger.name,
                                 upload.url if upload else None,
                                 upload.error if upload and not upload.ok else None)  # fmt: skip
        except Exception as exc:
            self.ctx.internal_error("alerts", exc)

    def finish(self) -> None:
        """At the end of the run: the index a moment to finish, the uploads up to their timeout, the alarms a
        little longer (a slow command, webhook or storage is left behind rather than holding the job's exit)."""
        for taken in self._intakes:
            taken.join(5.0)
        if self.uploads is not None:
            self.uploads.join(time.monotonic() + self.ctx.cfg.upload_timeout + 5.0)
        self.alerts.join(10.0)
