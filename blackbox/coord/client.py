"""The supervisor's side of multi-node coordination: starts the coordination helper (blackbox/coord/store_process.py),
passes it this node's summary and incidents, and hands the loop what the other nodes report. Never blocks the
supervisor for long: a post waits a few seconds at most, then the node goes on alone. Never prints: it speaks
through `event` and `say_once`. Imports the stdlib and blackbox's topology."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Mapping, Optional

from .topology import Topology

POST_WAIT_S = 3.0  # a post unanswered this long: the node collects under an incident id of its own
CONNECT_TIMEOUT_S = 60.0  # a client waits this long for the hosting node's store at each attempt
EPISODE_S = 60.0  # an incident posted this recently is joined rather than a second one posted
SECRET_ENV = "BLACKBOX_COORD_SECRET"  # the job's secret itself, the same on every node
REJECTED_EVERY_S = 60.0  # rejected posts: one event at the first, then one a minute with the count


def secret_source(given: str, env: Mapping[str, str]) -> tuple[str, bool]:
    """Where the job's secret is read from: the file the user named, else on Slurm a file in the job's submit
    directory (shared by its nodes) that node 0 creates; ("", False) when the secret is in the environment or none
    is to be had. The bool: whether this node may create the file (Slurm only; a named file is the user's)."""
    if env.get(SECRET_ENV):
        return "", False
    if given:
        return os.path.abspath(given), False
    job, shared = env.get("SLURM_JOB_ID"), env.get("SLURM_SUBMIT_DIR")
    if job and shared:
        return os.path.join(shared, ".blackbox", f"coord-secret-{job}"), True
    return "", False


class Coordination:
    def __init__(
        self, topo: Topology, run_id: str, hostname: str, run_dir: str, poll_interval: float,
        event: Callable[..., None], say_once: Callable[[str, str], None], wake: Callable[[], None],
        secret_file: str = "",
    ) -> None:  # fmt: skip
        self.topo = topo
        self.run_id = run_id
        self.hostname = hostname
        self.run_dir = run_dir
        self.poll_interval = poll_interval
        self.label = str(topo.node_rank) if topo.node_rank is not None else hostname
        self._event = event
        self._say_once = say_once
        self._wake = wake
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.status = "starting"  # starting | connected | waiting (lost, connecting again) | alone
        self.why_alone = ""
        self.job_id = ""
        self.joined = 0  # how many nodes have joined the coordination
        self.silent: dict[str, dict[str, Any]] = {}  # node -> what was known when it fell silent
        self.unanswered_since: Optional[float] = None  # wall time since which the store has not answered this node
        self.hosts: dict[str, Any] = {}  # node -> {"host", "ranks"}: where each node's ranks live
        self._lock = threading.Lock()
        self._inbox: list[dict[str, Any]] = []  # remote incidents, silences: taken by the supervisor's loop
        self._motion: Optional[tuple[float, str]] = None  # (when, on this clock, another node last moved; which)
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition(self._lock)
        self._ref = 0
        self._closing = False
        self.secret_file, self._create_secret = secret_source(secret_file, os.environ)
        self.signed = bool(self.secret_file or os.environ.get(SECRET_ENV))
        self._rejected = 0  # posts not believed since the last event about them
        self._rejected_said = 0.0

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        cfg = {
            "host": self.topo.host, "port": self.topo.port, "hosting": self.topo.hosting, "job_key": self.topo.job_key,
            "nnodes": self.topo.nnodes, "node": self.label, "hostname": self.hostname, "run_id": self.run_id,
            "poll_interval": self.poll_interval, "silent_after": max(10.0, 5 * self.poll_interval),
            "connect_timeout": CONNECT_TIMEOUT_S, "episode_s": EPISODE_S,
            "secret_file": self.secret_file, "secret_create": self._create_secret and self.topo.hosting,
        }  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["TORCH_CPP_LOG_LEVEL"] = "ERROR"
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(self.run_dir, "coordination.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "blackbox.coord.store_process", json.dumps(cfg)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True, cwd=self.run_dir,
            )  # fmt: skip
        self._event("coordination", status="starting", address=self.topo.address, hosting=self.topo.hosting,
                    node=self.label, nnodes=self.topo.nnodes, learned_from=self.topo.source,
                    helper_pid=self.proc.pid)  # fmt: skip
        if not self.signed:
            self._say_once("coordination-unauthenticated", (
                f"warning: the coordination store at {self.topo.address} is unauthenticated: anyone who reaches that "
                "port can post an incident (and so end the job); give every node the same secret in "
                f"{SECRET_ENV} or --coord-secret-file (docs/multinode.md)"))  # fmt: skip
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), name="blackbox-coord", daemon=True).start()

    # --- to the helper ------------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> bool:
        proc = self.proc
        if proc is None or proc.stdin is None or self.status == "alone":
            return False
        try:
            proc.stdin.write((json.dumps(message, default=str) + "\n").encode())
            proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def publish(self, summary: dict[str, Any]) -> None:
        if self.status == "connected":
            self._send({"op": "summary", "data": summary})

    def post(self, incident: dict[str, Any]) -> Optional[tuple[dict[str, Any], bool]]:
        """Post an incident to every node: (the incident as the store has it, whether this node posted it
        — False when it joined one another node had just posted). None: this node is not coordinated now."""
        if self.status != "connected" or self.unanswered_since is not None:
            return None
        with self._lock:
            self._ref += 1
            ref = self._ref
        if not self._send({"op": "post", "ref": ref, "incident": {**incident, "time": time.time()}}):
            return None
        deadline = time.monotonic() + POST_WAIT_S
        with self._answered:
            while ref not in self._answers:
                left = deadline - time.monotonic()
                if self.status == "alone":
                    return None
                if left <= 0:
                    self._event("coordination_error", error=f"no answer to an incident post within {POST_WAIT_S:g} s")
                    return None
                self._answered.wait(left)
            answer = self._answers.pop(ref)
        if answer.get("incident") is None:
            return None
        return answer["incident"], bool(answer.get("own"))

    def remote_motion(self) -> Optional[tuple[float, str]]:
        """When another node's ranks last moved (CLOCK_MONOTONIC of this process) and which node, as the hosting
        node last said: a node whose ranks all wait for a rank of another node that works is not stalled."""
        return self._motion if self.status == "connected" else None

    def _on_motion(self, nodes: Any) -> None:
        now = time.monotonic()
        for entry in nodes if isinstance(nodes, list) else []:
            if isinstance(entry, list) and len(entry) == 2 and str(entry[0]) != self.label:
                age = entry[1]
                if isinstance(age, (int, float)) and 0 <= age < 1e9:
                    self._motion = (now - float(age), str(entry[0]))
                return

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            taken, self._inbox = self._inbox, []
        return taken

    def close(self) -> None:
        self._closing = True
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()  # the helper ends on EOF; it also gets SIGTERM if this process dies
        try:
            proc.wait(2.0)
        except (subprocess.TimeoutExpired, ChildProcessError):
            with contextlib.suppress(OSError):
                proc.kill()
        except Exception:
            pass

    def state(self) -> dict[str, Any]:
        """What a bundle records about the coordination at the time of the collection."""
        return {
            "status": self.status, "why_alone": self.why_alone or None, "job_id": self.job_id or None,
            "address": self.topo.address, "hosting": self.topo.hosting, "node": self.label, "host": self.hostname,
            "node_rank": self.topo.node_rank, "nnodes": self.topo.nnodes, "joined": self.joined,
            "silent": dict(self.silent), "unanswered_since": self.unanswered_since, "rank_hosts": self.rank_hosts(),
        }  # fmt: skip

    def nodes(self) -> dict[str, Any]:
        """The job's nodes as the coordination knows them now, for `blackbox status` (the run dir's nodes.json):
        how many there are, how many joined, and which ranks live on each node that has said so."""
        hosts = {str(k): {"host": str(v.get("host")), "ranks": [r for r in v.get("ranks") or [] if isinstance(r, int)]}
                 for k, v in self.hosts.items() if isinstance(v, dict)}  # fmt: skip
        return {"status": self.status, "address": self.topo.address, "node": self.label, "nnodes": self.topo.nnodes,
                "joined": self.joined, "hosts": hosts}  # fmt: skip

    def rank_hosts(self) -> dict[str, str]:
        """rank -> the host it lives on, as every node's supervisor told the coordination."""
        out: dict[str, str] = {}
        for info in self.hosts.values():
            if isinstance(info, dict) and isinstance(info.get("ranks"), list):
                for rank in info["ranks"]:
                    out[str(rank)] = str(info.get("host"))
        return out

    # --- from the helper ------------------------------------------------------------------------------
    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            try:
                self._on(msg)
            except Exception as exc:  # a malformed message never takes the supervisor down
                self._event("coordination_error", error=repr(exc))
        if not self._closing and self.status != "alone":
            code = self.proc.poll() if self.proc is not None else None
            self._alone("helper", f"the coordination helper ended (exit code {code}; see coordination.log)")

    def _on_rejected(self, key: str, why: str) -> None:
        """A value in the store that the job's secret did not sign: never believed; said at the first and then once
        a minute with the count, so that whoever floods the port cannot fill the disk."""
        self._rejected += 1
        now = time.monotonic()
        if self._rejected_said and now - self._rejected_said < REJECTED_EVERY_S:
            return
        self._event("coordination_rejected", key=key, why=why, count=self._rejected)
        self._say_once("coordination-rejected", f"rejected a post to the coordination store ({why}, `{key}`): "
                       "someone outside this job wrote to its port; the job goes on")  # fmt: skip
        self._rejected, self._rejected_said = 0, now

    def _alone(self, reason: str, sentence: str) -> None:
        self.status, self.why_alone = "alone", sentence
        self._event("coordination", status="alone", reason=reason, message=sentence)
        self._say_once("coordination-alone", f"{sentence}; this node watches and collects on its own")
        with self._answered:
            self._answered.notify_all()

    def _on(self, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        where = f"the coordinator at {self.topo.address}"
        if ev == "motion":
            self._on_motion(msg.get("nodes"))
        elif ev == "connected":
            if self.status == "waiting" or self.unanswered_since is not None:  # again, after a cut or a lost store
                self._say_once("coordination-answered", f"{where} answers again")
            self.unanswered_since = None
            self.status, self.job_id = "connected", str(msg.get("job_id"))
            self._event("coordination", status="connected", job_id=self.job_id, hosting=msg.get("hosting"),
                        address=msg.get("address"), job_host=msg.get("job_host"))  # fmt: skip
            self._say_once("coordination-connected", f"{self.topo.node_label()} of {self.topo.nnodes}: "
                           f"{'serving' if self.topo.hosting else 'joined'} {where} (job {self.job_id})")  # fmt: skip
        elif ev == "failed":
            reason, detail = str(msg.get("reason")), str(msg.get("message"))
            sentences = {
                "port_taken": f"cannot serve the coordinator: port {self.topo.port} is already taken on this node "
                              "(choose another with --coord-port, the same on every node)",
                "serve": f"cannot serve the coordinator on port {self.topo.port}: {detail}",
                "unreachable": f"cannot reach {where} yet ({detail}); retrying in the background",
                "no_host": f"{where} answers but its node-0 supervisor has not registered this job",
                "lost": f"lost {where} ({detail})" + ("; trying again every 10 s, this node watches and collects on "
                                                    "its own meanwhile" if msg.get("retry") else ""),
                "no_torch": f"multi-node coordination needs torch in blackbox's own environment ({detail})",
                "secret": f"cannot read the job's coordination secret ({detail})",
            }  # fmt: skip
            sentence = sentences.get(reason, f"coordination failed: {detail}")
            if msg.get("retry"):
                if reason == "lost":  # nothing is posted or believed until it is connected again
                    self.status = "waiting"
                self._event("coordination", status="waiting", reason=reason, message=detail)
                self._say_once(f"coordination-{reason}", sentence)
            else:
                self._alone(reason, sentence)
        elif ev == "unanswered":
            quiet = float(msg.get("silent_s") or 0)
            self.unanswered_since = time.time() - quiet
            self._event("coordination", status="unanswered", address=self.topo.address, silent_s=quiet)
            self._say_once("coordination-unanswered", f"{where} has not answered for {quiet:g} s (its host is down, or "
                           "the network between this host and it is cut): this node watches and collects on its own "
                           "until it answers")  # fmt: skip
        elif ev == "answered":
            self.unanswered_since = None
            self._event("coordination", status="answered", address=self.topo.address)
            self._say_once("coordination-answered", f"{where} answers again")
        elif ev == "posted":
            with self._answered:
                self._answers[int(msg["ref"])] = msg
                self._answered.notify_all()
        elif ev in ("incident", "silent", "back"):
            if ev == "silent":
                quiet = float(msg.get("silent_s") or 0)
                self.silent[str(msg.get("node"))] = {"silent_s": quiet, "summary": msg.get("summary"),
                                                     "since": time.time() - quiet}  # fmt: skip
            elif ev == "back":
                self.silent.pop(str(msg.get("node")), None)
            with self._lock:
                self._inbox.append(msg)
            self._wake()
        elif ev == "rejected":
            self._on_rejected(str(msg.get("key")), str(msg.get("why")))
        elif ev == "peers":
            self.joined = int(msg.get("joined") or 0)
        elif ev == "hosts" and isinstance(msg.get("hosts"), dict):
            self.hosts = dict(msg["hosts"])
