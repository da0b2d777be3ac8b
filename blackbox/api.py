"""The public API a training script may call: step(), phase(), annotate(), log_metrics().
Each is a no-op outside `blackbox run`. Stdlib only: importing blackbox in a rank must stay cheap."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, Optional

_RECORDER_MODULE = "_blackbox_recorder.recorder"  # where the injected sitecustomize loaded the recorder


def _active() -> Any:
    module = sys.modules.get(_RECORDER_MODULE)
    rec = getattr(module, "ACTIVE", None)
    return rec if rec is not None and rec.enabled else None


def step() -> None:
    """Count one training step (for loops that do not use torch.optim; once called, optimizer steps
    are no longer counted automatically)."""
    rec = _active()
    if rec is not None:
        try:
            rec.step()
        except Exception as exc:
            rec.fail("api.step", exc)


class phase:
    """`with blackbox.phase("eval"): ...` marks what the rank is doing. `checkpoint` and `eval` get their
    own, longer stall timeouts; any other name is shown as given (at most 32 bytes)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._previous: Optional[tuple[int, float, bytes]] = None
        self._rec: Any = None

    def __enter__(self) -> phase:
        rec = _active()
        if rec is not None:
            try:
                from _blackbox_recorder import protocol as P  # type: ignore[import-not-found]

                code = P.PHASE_CODES.get(self.name, P.PHASE_CUSTOM)
                self._previous = rec.enter_phase(code, self.name.encode("utf-8")[:32])
                self._rec = rec
            except Exception as exc:
                rec.fail("api.phase", exc)
        return self

    def __exit__(
        self, tp: Optional[type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        rec, self._rec = self._rec, None
        if rec is not None and self._previous is not None:
            try:
                rec.exit_phase(self._previous)
            except Exception as exc:
                rec.fail("api.phase", exc)


def annotate(**fields: Any) -> None:
    """Attach facts to this rank's record (dataset shard, experiment name ...); they land in the bundle."""
    rec = _active()
    if rec is not None:
        try:
            rec.annotate(fields)
        except Exception as exc:
            rec.fail("api.annotate", exc)


def log_metrics(step: Optional[int] = None, **metrics: Any) -> None:
    """Keep the recent metrics (loss, lr, ...) of this rank; the last 256 entries land in the bundle."""
    rec = _active()
    if rec is not None:
        try:
            rec.log_metrics(step, metrics)
        except Exception as exc:
            rec.fail("api.log_metrics", exc)
