"""Peer-row admission and scoring, a mixin of [`FTISTrainer`]: every received row is either trained on correctly or
dropped and counted by reason, and rewards are recomputed with the receiver's own reward functions.

Kept apart from `trainer.py` (one concern: what a hostile or differently configured peer's rows may do to a step);
the methods run on the trainer (`self` is the [`FTISTrainer`]).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from trl.data_utils import apply_chat_template
from trl.trainer.utils import is_async_callable

from .peer_rows import (
    MAX_ABS_ADVANTAGE,
    PeerRow,
    _row_problem,
    prompt_columns,
    prompt_key,
    row_problems,
)

logger = logging.getLogger("trl_ftis.trainer")

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

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""Roles a received chat message may have. Another role is rendered by most chat templates as something it is not
(or refused), so the row is dropped (`bad_chat_prompt`)."""

DROP_REASONS: dict[str, str] = {
    "bad_ids": "completion token ids that are not integers in [0, vocab_limit)",
    "bad_logps": "generator log-probs that are not finite and <= 0",
    "too_long": "a completion longer than max_completion_length, or a prompt and completion longer than the model's "
    "context (max_position_embeddings)",
    "bad_prompt": "a prompt that is neither a string nor a list of chat messages, or that the tokenizer cannot encode",
    "empty_prompt": "an empty prompt ('' or []), or one that renders to no tokens",
    "bad_chat_prompt": "chat messages without a string role and content, with a role outside "
    f"{sorted(CHAT_ROLES)}, or that this trainer's chat template cannot render",
    "no_chat_template": "a chat prompt, but this trainer's tokenizer has no chat template",
    "bad_columns": "extra columns that are not a dict with string keys",
    "unknown_prompt": "a prompt that is not in this trainer's training set (require_known_prompts)",
    "reward_error": "a reward function raised, or returned the wrong number of rewards, for the rows' group (same "
    "sender, prompt kind and columns)",
    "unscorable": "every reward function returned None",
    "nonfinite": "a reward, advantage or group statistic that is not finite",
    "advantage_too_large": f"an advantage above {MAX_ABS_ADVANTAGE:g} in magnitude (scale_rewards='none' with "
    "enormous rewards)",
    "batch_split": "trimmed so that the peer rows split evenly over the micro-batches and processes",
    "internal_error": "an unexpected error while processing the round's rows (logged with its traceback)",
    "foreign_tokenizer": "completion ids in another tokenizer's tokens, but cross_tokenizer is off",
    "no_text": "a completion from a peer with another tokenizer without a usable text (none sent, or empty), or that "
    "ended with an end-of-sequence token when this tokenizer has none",
    "text_round_trip": "a completion text that does not survive re-tokenisation with this trainer's tokenizer "
    "(decode(encode(text)) != text: characters it cannot represent)",
    "text_special_tokens": "a completion text that this trainer's tokenizer reads as special tokens (a chat-template "
    "marker, padding, end of sequence...) inside the completion",
}
"""Why a received row is dropped: each is counted in `ftis/peer_rows_dropped/<reason>` (and the total in
`ftis/peer_rows_dropped`) and warned about once per peer and reason."""

STRIP_REASONS: dict[str, str] = {
    "reserved_column": "extra columns named like an argument TRL passes to reward functions "
    f"({', '.join(sorted(RESERVED_REWARD_COLUMNS))}) were removed; the rows are kept",
}
"""Why a received row was changed (and kept): counted in `ftis/peer_rows_stripped/<reason>`."""

_MAX_WARNED = 1000  # (peer, reason) pairs warned about: bounded like the swarm's warnings


class PeerRowAdmission:
    """Admission, scoring and drop accounting of peer rows (mixed into [`FTISTrainer`])."""

    def _count_rows(
        self, sender: Any, reason: str, count: int = 1, *, stripped: bool = False, detail: str = ""
    ) -> None:
        """Count `count` rows of `sender` dropped for `reason` (or, with `stripped`, changed and kept); warn the first
        time for each (peer, reason)."""
        if stripped:
            self._stripped[reason] += count
        else:
            self._dropped[reason] += count
            self._dropped_totals[reason] += count
        kind = "stripped" if stripped else "dropped"
        key = (str(sender)[:200], f"{kind}/{reason}")
        if key in self._drop_warned or len(self._drop_warned) >= _MAX_WARNED:
            return
        self._drop_warned.add(key)
        logger.warning(
            "%s %d peer row(s) from %r: %s%s. Counted in ftis/peer_rows_%s/%s; not logged again for this peer and "
            "reason.",
            "Changed" if stripped else "Dropped",
            count,
            key[0],
            (STRIP_REASONS if stripped else DROP_REASONS).get(reason, reason),
            f" ({detail})" if detail else "",
            kind,
            reason,
        )

    def _sift(
        self,
        rows: Sequence[PeerRow],
        problems: Sequence[str | None],
        details: Mapping[tuple[str, str], str] | None = None,
    ) -> list[PeerRow]:
        """The rows whose problem is `None`; the others are counted by (sender, reason). `details` adds a text to the
        warning of a (sender, reason)."""
        details = details or {}
        kept, counts = [], Counter()
        for row, problem in zip(rows, problems, strict=True):
            if problem is None:
                kept.append(row)
            else:
                counts[(str(row.sender), problem)] += 1
        for (sender, reason), count in counts.items():
            self._count_rows(sender, reason, count, detail=details.get((sender, reason), ""))
        return kept

    def _admit(self, rows: Sequence[PeerRow], *, local_columns: bool = False) -> list[PeerRow]:
        """
        The admission of received rows, shared by the swarm round and [`add_peer_rows`]: everything that can be
        decided from a row alone. Never raises because of a row's content: a row is kept, or dropped and counted by
        reason ([`DROP_REASONS`]).

        First, rows of a peer with another tokenizer are re-tokenised ([`_retokenise`]). Then, in order: ids and
        log-probs (`bad_ids`, `bad_logps`: the wire format and `add_peer_rows` already refuse them),
        the completion length (`too_long`), the prompt's shape (`bad_prompt`, `empty_prompt`, `bad_chat_prompt`,
        `no_chat_template`) and the columns' (`bad_columns`); then columns named like a reward function argument are
        removed ([`RESERVED_REWARD_COLUMNS`], `reserved_column`) and, with `local_columns`, a known prompt gets the
        training set's own columns instead (`unknown_prompt` under `require_known_prompts`); last, each distinct
        prompt is rendered as this trainer renders its own (plain and chat prompts separately: the kind of a batch is
        its first prompt's for TRL), and a prompt that fails (`bad_chat_prompt`, `bad_prompt`), renders to no tokens
        (`empty_prompt`) or does not fit the model's context with its completion (`too_long`) is dropped.

        What is left later: rescoring (`reward_error`, `unscorable`, `nonfinite`) and the group statistics
        (`nonfinite`, `advantage_too_large`) in the round, and `batch_split` at the merge.
        """
        rows = list(rows)
        if not rows:
            return rows
        if self.args.text_level_peer_rows:  # measuring the approximation: every text is foreign
            for row in rows:
                if row.completion_text is not None:
                    row.foreign_tokenizer = True
        if any(row.foreign_tokenizer for row in rows):
            rows = self._retokenise(rows)
        problems = row_problems(rows, self.vocab_limit)
        problems = [problem or self._shape_problem(row) for row, problem in zip(rows, problems, strict=True)]
        rows = self._sift(rows, problems)
        self._strip_reserved_columns(rows)
        if local_columns:
            rows = self._with_local_columns(rows)
        rendered = self._render_prompts([row.prompt for row in rows])
        context = self._context_length()
        problems = []
        for row, ids in zip(rows, rendered, strict=True):
            if isinstance(ids, str):
                problems.append(ids)
            elif context is not None and len(ids) + len(row.completion_ids) > context:
                problems.append("too_long")
            else:
                problems.append(None)
        return self._sift(rows, problems)

    def _retokenise(self, rows: list[PeerRow]) -> list[PeerRow]:
        """
        Rows in another tokenizer's tokens (`foreign_tokenizer`) become rows in this trainer's: their text is
        tokenised with this tokenizer (no special tokens added; its end-of-sequence token appended when the sender's
        completion ended with its own), and every generator log-prob becomes the sender's total over its tokens
        divided by the new length, so that the sum is still the sender's `Σ ℓgen` of the text. Such rows are marked
        `text_level`: the objective gives them one sequence-level weight `min(exp(Σ ℓθ - Σ ℓgen), C)`.

        Dropped and counted: rows that came in another tokenizer while `cross_tokenizer` is off
        (`foreign_tokenizer`), without a text (`no_text`), with generator log-probs that are not finite and <= 0
        (`bad_logps`), whose text does not survive `decode(encode(text))` (`text_round_trip`: characters this
        tokenizer maps to an unknown token, normalisation) or holds this tokenizer's special tokens
        (`text_special_tokens`: a peer must not smuggle a chat-template marker into the completion).
        """
        foreign = [row for row in rows if row.foreign_tokenizer]
        if not self.args.cross_tokenizer:  # nothing to tokenise: every such row is dropped
            return self._sift(rows, ["foreign_tokenizer" if row.foreign_tokenizer else None for row in rows])
        tokenizer = self._tokenizer
        texts = [row.completion_text if isinstance(row.completion_text, str) else "" for row in foreign]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        decoded = tokenizer.batch_decode(encoded, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        special = set(tokenizer.all_special_ids)
        eos = tokenizer.eos_token_id
        if eos is None and self.eos_token_ids:  # the model's end of sequence, when the tokenizer names none
            eos = self.eos_token_ids[0]
        problems: dict[int, str] = {}
        for row, ids, text in zip(foreign, encoded, decoded, strict=True):
            problem = None
            if (
                not isinstance(row.completion_text, str)
                or not (ids or row.ends_with_eos)
                or (row.ends_with_eos and eos is None)
            ):
                problem = "no_text"
            elif (shape := _row_problem(row, vocab_limit=2**63)) is not None:  # the sender's ids: any ints >= 0
                problem = shape
            elif text != row.completion_text:
                problem = "text_round_trip"
            elif special.intersection(ids):
                problem = "text_special_tokens"
            if problem is not None:
                problems[id(row)] = problem
                continue
            ids = list(ids) + ([int(eos)] if row.ends_with_eos else [])
            total = float(np.sum(np.asarray(row.generator_logps, dtype=np.float64)))
            row.completion_ids = np.asarray(ids, dtype=np.int64)
            row.generator_logps = np.full(len(ids), total / len(ids), dtype=np.float64)
            row.foreign_tokenizer, row.text_level = False, True
        self._totals["rows_retokenised"] += len(foreign) - len(problems)
        return self._sift(rows, [problems.get(id(row)) for row in rows])

    def _shape_problem(self, row: PeerRow) -> str | None:
        if len(row.completion_ids) > self.max_completion_length:
            return "too_long"
        problem = self._prompt_problem(row.prompt)
        if problem is not None:
            return problem
        if row.extra is None:
            row.extra = {}
        if not isinstance(row.extra, dict) or not all(isinstance(key, str) for key in row.extra):
            return "bad_columns"
        return None

    def _prompt_problem(self, prompt: Any) -> str | None:
        """Why `prompt` cannot be rendered, from its shape alone, or `None`."""
        if isinstance(prompt, str):
            return None if prompt else "empty_prompt"
        if not isinstance(prompt, list):
            return "bad_prompt"
        if not prompt:
            return "empty_prompt"
        for message in prompt:
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
                and message["role"] in CHAT_ROLES
                # Other keys (`name`, ...) as the wire format allows them: strings or null.
                and all(isinstance(key, str) and (v is None or isinstance(v, str)) for key, v in message.items())
            ):
                return "bad_chat_prompt"
        if not self._has_chat_template():
            return "no_chat_template"
        return None

    def _has_chat_template(self) -> bool:
        return any(
            getattr(owner, "chat_template", None)
            for owner in (self, self.processing_class, getattr(self, "_tokenizer", None))
        )

    def _context_length(self) -> int | None:
        """The model's context (`max_position_embeddings` of its text config), when it has one."""
        config = self.accelerator.unwrap_model(self.model).config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        length = getattr(config, "max_position_embeddings", None)
        return length if isinstance(length, int) and length > 0 else None

    def _strip_reserved_columns(self, rows: Sequence[PeerRow]) -> None:
        counts: Counter = Counter()
        names: dict[str, set[str]] = {}
        for row in rows:
            reserved = RESERVED_REWARD_COLUMNS.intersection(row.extra)
            if reserved:
                row.extra = {key: value for key, value in row.extra.items() if key not in RESERVED_REWARD_COLUMNS}
                counts[str(row.sender)] += 1
                names.setdefault(str(row.sender), set()).update(reserved)
        for sender, count in counts.items():
            self._count_rows(
                sender, "reserved_column", count, stripped=True, detail="removed " + ", ".join(sorted(names[sender]))
            )

    def _render_prompts(self, prompts: Sequence[Any]) -> list[list[int] | str]:
        """
        Each prompt rendered as this trainer renders its own (`GRPOTrainer._tokenize_prompts`: its chat template for
        messages, with `add_generation_prompt`) and tokenized, or the reason it cannot be (`bad_chat_prompt`,
        `bad_prompt`, `empty_prompt` for no tokens).

        Plain and chat prompts go to separate calls (TRL decides a batch's kind from its first prompt), each distinct
        prompt once; a call that fails is split in halves until the prompts that fail are found, so one bad prompt
        costs a few calls, not one per prompt.
        """
        keys = [prompt_key(prompt) for prompt in prompts]
        distinct: dict[str, Any] = {}
        for key, prompt in zip(keys, prompts, strict=True):
            distinct.setdefault(key, prompt)
        rendered: dict[str, list[int] | str] = {}
        for chat in (False, True):
            self._render_batch([(k, p) for k, p in distinct.items() if isinstance(p, list) == chat], chat, rendered)
        return [rendered[key] for key in keys]

    def _render_batch(self, batch: list[tuple[str, Any]], chat: bool, out: dict[str, list[int] | str]) -> None:
        if not batch:
            return
        try:
            ids, images, _ = self._tokenize_prompts([prompt for _, prompt in batch])
            if images is not None:
                raise ValueError("peer rows with images are not supported")
            ids = [[int(token) for token in one] for one in ids]
            if len(ids) != len(batch):
                raise ValueError(f"{len(ids)} tokenized prompts for {len(batch)}")
        except Exception:  # noqa: BLE001 - any failure of the template or tokenizer on a peer's prompt drops it
            if len(batch) == 1:
                out[batch[0][0]] = "bad_chat_prompt" if chat else "bad_prompt"
                return
            half = len(batch) // 2
            self._render_batch(batch[:half], chat, out)
            self._render_batch(batch[half:], chat, out)
            return
        for (key, _), one in zip(batch, ids, strict=True):
            out[key] = one if one else "empty_prompt"

    def _guard_statistics(self, rows: Sequence[PeerRow]) -> list[PeerRow]:
        """The last check before rows become tensors: a finite reward, a finite advantage of at most
        [`MAX_ABS_ADVANTAGE`] in magnitude (`nonfinite`, `advantage_too_large`), so that no peer value can make the
        loss or a gradient non-finite."""
        return self._sift(rows, [_statistics_problem(row) for row in rows])

    def _rescore(self, rows: list[PeerRow]) -> list[PeerRow]:
        """Recompute the rewards of peer rows with this trainer's reward functions; drop (and count) the rows a reward
        function raised for (`reward_error`), that every function declined (`unscorable`) or whose total is not finite
        (`nonfinite`)."""
        if not rows:
            return rows
        scores, problems, errors = self._score(rows)
        for row, (total, per_func), problem in zip(rows, scores, problems, strict=True):
            if problem is None:
                row.reward, row.rewards_per_func = total, per_func
        return self._sift(rows, problems, errors)

    def _with_local_columns(self, rows: list[PeerRow]) -> list[PeerRow]:
        """Give rows whose prompt is in our training set our own columns (the gold answer a reward function reads):
        a peer must not be able to send a wrong gold answer along with a completion that matches it. Under
        `require_known_prompts` the other rows are dropped (`unknown_prompt`, also in `summary()["refused"]`)."""
        if self._prompt_columns is None:
            self._prompt_columns = prompt_columns(self.train_dataset)
        problems = []
        for row in rows:
            local = self._prompt_columns.get(prompt_key(row.prompt))
            if local is not None:  # without the columns TRL itself never passes to reward functions (`completion`)
                row.extra = {key: value for key, value in local.items() if key not in RESERVED_REWARD_COLUMNS}
            problems.append("unknown_prompt" if local is None and self.args.require_known_prompts else None)
        unknown = problems.count("unknown_prompt")
        if unknown:
            self._refused_totals["unknown_prompt"] += unknown
        return self._sift(rows, problems)

    def score_rows(self, rows: Sequence[PeerRow]) -> list[tuple[float, dict[str, float]]]:
        """
        Score rows with this trainer's reward functions, on the calling process only (no collectives).

        Prompts are passed as the dataset gave them, completions decoded with this trainer's tokenizer (as chat
        messages for conversational prompts), and the rows' other columns as keyword arguments, as
        `GRPOTrainer._calculate_rewards` does. That method cannot be called for peer rows: it ends with a `gather`
        across processes (received rows are scored on the main process alone: a collective there would hang the
        job) and its `log_extra` would add peer rows to the local completions table. The deliberate differences from
        TRL 1.16's path, all here:

        * no `gather`: the rewards of this process's rows only;
        * rows are scored in groups of the same sender, prompt kind (plain text or chat messages: each row's
          completion is passed as its own kind, whatever the other rows are) and set of `extra` columns, so that the
          keyword columns are exactly each row's own (TRL passes the columns of the batch's first row) and one peer's
          odd columns or values cannot break another peer's rows;
        * `extra` columns named like an argument TRL passes itself ([`RESERVED_REWARD_COLUMNS`]) are not passed;
        * a reward function that raises (or returns the wrong number of rewards) for a group makes that group's rows
          score NaN, with a warning, instead of raising;
        * `log_extra` and `log_metric` are accepted and ignored (peer rows have no place in the completions table or
          in the step's reward metrics);
        * no `environments` keyword (peer rows are single-turn text completions);
        * async reward functions run one after another on TRL's event loop, not concurrently;
        * a reward model gets its inputs on its own device, and the table is returned on the CPU;
        * no `profiling_context` around the calls;
        * no warning for a row every function declines (`None`): it scores NaN, and the trainer drops it
          (`unscorable`);
        * the total is `nansum(rewards_per_func * reward_weights)` as in TRL's `"sum_then_normalize"`, in float64
          (rewards near the float32 maximum do not overflow), NaN when every function declined.

        Args:
            rows (`Sequence[PeerRow]`):
                The rows to score.

        Returns:
            `list[tuple[float, dict[str, float]]]`: per row, the weighted total and the reward of each function, by
            name.
        """
        scores, _, errors = self._score(rows)
        for (sender, _), error in errors.items():
            logger.warning("A reward function failed on rows from %r, which score NaN: %s", sender, error)
        return scores

    def _score(self, rows: Sequence[PeerRow]):
        """`(scores, problems, errors)`: per row the weighted total and the reward of each function (see
        [`score_rows`]) and `None` or why it cannot be trained on (`reward_error`, `unscorable`, `nonfinite`);
        `errors` maps `(sender, "reward_error")` to the first error of that sender's groups."""
        names = self.reward_func_names
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
        weights = self.reward_weights.detach().to("cpu", torch.float64)
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
            (float(totals[i]), {name: float(table[i, k]) for k, name in enumerate(names)}) for i in range(len(rows))
        ]
        return scores, problems, errors

    def _score_group(self, rows: Sequence[PeerRow], chat: bool, columns: Sequence[str]) -> torch.Tensor:
        """Rewards `(len(rows), num functions)`, float64, of rows of one prompt kind sharing the `extra` keys
        `columns`."""
        prompts = [row.prompt for row in rows]
        completion_ids = [np.asarray(row.completion_ids).reshape(-1).tolist() for row in rows]
        texts = self._tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": text}] for text in texts] if chat else texts
        kwargs = {key: [row.extra[key] for row in rows] for key in columns}
        kwargs.update(trainer_state=self.state, log_extra=_ignore, log_metric=_ignore)
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
                call = asyncio.run_coroutine_threadsafe(call, self.async_loop).result()
            values = list(call)
            if len(values) != len(rows):
                raise ValueError(
                    f"Reward function {self.reward_func_names[k]!r} returned {len(values)} rewards for "
                    f"{len(rows)} peer rows."
                )
            table[:, k] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)
        return table


def _api_row_problem(row: Any) -> str | None:
    """What makes `row` a programming error for [`FTISTrainer.add_peer_rows`] (a `TypeError`), or `None`."""
    if not isinstance(row, PeerRow):
        return f"add_peer_rows takes PeerRow objects, got {type(row).__name__}."
    if not isinstance(row.sender, str):
        return f"PeerRow.sender must be a string, got {type(row.sender).__name__}."
    try:
        hash(row.group)
    except TypeError:
        return f"PeerRow.group must be hashable, got {type(row.group).__name__} (from {row.sender!r})."
    if not isinstance(row.prompt, (str, list)):
        return f"PeerRow.prompt must be a string or a list of messages, got {type(row.prompt).__name__}."
    if row.extra is not None and (not isinstance(row.extra, dict) or not all(isinstance(k, str) for k in row.extra)):
        return f"PeerRow.extra must be a dict with string keys (or None), got {type(row.extra).__name__}."
    return None


def _statistics_problem(row: PeerRow) -> str | None:
    """Why `row`'s reward or group statistics cannot enter the loss (`nonfinite`, `advantage_too_large`), or `None`."""
    try:
        reward, advantage = float(row.reward), float(row.advantage)
        int(row.group_max_length)
    except (TypeError, ValueError, OverflowError):
        return "nonfinite"
    if not (math.isfinite(reward) and math.isfinite(advantage)):
        return "nonfinite"
    return "advantage_too_large" if abs(advantage) > MAX_ABS_ADVANTAGE else None


def _ignore(*args, **kwargs) -> None:
    """`log_extra` and `log_metric` for reward functions scoring peer rows: nothing is logged."""
