"""The supervisor's poll guard: a process of the job that ends while a poll reads it skips that poll (an event), and
the watch goes on; the same race poll after poll, or any other error, is a bug that stops the watch, said once."""

from __future__ import annotations

from typing import Any

from blackbox.supervisor.supervisor import RACES_TOLERATED, Supervisor


class Ctx:
    def __init__(self) -> None:
        self.watching = True
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.errors: list[str] = []

    def event(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))

    def internal_error(self, where: str, exc: BaseException) -> None:
        self.errors.append(f"{where}: {exc!r}")


def guard(fails: list[BaseException | None]) -> tuple[Supervisor, Ctx]:
    sup = Supervisor.__new__(Supervisor)  # the guard alone: no job, no watch
    ctx = Ctx()
    sup.ctx = ctx  # type: ignore[assignment]
    sup._raced = 0
    queue = list(fails)

    def poll() -> None:
        exc = queue.pop(0)
        if exc is not None:
            raise exc

    sup._poll = poll  # type: ignore[method-assign]
    return sup, ctx


def test_a_rank_ending_mid_poll_skips_that_poll_and_the_watch_goes_on() -> None:
    sup, ctx = guard([ProcessLookupError(3, "No such process"), None, FileNotFoundError(2, "gone"), None])
    for _ in range(4):
        sup._poll_guarded()
    assert ctx.watching and not ctx.errors
    assert [name for name, _ in ctx.events] == ["poll_skipped", "poll_skipped"]
    assert "ProcessLookupError" in ctx.events[0][1]["error"] and "Traceback" in ctx.events[0][1]["traceback"]


def test_the_same_race_poll_after_poll_or_another_error_stops_the_watch() -> None:
    sup, ctx = guard([ProcessLookupError(3, "No such process")] * RACES_TOLERATED)
    for _ in range(RACES_TOLERATED):
        sup._poll_guarded()
    assert not ctx.watching and ctx.errors == ["watch: ProcessLookupError(3, 'No such process')"]
    sup, ctx = guard([KeyError("x")])
    sup._poll_guarded()
    assert not ctx.watching and ctx.errors == ["watch: KeyError('x')"]
