"""Rewards of received rows, computed with the receiver's own reward functions, on the calling process only.

[`RewardScorer`] is built by `FTISTrainer` from what TRL's `GRPOTrainer` set up (the reward functions, their
processing classes, names and weights, the chat template arguments, the event loop of async reward functions); it
needs no trainer, so it can be tested with plain functions and a tokenizer. The admission
(`trl_ftis.swarm.admission.Admission.rescore`) and `FTISTrainer.score_rows` use it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from trl.data_utils import apply_chat_template
from trl.trainer.utils import is_async_callable

logger = logging.getLogger(__name__)

RESERVED_REWARD_COLUMNS = frozenset(
    {
        "prompts",
        "completions",
        "completion_ids",
        "trainer_state",
        "log_extra",
        "log_metric",
        "environments",
        "prompt",
        "completion",
    }
)
"""Names a peer row's `extra` columns must not have: the keyword arguments TRL 1.16's `_calculate_rewards` passes to
reward functions itself (`prompts`, `completions`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric`,
`environments`), and the columns it never passes (`prompt`, `completion`). Such columns are removed before scoring
(counted as `reserved_column`): passed along they would raise `TypeError` ("got multiple values for keyword
argument") in every reward function."""

Scores = list[tuple[float, dict[str, float]]]


class RewardScorer:
    """
    Scores rows (anything with `prompt`, `completion_ids`, `sender` and `extra`) with a trainer's reward functions.

    Prompts are passed as the dataset gave them, completions decoded with the tokenizer (as chat messages for
    conversational prompts), and the rows' other columns as keyword arguments, as `GRPOTrainer._calculate_rewards`
    does. That method cannot be called for peer rows: it ends with a `gather` across processes (received rows are
    scored on the main process alone: a collective there would hang the job) and its `log_extra` would add peer rows
    to the local completions table. The deliberate differences from TRL 1.16's path, all here:

    * no `gather`: the rewards of this process's rows only;
    * rows are scored in groups of the same sender, prompt kind (plain text or chat messages: each row's completion
      is passed as its own kind, whatever the other rows are) and set of `extra` columns, so that the keyword columns
      are exactly each row's own (TRL passes the columns of the batch's first row) and one peer's odd columns or
      values cannot break another peer's rows;
    * `extra` columns named like an argument TRL passes itself ([`RESERVED_REWARD_COLUMNS`]) are not passed;
    * a reward function that raises (or returns the wrong number of rewards) for a group makes that group's rows
      score NaN, with a warning, instead of raising;
    * `log_extra` and `log_metric` are accepted and ignored (peer rows have no place in the completions table or in
      the step's reward metrics);
    * no `environments` keyword (peer rows are single-turn text completions);
    * async reward functions run one after another on TRL's event loop, not concurrently;
    * a reward model gets its inputs on its own device, and the table is returned on the CPU;
    * no `profiling_context` around the calls;
    * no warning for a row every function declines (`None`): it scores NaN, and the trainer drops it (`unscorable`);
    * the total is `nansum(rewards_per_func * reward_weights)` as in TRL's `"sum_then_normalize"`, in float64
      (rewards near the float32 maximum do not overflow), NaN when every function declined.

    Args:
        tokenizer: decodes completions (`batch_decode`).
        reward_funcs (`Sequence`): functions (or `nn.Module` reward models), as `GRPOTrainer.reward_funcs`.
        reward_processing_classes (`Sequence`): one per function (the reward models' tokenizers).
        reward_func_names (`Sequence[str]`): one name per function.
        reward_weights (`torch.Tensor`): one weight per function.
        chat_template_kwargs (`dict`, *optional*): for reward models' chat templates.
        trainer_state (`Callable[[], Any]`, *optional*): the `TrainerState` passed as `trainer_state=`, read at each
            call (the Trainer replaces it when training starts).
        event_loop (`Callable[[], Any]`, *optional*): TRL's event loop for async reward functions, read at each call.
    """

    def __init__(
        self,
        *,
        tokenizer,
        reward_funcs: Sequence[Any],
        reward_processing_classes: Sequence[Any],
        reward_func_names: Sequence[str],
        reward_weights: torch.Tensor,
        chat_template_kwargs: dict[str, Any] | None = None,
        trainer_state: Callable[[], Any] = lambda: None,
        event_loop: Callable[[], Any] = lambda: None,
    ):
        self.tokenizer = tokenizer
        self.reward_funcs = list(reward_funcs)
        self.reward_processing_classes = list(reward_processing_classes)
        self.names = list(reward_func_names)
        self.weights = reward_weights
        self.chat_template_kwargs = chat_template_kwargs or {}
        self._trainer_state = trainer_state
        self._event_loop = event_loop

    def score_rows(self, rows: Sequence[Any]) -> Scores:
        """Per row, the weighted total and the reward of each function, by name; a failing function is warned
        about (its rows score NaN)."""
        scores, _, errors = self.score(rows)
        for (sender, _), error in errors.items():
            logger.warning("A reward function failed on rows from %r, which score NaN: %s", sender, error)
        return scores

    def score(self, rows: Sequence[Any]) -> tuple[Scores, list[str | None], dict[tuple[str, str], str]]:
        """`(scores, problems, errors)`: per row the weighted total and the reward of each function (see the class)
        and `None` or why it cannot be trained on (`reward_error`, `unscorable`, `nonfinite`); `errors` maps
        `(sender, "reward_error")` to the first error of that sender's groups."""
        table = torch.full((len(rows), len(self.reward_funcs)), math.nan, dtype=torch.float64)
        failed = [False] * len(rows)
        errors: dict[tuple[str, str], str] = {}
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            extra = row.extra if isinstance(row.extra, dict) else {}
            columns = tuple(sorted(str(key) for key in extra if key not in RESERVED_REWARD_COLUMNS))
            groups.setdefault((str(row.sender), isinstance(row.prompt, list), columns), []).append(i)
        for (sender, chat, columns), index in groups.items():
            try:
                table[index] = self._score_group([rows[i] for i in index], chat, columns)
            except Exception as error:  # noqa: BLE001 - a reward function failing on a peer's rows drops them only
                for i in index:
                    failed[i] = True
                errors.setdefault((sender, "reward_error"), f"{type(error).__name__}: {error}"[:300])
        weights = self.weights.detach().to("cpu", torch.float64)
        totals = torch.nansum(table * weights, dim=1)
        declined = torch.isnan(table).all(dim=1)
        totals[declined] = math.nan
        problems: list[str | None] = []
        for i in range(len(rows)):
            if failed[i]:
                problems.append("reward_error")
            elif declined[i]:
                problems.append("unscorable")
            elif not math.isfinite(totals[i]):
                problems.append("nonfinite")
            else:
                problems.append(None)
        scores = [
            (float(totals[i]), {name: float(table[i, k]) for k, name in enumerate(self.names)})
            for i in range(len(rows))
        ]
        return scores, problems, errors

    def _score_group(self, rows: Sequence[Any], chat: bool, columns: Sequence[str]) -> torch.Tensor:
        """Rewards `(len(rows), num functions)`, float64, of rows of one prompt kind sharing the `extra` keys
        `columns`."""
        prompts = [row.prompt for row in rows]
        completion_ids = [np.asarray(row.completion_ids).reshape(-1).tolist() for row in rows]
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": text}] for text in texts] if chat else texts
        kwargs = {key: [row.extra[key] for row in rows] for key in columns}
        kwargs.update(trainer_state=self._trainer_state(), log_extra=_ignore, log_metric=_ignore)
        table = torch.full((len(rows), len(self.reward_funcs)), math.nan, dtype=torch.float64)
        for k, (func, processor) in enumerate(zip(self.reward_funcs, self.reward_processing_classes, strict=True)):
            if isinstance(func, nn.Module):
                if chat:
                    messages = [{"messages": p + c} for p, c in zip(prompts, completions, strict=True)]
                    inputs = [apply_chat_template(m, processor, **self.chat_template_kwargs)["text"] for m in messages]
                else:
                    inputs = [p + c for p, c in zip(prompts, completions, strict=True)]
                encoded = processor(
                    text=inputs, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
                ).to(next(func.parameters()).device)
                with torch.inference_mode():
                    table[:, k] = func(**encoded).logits[:, 0].to("cpu", torch.float64)
                continue
            call = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            if is_async_callable(func):
                call = asyncio.run_coroutine_threadsafe(call, self._event_loop()).result()
            values = list(call)
            if len(values) != len(rows):
                raise ValueError(
                    f"Reward function {self.names[k]!r} returned {len(values)} rewards for {len(rows)} peer rows."
                )
            table[:, k] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)
        return table


def _ignore(*args, **kwargs) -> None:
    """`log_extra` and `log_metric` for reward functions scoring peer rows: nothing is logged."""
