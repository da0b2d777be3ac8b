"""The coordination helper: a small process beside each node's supervisor that serves (node 0) or joins the
job's `torch.distributed.TCPStore`, publishes this node's summary and liveness, posts incidents and relays
the other nodes' incidents and silences. It speaks JSON lines: commands on stdin, events on stdout; its
stderr (torch's own log lines) goes to the run dir. It runs in its own process so that torch's import, its
memory and any crash in it stay away from the supervisor, which is the parent of the user's job.
Imports the stdlib and torch.distributed (the store); nothing of blackbox, so that it starts fast and alone."""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import queue
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Optional

# The store's keys, under blackbox/<job key>/:
#   job                 {"job_id", "nnodes", "host"} set by the hosting node
#   roster, roster/<k>  join counter and the k-th node to join
#   beat/<node>         a counter each node bumps every poll (liveness without comparing clocks), then how many
#                       seconds ago its ranks last moved in any way (a step, a forward call, I/O, ...)
#   summary/<node>      the node's last summary (ranks' step, phase, liveness age)
#   motion              the hosting node's word on where the job moves: [[node, seconds since it moved]], the two
#                       freshest nodes (so that a node whose ranks all wait for another node's knows it still works);
#                       one read a node a poll
#   incident/<n>        the n-th incident; compare_set makes the first poster of a number win
#   silent              the hosting node's verdict on the others: {node: {"silent_s", "summary"}}
#   hosts/<node>        the node's host name and its ranks, set once its ranks are known: every node reads every
#                       other's once, so a report names the host a rank on another node lives on
# A node costs the store four operations a poll; only the hosting node reads every node's liveness (one
# multi_get), so a job of hundreds of nodes stays cheap.
# With the job's secret (every node's blackbox has it, nobody else does), what steers the other nodes — `incident/<n>`,
# `silent`, `motion`, and what they believe of each other: `beat/<node>`, `summary/<node>`, `hosts/<node>` — is stored
# signed: {"body": <the JSON text>, "mac": HMAC-SHA256(secret, key + "\n" + body)}.
# The key is in the MAC, so a signed value cannot be moved to another key (an old incident replayed as a new one).
# A value that is unsigned or wrongly signed is not believed: one `rejected` event, and the node goes on.
OP_TIMEOUT_S = 5.0
RECONNECT_S = 10.0
SECRET_ENV = "BLACKBOX_COORD_SECRET"  # the secret itself (never on a command line: /proc/PID/cmdline is public)
SECRET_WAIT_S = 60.0  # a node waits this long for the first node to create the job's secret file
SIGNED = ("incident/", "silent", "motion")


_EMITTING = threading.Lock()  # the loop and the answer watch both speak


def emit(event: str, **fields: Any) -> None:
    with _EMITTING:
        sys.stdout.write(json.dumps({"ev": event, **fields}) + "\n")
        sys.stdout.flush()


class StoreProcess:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.me = str(cfg["node"])  # the node's label in the store: its node rank, else its host name
        self.poll = float(cfg["poll_interval"])
        self.silent_after = float(cfg["silent_after"])
        self.commands: queue.Queue[Optional[dict[str, Any]]] = queue.Queue()
        self.store: Any = None
        self.job_id = ""
        self.next_incident = 1
        self.latest: Optional[dict[str, Any]] = None  # the last incident posted by any node
        self.summary: dict[str, Any] = {}
        self.beat = 0
        self.roster: list[str] = []
        self.peers: dict[str, dict[str, Any]] = {}  # hosting node only: node -> {"beat", "changed"}
        self.silent: dict[str, Any] = {}  # the last `silent` read from the store
        self.joined = 0  # the nodes that have joined, as last said (`peers`)
        self.hosts_set = False  # this node's hosts/<node> written
        self.hosts: dict[str, Any] = {}  # node -> {"host", "ranks"}, as read from the store
        self.host_roster: list[str] = []  # the roster as read for the hosts
        self.secret: Optional[bytes] = None  # the job's secret; None: the store is unauthenticated
        self.ticking: Optional[float] = None  # when the tick under way began (monotonic); None between ticks
        self.unanswered = False  # `unanswered` said, `answered` not yet
        self.joined = False  # this node is on the store's roster
        self._answer = threading.Lock()

    # --- signing ---------------------------------------------------------------------------------
    def seal(self, key: str, body: str) -> str:
        """The value to store under `key`: the body itself, or signed when the job has a secret."""
        if self.secret is None:
            return body
        return json.dumps({"body": body, "mac": mac(self.secret, key, body)})

    def unseal(self, key: str, raw: bytes) -> Optional[str]:
        """The body of a value read from `key`, or None (and one `rejected` event) when it is not the job's."""
        text = raw.decode(errors="replace")
        if self.secret is None:
            return text
        sealed = _loads(raw)
        body = sealed.get("body") if isinstance(sealed, dict) else None
        given = sealed.get("mac") if isinstance(sealed, dict) else None
        if isinstance(body, str) and isinstance(given, str) and hmac.compare_digest(given, mac(self.secret, key, body)):
            return body
        emit("rejected", key=key, why="wrongly signed" if isinstance(given, str) else "unsigned")
        return None

    # --- the store --------------------------------------------------------------------------------
    def connect(self) -> bool:
        from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

        cfg = self.cfg
        timeout = timedelta(seconds=OP_TIMEOUT_S)
        if cfg["hosting"]:
            try:
                base = TCPStore(cfg["host"], cfg["port"], is_master=True, wait_for_workers=False, timeout=timeout)
            except Exception as exc:
                taken = "EADDRINUSE" in str(exc) or "address already in use" in str(exc)
                emit("failed", reason="port_taken" if taken else "serve", message=_first_line(exc),
                     retry=False)  # fmt: skip
                return False
        else:
            try:
                base = TCPStore(cfg["host"], cfg["port"], is_master=False,
                                timeout=timedelta(seconds=float(cfg["connect_timeout"])))  # fmt: skip
            except Exception as exc:
                emit("failed", reason="unreachable", message=_first_line(exc), retry=True)
                return False
        store = PrefixStore(f"blackbox/{cfg['job_key']}/", base)
        if cfg["hosting"]:
            store.set("motion", self.seal("motion", "[]"))  # before `job`: a node that finds the job finds this key too
            store.set("job", json.dumps({"job_id": cfg["run_id"], "nnodes": cfg["nnodes"], "host": cfg["hostname"]}))
        try:
            store.set_timeout(timedelta(seconds=float(cfg["connect_timeout"])))
            job = json.loads(store.get("job"))  # the hosting node's supervisor may start later than this one
            store.set_timeout(timeout)
        except Exception as exc:
            emit("failed", reason="no_host", message=_first_line(exc), retry=True)
            return False
        self.store, self.job_id = store, str(job["job_id"])
        store.set(f"beat/{self.me}", self.seal(f"beat/{self.me}", "0"))  # before joining the roster: the watcher
        # reads every member's beat
        if not self.joined:  # once: a node that connects again after losing the store is the same node
            k = store.add("roster", 1)
            store.set(f"roster/{k}", self.me)
            self.joined = True
        while store.check([f"incident/{self.next_incident}"]):  # incidents before this node joined are not ours
            self.next_incident += 1
        emit("connected", job_id=self.job_id, nnodes=job.get("nnodes"), hosting=bool(cfg["hosting"]),
             address=f"{cfg['host']}:{cfg['port']}", job_host=job.get("host"))  # fmt: skip
        return True

    def same_episode(self, incident: dict[str, Any], other: Optional[dict[str, Any]]) -> bool:
        """Two nodes seeing one failure (every rank of a hung collective stalls at once; a crash on one node
        breaks the others): one incident. A collection asked for by hand is always its own."""
        return (
            other is not None
            and incident.get("kind") != "manual"
            and other.get("kind") == incident.get("kind")
            and time.time() - float(other.get("time", 0)) < float(self.cfg["episode_s"])
        )

    def post(self, ref: int, incident: dict[str, Any]) -> None:
        """Post an incident; or join the one another node posted just before, for the same failure."""
        store = self.store
        if self.same_episode(incident, self.latest):
            emit("posted", ref=ref, incident=self.latest, own=False)
            return
        while True:
            n = self.next_incident
            incident = {**incident, "id": f"{self.job_id}-i{n}", "n": n, "origin": self.me}
            mine = self.seal(f"incident/{n}", json.dumps(incident, sort_keys=True))
            won = store.compare_set(f"incident/{n}", "", mine).decode()
            self.next_incident = n + 1
            if won == mine:
                self.latest = incident
                emit("posted", ref=ref, incident=incident, own=True)
                return
            body = self.unseal(f"incident/{n}", won.encode())
            other = _loads(body.encode()) if body is not None else None
            if not isinstance(other, dict):  # a forged post took this number: post under the next
                continue
            self.latest = other
            if self.same_episode(incident, other):
                emit("posted", ref=ref, incident=other, own=False)
                return
            emit("incident", incident=other)  # another node's, not read yet: pass it on, then post after it

    def tick(self) -> None:
        store = self.store
        self.beat += 1
        summary = json.dumps({**self.summary, "time": time.time()})
        store.set(f"summary/{self.me}", self.seal(f"summary/{self.me}", summary))
        moved = self.summary.get("moved_s")
        beat = f"{self.beat} {moved:.1f}" if isinstance(moved, (int, float)) else str(self.beat)
        store.set(f"beat/{self.me}", self.seal(f"beat/{self.me}", beat))
        motion = self.read("motion")  # where the job last moved, as the hosting node last said
        if isinstance(motion, list) and motion:
            emit("motion", nodes=motion)
        while store.check([f"incident/{self.next_incident}"]):
            incident = self.read(f"incident/{self.next_incident}")
            self.next_incident += 1
            if not isinstance(incident, dict):
                continue
            self.latest = incident
            if incident.get("origin") != self.me:
                emit("incident", incident=incident)
        if self.cfg["hosting"]:
            self.watch()
        self.learn_hosts()
        silent = self.read("silent") if store.check(["silent"]) else {}
        silent = {k: v for k, v in silent.items() if k != self.me} if isinstance(silent, dict) else {}
        for node in silent.keys() - self.silent.keys():
            emit("silent", node=node, **silent[node])
        for node in self.silent.keys() - silent.keys():
            emit("back", node=node)
        nnodes = self.cfg.get("nnodes")
        counting = self.joined < nnodes if isinstance(nnodes, int) else self.beat == 1  # until every node has joined
        joined = int(store.add("roster", 0)) if counting or silent != self.silent else self.joined
        if silent != self.silent or joined != self.joined or self.beat == 1:
            self.silent, self.joined = silent, joined
            emit("peers", joined=joined)

    def read(self, key: str) -> Any:
        """A steering key's value as JSON, None when it is not the job's (or not JSON)."""
        body = self.unseal(key, self.store.get(key))
        return _loads(body.encode()) if body is not None else None

    def learn_hosts(self) -> None:
        """Publish which host this node's ranks live on, once they are known; read the other nodes' until every
        node of the job has said it (a key read once per node: cheap on hundreds of nodes)."""
        store = self.store
        ranks = self.summary.get("ranks")
        if not self.hosts_set and isinstance(ranks, dict) and ranks:
            mine = {"host": self.cfg["hostname"], "ranks": sorted(int(r) for r in ranks if str(r).isdigit())}
            store.set(f"hosts/{self.me}", self.seal(f"hosts/{self.me}", json.dumps(mine)))
            self.hosts_set = True
        nnodes = self.cfg.get("nnodes")
        if isinstance(nnodes, int) and len(self.hosts) >= nnodes:
            return
        joined = int(store.add("roster", 0))
        keys = [f"roster/{k}" for k in range(len(self.host_roster) + 1, joined + 1)]
        if keys and all(store.check([k]) for k in keys):
            self.host_roster += [n.decode() for n in _multi_get(store, keys)]
        waiting = [n for n in self.host_roster if n not in self.hosts and store.check([f"hosts/{n}"])]
        if not waiting:
            return
        for name, raw in zip(waiting, _multi_get(store, [f"hosts/{n}" for n in waiting])):
            body = self.unseal(f"hosts/{name}", raw)
            value = _loads(body.encode()) if body is not None else None
            if isinstance(value, dict):
                self.hosts[name] = value
        emit("hosts", hosts=self.hosts)

    def watch(self) -> None:
        """The hosting node: whose beat has stopped? Written to `silent` for every node to read."""
        store = self.store
        joined = int(store.add("roster", 0))
        if joined != len(self.roster):
            keys = [f"roster/{k}" for k in range(len(self.roster) + 1, joined + 1)]
            if all(store.check([k]) for k in keys):  # a node between its roster number and its name: next poll
                self.roster += [n.decode() for n in _multi_get(store, keys)]
        names = [n for n in self.roster if n != self.me]
        if not names:
            return
        now = time.monotonic()
        verdict: dict[str, Any] = {}
        moved = self.summary.get("moved_s")
        motion = [(now - moved, self.me)] if isinstance(moved, (int, float)) else []
        for name, raw in zip(names, _multi_get(store, [f"beat/{n}" for n in names])):
            peer = self.peers.setdefault(name, {"beat": None, "changed": now, "moved": None})  # moved: its motion
            beat = self.unseal(f"beat/{name}", raw)  # a forged beat keeps no node alive
            if beat is not None and beat != peer["beat"]:
                peer.update(beat=beat, changed=now, moved=_moved_at(beat, now))
            if peer["moved"] is not None:
                motion.append((peer["moved"], name))
            quiet = now - peer["changed"]
            if quiet > self.silent_after:
                before = self.silent.get(name)
                summary = before.get("summary") if isinstance(before, dict) else self.read(f"summary/{name}")
                verdict[name] = {"silent_s": round(quiet, 1), "summary": summary}
        if verdict.keys() != self.silent.keys():
            store.set("silent", self.seal("silent", json.dumps(verdict)))
        nodes = [[name, round(now - at, 1)] for at, name in sorted(motion, reverse=True)[:2]]
        store.set("motion", self.seal("motion", json.dumps(nodes)))

    # --- the loop --------------------------------------------------------------------------------
    def read_commands(self) -> None:
        for line in sys.stdin:
            try:
                self.commands.put(json.loads(line))
            except ValueError:
                continue
        self.commands.put(None)  # the supervisor is gone

    def run(self) -> int:
        threading.Thread(target=self.read_commands, daemon=True).start()
        try:
            self.secret = job_secret(self.cfg, os.environ)
        except OSError as exc:
            emit("failed", reason="secret", message=f"{exc.strerror or exc}: `{self.cfg.get('secret_file')}`",
                 retry=False)  # fmt: skip
            self.serve_commands(None)
            return 0
        while not self.connect():
            if self.cfg["hosting"]:  # a store that cannot be served stays unserved: this node goes alone
                self.serve_commands(None)
                return 0
            if self.serve_commands(time.monotonic() + RECONNECT_S):
                return 0
        threading.Thread(target=self.watch_answers, daemon=True).start()
        while True:
            try:
                self.ticking = time.monotonic()
                self.tick()
                self.answered()
                if self.serve_commands(time.monotonic() + self.poll):
                    return 0
            except Exception as exc:  # the store is gone or broken: node 0's own goes local for good; another
                # node's may come back (its supervisor restarted, or the network after a cut): joined again
                hosting = bool(self.cfg["hosting"])
                emit("failed", reason="lost", message=_first_line(exc), retry=not hosting)
                with self._answer:
                    self.ticking, self.unanswered = None, False
                self.store = None
                if hosting:
                    self.serve_commands(None)
                    return 0
                while not self.connect():
                    if self.serve_commands(time.monotonic() + RECONNECT_S):
                        return 0

    def watch_answers(self) -> None:
        """A store whose host went down or whose network was cut blocks a call for good: TCPStore's timeout does
        not cover a connection whose peer went silent (measured, torch 2.13: `check` still blocked after 90 s with
        a 5 s timeout). Say so once the tick under way is older than a silent node would be; `answered` when the
        store answers again (TCP delivers once the network is back)."""
        while True:
            time.sleep(1.0)
            since = self.ticking
            if since is None:
                continue
            quiet = time.monotonic() - since
            with self._answer:
                if quiet > self.silent_after and not self.unanswered and self.ticking == since:
                    self.unanswered = True
                    emit("unanswered", silent_s=round(quiet, 1))

    def answered(self) -> None:
        with self._answer:
            self.ticking = None
            if self.unanswered:
                self.unanswered = False
                emit("answered")

    def serve_commands(self, deadline: Optional[float]) -> bool:
        """Take the supervisor's commands until `deadline` (None: until it has gone); True when it has gone.
        Without a store a post is answered at once, with no incident: the supervisor then goes alone."""
        while deadline is None or time.monotonic() < deadline:
            try:
                cmd = self.commands.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if cmd is None:
                return True
            if cmd.get("op") == "summary":
                self.summary = cmd.get("data") or {}
            elif cmd.get("op") == "post" and self.store is None:
                emit("posted", ref=cmd["ref"], incident=None, own=True)
            elif cmd.get("op") == "post":
                self.post(int(cmd["ref"]), cmd["incident"])
        return False


def mac(secret: bytes, key: str, body: str) -> str:
    return hmac.new(secret, f"{key}\n{body}".encode(), hashlib.sha256).hexdigest()


def job_secret(cfg: dict[str, Any], env: Any) -> Optional[bytes]:
    """The job's secret: BLACKBOX_COORD_SECRET, else the file named in `secret_file` — created (0600, at once and
    whole) by the node that `secret_create` names, waited for by the others. None: no secret was given."""
    if env.get(SECRET_ENV):
        return str(env[SECRET_ENV]).encode()
    path = cfg.get("secret_file")
    if not path:
        return None
    if cfg.get("secret_create"):
        _create_secret(path)
    deadline = time.monotonic() + float(cfg.get("secret_wait_s", SECRET_WAIT_S))
    while True:
        try:
            with open(path, "rb") as f:
                secret = f.read().strip()
            if secret:
                return secret
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise OSError(f"the secret file is empty after {SECRET_WAIT_S:g} s")
        time.sleep(0.2)


def _create_secret(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(32).hex().encode())
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # the first node's file wins, whole; a file already there is kept
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _moved_at(beat: str, now: float) -> Optional[float]:
    """When (on this clock) a node's ranks last moved, from its beat (`<counter> <seconds ago>`), else None."""
    parts = beat.split()
    try:
        return now - float(parts[1]) if len(parts) == 2 else None
    except ValueError:
        return None


def _multi_get(store: Any, keys: list[str]) -> list[bytes]:
    """All keys in one round trip where the store can (torch >= 2.3), else one by one."""
    if hasattr(store, "multi_get"):
        return list(store.multi_get(keys))
    return [store.get(k) for k in keys]


def _first_line(exc: BaseException) -> str:
    """What went wrong, in one line, without the store's keys (torch names them: they hold the job's key)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(", keys:")[0][:300]


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def main() -> int:
    with_parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C is the supervisor's to handle
    cfg = json.loads(sys.argv[1])
    try:
        import torch.distributed  # noqa: F401
    except Exception as exc:
        emit("failed", reason="no_torch", message=_first_line(exc), retry=False)
        helper = StoreProcess(cfg)
        threading.Thread(target=helper.read_commands, daemon=True).start()
        helper.serve_commands(None)
        return 0
    return StoreProcess(cfg).run()


def with_parent_death_signal() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: end with the supervisor
    except Exception:
        pass


if __name__ == "__main__":
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    sys.exit(main())
