"""Where each optimizer step's time goes: the step clock and the callback that runs and logs it.

[`StepClock`] splits the seconds of every optimizer step into `generation` (TRL's `_generate`), `scoring` (the reward
functions), `exchange` (the swarm round: waiting, admitting, sharing out), `training` (forward and backward of the
loss) and `other` (the rest of the step: batch-time log-probs, merging peer rows, the optimizer), with the generation
share `f = generation / step` ([`generation_share`]). Pure bookkeeping (no trainer, no collectives): `FTISTrainer`
owns one, logs it as `ftis/time/...` and saves its totals in checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from transformers import TrainerCallback

PHASES = ("generation", "scoring", "exchange", "training")
"""The timed phases of a step; `other` is the step's remainder."""
TIME_KEYS = ("step", *PHASES, "other")
"""The keys of `time_seconds` in the summary, in order."""


def generation_share(generation_seconds: float, step_seconds: float) -> float | None:
    """`f`: the part of the step time spent generating; `None` before any step."""
    if step_seconds <= 0:
        return None
    return min(max(generation_seconds / step_seconds, 0.0), 1.0)


def non_negative_total(value: Any, name: str) -> float:
    """`value`, a total read from a saved state (the clock's, the peer value's), as a float; `ValueError` naming
    `name` unless it is a finite number >= 0."""
    # One range check refuses NaN, inf and integers too large for a float (math.isfinite would overflow on them).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**63:
        raise ValueError(f"{name!r} is not a finite number >= 0")
    return float(value)


class StepClock:
    """Seconds per phase of the current optimizer step, and totals over the run.

    [`begin`] starts a step, [`measure`] times a phase inside it (phases do not nest: a phase measured inside
    another is counted in both, so the trainer times disjoint spans), [`end`] closes the step and returns its split.
    `clock` is `time.perf_counter` (a test passes a fake one): two calls per timed span, nothing measurable.
    `synchronize` (`torch.cuda.synchronize` on a GPU) is called before every reading ([`now`]): GPU work is
    asynchronous, and without it a phase's kernels would be counted in whichever phase waits for them next.
    """

    def __init__(self, clock=time.perf_counter, synchronize: Callable[[], None] | None = None):
        self._clock = clock
        self.synchronize = synchronize
        self._started: float | None = None
        self._current = dict.fromkeys(PHASES, 0.0)
        self.totals: dict[str, float] = dict.fromkeys(TIME_KEYS, 0.0)
        self.steps = 0

    def begin(self) -> None:
        """Start an optimizer step (its phases so far are dropped: they belong to no step)."""
        self._started = self.now()
        self._current = dict.fromkeys(PHASES, 0.0)

    def now(self) -> float:
        """The clock's reading once the device's queued work is done."""
        if self.synchronize is not None:
            self.synchronize()
        return self._clock()

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        """Add the time spent in the block to `phase` of the current step (also when it raises)."""
        if phase not in self._current:
            raise KeyError(f"{phase!r} is not a phase ({', '.join(PHASES)})")
        start = self.now()
        try:
            yield
        finally:
            self._current[phase] += self.now() - start

    def add(self, phase: str, seconds: float) -> None:
        """Add `seconds` measured by the caller to `phase` of the current step."""
        if phase not in self._current:
            raise KeyError(f"{phase!r} is not a phase ({', '.join(PHASES)})")
        self._current[phase] += seconds

    def end(self) -> dict[str, float] | None:
        """Close the step: its `step` seconds, each phase's, `other` (the remainder, never negative) and
        `generation_share`; added to [`totals`]. `None` when no step was begun."""
        if self._started is None:
            return None
        split = {"step": self.now() - self._started, **self._current}
        split["other"] = max(split["step"] - sum(self._current.values()), 0.0)
        for key in TIME_KEYS:
            self.totals[key] += split[key]
        self.steps += 1
        self._started = None
        self._current = dict.fromkeys(PHASES, 0.0)
        split["generation_share"] = generation_share(split["generation"], split["step"]) or 0.0
        return split

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "steps": self.steps}

    def load_state_dict(self, state: Any) -> None:
        """Restore [`state_dict`]; `ValueError` (nothing changed) unless every total is a finite number >= 0."""
        if not isinstance(state, Mapping):
            raise ValueError("'time' is not an object")  # noqa: TRY004 - a malformed file, not a wrong argument
        totals = state.get("totals")
        if not isinstance(totals, Mapping) or set(totals) != set(TIME_KEYS):
            raise ValueError(f"'time.totals' must have exactly {', '.join(TIME_KEYS)}")
        values = {key: non_negative_total(totals[key], f"time.totals.{key}") for key in TIME_KEYS}
        steps = state.get("steps")
        if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps <= 2**53:
            raise ValueError("'time.steps' is not a non-negative integer")
        self.totals, self.steps = values, steps


class StepClockCallback(TrainerCallback):
    """Opens and closes a [`StepClock`] around each optimizer step and logs its split with `log(name, seconds)` as
    `ftis/time/<phase>` (and `ftis/time/generation_share`).

    The clock runs from `on_step_begin` to `on_step_end`: the step's micro-batches and optimizer step, without the
    logging, saving and evaluation the Trainer does after `on_step_end`."""

    def __init__(self, clock: StepClock, log: Callable[[str, float], None]):
        self.clock, self.log = clock, log

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.begin()

    def on_step_end(self, args, state, control, **kwargs):
        split = self.clock.end()
        for name, seconds in (split or {}).items():
            self.log(f"ftis/time/{name}", seconds)
