"""What the recorder's helpers (last words, the patch rooms) may ask of it: a shape for the type checker only,
so that none of them imports the recorder back. Imported under TYPE_CHECKING only; stdlib (typing) alone."""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol


class RecorderLike(Protocol):
    """The recorder as its helpers see it."""

    pid: int
    rank: int
    enabled: bool
    rank_dir: str

    def guard(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any: ...

    def hook_ok(self, hook: str) -> bool: ...

    def fail(self, hook: str, exc: BaseException) -> None: ...

    def context(self) -> dict[str, Any]: ...

    def mark_exception(self) -> None: ...


class PatchingRecorder(RecorderLike, Protocol):
    """The recorder as a patch room sees it: phases to enter and leave, and the list of strided patches."""

    _failed: set[str]
    _strided: list[list[Any]]

    def enter_phase(self, code: int, name: bytes = b"") -> tuple[int, float, bytes]: ...

    def exit_phase(self, previous: tuple[int, float, bytes], now: Optional[float] = None) -> None: ...

    def batch_delivered(self, previous: tuple[int, float, bytes], batch: Any, it: Any) -> None: ...

    def enter_collective(self, op: int, group: Any) -> tuple[int, float, bytes]: ...

    def joining(self, code: int) -> None: ...

    def counting(self, dist: Any) -> None: ...


class LiveRecorder(RecorderLike, Protocol):
    """The recorder as its liveness thread sees it."""

    mode: str
    hb: Any
    hb_path: str
    hb_ino: int
    motion: Any
    lastwords: Any
    torch: Any
    _stop: Any
    _failed: set[str]
    _striding: bool
    _last_step_time: float
    _versions_written: bool
    _liveness_interval: float

    def flush(self) -> None: ...

    def _pause_seen(self, now: float) -> None: ...


class DumpingRecorder(RecorderLike, Protocol):
    """The recorder as its dumps and state files see it (dumps.py)."""

    mode: str
    hb: Any
    lastwords: Any
    torch: Any
    _loader: Any
    _loader_written: Any
    _threads_written: dict[str, str]
    _versions_written: bool
    _annotations: dict[str, Any]
    _metrics: list[dict[str, Any]]
    _batches: int
    _data_wait: float
    _last_wait: float
