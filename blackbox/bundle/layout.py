"""The bundle's layout: the name of every member and the records written to them — the one module that spells
them. The writer, the collector, the reader, the analysis and the index all name members through it. A rank's own
files keep the recorder's names (blackbox._recorder.protocol) under ranks/<rank>/.
Imports the stdlib, the rank protocol and the shared words."""

from __future__ import annotations

import re
from typing import Any, Optional

from .._recorder import protocol as P
from ..detections import Detection

MANIFEST = "manifest.json"
# 2: a rank's own records live in the node's rank table (RANK_TABLE); 1: each is a member of its own
MANIFEST_SCHEMA_VERSION = 2

# --- the node's members ---------------------------------------------------------------------------------
DETECTION = "detection.json"  # what the live rule saw (detection_record)
CONSOLE_TAIL = "console-tail.log"  # the end of the job's output, redacted
EVENTS = "events.jsonl"  # the newest part of the run's event log
NODE = "node.json"  # host, GPUs, git, disk, which GPU each rank uses
NODE_ENV = "node/env.json"
KERNEL_MESSAGES = "node/kernel-messages.txt"
GIT_DIFFSTAT = "node/git-diffstat.txt"
PACKAGES = "node/packages.json"
GPU_HISTORY = "node/gpu-history.json"
COORDINATION = "node/coordination.json"
# The ranks' own records of TABLED, one JSON Lines line each, `[R, "<name>", record]` in compact JSON; a reader
# sees each as the member ranks/R/<name> it stands for, parsed only when read (a 32,768-rank node is one table
# member, not 131,072 tar members and their manifest entries).
RANK_TABLE = "node/ranks.jsonl"
CONFIG_DIR = "node/config/"  # the config files named on the job's command line, redacted
FLIGHT_RECORDER_DIR = P.FR_DIR + "/"  # the ranks' flight-recorder pickles, named as torch's analyzer reads them
AGENT_DIR = "agent/"  # torchrun's agent: its stacks and /proc state (blackbox collect)
RANKS_DIR = "ranks/"
NODES_DIR = "nodes/"  # merged node bundles: each node's own members under nodes/<node>/

# --- each rank's members, under ranks/<rank>/ -------------------------------------------------------------
# written by the collector
HEARTBEAT = "heartbeat.json"  # heartbeat_record
HISTORY = "history.json"  # the supervisor's samples of the rank's step, phase and state
TORCHELASTIC_ERROR = "torchelastic-error.json"  # torchelastic's own error file, copied
# a process's members (process_member): the rank's own, <what>.json; a helper's, <what>-worker-<pid>.json
PYSPY = "py-spy"  # py-spy's JSON, as py-spy wrote it
PYSPY_NATIVE = "py-spy-native"  # the main thread with native frames, where the Python stack was ambiguous
PROC = "proc"  # /proc state (adapters.procfs)
WORKER = "-worker-"
# a rank's own records, in RANK_TABLE
TABLED = (HEARTBEAT, HISTORY, PYSPY + ".json", PROC + ".json")
# copied from the rank's directory as the recorder named them
RANK_FILES = (
    P.RANK_LOG, P.RANK_EVENTS, P.RANK_ANNOTATIONS, P.RANK_METRICS, P.RANK_THREADS, P.RANK_MOVER, P.RANK_LOADER,
    P.RANK_INFO, P.RANK_EXCEPTIONS, P.RANK_OOM, P.RANK_FATAL, P.RANK_SIGTERM, P.RANK_STACKS, P.RANK_PYDUMP,
    P.RANK_FR_JSON, P.RANK_MEMORY_SNAPSHOT, P.RANK_ERROR,
)  # fmt: skip


def rank_member(rank: object, name: str) -> str:
    """ranks/<rank>/<name>."""
    return f"{RANKS_DIR}{rank}/{name}"


def process_member(rank: object, what: str, pid: Optional[int] = None) -> str:
    """Where a process's `what` (PYSPY, PROC) goes: ranks/R/what.json, ranks/R/what-worker-PID.json for a helper
    of the rank (`pid`: a DataLoader worker), agent/what.json for torchrun's agent (rank None)."""
    if rank is None:
        return f"{AGENT_DIR}{what}.json"
    return rank_member(rank, f"{what}{WORKER}{pid}.json" if pid is not None else f"{what}.json")


def worker_pid(rank: int, what: str, member: str) -> Optional[int]:
    """The helper's pid in ranks/<rank>/<what>-worker-<pid>.json, else None."""
    head, tail = rank_member(rank, f"{what}{WORKER}"), ".json"
    digits = member[len(head) : -len(tail)] if member.startswith(head) and member.endswith(tail) else ""
    return int(digits) if 0 < len(digits) <= 9 and digits.isascii() and digits.isdigit() else None


def numbered(rank: int, pattern: str, member: str) -> Optional[int]:
    """n in ranks/<rank>/<pattern with n for %d> (stacks-3.txt, pydump-2.json), else None."""
    head, _, tail = pattern.partition("%d")
    head = rank_member(rank, head)
    digits = member[len(head) : len(member) - len(tail)] if member.startswith(head) and member.endswith(tail) else ""
    return int(digits) if 0 < len(digits) <= 18 and digits.isascii() and digits.isdigit() else None


def glob(pattern: str) -> str:
    """A recorder name pattern as a shell glob: stacks-%d.txt -> stacks-*.txt."""
    return pattern.replace("%d", "*")


def config_member(path: str) -> str:
    """Where a config file of the job's command line goes: node/config/<its path, made one safe name>."""
    return CONFIG_DIR + re.sub(r"[^\w.\-]", "_", path.lstrip("/"))


def node_member(node: str, name: str) -> str:
    """A node's own member in a merged view: nodes/<node>/<name>."""
    return f"{NODES_DIR}{node}/{name}"


def is_flight_recorder_dump(member: str) -> bool:
    return member.startswith(FLIGHT_RECORDER_DIR + P.FR_PREFIX)


def is_per_rank(member: str) -> bool:
    """Members that belong to one rank, wherever its node: kept as they are when node bundles are merged."""
    return member.startswith((RANKS_DIR, FLIGHT_RECORDER_DIR))


# --- the records ----------------------------------------------------------------------------------------------
def detection_record(d: Detection) -> dict[str, Any]:
    return {
        "rule": d.rule, "ranks": list(d.ranks), "reason": d.reason, "same_episode": d.same_episode,
        "message": d.message(), "findings": [f.__dict__ for f in d.findings],
    }  # fmt: skip
