"""A one-minute F-TIS run on tiny models built locally: a learner trains on its own samples plus a smaller peer's.

    python examples/quick_demo.py [--steps 60] [--seed 0]

Two Llamas that share a character tokenizer (hidden size 64 and 32) first learn 2-digit addition a little by
supervised warm-up. The small peer then runs GRPO and publishes every completion it samples (token ids, generator
log-probs, reward). The learner runs F-TIS on its own completions plus the peer's, step by step; the same learner
also trains alone from the same start, and both are evaluated by greedy accuracy on held-out problems; the script
prints each change next to two standard errors of it (`noise_report`), the size of a difference that is noise.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_ftis.dependency_warnings import quiet_dependency_warnings

quiet_dependency_warnings()  # before the imports that warn

import torch
from transformers import PrinterCallback
from transformers.utils import logging as hf_logging

from trl_ftis import FTISTrainer
from trl_ftis.demo.report import two_standard_errors
from trl_ftis.demo.tiny import (
    build_char_tokenizer,
    build_tiny_llama,
    supervised_warmup,
    tiny_grpo_config,
    warmup_dev_problems,
)
from trl_ftis.tasks.addition import (
    addition_dataset,
    addition_problems,
    exact_answer_reward,
    greedy_accuracy,
)


def noise_report(before: float, after: dict[str, float], n: int) -> list[str]:
    """The noise band and each difference against it: two standard errors of a difference of two accuracies on `n`
    problems (`2 sqrt((p0 (1 - p0) + p1 (1 - p1)) / n)`, as for independent samples: conservative, since both are
    measured on the same problems), for each run's change from `before` and, with both runs, for `with peer` minus
    `alone`."""

    def judged(difference: float, two_se: float) -> str:
        verdict = "outside two standard errors" if abs(difference) > two_se else "inside the noise"
        return f"{difference:+.3f}, 2 SE {two_se:.3f}: {verdict}"

    band = two_standard_errors(0.5, 0.5, n)
    lines = [
        (
            f"   noise: a difference of two accuracies on {n} problems counts only when larger than two standard "
            f"errors, 2 sqrt((p0 (1 - p0) + p1 (1 - p1)) / n): at most {band:.3f} (both at 0.5)"
        )
    ]
    for label, accuracy in after.items():
        lines.append(
            f"   {label + ' - start':18s} {judged(accuracy - before, two_standard_errors(before, accuracy, n))}"
        )
    if {"alone", "with peer"} <= set(after):
        alone, shared = after["alone"], after["with peer"]
        lines.append(f"   {'with peer - alone':18s} {judged(shared - alone, two_standard_errors(alone, shared, n))}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps for each run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=500, help="held-out problems for the accuracy")
    options = parser.parse_args()
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    logging.getLogger("trl_ftis").setLevel(logging.ERROR)
    started = time.time()

    tokenizer = build_char_tokenizer()
    # Three disjoint sets: the warm-up's training problems, its early-stopping set (the dev split, which the warm-up
    # leaves out of its batches) and the held-out problems every accuracy below is measured on.
    dev = warmup_dev_problems(100, seed=options.seed)
    warmup_set = addition_problems(4000, seed=100 + options.seed)
    seen = {p["prompt"] for p in warmup_set} | {p["prompt"] for p in dev}
    held_out = addition_problems(options.eval_size, seed=200 + options.seed, exclude=seen)

    print("== warm-up: two Llamas learn a little addition by supervised steps")
    models = {}
    for name, hidden in (("learner", 64), ("small-peer", 32)):
        model = build_tiny_llama(tokenizer, hidden_size=hidden, seed=options.seed)
        steps = supervised_warmup(
            model, tokenizer, warmup_set, steps=1500, target_accuracy=0.25, dev_problems=dev, eval_every=25
        )
        models[name] = model
        size = sum(p.numel() for p in model.parameters())
        print(f"   {name:10s} hidden {hidden:3d}, {size / 1e3:5.0f}k params, {steps} warm-up steps")

    before = greedy_accuracy(models["learner"], tokenizer, held_out)
    workdir = tempfile.mkdtemp(prefix="trl-ftis-demo-")

    print(f"== the small peer runs GRPO for {options.steps} steps and publishes its completions")
    peer_trainer = FTISTrainer(
        models["small-peer"],
        exact_answer_reward,
        args=tiny_grpo_config(os.path.join(workdir, "peer"), max_steps=options.steps, seed=options.seed),
        train_dataset=addition_dataset(options.steps * 16, seed=300 + options.seed),
        processing_class=tokenizer,
    )
    peer_trainer.remove_callback(PrinterCallback)
    published: list = []
    peer_trainer.add_row_listener(published.append)
    peer_trainer.train()

    runs = {}
    for label, with_peer in (("alone", False), ("with peer", True)):
        print(f"== learner, {label}: F-TIS for {options.steps} steps")
        trainer = FTISTrainer(
            copy.deepcopy(models["learner"]),
            exact_answer_reward,
            args=tiny_grpo_config(
                os.path.join(workdir, label.replace(" ", "-")), max_steps=options.steps, seed=options.seed
            ),
            train_dataset=addition_dataset(options.steps * 16, seed=400 + options.seed),
            processing_class=tokenizer,
        )
        trainer.remove_callback(PrinterCallback)
        if with_peer:
            # Listeners run after the learner's own rows are scored and before peer rows are merged, so round k of
            # the learner trains on what the peer sampled in its round k.
            trainer.add_row_listener(lambda _rows, t=trainer: t.add_peer_rows(published[t.state.global_step]))
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        for entry in logs[:: max(len(logs) // 6, 1)]:
            line = f"   step {entry['step']:3d}  reward {entry['reward']:.3f}"
            if with_peer:
                line += (
                    f"  peer rows {entry.get('ftis/peer_rows', 0):3.0f}"
                    f"  peer filtered {entry.get('ftis/peer/filtered_frac', 0):.2f}"
                    f"  peer weight mean {entry.get('ftis/peer/is_weight_mean', float('nan')):.3f}"
                    f"  peer D mean {entry.get('ftis/peer/kl_mean', float('nan')):.3f}"
                )
            print(line)
        runs[label] = (
            greedy_accuracy(trainer.model, tokenizer, held_out),
            sum(e.get("ftis/peer_rows", 0) for e in logs),
        )

    print(f"== held-out greedy accuracy ({len(held_out)} problems), learner started at {before:.3f}")
    for label, (accuracy, rows) in runs.items():
        print(f"   {label:10s} {accuracy:.3f}  ({accuracy - before:+.3f}), peer rows trained on: {rows:.0f}")
    print("\n".join(noise_report(before, {label: accuracy for label, (accuracy, _) in runs.items()}, len(held_out))))
    print(f"== done in {time.time() - started:.0f} s (outputs in {workdir})")


if __name__ == "__main__":
    main()
