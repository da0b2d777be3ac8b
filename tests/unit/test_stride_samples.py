"""The stride's sample spacing (blackbox/_recorder/stride.py): a sample of SAMPLE_STEPS hooked steps every
SAMPLE_STEPS * STRIDE_EVERY steps, and SAMPLE_GAP_S after the one before at the earliest. Driven through the step hook
with the recorder's clock replaced; the strided hook is a plain attribute swapped in and out."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from blackbox._recorder import protocol as P
from blackbox._recorder import recorder as R
from blackbox._recorder import stride as S


def sample_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_s: float, steps: int) -> list[int]:
    """The step counts at which a sample began, in a loop of `steps` steps of `step_s` each."""
    clock = [1000.0]
    monkeypatch.setattr(R, "_monotonic", lambda: clock[0])
    monkeypatch.delenv(P.ENV_STRIDE, raising=False)
    rec = R.Recorder(str(tmp_path), 0, 0, 1, "rank")

    def original() -> None: ...
    def wrapper() -> None: ...  # fmt: skip

    owner = types.SimpleNamespace(load=wrapper)
    rec._strided.append([owner, "load", original, wrapper, P.PHASE_DATA])
    starts, hooked = [], 0
    for _ in range(steps):
        clock[0] += step_s
        rec.step()
        if rec.samples > len(starts):
            starts.append(rec.step_count)
        hooked += owner.load is wrapper
    assert rec._striding and hooked <= len(starts) * S.SAMPLE_STEPS + S.STRIDE_AFTER + 1  # hooks out in between
    return starts


def test_short_steps_are_sampled_a_second_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN steps of 1 ms: 256 of them (the step-count period) take a quarter of a second
    starts = sample_starts(tmp_path, monkeypatch, 0.001, 10_000)
    # THEN a sample begins a second after the one before (within one stretch of STRIDE_EVERY steps), no sooner
    gaps = {b - a for a, b in zip(starts, starts[1:])}
    assert len(starts) >= 8
    assert all(1000 <= gap <= 1000 + S.STRIDE_EVERY for gap in gaps), gaps


def test_longer_steps_keep_the_step_count_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN steps of 5 ms: 256 of them take 1.28 s, over the gap
    starts = sample_starts(tmp_path, monkeypatch, 0.005, 3_000)
    # THEN the samples come every SAMPLE_STEPS * STRIDE_EVERY steps, as before the gap
    gaps = {b - a for a, b in zip(starts, starts[1:])}
    assert gaps == {S.SAMPLE_STEPS * S.STRIDE_EVERY}, gaps
