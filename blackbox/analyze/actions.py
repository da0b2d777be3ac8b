"""Next actions for a verdict: concrete checks and commands chosen for the category and phase, most likely
first, filled in with what the bundle says (pids, shapes, paths, the snapshot to open). Pure; imports the
stdlib and the report model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .model import RankRow, Verdict


@dataclass
class Facts:
    """What the actions can point at, gathered by the analyzer."""

    node: str
    by_rank: dict[int, RankRow]
    last_batch: dict[int, str] = field(default_factory=dict)  # rank -> "batch[0] [4, 8] float32, ..."
    snapshots: dict[int, str] = field(default_factory=dict)  # rank -> bundle member of its memory snapshot
    reserved_unallocated: Optional[str] = None  # from the OOM message: fragmentation
    stuck_workers: dict[int, list[int]] = field(default_factory=dict)  # rank -> DataLoader worker pids
    checkpoint_frame: Optional[str] = None
    missing_collective: Optional[str] = None  # "all_reduce #5 (group default_pg)"
    mismatch: Optional[str] = None  # "rank 1 called broadcast at train.py:74; ranks 0, 2-7 called all_reduce ..."
    exception: Optional[str] = None  # "ValueError: bad batch at train.py:88"
    exception_path: Optional[str] = None  # a file the exception names: "/data/shard-0003.bin"
    kernel_oom: bool = False
    disk_free: Optional[str] = None
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> the host it lives on (coordination, merged view)
    blocked_io: dict[int, Blocked] = field(default_factory=dict)  # rank -> the I/O or process its main thread waits for
    network_lines: list[str] = field(default_factory=list)  # what the console said about the network's set-up
    remote_addresses: list[str] = field(default_factory=list)  # the addresses those lines name
    # this node's side of a network set-up: what its hostname resolves to, its interfaces, the *_SOCKET_IFNAME set
    hostname_note: Optional[str] = None
    queued: list[int] = field(default_factory=list)  # ranks whose pending collective waits behind their GPU's work
    job_ended: bool = False  # blackbox ended the job once this bundle was taken (`--on-stall kill`): no live pids
    no_start: list[str] = field(default_factory=list)  # the interpreter could not start the script: what it printed
    preempted_node: Optional[str] = None  # "node 0 (host)": another node being ended from outside came before this


@dataclass(frozen=True)
class Blocked:
    """What a rank's main thread waits for, outside the job: a system call or another process."""

    text: str  # "main thread blocked in read() of fd 5, /data/train.bin (a file on nfs4)"
    waited: str = ""  # another process, in the words that follow "waits for": "its child `cat` (pid 4121), …"
    by_thread: bool = False  # what it waits for is a thread of its own (`waited` names it), not a process


@dataclass
class _At:
    """Where the first suspect is, in the words every action uses."""

    ranks: str  # "1, 3"
    first: Optional[int]
    host: str  # the host of the first suspect
    where: str  # "rank 1 on node7", "ranks 0, 1 on node7", "rank 0 on node3 and rank 1 on node7"; "every rank on
    # node7" when none is named
    live_pids: list[str]  # the live suspects' pids on `host`
    everyone: bool = False  # the suspects are every rank of the bundle (none stands out)


def next_actions(v: Verdict, facts: Facts) -> list[str]:
    first = v.suspect_ranks[0] if v.suspect_ranks else None
    host = _host(first, facts) if first is not None else facts.node
    ranks = ", ".join(map(str, v.suspect_ranks)) or "?"
    by_host: dict[str, list[str]] = {}  # the suspects on each host, the first suspect's host first
    for r in v.suspect_ranks:
        by_host.setdefault(_host(r, facts), []).append(str(r))
    where = " and ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(rs)} on {h}"
                         for h, rs in by_host.items()) or f"every rank on {host}"  # fmt: skip
    # a pid is only meaningful on its own host
    live_pids = [str(facts.by_rank[r].pid) for r in v.suspect_ranks if r in facts.by_rank and facts.by_rank[r].alive
                 and _host(r, facts) == host]  # fmt: skip
    everyone = len(v.suspect_ranks) > 1 and set(v.suspect_ranks) == set(facts.by_rank)
    at = _At(ranks, first, host, where, live_pids, everyone)
    cat = v.category
    if cat == "hang.collective" and facts.mismatch:
        actions = [f"The ranks called different collectives: {facts.mismatch}. Find the rank-dependent branch or the "
                   "skipped call before those lines; `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks every collective's "
                   "signature across ranks."]  # fmt: skip
    else:
        actions = _BY_CATEGORY[cat](at, facts) if cat in _BY_CATEGORY else []
    if cat.startswith("hang.") and cat not in ("hang.network_setup", "hang.network"):
        if live_pids and not facts.job_ended:
            actions.append(f"While it hangs: `py-spy dump --native --pid {' --pid '.join(live_pids)}` on {host}.")
        actions.append("Rerun with `blackbox run --on-stall keep` to keep the job alive for a debugger on "
                       + (f"rank {ranks}." if v.suspect_ranks else "its ranks."))  # fmt: skip
    if cat == "ok" and v.suspect_ranks:
        actions.append(f"R{at.where[1:]} is the slowest (a straggler): compare its data, its node's load and its GPU's "
                       "temperature and clocks with the others'; it sets every collective's pace.")  # fmt: skip
    if not actions:
        actions.append("Compare steps and phases across ranks; the slowest rank is the first to look at.")
    if facts.preempted_node:  # what failed here is that ending's consequence: its cause is the first thing to read
        actions.insert(0, f"Start with why {facts.preempted_node} was ended (its own bundle, "
                       "taken at its preStop hook or SIGTERM, and the scheduler's events): this node's ranks lost "
                       "their peers after it; the actions below are about this node's side only.")  # fmt: skip
    return actions


def _host(rank: int, facts: Facts) -> str:
    row = facts.by_rank.get(rank)
    return row.node if row else facts.hosts.get(rank, facts.node)


def _oom(at: _At, facts: Facts) -> list[str]:
    batch = facts.last_batch.get(at.first) if at.first is not None else None
    out = [f"Lower the per-rank batch size or sequence length on {at.where}"
           + (f": its last batch was {batch}." if batch else ".")]  # fmt: skip
    snap = facts.snapshots.get(at.first) if at.first is not None else None
    if snap:
        out.append(f"Open the memory snapshot: extract `{snap}` and run `python -m torch.cuda._memory_viz trace_plot "
                   f"{snap.rsplit('/', 1)[-1]} -o memory.html`, or drop it on https://pytorch.org/memory_viz (it shows "
                   "who allocated what).")  # fmt: skip
    else:
        out.append("Rerun with `blackbox run --cuda-memory-history 100000` so the next OOM leaves a memory snapshot "
                   "with the allocating stacks.")  # fmt: skip
    frag = f" ({facts.reserved_unallocated} was reserved but unallocated)" if facts.reserved_unallocated else ""
    out.append(f"Try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to reduce fragmentation{frag}.")
    return out


def _collective(at: _At, facts: Facts) -> list[str]:
    pids = f"; while it runs: `py-spy dump --native --pid {' --pid '.join(at.live_pids)}`." if at.live_pids else "."
    if at.first is not None and at.first in facts.queued:
        first = (
            f"Look at {at.where}: its GPU still runs the work queued before the collective (a long or hung "
            f"kernel): `nvidia-smi` on {at.host} shows it busy, `py-spy dump --native` the host side{pids}"
        )
    elif facts.missing_collective or not (at.everyone or at.first is None):
        what = f" never entered {facts.missing_collective}" if facts.missing_collective else " did not arrive"
        first = f"Look at {at.where}: it{what}. Its stack is in the bundle{pids}"
    else:  # every rank arrived (or none is named): which one's GPU is behind is not in the flight recorder
        first = (f"No rank stands out: compare the stacks of {at.where} in the bundle{pids[:-1]}; to see whose "
                 "collective never started on the GPU, rerun with `TORCH_NCCL_ENABLE_TIMING=1` (NCCL's flight "
                 "recorder then keeps start times; it adds CUDA events to every collective).")  # fmt: skip
    return [first,
            "Check that every rank issues the same collectives in the same order (a rank-dependent branch, an early "
            "`break`, a skipped eval): rerun with `TORCH_DISTRIBUTED_DEBUG=DETAIL`.",
            f"Check {at.host}'s network and GPU health (NCCL_DEBUG=INFO, `dmesg -T | grep -i xid`)."]  # fmt: skip


def _cuda(at: _At, facts: Facts) -> list[str]:
    return [f"Look for NVIDIA Xid errors on {at.host}: `dmesg -T | grep -i xid` (node/kernel-messages.txt in the "
            "bundle, where readable).",
            f"Check the GPU of {at.where}: `nvidia-smi -q` (ECC errors, retired pages, throttling).",
            "Rerun with `CUDA_LAUNCH_BLOCKING=1` to find the kernel that failed (an NCCL `unhandled cuda error` is a "
            "CUDA fault on that GPU, not the network)."]  # fmt: skip


def _exception(at: _At, facts: Facts) -> list[str]:
    out = []
    if facts.exception_path:
        path = facts.exception_path
        out.append(f"Check `{path}`, the file named in the exception of {at.where}: `ls -l {path}` as the job's user "
                   "(permissions, existence, the filesystem).")  # fmt: skip
    out.append(f"Read the exception of {at.where}" + (f": {facts.exception}." if facts.exception else ".")
               + " The traceback is in ranks/<rank>/exceptions.jsonl and the console tail.")  # fmt: skip
    out.append("The other ranks' errors (connection reset, timeouts) are consequences: they lost a peer.")
    return out


def _signal(at: _At, facts: Facts) -> list[str]:
    out = [f"The kernel killed {at.where} (OOM killer): check the node's memory."] if facts.kernel_oom else []
    out.append(f"Read the fatal.txt (faulthandler) of {at.where} for a segfault or abort, and the console tail; check "
               f"`dmesg -T | tail -50` on {at.host} for the OOM killer.")  # fmt: skip
    return out


def _data(at: _At, facts: Facts) -> list[str]:
    workers = facts.stuck_workers.get(at.first) if at.first is not None else None
    io = facts.blocked_io.get(at.first) if at.first is not None else None
    blocked = io.text if io is not None else None
    out = [f"Check what {at.where} reads" + (f" ({blocked})" if blocked else ": the dataset shard or file in its "
           "`__getitem__` or `get_batch` frame") + ": its permissions and the filesystem or storage service (a hung "
           "network mount or object store blocks a read forever)."]  # fmt: skip
    if workers:
        out.append(f"Its DataLoader worker(s) {', '.join(map(str, workers))} hold the stuck read: "
                   f"`py-spy dump --pid {workers[0]}`.")  # fmt: skip
    out.append("Give reads a timeout so a stuck one raises instead of hanging: `DataLoader(timeout=)`, the storage "
               "client's read timeout (boto3 `read_timeout`, fsspec's `timeout`); check `num_workers`.")  # fmt: skip
    return out


def _io(at: _At, facts: Facts) -> list[str]:
    io = facts.blocked_io.get(at.first) if at.first is not None else None
    blocked = io.text if io is not None else None
    if io is not None and io.waited and io.by_thread:
        return [f"R{at.where[1:]} waits for {io.waited}. That thread's stack is in the bundle (py-spy, every "
                "thread): check the service at the other end (is it up, does it read what it is sent?).",
                "Give the client a deadline so that a peer that stops answering raises instead of hanging (the "
                "client's `read_timeout`/`connect_timeout`, socket `settimeout`), and join such a thread with a "
                "timeout, or make it a daemon, where the job must end without it."]  # fmt: skip
    if io is not None and io.waited:
        return [f"R{at.where[1:]} waits for {io.waited}. Look at that process (`py-spy dump --pid`, "
                "`cat /proc/PID/wchan`): a tool that reads its standard input or a terminal waits for an answer no "
                "one gives (a password or confirmation prompt).",
                "Run tools without a terminal and with a deadline: `subprocess.run(..., stdin=subprocess.DEVNULL, "
                "timeout=...)`, the tool's non-interactive flag, credentials from the environment."]  # fmt: skip
    return [f"R{at.where[1:]} waits for I/O" + (f": {blocked}" if blocked else "") + ". Check that file's filesystem "
            "(`df -h`, `mount | grep` its mount point, a stale NFS/Lustre/FUSE mount) or the service at the other end "
            "of the socket (is it up, reachable from this host?).",
            "Give the read a timeout so it raises instead of hanging (socket `settimeout`, the client's "
            "`read_timeout`)."]  # fmt: skip


def _network(at: _At, facts: Facts) -> list[str]:
    said = f" The console says: `{facts.network_lines[0][:160]}`." if facts.network_lines else ""
    tried = facts.remote_addresses
    loopback = any(a.startswith("127.") for a in tried)
    addrs = ""
    if tried:
        addrs = (f" The address{'es' if len(tried) > 1 else ''} the ranks tried: {', '.join(f'`{a}`' for a in tried)}"
                 + (" — loopback: a peer advertised its own host as 127.0.0.1." if loopback else "."))  # fmt: skip
    if any("Duplicate GPU detected" in line for line in facts.network_lines):
        return [
            f"R{at.where[1:]} share one GPU (NCCL: `Duplicate GPU detected`).{said} Each rank must select its own "
            "device before the process group is used: `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))`; "
            "check `CUDA_VISIBLE_DEVICES` per task (a launcher or scheduler that hides all but one GPU from every "
            "task, or gives every task the same list) and `--nproc-per-node` against the GPUs of the node."
        ]
    host = f" {facts.hostname_note}." if facts.hostname_note else ""
    return [f"R{at.where[1:]} could not connect to its peers while creating the process group.{said}{addrs}{host}",
            "Each rank advertises the address its hostname resolves to (gloo) or the interface NCCL picks: on every "
            "node run `getent hosts $(hostname)` and `ip -br addr`; if the hostname resolves to 127.0.x.x or to an "
            "address the other nodes cannot reach, set `GLOO_SOCKET_IFNAME=<iface>` (gloo) and "
            "`NCCL_SOCKET_IFNAME=<iface>` (NCCL) to the interface that carries the job's traffic, or fix /etc/hosts "
            "or DNS.",
            "Check MASTER_ADDR:MASTER_PORT is reachable from every node (`nc -zv ADDR PORT`, firewalls); for NCCL "
            "rerun with `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` to see the interface and transport it picked; "
            "on InfiniBand/RoCE check `ibv_devinfo`, `NCCL_IB_HCA`, or try `NCCL_IB_DISABLE=1`."]  # fmt: skip


def _lost_host(at: _At, facts: Facts) -> list[str]:
    if at.first is None:  # every node's bundle given: every rank alive, waiting, the hosts cut apart
        return ["Check the network between the job's hosts (each rank's host is in the ranks table): from each host, "
                "`ping` the others; the interfaces' error counters (`ip -s link`, `ethtool -S <nic>`), the switch "
                "ports, `ibstat` on InfiniBand; NCCL_DEBUG=INFO names the interface NCCL uses."]  # fmt: skip
    here = facts.node
    return [f"From {here}, check that {at.host} answers: `ping {at.host}`, `ssh {at.host} uptime`. A host that answers "
            "nothing is down: its console, its BMC or the scheduler's node state says why (a kernel panic, power, an "
            "Xid that took the node).",
            f"If it answers, the network between {here} and {at.host} lost the job's traffic: the interfaces' error "
            "counters (`ip -s link`, `ethtool -S <nic>`), the switch port, `ibstat` on InfiniBand; NCCL_DEBUG=INFO "
            "names the interface NCCL uses.",
            f"{at.host}'s side is in its blackbox run directory (bundles/): give every node's bundle to `blackbox "
            "report` to merge them."]  # fmt: skip


def _simple(text: str) -> Callable[[_At, Facts], list[str]]:
    return lambda at, facts: [text.format(at=at, R="R" + at.where[1:], where=at.where, host=at.host)]


def _checkpoint(at: _At, facts: Facts) -> list[str]:
    where = f" (at {facts.checkpoint_frame})" if facts.checkpoint_frame else ""
    disk = f"; free space where the run writes: {facts.disk_free}" if facts.disk_free else ""
    return [f"Check the checkpoint path {at.where} writes to{where}: `df -h PATH`, the filesystem's health, a FIFO or "
            f"a stale network mount{disk}."]  # fmt: skip


def _stopped(at: _At, facts: Facts) -> list[str]:
    pids = " ".join(at.live_pids) or "PID"
    return [f"R{at.where[1:]} is stopped (SIGSTOP, job control, or a debugger attached): find who stopped it (`ps -o "
            f"pid,stat,tracerpid -p {pids}`; `grep TracerPid /proc/{pids.split()[0]}/status`); `kill -CONT {pids}` "
            "resumes it."]  # fmt: skip


_BY_CATEGORY: dict[str, Callable[[_At, Facts], list[str]]] = {
    "crash.oom": _oom, "crash.comm_timeout": _collective, "hang.collective": _collective, "crash.cuda_error": _cuda,
    "crash.exception": _exception, "crash.signal": _signal, "hang.data_loading": _data, "hang.io": _io,
    "crash.network_setup": _network, "hang.network_setup": _network, "hang.checkpoint_io": _checkpoint,
    "hang.stopped": _stopped, "hang.network": _lost_host,
    "crash.host_oom": _simple("The kernel's OOM killer ended {where}: check the node's memory (node.json) and "
                              "host-side memory per rank (DataLoader workers, pinned memory, dataset caches); `dmesg "
                              "-T | grep -i -e oom -e 'killed process'` on the node."),
    "hang.kernel": _simple("{R} is in an uninterruptible sleep in the kernel: its wchan (ranks/<rank>/proc.json) names "
                           "the wait — a hung network filesystem (nfs, lustre), a device or driver; `dmesg -T | tail "
                           "-50` and the mount's health on the node."),
    "crash.exit": lambda at, facts: [
        f"R{at.where[1:]} could not start the script: the console says `{facts.no_start[0]}`. Check the script's path "
        "or module name (relative to the directory the launcher runs in, on every node)."] if facts.no_start else [
        f"R{at.where[1:]} exited without raising an exception: look for `sys.exit`/`os._exit` or a library that exits "
        "(a rank-dependent `break` or `return` out of the training loop, a native library's exit()), and at its "
        "last lines in the console tail.",
        "Every rank must run the same number of steps and collectives: a rank that leaves early leaves the others "
        "waiting in the next collective (they then fail with 'connection closed')."],
    "hang.poll": _simple("{R} sleeps and checks in a loop (its stack in the bundle says where): find what it waits "
                         "for — a lock file another process holds (`fuser -v FILE` on {host}; a stale `.lock` of a "
                         "model or dataset cache), a marker file or a store key that no rank wrote — and why it "
                         "never came."),
    "hang.compute": _simple("Find the loop or native call {where} is in (its stack in the bundle), and what differs on "
                            "that rank: its data, a rank-dependent branch."),
}  # fmt: skip
