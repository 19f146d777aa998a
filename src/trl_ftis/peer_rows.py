"""Peer rows: what a trainer receives from other peers, the stages a row goes through, and how rows join a local GRPO
batch.

A [`PeerRow`] is one completion sampled by another model: the prompt as the dataset gave it (the receiver renders it
with its own chat template), the completion token ids, the generator's per-token log-probs and the reward. Rows
sharing a `group` were sampled for one prompt; in vertical mode (the default) their advantages are normalised within
that group only, exactly as the sender would, never across models.

A row's stage is its type. [`PeerRow`] is what is received (the public input type; the trainer never rewrites one).
The admission (`trl_ftis.swarm.admission.Admission`) turns it into an [`AdmittedRow`]: frozen, in this trainer's
tokens, with clean columns and its prompt rendered once (`prompt_ids`, used again by the merge); rescoring replaces its
rewards ([`AdmittedRow.rescored`]); [`with_group_statistics`] (or [`AdmittedRow.with_statistics`]) makes a
[`ScoredRow`], which also carries its group's advantage and longest completion: what [`build_peer_batch`] turns into
tensors.
"""

from __future__ import annotations

import json
import math
import pickle
from collections import deque
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from typing import Any, TypeVar

import numpy as np
import torch
from trl.trainer.utils import pad

from .objective import group_max_len
from .sampling_bounds import MAX_LOGP

UNMERGEABLE_FIELDS = (
    "tool_mask",
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
    "num_images",
    "num_tiles",
)
"""Batch fields that peer rows cannot provide (multimodal inputs, tool masks): merging into a batch with any of them
is refused clearly."""

MAX_ABS_ADVANTAGE = 1e7
"""Largest `|advantage|` a peer row may bring into the loss (the trainer drops a row beyond it, reason
`advantage_too_large`). Group-normalised advantages are below `sqrt(group size)`; only `scale_rewards="none"` with
enormous reward differences comes near it. It keeps every loss term (at most `is_cap · e^MAX_LOG_RATIO · |Â|`) and
every gradient far inside float32, whatever rewards a peer sends."""

LOGP_FLOOR = -1e30
"""Generator log-probs below this (a probability of exactly 0 in any float format) are raised to it in
[`build_peer_batch`], so that no peer value becomes `-inf` in the float32 batch (`-1e300` would) and sums of k3
terms stay finite."""


@dataclass
class PeerRow:
    """One completion produced by another peer (or by this trainer, when it shares its rows)."""

    prompt: Any
    """The prompt as the dataset gave it: a string, or a list of chat messages."""
    completion_ids: Sequence[int]
    """Completion token ids, without padding; EOS included when the completion ended with it."""
    generator_logps: Sequence[float]
    """The generator's full-softmax log-prob of each completion token at the shared temperature (fp32, <= 0)."""
    reward: float
    """Total (weighted) reward of the completion."""
    group: Hashable
    """Rows with the same group were sampled for the same prompt; advantages are normalised within a group."""
    sender: str = "peer"
    """Id of the peer that sampled the completion."""
    rewards_per_func: dict[str, float] | None = None
    """Optional per-reward-function rewards, by function name."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The dataset row's other columns (reward functions may read them)."""
    round: int | None = None
    """The sender's training step when it sampled the row."""
    advantage: float | None = None
    """Set by [`assign_group_statistics`]; the trainer ignores it (it computes its own: [`ScoredRow`])."""
    group_max_length: int | None = None
    """Longest completion of the row's group, set with `advantage`."""
    completion_text: str | None = None
    """The completion as text, decoded with the sender's tokenizer, without its end-of-sequence token: sent by peers
    with `cross_tokenizer` on, so that peers with another tokenizer can re-tokenise it. `None`: not sent."""
    ends_with_eos: bool = False
    """The completion ended with the sender's end-of-sequence token (not part of `completion_text`)."""
    foreign_tokenizer: bool = False
    """`completion_ids` and `generator_logps` are in another tokenizer's tokens (a peer whose tokenizer differs):
    the receiving trainer re-tokenises `completion_text` before anything else ([`FTISTrainer`] admission)."""
    text_level: bool = False
    """Re-tokenised: `completion_ids` are this receiver's tokens of the sender's text and every `generator_logps`
    entry is the sender's total log-prob divided by their number, so that their sum is the sender's `Σ ℓgen`. The
    objective gives such a row one sequence-level weight (`docs/objective.md`). Set on [`AdmittedRow`]s by the
    re-tokenisation, and on the rows a checkpoint restores; ignored in rows given to `add_peer_rows` (it cannot be
    forged)."""

    def __post_init__(self):
        n_ids, n_logps = len(self.completion_ids), len(self.generator_logps)
        if n_ids == 0:
            raise ValueError(f"PeerRow from {self.sender!r} has an empty completion.")
        if n_ids != n_logps:
            raise ValueError(
                f"PeerRow from {self.sender!r} has {n_ids} completion ids but {n_logps} generator log-probs."
            )
        if not math.isfinite(float(self.reward)):
            raise ValueError(f"PeerRow from {self.sender!r} has a non-finite reward {self.reward!r}.")


@dataclass(frozen=True, eq=False)
class AdmittedRow:
    """A received row the admission kept: in this trainer's tokens, with columns safe to pass to its reward functions
    and its prompt rendered and tokenized as this trainer renders its own (`prompt_ids`, carried to the merge so the
    prompt is tokenised once). Frozen: a later stage is a new object ([`rescored`], [`with_statistics`])."""

    prompt: Any
    """The prompt as the sender gave it (a string or chat messages): what reward functions see."""
    prompt_ids: tuple[int, ...]
    """The prompt rendered with this trainer's chat template and tokenized, without padding (never empty)."""
    completion_ids: Sequence[int]
    """Completion token ids in this trainer's vocabulary (re-tokenised when the sender's tokenizer differs)."""
    generator_logps: Sequence[float]
    """The generator's per-token log-probs, finite and <= `MAX_LOGP` (spread evenly when re-tokenised)."""
    reward: float
    """The sender's reward, or this trainer's own after [`rescored`]."""
    group: Hashable
    sender: str
    rewards_per_func: dict[str, float] | None
    extra: dict[str, Any]
    """Columns for the reward functions: without `RESERVED_REWARD_COLUMNS`; the training set's own for a known
    prompt when the admission was asked for local columns."""
    round: int | None
    text_level: bool
    """Re-tokenised from another tokenizer's text: trained on with one sequence-level weight."""

    def rescored(self, reward: float, rewards_per_func: dict[str, float]) -> AdmittedRow:
        """The same row with the rewards of this trainer's reward functions."""
        return replace(self, reward=reward, rewards_per_func=rewards_per_func)

    def with_statistics(self, advantage: float, group_max_length: int) -> ScoredRow:
        """The row as a [`ScoredRow`] with its group statistics."""
        values = {name: getattr(self, name) for name in AdmittedRow.__dataclass_fields__}
        return ScoredRow(**values, advantage=advantage, group_max_length=group_max_length)

    def to_peer_row(self) -> PeerRow:
        """The row as a plain [`PeerRow`] (what a checkpoint saves): its prompt ids and statistics are left out."""
        return PeerRow(
            prompt=self.prompt,
            completion_ids=self.completion_ids,
            generator_logps=self.generator_logps,
            reward=self.reward,
            group=self.group,
            sender=self.sender,
            rewards_per_func=self.rewards_per_func,
            extra=self.extra,
            round=self.round,
            text_level=self.text_level,
        )


@dataclass(frozen=True, eq=False)
class ScoredRow(AdmittedRow):
    """An admitted row with its group statistics: ready to become part of a batch ([`build_peer_batch`])."""

    advantage: float
    """Normalised within the row's group (vertical mode) or the prompt's mixed group (horizontal mode), float64."""
    group_max_length: int
    """The longest completion of the row's group (the filter statistic's denominator)."""
    age: int | None = None
    """How many of its sender's steps old the row was when a step took it (the sender's newest delivered round
    minus the row's round); `None` when not known (rows given to `add_peer_rows`). For the metrics by age only."""


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, scale_rewards: str = "group") -> torch.Tensor:
    """
    Advantages normalised within each group: `(r - mean_g) / (std_g + 1e-4)`, or `r - mean_g` with
    `scale_rewards="none"`. A group of one row gets advantage 0. Computed and returned in float64.

    This is the arithmetic of TRL's `multi_objective_aggregation="sum_then_normalize"` (unbiased std, the same `1e-4`),
    which `GRPOTrainer._generate_and_score_completions` computes inline on contiguous groups of exactly
    `num_generations` rows (`rewards.view(-1, G)`); peer groups come in any size and any order, so TRL's code cannot be
    called for them. Deliberate differences: `scale_rewards="batch"` is treated as `"group"` (normalising over a
    batch of mixed models is exactly what vertical F-TIS avoids), `"normalize_then_sum"` is not applied (peer rows
    carry one total reward), and the arithmetic cannot overflow: each group's rewards are divided by their largest
    magnitude `s` first, so `(r - mean) / (std + 1e-4)` is computed as `(x - mean_x) / (std_x + 1e-4 / s)` with
    `x = r / s` in `[-1, 1]` (the same value, exactly in real arithmetic). Rewards near the float32 maximum, or
    `±1e300`, give the advantages of any other rewards in the same proportions; only `scale_rewards="none"` can then
    give an advantage too large for float32 (the trainer drops such rows). A non-finite reward gives NaN advantages
    to its whole group.

    Args:
        rewards (`torch.Tensor`):
            Total reward per row, shape `(B,)`.
        group_index (`torch.Tensor`):
            A group label per row, shape `(B,)`.
        scale_rewards (`str`, *optional*, defaults to `"group"`):
            `"group"` (or `"batch"`) divides by the group's std, `"none"` does not.
    """
    rewards = rewards.to(torch.float64)
    if rewards.numel() == 0:
        return rewards.clone()
    _, index, counts = torch.unique(group_index.to(rewards.device), return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    scale = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device)
    scale = scale.scatter_reduce(0, index, rewards.abs(), reduce="amax", include_self=False)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero groups: x = 0 (NaN stays NaN)
    x = rewards / scale[index]
    counts = counts.to(torch.float64)
    mean = torch.zeros_like(scale).index_add(0, index, x) / counts
    centred = x - mean[index]
    if scale_rewards == "none":
        advantages = centred * scale[index]
    else:
        # Two-pass unbiased std, like torch.std.
        variance = torch.zeros_like(scale).index_add(0, index, centred * centred) / (counts - 1).clamp(min=1)
        advantages = centred / (variance.sqrt()[index] + 1e-4 / scale[index])
    return torch.where(counts[index] > 1, advantages, torch.zeros_like(advantages))


def group_indices(rows: Sequence[PeerRow]) -> torch.Tensor:
    """A group number per row: rows with the same `(sender, group)` share one."""
    keys: dict[tuple, int] = {}
    return torch.tensor([keys.setdefault((row.sender, row.group), len(keys)) for row in rows], dtype=torch.long)


def group_statistics(rows: Sequence[Any], scale_rewards: str = "group") -> tuple[list[float], list[int]]:
    """Per row (anything with `sender`, `group`, `reward` and `completion_ids`), its advantage normalised within its
    `(sender, group)` (in float64: see [`group_advantages`]) and the longest completion of that group."""
    if not rows:
        return [], []
    index = group_indices(rows)
    rewards = torch.tensor([float(row.reward) for row in rows], dtype=torch.float64)
    lengths = torch.tensor([len(row.completion_ids) for row in rows])
    return group_advantages(rewards, index, scale_rewards).tolist(), group_max_len(lengths, index).tolist()


def assign_group_statistics(rows: Sequence[PeerRow], scale_rewards: str = "group") -> None:
    """Set each [`PeerRow`]'s `advantage` (normalised within its group, in float64: see [`group_advantages`]) and
    `group_max_length`, in place ([`group_statistics`]). The trainer itself uses [`with_group_statistics`], which
    returns [`ScoredRow`]s instead.

    Done once, on all received rows, before they are shared out between the processes of a job: a group split over
    two processes would otherwise be normalised in two halves.
    """
    advantages, max_lengths = group_statistics(rows, scale_rewards)
    for row, advantage, max_length in zip(rows, advantages, max_lengths, strict=True):
        row.advantage, row.group_max_length = advantage, max_length


def with_group_statistics(rows: Sequence[AdmittedRow], scale_rewards: str = "group") -> list[ScoredRow]:
    """The admitted `rows` as [`ScoredRow`]s, with their advantages normalised within each `(sender, group)` of
    `rows` and their groups' longest completions ([`group_statistics`])."""
    advantages, max_lengths = group_statistics(rows, scale_rewards)
    return [row.with_statistics(a, m) for row, a, m in zip(rows, advantages, max_lengths, strict=True)]


QueuedRow = TypeVar("QueuedRow")


def take_rows(rows: Sequence[QueuedRow], most: int | None) -> tuple[list[QueuedRow], list[QueuedRow]]:
    """The first rows of a queue, at most `most` (`None`: all), as whole `(sender, group)` groups in queue order
    while they fit; a first group larger than `most` gives its first `most` rows. Returns (taken, left)."""
    if most is None or len(rows) <= most:
        return list(rows), []
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault((row.sender, row.group), []).append(index)
    taken: list[int] = []
    for members in groups.values():
        if len(taken) + len(members) > most:
            taken = taken or members[:most]
            break
        taken += members
    chosen = set(taken)
    return [rows[k] for k in sorted(chosen)], [row for k, row in enumerate(rows) if k not in chosen]


def select_rows(
    rows: Sequence[PeerRow], max_rows: int | None, *, regulars: Collection[str] | None = None
) -> list[PeerRow]:
    """At most `max_rows` rows, taken as whole groups, newest round first, alternating between senders so that one
    fast peer cannot crowd out the others. `None`: all rows.

    With `regulars` (the swarm round's `RoundResult.regulars`: the expected, registered or known peers), each regular
    sender has its own turn of the round-robin and every other sender shares one turn (their groups alternate within
    it): a member that invents a thousand sender ids gets one turn, not a thousand. `None`: every sender has a turn.
    """
    if max_rows is None or len(rows) <= max_rows:
        return list(rows)
    groups: dict[tuple, list[PeerRow]] = {}
    for row in rows:
        groups.setdefault((row.sender, row.group), []).append(row)
    by_sender: dict[str, list[list[PeerRow]]] = {}
    for (sender, _), members in groups.items():
        by_sender.setdefault(sender, []).append(members)
    for queue in by_sender.values():
        queue.sort(key=lambda members: -(members[0].round or 0))  # stable: arrival order within a round
    queues = [deque(queue) for sender, queue in by_sender.items() if regulars is None or sender in regulars]
    others = [queue for sender, queue in by_sender.items() if regulars is not None and sender not in regulars]
    if others:  # one shared turn, last: the others' groups alternate between them within it
        queues.append(deque(members for turn in zip_longest(*others) for members in turn if members is not None))
    selected: list[PeerRow] = []
    while len(selected) < max_rows and any(queues):
        for queue in queues:
            if queue:
                members = queue.popleft()
                if len(selected) + len(members) <= max_rows:  # a group that does not fit is skipped whole
                    selected.extend(members)
    return selected


@dataclass
class PeerBatch:
    """Peer rows turned into tensors shaped like TRL's batch (before merging)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    generator_logps: torch.Tensor
    advantages: torch.Tensor
    group_max_lengths: torch.Tensor
    senders: list[str]
    text_level: torch.Tensor
    """bool `(B,)`: rows re-tokenised from a peer with another tokenizer ([`PeerRow.text_level`])."""

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


def build_peer_batch(
    rows: Sequence[PeerRow | ScoredRow],
    prompt_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    scale_rewards: str = "group",
    device: torch.device | str = "cpu",
) -> PeerBatch:
    """
    Tensors for `rows`, whose prompts the caller already rendered and tokenized into `prompt_ids`.

    Prompts are padded on the left and completions on the right, like TRL's own rows. Advantages come from each
    group's rewards alone (or from the rows' `advantage` and `group_max_length`, when [`assign_group_statistics`] set
    them for every row), computed in float64 and returned in float32; generator log-probs below [`LOGP_FLOOR`] are
    raised to it. Checking that the advantages fit float32 is the caller's job (the trainer drops rows beyond
    [`MAX_ABS_ADVANTAGE`]).

    Args:
        rows (`Sequence[PeerRow | ScoredRow]`):
            The peer rows (the trainer passes [`ScoredRow`]s, with their `prompt_ids`).
        prompt_ids (`Sequence[Sequence[int]]`):
            Each row's prompt, tokenized with the receiver's chat template, without padding.
        pad_token_id (`int`):
            Padding id of the receiver's tokenizer.
        scale_rewards (`str`, *optional*, defaults to `"group"`):
            Passed to [`group_advantages`].
        device (`torch.device` or `str`, *optional*, defaults to `"cpu"`):
            Device of the returned tensors.

    Returns:
        [`PeerBatch`]: the rows as tensors shaped like TRL's batch.
    """
    if len(rows) != len(prompt_ids):
        raise ValueError(f"{len(rows)} peer rows but {len(prompt_ids)} tokenized prompts.")
    if all(row.advantage is not None and row.group_max_length is not None for row in rows):
        advantages = torch.tensor([float(row.advantage) for row in rows], dtype=torch.float64)
        group_max = torch.tensor([int(row.group_max_length) for row in rows], dtype=torch.long)
    else:
        group_index = group_indices(rows)
        rewards = torch.tensor([float(row.reward) for row in rows], dtype=torch.float64)
        advantages = group_advantages(rewards, group_index, scale_rewards)
        group_max = group_max_len(torch.tensor([len(row.completion_ids) for row in rows]), group_index)

    prompts = [torch.as_tensor(np.asarray(ids, dtype=np.int64)) for ids in prompt_ids]
    completions = [torch.as_tensor(np.asarray(row.completion_ids, dtype=np.int64)) for row in rows]
    # Clipped in float64 before the float32 cast: -1e300 would become -inf.
    logps = [
        torch.as_tensor(np.maximum(np.asarray(row.generator_logps, dtype=np.float64), LOGP_FLOOR).astype(np.float32))
        for row in rows
    ]
    return PeerBatch(
        prompt_ids=pad(prompts, padding_value=pad_token_id, padding_side="left").to(device),
        prompt_mask=pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left").to(device),
        completion_ids=pad(completions, padding_value=pad_token_id, padding_side="right").to(device),
        completion_mask=pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right").to(
            device
        ),
        # Padded log-probs are 0 plus mask, never -inf.
        generator_logps=pad(logps, padding_value=0.0, padding_side="right").to(device),
        advantages=advantages.to(device, torch.float32),
        group_max_lengths=group_max.to(device),
        senders=[row.sender for row in rows],
        text_level=torch.tensor([bool(row.text_level) for row in rows], dtype=torch.bool, device=device),
    )


def _pad_columns(x: torch.Tensor, width: int, value: float, side: str) -> torch.Tensor:
    missing = width - x.shape[1]
    if missing <= 0:
        return x
    filler = torch.full((x.shape[0], missing), value, dtype=x.dtype, device=x.device)
    return torch.cat([filler, x] if side == "left" else [x, filler], dim=1)


def concat_rows(
    local: dict[str, Any],
    extra: dict[str, Any],
    *,
    pad_token_id: int,
    left_padded: Sequence[str] = ("prompt_ids", "prompt_mask"),
) -> dict[str, Any]:
    """
    Concatenate two TRL batch dicts row-wise.

    Keys in `left_padded` are widened on the left (prompts: the completion must start at the same column for every
    row), every other `(B, T)` tensor on the right. Id tensors are padded with `pad_token_id`, masks and log-probs with
    0. Scalars (`num_items_in_batch`) are left to the caller.

    Args:
        local (`dict[str, Any]`):
            The batch TRL formed (its keys decide what is merged).
        extra (`dict[str, Any]`):
            The rows to append; must have every tensor field of `local`, else `KeyError`.
        pad_token_id (`int`):
            Padding id for `*_ids` tensors.
        left_padded (`Sequence[str]`, *optional*, defaults to `("prompt_ids", "prompt_mask")`):
            Keys widened on the left.
    """
    merged: dict[str, Any] = {}
    for key, value in local.items():
        other = extra.get(key)
        if not isinstance(value, torch.Tensor) or value.ndim == 0:
            merged[key] = value
            continue
        if other is None:
            raise KeyError(f"Cannot merge peer rows: they lack the batch field {key!r}.")
        if value.ndim == 2:
            width = max(value.shape[1], other.shape[1])
            side = "left" if key in left_padded else "right"
            fill = pad_token_id if key.endswith("_ids") else 0
            value = _pad_columns(value, width, fill, side)
            other = _pad_columns(other.to(value.dtype), width, fill, side)
        merged[key] = torch.cat([value, other.to(value.device, value.dtype)], dim=0)
    return merged


def prompt_key(prompt: Any) -> str:
    """A stable text key for a prompt (string or chat messages), to match groups of the same prompt across peers."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def prompt_columns(dataset) -> dict[str, dict[str, Any]]:
    """Prompt key -> the other columns of its first row, for a map-style dataset (empty for a streaming one)."""
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "column_names"):
        return {}
    names = [name for name in dataset.column_names if name != "prompt"]
    table: dict[str, dict[str, Any]] = {}
    for example in dataset:
        table.setdefault(prompt_key(example["prompt"]), {name: example[name] for name in names})
    return table


def row_problems(rows: Sequence[PeerRow], vocab_limit: int) -> list[str | None]:
    """Per row, what is wrong with its numbers (`"bad_ids"`: ids not one-dimensional integers in
    `[0, vocab_limit)`; `"bad_logps"`: generator log-probs not finite and <= [`MAX_LOGP`] in float64), or `None`.
    One vectorised pass over all rows; the per-row checks only run when something is wrong."""
    if not rows:
        return []
    try:
        ids = np.concatenate([np.asarray(row.completion_ids).reshape(-1) for row in rows])
        logps = np.concatenate([np.asarray(row.generator_logps, dtype=np.float64).reshape(-1) for row in rows])
        shapes_ok = all(np.ndim(row.completion_ids) == 1 and np.ndim(row.generator_logps) == 1 for row in rows)
        ids_ok = shapes_ok and ids.dtype.kind in "iu" and ids.min() >= 0 and ids.max() < vocab_limit
        logps_ok = shapes_ok and bool(np.isfinite(logps).all() and (logps <= MAX_LOGP).all())
    except (TypeError, ValueError):
        ids_ok = logps_ok = False
    if ids_ok and logps_ok:
        return [None] * len(rows)
    return [row_problem(row, vocab_limit) for row in rows]


def row_problem(row: Any, vocab_limit: int) -> str | None:
    """What is wrong with one row's numbers (`"bad_ids"`, `"bad_logps"`: see [`row_problems`]), or `None`."""
    try:
        ids = np.asarray(row.completion_ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= vocab_limit:
            return "bad_ids"
    except (TypeError, ValueError):
        return "bad_ids"
    try:
        logps = np.asarray(row.generator_logps, dtype=np.float64)
        if logps.ndim != 1 or not (np.isfinite(logps).all() and (logps <= MAX_LOGP).all()):
            return "bad_logps"
    except (TypeError, ValueError):
        return "bad_logps"
    return None


def check_rows(rows: Sequence[PeerRow], vocab_limit: int) -> None:
    """Raise `ValueError` naming the first bad row's sender: ids outside [0, vocab_limit) (or not one-dimensional
    integers), log-probs not finite and <= 0 ([`row_problems`], which the trainer uses to drop such rows instead)."""
    for row, problem in zip(rows, row_problems(rows, vocab_limit), strict=True):
        if problem == "bad_ids":
            raise ValueError(
                f"Peer row from {row.sender!r} has token ids outside this model's vocabulary [0, {vocab_limit}): "
                "peers must share a tokenizer (rows in another tokenizer's tokens: foreign_tokenizer=True with their "
                "completion_text, and cross_tokenizer=True)."
            )
        if problem == "bad_logps":
            raise ValueError(f"Peer row from {row.sender!r} has generator log-probs that are not finite and <= 0.")


def row_type_problem(row: Any) -> str | None:
    """What makes `row` a programming error for `FTISTrainer.add_peer_rows` (it raises `TypeError` with this text):
    not a [`PeerRow`], a `sender` that is not a string, a `group` that is not hashable, a `prompt` neither a string nor
    a list, `extra` neither a dict with string keys nor `None`. `None` when the row's types are right."""
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


SHARED_FIELDS = (
    "prompt",
    "completion_ids",
    "generator_logps",
    "reward",
    "group",
    "sender",
    "rewards_per_func",
    "extra",
    "round",
)
"""The [`PeerRow`] fields an [`AdmittedRow`] carries: what a multi-process trainer pickles when it gathers the rows of
`add_peer_rows` (accelerate's `gather_object`)."""


class _Discard:
    """A file that keeps nothing: pickling into it checks that a value can be pickled without holding its bytes."""

    def write(self, data) -> int:
        return len(data)


def _pickling_error(value: Any) -> Exception | None:
    """Why `value` cannot be pickled (with the highest protocol, as `gather_object` does); `None` when it can."""
    try:
        pickle.Pickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception as error:  # noqa: BLE001 - PicklingError, TypeError, AttributeError, RecursionError, a __reduce__'s
        return error
    return None


def row_pickle_problem(row: PeerRow, index: int) -> str | None:
    """What makes `row` (the `index`-th of an `add_peer_rows` call; its types already checked by [`row_type_problem`])
    impossible to share between processes: the first of its [`SHARED_FIELDS`] that cannot be pickled (for `extra`, the
    first such column), and why. `None` when the row can be pickled. A good row is pickled once, into nothing."""
    values = tuple(getattr(row, name) for name in SHARED_FIELDS)
    error = _pickling_error(values)
    if error is None:
        return None
    where = "PeerRow"
    for name, value in zip(SHARED_FIELDS, values, strict=True):
        field_error = _pickling_error(value)
        if field_error is None:
            continue
        where, error = f"PeerRow.{name}", field_error
        if name == "extra":
            for key, column in value.items():
                column_error = _pickling_error(column)
                if column_error is not None:
                    where, error = f"PeerRow.extra[{key!r}]", column_error
                    break
        break
    reason = f"{type(error).__name__}: {error}"
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return (
        f"{where} cannot be pickled (row {index} of this call, from {row.sender!r}): {reason}. The rows given to "
        "add_peer_rows are shared between processes with pickle (accelerate's gather_object): pass plain data "
        "(strings, numbers, lists, dicts, tuples)."
    )


def checked_rows(rows: Iterable[Any]) -> list[PeerRow]:
    """The rows of an `FTISTrainer.add_peer_rows` call as a list, once every one is a [`PeerRow`] of the right types
    ([`row_type_problem`]) that can be pickled ([`row_pickle_problem`]); else `TypeError` naming the first bad row and
    field. All are checked before any is queued: a call queues all its rows or none."""
    rows = list(rows)
    for index, row in enumerate(rows):
        problem = row_type_problem(row) or row_pickle_problem(row, index)
        if problem is not None:
            raise TypeError(problem)
    return rows
