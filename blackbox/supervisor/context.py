"""What every room of the supervisor shares: the run's identity and configuration, its logs, and how it speaks —
through `say` (a line on stderr, written by a thread of its own: a stderr nobody reads never stops the watch),
`event` (a record in events.jsonl) and `internal_error` (blackbox's own bug: said once, logged with its traceback,
never the job's problem). Imports the stdlib and blackbox's config and logs."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Mapping
from typing import Callable, Optional

from .._recorder import protocol as P
from ..config import RunConfig
from ..events import EventLog
from .console_log import ConsoleLogProcess
from .rundir import INJECT_DIR, flight_recorder_env
from .speaker import Speaker


class RunContext:
    def __init__(self, argv: list[str], cfg: RunConfig, env: Mapping[str, str], say: Callable[[str], None],
                 run_id: str, node: str, run_dir: str, cwd: str) -> None:  # fmt: skip
        self.argv = list(argv)
        self.cfg = cfg
        self.env = dict(env)
        self.run_id = run_id
        self.node = node
        self.run_dir = run_dir
        self.cwd = cwd  # where blackbox was started, read once (it may be removed while the job runs)
        self.events: Optional[EventLog] = None
        self.console: Optional[ConsoleLogProcess] = None
        self.watching = True  # False once the watch itself failed: the job goes on unwatched
        self.bundles: list[str] = []  # the bundles this node wrote, in order
        self._speaker = Speaker(say, lambda line: self.event("unsaid", line=line))
        self._said_once: set[str] = set()
        self.listeners: list[Callable[[str, dict[str, object]], None]] = []  # told every event (the metrics)

    def say(self, message: str) -> None:
        """Queue a line for stderr: returns at once, whether or not anything reads it."""
        self._speaker.say(message)

    def start_speech(self) -> None:
        """Lines said so far go out, and each from now on as it is said (after console.log's process is forked)."""
        self._speaker.start()

    def close_speech(self) -> None:
        """The run ends: the queued lines out (bounded when stderr takes nothing; those are kept in events.jsonl)."""
        self._speaker.close()

    def first(self, key: str) -> bool:
        """True the first time `key` is asked for in this run: what is said or logged once."""
        if key in self._said_once:
            return False
        self._said_once.add(key)
        return True

    def say_once(self, key: str, message: str) -> None:
        if self.first(key):
            self.say(message)

    def event(self, name: str, **fields: object) -> None:
        if self.events is not None:
            self.events.write(name, **fields)
        for listener in self.listeners:
            with contextlib.suppress(Exception):
                listener(name, fields)

    def internal_error(self, where: str, exc: BaseException) -> None:
        self.event("error", where=where, error=repr(exc), traceback=traceback.format_exc())
        self.say_once(
            f"internal:{where}",
            f"internal error while {'watching' if where == 'watch' else 'handling ' + where}: {exc!r}; "
            "the job goes on" + (" unwatched" if where == "watch" else "") + " (details in events.jsonl)",
        )

    def job_env(self) -> dict[str, str]:
        """The job's environment: the user's, with the recorder injected and pointed at the run directory."""
        env = dict(self.env)
        env.pop(P.ENV_RECORDER, None)  # blackbox run inside a rank: the job's ranks are ranks of their own
        pythonpath = env.get("PYTHONPATH")
        env["PYTHONPATH"] = INJECT_DIR + (os.pathsep + pythonpath if pythonpath else "")
        env[P.ENV_RUN_DIR] = self.run_dir
        env[P.ENV_RUN_ID] = self.run_id
        if self.cfg.cuda_memory_history:
            env[P.ENV_CUDA_MEMORY_HISTORY] = str(self.cfg.cuda_memory_history)
        env.update(flight_recorder_env(self.run_dir, env))
        return env

    def rank_file(self, rank: int, name: str) -> str:
        return os.path.join(self.run_dir, P.RANKS_DIR, str(rank), name)
