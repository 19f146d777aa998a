"""The warm tiny models the learning benchmarks start from: built once per (model, seed) into a cache folder."""

from __future__ import annotations

import os
from pathlib import Path

MODELS = {  # hidden size, warm-up target accuracy, answer rule
    "big": (64, 0.3, "true"),
    "small": (32, 0.12, "true"),
    "wrong": (64, 0.5, "reversed"),
}


def reversed_answer(problem: dict) -> dict:
    """The problem with its answer's digits reversed: the corrupted rule of the "wrong" model."""
    return {**problem, "answer": problem["answer"][::-1]}


def warm_checkpoint(cache: Path, name: str, seed: int) -> Path:
    """The folder of model `name` warmed up by supervised steps for `seed` (up to 600 steps or its target dev
    accuracy), built on first use. Written under a temporary name and renamed, so concurrent callers never read half
    a checkpoint."""
    import torch

    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama, supervised_warmup, warmup_dev_problems
    from trl_ftis.tasks.addition import addition_problems

    path = Path(cache) / f"{name}-seed{seed}-devsplit"  # not the checkpoints warmed up on held-out problems
    if (path / "config.json").exists():
        return path
    hidden, target, rule = MODELS[name]
    tokenizer = build_char_tokenizer()
    problems = addition_problems(4000, seed=1000 + seed, split="train")
    dev = warmup_dev_problems(100, seed=2000 + seed)  # disjoint from every held-out evaluation set
    if rule == "reversed":
        problems, dev = [reversed_answer(p) for p in problems], [reversed_answer(p) for p in dev]
    torch.manual_seed(seed)
    model = build_tiny_llama(tokenizer, hidden_size=hidden, seed=seed)
    supervised_warmup(
        model, tokenizer, problems, steps=600, target_accuracy=target, dev_problems=dev, eval_every=25, seed=seed
    )
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    model.save_pretrained(temporary)
    if path.exists():  # another process finished first: keep its copy
        import shutil

        shutil.rmtree(temporary)
    else:
        os.replace(temporary, path)
    return path
