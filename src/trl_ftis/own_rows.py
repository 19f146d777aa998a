"""What a trainer's own completions look like on the way out, and the truncation rule on the way in.

TRL's `mask_truncated_completions=True` zeroes the whole `completion_mask` (and so the attention) of a completion that
ended without an end-of-sequence or padding token: it still counts in its group's advantages but not in the loss. Such
a row is still a sample of the sender's policy, so a sender sends it with all its tokens ([`completion_lengths`]
finds them, [`unmasked_completions`] restores the mask that scores them), and each receiver applies its own
`mask_truncated_completions` to peer rows ([`is_truncated`]), as TRL applies it to the receiver's own rows.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from .peer_rows import PeerRow

__all__ = [
    "LOGPS_SOURCES",
    "build_own_rows",
    "completion_lengths",
    "completion_texts",
    "generator_logps",
    "is_truncated",
    "sampling_settings",
    "unmasked_completions",
]

LOGPS_SOURCES = {
    "sampler": "the inference engine's own log-probs of the tokens it sampled (vLLM, a rollout function): the "
    "distribution actually sampled, after temperature and top_k / top_p / min_p",
    "generation": "recorded during `generate` (transformers): the distribution actually sampled, after temperature "
    "and top_k / top_p / min_p",
    "trainer": "the trainer's forward pass at the temperature, full softmax: the sampled distribution only without "
    "top_k / top_p / min_p (and, with vLLM, up to the sampler-trainer gap)",
}
"""What a row's generator log-probs are, by the name a message carries (`Message.sampling["logps"]`)."""


def completion_lengths(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, pad_token_id: int | None
) -> list[int]:
    """Each completion's length in tokens: its `completion_mask` sum, or, for a row whose mask TRL zeroed (a truncated
    completion under `mask_truncated_completions`), the tokens up to its last id that is not `pad_token_id`."""
    lengths = completion_mask.sum(-1).tolist()
    for i, length in enumerate(lengths):
        if length == 0:
            ids = completion_ids[i].tolist()
            real = [k for k, token in enumerate(ids) if token != pad_token_id]
            lengths[i] = real[-1] + 1 if real else 0
    return [int(length) for length in lengths]


def unmasked_completions(batch: dict, lengths: Sequence[int]) -> dict:
    """A shallow copy of `batch` whose `completion_mask` covers each row's first `lengths` tokens (the mask a
    truncated completion had before TRL zeroed it), to score the tokens that were sampled."""
    mask = batch["completion_mask"]
    positions = torch.arange(mask.shape[1], device=mask.device)
    lengths = torch.tensor(list(lengths), device=mask.device)
    return {**batch, "completion_mask": (positions.unsqueeze(0) < lengths.unsqueeze(1)).to(mask.dtype)}


def generator_logps(
    lengths: Sequence[int],
    *,
    recorded: Sequence[Sequence[float]] | None,
    sampler: torch.Tensor | None,
    scored: Callable[[], torch.Tensor],
) -> tuple[list[list[float]], str]:
    """Each own completion's generator log-probs (its first `lengths` tokens) and their source ([`LOGPS_SOURCES`]):
    those `recorded` while generating when they cover every token; else the `sampler`'s (vLLM's, TRL's
    `sampling_per_token_logps`) when every one is finite (vLLM leaves a token it could not score NaN); else
    `scored()`, the trainer's own forward, called only then."""
    if recorded is not None and [len(row) for row in recorded] == list(lengths):
        return [list(row) for row in recorded], "generation"
    if sampler is not None:
        rows = [row[:n] for row, n in zip(sampler.float().cpu(), lengths, strict=True)]
        if all(bool(torch.isfinite(row).all()) for row in rows):
            return [row.tolist() for row in rows], "sampler"
    return [row[:n].tolist() for row, n in zip(scored().float().cpu(), lengths, strict=True)], "trainer"


def sampling_settings(logps: str, top_k: int | None, top_p: float | None, min_p: float | None) -> dict[str, Any]:
    """`Message.sampling` of a sender whose generator log-probs are `logps` ([`LOGPS_SOURCES`]) and that samples with
    `top_k`, `top_p` and `min_p` (TRL's settings; `None` and 0 top-k are off)."""
    return {
        "logps": logps,
        "top_k": int(top_k or 0),
        "top_p": 1.0 if top_p is None else float(top_p),
        "min_p": float(min_p or 0.0),
    }


def build_own_rows(
    inputs: Sequence[Mapping[str, Any]],
    ids: Sequence[list[int]],
    logps: Sequence[list[float]],
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    reward_names: Sequence[str],
    *,
    sender: str,
    step: int,
    first_index: int,
    num_generations: int,
    texts: Sequence[tuple[str | None, bool]] | None = None,
) -> list[PeerRow]:
    """A process's scored completions as `PeerRow`s: row `i` answers `inputs[i]`, belongs to group `(step, (first_index
    + i) // num_generations)` (groups may span processes: `first_index` is this process's first row in the batch),
    and its reward is the weighted sum of `rewards_per_func[i]` (NaN, a function's None, counts 0)."""
    rewards_per_func = rewards_per_func.float().cpu()
    totals = torch.nansum(rewards_per_func * reward_weights.float().cpu(), dim=1)
    return [
        PeerRow(
            prompt=example["prompt"],
            completion_ids=ids[i],
            generator_logps=logps[i],
            reward=float(totals[i]),
            group=(step, (first_index + i) // num_generations),
            sender=sender,
            rewards_per_func={name: float(rewards_per_func[i, k]) for k, name in enumerate(reward_names)},
            extra={key: value for key, value in example.items() if key != "prompt"},
            round=step,
            completion_text=texts[i][0] if texts else None,
            ends_with_eos=texts[i][1] if texts else False,
        )
        for i, example in enumerate(inputs)
    ]


def is_truncated(completion_ids: Sequence[int], end_ids: Collection[int]) -> bool:
    """TRL's rule for `mask_truncated_completions`: a completion is truncated when its last id is not one of
    `end_ids` (the end-of-sequence ids and the padding id); an empty one is too."""
    return not completion_ids or completion_ids[-1] not in end_ids


def completion_texts(
    tokenizer, rows: Sequence[Sequence[int]], eos_ids: Collection[int]
) -> list[tuple[str | None, bool]]:
    """Per completion (its ids), its text without the final end-of-sequence token and whether it ended with one, for
    peers with another tokenizer (`cross_tokenizer`). The text is `None` (receivers drop the row, `no_text`) when it
    holds U+FFFD: a byte-level token sequence cut inside a character, which no text can stand for."""
    texts = []
    for ids in rows:
        ids = list(ids)
        ends = bool(ids) and ids[-1] in eos_ids
        text = tokenizer.decode(
            ids[:-1] if ends else ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        texts.append((None if "\ufffd" in text else text, ends))
    return texts
