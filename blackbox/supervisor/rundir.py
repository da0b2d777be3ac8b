"""The run directory and what the job is given to find it: the run id, the directory made private, the injected
recorder's path, and the flight recorder's dump settings. Imports the stdlib, blackbox's errors and the rank
protocol."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from datetime import datetime, timezone

from .._recorder import protocol as P
from ..errors import EXIT_CANT_CREATE, BlackboxError

INJECT_DIR = os.path.join(os.path.dirname(os.path.abspath(P.__file__)), "inject")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def prepare_run_dir(path: str) -> str:
    """Create the run directory, private (0700), and refuse one that already holds a run. A directory that exists
    already (a shared group directory given with --run-dir) keeps its modes: only what blackbox creates is 0700."""
    path = os.path.abspath(path)
    if os.path.exists(os.path.join(path, P.EVENTS_LOG)):
        raise BlackboxError(
            f"The run directory `{path}` already holds a run.",
            hint="Give a new --run-dir, or leave it out to get a fresh one under ./blackbox-runs.",
        )
    try:
        existed = os.path.isdir(path)
        os.makedirs(path, mode=0o700, exist_ok=True)
        if not existed:
            os.chmod(path, 0o700)
        for sub in (P.RANKS_DIR, P.BUNDLES_DIR):
            os.makedirs(os.path.join(path, sub), mode=0o700, exist_ok=True)
        probe = os.path.join(path, ".write-test")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise BlackboxError(
            f"Cannot use `{path}` as the run directory: {exc.strerror or exc}.",
            hint="Pass --run-dir (or BLACKBOX_RUN_DIR) pointing at a writable directory.",
            exit_code=EXIT_CANT_CREATE,
        ) from None
    return path


def flight_recorder_env(run_dir: str, env: Mapping[str, str]) -> dict[str, str]:
    """What the job needs for flight-recorder dumps. The buffer size and dump file names differ between torch
    releases (and the old ones print deprecation warnings on new ones), so the rank recorder sets those for
    the torch it finds, from BLACKBOX_FR_DIR. Async error handling 3 keeps a process alive long enough to dump
    on an NCCL timeout (torchrun's default, 1, tears it down first). Values the user set are kept."""
    fr_dir = os.path.join(run_dir, P.FR_DIR)
    os.makedirs(fr_dir, mode=0o700, exist_ok=True)
    wanted = {
        P.ENV_FR_DIR: fr_dir,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        # the debug pipe through which the collector asks NCCL's watchdog for the flight recorder of a rank whose
        # Python cannot run (adapters.nccl_pipe): the name each torch release reads (an unread one changes nothing)
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(fr_dir, "pipe_"),
        "TORCH_FR_DEBUG_INFO_PIPE_FILE": os.path.join(fr_dir, "pipe_"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    }
    return {name: env.get(name) or value for name, value in wanted.items()}
