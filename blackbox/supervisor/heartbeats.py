"""Reads every local rank's heartbeat file each poll, remapping a file a restarted rank replaced.
Imports the stdlib and the heartbeat decoder."""

from __future__ import annotations

import mmap
import os
from typing import Callable

from .._recorder import protocol as P
from ..heartbeat import HeartbeatFormatError, HeartbeatState, decode


class HeartbeatTable:
    def __init__(self, ranks_dir: str, on_error: Callable[[str, str], None]) -> None:
        self.ranks_dir = ranks_dir
        self.on_error = on_error  # (path, message), reported once per path and message
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}
        self._errors: set[tuple[str, str]] = set()

    def read(self) -> list[HeartbeatState]:
        try:
            names = os.listdir(self.ranks_dir)
        except FileNotFoundError:
            return []
        states = []
        for name in sorted(names, key=lambda n: (len(n), n)):
            path = os.path.join(self.ranks_dir, name, "heartbeat")
            try:
                ino = os.stat(path).st_ino
                cached = self._maps.get(path)
                if cached is None or cached[0] != ino:
                    if cached is not None:
                        cached[1].close()
                    with open(path, "rb") as f:
                        self._maps[path] = (ino, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                states.append(decode(self._maps[path][1]))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, HeartbeatFormatError) as exc:
                key = (path, str(exc))
                if key not in self._errors:
                    self._errors.add(key)
                    self.on_error(path, str(exc))
        return states

    def request_dump(self, rank: int) -> int:
        """Ask a rank for its own dump (its daemon thread watches this word); returns the request number."""
        path = os.path.join(self.ranks_dir, str(rank), "heartbeat")
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            words = memoryview(mm).cast("Q")
            try:
                request = int(words[P.W_DUMP_REQUEST]) + 1
                words[P.W_DUMP_REQUEST] = request  # the supervisor is this word's only writer
            finally:
                words.release()
        return request

    def close(self) -> None:
        for _, mm in self._maps.values():
            mm.close()
        self._maps.clear()
