"""A training micro-batch as the F-TIS loss sees it: [`batch_terms`] reads its F-TIS terms off TRL's batch dict (own
rows and peer rows, with their generator log-probs), and a micro-batch that peer rows made larger than
`per_device_train_batch_size`, computed in chunks with the same gradient: [`split_rows`] cuts it into row chunks,
[`chunk_weights`] weighs each chunk's loss so that the weighted sum is the loss TRL's `loss_type` computes on the whole
micro-batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .objective import FTISTerms, ftis_terms

__all__ = [
    "ROW_MEAN_LOSSES",
    "TOKEN_MEAN_LOSSES",
    "chunk_size",
    "chunk_weights",
    "chunked_loss",
    "joined",
    "split_rows",
]

PER_MICRO_BATCH_OPTIONS = {
    "peer_weighting": "ess",  # the peer rows' scale is the micro-batch's effective sample size
    "kl_threshold_mode": "quantile",  # g follows the micro-batch's quantile of D
}
"""F-TIS options computed from the whole micro-batch: with one on, a micro-batch is not cut into chunks (so that it
trains as it would without chunks)."""

ROW_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")
"""TRL losses that average over the micro-batch's rows: a chunk weighs its share of the rows."""
TOKEN_MEAN_LOSSES = ("bnpo",)
"""TRL losses that average over the micro-batch's tokens: a chunk weighs its share of the tokens."""
# Every other TRL loss (dapo, cispo, vespo) divides by the generation batch's tokens: chunks simply add up.


def split_rows(inputs: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """`inputs` cut into chunks of at most `size` rows (the last may be shorter): every tensor or list whose first
    dimension is the micro-batch's rows is sliced; everything else (`num_items_in_batch`, ...) is shared."""
    rows = inputs["completion_ids"].shape[0]
    chunks = []
    for start in range(0, rows, size):
        chunk = {}
        for key, value in inputs.items():
            per_row = (isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows) or (
                isinstance(value, list) and len(value) == rows
            )
            chunk[key] = value[start : start + size] if per_row else value
        chunks.append(chunk)
    return chunks


def chunk_weights(loss_type: str, chunks: list[dict[str, Any]]) -> list[float]:
    """The weight of each chunk's loss, so that their weighted sum is `loss_type`'s loss on the chunks together."""
    if loss_type in ROW_MEAN_LOSSES:
        sizes = [chunk["completion_ids"].shape[0] for chunk in chunks]
    elif loss_type in TOKEN_MEAN_LOSSES:
        sizes = [float(_loss_mask(chunk).sum()) for chunk in chunks]
        if sum(sizes) == 0:
            return [0.0] * len(chunks)  # no token anywhere: TRL's loss is 0
    else:
        return [1.0] * len(chunks)
    total = sum(sizes)
    return [size / total for size in sizes]


def _loss_mask(chunk: dict[str, Any]) -> torch.Tensor:
    mask = chunk["completion_mask"]
    return mask if chunk.get("tool_mask") is None else mask * chunk["tool_mask"]


def chunk_size(args, rows: int, *, training: bool, deepspeed: bool) -> int | None:
    """The rows a chunk of a micro-batch of `rows` holds, or `None` to compute it whole: outside training, under
    DeepSpeed (it counts every backward as a micro-step), with an option computed per micro-batch
    ([`PER_MICRO_BATCH_OPTIONS`], TRL's entropy mask `top_entropy_quantile < 1`), or when peer rows did not make it
    larger than `per_device_train_batch_size` and than one chunk of `peer_micro_batch_size` (`None`:
    `per_device_train_batch_size`; 0: never cut)."""
    size = args.per_device_train_batch_size if args.peer_micro_batch_size is None else args.peer_micro_batch_size
    per_micro_batch = any(getattr(args, name) == value for name, value in PER_MICRO_BATCH_OPTIONS.items())
    enlarged = rows > max(size, args.per_device_train_batch_size)  # by peer rows: a micro-batch without is TRL's
    if not size or not enlarged or not training or deepspeed or per_micro_batch or args.top_entropy_quantile < 1:
        return None
    return size


def chunked_loss(
    compute: Callable[[dict[str, Any]], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    inputs: dict[str, Any],
    size: int,
    loss_type: str,
) -> torch.Tensor:
    """`inputs`' loss computed in chunks of `size` rows: every chunk but the last is weighted and back-propagated
    with `backward` here; the last one's weighted loss is returned (plus the others', detached, for the log) for the
    caller to back-propagate. The gradient is that of the whole micro-batch."""
    chunks = split_rows(inputs, size)
    weights, done = chunk_weights(loss_type, chunks), 0.0
    for chunk, weight in zip(chunks[:-1], weights[:-1], strict=True):
        loss = compute(chunk) * weight
        backward(loss)
        done += loss.detach()
    return compute(chunks[-1]) * weights[-1] + done


def joined(parts: Sequence[tuple]) -> tuple:
    """Per-chunk tuples of tensors, dataclasses of tensors or `None`s, joined row-wise into one: the micro-batch's."""

    def join(values):
        first = values[0]
        if first is None:
            return None
        if dataclasses.is_dataclass(first):
            names = [field.name for field in dataclasses.fields(first)]
            return type(first)(**{name: join([getattr(v, name) for v in values]) for name in names})
        return torch.cat(list(values))

    return tuple(join([part[k] for part in parts]) for k in range(len(parts[0])))


def batch_terms(inputs: dict[str, Any], per_token_logps: torch.Tensor, **settings) -> tuple[FTISTerms, torch.Tensor]:
    """The F-TIS terms (`trl_ftis.objective.ftis_terms`, with `settings`: `variant`, `is_cap`, `kl_threshold`, ...) of
    a micro-batch of TRL's batch dict and its loss mask. Own rows have no generator log-probs of their own (`ℓgen =
    ℓold`, or the current log-probs when TRL keeps no batch-time ones); peer rows carry theirs (`ftis_gen_logps`
    where `ftis_gen_valid`)."""
    completion_mask = inputs["completion_mask"]
    mask = completion_mask if inputs.get("tool_mask") is None else completion_mask * inputs["tool_mask"]
    advantages = inputs["advantages"]
    if advantages.dim() != 1:
        raise ValueError(f"F-TIS expects one advantage per completion, got shape {tuple(advantages.shape)}.")
    old = inputs.get("old_per_token_logps")
    gen = inputs.get("ftis_gen_logps")
    if gen is not None and not inputs["ftis_gen_valid"].any():
        gen = None  # only own rows: ℓgen = ℓold
    if gen is not None:
        batch_time = per_token_logps.detach() if old is None else old
        gen = torch.where(inputs["ftis_gen_valid"].unsqueeze(-1), gen.to(batch_time.dtype), batch_time)
    group_max = inputs.get("ftis_group_max_len")
    if group_max is None:  # a batch that did not come from this trainer's batch formation
        group_max = mask.sum(-1)
    terms = ftis_terms(
        per_token_logps,
        old,
        gen,
        advantages,
        mask,
        group_max_lengths=group_max,
        text_level=inputs.get("ftis_text_level"),
        **settings,
    )
    return terms, mask
