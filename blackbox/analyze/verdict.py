"""From a bundle to a verdict: category, phase, suspect ranks, evidence marked observed or inferred, and
next actions. Pure: reads the Bundle object only. Imports the stdlib and blackbox's model and reader."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from .._recorder.protocol import FR_PREFIX
from ..adapters import cuda_memory, stacks
from ..adapters import flight_recorder as fr
from ..adapters.cuda_memory import human
from ..bundle.reader import Bundle
from ..supervisor.rules import CRASH_RULES, rank_ranges
from .actions import Facts, next_actions
from .model import Finding, RankRow, Report, Verdict
from .stackgroups import RankStack, group, rank_stack, signature, waits_in

_HANG_BY_PHASE = {
    "data": "hang.data_loading",
    "checkpoint": "hang.checkpoint_io",
    "collective": "hang.collective",
    "compute": "hang.compute",
    "eval": "hang.compute",
    "startup": "hang.unknown",
}
CONSOLE_LINES = 15


def _newest(bundle: Bundle, rank: int, prefix: str, suffix: str) -> Optional[str]:
    """The bundle member ranks/<rank>/<prefix><n><suffix> with the highest n."""
    best: tuple[int, str] | None = None
    head = f"ranks/{rank}/{prefix}"
    for name in bundle.rank_files(rank):
        if name.startswith(head) and name.endswith(suffix) and name[len(head) : len(name) - len(suffix)].isdigit():
            n = int(name[len(head) : len(name) - len(suffix)])
            if best is None or n > best[0]:
                best = (n, name)
    return best[1] if best else None


def main_stack(bundle: Bundle, rank: int) -> tuple[Optional[stacks.ThreadStack], Optional[str]]:
    """The rank's main thread from its newest dump: the recorder's JSON dump, else faulthandler's."""
    name = _newest(bundle, rank, "pydump-", ".json")
    if name is not None:
        thread = stacks.main_thread(stacks.from_pydump(bundle.json(name)))
        if thread is not None:
            return thread, name
    names = bundle.json(f"ranks/{rank}/threads.json")
    for candidate in (_newest(bundle, rank, "stacks-", ".txt"), f"ranks/{rank}/sigterm.txt"):
        if candidate is None or candidate not in bundle.files:
            continue
        dumps = stacks.parse_faulthandler(bundle.text(candidate), names if isinstance(names, dict) else None)
        if dumps:
            thread = stacks.main_thread(dumps[-1])
            if thread is not None:
                return thread, candidate
    return None, None


def _rows(bundle: Bundle, node: str, rank_stacks: dict[int, RankStack]) -> list[RankRow]:
    """One row per rank: from its heartbeat where the recorder ran, else from the manifest and its stacks."""
    rows: dict[int, RankRow] = {}
    rank_nodes = bundle.manifest.get("rank_nodes")  # merged node bundles: which node each rank came from
    rank_nodes = rank_nodes if isinstance(rank_nodes, dict) else {}
    for rank_id in bundle.ranks():
        name = f"ranks/{rank_id}/heartbeat.json"
        if name not in bundle.files:
            continue
        hb = bundle.json(name)
        if not isinstance(hb, dict):
            continue
        try:
            rank = int(hb["rank"])
            host = str(rank_nodes.get(str(rank), node))
            rows[rank] = RankRow(
                rank=rank, node=host, pid=int(hb["pid"]), state=str(hb.get("state", "unknown")),
                step=int(hb.get("step", 0)), phase=str(hb.get("phase", "unknown")),
                top_frame=_top_frame(rank_stacks.get(rank)),
                idle_s=_float(hb.get("idle_s")), alive=bool(hb.get("alive")),
                collective=str(hb.get("collective")) if hb.get("phase") == "collective" else None,
                last_step_s=_float(hb.get("last_step_dt")),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            continue
    for entry in bundle.section("job").get("local_ranks") or []:
        try:
            rank, pid = int(entry["rank"]), int(entry["pid"])
        except (KeyError, TypeError, ValueError):
            continue
        if rank in rows:
            continue
        rs = rank_stacks.get(rank)
        host = str(entry.get("node") or rank_nodes.get(str(rank), node))
        rows[rank] = RankRow(rank=rank, node=host, pid=pid, state="running" if entry.get("alive") else "gone",
                             step=None, phase=rs.waits_in if rs else "unknown", top_frame=_top_frame(rs),
                             alive=bool(entry.get("alive")))  # fmt: skip
    return [rows[r] for r in sorted(rows)]


def _top_frame(rs: Optional[RankStack]) -> Optional[str]:
    frame = rs.thread.top_user_frame() if rs is not None else None
    return frame.describe() if frame is not None else None


def _float(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int_list(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]


def _rank_ids(bundle: Bundle) -> list[int]:
    return bundle.ranks()


def _exceptions(bundle: Bundle, ranks: list[int]) -> list[dict[str, Any]]:
    """Uncaught main-thread exceptions of every rank, earliest first (the recorder's exceptions.jsonl)."""
    out = []
    for rank in ranks:
        for line in bundle.text(f"ranks/{rank}/exceptions.jsonl").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            main = isinstance(rec, dict) and rec.get("thread") == "MainThread"
            if main and isinstance(rec.get("time"), (int, float)):
                out.append({**rec, "rank": rank})
    return sorted(out, key=lambda r: r["time"])


_COMM_TIMEOUT = ("Timed out waiting", "Watchdog caught collective operation timeout", "DistBackendError",
                 "timed out", "Timeout")  # fmt: skip
_PEER_LOSS = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote process exit|"
    r"communicator was aborted|aborted|Socket closed",
    re.IGNORECASE,
)
_CUDA_ERROR = re.compile(
    r"CUDA error|CUBLAS_STATUS|cuDNN error|NCCL error|illegal memory access|"
    r"device-side assert",
    re.IGNORECASE,
)
_CONSOLE_CATEGORY = {
    "console-comm-timeout": "crash.comm_timeout", "console-oom": "crash.oom", "console-cuda-error": "crash.cuda_error",
    "console-segfault": "crash.signal",
}  # fmt: skip


_CRASH_SUMMARY = {
    "crash.comm_timeout": "A collective timed out", "crash.oom": "A rank ran out of memory",
    "crash.cuda_error": "A CUDA or NCCL error", "crash.signal": "A rank crashed with a fatal signal",
}  # fmt: skip


def _exception_line(exc: dict[str, Any]) -> str:
    """`Type: message` in one line. An exception re-raised from a DataLoader worker carries the worker's whole
    traceback in its message: its last line is the one that says what went wrong."""
    message = str(exc.get("message", ""))
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if "Original Traceback" in message and lines:
        return lines[-1][:300]
    return f"{str(exc.get('type')).rsplit('.', 1)[-1]}: {lines[0] if lines else ''}"[:300]


def _exception_record(exc: dict[str, Any]) -> dict[str, Any]:
    tb: list[Any] = exc["traceback"] if isinstance(exc.get("traceback"), list) else []
    frames = [stacks.Frame(str(f.get("file", "?")), int(f.get("line") or 0), str(f.get("function", "?")))
              for f in tb if isinstance(f, dict)]  # fmt: skip
    user = [f for f in frames if not f.is_library] or frames
    return {"rank": exc.get("rank"), "type": str(exc.get("type")), "message": _exception_line(exc),
            "frame": user[-1].describe() if user else None}  # fmt: skip


def _exception_phase(exc: dict[str, Any]) -> Optional[str]:
    """Where the exception came from, read from its traceback the way a stack is read (waits_in): data,
    checkpoint or a collective; None for plain compute."""
    tb = exc.get("traceback")
    frames = tuple(stacks.Frame(str(f.get("file", "")), int(f.get("line") or 0), str(f.get("function", "")))
                   for f in (tb if isinstance(tb, list) else []) if isinstance(f, dict))  # fmt: skip
    where = waits_in(stacks.ThreadStack("exception", None, False, frames))
    return None if where == "compute" else where


def _raised_in_collective(exc: dict[str, Any]) -> bool:
    """The exception came out of a collective: the rank was waiting in it, a victim."""
    return _exception_phase(exc) == "collective"


def _not_in_collective(
    rows: list[RankRow], rank_stacks: dict[int, RankStack], raised: Optional[list[dict[str, Any]]] = None
) -> list[int]:
    """Ranks that are not waiting in a collective (by heartbeat phase, stack, or an exception raised from one)
    while others are."""
    victims = {e["rank"] for e in raised or [] if _raised_in_collective(e)}
    waiting: list[int] = []
    elsewhere: list[int] = []
    for r in rows:
        rs = rank_stacks.get(r.rank)
        in_coll = r.phase == "collective" or (rs is not None and rs.waits_in == "collective") or r.rank in victims
        (waiting if in_coll else elsewhere).append(r.rank)
    return elsewhere if waiting and elsewhere else []


def flight_recorder_dumps(bundle: Bundle) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Every rank's flight-recorder dump, read with the restricted loader; and what could not be read."""
    dumps: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    for name in sorted(bundle.files):
        if not name.startswith("flight_recorder/" + FR_PREFIX):
            continue
        rank = fr.rank_of(name)
        try:
            if rank is not None:
                dumps[rank] = fr.load_dump(bundle.files[name])
        except fr.FlightRecorderError as exc:
            errors.append(f"{name}: {exc}")
    return dumps, errors


def _collective_findings(
    bundle: Bundle, torch_fr: Optional[tuple[Optional[str], str]]
) -> tuple[list[fr.Unjoined], list[fr.Mismatch], list[Finding]]:
    dumps, errors = flight_recorder_dumps(bundle)
    findings = [Finding("observed", f"a flight-recorder trace could not be read: {e}", "flight_recorder/")
                for e in errors]  # fmt: skip
    unjoined = fr.unjoined(dumps) if dumps else []
    mismatched = fr.mismatches(dumps) if dumps else []
    for mm in mismatched:
        calls = "; ".join(f"{_plural_ranks(r)} called {call}" + (f" at {mm.where[call]}" if call in mm.where else "")
                          for call, r in sorted(mm.calls.items(), key=lambda kv: (len(kv[1]), kv[0])))  # fmt: skip
        findings.append(Finding("observed", f"collective #{mm.seq} of group {mm.group_name} is not the same on every "
                                f"rank: {calls}", "flight_recorder/: entries"))  # fmt: skip
    for u in unjoined:
        text = (f"{_plural_ranks(u.missing)} never entered {u.op} #{u.seq} (group {u.group_name}) that "
                f"{_plural_ranks(u.waiting)} {'waits' if len(u.waiting) == 1 else 'wait'} in"
                + (f" at {u.where}" if u.where else ""))  # fmt: skip
        seen = "; ".join(f"rank {r} last entered a collective at {w}" for r, w in sorted(u.last_seen.items()))
        findings.append(Finding("observed", text + (f" — {seen}" if seen else ""),
                                "flight_recorder/: pg_status and entries"))  # fmt: skip
    if torch_fr is not None:
        output, how = torch_fr
        missing = fr.analyzer_missing_ranks(output or "")
        if missing:
            source = "python -m torch.distributed.flight_recorder.fr_trace (normalised dumps)"
            findings.append(Finding("observed", f"PyTorch's flight-recorder analyzer: missing ranks {missing}", source))
        elif output is None or how != "PyTorch's analyzer ran":
            findings.append(Finding("observed", how, "flight_recorder/"))
    return unjoined, mismatched, findings


def _memory_findings(bundle: Bundle, ranks: list[int], findings: list[Finding], facts: Facts) -> list[int]:
    """OOM records (the message's figures, the last batch) and memory snapshots (the largest live allocations
    with the user frame that made them). Returns the ranks that ran out of memory."""
    oom_ranks = []
    for rank in ranks:
        source = f"ranks/{rank}/oom.jsonl"
        for line in bundle.text(source).splitlines()[-1:]:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            oom_ranks.append(rank)
            parsed = cuda_memory.parse_oom(str(rec.get("message", "")))
            text = f"rank {rank} ran out of CUDA memory" + (f": {parsed.describe()}" if parsed else "")
            phase = f" in phase {rec.get('phase')} at step {rec.get('step')}" if rec.get("phase") else ""
            findings.append(Finding("observed", text + phase, source))
            if parsed and "reserved_unallocated" in parsed.sizes:
                facts.reserved_unallocated = cuda_memory.human(parsed.sizes["reserved_unallocated"])
            batch = rec.get("last_batch")
            if isinstance(batch, list) and batch:
                shapes = ", ".join(f"{b.get('path')} {b.get('shape')} {b.get('dtype')}" for b in batch[:6]
                                   if isinstance(b, dict))  # fmt: skip
                facts.last_batch[rank] = shapes
                findings.append(Finding("observed", f"rank {rank}'s last batch: {shapes}", source))
        for name in [n for n in bundle.rank_files(rank) if n.startswith(f"ranks/{rank}/memory-snapshot-")]:
            facts.snapshots[rank] = name
            try:
                snap = cuda_memory.load_snapshot(bundle.files[name])
            except cuda_memory.SnapshotError as exc:
                findings.append(Finding("observed", f"rank {rank}'s memory snapshot could not be read: {exc}", name))
                continue
            top, allocated, reserved = cuda_memory.largest_allocations(snap)
            findings.append(Finding("observed", f"rank {rank}'s memory snapshot: {cuda_memory.human(allocated)} "
                                    f"allocated in {cuda_memory.human(reserved)} reserved", name))  # fmt: skip
            for a in top:
                findings.append(Finding("observed", f"rank {rank}: live allocation of {cuda_memory.human(a.size)}"
                                        + (f" from {a.frame}" if a.frame else ""), name))  # fmt: skip
    return oom_ranks


def _timeline(bundle: Bundle, rows: list[RankRow]) -> dict[str, Any]:
    """Each rank's step over time (the supervisor's heartbeat history, else its last progress alone), and the
    rank that stopped progressing first."""
    out: list[dict[str, Any]] = []
    for row in rows:
        samples = []
        history = bundle.json(f"ranks/{row.rank}/history.json")
        for h in history if isinstance(history, list) else []:
            if isinstance(h, dict) and isinstance(h.get("t"), (int, float)) and isinstance(h.get("step"), int):
                samples.append([float(h["t"]), h["step"], str(h.get("phase", ""))])
        hb = bundle.json(f"ranks/{row.rank}/heartbeat.json")
        last = hb.get("last_progress_wall") if isinstance(hb, dict) else None
        last = float(last) if isinstance(last, (int, float)) and last > 0 else None
        if last is not None and not samples:
            samples.append([last, row.step or 0, row.phase])
        out.append({"rank": row.rank, "node": row.node, "samples": samples[-500:], "last_progress": last})
    stopped = [t for t in out if t["last_progress"] is not None]
    first = min(stopped, key=lambda t: (t["last_progress"], t["rank"]))["rank"] if len(stopped) > 1 else None
    created = bundle.manifest.get("created")
    end = None
    if isinstance(created, str):
        from datetime import datetime

        try:
            end = datetime.fromisoformat(created).timestamp()
        except ValueError:
            end = None
    return {"ranks": out, "stopped_first": first, "end": end}


def _rank_summary(rows: list[RankRow], rank_stacks: dict[int, RankStack], suspects: list[int]) -> list[Finding]:
    """What each rank was doing: the suspects one by one, the others grouped by what they share (step, where,
    alive, main-thread frame), so that 4,095 ranks waiting in the same all_reduce are one line, not 8,190."""
    out: list[Finding] = []
    groups: dict[tuple[object, ...], list[RankRow]] = {}
    for row in rows:
        rs = rank_stacks.get(row.rank)
        if row.rank in suspects:
            out.extend(_one_rank(row, rs))
            continue
        key = (row.step, row.phase, row.collective, row.alive, row.state, row.top_frame)
        groups.setdefault(key, []).append(row)
    for members in groups.values():
        if len(members) == 1:
            out.extend(_one_rank(members[0], rank_stacks.get(members[0].rank)))
            continue
        row = members[0]
        ids = [m.rank for m in members]
        where = f"in {row.collective}" if row.collective else f"in phase {row.phase}"
        step = f" at step {row.step}" if row.step is not None else ""
        idles = [m.idle_s for m in members if m.idle_s is not None]
        idle = ""
        if idles:
            lo, hi = min(idles), max(idles)
            span = f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"
            idle = f", no progress for {span} s"
        life = "" if row.alive else f", processes gone ({row.state})"
        frame = f"; main thread in {row.top_frame}" if row.top_frame else ""
        source = "ranks/*/heartbeat.json" if row.step is not None else "manifest.json"
        out.append(Finding("observed", f"{_plural_ranks(ids)} ({len(ids)} ranks){step}, {where}{idle}{life}{frame}",
                           source + (", ranks/*/py-spy.json" if frame else "")))  # fmt: skip
    return out


def _workers(ranks: list[int], rank_stacks: dict[int, RankStack]) -> dict[str, list[str]]:
    """Each rank's DataLoader workers, attached to its stack group: "pid: where its main thread is"."""
    out: dict[str, list[str]] = {}
    for rank in ranks:
        rs = rank_stacks.get(rank)
        for pid, worker in rs.workers if rs is not None else ():
            top = worker.top_user_frame()
            out.setdefault(str(rank), []).append(f"worker {pid}: {signature(worker)}" if top else f"worker {pid}")
    return out


def _one_rank(row: RankRow, rs: Optional[RankStack]) -> list[Finding]:
    where = f"in {row.collective}" if row.collective else f"in phase {row.phase}"
    idle = f", no progress for {row.idle_s:.0f} s" if row.idle_s is not None else ""
    life = "" if row.alive else f", process gone ({row.state})"
    step = f" at step {row.step}" if row.step is not None else ""
    source = f"ranks/{row.rank}/heartbeat.json" if row.step is not None else "manifest.json"
    out = [Finding("observed", f"rank {row.rank} (pid {row.pid}){step}, {where}{idle}{life}", source)]
    if rs is not None and row.top_frame:
        out.append(Finding("observed", f"rank {row.rank}'s main thread is in {row.top_frame}", rs.source))
    return out


def _gpu_series(bundle: Bundle) -> list[dict[str, Any]]:
    history = bundle.json("node/gpu-history.json")
    out = []
    for index, samples in sorted(history.items()) if isinstance(history, dict) else []:
        good = [x for x in samples if isinstance(x, dict)] if isinstance(samples, list) else []
        rows = [[x["t"], x.get("utilization_pct"), x.get("temperature_c")] for x in good
                if isinstance(x.get("t"), (int, float))]  # fmt: skip
        if rows:
            out.append({"index": index, "name": good[-1].get("name"), "samples": rows[-500:]})
    return out


def _gpu_findings(bundle: Bundle, findings: list[Finding]) -> None:
    """From the supervisor's GPU history: each GPU's last reading, how long it sat at 0 %, and any throttling,
    heat or ECC errors seen."""
    history = bundle.json("node/gpu-history.json")
    if not isinstance(history, dict):
        return
    source = "node/gpu-history.json"
    for index, samples in sorted(history.items()):
        samples = [x for x in samples if isinstance(x, dict)] if isinstance(samples, list) else []
        if not samples:
            continue
        last = samples[-1]
        idle = 0
        for x in reversed(samples):
            if x.get("utilization_pct") != 0:
                break
            idle += 1
        span = ""
        if idle > 1 and isinstance(samples[-idle].get("t"), (int, float)) and isinstance(last.get("t"), (int, float)):
            span = f", at 0 % for the last {last['t'] - samples[-idle]['t']:.0f} s"
        findings.append(Finding("observed", f"GPU {index} ({last.get('name')}): {last.get('utilization_pct')} % "
                                f"utilisation, {last.get('temperature_c')}C, {last.get('memory_used_mib')} of "
                                f"{last.get('memory_total_mib')} MiB{span}", source))  # fmt: skip
        throttled = {str(x["throttle"]) for x in samples if x.get("throttle")}
        if throttled:
            hottest = max((x.get("temperature_c") or 0) for x in samples)
            findings.append(Finding("observed", f"GPU {index} throttled its clocks ({', '.join(sorted(throttled))}); "
                                    f"hottest reading {hottest}C", source))  # fmt: skip
        ecc = [x.get("ecc_uncorrected") or 0 for x in samples]
        if ecc and max(ecc) > min(ecc):
            findings.append(Finding("observed", f"GPU {index}: uncorrected ECC errors rose from {min(ecc):g} to "
                                    f"{max(ecc):g}", source))  # fmt: skip


def _plural_ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def _node_findings(bundle: Bundle) -> list[Finding]:
    """Multi-node: nodes whose bundle is not among those given, and nodes whose supervisor had fallen silent."""
    m = bundle.manifest
    mn = bundle.section("multinode")
    states = {name: bundle.json(name) for name in bundle.files if name.endswith("node/coordination.json")}
    silent: dict[str, Any] = {}
    out: list[Finding] = []
    for name, state in states.items():
        if not isinstance(state, dict):
            continue
        if state.get("status") == "alone" and state.get("why_alone"):
            out.append(Finding("observed", f"node {state.get('node')} was not coordinated with the others "
                               f"({state['why_alone']}): they did not collect at the same moment", name))  # fmt: skip
        gone = state.get("silent")
        for node, info in gone.items() if isinstance(gone, dict) else ():
            silent.setdefault(str(node), (info, name))
    nodes: list[Any] = m["nodes"] if isinstance(m.get("nodes"), list) else [{"node_rank": mn.get("node_rank")}]
    present = {str(n.get("node_rank")) for n in nodes if isinstance(n, dict)}
    nnodes = mn.get("nnodes")
    missing = [str(i) for i in range(nnodes) if str(i) not in present] if isinstance(nnodes, int) else []
    for node, (info, source) in silent.items():
        last = info.get("summary") if isinstance(info, dict) else None
        ranks: dict[str, Any] = last["ranks"] if isinstance(last, dict) and isinstance(last.get("ranks"), dict) else {}
        seen = ", ".join(f"rank {r} step {v.get('step')} {v.get('phase')}" for r, v in sorted(
            ranks.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0) if isinstance(v, dict))  # fmt: skip
        quiet = info.get("silent_s") if isinstance(info, dict) else None
        out.append(Finding("observed", f"node {node}'s blackbox supervisor fell silent (no liveness for {quiet} s: "
                           "killed, or its host is down); that node was not watched and has no bundle for this "
                           "incident" + (f"; last seen: {seen}" if seen else ""), source))  # fmt: skip
    lost = [n for n in missing if n not in silent]
    if lost:
        out.append(Finding("observed", f"node(s) {', '.join(lost)} of {nnodes} have no bundle among those given: "
                           "each node writes its own under its run directory's bundles/ — give them all",
                           "manifest.json: multinode"))  # fmt: skip
    return out


def analyze(bundle: Bundle, torch_fr: Optional[tuple[Optional[str], str]] = None) -> Report:
    """`torch_fr`: PyTorch's own analyzer's output and how it went, when the caller ran it
    (adapters.flight_recorder.torch_analyzer); the analysis itself stays pure."""
    m = bundle.manifest
    node = str(m.get("node", "unknown"))
    trigger = str(m.get("trigger", "unknown"))
    rank_stacks = {rs.rank: rs for rs in (rank_stack(bundle, r) for r in _rank_ids(bundle)) if rs is not None}
    rows = _rows(bundle, node, rank_stacks)
    by_rank = {r.rank: r for r in rows}
    groups = group(list(rank_stacks.values()))
    detection = bundle.json("detection.json")
    detection = detection if isinstance(detection, dict) else {}
    incident = bundle.section("incident")
    if trigger.startswith("remote-"):  # collected because another node posted an incident: judged by its rule
        trigger = trigger[len("remote-") :]
        if not detection and incident:
            detection = {"rule": incident.get("rule"), "suspects": incident.get("suspects"),
                         "reason": f"node {incident.get('origin')} reported: {incident.get('reason')}"}  # fmt: skip
    rule = str(detection.get("rule") or trigger.replace("-", "_"))
    suspects = _int_list(detection.get("suspects"))
    reason = str(detection.get("reason", ""))
    findings: list[Finding] = []
    for row in rows:  # each rank's own facts are summarised once the suspects are known (_rank_summary)
        rs = rank_stacks.get(row.rank)
        for pid, worker in rs.workers if rs is not None else ():
            top = worker.top_user_frame()
            if top is not None:
                text = f"rank {row.rank}'s DataLoader worker {pid} is in {top.describe()}"
                findings.append(Finding("observed", text, f"ranks/{row.rank}/py-spy-worker-{pid}.json"))
    job = bundle.section("job")
    world = job.get("world_size")
    if isinstance(world, int) and 0 < len(rows) < world:
        absent = [r for r in range(world) if r not in by_rank]
        findings.append(Finding("observed", f"{_plural_ranks(absent)} of {world} are in none of the bundles given: "
                                "their node's bundle is missing (give every node's bundle to merge them)",
                                "manifest.json: job.world_size"))  # fmt: skip
    findings.extend(_node_findings(bundle))
    raised = _exceptions(bundle, list(by_rank) or _rank_ids(bundle))
    for exc in raised[:3]:
        text = f"rank {exc['rank']} raised {_exception_line(exc)}"
        findings.append(Finding("observed", text, f"ranks/{exc['rank']}/exceptions.jsonl"))

    facts = Facts(node, by_rank)
    oom_ranks = _memory_findings(bundle, list(by_rank) or _rank_ids(bundle), findings, facts)
    kernel = bundle.text("node/kernel-messages.txt")
    facts.kernel_oom = bool(re.search(r"oom-kill|Out of memory|Killed process", kernel))
    if facts.kernel_oom:
        findings.append(Finding("observed", "the kernel log mentions the OOM killer: "
                                + next(line for line in kernel.splitlines() if re.search(
                                    r"oom-kill|Out of memory|Killed process", line))[:300],
                                "node/kernel-messages.txt"))  # fmt: skip
    node_facts = bundle.json("node.json")
    disk = node_facts.get("run_dir_disk") if isinstance(node_facts, dict) else None
    if isinstance(disk, dict) and isinstance(disk.get("free"), int):
        facts.disk_free = f"{human(disk['free'])} free at {disk.get('path')}"
    for rank, rs in rank_stacks.items():
        if rs.workers:
            facts.stuck_workers[rank] = [pid for pid, _ in rs.workers]
        if rs.waits_in == "checkpoint":
            top = rs.thread.top_user_frame()
            facts.checkpoint_frame = top.describe() if top else None
    unjoined, mismatched, fr_findings = _collective_findings(bundle, torch_fr)
    findings.extend(fr_findings)
    never_joined = sorted({r for u in unjoined for r in u.missing})

    def phase_of(rank: int) -> Optional[str]:
        row = by_rank.get(rank)
        if row is None:
            return None
        rs = rank_stacks.get(rank)
        if row.phase in ("compute", "unknown", "startup") and rs is not None and rs.waits_in != "compute":
            return rs.waits_in  # the stack knows better (a C++-side wait, a worker's queue)
        return row.phase

    dead = [r for r in rows if not r.alive and r.state not in ("exited",)]
    confidence = "low"
    first = raised[0] if raised else None
    comm_timeout = first is not None and any(t in f"{first.get('type')} {first.get('message')}" for t in _COMM_TIMEOUT)
    _gpu_findings(bundle, findings)
    if rule in ("stall", "frozen", "gpu_idle"):
        suspects = suspects or never_joined
        elsewhere = _not_in_collective(rows, rank_stacks)
        if suspects and elsewhere and not set(suspects) & set(elsewhere):
            text = (
                f"the supervisor named rank(s) {', '.join(map(str, suspects))}, which wait in a collective: "
                f"the rank(s) not in it, {', '.join(map(str, elsewhere))}, are the cause"
            )
            findings.append(Finding("inferred", text, "heartbeats and stacks"))
            suspects = elsewhere
        phase = phase_of(suspects[0]) if suspects else None
        category = (
            "crash.signal" if any(r.rank in suspects for r in dead) else _HANG_BY_PHASE.get(phase or "", "hang.unknown")
        )
        confidence = "medium" if suspects and len(suspects) < len(rows) else "low"
        what = "stopped answering" if rule == "frozen" else "stalled"
        summary = f"The job {what}: {reason}." if reason else f"The job {what}."
    elif trigger in _CONSOLE_CATEGORY or (rule in CRASH_RULES and comm_timeout):
        category = _CONSOLE_CATEGORY.get(trigger, "crash.comm_timeout")
        if category == "crash.comm_timeout":
            # The rank that raised first is the victim: the suspect is the one that never arrived.
            suspects = _not_in_collective(rows, rank_stacks, raised) or suspects
            confidence = "medium" if suspects else "low"
            if never_joined and set(never_joined) != set(suspects):
                suspects = suspects or never_joined
        elif category == "crash.oom" and oom_ranks:
            suspects, confidence = sorted(oom_ranks), "high"
        elif first is not None:
            suspects = [first["rank"]]
            confidence = "medium"
        phase = phase_of(suspects[0]) if suspects else None
        summary = _CRASH_SUMMARY[category] + (f"; suspect rank(s) {', '.join(map(str, suspects))}." if suspects
                                              else ".")  # fmt: skip
    elif rule in CRASH_RULES or dead or raised:
        # Ranks that died without an exception record died of a signal (segfault, SIGKILL); exceptions that only
        # say a peer went away are the consequence, not the cause.
        signal_dead = [r.rank for r in dead if r.state != "exception"]
        causes = [e for e in raised if not _PEER_LOSS.search(str(e.get("message", "")))]
        if signal_dead and not causes:
            first = None
        elif causes:
            first = causes[0]
        if first is None and signal_dead:
            category, suspects, confidence = "crash.signal", signal_dead, "medium"
            fatal = [r for r in signal_dead if f"ranks/{r}/fatal.txt" in bundle.files]
            how = "a fatal signal (faulthandler's fatal.txt)" if fatal else "a signal (no exception, no exit)"
            summary = f"Rank(s) {', '.join(map(str, signal_dead))} died of {how}; the others lost their peer."
            for r in fatal:
                head = bundle.text(f"ranks/{r}/fatal.txt").strip().splitlines()[:1]
                findings.append(Finding("observed", f"rank {r}: {head[0] if head else 'fatal signal'}",
                                        f"ranks/{r}/fatal.txt"))  # fmt: skip
        elif first is not None:
            oom = "OutOfMemoryError" in str(first.get("type")) or "out of memory" in str(first.get("message"))
            cuda = bool(_CUDA_ERROR.search(str(first.get("message"))))
            category = "crash.oom" if oom else "crash.cuda_error" if cuda else "crash.exception"
            suspects = [first["rank"]]
            confidence = "high" if rule == "exception" or len(raised) == 1 else "medium"
            summary = f"Rank {first['rank']} raised {_exception_line(first)} first."
        else:
            category = "crash.signal"
            suspects = suspects or [r.rank for r in dead]
            confidence = "medium" if suspects else "low"
            summary = f"Rank(s) {', '.join(map(str, suspects)) or '?'} ended abnormally" + (
                f": {reason}." if reason else ".")  # fmt: skip
        phase = phase_of(suspects[0]) if suspects else None
        if first is not None and suspects == [first["rank"]]:
            phase = _exception_phase(first) or phase
    else:
        # Collected on request: no rule fired. The stacks say who holds the others up, if anyone does.
        elsewhere = _not_in_collective(rows, rank_stacks)
        idles = [r.idle_s for r in rows if r.idle_s is not None]
        step_s = max([r.last_step_s for r in rows if r.last_step_s] or [0.0])
        progressing = bool(idles) and max(idles) < max(30.0, 5 * step_s)
        if progressing:
            # Not a hang: the job steps. The ranks the others wait for are the slowest: a straggler.
            slow = elsewhere or never_joined
            suspects, phase, category, confidence = slow, phase_of(slow[0]) if slow else None, "ok", "low"
            summary = (f"Collected on request ({trigger}): the job is progressing (last step {max(idles):.0f} s ago, "
                       f"steps take {step_s:.2f} s)") + (
                f"; rank(s) {', '.join(map(str, slow))} are the slowest: the others wait for them in a collective."
                if slow else ".")  # fmt: skip
            if slow:
                text = (f"rank(s) {', '.join(map(str, slow))} are the slowest: the ones the others wait for in a "
                        "collective while the job progresses")  # fmt: skip
                findings.append(Finding("inferred", text, "stack groups, flight recorder"))
        elif elsewhere:
            suspects = elsewhere
            phase = phase_of(elsewhere[0])
            category = _HANG_BY_PHASE.get(phase or "", "hang.unknown")
            waiting = [r.rank for r in rows if r.rank not in elsewhere]
            summary = (f"Collected on request ({trigger}): rank(s) {', '.join(map(str, waiting))} wait in a collective "
                       f"while rank(s) {', '.join(map(str, elsewhere))} are elsewhere ({phase}); if the job is stuck, "
                       "they are holding it up.")  # fmt: skip
            findings.append(Finding("inferred", f"rank(s) {', '.join(map(str, elsewhere))} hold the others up: "
                                    "they are the only ones not waiting in a collective", "stack groups"))  # fmt: skip
        elif never_joined:
            suspects, phase, category = never_joined, phase_of(never_joined[0]), "hang.collective"
            summary = (f"Collected on request ({trigger}): rank(s) {', '.join(map(str, never_joined))} never entered "
                       "a collective the others wait in (flight recorder).")  # fmt: skip
        else:
            category, phase = "ok", None
            summary = f"Collected on request ({trigger}); no rule had fired and no rank stands out."
    if category == "crash.signal" and facts.kernel_oom:
        category = "crash.host_oom"
        summary += " The kernel's OOM killer was active on this node."
    if oom_ranks and category in ("crash.exception", "crash.signal"):
        category = "crash.oom"
    if unjoined:
        u = unjoined[0]
        facts.missing_collective = f"{u.op} #{u.seq} (group {u.group_name})"
    if mismatched:
        mm = mismatched[0]
        facts.mismatch = (
            "; ".join(
                f"{_plural_ranks(r)} called {call.split(' ')[0]}"
                + (f" at {mm.where[call]}" if call in mm.where else "")
                for call, r in sorted(mm.calls.items(), key=lambda kv: (len(kv[1]), kv[0]))
            )
            + f" (collective #{mm.seq}, group {mm.group_name})"
        )
        if category.startswith("hang."):
            category = "hang.collective"
            smallest = min(len(r) for r in mm.calls.values())
            odd = sorted(x for r in mm.calls.values() if len(r) == smallest for x in r)
            if len(odd) < sum(len(r) for r in mm.calls.values()):
                suspects = odd
            if "mismatch" not in summary:
                summary += " The ranks are in different collectives: a collective mismatch."
    if first is not None:
        tb = first.get("traceback") if isinstance(first.get("traceback"), list) else []
        at = f" at {tb[-1].get('file', '?').rsplit('/', 1)[-1]}:{tb[-1].get('line')}" if tb and isinstance(
            tb[-1], dict) else ""  # fmt: skip
        facts.exception = _exception_line(first) + at
        path = re.search(r"'(/[^']+)'", _exception_line(first))
        facts.exception_path = path.group(1) if path else None
    if reason and detection.get("rule") == "console":
        findings.append(Finding("observed", f"trigger: {reason}", "detection.json, console-tail.log"))
    elif reason:
        findings.append(Finding("inferred", f"suspects: {reason}", "detection.json: the supervisor's blame rule"))
    findings = _rank_summary(rows, rank_stacks, suspects) + findings
    # the suspects' facts first: they are the ones a reader needs
    findings.sort(key=lambda f: not any(f.text.startswith(f"rank {r} ") or f.text.startswith(f"rank {r}'")
                                        for r in suspects))  # fmt: skip
    verdict = Verdict(category, phase, suspects, confidence, summary)
    console = bundle.text("console-tail.log")
    _, marker, body = console.partition("\n# ---\n")  # after console.log's header, when the tail still has it
    tail = [line for line in (body if marker else console).splitlines() if line.strip()][-CONSOLE_LINES:]
    return Report(
        run_id=str(m.get("run_id", "unknown")), node=node, trigger=str(m.get("trigger", "unknown")), bundle=bundle.path,
        verdict=verdict,
        ranks=rows, findings=findings, next_actions=next_actions(verdict, facts), console_tail=tail,
        collectives=[u.__dict__ for u in unjoined],
        exception=None if first is None else _exception_record(first),
        timeline=_timeline(bundle, rows),
        gpus=_gpu_series(bundle),
        stack_groups=[{"ranks": g.ranks, "waits_in": g.waits_in, "signature": g.signature, "frames": g.frames,
                       "odd": g.odd, "sources": g.sources, "describe": g.describe(),
                       "workers": _workers(g.ranks, rank_stacks)} for g in groups],
    )  # fmt: skip
