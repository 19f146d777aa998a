"""The tiny models' warm-up stops early on a dev set that no evaluation set shares a problem with (no training
here)."""

import logging

import pytest

from trl_ftis.demo import supervised
from trl_ftis.demo.tiny import build_char_tokenizer, supervised_warmup, warmup_dev_problems
from trl_ftis.tasks.addition import addition_problems, in_test_split


def prompts(problems):
    return {p["prompt"] for p in problems}


@pytest.mark.parametrize("seed", range(8))
def test_the_early_stopping_set_is_disjoint_from_the_evaluation_sets(seed):
    dev = warmup_dev_problems(100, seed=seed)
    assert len(prompts(dev)) == 100
    assert not any(in_test_split(p["prompt"]) for p in dev)
    # the evaluation set of examples/tiny_peer.py and of the CPU benchmarks (500 held-out problems, seed 99,999),
    # and the whole held-out split: every evaluation drawn with split="test" is inside it
    assert not prompts(dev) & prompts(addition_problems(500, seed=99_999, split="test"))
    held_out_split = {f"{a}+{b}=" for a in range(10, 100) for b in range(10, 100) if in_test_split(f"{a}+{b}=")}
    assert not prompts(dev) & held_out_split
    assert all(int(p["answer"]) == sum(map(int, p["prompt"][:-1].split("+"))) for p in dev)
    assert warmup_dev_problems(100, seed=seed) == dev  # deterministic


def test_the_warm_up_trains_on_none_of_its_early_stopping_problems_and_warns_about_held_out_ones(monkeypatch, caplog):
    tokenizer = build_char_tokenizer()
    trained_on: set[str] = set()

    def record_batches(model, batches, *, lr, pad_id, on_step=None):
        for batch in batches:
            trained_on.update(tokenizer.decode(prompt) for prompt, _ in batch)
        return 0, None

    monkeypatch.setattr(supervised, "supervised_steps", record_batches)
    dev = warmup_dev_problems(100, seed=0)
    pool = addition_problems(300, seed=1, split="train") + dev  # the pool holds every dev problem
    with caplog.at_level(logging.WARNING, logger="trl_ftis.demo.tiny"):
        supervised_warmup(None, tokenizer, pool, steps=40, batch_size=64, target_accuracy=0.5, dev_problems=dev)
    assert trained_on and not trained_on & prompts(dev)
    assert not caplog.records  # a dev split set is not warned about

    held_out_dev = addition_problems(100, seed=2000, split="test")  # how the benchmarks' warm-ups drew it
    with caplog.at_level(logging.WARNING, logger="trl_ftis.demo.tiny"):
        supervised_warmup(None, tokenizer, pool, steps=1, target_accuracy=0.5, dev_problems=held_out_dev)
    assert "100 of the 100 early-stopping problems are in the addition task's held-out split" in caplog.text
