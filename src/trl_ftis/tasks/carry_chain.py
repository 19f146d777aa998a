"""Carry-chain addition: `"937+486="` -> `"7+6=13,3+8+1=12,9+4+1=14;1423"`, a verifiable task whose completion is
several times longer than its prompt (about 4x with 3 digits), so that a training step of the tiny models is
dominated by generation, as it is for reasoning models.

The completion adds the numbers digit by digit from the right: one step a column, `x+y=s` or, with a carry from the
column before, `x+y+1=s` (`s` the column sum written out, one or two digits), the steps separated by `,`, then `;` and
the answer. Both numbers have `digits` digits, so every chain has `digits` steps.

`,` and `;` are not in the tiny character tokenizer's default alphabet: build it with
``build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)`` ([`trl_ftis.demo.tiny`]); the alphabet is the default one
with `,;` appended, so every other character keeps its token id.

The problems, and so the splits, are the addition task's ([`trl_ftis.tasks.addition`]): a fixed tenth is held out
whatever the seed (`trl_ftis.tasks.addition.in_test_split`), so every peer and every seed is evaluated on problems no
training stream contains, and an early-stopping split (`trl_ftis.tasks.addition.in_dev_split`) lies on the training
side, disjoint from it.

Reward ([`carry_chain_reward`]): 1.0 when the final answer (the text after the last `;`) is exactly right, plus
0.5 x the fraction of steps that are exactly right at their position (the `,`-separated pieces before the `;`; a
chain without `;` is all steps). Range 0 to 1.5: a right answer scores at least 1.0, a right chain with a wrong
answer at most 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

from datasets import Dataset

from .addition import addition_problems, greedy_texts

__all__ = [
    "CARRY_CHAIN_ALPHABET",
    "STEP_WEIGHT",
    "carry_chain",
    "carry_chain_accuracy",
    "carry_chain_dataset",
    "carry_chain_problems",
    "carry_chain_reward",
    "carry_chain_warmup",
    "final_answer",
    "max_chain_tokens",
]

#: The tiny character tokenizer's default alphabet (`trl_ftis.demo.tiny.ALPHABET`) with the chain's separators
#: `,` (between steps) and `;` (before the answer) appended.
CARRY_CHAIN_ALPHABET = "0123456789+-*=QA: ,;"
#: Weight of the steps in [`carry_chain_reward`] (all steps right: +0.5).
STEP_WEIGHT = 0.5


def carry_chain(a: int, b: int) -> str:
    """The completion for `a+b=`: `carry_chain(937, 486) == "7+6=13,3+8+1=12,9+4+1=14;1423"`.

    Columns from the right; a column past the end of the shorter number counts as 0. The final carry is not a
    step of its own: it is the answer's leading digit.
    """
    if a < 0 or b < 0:
        raise ValueError("carry_chain adds non-negative numbers.")
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        total = x + y + carry
        steps.append(f"{x}+{y}+1={total}" if carry else f"{x}+{y}={total}")
        carry = total // 10
    return ",".join(steps) + ";" + str(a + b)


def max_chain_tokens(digits: int = 3) -> int:
    """Characters of the longest chain of two `digits`-digit numbers, plus one for EOS: the completion length
    to generate (30 with 3 digits: `9+9=18,9+9+1=19,9+9+1=19;1998` and EOS; the first column `x+y=1s` has 6
    characters, every later one `x+y+1=1s` 8, then the `,`s, the `;` and a `digits + 1`-digit answer)."""
    return 6 + 8 * (digits - 1) + (digits - 1) + 1 + (digits + 1) + 1


def carry_chain_problems(
    n: int, *, seed: int, digits: int = 3, exclude: set[str] | None = None, split: str | None = None
) -> list[dict]:
    """`n` distinct problems `{"prompt": "937+486=", "answer": "1423", "chain": "7+6=13,...;1423"}` drawn with
    `seed`, both numbers of exactly `digits` digits: the addition task's problems
    ([`trl_ftis.tasks.addition.addition_problems`], the same prompts, splits and draws) with their chains.

    Prompts in `exclude` are skipped. `split="train"` or `"test"` draws only from that side of the fixed split of
    `trl_ftis.tasks.addition.in_test_split` (about 81,000 test problems with 3 digits); `split="dev"` from the
    early-stopping split ([`trl_ftis.tasks.addition.in_dev_split`], on the training side, disjoint from `"test"`).
    """
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}.")
    problems = addition_problems(n, seed=seed, digits=digits, exclude=exclude, split=split)
    return [{**p, "chain": carry_chain(*map(int, p["prompt"][:-1].split("+")))} for p in problems]


def carry_chain_dataset(
    n: int, *, seed: int, digits: int = 3, exclude: set[str] | None = None, split: str | None = None
) -> Dataset:
    """[`carry_chain_problems`] as a `datasets.Dataset` with columns `prompt`, `answer` and `chain` (GRPO passes
    `answer` and `chain` to the reward)."""
    return Dataset.from_list(carry_chain_problems(n, seed=seed, digits=digits, exclude=exclude, split=split))


def final_answer(text: str) -> str:
    """The text after the last `;` (stripped); the whole text stripped when there is none."""
    return text.rsplit(";", 1)[-1].strip()


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def carry_chain_reward(completions: Sequence, answer: Sequence[str], chain: Sequence[str], **kwargs) -> list[float]:
    """1.0 for the exact final answer, plus [`STEP_WEIGHT`] x the fraction of the expected steps that the completion
    writes exactly at their position (see the module docstring). Chat completions use their last message's content."""
    rewards = []
    for completion, expected, expected_chain in zip(completions, answer, chain, strict=True):
        text = _text(completion).strip()
        steps = text.rsplit(";", 1)[0].split(",") if text else []
        expected_steps = expected_chain.rsplit(";", 1)[0].split(",")
        right_steps = sum(got == want for got, want in zip(steps, expected_steps))
        score = STEP_WEIGHT * right_steps / len(expected_steps)
        if ";" in text and final_answer(text) == str(expected):
            score += 1.0
        rewards.append(score)
    return rewards


def carry_chain_accuracy(
    model, tokenizer, problems: Sequence[dict], *, max_new_tokens: int | None = None, batch_size: int = 256
) -> float:
    """Fraction of `problems` whose greedy completion (cut at EOS) has a `;` and the exact answer after it.

    `max_new_tokens` defaults to [`max_chain_tokens`] of the problems' digit count."""
    if not problems:
        return 0.0
    if max_new_tokens is None:
        max_new_tokens = max_chain_tokens(max(len(p["prompt"].split("+")[0]) for p in problems))
    texts = greedy_texts(model, tokenizer, [p["prompt"] for p in problems], max_new_tokens=max_new_tokens,
                         batch_size=batch_size)  # fmt: skip
    correct = sum(";" in text and final_answer(text) == p["answer"] for text, p in zip(texts, problems, strict=True))
    return correct / len(problems)


def carry_chain_warmup(
    model,
    tokenizer,
    problems: Sequence[dict],
    *,
    steps: int = 600,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    target_accuracy: float | None = None,
    dev_problems: Sequence[dict] | None = None,
    eval_every: int = 25,
) -> tuple[int, float | None]:
    """Teach `model` the chains by next-token prediction on `prompt + chain + <eos>`, the loss on the chain only
    (one fresh AdamW, learning rate `lr`, `batch_size` problems drawn with `seed` a step).

    Stops after `steps` steps, or earlier at the first check (every `eval_every` steps) where the greedy
    [`carry_chain_accuracy`] on `dev_problems` reaches `target_accuracy`: a warm start that is partly right, so that
    GRPO has a reward signal and something left to learn. Returns `(steps taken, the last dev accuracy measured)`
    (`None` when none was). The model is left in train mode.

    (The same loop as `trl_ftis.demo.supervised.supervised_steps`, written out here because the tasks never import
    the demo.)
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    encoded = [
        (
            tokenizer(p["prompt"], add_special_tokens=False)["input_ids"],
            tokenizer(p["chain"], add_special_tokens=False)["input_ids"] + [eos],
        )
        for p in problems
    ]
    model.train()
    accuracy, taken = None, 0
    for step in range(1, steps + 1):
        index = torch.randint(len(encoded), (batch_size,), generator=generator).tolist()
        rows = [encoded[i] for i in index]
        width = max(len(p) + len(c) for p, c in rows)
        input_ids = torch.full((batch_size, width), pad)
        labels = torch.full((batch_size, width), -100)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (prompt, chain) in enumerate(rows):
            ids = prompt + chain
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
            labels[row, len(prompt) : len(ids)] = torch.tensor(chain)
        device = model.device
        loss = model(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        taken = step
        if target_accuracy is not None and dev_problems and step % eval_every == 0:
            accuracy = carry_chain_accuracy(model, tokenizer, dev_problems)
            model.train()
            if accuracy >= target_accuracy:
                break
    return taken, accuracy
