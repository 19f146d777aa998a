"""A held-out evaluation in the run: before training, every `every` steps, at every checkpoint and at the end, for
swarm peers and their controls alike, so that a run answers "did joining help?" in its own setting.

[`HeldOutEvaluation`] is a `TrainerCallback` around a function the user gives: `evaluate(model)` returns, for each
held-out problem, whether the model solved it (for the tasks with a verifier: `trl_ftis.tasks.addition.greedy_correct`,
say). Each result is logged (`eval_<name>`, at its step) and kept for `FTISTrainer.summary()`: `<name>_before`,
`<name>_after`, the per-problem `<name>_items_after` (which the launcher pairs with a control's on the same
problems), and `<name>_evaluations`: every evaluation's step, score, training-clock seconds so far and per-problem
results, from which `trl_ftis.joining` reads a peer's gain at equal steps and its time to an accuracy.

The evaluation runs after the step clock has closed the step (`FTISTrainer` registers its clock first), so its own
time is never counted as training time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback

from .summary_file import SummaryCallback

__all__ = ["HeldOutEvaluation", "add_held_out_evaluation", "held_out_results", "run_curve"]


class HeldOutEvaluation(TrainerCallback):
    """Evaluate `evaluate(model)` (one bool per held-out problem, the same problems every time) before training, at
    every checkpoint and when training ends; log `eval_<name>` and keep what [`results`] returns.

    Args:
        evaluate: the model -> per-problem correctness. It is called with the model in eval mode (training mode is
            restored after) and under `torch.no_grad()`.
        name: the metric's name (`accuracy`).
        every: also evaluate after every `every`-th optimizer step (None: only before, at checkpoints and at the end).
        clock: the training clock's seconds so far (the optimizer steps' time, evaluations left out), kept with
            each evaluation; None keeps no seconds.
    """

    def __init__(
        self,
        evaluate: Callable[[Any], Sequence[bool]],
        *,
        name: str = "accuracy",
        every: int | None = None,
        clock: Callable[[], float] | None = None,
    ):
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive number of steps or None, got {every!r}")
        self.evaluate, self.name, self.every, self.clock = evaluate, name, every, clock
        self.history: list[tuple[int, float]] = []  # (step, score) of every evaluation
        self.evaluations: list[dict[str, Any]] = []  # every evaluation: step, score, seconds, per-problem results
        self.items_after: list[int] | None = None
        self.before: float | None = None
        self._log: Callable[[dict], None] | None = None

    def attach(self, log: Callable[[dict], None]) -> HeldOutEvaluation:
        """Log each result through `log` (a trainer's `log`, so that it reaches every reporting integration)."""
        self._log = log
        return self

    def _run(self, model, step: int) -> list[int]:
        import torch

        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                items = [int(bool(ok)) for ok in self.evaluate(model)]
        finally:
            model.train(training)
        score = sum(items) / len(items) if items else 0.0
        self.history.append((step, score))
        seconds = None if self.clock is None else round(float(self.clock()), 6)
        bits = "".join("1" if item else "0" for item in items)
        self.evaluations.append({"step": step, self.name: score, "seconds": seconds, "items": bits})
        if self._log is not None:
            self._log({f"eval_{self.name}": score})
        return items

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and self.before is None:
            self._run(model, state.global_step)
            self.before = self.history[-1][1]

    def _evaluated_at(self, step: int) -> bool:
        """Whether the last evaluation was at `step` (a checkpoint or the end at an `every` step: one a step)."""
        return bool(self.history) and self.history[-1][0] == step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None and self.every is not None and state.global_step % self.every == 0:
            self._run(model, state.global_step)

    def on_save(self, args, state, control, model=None, **kwargs):
        if model is not None and not self._evaluated_at(state.global_step):
            self._run(model, state.global_step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if model is not None:
            if self._evaluated_at(state.global_step):
                self.items_after = [int(bit) for bit in self.evaluations[-1]["items"]]
            else:
                self.items_after = self._run(model, state.global_step)

    def results(self) -> dict[str, Any]:
        """`<name>_before`, `<name>_after`, `<name>_items_after` (0/1 per problem), `<name>_history` ([step,
        score] pairs) and `<name>_evaluations` (each evaluation's `step`, `<name>`, `seconds` of training so far and
        `items`, its per-problem results as a string of 0s and 1s); empty before any evaluation ran."""
        if not self.history:
            return {}
        found: dict[str, Any] = {
            f"{self.name}_history": [[step, score] for step, score in self.history],
            f"{self.name}_evaluations": [dict(entry) for entry in self.evaluations],
        }
        if self.before is not None:
            found[f"{self.name}_before"] = self.history[0][1]
        if self.items_after is not None:
            found[f"{self.name}_after"] = self.history[-1][1]
            found[f"{self.name}_items_after"] = list(self.items_after)
        return found


def held_out_results(callbacks: Sequence[Any]) -> dict[str, Any]:
    """The [`HeldOutEvaluation.results`] of every such callback among `callbacks` (a trainer's), merged."""
    found: dict[str, Any] = {}
    for callback in callbacks:
        if isinstance(callback, HeldOutEvaluation):
            found.update(callback.results())
    return found


def add_held_out_evaluation(
    trainer, evaluate: Callable[[Any], Sequence[bool]], *, name: str = "accuracy", every: int | None = None
):
    """Evaluate `trainer`'s model with `evaluate` before training, every `every` steps (when given), at every
    checkpoint and at the end ([`HeldOutEvaluation`], logging through `trainer.log`, each evaluation stamped with the
    training clock's seconds when the trainer has one: `FTISTrainer.collaboration()`), early enough in the trainer's
    callbacks that the end result reaches its `ftis_summary.json`. Returns the callback."""
    clock = None
    if callable(getattr(trainer, "collaboration", None)):

        def clock() -> float:
            return trainer.collaboration()["time_seconds"]["step"]

    callback = HeldOutEvaluation(evaluate, name=name, every=every, clock=clock).attach(trainer.log)
    callbacks = trainer.callback_handler.callbacks
    writers = [index for index, existing in enumerate(callbacks) if isinstance(existing, SummaryCallback)]
    callbacks.insert(writers[0] if writers else len(callbacks), callback)
    return callback


MAX_CURVE_POINTS = 500  # a run's curve is thinned to at most this many points (its summary stays small)


def run_curve(log_history: Sequence[dict]) -> list[dict[str, float]]:
    """A trainer's log history as points for plotting against wall time and tokens: `step`, `seconds` (the training
    steps' time so far, from `ftis/time/step`, the mean step time of each logging window), `tokens` (the completion
    tokens this trainer generated so far, from `ftis/own_tokens_total`; TRL's `num_tokens`, prompts included, for
    a log without it), and `reward` and/or `accuracy` (`eval_accuracy`) where logged.
    Thinned evenly to at most `MAX_CURVE_POINTS`."""
    points, seconds, last_step, tokens = [], 0.0, 0, 0.0  # nothing processed before the first step
    for entry in log_history:
        step = entry.get("step")
        if not isinstance(step, int):
            continue
        step_seconds = entry.get("ftis/time/step")
        if isinstance(step_seconds, (int, float)) and step > last_step:
            seconds += float(step_seconds) * (step - last_step)
            last_step = step
        for key in ("ftis/own_tokens_total", "num_tokens"):  # own generated tokens where logged
            if isinstance(entry.get(key), (int, float)):
                tokens = float(entry[key])
                break
        point = {"step": step, "seconds": round(seconds, 3), "tokens": tokens}
        for key, name in (("reward", "reward"), ("eval_accuracy", "accuracy")):
            if isinstance(entry.get(key), (int, float)) and not isinstance(entry.get(key), bool):
                point[name] = float(entry[key])
        if "reward" in point or "accuracy" in point:
            points.append(point)
    if len(points) > MAX_CURVE_POINTS:
        stride = len(points) / MAX_CURVE_POINTS
        points = [points[int(k * stride)] for k in range(MAX_CURVE_POINTS - 1)] + [points[-1]]
    return points
