"""Each rank's state, read from every independent source in a bundle, each fact kept with the member it came from:
the flight recorder's `pg_status`, the main thread's stack (py-spy, the rank's own dump, faulthandler) and its
native frames, `/proc` (stopped, traced, uninterruptible, zombie), the liveness thread's age against its peers',
whether py-spy and the dump request were answered, the heartbeat's step and phase, exceptions, and how the
process ended. Then one classification: waiting (in what, at which sequence number), elsewhere (data, checkpoint,
compute, holding the GIL, stopped, in the kernel, exited, dead, raised) or unknown. Pure; imports the stdlib,
the frame vocabulary, the stack and flight-recorder adapters, and the bundle reader."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import flight_recorder as fr
from ..adapters import stacks, torchelastic
from ..bundle import layout as L
from ..bundle.reader import Bundle, number
from ..frames import Where, is_native, where
from .stackgroups import RankStack

# What a rank is doing, as the blame sees it. "waiting" ranks are victims; the others may be causes.
ELSEWHERE = ("data", "checkpoint", "compute", "eval", "gil", "stopped", "traced", "kernel", "exited", "dead", "raised")
STOPPED_WCHAN = ("do_signal_stop", "ptrace_stop")
_COMM_TIMEOUT = re.compile(r"Timed out waiting|Watchdog caught collective operation timeout|DistBackendError|"
                           r"timed out|Timeout", re.IGNORECASE)  # fmt: skip
PEER_LOSS = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote process exit|communicator was aborted|aborted|"
    r"Socket closed|Connection refused",
    re.IGNORECASE,
)
FROZEN_MIN_S = 5.0  # a liveness thread this much older than its peers' (and 3x their median) is not running


@dataclass(frozen=True)
class Fact:
    source: str  # the bundle member it was read from
    says: str  # "waiting" or one of ELSEWHERE, or "ambiguous" / "running"
    text: str  # plain words: "main thread in all_reduce (distributed_c10d.py:2950)"


@dataclass
class RankState:
    rank: int
    node: str
    pid: Optional[int]
    kind: str  # waiting | elsewhere | unknown
    where: str  # collective (waiting), one of ELSEWHERE, or unknown
    detail: str  # in what: "all_reduce #9 of group 0", "__getitem__ (train.py:40)", "exit code 3"
    phase: str  # the phase for the verdict: data, checkpoint, collective, compute, eval, startup, ...
    step: Optional[int] = None
    seq: Optional[int] = None  # the collective's sequence number it waits in (flight recorder)
    facts: list[Fact] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # sources that disagree with the classification
    failed_at: Optional[float] = None  # wall time of its exception, when it raised
    exception: Optional[dict[str, Any]] = None  # its first main-thread exception record
    exit_code: Optional[int] = None  # non-zero exit without an exception; negative: a signal
    left_early: bool = False  # exited 0 while others still ran
    op: Optional[str] = None  # waiting: the collective its main thread waits in ("all_reduce", "barrier")

    def agreeing(self) -> int:
        """How many independent sources agree with the classification."""
        return len({f.source.split("#")[0] for f in self.facts if f.says == self.where or (
            self.kind == "waiting" and f.says == "waiting")})  # fmt: skip


@dataclass(frozen=True)
class GroupProgress:
    """Per process group, the furthest collective any rank enqueued (flight recorder)."""

    top: dict[str, int]


def native_stack(bundle: Bundle, rank: int, rs: Optional[RankStack]) -> Optional[stacks.ThreadStack]:
    """The rank's main thread with native frames, when the collection took them: the ambiguous ranks' own
    `py-spy-native.json`, or the main stack itself when every stack was taken with --native."""
    from ..adapters import pyspy

    name = L.process_member(rank, L.PYSPY_NATIVE)
    if name in bundle.files:
        data = bundle.json(name)
        thread = stacks.main_thread(pyspy.threads(data)) if isinstance(data, list) else None
        if thread is not None:
            return thread
    if rs is not None and any(is_native(f) for f in rs.thread.frames):
        return rs.thread
    return None


def exception_records(bundle: Bundle, rank: int) -> list[dict[str, Any]]:
    """The rank's uncaught main-thread exceptions (the recorder's exceptions.jsonl), earliest first."""
    out = []
    for line in bundle.text(L.rank_member(rank, P.RANK_EXCEPTIONS)).splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("thread") == "MainThread" and number(rec.get("time")) is not None:
            out.append({**rec, "rank": rank})
    return sorted(out, key=lambda r: float(r["time"]))


def exception_line(exc: dict[str, Any]) -> str:
    """`Type: message` in one line. An exception re-raised from a DataLoader worker carries the worker's whole
    traceback in its message: its last line is the one that says what went wrong."""
    message = str(exc.get("message", ""))
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if "Original Traceback" in message and lines:
        return lines[-1][:300]
    return f"{str(exc.get('type')).rsplit('.', 1)[-1]}: {lines[0] if lines else ''}"[:300]


def exception_frames(exc: dict[str, Any]) -> tuple[stacks.Frame, ...]:
    tb = exc.get("traceback")
    out = []
    for f in tb if isinstance(tb, list) else []:
        if isinstance(f, dict):
            line = f.get("line")
            out.append(stacks.Frame(str(f.get("file", "")), line if isinstance(line, int) else 0,
                                    str(f.get("function", ""))))  # fmt: skip
    return tuple(out)


def exception_where(exc: dict[str, Any]) -> Where:
    """Where the exception came from, read from its traceback the way a stack is read. An exception out of
    autograd's backward that says a collective timed out or a peer went away came out of DDP's all_reduce."""
    w = where(stacks.ThreadStack("exception", None, False, exception_frames(exc)))
    text = f"{exc.get('type')} {exc.get('message')}"
    if w.kind == "ambiguous" and (_COMM_TIMEOUT.search(text) or PEER_LOSS.search(text)):
        return Where("collective", "DDP's gradient all_reduce in backward()")
    return w


def is_comm_timeout(exc: dict[str, Any]) -> bool:
    return bool(_COMM_TIMEOUT.search(f"{exc.get('type')} {exc.get('message')}"))


def group_progress(dumps: dict[int, dict[str, Any]]) -> GroupProgress:
    top: dict[str, int] = {}
    for rank, dump in dumps.items():
        for s in fr.pg_status(rank, dump):
            top[s.group] = max(top.get(s.group, -1), s.last_enqueued)
    return GroupProgress(top)


def _fr_facts(rank: int, dump: Optional[dict[str, Any]], progress: GroupProgress) -> list[Fact]:
    """Waiting: a collective enqueued and not completed. Behind: its group went further without it."""
    if dump is None:
        return []
    source = f"{L.FLIGHT_RECORDER_DIR} (rank {rank}'s pg_status)"
    out = []
    for s in fr.pg_status(rank, dump):
        top = progress.top.get(s.group, s.last_enqueued)
        if s.last_enqueued > s.last_completed and s.last_enqueued >= 0:
            entry = fr.entry(dump, s.group, s.last_enqueued)
            op = str(entry.get("profiling_name") or "collective").split(":")[-1] if entry else "collective"
            out.append(Fact(source, "waiting", f"enqueued {op} #{s.last_enqueued} of group {s.group} and it has "
                            f"not completed (last completed #{s.last_completed})"))  # fmt: skip
        elif s.last_enqueued < top:
            out.append(Fact(source, "behind", f"never enqueued collective #{top} of group {s.group} that others "
                            f"did (its last: #{s.last_enqueued}, completed)"))  # fmt: skip
    return out


def read_state(
    bundle: Bundle,
    rank: int,
    node: str,
    rs: Optional[RankStack],
    fr_dump: Optional[dict[str, Any]],
    progress: GroupProgress,
    peer_liveness: Optional[float],
    exits: dict[int, int],
    job_entry: dict[str, Any],
) -> RankState:
    """Every source's facts about one rank, then its classification (classify). `peer_liveness`: the median
    age of the other ranks' liveness threads; `job_entry`: the rank's entry in the manifest's job.local_ranks."""
    hb_src = L.rank_member(rank, L.HEARTBEAT)
    hb_raw = bundle.json(hb_src)
    hb: dict[str, Any] = hb_raw if isinstance(hb_raw, dict) else {}
    facts: list[Fact] = []
    pid = hb.get("pid") if isinstance(hb.get("pid"), int) else None
    alive = hb.get("alive") if isinstance(hb.get("alive"), bool) else None
    if job_entry:
        entry_pid = job_entry.get("pid")
        pid = pid if pid is not None else entry_pid if isinstance(entry_pid, int) else None
        alive = alive if alive is not None else bool(job_entry.get("alive"))
    step = hb.get("step") if isinstance(hb.get("step"), int) else None
    phase = str(hb.get("phase") or "unknown")
    state = str(hb.get("state") or "")
    # how it ended
    excs = exception_records(bundle, rank)
    exc = excs[0] if excs else None
    exit_status = str(hb.get("exit_status") or "")
    exit_code = _exit_code(exit_status)
    if exit_code is None and pid in exits and alive is not True:
        exit_code = exits[pid]
        exit_status = _describe_exit(exit_code)
        facts.append(Fact(f"{L.CONSOLE_TAIL} (torchrun's failure summary)", "dead" if exit_code else "exited",
                          f"torchrun saw it end with exitcode {exit_code}"))  # fmt: skip
    if exc is not None:
        w = exception_where(exc)
        says = "waiting" if w.kind == "collective" else "raised"
        facts.append(Fact(L.rank_member(rank, P.RANK_EXCEPTIONS), says, f"raised {exc.get('type')}"
                          + (" out of a collective" if says == "waiting" else "")))  # fmt: skip
    if alive is False or state == "exited":
        if state == "exited" and not exit_code:
            facts.append(Fact(hb_src, "exited", f"exited normally at step {step}"))
        elif exit_status:
            facts.append(Fact(hb_src, "dead", f"ended: {exit_status}"))
        elif exc is None:
            facts.append(Fact(hb_src if hb else L.MANIFEST, "dead", "its process is gone"))
    # /proc
    psrc = L.process_member(rank, L.PROC)
    proc = bundle.json(psrc)
    proc = proc if isinstance(proc, dict) else {}
    letter = str(proc.get("state") or "")[:1]
    wchan = str(proc.get("wchan") or "")
    if letter == "T" or (letter == "t" and wchan == "do_signal_stop"):
        facts.append(Fact(psrc, "stopped", f"/proc state {proc.get('state')}" + (f", wchan {wchan}" if wchan else "")))
    elif letter == "t":
        facts.append(Fact(psrc, "traced", f"/proc state {proc.get('state')} (stopped by a debugger)"))
    elif letter == "Z":  # exited, not yet reaped by its parent: the kernel still holds how it ended
        code = proc.get("exit_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        if code == 0:
            facts.append(Fact(psrc, "exited", "/proc state Z: exited with code 0, not yet reaped"))
        else:
            facts.append(Fact(psrc, "dead", "/proc state Z (zombie: exited, not yet reaped)"
                              + (f", {_describe_exit(code)}" if code is not None else "")))  # fmt: skip
            if code is not None and exit_code is None:
                exit_code, exit_status = code, _describe_exit(code)
    elif letter == "D":
        facts.append(Fact(psrc, "kernel", f"/proc state D (uninterruptible sleep in the kernel, wchan {wchan or '?'})"))
    # stacks
    native = native_stack(bundle, rank, rs)
    if rs is not None:
        w = where(native) if native is not None else rs.where or where(rs.thread)
        native_src = L.process_member(rank, L.PYSPY_NATIVE)
        src = native_src if native is not None and native_src in bundle.files else rs.source
        says = {"collective": "waiting", "ambiguous": "ambiguous"}.get(w.kind, w.kind)
        text = f"main thread in {w.what}" + (" (native frames)" if w.native else "")
        facts.append(Fact(src, says, text))
    elif alive and (proc or hb):
        facts.append(Fact(f"{L.MANIFEST}: steps", "unanswered", "no stack could be taken (py-spy failed or was not "
                          "run, no dump of its own)"))  # fmt: skip
    # flight recorder
    facts.extend(_fr_facts(rank, fr_dump, progress))
    # heartbeat
    if hb and alive is not False and state not in ("exited",):
        hb_says = {"collective": "waiting", "data": "data", "checkpoint": "checkpoint", "eval": "eval"}.get(phase)
        if hb_says is not None:
            coll = f" {hb.get('collective')}" if phase == "collective" and hb.get("collective") not in (None, "none") \
                else ""  # fmt: skip
            facts.append(Fact(hb_src, hb_says, f"heartbeat phase {phase}{coll}"))
        age = number(hb.get("liveness_age_s"))
        median = peer_liveness
        if age is not None and median is not None and age > max(FROZEN_MIN_S, 3 * median + 1):
            facts.append(Fact(hb_src, "gil", f"its liveness thread has not run for {age:.0f} s while its peers' ran "
                              f"{median:.1f} s ago (the GIL is held, or the process is stopped)"))  # fmt: skip
        if isinstance(hb.get("dump_request"), int) and isinstance(hb.get("dump_ack"), int) and \
                hb["dump_request"] > hb["dump_ack"]:  # fmt: skip
            facts.append(Fact(hb_src, "unanswered", "did not answer the dump request"))
    node_name = str(hb.get("node") or node)
    st = classify(rank, node_name, pid, facts, phase, step)
    st.exception = exc
    st.failed_at = number(exc.get("time")) if exc else None
    if exit_code:
        st.exit_code = exit_code
    return st


def _exit_code(status: str) -> Optional[int]:
    m = re.match(r"exit code (-?\d+)", status)
    if m:
        return int(m.group(1))
    m = re.match(r"signal (\d+)", status)
    return -int(m.group(1)) if m else None


def _describe_exit(code: int) -> str:
    if code < 0:
        import signal as _signal

        try:
            return f"signal {-code} ({_signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# The order in which one fact settles a rank's state over the others: how a process ended first, then what the
# kernel says, then what its main thread is doing, then the flight recorder, then the heartbeat.
_FINAL = ("raised", "dead", "exited", "stopped", "traced")


def classify(rank: int, node: str, pid: Optional[int], facts: list[Fact], phase: str, step: Optional[int]) -> RankState:
    """One state from the facts. Pure: unit tests give hand-made facts."""

    firsts: dict[str, Fact] = {}  # what each kind of fact says first (the order of `facts` is the order of trust)
    for f in facts:
        firsts.setdefault(f.says, f)
    first = firsts.get

    def make(kind: str, where_: str, decided: Fact, ph: str) -> RankState:
        st = RankState(rank, node, pid, kind, where_, decided.text, ph, step, facts=facts)
        for f in facts:
            contradicts = (kind == "waiting" and f.says in ("data", "checkpoint", "compute", "eval", "behind")) or (
                kind == "elsewhere" and f.says == "waiting" and where_ not in _FINAL
            )
            if contradicts and f.source != decided.source:
                st.conflicts.append(f"{f.source} says {f.text}")
        return st

    waiting_exc = next((f for f in facts if f.says == "waiting" and f.source.endswith(P.RANK_EXCEPTIONS)), None)
    if waiting_exc is not None:  # raised out of a collective: a victim of whoever did not arrive
        return make("waiting", "collective", waiting_exc, "collective")
    for final in _FINAL:
        decisive = first(final)
        if decisive is not None:
            return make("elsewhere", final, decisive, phase)
    stack = next((f for f in facts if f.text.startswith("main thread in ")), None)
    gil = first("gil")
    kernel = first("kernel")
    if stack is not None and stack.says in ("data", "checkpoint"):
        return make("elsewhere", stack.says, stack, stack.says)
    if stack is not None and stack.says == "waiting":
        fr_wait = next((f for f in facts if f.says == "waiting" and f.source.startswith(L.FLIGHT_RECORDER_DIR)), None)
        st = make("waiting", "collective", stack, "collective")
        st.seq = _seq(fr_wait.text) if fr_wait else None
        st.op = stack.text.removeprefix("main thread in ").split(" ")[0]
        return st
    if kernel is not None:
        return make("elsewhere", "kernel", kernel, phase)
    if stack is not None and stack.says == "compute":
        if gil is not None:
            return make("elsewhere", "gil", gil, "compute")
        hb_phase = next(
            (f for f in facts if f.source.endswith(L.HEARTBEAT) and f.says in ("data", "checkpoint", "eval")), None
        )
        return make("elsewhere", "compute", stack, hb_phase.says if hb_phase and hb_phase.says == "eval" else "compute")
    # no decisive stack (none, or a C call that may be a collective wait): the flight recorder, then the heartbeat
    fr_wait = next((f for f in facts if f.says == "waiting" and f.source.startswith(L.FLIGHT_RECORDER_DIR)), None)
    if fr_wait is not None:
        st = make("waiting", "collective", fr_wait, "collective")
        st.seq = _seq(fr_wait.text)
        return st
    if gil is not None:
        return make("elsewhere", "gil", gil, "compute")
    hb_fact = next((f for f in facts if f.source.endswith(L.HEARTBEAT) and f.says in (
        "waiting", "data", "checkpoint", "eval")), None)  # fmt: skip
    if hb_fact is not None:
        if hb_fact.says == "waiting":
            return make("waiting", "collective", hb_fact, "collective")
        return make("elsewhere", hb_fact.says, hb_fact, hb_fact.says)
    behind = first("behind")
    if behind is not None and stack is not None:  # in backward with no collective pending: computing
        return make("elsewhere", "compute", behind, "compute")
    decided = stack or first("unanswered") or Fact("", "unknown", "no source says where it is")
    return RankState(rank, node, pid, "unknown", "unknown", decided.text, phase, step, facts=facts)


def _seq(text: str) -> Optional[int]:
    m = re.search(r"#(\d+)", text)
    return int(m.group(1)) if m else None


def console_exits(bundle: Bundle) -> dict[int, int]:
    """pid -> exit code, as torchrun printed them for its failed workers (in the console tail)."""
    return torchelastic.failures_in_output(bundle.text(L.CONSOLE_TAIL))
