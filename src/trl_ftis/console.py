"""What a person reads in a terminal: one short line per logged step instead of Trainer's dict of every metric (76
keys, ~2.7 KB, no step number), and the dependencies' deprecation notices a user cannot act on, hidden.

The full metrics stay in the trackers and `trainer.state.log_history`. The launcher turns both on for its peers
with the environment switch [`trl_ftis.shared_names.CONSOLE_ENV`] (read by [`apply_console_env`], which `FTISTrainer`
calls); scripts call `trl_ftis.dependency_warnings.quiet_dependency_warnings` (before importing transformers: this
module imports it) and [`use_step_lines`] themselves, or [`use_script_console`] (the examples: step lines unless
`CONSOLE_ENV=dict`). Standard library and transformers only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from .dependency_warnings import quiet_dependency_warnings
from .shared_names import CONSOLE_DICTS, CONSOLE_ENV, CONSOLE_LINES


def step_line(
    step: int, max_steps: int, logs: Mapping[str, Any], elapsed: float, *, first_step: int = 0
) -> str | None:
    """`step 3/30  reward 0.412  peer rows 128  filtered 4  w 0.97  12s  eta 1m52s` for a training step's logs
    (`None` for logs without a reward: evaluation, the end-of-training totals). `elapsed` is the time since training
    began at step `first_step` (a resumed run's checkpoint step); the ETA ([`eta`]) is left out when it is unknown."""
    if "reward" not in logs:
        return None
    parts = [f"step {step}/{max_steps}", f"reward {logs['reward']:.3f}"]
    if "ftis/peer_rows_accepted" in logs:
        parts.append(f"peer rows {logs['ftis/peer_rows_accepted']:.0f}")
        parts.append(f"filtered {logs.get('ftis/peer_rows_filtered', 0):.0f}")
    if "ftis/peer/is_weight_mean" in logs:
        parts.append(f"w {logs['ftis/peer/is_weight_mean']:.2f}")
    parts.append(f"{elapsed:.0f}s")
    left = eta(step, max_steps, elapsed, first_step)
    if left is not None:
        parts.append(f"eta {format_duration(left)}")
    return "  ".join(parts)


def eta(step: int, max_steps: int, elapsed: float, first_step: int = 0) -> float | None:
    """Seconds until `max_steps`, at the mean step time of this run so far (the steps since `first_step`, so that a
    resumed run does not count the checkpoint's steps as done in no time); `None` without a known end, before the
    first step of this run, or once there is nothing left."""
    done = step - first_step
    if max_steps <= 0 or done <= 0 or step >= max_steps:
        return None
    return elapsed / done * (max_steps - step)


def format_duration(seconds: float) -> str:
    """`45s`, `1m20s`, `2h13m`: short enough for a step line."""
    seconds = round(max(seconds, 0.0))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class StepLineCallback(TrainerCallback):
    """Prints [`step_line`] for each logged training step (on the main process), prefixed with `prefix`."""

    def __init__(self, prefix: str = "", write: Callable[[str], None] | None = None):
        self.prefix, self.write = prefix, write or (lambda line: print(line, flush=True))
        self.started = time.time()
        self.first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.time()  # seconds of training, not of the set-up before it
        self.first_step = state.global_step  # a resumed run starts at its checkpoint's step: the ETA counts from it

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        elapsed = time.time() - self.started
        line = step_line(state.global_step, state.max_steps, logs, elapsed, first_step=self.first_step)
        if line is not None:
            self.write(self.prefix + line)


def use_step_lines(trainer, prefix: str = "") -> StepLineCallback:
    """Replace the Trainer's printing of every logged dict (`PrinterCallback`, or the dict lines of its
    `ProgressCallback`) with one [`StepLineCallback`] line a step; the progress bar, if any, stays."""
    trainer.remove_callback(PrinterCallback)
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, StepLineCallback):  # once: a script may call this after the launcher's switch did
            return callback
        if isinstance(callback, ProgressCallback):
            callback.on_log = lambda *args, **kwargs: None  # its bar stays; only the dict lines go
    line = StepLineCallback(prefix)
    trainer.add_callback(line)
    return line


def apply_console_env(trainer) -> bool:
    """With `CONSOLE_ENV=lines` (the launcher sets it for its peers): quiet dependency warnings, step lines, and no
    transformers progress bars (loading and saving shards: a peer's log is a stream of lines, not a terminal)."""
    if os.environ.get(CONSOLE_ENV, "").strip().lower() != CONSOLE_LINES:
        return False
    quiet_dependency_warnings()
    use_step_lines(trainer)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    return True


def use_script_console(trainer) -> bool:
    """What the example scripts call: step lines (and quiet dependency warnings) unless `CONSOLE_ENV=dict` asks for
    Trainer's dicts. Returns whether step lines are on."""
    if os.environ.get(CONSOLE_ENV, "").strip().lower() == CONSOLE_DICTS:
        return False
    quiet_dependency_warnings()
    use_step_lines(trainer)
    return True
