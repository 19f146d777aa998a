"""Peer rows: what a trainer receives from other peers, and how they join a local GRPO batch.

A [`PeerRow`] is one completion sampled by another model: the prompt as the dataset gave it (the receiver renders it
with its own chat template), the completion token ids, the generator's per-token log-probs and the reward. Rows
sharing a `group` were sampled for one prompt; in vertical mode (the default) their advantages are normalised within
that group only, exactly as the sender would, never across models.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from trl.trainer.utils import pad

from .objective import group_max_len
from .rules import MAX_LOGP


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
    """Set by [`assign_group_statistics`] before rows are shared out between processes (groups may split)."""
    group_max_length: int | None = None
    """Longest completion of the row's group, set with `advantage`."""

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


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, scale_rewards: str = "group") -> torch.Tensor:
    """
    Advantages normalised within each group: `(r - mean_g) / (std_g + 1e-4)`, or `r - mean_g` with
    `scale_rewards="none"`. A group of one row gets advantage 0.

    This is the arithmetic of TRL's `multi_objective_aggregation="sum_then_normalize"` (unbiased std, the same `1e-4`),
    which `GRPOTrainer._generate_and_score_completions` computes inline on contiguous groups of exactly
    `num_generations` rows (`rewards.view(-1, G)`); peer groups come in any size and any order, so TRL's code cannot be
    called for them. Deliberate differences: `scale_rewards="batch"` is treated as `"group"` (normalising over a
    batch of mixed models is exactly what vertical F-TIS avoids), `"normalize_then_sum"` is not applied (peer rows
    carry one total reward), and there is no NaN handling (a [`PeerRow`]'s reward is always finite).

    Args:
        rewards (`torch.Tensor`):
            Total reward per row, shape `(B,)`.
        group_index (`torch.Tensor`):
            A group label per row, shape `(B,)`.
        scale_rewards (`str`, *optional*, defaults to `"group"`):
            `"group"` (or `"batch"`) divides by the group's std, `"none"` does not.
    """
    rewards = rewards.to(torch.float32)
    advantages = torch.zeros_like(rewards)
    for g in torch.unique(group_index):
        rows = group_index == g
        r = rewards[rows]
        centred = r - r.mean()
        if scale_rewards != "none" and r.numel() > 1:
            centred = centred / (r.std() + 1e-4)
        advantages[rows] = centred if r.numel() > 1 else torch.zeros_like(r)
    return advantages


def group_indices(rows: Sequence[PeerRow]) -> torch.Tensor:
    """A group number per row: rows with the same `(sender, group)` share one."""
    keys: dict[tuple, int] = {}
    return torch.tensor([keys.setdefault((row.sender, row.group), len(keys)) for row in rows], dtype=torch.long)


def assign_group_statistics(rows: Sequence[PeerRow], scale_rewards: str = "group") -> None:
    """Set each row's `advantage` (normalised within its group) and `group_max_length`, in place.

    Done once, on all received rows, before they are shared out between the processes of a job: a group split over
    two processes would otherwise be normalised in two halves.
    """
    if not rows:
        return
    index = group_indices(rows)
    rewards = torch.tensor([float(row.reward) for row in rows])
    lengths = torch.tensor([len(row.completion_ids) for row in rows])
    advantages = group_advantages(rewards, index, scale_rewards).tolist()
    max_lengths = group_max_len(lengths, index).tolist()
    for row, advantage, max_length in zip(rows, advantages, max_lengths, strict=True):
        row.advantage, row.group_max_length = advantage, max_length


def select_rows(rows: Sequence[PeerRow], max_rows: int | None) -> list[PeerRow]:
    """At most `max_rows` rows, taken as whole groups, newest round first, alternating between senders so that one
    fast peer cannot crowd out the others. `None`: all rows."""
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
    selected: list[PeerRow] = []
    while len(selected) < max_rows and any(by_sender.values()):
        for queue in by_sender.values():
            if queue:
                members = queue.pop(0)
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

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


def build_peer_batch(
    rows: Sequence[PeerRow],
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
    them for every row).

    Args:
        rows (`Sequence[PeerRow]`):
            The peer rows.
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
        advantages = torch.tensor([float(row.advantage) for row in rows], dtype=torch.float32)
        group_max = torch.tensor([int(row.group_max_length) for row in rows], dtype=torch.long)
    else:
        group_index = group_indices(rows)
        rewards = torch.tensor([float(row.reward) for row in rows], dtype=torch.float32)
        advantages = group_advantages(rewards, group_index, scale_rewards)
        group_max = group_max_len(torch.tensor([len(row.completion_ids) for row in rows]), group_index)

    prompts = [torch.as_tensor(np.asarray(ids, dtype=np.int64)) for ids in prompt_ids]
    completions = [torch.as_tensor(np.asarray(row.completion_ids, dtype=np.int64)) for row in rows]
    logps = [torch.as_tensor(np.asarray(row.generator_logps, dtype=np.float32)) for row in rows]
    return PeerBatch(
        prompt_ids=pad(prompts, padding_value=pad_token_id, padding_side="left").to(device),
        prompt_mask=pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left").to(device),
        completion_ids=pad(completions, padding_value=pad_token_id, padding_side="right").to(device),
        completion_mask=pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right").to(
            device
        ),
        # Padded log-probs are 0 plus mask, never -inf.
        generator_logps=pad(logps, padding_value=0.0, padding_side="right").to(device),
        advantages=advantages.to(device),
        group_max_lengths=group_max.to(device),
        senders=[row.sender for row in rows],
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


def check_rows(rows: Sequence[PeerRow], vocab_limit: int) -> None:
    """Raise `ValueError` naming the first bad row's sender: ids outside [0, vocab_limit), log-probs not finite
    and <= 0. One vectorised pass over all rows; the per-row search only runs to name the culprit."""
    ids = np.concatenate([np.asarray(row.completion_ids).reshape(-1) for row in rows])
    logps = np.concatenate([np.asarray(row.generator_logps, dtype=np.float64).reshape(-1) for row in rows])
    ids_ok = ids.dtype.kind in "iu" and ids.min() >= 0 and ids.max() < vocab_limit
    logps_ok = bool(np.isfinite(logps).all() and (logps <= MAX_LOGP).all())
    if ids_ok and logps_ok:
        return
    for row in rows:
        row_ids = np.asarray(row.completion_ids)
        if not ids_ok and (row_ids.dtype.kind not in "iu" or row_ids.min() < 0 or row_ids.max() >= vocab_limit):
            raise ValueError(
                f"Peer row from {row.sender!r} has token ids outside this model's vocabulary [0, {vocab_limit}): "
                "peers must share a tokenizer."
            )
        row_logps = np.asarray(row.generator_logps, dtype=np.float64)
        if not logps_ok and not (np.isfinite(row_logps).all() and (row_logps <= MAX_LOGP).all()):
            raise ValueError(f"Peer row from {row.sender!r} has generator log-probs that are not finite and <= 0.")
