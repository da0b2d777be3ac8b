"""A patched function's phase: set by an `enter` while the function runs, restored after; the job's errors pass
through and a fault of ours switches the hook off. Stdlib only; the recorder's shape (seam) for the type checker."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from .seam import PatchingRecorder


def is_compiling(torch: Any) -> Callable[[], bool]:
    """torch.compiler.is_compiling where this torch has it: a phase wrapper steps aside while dynamo traces."""
    return getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def phase_wrapper(
    rec: PatchingRecorder,
    hook: str,
    fn: Callable[..., Any],
    enter: Callable[[tuple[Any, ...], dict[str, Any]], tuple[int, float, bytes]],
    skip: Optional[Callable[[], bool]] = None,
) -> Callable[..., Any]:
    """`fn` with the rank's phase set by `enter(args, kwargs)` while it runs and restored after; the job's
    own errors pass through untouched, and a fault of ours switches `hook` off."""
    import functools

    @functools.wraps(fn)
    def in_phase(*args: Any, **kwargs: Any) -> Any:
        if not rec.enabled or hook in rec._failed or (skip is not None and skip()):
            return fn(*args, **kwargs)
        try:
            previous = enter(args, kwargs)
        except Exception as exc:
            rec.fail(hook, exc)
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            try:
                rec.exit_phase(previous)
            except Exception as exc:
                rec.fail(hook, exc)

    in_phase.__blackbox_wrapped__ = True  # type: ignore[attr-defined]
    return in_phase


def entering(rec: PatchingRecorder, code: int) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[int, float, bytes]]:
    return lambda args, kwargs: rec.enter_phase(code)
