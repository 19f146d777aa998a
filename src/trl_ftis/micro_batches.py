"""A micro-batch that peer rows made larger than `per_device_train_batch_size`, computed in chunks with the same
gradient: [`split_rows`] cuts it into row chunks, [`chunk_weights`] weighs each chunk's loss so that the weighted sum
is the loss TRL's `loss_type` computes on the whole micro-batch."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ROW_MEAN_LOSSES", "TOKEN_MEAN_LOSSES", "chunk_weights", "split_rows"]

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
