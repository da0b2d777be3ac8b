"""Calls a callback with a module right after the job imports it, never importing anything itself.
Stdlib only; imports nothing of the package."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:
    from typing import Any, Callable


def watch_imports(callbacks: dict[str, Callable[[Any], None]]) -> None:
    """Call each callback with its module right after the job imports it; never import anything ourselves.
    (Modules already imported are handled at once.)"""
    pending = {}
    for name, callback in callbacks.items():
        if name in sys.modules:
            callback(sys.modules[name])
        else:
            pending[name] = callback
    if pending:
        sys.meta_path.insert(0, _ImportWatcher(pending))


class _ImportWatcher:
    def __init__(self, pending: dict[str, Callable[[Any], None]]) -> None:
        self.pending = pending

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.pending:
            return None
        callback = self.pending.pop(name)
        if not self.pending:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_notify(module: Any) -> None:
            exec_module(module)
            try:
                callback(module)
            except Exception:
                pass  # the callbacks guard their own hooks; nothing may reach the job's import

        try:
            loader.exec_module = exec_and_notify
        except Exception:
            return spec
        return spec
