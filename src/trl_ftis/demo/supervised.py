"""The one supervised loop of the demo: next-token prediction on `prompt + target` with the loss on the target only.

[`trl_ftis.demo.tiny.supervised_warmup`] (the tiny models' warm-up on the addition task) and
[`trl_ftis.demo.driver.heal_small_peer`] (the pruned SmolLM2's healing on worked solutions) both run
[`supervised_steps`]; they differ only in how they tokenize their examples and pick the batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

__all__ = ["pad_supervised_batch", "supervised_steps"]

#: One example: the prompt's token ids (no loss) and the target's (loss), e.g. an answer followed by EOS.
Example = tuple[Sequence[int], Sequence[int]]


def pad_supervised_batch(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """`input_ids`, `attention_mask` and `labels` for `prompt + target` rows, padded on the right with
    `pad_id`; the labels are -100 (no loss) on the prompt and the padding."""
    rows = [list(prompt) + list(target) for prompt, target in examples]
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, (prompt, _)) in enumerate(zip(rows, examples, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        labels[i, len(prompt) : len(row)] = torch.tensor(row[len(prompt) :])
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def supervised_steps(
    model,
    batches: Iterable[Sequence[Example]],
    *,
    lr: float,
    pad_id: int,
    on_step: Callable[[int, float], bool] | None = None,
) -> tuple[int, float | None]:
    """One AdamW step (learning rate `lr`, a fresh optimizer) per batch of `(prompt_ids, target_ids)` examples
    in `batches`, in train mode, with the loss on the targets only ([`pad_supervised_batch`]).

    `batches` may be a generator: it is drawn from one batch a step, so it can stop early or draw lazily.
    `on_step(step, loss)`, if given, runs after each step (1-based) and stops the loop by returning True; the
    model is put back in train mode after it (it may evaluate). Returns `(steps taken, the last step's loss)`
    (`(0, None)` when there was no batch).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    steps, last_loss = 0, None
    for examples in batches:
        batch = {key: value.to(model.device) for key, value in pad_supervised_batch(examples, pad_id).items()}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        last_loss = loss.item()
        if on_step is not None:
            stop = on_step(steps, last_loss)
            model.train()
            if stop:
                break
    return steps, last_loss
