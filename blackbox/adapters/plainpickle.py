"""Pickles from untrusted bundles (flight-recorder traces, CUDA memory snapshots): an unpickler that admits only
plain data — dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None — and refuses any class or
function reference, the way a pickle runs code. Imports the stdlib only."""

from __future__ import annotations

import io
import pickle
from typing import Any

MAX_DEPTH = 100


class PlainPickleError(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise PlainPickleError(f"it references `{module}.{name}`; only plain data is read")


def _check_tree(obj: Any, budget: int) -> None:
    """Refuse a pickle whose containers share references so much that walking it as a tree (what every reader of
    it does: torch's analyzer, str(), json) would visit more than `budget` items: 60 levels of `[x, x]` are a
    few hundred bytes and 2**60 paths. A tree costs at least one opcode byte per item, so the budget (a multiple of
    the pickle's size) never refuses one. Nesting deeper than MAX_DEPTH is refused too: readers recurse."""
    stack, seen = [(obj, 0)], 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > budget:
            raise PlainPickleError(f"its shared references expand past {budget} items")
        if depth > MAX_DEPTH:
            raise PlainPickleError(f"it nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((x, depth + 1) for x in item)
            stack.extend((x, depth + 1) for x in item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((x, depth + 1) for x in item)


def load_plain(data: bytes, limit: int, what: str) -> Any:
    """Unpickle `data` (a `what`, for the messages) if it is plain data of at most `limit` bytes, a tree (not a
    DAG that would expand exponentially) and not nested deeper than the interpreter can follow."""
    if len(data) > limit:
        raise PlainPickleError(f"the {what} is {len(data)} bytes, over the {limit} byte limit")
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
        _check_tree(obj, 16 * len(data) + 100_000)
        return obj
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
