"""Seconds per supervised warm-up step (AdamW, batch 64, the warm-up of part B of benchmarks/peer_gain.md) for the
candidates of the frontier rule's order, so that the cost of a candidate's part B can be estimated before it runs.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/warm_cost.py | tee benchmarks/results/peer_gain_wall-warm-cost.txt

One process on one core; the medians of `STEPS` timed steps after one untimed step; a fresh random model per
configuration. Seconds are context (this machine is shared): what they decide is an order of magnitude.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import time_to_target as ttt

CANDIDATES = [(128, 4, 14), (256, 4, 7), (128, 2, 4), (128, 2, 7), (64, 2, 2)]
STEPS = 8


def main() -> None:
    import torch

    from trl_ftis.demo.tiny import build_tiny_causal_lm
    from trl_ftis.tasks.carry_chain import carry_chain_problems, carry_chain_warmup, max_chain_tokens

    torch.set_num_threads(1)
    tok = ttt.tokenizer()
    print("# python benchmarks/warm_cost.py (one core)")
    print("| hidden | layers | digits | s a warm-up step (median) | 4,000 steps (h) |")
    print("|---|---|---|---|---|")
    for hidden, layers, digits in CANDIDATES:
        problems = carry_chain_problems(2000, seed=1, split="train", digits=digits)
        model = build_tiny_causal_lm(
            tok,
            hidden_size=hidden,
            num_layers=layers,
            seed=0,
            max_position_embeddings=2 * digits + 2 + max_chain_tokens(digits) + 8,
        )
        times = []
        for step in range(STEPS + 1):
            began = time.perf_counter()
            carry_chain_warmup(model, tok, problems, steps=1, batch_size=64, lr=3e-3, seed=step)
            if step:
                times.append(time.perf_counter() - began)
        median = statistics.median(times)
        print(f"| {hidden} | {layers} | {digits} | {median:.2f} | {4000 * median / 3600:.2f} |", flush=True)


if __name__ == "__main__":
    main()
