"""Setting up a run and the plain facts of processes: the run id, the command to run, the run directory, the
flight-recorder environment, exit codes of wait statuses, becoming a subreaper, and the unwatched fallback.
Imports the stdlib and blackbox's errors and rank protocol."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
from collections.abc import Mapping
from datetime import datetime, timezone

from .._recorder import protocol as P
from ..errors import EXIT_CANT_CREATE, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, BlackboxError

INJECT_DIR = os.path.join(os.path.dirname(os.path.abspath(P.__file__)), "inject")
_PR_SET_CHILD_SUBREAPER = 36


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def resolve_command(argv: list[str], env: Mapping[str, str]) -> str:
    """The executable the job will run, or a BlackboxError that says why it cannot be run."""
    if not argv:
        raise BlackboxError(
            "No command given: put the job's command line after `--`.",
            hint="For example: blackbox run -- torchrun --nproc-per-node 8 train.py",
        )
    cmd = argv[0]
    if os.sep in cmd:
        if not os.path.exists(cmd):
            raise BlackboxError(f"The command `{cmd}` does not exist.", exit_code=EXIT_NOT_FOUND)
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            raise BlackboxError(
                f"The command `{cmd}` is not executable.",
                hint=f"chmod +x {cmd}, or run it through its interpreter (python {cmd}).",
                exit_code=EXIT_NOT_EXECUTABLE,
            )
        return cmd
    found = shutil.which(cmd, path=env.get("PATH", os.defpath))
    if found is None:
        raise BlackboxError(
            f"The command `{cmd}` was not found on PATH.",
            hint="Check the spelling, or activate the environment that provides it.",
            exit_code=EXIT_NOT_FOUND,
        )
    return found


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
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(fr_dir, "pipe_"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    }
    return {name: env.get(name) or value for name, value in wanted.items()}


def exit_code_of(status: int) -> int:
    """The code a shell reports for a wait status: the exit code, or 128+N for a death by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def describe_status(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"died of signal {-code} ({signame(-code)})"
    return f"exited with code {code}"


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def become_subreaper() -> None:
    """Orphaned ranks (the launcher died) are handed to us instead of init, so we can find and end them."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def run_plain(argv: list[str], exe: str) -> int:
    import subprocess

    proc = subprocess.Popen([exe, *argv[1:]])
    while True:
        try:
            proc.wait()
            break
        except KeyboardInterrupt:
            continue
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
