"""Each rank's state, read from every independent source in a bundle, each fact kept with the member it came from:
the collective each process group is stuck at (the flight recorder's `pg_status`, or the NCCL watchdog's lines in
the console), the main thread's stack (py-spy, the rank's own dump, faulthandler) and its native frames, `/proc`
(stopped, traced, uninterruptible, zombie, blocked in a read of a file or socket), the liveness thread's age against
its peers', whether py-spy and the dump request were answered, the heartbeat's step and phase, exceptions (the
recorder's, else the console's), and how the process ended. Then one classification: waiting (in what, in which
group, at which sequence number), elsewhere (data, checkpoint, I/O, compute, holding the GIL, stopped, in the
kernel, exited, dead, raised) or unknown. Pure; imports the stdlib, the frame vocabulary, the stack, console and
flight-recorder adapters, and the bundle reader."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .._recorder import protocol as P
from ..adapters import comm_log, stacks, torchelastic
from ..adapters import flight_recorder as fr
from ..bundle import layout as L
from ..bundle.evidence import exception_records
from ..bundle.reader import Bundle, integer, number
from ..detections import human_bytes
from ..frames import SETUP_FUNCS, Where, is_native, looks_like_data, where
from .stackgroups import RankStack

# What a rank is doing, as the blame sees it. "waiting" ranks are victims; the others may be causes.
ELSEWHERE = ("data", "checkpoint", "io", "compute", "eval", "gil", "stopped", "traced", "kernel", "exited", "dead",
             "raised")  # fmt: skip
FROZEN_MIN_S = 5.0  # a liveness thread this much older than its peers' (and 3x their median) is not running
# Syscalls a thread blocks in while it waits for I/O, as the /proc adapter names them.
IO_SYSCALLS = frozenset({"read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg", "recvmmsg", "open",
                         "openat", "openat2", "connect", "accept", "accept4", "poll", "ppoll", "select", "pselect6",
                         "epoll_wait", "epoll_pwait", "write", "writev", "pwrite64", "sendto", "sendmsg"})  # fmt: skip
IO_FDS = frozenset({"file", "fifo", "socket", "pipe", None})  # what the fd is; None: the syscall names none (poll)


@dataclass(frozen=True)
class Fact:
    source: str  # the bundle member it was read from
    says: str  # "waiting", "behind" or one of ELSEWHERE, or "ambiguous" / "unanswered"
    text: str  # plain words: "main thread in all_reduce (distributed_c10d.py:2950)"
    group: Optional[str] = None  # waiting / behind: the process group
    seq: Optional[int] = None  # ... and the collective's sequence number in it
    op: Optional[str] = None  # ... and its op, where known
    weak: bool = False  # a stack that says compute only because nothing in it says otherwise (frames.Where.fallback)
    stack: bool = False  # read from the main thread's stack
    waited: str = ""  # io: the other process the main thread waits for, in words ("its child `cat` (pid 4121), …")
    by_thread: bool = False  # io: `waited` is a thread of its own (an upload), not another process


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
    seq: Optional[int] = None  # the collective's sequence number it waits in (flight recorder, NCCL's watchdog)
    facts: list[Fact] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # sources that disagree with the classification
    failed_at: Optional[float] = None  # wall time of its exception, when it raised
    exception: Optional[dict[str, Any]] = None  # its first main-thread exception record
    exit_code: Optional[int] = None  # non-zero exit without an exception; negative: a signal
    op: Optional[str] = None  # waiting: the collective its main thread waits in ("all_reduce", "barrier")
    group: Optional[str] = None  # waiting: the process group of that collective
    setup: bool = False  # waiting in process-group set-up (init_process_group, a store barrier)
    exiting: bool = False  # its main thread is in the interpreter's exit (threading._shutdown): training is over

    def agreeing(self) -> int:
        """How many independent sources agree with the classification."""
        agree = {self.where, "waiting" if self.kind == "waiting" else "behind" if self.kind == "elsewhere" else ""}
        return len({f.source.split("#")[0] for f in self.facts if f.says in agree})


@dataclass
class JobEvidence:
    """What each rank's state is read against: the collective each group is stuck at (flight recorder and console),
    the console's facts, torchrun's exit codes."""

    stuck: list[fr.Stuck] = field(default_factory=list)
    ops: dict[tuple[str, int], str] = field(default_factory=dict)  # (group, seq) -> op, where known
    status_source: dict[int, str] = field(default_factory=dict)  # rank -> where its group statuses came from
    console_statuses: list[fr.GroupStatus] = field(default_factory=list)  # the watchdog's, for ranks without a dump
    entered: dict[int, str] = field(default_factory=dict)  # rank -> the collective it entered after its dump (_entered)
    # collectives the ranks did not agree on: (group, seq, {rank: "ALLREDUCE [25]"}) — DETAIL's fingerprints, or the
    # watchdog's lines of one number with different ops or sizes
    mismatches: list[tuple[str, int, dict[int, str]]] = field(default_factory=list)
    console: comm_log.ConsoleFacts = field(default_factory=comm_log.ConsoleFacts)
    exits: dict[int, int] = field(default_factory=dict)  # pid -> exit code (torchrun's lines)
    rank_exits: dict[int, int] = field(default_factory=dict)  # rank -> exit code (torchrun's failure summary)
    # ranks whose stuck collective every member enqueued and none started (`scheduled`; or a group of one): the GPU
    # still runs the work queued before it, a long kernel, not a wait for a peer
    queued: list[int] = field(default_factory=list)


def job_evidence(bundle: Bundle, dumps: dict[int, dict[str, Any]], world: Optional[int]) -> JobEvidence:
    """The job-wide evidence: the flight recorder's group statuses, completed by the NCCL watchdog's lines for the
    ranks without a dump; per group, the collective it is stuck at."""
    console_text = bundle.text(L.CONSOLE_TAIL)
    ev = JobEvidence(console=comm_log.parse_console(console_text), exits=torchelastic.failures_in_output(console_text),
                     rank_exits=torchelastic.failures_by_rank(console_text))  # fmt: skip
    statuses: list[fr.GroupStatus] = []
    for rank, dump in dumps.items():
        statuses.extend(fr.pg_status(rank, dump))
        ev.status_source[rank] = f"{L.FLIGHT_RECORDER_DIR} (rank {rank}'s pg_status)"
    members = fr.members(dumps)
    pairs = {g for g, ranks in members.items() if len(ranks) == 2}
    for rank, dump in dumps.items():
        statuses.extend(fr.p2p_status(rank, dump, pairs))
    members.update({g + fr.P2P: members[g] for g in pairs})
    for t in ev.console.timeouts:
        if t.rank in dumps:
            continue
        group = t.group or "0"
        enqueued = t.last_enqueued if t.last_enqueued is not None else t.seq
        completed = t.last_completed if t.last_completed is not None else t.seq - 1
        ev.console_statuses.append(fr.GroupStatus(t.rank, group, enqueued, -1, completed))
        ev.ops[(group, t.seq)] = t.op.lower()
        ev.status_source[t.rank] = f"{L.CONSOLE_TAIL} (the NCCL watchdog's line)"
        if group == "0" and world and group not in members:
            members[group] = list(range(world))
    ev.entered = _entered(bundle, dumps)
    ev.stuck = fr.stuck(statuses + ev.console_statuses, members, ev.entered)
    ev.mismatches = [("0", seq, calls) for seq, calls in ev.console.mismatches] + _watchdog_mismatches(ev.console)
    ev.queued = _queued(ev.stuck, statuses, members)
    for st in ev.stuck:  # the stuck collective's op, from a waiting rank's own entry
        if st.group.endswith(fr.P2P):
            ev.ops[(st.group, st.seq)] = "send/recv"
            continue
        e = next((fr.entry(dumps[r], st.group, st.seq) for r in st.waiting if r in dumps), None)
        if e is not None:
            ev.ops[(st.group, st.seq)] = fr.op_name(e)
    return ev


def _queued(stuck: list[fr.Stuck], statuses: list[fr.GroupStatus], members: dict[str, list[int]]) -> list[int]:
    """The ranks of groups whose stuck collective every member enqueued and none started: `scheduled` behind earlier
    work on the GPU. Where the backend keeps start times (NCCL with TORCH_NCCL_ENABLE_TIMING=1) the started counter
    says so; without them (NCCL's default: last started -1, every entry `scheduled`; seen on an H200, torch 2.11)
    only a group of one rank says it: it has no peer to wait for."""
    out: set[int] = set()
    for st in stuck:
        if not st.waiting or st.missing or st.untraced:
            continue
        own = [s for s in statuses if s.group == st.group]
        alone = members.get(st.group) == st.waiting and len(st.waiting) == 1
        if alone or all(0 <= s.last_started < st.seq for s in own):
            out.update(st.waiting)
    return sorted(out)


def _entered(bundle: Bundle, dumps: dict[int, dict[str, Any]]) -> dict[int, str]:
    """Ranks whose flight-recorder dump has no collective pending while their heartbeat puts them inside one: the
    recorder's hook marks the phase just before torch enqueues the call, so the dump was written before the rank got
    there (a rank still moving while the job is collected: slow, or starved of CPU). rank -> the op it is in."""
    out = {}
    for rank, dump in dumps.items():
        hb = bundle.json(L.rank_member(rank, L.HEARTBEAT))
        if not isinstance(hb, dict) or hb.get("phase") != "collective" or hb.get("alive") is False:
            continue
        op, statuses = hb.get("collective"), fr.pg_status(rank, dump)
        if isinstance(op, str) and op not in ("", "none") and statuses and fr.idle(statuses):
            out[rank] = op
    return out


def _watchdog_mismatches(console: comm_log.ConsoleFacts) -> list[tuple[str, int, dict[int, str]]]:
    """Ranks whose watchdogs timed out on the same collective number of one group with different ops or sizes: they
    were not in the same call."""
    by_work: dict[tuple[str, int], dict[int, str]] = {}
    for t in console.timeouts:
        if t.numel is not None or t.op != "collective":
            by_work.setdefault((t.group or "0", t.seq), {})[t.rank] = f"{t.op}" + (
                f" NumelIn={t.numel}" if t.numel is not None else "")  # fmt: skip
    return [(g, seq, calls) for (g, seq), calls in sorted(by_work.items()) if len(set(calls.values())) > 1]


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


def console_exception(ev: JobEvidence, rank: int) -> Optional[dict[str, Any]]:
    """The rank's exception as its console shows it (`[rank3]: ValueError: ...`), for a rank without the recorder's
    record: an exception record with no time, ordered by its place in the console."""
    for e in ev.console.exceptions:
        if e.rank == rank:
            return {"rank": rank, "type": e.type, "message": e.message, "time": None, "order": e.order,
                    "thread": "MainThread", "source": L.CONSOLE_TAIL,
                    "traceback": [{"file": f, "line": n, "function": fn} for f, n, fn in e.traceback]}  # fmt: skip
    return None


def exception_key(exc: dict[str, Any]) -> tuple[float, int]:
    """When an exception came: the recorder's wall time, else its place in the console."""
    t = exc.get("time")
    order = exc.get("order")
    return (float(t) if isinstance(t, (int, float)) else 0.0, order if isinstance(order, int) else 0)


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


def error_kind(exc: dict[str, Any]) -> Optional[str]:
    """What an exception is (adapters.comm_log.error_kind): a collective timeout, a lost peer, a CUDA fault, a
    network set-up failure, an OOM, or None — the rank's own error. Its traceback says whether it came out of
    process-group set-up (or the first collective, which sets NCCL's communicator up)."""
    frames = exception_frames(exc)
    in_setup = any(f.function in SETUP_FUNCS or f.function in ("_verify_param_shape_across_processes",
                                                                "_sync_module_states") for f in frames)  # fmt: skip
    return comm_log.error_kind(f"{exc.get('type')}: {exc.get('message')}", in_setup)


def is_comm_timeout(exc: dict[str, Any]) -> bool:
    return error_kind(exc) == "comm_timeout"


def is_victim(exc: dict[str, Any]) -> bool:
    """Only a collective's timeout or a lost peer makes the rank that raised a victim; anything else raised inside a
    collective (a CPU tensor given to NCCL, an object that cannot be pickled) is the rank's own failure."""
    return error_kind(exc) in ("comm_timeout", "peer_loss")


def exception_where(exc: dict[str, Any]) -> Where:
    """Where the exception came from, read from its traceback the way a stack is read. An exception out of
    autograd's backward that says a collective timed out or a peer went away came out of DDP's all_reduce."""
    w = where(stacks.ThreadStack("exception", None, False, exception_frames(exc)))
    if w.kind == "ambiguous" and is_victim(exc):
        return Where("collective", "DDP's gradient all_reduce in backward()")
    return w


def stuck_name(st: fr.Stuck, ev: JobEvidence) -> str:
    """The collective a group is stuck at, in words: "all_reduce #9 of group 0"."""
    return f"{ev.ops.get((st.group, st.seq)) or 'collective'} #{st.seq} of group {st.group}"


def late_arrival(rank: int, st: fr.Stuck, ev: JobEvidence) -> str:
    """What makes `rank` a late arrival in the stuck collective `st` (fr.stuck's `entered`)."""
    return (f"had not enqueued {stuck_name(st, ev)} when it wrote its flight-recorder dump, but its heartbeat has it "
            f"in {ev.entered.get(rank)}: it was on its way in")  # fmt: skip


def _fr_facts(rank: int, ev: JobEvidence) -> list[Fact]:
    """Per stuck group: waiting (it enqueued the collective the group is stuck at), or behind (it never did)."""
    source = ev.status_source.get(rank)
    out = []
    for st in ev.stuck:
        op = ev.ops.get((st.group, st.seq))
        name = stuck_name(st, ev)
        if rank in st.late and source:
            out.append(Fact(source, "waiting", late_arrival(rank, st, ev), st.group, st.seq, op))
        elif rank in st.waiting and source:
            out.append(Fact(source, "waiting", f"enqueued {name} and it has not completed", st.group, st.seq, op))
        elif rank in st.missing and source:
            out.append(Fact(source, "behind", f"never enqueued {name}, which ranks "
                            f"{', '.join(map(str, st.waiting[:8]))} wait in", st.group, st.seq, op))  # fmt: skip
    return out


def _end_facts(bundle: Bundle, rank: int, hb: dict[str, Any], alive: Optional[bool], pid: Optional[int],
               ev: JobEvidence, exc: Optional[dict[str, Any]]) -> tuple[list[Fact], Optional[int]]:  # fmt: skip
    """How the process ended (torchrun's lines, the heartbeat's exit status), and its exception. Returns the facts
    and its exit code where known."""
    hb_src = L.rank_member(rank, L.HEARTBEAT)
    facts: list[Fact] = []
    state = str(hb.get("state") or "")
    exit_status = str(hb.get("exit_status") or "")
    exit_code = _exit_code(exit_status)
    torchrun = ev.exits.get(pid) if pid is not None else None
    torchrun = torchrun if torchrun is not None else ev.rank_exits.get(rank) if not hb else None
    if exit_code is None and torchrun is not None and alive is not True:
        exit_code = torchrun
        exit_status = _describe_exit(torchrun)
        facts.append(Fact(f"{L.CONSOLE_TAIL} (torchrun's failure summary)", "dead" if torchrun else "exited",
                          f"torchrun saw it end with exitcode {torchrun}"))  # fmt: skip
    if exc is not None:
        w = exception_where(exc)
        says = "waiting" if is_victim(exc) else "raised"
        text = f"raised {exc.get('type')}" + (" out of a collective" if w.kind == "collective" else "") + (
            ": a timeout or a lost peer" if says == "waiting" else "")  # fmt: skip
        facts.append(Fact(str(exc.get("source") or L.rank_member(rank, P.RANK_EXCEPTIONS)), says, text))
    if alive is False or state == "exited":
        if state == "exited" and not exit_code:
            facts.append(Fact(hb_src, "exited", f"exited normally at step {hb.get('step')}"))
        elif exit_status:
            facts.append(Fact(hb_src, "dead", f"ended: {exit_status}"))
        elif exc is None:
            facts.append(Fact(hb_src if hb else L.MANIFEST, "dead", "its process is gone"))
    return facts, exit_code


def _proc_facts(proc: dict[str, Any], rank: int, waiting: str, exiting: bool = False
                ) -> tuple[list[Fact], Optional[int]]:  # fmt: skip
    """What the kernel says (ranks/R/proc.json): stopped, traced, a zombie and its end, uninterruptible sleep, or
    the main thread blocked in I/O (which syscall, on which file, socket or pipe), or waiting on other processes
    (those the kernel shows; those it may wait for while it waits for a thread: `waiting`, its heartbeat's; the
    thread of its own it waits for, also at the interpreter's exit: `exiting`). Returns a zombie's exit code."""
    psrc = L.process_member(rank, L.PROC)
    letter = str(proc.get("state") or "")[:1]
    wchan = str(proc.get("wchan") or "")
    main = proc.get("main_thread")
    blocked: dict[str, Any] = main if isinstance(main, dict) else {}
    if letter == "T" or (letter == "t" and wchan == "do_signal_stop"):
        return [Fact(psrc, "stopped", f"/proc state {proc.get('state')}" + (f", wchan {wchan}" if wchan else ""))], None
    if letter == "t":
        return [Fact(psrc, "traced", f"/proc state {proc.get('state')} (stopped by a debugger)")], None
    if letter == "Z":  # exited, not yet reaped by its parent: the kernel still holds how it ended
        code = integer(proc.get("exit_code"))
        if code == 0:
            return [Fact(psrc, "exited", "/proc state Z: exited with code 0, not yet reaped")], None
        return [Fact(psrc, "dead", "/proc state Z (zombie: exited, not yet reaped)"
                     + (f", {_describe_exit(code)}" if code is not None else ""))], code  # fmt: skip
    io = describe_blocked(blocked)
    child = describe_waited(proc.get("waits_for"))
    if not child and waiting == "thread":  # a pool's result: its workers are the leaf of the wait
        child = describe_waited(proc.get("may_wait_for"))
    if letter == "D":
        return [Fact(psrc, "kernel", f"/proc state D (uninterruptible sleep in the kernel, wchan {wchan or '?'})"
                     + (f"; {io}" if io else ""))], None  # fmt: skip
    if child:
        return [Fact(psrc, "io", f"main thread waits for {child}", waited=child)], None
    if io and blocked.get("syscall") in IO_SYSCALLS and blocked.get("fd_kind") in IO_FDS:
        return [Fact(psrc, "io", io)], None
    held = _held_thread(proc) if waiting == "thread" else ""
    if held and exiting:  # training is over: what holds it is a thread the interpreter joins before it can exit
        return [Fact(psrc, "io", f"finished but cannot exit: the interpreter waits for {held}", waited=held,
                     by_thread=True)], None  # fmt: skip
    if held:
        return [Fact(psrc, "io", f"main thread waits for {held}", waited=held, by_thread=True)], None
    return [], None


def at_exit(thread: stacks.ThreadStack) -> bool:
    """Whether a main thread is in the interpreter's exit, joining the non-daemon threads (threading._shutdown)."""
    inner = thread.frames[-1] if thread.frames else None
    return inner is not None and inner.function == "_shutdown" and inner.file.endswith("threading.py")


def _held_thread(proc: dict[str, Any]) -> str:
    """The thread of its own a rank's main thread may wait for (its heartbeat says it waits for a thread), in words
    after "waits for": one blocked on a socket, pipe or FIFO (an upload sent with blocking calls), else the socket
    whose bytes its peer does not take (an upload from an event loop: the thread waits in epoll, not in send)."""
    threads = proc.get("threads")
    for t in threads if isinstance(threads, list) else []:
        b = t.get("blocked") if isinstance(t, dict) else None
        if isinstance(b, dict) and b.get("syscall") in IO_SYSCALLS and b.get("fd_kind") in ("socket", "pipe", "fifo"):
            tid = integer(t.get("tid"))
            return f"a thread of its own{f' (tid {tid})' if tid is not None else ''}, which is " + describe_blocked(
                b, subject="")  # fmt: skip
    sockets = proc.get("sockets")
    listed = [s for s in sockets[:64] if isinstance(s, dict)] if isinstance(sockets, list) else []
    unsent, peer = max(((integer(s.get("unsent")) or 0, str(s.get("peer"))[:80]) for s in listed), default=(0, ""))
    if unsent > 0:
        return f"a thread of its own, whose socket to {peer} holds {human_bytes(unsent)} that the peer has not taken"
    return ""


def describe_waited(waits: Any) -> str:
    """The leaf of a rank's wait on other processes (proc.json's `waits_for`, written by the collector), in words
    that follow "waits for": "its child `cat` (pid 4121), which is blocked in read() of fd 0, pipe:[88] (a pipe)".
    The leaf is the deepest process that waits on something other than its own children."""
    entries = [e for e in waits if isinstance(e, dict) and isinstance(e.get("pid"), int)] if isinstance(
        waits, list) else []  # fmt: skip
    if not entries:
        return ""
    first = next((e for e in entries if e.get("waited") is True), entries[0])
    leaves = [e for e in entries if isinstance(e.get("main_thread"), dict)
              and e["main_thread"].get("syscall") not in ("wait4", "waitid")]  # fmt: skip
    leaf = leaves[-1] if leaves else first
    said = f"its child {_command(first)} (pid {first['pid']})"
    if leaf is not first:
        said += f", which waits for {_command(leaf)} (pid {leaf['pid']})"
    blocked = describe_blocked(leaf["main_thread"], subject="") if isinstance(leaf.get("main_thread"), dict) else ""
    if str(leaf.get("state") or "")[:1] == "D":
        return said + ", in uninterruptible sleep in the kernel" + (f" ({blocked})" if blocked else "")
    return said + (f", which is {blocked}" if blocked else "")


def _command(entry: dict[str, Any]) -> str:
    argv = entry.get("argv")
    words = [str(a) for a in argv[:6]] if isinstance(argv, list) else []
    line = " ".join(" ".join(words).split())[:80]  # one line, whatever a `-c` script holds
    return f"`{line}`" if line else "process"


def describe_blocked(b: dict[str, Any], subject: str = "main thread") -> str:
    """A thread's blocking syscall in words, after its `subject`: "main thread blocked in read() of fd 5,
    /data/train.bin (a file on nfs4)"."""
    call = b.get("syscall")
    if not isinstance(call, str) or call in ("running", ""):
        return ""
    what = str(b.get("fd_target") or b.get("path") or "")
    kind = b.get("fd_kind")
    on = f" on {b['fs_type']}" + (f" ({b['mount']})" if b.get("mount") else "") if b.get("fs_type") else ""
    peer = f" to {b['peer']}" if b.get("peer") else ""
    fd = f" of fd {b['fd']}" if isinstance(b.get("fd"), int) else ""
    thing = f", {what} (a {kind}{on}{peer})" if what and kind else f", {what}" if what else ""
    return (f"{subject} " if subject else "") + f"blocked in {call}(){fd}{thing}"


def _stack_facts(bundle: Bundle, rank: int, rs: Optional[RankStack], alive: Optional[bool],
                 known: bool) -> list[Fact]:  # fmt: skip
    native = native_stack(bundle, rank, rs)
    if rs is None:
        if alive and known:
            return [Fact(f"{L.MANIFEST}: steps", "unanswered", "no stack could be taken (py-spy failed or was not "
                         "run, no dump of its own)")]  # fmt: skip
        return []
    w = where(native) if native is not None else rs.where or where(rs.thread)
    native_src = L.process_member(rank, L.PYSPY_NATIVE)
    src = native_src if native is not None and native_src in bundle.files else rs.source
    says = {"collective": "waiting", "ambiguous": "ambiguous"}.get(w.kind, w.kind)
    text = f"main thread in {w.what}" + (" (native frames)" if w.native else "")
    op = w.what.split(" ")[0] if w.kind == "collective" else None
    out = [Fact(src, says, text, op=op, weak=w.fallback, stack=True)]
    if w.setup:
        out.append(Fact(src, "setup", "process-group set-up", stack=True))
    reads = looks_like_data(native or rs.thread) if w.fallback or w.kind == "ambiguous" else None
    if reads is not None:  # under a read the kernel may show: the job's data (nanoGPT's get_batch), not other I/O
        out.append(Fact(src, "reads_data", f"{reads.describe()} reads the job's data", stack=True))
    return out


def describe_polls(polls: Any) -> str:
    """What a poll loop checks (proc.json's `polls`, written by the collector), in words: "`while not
    os.path.exists(path)`; path = /ckpt/stage1.done, no such file". Untrusted: what does not fit is left out."""
    if not isinstance(polls, dict):
        return ""
    loop = polls.get("loop")
    line = str(loop.get("line") or "")[:160].rstrip(":").strip() if isinstance(loop, dict) else ""
    said = [f"`{line}`"] if line else []
    checks = polls.get("checks")
    for c in checks if isinstance(checks, list) else []:
        if not isinstance(c, dict) or not isinstance(c.get("value"), str):
            continue
        name, value = str(c.get("name") or "?")[:40], c["value"][:240]
        held = [h for h in c.get("held_by") or [] if isinstance(h, dict) and isinstance(h.get("pid"), int)]
        if c.get("exists") is False:
            value += ", no such file"
        elif held:
            value += ", held open by " + ", ".join(f"{_command(h)} (pid {h['pid']})" for h in held[:3])
        elif c.get("exists") is True:
            value += ", which no process holds open"
        said.append(f"{name} = {value}")
    return "; ".join(said)


def _held_at(proc: dict[str, Any], where: str) -> str:
    """What holds a rank where its stack is, for its state's words (": " and them, else ""): what a poll loop checks
    (a lock file, a marker, a store key); for checkpoint or data code the kernel holds asleep (state D), the call it
    is held in ("main thread blocked in write() of fd 13, /ckpt/step-900.pt (a file on ext4 (/ckpt)), held by the
    kernel in balance_dirty_pages")."""
    if where == "poll":
        checked = describe_polls(proc.get("polls"))
        return f": {checked}" if checked else ""
    main = proc.get("main_thread")
    if where in ("checkpoint", "data") and str(proc.get("state") or "")[:1] == "D" and isinstance(main, dict):
        wchan = str(proc.get("wchan") or "")[:60]
        blocked = describe_blocked(main) or "main thread asleep in the kernel"
        return f": {blocked}, held by the kernel" + (f" in {wchan}" if wchan and wchan != "0" else "")
    return ""


def _heartbeat_facts(rank: int, hb: dict[str, Any], alive: Optional[bool], peer_liveness: Optional[float],
                     polled: str = "") -> list[Fact]:  # fmt: skip
    hb_src = L.rank_member(rank, L.HEARTBEAT)
    if not hb or alive is False or hb.get("state") == "exited":
        return []
    out = []
    phase = str(hb.get("phase") or "unknown")
    hb_says = {"collective": "waiting", "data": "data", "checkpoint": "checkpoint", "eval": "eval"}.get(phase)
    if hb_says is not None:
        named = phase == "collective" and hb.get("collective") not in (None, "none")
        coll = f" {hb.get('collective')}" if named else ""
        out.append(Fact(hb_src, hb_says, f"heartbeat phase {phase}{coll}"))
    if hb.get("waiting") == "poll":  # its recorder saw it wake from a timer and sleep again: waking is not working
        still = f": {polled}" if polled else " (no thread of its own, no process it started)"
        out.append(Fact(hb_src, "poll", f"its main thread sleeps and checks in a loop, while nothing it could wait for "
                        f"moves{still}"))  # fmt: skip
    age = number(hb.get("liveness_age_s"))
    if age is not None and peer_liveness is not None and age > max(FROZEN_MIN_S, 3 * peer_liveness + 1):
        out.append(Fact(hb_src, "gil", f"its liveness thread has not run for {age:.0f} s while its peers' ran "
                        f"{peer_liveness:.1f} s ago (the GIL is held, or the process is stopped)"))  # fmt: skip
    request, ack = integer(hb.get("dump_request")), integer(hb.get("dump_ack"))
    if request is not None and ack is not None and request > ack:
        out.append(Fact(hb_src, "unanswered", "did not answer the dump request"))
    return out


def read_state(bundle: Bundle, rank: int, node: str, rs: Optional[RankStack], ev: JobEvidence,
               peer_liveness: Optional[float], job_entry: dict[str, Any]) -> RankState:  # fmt: skip
    """Every source's facts about one rank, then its classification (classify). `peer_liveness`: the median
    age of the other ranks' liveness threads; `job_entry`: the rank's entry in the manifest's job.local_ranks."""
    hb_raw = bundle.json(L.rank_member(rank, L.HEARTBEAT))
    hb: dict[str, Any] = hb_raw if isinstance(hb_raw, dict) else {}
    pid = integer(hb.get("pid"))
    alive = hb.get("alive") if isinstance(hb.get("alive"), bool) else None
    if job_entry:
        pid = pid if pid is not None else integer(job_entry.get("pid"))
        alive = alive if alive is not None else bool(job_entry.get("alive"))
    excs = exception_records(bundle, rank)
    exc = excs[0] if excs else console_exception(ev, rank)
    facts, exit_code = _end_facts(bundle, rank, hb, alive, pid, ev, exc)
    waiting = str(hb.get("waiting") or "")
    proc = bundle.json(L.process_member(rank, L.PROC))  # parsed once: the facts, the poll, what holds it
    proc = proc if isinstance(proc, dict) else {}
    exiting = rs is not None and at_exit(rs.thread)
    proc_facts, zombie_code = _proc_facts(proc, rank, waiting, exiting)
    facts += proc_facts
    known = bool(proc_facts or hb or proc)
    facts += _stack_facts(bundle, rank, rs, alive, known)
    facts += _fr_facts(rank, ev)
    if rank in ev.console.setup_waits:  # "Waiting in store based barrier to initialize process group for rank: N"
        line = ev.console.setup_waits[rank]
        key = re.search(r"key: (\S+)", line)
        facts.append(Fact(f"{L.CONSOLE_TAIL} (its set-up barrier line)", "waiting", "waits in process-group set-up: "
                          + line[-160:], key.group(1) if key else "set-up", None, "store_based_barrier"))  # fmt: skip
        facts.append(Fact(f"{L.CONSOLE_TAIL} (its set-up barrier line)", "setup", "process-group set-up"))
    polled = describe_waited(proc.get("may_wait_for")) if waiting == "poll" else ""
    facts += _heartbeat_facts(rank, hb, alive, peer_liveness, polled)
    step = integer(hb.get("step"))
    st = classify(rank, str(hb.get("node") or node), pid, facts, str(hb.get("phase") or "unknown"), step)
    if st.where == "poll" and rs is not None and st.detail.endswith("(native frames)"):
        st.detail = f"main thread in {(rs.where or where(rs.thread)).what}"  # the loop is Python's: name its frame
    st.detail += _held_at(proc, st.where)
    st.exiting = exiting
    st.exception = exc
    st.failed_at = number(exc.get("time")) if exc else None
    code = exit_code if exit_code is not None else zombie_code
    if code:
        st.exit_code = code
    return st


def _exit_code(status: str) -> Optional[int]:
    """The code in an exit status, as blackbox's supervisor words it when it reaps a rank ("exited with code 7",
    "died of signal 9 (SIGKILL)") or as _describe_exit does ("exit code 7", "signal 9 (SIGKILL)"); negative: a
    signal."""
    m = re.match(r"(?:exited with )?(?:exit )?code (-?\d+)", status)
    if m:
        return int(m.group(1))
    m = re.match(r"(?:died of )?signal (\d+)", status)
    return -int(m.group(1)) if m else None


def _describe_exit(code: int) -> str:
    if code < 0:
        import signal as _signal

        try:
            return f"signal {-code} ({_signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# How one fact settles a rank's state over the others: how a process ended first, then what the kernel says, then
# what its main thread is doing, then the collective it is stuck in, then the heartbeat — except that a stack that
# says "compute" only because no frame said otherwise (on a GPU the host runs ahead of the device) loses to the
# flight recorder's "enqueued, not completed", to a read the kernel shows it blocked in, and to the phase the job
# declared (`blackbox.phase("data")`).
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
            against = ("data", "checkpoint", "io", "compute", "eval", "behind") if kind == "waiting" else ("waiting",)
            if f.says in against and f.source != decided.source and where_ not in _FINAL:
                st.conflicts.append(f"{f.source} says {f.text}")
        if kind == "waiting":
            wait = decided if decided.group is not None else next((f for f in facts if f.says == "waiting" and
                                                                  f.group is not None), None)  # fmt: skip
            st.group, st.seq = (wait.group, wait.seq) if wait else (None, None)
            st.op = decided.op or (wait.op if wait else None)
            st.setup = first("setup") is not None
        return st

    stack = next((f for f in facts if f.stack and f.says not in ("setup", "reads_data")), None)
    says = stack.says if stack is not None else None
    strong = stack is not None and not stack.weak  # a stack that says where it is, not a fallback to compute
    loose = stack is None or stack.weak or says == "ambiguous"  # no stack, or one that does not settle it
    hb = {f.says: f for f in facts if f.source.endswith(L.HEARTBEAT) and f.says in ("waiting", "data", "checkpoint",
                                                                                    "eval")}  # fmt: skip
    declared = next((hb[p] for p in ("data", "checkpoint", "eval") if p in hb), None)
    fr_wait = next((f for f in facts if f.says == "waiting" and f.group is not None), None)
    exc_wait = next((f for f in facts if f.says == "waiting" and f.source.endswith((P.RANK_EXCEPTIONS, L.CONSOLE_TAIL))
                     and f.group is None), None)  # fmt: skip
    if exc_wait is not None:  # raised a timeout or a lost peer: a victim of whoever did not arrive
        return make("waiting", "collective", exc_wait, "collective")
    for final in _FINAL:
        if final in firsts:
            return make("elsewhere", final, firsts[final], phase)
    if "poll" in firsts and "gil" not in firsts and fr_wait is None and not (strong and says in ("data", "checkpoint")):
        # its recorder saw it sleep on a timer within the last seconds and wake to check, sample after sample: a read,
        # a store's round trip or a kernel wait that one stack or /proc snapshot caught is the loop's check, not a
        # wait of its own (the same job was hang.io, hang.poll or hang.collective by where the snapshot landed)
        checked = stack if stack is not None and says in ("io", "waiting", "compute") else firsts["poll"]
        return make("elsewhere", "poll", checked, "compute")
    if stack is not None and strong and says in ("data", "checkpoint", "io"):
        now = declared.says if says == "io" and declared is not None and declared.says != "eval" else str(says)
        return make("elsewhere", now, stack, now if now != "io" else phase)
    if stack is not None and strong and says == "waiting":
        return make("waiting", "collective", stack, "collective")
    if "kernel" in firsts:
        return make("elsewhere", "kernel", firsts["kernel"], phase)
    if "io" in firsts and loose:  # blocked in a read under user code: waiting for I/O, never computing
        now = declared.says if declared is not None and declared.says != "eval" else (
            "data" if "reads_data" in firsts else "io")  # fmt: skip
        return make("elsewhere", now, firsts["io"], now if now != "io" else phase)
    if fr_wait is not None and (loose or says == "compute"):
        return make("waiting", "collective", fr_wait, "collective")
    if stack is not None and strong and says == "compute":
        return make("elsewhere", "gil" if "gil" in firsts else "compute", firsts.get("gil", stack), "compute")
    if declared is not None and loose:  # the phase the job declared wins over a fallback
        return make("elsewhere", declared.says, declared, declared.says)
    if stack is not None and stack.weak:
        return make("elsewhere", "gil" if "gil" in firsts else "compute", firsts.get("gil", stack), "compute")
    if "gil" in firsts:
        return make("elsewhere", "gil", firsts["gil"], "compute")
    if "waiting" in hb:
        return make("waiting", "collective", hb["waiting"], "collective")
    if "behind" in firsts and stack is not None:  # in backward or a CUDA sync with nothing pending: computing
        return make("elsewhere", "compute", firsts["behind"], "compute")
    decided = stack or first("unanswered") or first("behind") or Fact("", "unknown", "no source says where it is")
    return RankState(rank, node, pid, "unknown", "unknown", decided.text, phase, step, facts=facts)
