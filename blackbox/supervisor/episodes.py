"""Deciding: what the rules and the console saw becomes an incident — or part of one already collected (a crash's
teardown, a stall's waiting ranks crossing their own timeout a moment later, blackbox's own ending of the job, the
user's Ctrl-C). This node's incidents are posted to the other nodes first; theirs are collected here at once.
Imports the stdlib and blackbox's host side."""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional

from .._recorder import protocol as P
from ..analyze.model import Report
from ..coord.client import Coordination
from ..coord.topology import Topology
from ..detections import CRASH_RULES, HANG_RULES, NOTE_RULES, Detection, Trigger, incident_kind
from ..errors import EXIT_ENDED_AFTER_TRAINING, EXIT_STALL_ENDED
from ..redact import redact_text
from .context import RunContext
from .evidence import Evidence
from .process import JobProcess
from .rules import FatalLines, RankView, Rules

CRASH_WINDOW_S = 60.0  # after a crash was collected, further deaths within this window are the same episode
OTHERS_EXTRA_S = 3.0  # past the dump timeout: how long a multi-node job's other nodes get to collect before it ends
CONFIRM_S = 2.0  # a stall's ranks are watched this long (two polls at least) once more before it counts
CONFIRMED = ("stall", "frozen")  # the hangs so confirmed (the busy rule's ranks move by definition)
PEER_ENDING_S = 300.0  # what fails here this soon after another node was preempted is its consequence (no alarm)
_WHAT = {"stall": "stall", "frozen": "frozen rank", "busy": "busy rank (no step)", "gpu_idle": "GPU idle"}


def _ending_option(rule: str) -> str:
    """The option that says whether a hang of this rule ends the job: the busy rule has its own."""
    return "on_busy" if rule == "busy" else "on_stall"


class Episodes:
    def __init__(self, ctx: RunContext, process: JobProcess, evidence: Evidence, topology: Optional[Topology]) -> None:
        self.ctx = ctx
        self.process = process
        self.evidence = evidence
        self.topology = topology  # this node's place in a multi-node job (None: one node)
        self.coord: Optional[Coordination] = None
        self.rules = Rules(ctx.cfg)
        self.ended_after_stall = False
        self.after_training = False  # the hang it ended the job for came after training (Report.after_training)
        self._fatal = FatalLines()
        self._console_hits: list[tuple[str, str]] = []  # appended by the output threads, taken by the loop
        self._console_kinds: set[str] = set()  # fatal-line kinds already acted on
        self._last_crash: Optional[tuple[float, str]] = None  # (when, bundle) of the last crash collection
        self._crash_pids: frozenset[int] = frozenset()  # the ranks' processes alive when it was collected
        self._live_pids: frozenset[int] = frozenset()  # the ranks' processes alive at the last poll
        self._incidents: dict[str, str] = {}  # incident id -> the bundle this node wrote for it
        self._local_incidents = 0
        self.on_stall_end: Optional[Callable[[], None]] = None  # told before the job is ended after a stall
        self._nodes_written: Optional[dict[str, object]] = None  # the last nodes.json written (write_nodes)
        self._peer_ended: Optional[dict[str, object]] = None  # the last preemption of another node told here
        self._peer_ended_at = 0.0  # when it was told (monotonic)

    # --- the rules ------------------------------------------------------------------------------------------
    def evaluate(self, views: list[RankView], now: float) -> None:
        remote = self.coord.remote_motion() if self.coord is not None else None
        self._live_pids = frozenset(v.hb.pid for v in views if v.alive)
        for detection in self.rules.evaluate(views, now, remote):
            self.act(detection)

    def act(self, d: Detection) -> None:
        ctx, process = self.ctx, self.process
        detected = time.monotonic()
        if d.rule in NOTE_RULES:  # a long pause while the job moves: a line and an event, nothing else
            if process.ending_since is None and not process.interrupted and not process.terminating:
                ctx.event(d.rule, ranks=list(d.ranks), reason=d.reason, findings=[f.__dict__ for f in d.findings])
                ctx.say(d.message())
            return
        if d.rule == "rank_death" and process.terminating:  # the teardown we asked for: a record, no alarm
            ctx.event(d.rule, ranks=list(d.ranks), expected=True)
            return
        if process.preempted:  # ended from outside (Slurm, the kubelet, a user): its ranks' deaths are that ending
            ctx.event(d.rule, ranks=list(d.ranks), reason=d.reason, expected=True, preempted=True)
            return
        if process.interrupted or (d.rule in ("exception", "rank_death") and self._interrupt_in(d)):
            process.say_interrupted()
            ctx.event(d.rule, ranks=list(d.ranks), reason=d.reason, expected=True, interrupted=True)
            return
        if process.ending_since is not None:  # blackbox is ending the job (its evidence is taken): what follows —
            # stalls, peers' "connection closed" exceptions, deaths — is that ending, not a new incident
            ctx.event(d.rule, ranks=list(d.ranks), reason=d.reason, expected=True)
            return
        if d.rule in CRASH_RULES and self._crash_collected_recently(d):
            return
        if d.rule in HANG_RULES and self._survivors_of_recent_crash(d):
            return
        if d.same_episode:  # a rank crossing its own timeout in a stall already collected: the same incident
            ctx.event("same_episode", rule=d.rule, ranks=list(d.ranks), bundle=ctx.bundles[-1] if ctx.bundles
                      else None)  # fmt: skip
            ctx.say_once(f"same-episode:{d.rule}", f"{d.message()} (the stall already collected: same incident)")
            return
        if d.rule in CONFIRMED and ctx.watching:
            moved = self._moved_since(detected)
            if moved is not None:
                self._not_a_stall(d, moved)
                return
        ctx.event(d.rule, ranks=list(d.ranks), reason=d.reason, findings=[f.__dict__ for f in d.findings])
        ctx.say(d.message())
        for f in d.findings:
            ctx.say(f"  {f.describe()}: idle {f.idle_s:.0f} s" + (f"; {f.doing}" if f.doing else "")
                    if d.rule != "rank_death" else f"  {f.describe()}: {f.exit_status or f.state}")  # fmt: skip
        hang = d.rule in HANG_RULES
        option = _ending_option(d.rule)
        ending = hang and getattr(ctx.cfg, option) == "kill"
        report = self.collect(Trigger(d.rule), d, job_ends=ending)
        if not hang:
            return
        flag = "--" + option.replace("_", "-")
        if ending:
            self.after_training = report is not None and report.after_training()
            self.end_after_stall(_WHAT.get(d.rule, d.rule), flag)
            return
        suspects = report.verdict.suspect_ranks if report is not None else list(d.ranks)
        pids = ", ".join(str(r.pid) for r in report.ranks if r.rank in suspects) if report else ", ".join(
            str(f.pid) for f in d.findings)  # fmt: skip
        ctx.say(f"leaving the job running ({flag} keep); inspect it with: py-spy dump --pid {pids}")

    def _moved_since(self, detected: float) -> Optional[str]:
        """Whether a rank moved within CONFIRM_S (two polls at least) after the hang was detected: a step, batch,
        forward call or stack change (its heartbeat), bytes, or the processes its main thread waits for. Watched
        before the evidence is collected: the collection's dump signal may wake what the job sleeps in (a C
        sleep() returns early), and that would be blackbox moving the job. What moved, in words; None when nothing
        did."""
        watch, poll = self.evidence.watch, self.ctx.cfg.poll_interval
        end = time.monotonic() + max(CONFIRM_S, 2 * poll)
        while True:
            time.sleep(poll)
            now = time.monotonic()
            for v in watch.read_views(now):
                if v.alive and (v.hb.last_motion > detected or v.io_at >= now):
                    return f"rank {v.rank} moved: {v.doing(now, now - detected)}"
            if now >= end or not self.process.running:
                return None

    def _not_a_stall(self, d: Detection, moved: str) -> None:
        """A rank moved right after the detection: closed as not a hang before anything is said, collected or
        posted. An event and one line; no bundle, no alarm, the job goes on."""
        self.rules.forget_hang()  # a hang later on is an incident of its own, ended as any other
        self.ctx.event("not_a_stall", rule=d.rule, ranks=list(d.ranks), reason=d.reason, moved=moved,
                       findings=[f.__dict__ for f in d.findings])  # fmt: skip
        idle = min((f.idle_s for f in d.findings), default=0.0)
        self.ctx.say(f"no progress for {idle:.0f} s, then {moved}: not a {_WHAT.get(d.rule, d.rule)}; the job goes "
                     "on (no evidence taken, no alarm)")  # fmt: skip

    def end_after_stall(self, what: str, flag: str = "--on-stall") -> None:
        self.ended_after_stall = True
        if self.on_stall_end is not None:
            self.on_stall_end()
        self._let_other_nodes_collect()
        code = EXIT_ENDED_AFTER_TRAINING if self.after_training else EXIT_STALL_ENDED
        self.process.end_job(
            f"{what}, {flag} kill; exit code will be {code}"
            + (" (training had finished: not to be run again)" if self.after_training else "")
        )

    def _let_other_nodes_collect(self) -> None:
        """Before this node ends its part of a multi-node job, the other nodes get the time to take their own
        evidence of the incident (they began as it was posted): ended at once, this node's ranks close their
        sockets under the others' collection, and a waiting rank of theirs raises "connection closed" — the bundle
        then holds that teardown, not the hang. Their collection waits at most the dump timeout for their ranks'
        answers; no node says when it is done, so this node waits that long, and a little more, once."""
        coord, nodes = self.coord, (self.topology.nnodes if self.topology is not None else 1)
        if coord is None or coord.status != "connected":
            return
        others = nodes - 1 - len(coord.silent)  # a silent node (its supervisor gone, its host cut off) takes nothing
        if others < 1:
            return
        wait = min(self.ctx.cfg.dump_timeout + OTHERS_EXTRA_S, self.ctx.cfg.collect_budget)
        self.ctx.event("await_other_nodes", seconds=wait, nodes=others)
        self.ctx.say(f"waiting {wait:g} s for the other {others} node(s) to take their evidence before ending the "
                     "job")  # fmt: skip
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self.process.running:
            time.sleep(0.1)

    def _interrupt_in(self, d: Detection) -> bool:
        """Whether the ranks of a detection ended by an interrupt (Ctrl-C at the terminal reaches every process
        of the job): their last exception is a KeyboardInterrupt, or they died of SIGINT."""
        if not d.ranks:
            return False
        for f in d.findings:
            if f.exit_status and "SIGINT" in f.exit_status:
                continue
            try:
                with open(self.ctx.rank_file(f.rank, P.RANK_EXCEPTIONS), "rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    fh.seek(max(0, fh.tell() - 65536))
                    last = fh.read().splitlines()[-1:]
                record = json.loads(last[0]) if last else {}
            except (OSError, ValueError):
                return False
            if not (isinstance(record, dict) and str(record.get("type", "")).endswith("KeyboardInterrupt")):
                return False
        return bool(d.findings)

    # --- the console ----------------------------------------------------------------------------------------
    def watch_console(self, data: bytes, stream: int) -> bool:
        """Runs in an output thread: note fatal lines; True when the loop should wake at once."""
        hits = self._fatal.feed(data, stream)
        if hits:
            self._console_hits.extend(hits)
        return bool(hits)

    def on_console(self, poll: Callable[[], None]) -> None:
        """Act on the fatal lines the output threads noted; `poll` reads the heartbeats now (the recorder marks a
        rank that raised before its traceback is printed)."""
        if not self._console_hits:
            return
        hits, self._console_hits[:] = list(self._console_hits), []
        for kind, line in hits:
            if kind in self._console_kinds:
                continue
            self._console_kinds.add(kind)
            self.ctx.event("fatal_line", kind=kind, line=redact_text(line))
            if kind == "exception":
                poll()
                continue
            if not self.ctx.watching or self.process.ending_since is not None:
                continue
            d = Detection("console", (), f"the job printed `{redact_text(line)[:200]}`", ())
            if self._crash_collected_recently(d):
                continue
            self.ctx.say(d.message())
            self.collect(Trigger("console", kind), d)

    # --- crash episodes -------------------------------------------------------------------------------------
    def recent_crash(self) -> Optional[tuple[float, str]]:
        """(seconds ago, bundle) of a crash collected within the episode window, else None."""
        if self._last_crash is None or time.monotonic() - self._last_crash[0] > CRASH_WINDOW_S:
            return None
        return time.monotonic() - self._last_crash[0], self._last_crash[1]

    def _crash_collected_recently(self, d: Detection) -> bool:
        """A crash was just collected: what follows (the launcher tearing the other ranks down, their errors) is
        the same episode. Record it; do not bundle it again."""
        recent = self.recent_crash()
        if recent is None:
            return False
        ago, bundle = recent
        self.ctx.event("same_episode", rule=d.rule, ranks=list(d.ranks), reason=d.reason, bundle=bundle)
        if d.rule != "console":
            self.ctx.say(f"{d.message()} (same episode: evidence collected {ago:.0f} s ago)")
        return True

    def _survivors_of_recent_crash(self, d: Detection) -> bool:
        """A hang on the processes that outlived a crash just collected: the launcher is tearing them down (slowly on
        a loaded machine), and their stillness is that crash's episode. Put off, not forgotten: the rules fire it
        again at a later poll, and once the window has passed with them still there it is an incident of its own (a
        crash that left the job hung). A restarted attempt's ranks (new processes) are never put off."""
        pids = {f.pid for f in d.findings}
        recent = self.recent_crash()
        if recent is None or not pids or not pids <= self._crash_pids:
            return False
        self.rules.put_off(d)
        ago, bundle = recent
        key = f"crash-survivors:{self._last_crash[0] if self._last_crash else 0}:{d.rule}"
        if self.ctx.first(key):
            self.ctx.event("same_episode", rule=d.rule, ranks=list(d.ranks), reason=d.reason, bundle=bundle,
                           survivors=True)  # fmt: skip
            self.ctx.say(f"{d.message()} (the ranks that outlived the crash collected {ago:.0f} s ago, not yet "
                         f"ended by the launcher: same episode; still so {CRASH_WINDOW_S:.0f} s after it, an "
                         "incident of its own)")  # fmt: skip
        return True

    # --- incidents ------------------------------------------------------------------------------------------
    def collect(self, trigger: Trigger, detection: Optional[Detection], job_ends: bool = False,
                incident: Optional[dict[str, object]] = None, budget: Optional[float] = None,
                written_then: Optional[Callable[[], None]] = None,
                preemption: Optional[str] = None) -> Optional[Report]:  # fmt: skip
        """Bundle this node's evidence for an incident. `incident`: another node's, which this node collects for;
        otherwise this node's trigger is posted to every node first. `budget`: the collection's seconds, when fewer
        than its own budget (a preemption's grace); `written_then`: called once the bundle is written (or could not
        be), before it is analysed. `preemption`: why this node is being ended from outside (a preStop hook, a SIGTERM):
        the other nodes only note it (every node being ended gets its own signal; one pod deleted is no incident of
        theirs, though what fails there next is its consequence), and, as any preempted job's, it raises no alarm."""
        ctx = self.ctx
        own = incident is None
        if incident is None:
            incident, own = self._incident(trigger, detection, preemption)
        iid = str(incident.get("id"))
        if iid in self._incidents:  # joined an incident this node has already collected for
            ctx.event("same_episode", rule=trigger.name, incident=iid, bundle=self._incidents[iid])
            return None
        coordination = self.coord.state() if self.coord is not None else None
        written = self.evidence.write(trigger, detection, job_ends, incident, coordination, budget)
        if written_then is not None:
            written_then()
        if incident.get("kind") == "crash":  # what follows within the window is this crash's episode
            self._last_crash = (time.monotonic(), written.path if written else "")
            self._crash_pids = self._live_pids
        if written is None:
            return None
        ctx.bundles.append(written.path)
        self._incidents[iid] = written.path
        ctx.event("bundle", path=written.path, trigger=trigger.name, incident=iid)
        ctx.say(f"evidence bundle: {written.path}")
        peer = self.peer_ended
        if own and peer is not None and not preemption:
            ctx.say(f"  this follows node {peer['node']}'s preemption: no alarm")
        quiet = preemption or self.process.preempted or peer is not None  # an ending's, or its consequence
        return self.evidence.take_in(written, trigger, alert=own and not quiet)

    def _incident(self, trigger: Trigger, detection: Optional[Detection], preemption: Optional[str] = None
                  ) -> tuple[dict[str, object], bool]:  # fmt: skip
        """This node's incident, told to every node: each collects its own evidence under the same id — but for a
        `preemption` (why this node is being ended from outside), which the others only note; alone, an id of this
        node's own. (incident, whether this node is the one that posted it)."""
        rule = detection.rule if detection is not None else trigger.rule
        body: dict[str, object] = {
            "trigger": trigger.name, "triggered_by": trigger.to_json(), "rule": rule,
            "kind": "preemption" if preemption else incident_kind(rule),
            "node": self.ctx.node, "node_rank": self.topology.node_rank if self.topology else None,
            "reason": detection.reason if detection is not None else preemption or trigger.name,
            "ranks": list(detection.ranks) if detection is not None else [],
        }  # fmt: skip
        if self.peer_ended is not None:
            body["after_peer_preemption"] = self.peer_ended
        if self.coord is not None:
            posted = self.coord.post(body)
            if posted is not None:
                return posted[0], posted[1]
        self._local_incidents += 1
        return {**body, "id": f"{self.ctx.run_id}-i{self._local_incidents}", "time": time.time()}, True

    # --- other nodes ----------------------------------------------------------------------------------------
    def start_coordination(self, wake: Callable[[], None]) -> None:
        if self.topology is None:
            return
        ctx = self.ctx
        coord = Coordination(self.topology, ctx.run_id, ctx.node, ctx.run_dir, ctx.cfg.poll_interval, ctx.event,
                             ctx.say_once, wake, secret_file=ctx.cfg.coord_secret_file)  # fmt: skip
        try:
            coord.start()
        except Exception as exc:
            ctx.internal_error("coordination", exc)
            return
        self.coord = coord

    def helper_pids(self) -> list[int]:
        """The coordination helper's pid: blackbox's own process, never the job's."""
        return [self.coord.pid] if self.coord is not None and self.coord.pid is not None else []

    def publish(self, views: list[RankView], now: float) -> None:
        if self.coord is not None:
            moved = max((v.moved_at for v in views if v.alive), default=None)  # this node's newest motion
            self.coord.publish({"host": self.ctx.node, "ranks": {str(v.rank): {
                "step": v.hb.step, "phase": v.hb.phase, "state": v.hb.state, "alive": v.alive,
                "quiet_s": round(max(0.0, now - v.hb.last_progress), 1)} for v in views},
                "moved_s": None if moved is None else round(max(0.0, now - moved), 1)})  # fmt: skip

    def write_nodes(self) -> None:
        """The job's nodes as the coordination knows them, for `blackbox status` here (it names the ranks another
        node holds, and the nodes not joined): rewritten when that changes."""
        if self.coord is None:
            return
        nodes = self.coord.nodes()
        if nodes == self._nodes_written:
            return
        path = os.path.join(self.ctx.run_dir, P.NODES_FILE)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(nodes, f)
        os.replace(path + ".tmp", path)
        self._nodes_written = nodes

    def on_coordination(self) -> None:
        if self.coord is None:
            return
        ctx = self.ctx
        self.write_nodes()
        for msg in self.coord.take():
            node = msg.get("node")
            if msg["ev"] == "silent":
                ctx.event("node_silent", node=node, silent_s=msg.get("silent_s"), last_summary=msg.get("summary"))
                ctx.say(f"the blackbox supervisor of node {node} has been silent for {msg.get('silent_s')} s "
                        "(killed, its host down, or the network to it cut): that node is no longer watched; this one "
                        "goes on")  # fmt: skip
            elif msg["ev"] == "back":
                ctx.event("node_back", node=node)
                ctx.say(f"the blackbox supervisor of node {node} is back")
            elif msg["ev"] == "incident":
                self._remote_incident(msg["incident"])

    def _remote_incident(self, incident: dict[str, object]) -> None:
        """Another node posted an incident: collect this node's side of it at once (its ranks may be the victims
        waiting on the suspect, or the suspect itself)."""
        ctx = self.ctx
        iid, origin = str(incident.get("id")), incident.get("origin")
        fields = {"incident": iid, "origin": origin, "trigger": incident.get("trigger"),
                  "reason": incident.get("reason")}  # fmt: skip
        if iid in self._incidents:
            return
        if incident.get("kind") == "preemption":
            self._peer_preempted(incident)
            return
        if not self.process.running or self.process.ending_since is not None or self.process.preempted:
            ctx.event("remote_incident", **fields, action="none: this node's job is ending")
            return
        recent = self.recent_crash()
        if incident.get("kind") == "crash" and recent is not None:
            ctx.event("same_episode", rule="remote", incident=iid, bundle=recent[1])
            return
        ctx.event("remote_incident", **fields, action="collect")
        ctx.say(f"node {origin} reports an incident ({incident.get('trigger')}: {str(incident.get('reason'))[:200]}); "
                f"collecting this node's evidence for incident {iid}")  # fmt: skip
        hang = incident.get("kind") == "hang"
        option = _ending_option(str(incident.get("rule")))
        ending = hang and getattr(ctx.cfg, option) == "kill"
        trigger = Trigger.from_json(incident.get("triggered_by"), incident.get("trigger")).joined()
        self.collect(trigger, None, job_ends=ending, incident=incident)
        if ending:
            what = _WHAT.get(str(incident.get("rule")), "hang")
            self.end_after_stall(f"node {origin}'s {what}", "--" + option.replace("_", "-"))

    @property
    def peer_ended(self) -> Optional[dict[str, object]]:
        """Another node's preemption, told within PEER_ENDING_S: what fails here meanwhile is its consequence."""
        return self._peer_ended if time.monotonic() - self._peer_ended_at < PEER_ENDING_S else None

    def _peer_preempted(self, incident: dict[str, object]) -> None:
        """Another node is being ended from outside (a pod deleted, drained): nothing to collect here for it, but what
        fails here in the next PEER_ENDING_S is its consequence — collected, without an alarm."""
        origin = incident.get("origin")
        why = str(incident.get("reason"))[:200]
        self._peer_ended = {"node": origin, "host": incident.get("node"), "why": why, "time": incident.get("time")}
        self._peer_ended_at = time.monotonic()
        self.ctx.event("peer_preempted", node=origin, host=incident.get("node"), why=why, incident=incident.get("id"))
        if self.process.terminating:  # this node is being ended too (the whole job is): nothing to add
            return
        self.ctx.say(f"node {origin} ({incident.get('node')}) is being ended from outside ({why}): a failure here "
                     f"within {PEER_ENDING_S / 60:.0f} minutes is its consequence (evidence kept, no "
                     "alarm)")  # fmt: skip

    def close(self) -> None:
        if self.coord is not None:
            self.coord.close()
