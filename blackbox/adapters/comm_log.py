"""The words of NCCL, gloo, c10d and the CUDA runtime, as they reach an exception or the job's output: what kind of
failure an error message is (a collective timeout, a lost peer, a CUDA fault, a network set-up failure, an OOM),
and what the job's console says per rank — the NCCL watchdog's timeouts with their sequence numbers and its
"last enqueued / last completed" counters (the flight recorder's `pg_status`, in words), the last line of each
rank's traceback, gloo's hostname fallback and NCCL's network warnings. Imports the stdlib only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

# --- what an error message is ---------------------------------------------------------------------------------
# A CUDA fault, also when NCCL reports it (`DistBackendError: NCCL error ... unhandled cuda error`).
CUDA_ERROR = re.compile(
    r"CUDA error|unhandled cuda error|ncclUnhandledCudaError|CUBLAS_STATUS|cuDNN error|CUDNN_STATUS|"
    r"illegal memory access|device-side assert|misaligned address|an illegal instruction|uncorrectable ECC|"
    r"Xid \d+|CUDA driver error|cudaError",
    re.IGNORECASE,
)
# The job could not set up its communication: rendezvous, gloo's full mesh, NCCL's bootstrap, a store connection,
# a name that does not resolve, an interface or IB device NCCL cannot use.
NETWORK_SETUP = re.compile(
    r"connectFullMesh|Gloo connectFullMesh failed|DistNetworkError|client socket has (?:failed|timed out)[^.]*"
    r"(?:connect|while trying)|Unable to resolve hostname|unable to find (?:an )?(?:address|interface)|"
    r"Bootstrap ?: no socket interface found|NET/Socket ?: .*(?:no usable|unable|not found)|socketStartConnect|"
    r"WARN NET/IB ?: .*(?:No device|failed|Got completion)|ibv_\w+ failed|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|"
    r"pair\.cc:\d+\] connect \[|Duplicate GPU detected|"
    r"RendezvousConnectionError|RendezvousTimeoutError|EADDRINUSE|address already in use|"
    r"ncclCommInitRank failed|ncclSystemError.*(?:init|bootstrap)|unhandled system error.*(?:init|Comm)|"
    r"getaddrinfo|Name or service not known|No route to host|Network is unreachable",
    re.IGNORECASE,
)
# A collective (or a set-up barrier) gave up waiting for its peers: the raiser is a victim.
COMM_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out|"
    r"Timed out waiting \d+ ?ms for (?:recv|send) operation|Some NCCL operations have failed or timed out|"
    r"failed to pass monitoredBarrier|Timed out initializing process group in store based barrier|"
    r"watchdog got stuck for \d+ seconds|Timeout at NCCL work|NCCL timeout",
    re.IGNORECASE,
)
# The same said loosely ("... collective operation timed out"): checked after a lost peer, whose messages often
# carry the work's `Timeout(ms)=` too.
LOOSE_TIMEOUT = re.compile(r"(?:collective|NCCL|Gloo|c10d|ProcessGroup\w*|barrier|operation)[^\n]{0,120}timed out",
                           re.IGNORECASE)  # fmt: skip
# Time-outs that are not a collective's: a DataLoader's `timeout=`, a storage or HTTP client's read.
NOT_COMM_TIMEOUT = re.compile(r"DataLoader timed out|DataLoader worker \(pid|ReadTimeout|ConnectTimeout|"
                              r"urllib3|botocore|requests\.exceptions|socket\.timeout", re.IGNORECASE)  # fmt: skip
# A peer went away: the raiser lost it (a consequence, not a cause).
PEER_LOSS = re.compile(
    r"Connection (?:closed|reset) by (?:peer|remote peer|localRank)|Broken pipe|remote process exit|"
    r"communicator was aborted|NCCL communicator .* aborted|ncclRemoteError|remote process exiting prematurely|"
    r"Socket closed|Connection refused|Connection reset|peer (?:closed|reset)|ProcessGroupNCCL is aborted|"
    r"NCCL has been aborted|has been aborted by|process group (?:was|has been) aborted",
    re.IGNORECASE,
)
# NCCL's system errors: the network's set-up when they come out of process-group creation (or the first
# collective, which creates NCCL's communicator), a lost peer otherwise.
SYSTEM_ERROR = re.compile(r"unhandled system error|ncclSystemError", re.IGNORECASE)
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|\bout of memory\b", re.IGNORECASE)


def error_kind(text: str, in_setup: bool = False) -> Optional[str]:
    """The kind of failure an error text (`Type: message`) is: cuda_error, network_setup, comm_timeout, peer_loss,
    oom, or None (the rank's own error). `in_setup`: it came out of process-group set-up (its traceback), where a
    refused or reset connection is the network's set-up, not a lost peer."""
    if OOM.search(text):
        return "oom"
    if CUDA_ERROR.search(text):
        return "cuda_error"
    if NETWORK_SETUP.search(text) or (in_setup and (PEER_LOSS.search(text) or SYSTEM_ERROR.search(text) or (
            "timed out" in text.lower() and "store based barrier" not in text))):  # fmt: skip
        return "network_setup"
    if NOT_COMM_TIMEOUT.search(text):
        return None
    if COMM_TIMEOUT.search(text):
        return "comm_timeout"
    if PEER_LOSS.search(text) or SYSTEM_ERROR.search(text):
        return "peer_loss"
    if LOOSE_TIMEOUT.search(text):
        return "comm_timeout"
    return None


# --- the console, per rank ------------------------------------------------------------------------------------
_PREFIX = re.compile(r"^(?:\S+: )?\[(?:default)?rank(\d+)\]:", re.IGNORECASE)  # torchrun's / c10's per-rank prefix
# "[Rank 3]", "[PG 0 Rank 2]", "[PG 0 (default_pg) Rank 12]", "[PG ID 0 PG GUID 0(default_pg) Rank 2]", "[PG ID 2 PG
# GUID 9 Rank 4]": the process group's id and name where printed, and the rank in that group
_RANK_IN = re.compile(r"\[(?:PG (?:ID )?(\d+)(?: PG GUID \S+?)?\s*(?:\(([^)]*)\))? )?Rank (\d+)\]")
_WORK = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(\d+))?")
_COUNTERS = re.compile(r"(?:Timeout at NCCL work|detected by watchdog at work|at work sequence id):? (-?\d+),? "
                       r"(?:PG status: )?last enqueued (?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: "
                       r"(-?\d+)")  # fmt: skip
_DUMP_SIGNAL = re.compile(r"Received a dump signal due to a collective timeout from\s+rank (\d+).*?Last enqueued NCCL "
                          r"work: (-?\d+), last completed NCCL work: (-?\d+)", re.IGNORECASE)  # fmt: skip
_MISMATCH = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+)"
    r"(?:, TensorShape=(\[[^\]]*\]))?.*?but Rank (\d+) is running collective: "
    r"CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+)(?:, TensorShape=(\[[^\]]*\]))?"
)
_STORE_BARRIER = re.compile(r"Waiting in store based barrier to initialize process group for rank: (\d+), key: (\S+) "
                            r"\(world_size=(\d+), (?:worker_count|num_workers_joined)=(\d+)")  # fmt: skip
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device (\w+)")
_EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Z][\w]*(?:Error|Exception|Interrupt|Exit|Failure|Timeout)): (.*)$")
_TB_FILE = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
# What the interpreter prints when it cannot start a rank's script (no traceback, no exception of the rank's own)
_NO_START = re.compile(r"^(?!\S*(?:Error|Exception|Warning):)\S{1,300}: (?:can't open file '[^']{0,300}': "
                       r"\[Errno \d+\] .{0,80}|No module named \S{1,200}$|Error while finding module specification "
                       r"for .{0,200})")  # fmt: skip
_GLOO_FALLBACK = re.compile(r"Unable to resolve hostname to a \(local\) address|Using the loopback address as "
                            r"fallback", re.IGNORECASE)  # fmt: skip
_REMOTE = re.compile(r"remote=\[?([\w.:\-]+?)\]?:(\d+)|connect \[([\w.:\-]+?)\]:(\d+)|peer ([\d.]+)<(\d+)>|"
                     r"Connect to ([\d.]+)<(\d+)>")  # fmt: skip
# NCCL's and gloo's lines that say a connection could not be set up (INFO lines that merely list what NCCL tried,
# "NET/IB : No device found", are not failures: only WARN lines and errors count)
_SETUP_LINE = re.compile(r"NCCL WARN .*(?:NET/|Bootstrap|socket|Connect|ibv_|IB)|pair\.cc:\d+\] connect \[|"
                         r"connectFullMesh|Duplicate GPU detected|"
                         r"client socket has (?:failed|timed out)|DistNetworkError|No socket interface found",
                         re.IGNORECASE)  # fmt: skip


@dataclass(frozen=True)
class WatchdogTimeout:
    """One rank's word on a collective that timed out (the NCCL watchdog's lines): which, in which group, and where
    printed, the group's counters (the flight recorder's `pg_status`, in words)."""

    rank: int
    group: str  # the process group's id as the line names it ("0"), or "" when the line does not say
    group_name: str  # its description ("default_pg"), when printed
    seq: int  # the collective that timed out
    op: str  # ALLREDUCE, BROADCAST, ...
    last_enqueued: Optional[int] = None
    last_completed: Optional[int] = None
    line: str = ""
    numel: Optional[int] = None  # NumelIn: two ranks with different sizes at one number are not in the same call


@dataclass(frozen=True)
class ConsoleException:
    rank: int
    type: str
    message: str
    order: int  # its place in the console: earlier lines come first
    traceback: tuple[tuple[str, int, str], ...] = ()  # (file, line, function), outermost first


@dataclass
class ConsoleFacts:
    timeouts: list[WatchdogTimeout] = field(default_factory=list)
    exceptions: list[ConsoleException] = field(default_factory=list)  # the last line of each rank's traceback
    hostname_fallback: list[str] = field(default_factory=list)  # gloo fell back to loopback: the lines
    network: list[str] = field(default_factory=list)  # set-up failures: the lines (connectFullMesh, NCCL WARN NET)
    remote_addresses: list[str] = field(default_factory=list)  # the addresses those lines name ("127.0.0.1:29500")
    cuda_errors: list[tuple[Optional[int], str]] = field(default_factory=list)  # (rank if known, the line)
    # TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprints: (seq, {rank: "BROADCAST [1]"}) per mismatch it reported
    mismatches: list[tuple[int, dict[int, str]]] = field(default_factory=list)
    setup_waits: dict[int, str] = field(default_factory=dict)  # rank -> the set-up barrier it waits in (the line)
    duplicate_gpu: list[int] = field(default_factory=list)  # ranks NCCL found on one GPU
    no_start: list[str] = field(default_factory=list)  # the interpreter could not start the script: its lines


def _rank_of(line: str) -> tuple[Optional[int], str]:
    m = _PREFIX.match(line)
    return (int(m.group(1)), line[m.end() :]) if m else (None, line)


def _who(prefixed: Optional[int], body: str) -> tuple[Optional[int], str, str]:
    """(global rank, group id, group name) a line speaks for: the "[rankN]:" prefix is the global rank; "[PG g Rank
    N]" is the rank in group g — the same in the default group."""
    who = _RANK_IN.search(body)
    pg, desc, in_group = who.groups() if who else (None, None, None)
    rank = prefixed if prefixed is not None else int(in_group) if in_group is not None and pg in (None, "0") else None
    return rank, pg or "", desc or ""


def parse_console(text: str) -> ConsoleFacts:
    """Per-rank facts from the job's output (untrusted text; bounded by the caller). Lines from several ranks may be
    interleaved, even spliced into one another: each fact is read from what one line holds."""
    out = ConsoleFacts()
    tracebacks: dict[Optional[int], list[tuple[str, int, str]]] = {}
    lines = text.splitlines()
    for order, raw in enumerate(lines):
        prefixed, line = _rank_of(raw.rstrip())
        body = line.strip()
        if "Watchdog caught collective operation timeout" in body and "WorkNCCL" not in body and order + 1 < len(
                lines):  # the work on the next line, as some logs wrap it  # fmt: skip
            body += " " + _rank_of(lines[order + 1].strip())[1].strip()
        _work_facts(out, prefixed, body)
        _setup_facts(out, prefixed, body)
        if CUDA_ERROR.search(body) and "NCCL INFO" not in body and not body.startswith(("File ", "frame #")):
            out.cuda_errors.append((_who(prefixed, body)[0], body[:300]))
        f = _TB_FILE.match(line)
        if f:
            tracebacks.setdefault(prefixed, []).append((f.group(1), int(f.group(2)), f.group(3).strip()))
            continue
        if body.startswith("Traceback (most recent call last)"):
            tracebacks[prefixed] = []
            continue
        e = _EXC_LINE.match(body)
        if e and prefixed is not None and not any(x.rank == prefixed for x in out.exceptions):
            out.exceptions.append(ConsoleException(prefixed, e.group(1), e.group(2)[:1000], order,
                                                   tuple(tracebacks.pop(prefixed, []))))  # fmt: skip
    return out


def _work_facts(out: ConsoleFacts, prefixed: Optional[int], body: str) -> None:
    """The NCCL watchdog's lines: a work that timed out, its group's counters, a peer's dump signal; and DETAIL's
    mismatched fingerprints."""
    m = _MISMATCH.search(body)
    if m:
        seq = int(m.group(2))
        calls = {int(m.group(1)): f"{m.group(3)} {m.group(4) or ''}".strip(),
                 int(m.group(5)): f"{m.group(7)} {m.group(8) or ''}".strip()}  # fmt: skip
        if not any(s == seq and c == calls for s, c in out.mismatches):
            out.mismatches.append((seq, calls))
        return
    work, counters, signal = _WORK.search(body), _COUNTERS.search(body), _DUMP_SIGNAL.search(body)
    if not (work or counters or signal) or "Exception raised from" in body:
        return
    rank, group, desc = _who(prefixed, body)
    if rank is None:
        return
    if signal:  # the rank whose watchdog fired first is a waiter too: it timed out on the same collective
        _add(out, WatchdogTimeout(int(signal.group(1)), group, desc, int(signal.group(2)), "collective",
                                  line=body[:400]))  # fmt: skip
        _add(out, WatchdogTimeout(rank, group, desc, int(signal.group(2)), "collective", int(signal.group(2)),
                                  int(signal.group(3)), body[:400]))  # fmt: skip
        return
    seq = int(work.group(1)) if work else int(counters.group(1))  # type: ignore[union-attr]
    enqueued = int(counters.group(2)) if counters else None
    completed = int(counters.group(3)) if counters else None
    numel = int(work.group(3)) if work and work.group(3) else None
    _add(out, WatchdogTimeout(rank, group, desc, seq, work.group(2) if work else "collective", enqueued, completed,
                              body[:400], numel))  # fmt: skip


def _add(out: ConsoleFacts, t: WatchdogTimeout) -> None:
    """One rank's facts, merged with what its other lines said about the same group (a line that names no group
    speaks for the one another line names)."""
    for i, old in enumerate(out.timeouts):
        if old.rank == t.rank and (old.group == t.group or "" in (old.group, t.group)):
            out.timeouts[i] = WatchdogTimeout(
                t.rank, old.group or t.group, old.group_name or t.group_name, min(old.seq, t.seq),
                old.op if old.op != "collective" else t.op,
                old.last_enqueued if old.last_enqueued is not None else t.last_enqueued,
                old.last_completed if old.last_completed is not None else t.last_completed,
                old.line or t.line, old.numel if old.numel is not None else t.numel,
            )  # fmt: skip
            return
    out.timeouts.append(t)


def _setup_facts(out: ConsoleFacts, prefixed: Optional[int], body: str) -> None:
    """Lines that say the job's communication could not be set up, the addresses they name, gloo's loopback
    fallback, ranks waiting in a set-up barrier, and ranks NCCL found on one GPU."""
    if _GLOO_FALLBACK.search(body):
        out.hostname_fallback.append(body[:300])
    if _NO_START.search(body) and body[:300] not in out.no_start and not body.startswith(("File ", "Traceback")):
        out.no_start.append(body[:300])
    barrier = _STORE_BARRIER.search(body)
    if barrier:
        out.setup_waits.setdefault(int(barrier.group(1)), body[:300])
    dup = _DUPLICATE_GPU.search(body)
    if dup:
        out.duplicate_gpu = sorted(set(out.duplicate_gpu) | {int(dup.group(1)), int(dup.group(2))})
    if _SETUP_LINE.search(body) and not body.startswith("File "):
        if body[:300] not in out.network:
            out.network.append(body[:300])
        for m in _REMOTE.finditer(body):
            host = next((g for g in m.groups()[0::2] if g), "")
            port = next((g for g in m.groups()[1::2] if g), "")
            if host and f"{host}:{port}" not in out.remote_addresses:
                out.remote_addresses.append(f"{host}:{port}")
