"""Pickles from untrusted bundles (flight-recorder traces, CUDA memory snapshots): an unpickler that admits only
plain data — dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None — and refuses any class or
function reference, the way a pickle runs code. Imports the stdlib only."""

from __future__ import annotations

import io
import pickle
from typing import Any


class PlainPickleError(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise PlainPickleError(f"it references `{module}.{name}`; only plain data is read")


def load_plain(data: bytes, limit: int, what: str) -> Any:
    """Unpickle `data` (a `what`, for the messages) if it is plain data of at most `limit` bytes."""
    if len(data) > limit:
        raise PlainPickleError(f"the {what} is {len(data)} bytes, over the {limit} byte limit")
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except PlainPickleError as exc:
        raise PlainPickleError(f"the {what} cannot be read: {exc}") from None
    except Exception as exc:
        raise PlainPickleError(f"the {what} is not a readable pickle: {exc}") from None


def load_plain_dict(data: bytes, limit: int, what: str, key: str, kind: str) -> dict[str, Any]:
    """A plain-data pickle that must be a dict holding `key` (else: "the dump is not a <kind> (no `key`)")."""
    obj = load_plain(data, limit, what)
    if not isinstance(obj, dict) or key not in obj:
        raise PlainPickleError(f"the {what} is not a {kind} (no `{key}`)")
    return obj
