"""The one error type of blackbox and the exit codes that are part of its API.
Imports nothing of blackbox; caught in exactly one place, the CLI entry point."""

from __future__ import annotations

from typing import Optional

EXIT_USAGE = 2  # bad command line, bad configuration, bad input file
EXIT_INTERNAL = 70  # a bug in blackbox (run with BLACKBOX_DEBUG=1 for the traceback)
EXIT_CANT_CREATE = 73  # the run directory (or another output) cannot be created or written
EXIT_NO_PERMISSION = 77  # another user's process: blackbox may not read or trace it
EXIT_STALL_ENDED = 86  # `blackbox run` ended the job itself after a hang (stall, frozen; busy with `--on-busy kill`)
# ... after a hang of ranks that had all finished training and could not exit: its work is done, not to be rerun
EXIT_ENDED_AFTER_TRAINING = 87
EXIT_NOT_EXECUTABLE = 126  # the job's command exists but cannot be executed
EXIT_NOT_FOUND = 127  # the job's command does not exist


class BlackboxError(Exception):
    """A failure the user can act on: `message` is one sentence (values in backticks), `hint` the fix."""

    def __init__(self, message: str, hint: Optional[str] = None, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
