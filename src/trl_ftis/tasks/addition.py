"""The addition task: `"23+48="` -> `"71"`, a verifiable task that the tiny models of [`trl_ftis.demo.tiny`]
learn on a 2-core CPU in under a minute (tests, the quick demo, the CPU benchmarks).

A fixed tenth of all problems ([`in_test_split`]) is held out whatever the seed, so every peer and every seed is
evaluated on problems no training stream contains.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

from datasets import Dataset
from transformers import PreTrainedTokenizerFast

from .generation import generate_completions


def in_test_split(prompt: str) -> bool:
    """A fixed tenth of all problems, chosen by a hash of the prompt: the held-out split, whatever the seed."""
    return zlib.crc32(prompt.encode()) % 10 == 0


def in_dev_split(prompt: str) -> bool:
    """An early-stopping (dev) split: about a tenth of the problems outside the held-out split ([`in_test_split`]),
    chosen by a second hash, so that no evaluation set drawn with `split="test"` ever shares a problem with it,
    whatever the seeds (782 problems with 2 digits). It is part of the training side: a warm-up that stops on it
    leaves its problems out of its own training batches (`trl_ftis.demo.tiny.supervised_warmup`)."""
    return not in_test_split(prompt) and zlib.crc32(f"warm-up dev:{prompt}".encode()) % 9 == 0


def addition_problems(
    n: int, *, seed: int, digits: int = 2, exclude: set[str] | None = None, split: str | None = None
) -> list[dict]:
    """`n` distinct problems `{"prompt": "23+48=", "answer": "71"}` drawn with `seed`.

    Prompts in `exclude` are skipped. `split="train"` or `"test"` draws only from that side of the fixed
    split of [`in_test_split`] (about 810 test problems with 2 digits), so every peer and every seed is
    evaluated on problems no training stream contains; `split="dev"` only from the early-stopping split
    [`in_dev_split`] (on the training side, disjoint from `"test"`).
    """
    if split not in (None, "train", "test", "dev"):
        raise ValueError(f"split must be None, 'train', 'test' or 'dev', got {split!r}.")
    in_split = {None: None, "train": lambda p: not in_test_split(p), "test": in_test_split, "dev": in_dev_split}[split]
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10**digits - 1
    exclude = exclude or set()
    seen: set[str] = set()
    problems = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 100 * n + 100_000:
            raise ValueError(f"Could not draw {n} distinct {digits}-digit problems (split={split!r}).")
        a, b = rng.randint(low, high), rng.randint(low, high)
        prompt = f"{a}+{b}="
        if prompt in seen or prompt in exclude or (in_split is not None and not in_split(prompt)):
            continue
        seen.add(prompt)
        problems.append({"prompt": prompt, "answer": str(a + b)})
    return problems


def addition_dataset(
    n: int, *, seed: int, digits: int = 2, exclude: set[str] | None = None, split: str | None = None
) -> Dataset:
    """[`addition_problems`] as a `datasets.Dataset` with columns `prompt` and `answer`."""
    return Dataset.from_list(addition_problems(n, seed=seed, digits=digits, exclude=exclude, split=split))


def exact_answer_reward(completions: Sequence, answer: Sequence[str], **kwargs) -> list[float]:
    """1.0 when the completion text (stripped; chat completions use their content) equals the answer, else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        rewards.append(1.0 if text.strip() == str(expected) else 0.0)
    return rewards


def digit_match_reward(completions: Sequence, answer: Sequence[str], **kwargs) -> list[float]:
    """A dense reward for tests: the fraction of answer characters the completion gets right, position by position,
    minus 0.1 per extra character. Unlike [`exact_answer_reward`] it varies even for an untrained model."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        text = (completion[-1]["content"] if isinstance(completion, list) else completion).strip()
        expected = str(expected)
        hits = sum(a == b for a, b in zip(text, expected))
        rewards.append(hits / len(expected) - 0.1 * max(len(text) - len(expected), 0))
    return rewards


def greedy_texts(model, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str], *, max_new_tokens: int,
                 batch_size: int = 256) -> list[str]:  # fmt: skip
    """The greedy completion of each prompt (plain prompts, cut at EOS), as text: what the tiny tasks' accuracies
    score."""
    completions = generate_completions(
        model, tokenizer, list(prompts), max_new_tokens=max_new_tokens, batch_size=batch_size,
        stop_ids=[tokenizer.eos_token_id],
    )  # fmt: skip
    return [completion.text for completion in completions]


def greedy_accuracy(
    model,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[dict],
    *,
    max_new_tokens: int = 6,
    batch_size: int = 256,
) -> float:
    """Fraction of `problems` whose greedy completion equals the answer exactly (then EOS)."""
    correct = greedy_correct(model, tokenizer, problems, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return sum(correct) / max(len(problems), 1)


def greedy_correct(
    model,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[dict],
    *,
    max_new_tokens: int = 6,
    batch_size: int = 256,
) -> list[bool]:
    """Whether each of `problems` is answered exactly (then EOS) by a greedy completion: per problem, so that two
    models evaluated on the same problems can be compared pair by pair."""
    texts = greedy_texts(model, tokenizer, [p["prompt"] for p in problems], max_new_tokens=max_new_tokens,
                         batch_size=batch_size)  # fmt: skip
    return [text.strip() == p["answer"] for text, p in zip(texts, problems, strict=True)]
