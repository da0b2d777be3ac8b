"""The stride: in a loop of short steps the recorder's data and backward hooks are taken out between sampled steps,
and the time they would have seen is moved out of compute by the samples' shares. A base of Recorder (its state lives
in the recorder's slots: the step path reads it in place). Stdlib only; imports protocol alone."""

from __future__ import annotations

import sys

from . import protocol as P

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds at start-up
if TYPE_CHECKING:  # annotations only
    from typing import Any, Optional

# The stride: in a loop of short steps the data and backward hooks are taken out between sampled steps (see _stride).
STRIDE_STEP_S = 0.01  # a step shorter than this is short ...
STRIDE_AFTER = 64  # ... and this many short steps in a row start the stride
STRIDE_EVERY = 64  # one step in this many at most is sampled (BLACKBOX_STRIDE overrides; 1: never stride) ...
SAMPLE_STEPS = 4  # ... SAMPLE_STEPS in a row: each putting in and taking out costs more than a hooked step
SAMPLE_GAP_S = 1.0  # ... and a sample begins this long after the one before at the earliest (a step of 1.75 ms: 571)
SAMPLE_KEEP = 0.75  # each sample's weight in the next estimate: the shares average about the last 4 samples
STRIDE_PAUSE_S = 0.25  # no step for this long while striding: the liveness thread ends the stride
STRIDE_FRAMES = 128  # frames of the main thread searched for an unhooked backward or DataLoader call


class Stride:
    """The stride's methods; Recorder inherits them and holds their state (see Recorder.__init__; a base without
    __slots__ gives the recorder its __dict__ beside its slots)."""

    if TYPE_CHECKING:  # the recorder's state these methods use
        _short: int
        _left: int
        _striding: bool
        _hooks_in: bool
        _unhooked_steps: int
        _strided: list[list[Any]]
        _stride_every: int
        _sample_from: list[float]
        _sample_at: float
        _unhooked_from: Optional[list[float]]
        _shares: list[tuple[int, float]]
        _base: int
        _batches_per_step: float
        _sampled: list[float]
        _weight: float
        _stale: int
        _batches: int
        _data_wait: float
        _phase: tuple[int, float, bytes]
        _last_step_time: float
        _collective_op: int
        _collective_seq: int
        samples: int
        motion: Any
        hb: Any

        def hook_ok(self, hook: str) -> bool: ...
        def fail(self, hook: str, exc: BaseException) -> None: ...

    # In place, between a step's torch work, the data and backward hooks cost about 20 µs a step on a 2-core VM:
    # nothing for a 100 ms step, well over 1 % of a 1.5 ms one. After STRIDE_AFTER steps in a row shorter than
    # STRIDE_STEP_S they are taken out (the originals put back) and put in for one step in STRIDE_EVERY: a sample of
    # SAMPLE_STEPS steps in a row every SAMPLE_STEPS * STRIDE_EVERY (putting the hooks in and taking them out costs
    # tens of µs in place, more than a hooked step), and SAMPLE_GAP_S after the one before at the earliest: a sample
    # costs about 200 µs in place, so the shorter the steps, the more of them between two samples. Steps, collectives
    # and checkpoints stay exact. The time an unhooked step spends in data and backward accrues to the phase it runs
    # in (compute) and is moved, at the next sample, by the recent samples' shares; batches are counted alike. A slow
    # step ends the stride; so does a pause, seen by the liveness thread, which then names the phase from the main
    # thread's stack (an unhooked DataLoader or backward call) and puts the hooks back. A job that uses torch.compile
    # never strides (dynamo guards on the globals the hooks swap).
    def _stride(self, now: float) -> None:
        try:
            if self.motion.compiling:  # hooks coming and going under torch.compile could make dynamo recompile
                self._short = -(1 << 62)  # never again
                self._stride_stop(now)
                return
            if not self._striding:
                if self._stride_every <= 1 or not self._strided or not self.hook_ok("stride"):
                    self._short = -(1 << 62)  # never: not asked again
                    return
                self._striding = True
                self._begin_sample(now)
                return
            self._unhooked_steps += not self._hooks_in
            if self._hooks_in:
                self._end_sample(now)
            elif now - self._sample_at < SAMPLE_GAP_S:  # too soon: a little longer unhooked
                self._left = self._stride_every
            else:
                self._begin_sample(now)
        except Exception as exc:
            self._short = -(1 << 62)
            self.fail("stride", exc)
            try:
                self._stride_stop(now)
            except Exception:
                pass

    def _counts(self, now: float) -> list[float]:
        return [*self.hb.spent(now), float(self._batches)]

    def _begin_sample(self, now: float) -> None:
        counts = self._counts(now)
        self._settle(counts)
        self._set_hooks(True)
        self._sample_from = counts
        self._sample_at = now
        self._left = SAMPLE_STEPS
        self.samples += 1

    def _end_sample(self, now: float) -> None:
        counts = self._counts(now)
        base = P.ledger_slot(self._phase[0])
        if base != self._base or not self._sampled:
            self._sampled, self._weight = [0.0] * len(counts), 0.0
        self._base = base
        # a moving average over the last few samples (one sample alone is too noisy an estimate)
        self._sampled = [kept * SAMPLE_KEEP + b - a for kept, a, b in zip(self._sampled, self._sample_from, counts)]
        self._weight = self._weight * SAMPLE_KEEP + 1.0
        sampled = self._sampled
        hidden = [P.ledger_slot(P.PHASE_DATA), P.ledger_slot(P.PHASE_BACKWARD)]
        total = sampled[base] + sum(sampled[slot] for slot in hidden)
        ok = total > 0 and base not in hidden
        self._shares = [(slot, sampled[slot] / total) for slot in hidden] if ok else []
        self._batches_per_step = sampled[-1] / (self._weight * SAMPLE_STEPS)
        self._set_hooks(False)
        self._unhooked_from = counts
        self._unhooked_steps = 0
        self._left = SAMPLE_STEPS * (self._stride_every - 1)

    def _settle(self, counts: list[float]) -> None:
        """The unhooked stretch's data and backward time, moved out of the base phase by the sample's shares (and
        `counts`, the ledger now, moved alike)."""
        start, self._unhooked_from = self._unhooked_from, None
        if start is None:
            return
        hidden = counts[self._base] - start[self._base]
        if hidden > 0 and self._shares:
            moves = [(slot, hidden * share) for slot, share in self._shares]
            self.hb.shift(self._base, moves)
            for slot, seconds in moves:
                counts[slot] += seconds
                counts[self._base] -= seconds
            self._data_wait += dict(moves).get(P.ledger_slot(P.PHASE_DATA), 0.0)
        batches = round(self._batches_per_step * self._unhooked_steps)
        self._batches += batches
        counts[-1] += batches
        self._unhooked_steps = 0
        self.hb.data(self._data_wait, self._batches)

    def _set_hooks(self, on: bool) -> None:
        """Put the strided hooks in (on) or take them out; one someone else has replaced since is left alone, for
        good."""
        for entry in list(self._strided):
            owner, name, original, wrapper, _phase = entry
            current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
            if current is (original if on else wrapper):
                setattr(owner, name, wrapper if on else original)
            elif current is not (wrapper if on else original):
                self._strided.remove(entry)
        self._hooks_in = on

    def _stride_stop(self, now: float) -> None:
        """Back to every step hooked (a slow step, a pause, a fault)."""
        self._short = min(self._short, 0)
        self._left = 0
        if not self._striding:
            return
        self._striding = False
        self._sampled = []
        if not self._hooks_in:
            self._settle(self._counts(now))
            self._set_hooks(True)

    def _pause_seen(self, now: float) -> None:
        """Liveness thread: the rank stopped stepping while striding. The hooks go back in (for the calls to come),
        and the call the main thread is in now, if it is an unhooked DataLoader batch or backward, names the phase."""
        unhooked = not self._hooks_in
        self._stride_stop(now)
        if not unhooked:
            return
        codes = {getattr(entry[2], "__code__", None): entry[4] for entry in self._strided}
        main = self.motion.main
        frame = sys._current_frames().get(main) if main is not None else None
        for _ in range(STRIDE_FRAMES):
            if frame is None:
                return
            phase = codes.get(frame.f_code)
            if phase is not None:
                break
            frame = frame.f_back
        else:
            return
        start = max(self._last_step_time, self._phase[1])  # it began after the last step (and the last edge)
        self._phase = (phase, start, b"")
        self.hb.phase(phase, start, self._collective_op, self._collective_seq)
        self._stale = phase
