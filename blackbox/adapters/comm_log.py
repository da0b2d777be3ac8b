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
    r"NET/IB ?: .*(?:No device|failed|Got completion)|ibv_\w+ failed|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|"
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
_PREFIX = re.compile(r"^\[(?:default)?rank(\d+)\]:", re.IGNORECASE)  # torchrun's / c10's per-rank prefix
_RANK_IN = re.compile(r"\[(?:PG ID (\S+) PG GUID (\S+?)(?:\(([^)]*)\))? )?Rank (\d+)\]")
_WORK = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(\d+))?")
_COUNTERS = re.compile(r"Timeout at NCCL work: (-?\d+), last enqueued NCCL work: (-?\d+), last completed NCCL "
                       r"work: (-?\d+)")  # fmt: skip
_EXC_LINE = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Z][\w]*(?:Error|Exception|Interrupt|Exit|Failure|Timeout)): (.*)$")
_TB_FILE = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
_GLOO_FALLBACK = re.compile(r"Unable to resolve hostname to a \(local\) address|Using the loopback address as "
                            r"fallback", re.IGNORECASE)  # fmt: skip
_REMOTE = re.compile(r"remote=\[?([\w.:\-]+?)\]?:(\d+)|connect \[?([\w.:\-]+?)\]?:(\d+)|\[([\d.]+)\]:(\d+)")
_CLOSED_BY = re.compile(r"Connection closed by localRank (\d+)")
_HOST_RANK = re.compile(r"^(\S+?):(\d+):\d+ \[(\d+)\] NCCL")  # NCCL's "host:pid:tid [localrank] NCCL ..." lines


@dataclass(frozen=True)
class WatchdogTimeout:
    """One rank's NCCL watchdog line: the collective that timed out and, where printed, its group's counters."""

    rank: int
    group: str  # the process group's id as the line names it ("0"), or "" when the line does not say
    group_name: str  # its description ("default_pg"), when printed
    seq: int  # the collective that timed out
    op: str  # ALLREDUCE, BROADCAST, ...
    last_enqueued: Optional[int] = None
    last_completed: Optional[int] = None
    line: str = ""


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
    closed_by: dict[int, str] = field(default_factory=dict)  # NCCL "Connection closed by localRank N": the host
    cuda_errors: list[tuple[Optional[int], str]] = field(default_factory=list)  # (rank if prefixed, the line)


def _rank_of(line: str) -> tuple[Optional[int], str]:
    m = _PREFIX.match(line)
    return (int(m.group(1)), line[m.end() :]) if m else (None, line)


def parse_console(text: str) -> ConsoleFacts:
    """Per-rank facts from the job's output (untrusted text; bounded by the caller)."""
    out = ConsoleFacts()
    tracebacks: dict[Optional[int], list[tuple[str, int, str]]] = {}
    for order, raw in enumerate(text.splitlines()):
        prefixed, line = _rank_of(raw.rstrip())
        body = line.strip()
        if "Watchdog caught collective operation timeout" in body or _COUNTERS.search(body):
            _timeout(out, prefixed, body)
        if _GLOO_FALLBACK.search(body):
            out.hostname_fallback.append(body[:300])
        if NETWORK_SETUP.search(body) and not body.startswith("File "):
            out.network.append(body[:300])
            for m in _REMOTE.finditer(body):
                host, port = next((g for g in m.groups()[0::2] if g), ""), next((g for g in m.groups()[1::2] if g), "")
                if host and f"{host}:{port}" not in out.remote_addresses:
                    out.remote_addresses.append(f"{host}:{port}")
        closed = _CLOSED_BY.search(body)
        host = _HOST_RANK.match(body)
        if closed and host:
            out.closed_by.setdefault(int(closed.group(1)), host.group(1))
        if CUDA_ERROR.search(body) and "NCCL INFO" not in body:
            out.cuda_errors.append((prefixed, body[:300]))
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


def _timeout(out: ConsoleFacts, prefixed: Optional[int], body: str) -> None:
    who = _RANK_IN.search(body)
    pg, _, desc, in_group = who.groups() if who else (None, None, None, None)
    # the "[rankN]:" prefix is the global rank; "[... Rank N]" is the rank in its group (the same in the default one)
    rank = prefixed if prefixed is not None else int(in_group) if in_group is not None and pg in (None, "0") else None
    if rank is None:
        return
    work, counters = _WORK.search(body), _COUNTERS.search(body)
    group = pg or ""
    for i, t in enumerate(out.timeouts):  # the counters line completes the watchdog line of the same rank and group
        if t.rank == rank and t.group == group and (counters is not None) != (t.last_enqueued is not None):
            seq = t.seq if work is None else int(work.group(1))
            out.timeouts[i] = WatchdogTimeout(rank, group, t.group_name or desc or "", seq, t.op if work is None else
                                              work.group(2), int(counters.group(2)) if counters else t.last_enqueued,
                                              int(counters.group(3)) if counters else t.last_completed,
                                              t.line)  # fmt: skip
            return
    if work is None and counters is None:
        return
    seq = int(work.group(1)) if work else int(counters.group(1))  # type: ignore[union-attr]
    out.timeouts.append(WatchdogTimeout(rank, group, desc or "", seq, work.group(2) if work else "collective",
                                        int(counters.group(2)) if counters else None,
                                        int(counters.group(3)) if counters else None, body[:400]))  # fmt: skip
