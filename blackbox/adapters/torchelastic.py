"""What torchrun (torch.distributed.elastic) leaves in a process: the rank identity in its environment, the
run id, the error file, and how its launcher's command line looks. Imports the stdlib only."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Optional

# The variables that tell the processes of one job from those of another on the same host.
_JOB_KEYS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "GROUP_WORLD_SIZE")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _int(env: Mapping[str, str], key: str) -> Optional[int]:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        return None


def rank_of(env: Mapping[str, str]) -> Optional[int]:
    """The global rank of a worker, or None for a process that is not a rank (RANK and LOCAL_RANK unset)."""
    rank, local = _int(env, "RANK"), _int(env, "LOCAL_RANK")
    return rank if rank is not None and local is not None and rank >= 0 else None


def local_rank_of(env: Mapping[str, str]) -> Optional[int]:
    return _int(env, "LOCAL_RANK")


def world_size_of(env: Mapping[str, str]) -> Optional[int]:
    return _int(env, "WORLD_SIZE")


def run_id_of(env: Mapping[str, str]) -> Optional[str]:
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    return run_id if run_id and run_id != "none" else None


def same_job(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two ranks belong to the same job (same rendezvous), not merely to the same host."""
    return all(a.get(k) == b.get(k) for k in _JOB_KEYS)


def error_file(env: Mapping[str, str]) -> Optional[str]:
    """Where torchelastic's `@record` writes a worker's exception (the file may not exist yet, or ever)."""
    return env.get("TORCHELASTIC_ERROR_FILE") or None


def is_launcher(argv: list[str]) -> bool:
    """Whether a command line is torchrun's agent (`torchrun`, `python -m torch.distributed.run`, ...)."""
    return any(os.path.basename(a) in _LAUNCHERS or a in _LAUNCHERS for a in argv[:3])


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)")
_FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)")


def failures_in_output(text: str) -> dict[int, int]:
    """What torchrun's agent printed about failed workers: pid -> exit code (negative: killed by that signal).
    Read from its "failed (exitcode: 3) local_rank: 1 (pid: 4242)" line, printed the moment it sees a worker
    fail, and from its failure summary ("rank : 1 (local_rank: 1)" / "exitcode : 3 (pid: 4242)")."""
    out = {int(m.group(2)): int(m.group(1)) for m in _FAILED_LINE.finditer(text)}
    out.update({int(m.group(3)): int(m.group(2)) for m in _FAILURE.finditer(text)})
    return out


_SUMMARY_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def failures_by_rank(text: str) -> dict[int, int]:
    """rank -> exit code, from torchrun's failure summary: for ranks whose pid the bundle does not know (output
    pasted from a job run without blackbox)."""
    return {int(m.group(1)): int(m.group(2)) for m in _SUMMARY_RANK.finditer(text)}
