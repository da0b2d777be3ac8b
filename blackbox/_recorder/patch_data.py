"""The DataLoader room: phase `data` while the job waits in a DataLoader iterator's `__next__`, and the shapes of
the batch it delivered. Stdlib only; imports protocol, and the recorder's shape (seam) for the type checker."""

from __future__ import annotations

from . import protocol as P

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:
    from typing import Any, Optional

    from .seam import PatchingRecorder

MAX_BATCH_TENSORS = 32
SHAPES_EVERY = 64  # batches between two readings of the batch's shapes (and the first of every loader)


def batch_shapes(batch: Any, path: str = "batch", depth: int = 0, out: Optional[list[Any]] = None) -> list[Any]:
    """(path, shape, dtype) of the tensors in a batch: tuples, lists and dicts, three levels deep, bounded.
    Runs on every batch: shapes and dtypes are kept as objects, turned into text only by a dump."""
    if out is None:
        out = []
    shape = getattr(batch, "shape", None)
    if shape is not None and hasattr(batch, "dtype"):
        out.append((path, shape, batch.dtype))
    elif depth < 3 and isinstance(batch, (tuple, list)):
        for i, item in enumerate(batch):
            if len(out) >= MAX_BATCH_TENSORS or i >= 16:
                break
            batch_shapes(item, "%s[%d]" % (path, i), depth + 1, out)
    elif depth < 3 and isinstance(batch, dict):
        for i, (key, item) in enumerate(batch.items()):
            if len(out) >= MAX_BATCH_TENSORS or i >= 16:
                break
            batch_shapes(item, "%s[%r]" % (path, key), depth + 1, out)
    return out


def describe_batch(shapes: Any) -> Optional[list[dict[str, Any]]]:
    if not shapes:
        return None
    return [{"path": p, "shape": list(shape), "dtype": str(dtype).replace("torch.", "")} for p, shape, dtype in shapes]


def wrap_dataloader(rec: PatchingRecorder) -> None:
    """Phase `data` while the job waits in DataLoader `__next__` (the iterator class, not the user's loader)."""
    import functools
    import importlib

    cls = importlib.import_module("torch.utils.data.dataloader")._BaseDataLoaderIter
    original = cls.__next__
    if getattr(original, "__blackbox_wrapped__", False):
        return

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if not rec.enabled or "data" in rec._failed:
            return original(self)
        try:
            previous = rec.enter_phase(P.PHASE_DATA)
        except Exception as exc:
            rec.fail("data", exc)
            return original(self)
        try:
            batch = original(self)
        except BaseException:
            try:
                rec.exit_phase(previous)
            except Exception as exc:
                rec.fail("data", exc)
            raise
        try:
            rec.batch_delivered(previous, batch, self)
        except Exception as exc:
            rec.fail("data", exc)
        return batch

    __next__.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
    cls.__next__ = __next__
    rec._strided.append([cls, "__next__", original, __next__, P.PHASE_DATA])
