"""What collaboration buys: wall time and own generated tokens until a peer reaches the accuracy the same model
reaches alone, with equal hardware per peer (one CPU core each).

    OMP_NUM_THREADS=1 python benchmarks/time_to_accuracy.py            # 4 paired seeds (see docs/benchmarks.md)
    OMP_NUM_THREADS=1 python benchmarks/time_to_accuracy.py --quick    # 1 seed, fewer steps

Per seed, the same warm tiny Llama (hidden 64) trains on 2-digit addition in two ways, one after the other so that
each process has a core to itself:

    alone   one process generates all 128 rows it trains on per step (16 prompts x 8), for `--steps` steps; its
            final held-out greedy accuracy is the target
    swarm   two processes (`a` and `b`, the same warm model, different prompt streams) each generate 64 rows
            (8 prompts x 8) per step and train on 128: their own and the other's, through a `dir://` exchange in
            lock-step (F-TIS, the defaults), for 1.5 x `--steps` steps (neither stops at the target: a peer that
            stopped would make its partner wait)

Held-out accuracy (500 problems no training stream contains) is measured every `--eval-every` steps; the time spent
evaluating is not counted. Per peer, the record holds the wall seconds and own generated tokens when the target was
first reached (`reached` false when never). The ratio swarm/alone of each is reported per seed and as a mean with a
95% t-interval. Records go to `--out` (JSON lines), the summary to `--summary`, the curves to `--figure`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bound_run import bind_peers_to_this_run  # benchmarks/, the script's folder
from paired import interval  # benchmarks/, the script's folder
from warm_models import warm_checkpoint

bind_peers_to_this_run()

ROOT = Path(__file__).resolve().parents[1]


def peer(options) -> None:
    """One training process (alone, or one peer of the swarm); writes its curve as JSON to `options.curve`."""
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trl_ftis import FTISTrainer
    from trl_ftis.demo.tiny import build_char_tokenizer, tiny_grpo_config
    from trl_ftis.tasks.addition import addition_dataset, addition_problems, digit_match_reward, greedy_accuracy

    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(options.checkpoint)
    held_out = addition_problems(options.eval_size, seed=99_999, split="test")
    swarm = options.exchange is not None
    rows = 64 if swarm else 128
    settings = {"per_device_train_batch_size": rows, "seed": options.seed}
    if swarm:
        settings.update(
            exchange_url=options.exchange, peer_id=options.peer_id, expected_peers=["a", "b"], peer_timeout=120
        )
    args = tiny_grpo_config(tempfile.mkdtemp(), max_steps=options.max_steps, **settings)
    stream_seed = 3000 + options.seed + (0 if options.peer_id in ("alone", "a") else 500)
    trainer = FTISTrainer(
        model,
        digit_match_reward,
        args=args,
        train_dataset=addition_dataset(4000, seed=stream_seed, split="train"),
        processing_class=tokenizer,
    )
    curve = []
    clock = {"start": time.time(), "paused": 0.0}

    def evaluate(step: int) -> float:
        paused = time.time()
        accuracy = greedy_accuracy(trainer.model, tokenizer, held_out)
        elapsed = paused - clock["start"] - clock["paused"]
        tokens = int(trainer._own_tokens)
        curve.append({"step": step, "wall_seconds": elapsed, "accuracy": accuracy, "own_tokens": tokens})
        clock["paused"] += time.time() - paused
        return accuracy

    class Progress(TrainerCallback):
        def on_step_end(self, cb_args, state, control, **kwargs):
            if state.global_step % options.eval_every == 0:
                evaluate(state.global_step)  # never stops early: a stopped peer would stall its partner

    # Own generated tokens: TRL logs num_tokens (prompt + completion, cumulative); count completion tokens ourselves.
    trainer._own_tokens = 0
    original = trainer._generate_and_score_completions

    def counting(inputs):
        output = original(inputs)  # own rows first, then the merged peer rows
        trainer._own_tokens += output["completion_mask"][: len(inputs)].sum().item()
        return output

    trainer._generate_and_score_completions = counting
    trainer.add_callback(Progress())
    curve.append(
        {"step": 0, "wall_seconds": 0.0, "accuracy": greedy_accuracy(model, tokenizer, held_out), "own_tokens": 0}
    )
    clock["start"] = time.time()
    trainer.train()
    Path(options.curve).write_text(json.dumps(curve))


def run(command, log: Path, env) -> subprocess.Popen:
    handle = open(log, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def first_reach(curve, target):
    for point in curve:
        if point["step"] > 0 and point["accuracy"] >= target:
            return point
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ftis-tta-cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/time_to_accuracy.jsonl")
    parser.add_argument("--summary", type=Path, default=ROOT / "benchmarks/results/time_to_accuracy-summary.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "benchmarks/results/time_to_accuracy.png")
    parser.add_argument("--only-summary", action="store_true", help="summarise the records in --out, run nothing")
    # One training process (internal).
    parser.add_argument("--peer-id")
    parser.add_argument("--checkpoint")
    parser.add_argument("--exchange")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--curve")
    options = parser.parse_args()
    if options.peer_id:
        return peer(options)
    if options.only_summary:
        records = [json.loads(line) for line in options.out.read_text().splitlines() if line.strip()]
        return summarise(records, options.summary)
    if options.quick:
        options.seeds, options.steps, options.eval_size = 1, 20, 300
        suffix = lambda path: path.with_name(path.stem + "-quick" + path.suffix)  # noqa: E731
        options.out, options.summary, options.figure = map(suffix, (options.out, options.summary, options.figure))
    options.cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    records, curves = [], {}
    work = Path(tempfile.mkdtemp(prefix="ftis-tta-"))
    for seed in range(options.seeds):
        checkpoint = warm_checkpoint(options.cache, "big", seed)
        base = [sys.executable, __file__, "--checkpoint", str(checkpoint), "--seed", str(seed)]
        base += ["--eval-every", str(options.eval_every), "--eval-size", str(options.eval_size)]
        alone_curve = work / f"alone-{seed}.json"
        alone = run(
            [*base, "--peer-id", "alone", "--max-steps", str(options.steps), "--curve", str(alone_curve)],
            work / f"alone-{seed}.log",
            env,
        )
        if alone.wait() != 0:
            raise RuntimeError(f"alone run failed: {work / f'alone-{seed}.log'}")
        alone_points = json.loads(alone_curve.read_text())
        target = alone_points[-1]["accuracy"]
        exchange = f"dir://{work / f'exchange-{seed}'}"
        swarm = {}
        for peer_id in ("a", "b"):
            command = [*base, "--peer-id", peer_id, "--exchange", exchange, "--max-steps", str(3 * options.steps // 2)]
            command += ["--curve", str(work / f"{peer_id}-{seed}.json")]
            swarm[peer_id] = run(command, work / f"{peer_id}-{seed}.log", env)
        for peer_id, process in swarm.items():
            if process.wait() != 0:
                raise RuntimeError(f"swarm peer failed: {work / f'{peer_id}-{seed}.log'}")
        alone_end = alone_points[-1]
        curves[seed] = {"alone": alone_points}
        for peer_id in ("a", "b"):
            points = json.loads((work / f"{peer_id}-{seed}.json").read_text())
            curves[seed][peer_id] = points
            hit = first_reach(points, target)
            record = {
                "experiment": "time_to_accuracy",
                "partner": "swarm of 2",
                "setting": f"swarm peer {peer_id}",
                "seed": seed,
                "accuracy_before": points[0]["accuracy"],
                "accuracy_after": points[-1]["accuracy"],
                "target": target,
                "reached": hit is not None,
                "wall_seconds": hit["wall_seconds"] if hit else None,
                "own_tokens": hit["own_tokens"] if hit else None,
                "steps": hit["step"] if hit else None,
                "alone_wall_seconds": alone_end["wall_seconds"],
                "alone_own_tokens": alone_end["own_tokens"],
                "alone_steps": alone_end["step"],
                "filtered_frac": None,
                "is_weight_mean": None,
            }
            record["wall_ratio"] = record["wall_seconds"] / record["alone_wall_seconds"] if hit else None
            record["token_ratio"] = record["own_tokens"] / record["alone_own_tokens"] if hit else None
            records.append(record)
            print(json.dumps(record), flush=True)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    summarise(records, options.summary)
    figure(curves, options.figure)


def summarise(records, path: Path) -> None:
    """Ratios per seed (the mean of its two peers, which are not independent), then their mean and 95% t-interval
    over seeds; seconds per step of the swarm peers and of the alone run."""
    seeds = sorted({r["seed"] for r in records})
    per_seed = {}
    for seed in seeds:
        peers = [r for r in records if r["seed"] == seed]
        reached = [r for r in peers if r["reached"]]
        per_seed[seed] = {
            "reached": f"{len(reached)}/{len(peers)}",
            "wall_ratio": statistics.fmean(r["wall_ratio"] for r in reached) if reached else None,
            "token_ratio": statistics.fmean(r["token_ratio"] for r in reached) if reached else None,
            "swarm_steps": statistics.fmean(r["steps"] for r in reached) if reached else None,
            "alone_steps": peers[0]["alone_steps"],
            "swarm_seconds_per_step": (
                statistics.fmean(r["wall_seconds"] / r["steps"] for r in reached) if reached else None
            ),
            "alone_seconds_per_step": peers[0]["alone_wall_seconds"] / peers[0]["alone_steps"],
        }  # fmt: skip
    complete = [v for v in per_seed.values() if v["wall_ratio"] is not None]
    summary = {
        "command": " ".join(sys.argv),
        "seeds": len(seeds),
        "peers_reached": sum(r["reached"] for r in records),
        "peers": len(records),
        "wall_ratio": interval([v["wall_ratio"] for v in complete], null=1.0),
        "token_ratio": interval([v["token_ratio"] for v in complete], null=1.0),
        "step_time_ratio": interval(
            [v["swarm_seconds_per_step"] / v["alone_seconds_per_step"] for v in complete], null=1.0
        ),
        "per_seed": per_seed,
    }
    path.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


def figure(curves, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for seed, runs in curves.items():
        for name, points in runs.items():
            style = "-" if name == "alone" else "--"
            ax.plot([p["wall_seconds"] for p in points], [p["accuracy"] for p in points], style,
                    color=f"C{seed}", label=f"seed {seed} {name}")  # fmt: skip
    ax.set_xlabel("wall seconds (evaluation excluded), one core per process")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("Alone (solid) vs a two-peer swarm (dashed): time to accuracy")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
