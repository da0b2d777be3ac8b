"""The collectives room: torch.distributed's collectives run in the rank's `collective` phase, with the op and
the group's sequence number; init_process_group says when the rank is joining and when it has joined, and from then
on the ring holds torch's count of the default group's collectives, until destroy_process_group. Stdlib only;
imports protocol and patch_phase."""

from __future__ import annotations

import functools

from . import protocol as P
from .patch_phase import is_compiling, phase_wrapper

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:
    from typing import Any, Callable

    from .seam import PatchingRecorder


def wrap_collectives(rec: PatchingRecorder, torch: Any) -> None:
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    compiling = is_compiling(torch)

    def wrap(fn: Callable[..., Any], op: int) -> Callable[..., Any]:
        try:  # where the `group` argument sits, for the per-group sequence number
            group_at = fn.__code__.co_varnames[: fn.__code__.co_argcount].index("group")
        except (AttributeError, ValueError):
            group_at = -1

        def enter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, float, bytes]:
            if "group" in kwargs:
                return rec.enter_collective(op, kwargs["group"])
            return rec.enter_collective(op, args[group_at] if 0 <= group_at < len(args) else None)

        return phase_wrapper(rec, "collectives", fn, enter, skip=compiling)

    for op, name in enumerate(P.COLLECTIVE_OPS):
        fn = getattr(dist, name, None) if op else None
        if fn is None or getattr(fn, "__blackbox_wrapped__", False):
            continue
        setattr(dist, name, wrap(fn, op))
    init = getattr(dist, "init_process_group", None)
    if init is not None and not getattr(init, "__blackbox_wrapped__", False):
        dist.init_process_group = _joining(rec, dist, init)
    destroy = getattr(dist, "destroy_process_group", None)
    if destroy is not None and not getattr(destroy, "__blackbox_wrapped__", False):
        dist.destroy_process_group = _leaving(rec, dist, destroy)


def _joining(rec: PatchingRecorder, dist: Any, init: Callable[..., Any]) -> Callable[..., Any]:
    """init_process_group, with the rank's join word set as it enters (the rendezvous) and as it returns."""

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rec.guard("join", rec.joining, P.JOIN_JOINING)
        try:
            result = init(*args, **kwargs)
        except BaseException:
            rec.guard("join", rec.joining, P.JOIN_NOT_YET)  # it gave up (a timeout): no longer waiting there
            raise
        rec.guard("join", rec.joining, P.JOIN_JOINED)
        rec.guard("join", rec.counting, dist)
        return result

    init_process_group.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
    return init_process_group


def _leaving(rec: PatchingRecorder, dist: Any, destroy: Callable[..., Any]) -> Callable[..., Any]:
    """destroy_process_group, with the ring's count of the default group's collectives dropped first (the group's
    getter is not called on a group torch has shut down, nor is the group kept alive by it)."""

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("group")
        if group is None or group is getattr(getattr(dist, "group", None), "WORLD", None):
            rec.guard("join", rec.counting, None)
        return destroy(*args, **kwargs)

    destroy_process_group.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
    return destroy_process_group
