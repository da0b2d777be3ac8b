"""Next actions for a verdict: concrete checks and commands chosen for the category and phase, most likely
first, filled in with what the bundle says (pids, shapes, paths, the snapshot to open). Pure; imports the
stdlib and the report model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

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


def next_actions(v: Verdict, facts: Facts) -> list[str]:
    ranks = ", ".join(map(str, v.suspect_ranks)) or "?"
    first = v.suspect_ranks[0] if v.suspect_ranks else None
    row = facts.by_rank.get(first) if first is not None else None
    live_pids = [str(facts.by_rank[r].pid) for r in v.suspect_ranks if r in facts.by_rank
                 and facts.by_rank[r].alive]  # fmt: skip
    where = f"rank {ranks} on {row.node if row else facts.node}"
    actions: list[str] = []
    cat = v.category
    if cat == "crash.oom":
        batch = facts.last_batch.get(first) if first is not None else None
        actions.append(f"Lower the per-rank batch size or sequence length on {where}"
                       + (f": its last batch was {batch}." if batch else "."))  # fmt: skip
        snap = facts.snapshots.get(first) if first is not None else None
        if snap:
            actions.append(f"Open the memory snapshot: extract `{snap}` and run `python -m torch.cuda._memory_viz "
                           f"trace_plot {snap.rsplit('/', 1)[-1]} -o memory.html`, or drop it on "
                           "https://pytorch.org/memory_viz (it shows who allocated what).")  # fmt: skip
        else:
            actions.append("Rerun with `blackbox run --cuda-memory-history 100000` so the next OOM leaves a memory "
                           "snapshot with the allocating stacks.")  # fmt: skip
        frag = f" ({facts.reserved_unallocated} was reserved but unallocated)" if facts.reserved_unallocated else ""
        actions.append(f"Try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to reduce fragmentation{frag}.")
    elif cat == "crash.host_oom":
        actions.append(f"The kernel's OOM killer ended {where}: check the node's memory (node.json) and host-side "
                       "memory per rank (DataLoader workers, pinned memory, dataset caches); "
                       "`dmesg -T | grep -i -e oom -e 'killed process'` on the node.")  # fmt: skip
    elif cat == "hang.collective" and facts.mismatch:
        actions.append(f"The ranks called different collectives: {facts.mismatch}. Find the rank-dependent branch "
                       "or the skipped call before those lines; `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks every "
                       "collective's signature across ranks.")  # fmt: skip
    elif cat in ("crash.comm_timeout", "hang.collective"):
        what = f" never entered {facts.missing_collective}" if facts.missing_collective else " did not arrive"
        actions.append(f"Look at {where}: it{what}. Its stack is in the bundle"
                       + (f"; while it runs: `py-spy dump --native --pid {' --pid '.join(live_pids)}`." if live_pids
                          else "."))  # fmt: skip
        actions.append(
            "Check that every rank issues the same collectives in the same order (a rank-dependent "
            "branch, an early `break`, a skipped eval): rerun with `TORCH_DISTRIBUTED_DEBUG=DETAIL`."
        )
        actions.append(f"Check {row.node if row else facts.node}'s network and GPU health (NCCL_DEBUG=INFO, "
                       "`dmesg -T | grep -i xid`).")  # fmt: skip
    elif cat == "crash.cuda_error":
        actions.append(f"Look for NVIDIA Xid errors on {facts.node}: `dmesg -T | grep -i xid` "
                       "(node/kernel-messages.txt in the bundle, where readable).")  # fmt: skip
        actions.append(f"Check the GPU of {where}: `nvidia-smi -q` (ECC errors, retired pages, throttling).")
        actions.append("Rerun with `CUDA_LAUNCH_BLOCKING=1` to find the kernel that failed.")
    elif cat == "crash.exception":
        if facts.exception_path:
            path = facts.exception_path
            actions.append(f"Check `{path}`, the file {where}'s exception names: `ls -l {path}` as the job's "
                           "user (permissions, existence, the filesystem).")  # fmt: skip
        actions.append(f"Read {where}'s exception" + (f": {facts.exception}." if facts.exception else ".")
                       + " The traceback is in ranks/<rank>/exceptions.jsonl and the console tail.")  # fmt: skip
        actions.append("The other ranks' errors (connection reset, timeouts) are consequences: they lost a peer.")
    elif cat == "crash.signal":
        if facts.kernel_oom:
            actions.append(f"The kernel killed {where} (OOM killer): check the node's memory.")
        host = row.node if row else facts.node
        actions.append(f"Read {where}'s fatal.txt (faulthandler) for a segfault or abort, and the console tail; "
                       f"check `dmesg -T | tail -50` on {host} for the OOM killer.")  # fmt: skip
    elif cat == "hang.data_loading":
        workers = facts.stuck_workers.get(first) if first is not None else None
        actions.append(f"Check what {where} reads: the dataset shard or file in its `__getitem__` frame, its "
                       "permissions and the filesystem (a hung network mount blocks a read forever).")  # fmt: skip
        if workers:
            actions.append(f"Its DataLoader worker(s) {', '.join(map(str, workers))} hold the stuck read: "
                           f"`py-spy dump --pid {workers[0]}`.")  # fmt: skip
        actions.append("Give the DataLoader a `timeout=` so a stuck worker raises instead of hanging; check "
                       "`num_workers`.")  # fmt: skip
    elif cat == "hang.checkpoint_io":
        at = f" (at {facts.checkpoint_frame})" if facts.checkpoint_frame else ""
        disk = f"; free space where the run writes: {facts.disk_free}" if facts.disk_free else ""
        actions.append(f"Check the checkpoint path {where} writes to{at}: `df -h PATH`, the filesystem's health, "
                       f"a FIFO or a stale network mount{disk}.")  # fmt: skip
    elif cat == "hang.stopped":
        pids = " ".join(live_pids) or "PID"
        actions.append(f"R{where[1:]} is stopped (SIGSTOP, job control, or a debugger attached): find who stopped it "
                       f"(`ps -o pid,stat,tracerpid -p {pids}`; `grep TracerPid /proc/{pids.split()[0]}/status`); "
                       f"`kill -CONT {pids}` resumes it.")  # fmt: skip
    elif cat == "hang.kernel":
        actions.append(f"R{where[1:]} is in an uninterruptible sleep in the kernel: its wchan (ranks/<rank>/proc.json) "
                       "names the wait — a hung network filesystem (nfs, lustre), a device or driver; `dmesg -T | "
                       "tail -50` and the mount's health on the node.")  # fmt: skip
    elif cat == "crash.exit":
        actions.append(f"R{where[1:]} exited without raising an exception: look for `sys.exit`/`os._exit` or a library "
                       "that exits (a rank-dependent `break` or `return` out of the training loop, a native "
                       "library's exit()), and at its last lines in the console tail.")  # fmt: skip
        actions.append(
            "Every rank must run the same number of steps and collectives: a rank that leaves early "
            "leaves the others waiting in the next collective (they then fail with 'connection closed')."
        )
    elif cat == "hang.compute":
        actions.append(f"Find the loop or native call {where} is in (its stack in the bundle), and what differs on "
                       "that rank: its data, a rank-dependent branch.")  # fmt: skip
    if v.category.startswith("hang."):
        if live_pids:
            actions.append(f"While it hangs: `py-spy dump --native --pid {' --pid '.join(live_pids)}` on "
                           f"{row.node if row else facts.node}.")  # fmt: skip
        actions.append(
            f"Rerun with `blackbox run --on-stall keep` to keep the job alive for a debugger on rank {ranks}."
        )
    if cat == "ok" and v.suspect_ranks:
        actions.append(f"R{where[1:]} is the slowest (a straggler): compare its data, its node's load and its "
                       "GPU's temperature and clocks with the others'; it sets every collective's pace.")  # fmt: skip
    if not actions:
        actions.append("Compare steps and phases across ranks; the slowest rank is the first to look at.")
    return actions
