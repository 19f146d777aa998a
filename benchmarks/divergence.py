"""The divergence experiment: a learner next to a frozen partner, at three levels of divergence, every setting,
paired seeds.

    OMP_NUM_THREADS=1 python benchmarks/divergence.py                # 8 seeds, the whole grid (see docs/benchmarks.md)
    OMP_NUM_THREADS=1 python benchmarks/divergence.py --quick        # 2 seeds, 8 steps: checks the machinery

The learner trains with `FTISTrainer` on 2-digit addition (dense `digit_match` reward, 16 own prompts x 8
completions a step). Before every step a frozen partner samples 16 prompts of its own x 8 completions at the same
temperature; their generator log-probs come from one forward pass of the partner (full softmax at temperature 1),
their rewards from the learner's reward function (as a swarm receiver rescores them), and they join the learner's
batch through `add_peer_rows`. Partners:

    copy     the learner's own starting weights (importance weights ~1, filter statistic ~0)
    weaker   a smaller model (hidden 32) warmed up less
    wrong    a model of the learner's size warmed up on a corrupted rule (the answer's digits reversed): confident,
             wrong, its samples likely under it and unlikely under the learner (what the filter is for)
    strong   (roles swapped) the strong model next to a weak learner

Settings: `alone` (own rows only: the same own generation), `alone-rows` (own rows only, twice as many: the same
rows per step as with a partner), and with the partner's rows `nois`, `tis`, `f-nois`, `f-tis` (filter_mode zero,
g = 50), `f-tis-remove` (the authors' filter_mode) and `f-tis-quantile` (g from a running quantile, 10% target).
Every (learner, partner, setting) runs on the same seeds; a seed fixes the warm checkpoints, the prompts and the
sampling. One JSON record per run goes to `--out` (JSON lines; runs already there are skipped, so the command can
be rerun to finish a grid), then a summary (paired differences with 95% t-intervals and sign counts) is printed and
written to `--summary`, and the dose-response figure to `--figure`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paired import format_interval, interval  # benchmarks/, the script's folder
from warm_models import MODELS, warm_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ["alone", "alone-rows", "nois", "tis", "f-nois", "f-tis", "f-tis-remove", "f-tis-quantile"]
WITH_PARTNER = SETTINGS[2:]
EXPERIMENTS = {"strong-learner": ("big", ["copy", "weaker", "wrong"]), "weak-learner": ("small", ["strong"])}
PARTNER_MODEL = {"copy": None, "weaker": "small", "wrong": "wrong", "strong": "big"}
PROMPTS_PER_STEP, G = 16, 8


def warm_model(cache: Path, name: str, seed: int):
    """The warm model `name` for `seed`, loaded ([`warm_models.warm_checkpoint`])."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(warm_checkpoint(cache, name, seed))


def partner_rows(model, tokenizer, problems, step: int, seed: int):
    """`PROMPTS_PER_STEP` of the partner's prompts x `G` sampled completions, with their generator log-probs."""
    import torch

    from trl_ftis import PeerRow
    from trl_ftis.tasks.addition import digit_match_reward
    from trl_ftis.tasks.generation import generate_completions

    batch = [problems[(step * PROMPTS_PER_STEP + k) % len(problems)] for k in range(PROMPTS_PER_STEP)]
    completions = generate_completions(
        model,
        tokenizer,
        [p["prompt"] for p in batch],
        max_new_tokens=6,
        batch_size=256,
        stop_ids=[tokenizer.eos_token_id],
        do_sample=True,
        num_samples=G,
        seed=seed * 100_003 + step,
    )
    rows = []
    with torch.no_grad():
        for index, completion in enumerate(completions):
            problem = batch[index // G]
            prompt_ids = tokenizer(problem["prompt"], add_special_tokens=False)["input_ids"]
            # The character tokenizer round-trips text exactly: the sampled ids are the text's, then EOS if it ended.
            ids = tokenizer(completion.text, add_special_tokens=False)["input_ids"]
            ids += [] if completion.truncated else [tokenizer.eos_token_id]
            if not ids:
                continue
            logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
            logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)
            group = ("partner", step, index // G)
            # add_peer_rows uses rewards as given: score them with the learner's reward function, as a swarm
            # receiver would (trust_peer_rewards=False).
            reward = digit_match_reward([completion.text], [problem["answer"]])[0]
            rows.append(
                PeerRow(
                    problem["prompt"],
                    ids,
                    logps.tolist(),
                    reward,
                    group,
                    "partner",
                    extra={"answer": problem["answer"]},
                )
            )
    return rows


def malformed_rate(model, tokenizer, problems) -> float:
    """Share of greedy held-out answers that are not a plain number (then EOS)."""
    from trl_ftis.tasks.generation import generate_completions

    completions = generate_completions(
        model, tokenizer, [p["prompt"] for p in problems], max_new_tokens=6, batch_size=256,
        stop_ids=[tokenizer.eos_token_id],
    )  # fmt: skip
    return sum(not (c.text.strip().isdigit() and not c.truncated) for c in completions) / max(len(problems), 1)


def run_one(spec: dict) -> dict:
    """One learner run; returns its record."""
    import torch
    from transformers import TrainerCallback

    from trl_ftis import FTISTrainer
    from trl_ftis.demo.tiny import build_char_tokenizer, tiny_grpo_config
    from trl_ftis.tasks.addition import addition_dataset, addition_problems, digit_match_reward, greedy_accuracy

    torch.set_num_threads(1)
    start = time.time()
    cache, seed, setting = Path(spec["cache"]), spec["seed"], spec["setting"]
    tokenizer = build_char_tokenizer()
    learner = warm_model(cache, spec["learner"], seed)
    held_out = addition_problems(spec["eval_size"], seed=99_999, split="test")
    before = greedy_accuracy(learner, tokenizer, held_out)
    partner_name = PARTNER_MODEL.get(spec["partner"])
    partner = None
    if setting in WITH_PARTNER:
        partner = warm_model(cache, partner_name, seed) if partner_name else warm_model(cache, spec["learner"], seed)
        partner.eval()
    variant = {"f-tis-remove": "f-tis", "f-tis-quantile": "f-tis"}.get(setting, setting)
    overrides = {}
    if setting == "f-tis-remove":
        overrides["filter_mode"] = "remove"
    if setting == "f-tis-quantile":
        overrides["kl_threshold_mode"] = "quantile"
    rows_per_step = PROMPTS_PER_STEP * G * (2 if setting == "alone-rows" else 1)
    with tempfile.TemporaryDirectory() as out:
        args = tiny_grpo_config(
            out,
            max_steps=spec["steps"],
            seed=seed,
            per_device_train_batch_size=rows_per_step,
            variant="f-tis" if setting.startswith("alone") else variant,
            logging_steps=1,
            **overrides,
        )
        trainer = FTISTrainer(
            learner,
            digit_match_reward,
            args=args,
            train_dataset=addition_dataset(4000, seed=3000 + seed, split="train"),
            processing_class=tokenizer,
        )
        if partner is not None:
            problems = addition_problems(4000, seed=4000 + seed, split="train")

            class Partner(TrainerCallback):
                def on_step_begin(self, args, state, control, **kwargs):
                    trainer.add_peer_rows(partner_rows(partner, tokenizer, problems, state.global_step, seed))

            trainer.add_callback(Partner())
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]

    def mean_of(key):
        values = [entry[key] for entry in logs if key in entry]
        return statistics.fmean(values) if values else None

    model = trainer.model
    return {
        "experiment": spec["experiment"],
        "learner": spec["learner"],
        "partner": spec["partner"],
        "setting": setting,
        "seed": seed,
        "steps": spec["steps"],
        "accuracy_before": before,
        "accuracy_after": greedy_accuracy(model, tokenizer, held_out),
        "malformed_after": malformed_rate(model, tokenizer, held_out),
        "filtered_frac": mean_of("ftis/peer/filtered_frac"),
        "is_weight_mean": mean_of("ftis/peer/is_weight_mean"),
        "kl_mean": mean_of("ftis/peer/kl_mean"),
        "reward_last10": statistics.fmean([entry["reward"] for entry in logs[-10:]]) if logs else None,
        "eval_size": spec["eval_size"],
        "wall_seconds": time.time() - start,
    }


def specs(seeds, steps, eval_size, cache):
    out = []
    for experiment, (learner, partners) in EXPERIMENTS.items():
        for seed in seeds:
            for setting in SETTINGS:
                for partner in ["-"] if setting.startswith("alone") else partners:
                    out.append(
                        dict(experiment=experiment, learner=learner, partner=partner, setting=setting, seed=seed,
                             steps=steps, eval_size=eval_size, cache=str(cache))
                    )  # fmt: skip
    return out


def key(record) -> tuple:
    return (record["experiment"], record["partner"], record["setting"], record["seed"], record["steps"])


def paired(records, experiment, partner, setting, baseline, baseline_partner):
    """Paired differences in the change of accuracy (setting − baseline) over the seeds both have."""
    change = {}
    for r in records:
        if r["experiment"] == experiment:
            change[(r["partner"], r["setting"], r["seed"])] = r["accuracy_after"] - r["accuracy_before"]
    diffs = [
        change[(partner, setting, seed)] - change[(baseline_partner, baseline, seed)]
        for (p, s, seed) in list(change)
        if p == partner and s == setting and (baseline_partner, baseline, seed) in change
    ]
    return interval(diffs)


def summarise(records) -> dict:
    summary = {}
    for experiment, (_, partners) in EXPERIMENTS.items():
        for partner in ["-", *partners]:
            for setting in SETTINGS if partner == "-" else WITH_PARTNER:
                rows = [
                    r
                    for r in records
                    if r["experiment"] == experiment and r["partner"] == partner and r["setting"] == setting
                ]
                if not rows:
                    continue
                changes = [r["accuracy_after"] - r["accuracy_before"] for r in rows]
                cell = {
                    "n": len(rows),
                    "change_mean": statistics.fmean(changes),
                    "change_sd": statistics.stdev(changes) if len(changes) > 1 else None,
                    "accuracy_after_mean": statistics.fmean(r["accuracy_after"] for r in rows),
                    "malformed_after_mean": statistics.fmean(r["malformed_after"] for r in rows),
                }
                for name in ("filtered_frac", "is_weight_mean", "kl_mean"):
                    values = [r[name] for r in rows if r[name] is not None]
                    cell[name] = statistics.fmean(values) if values else None
                if setting == "alone-rows":  # what the extra own rows alone buy
                    cell["vs_alone"] = paired(records, experiment, partner, setting, "alone", "-")
                if partner != "-":
                    cell["vs_alone"] = paired(records, experiment, partner, setting, "alone", "-")
                    cell["vs_alone_rows"] = paired(records, experiment, partner, setting, "alone-rows", "-")
                    if setting != "nois":
                        cell["vs_nois"] = paired(records, experiment, partner, setting, "nois", partner)
                    if setting in ("f-tis-remove", "f-tis-quantile"):  # the options against the defaults
                        cell["vs_f_tis"] = paired(records, experiment, partner, setting, "f-tis", partner)
                summary[f"{experiment}/{partner}/{setting}"] = cell
    return summary


def print_summary(summary) -> None:
    print(
        "| experiment / partner / setting | n | change | vs alone (same own generation) | vs alone (same rows) "
        "| vs NoIS | vs F-TIS (defaults) | filtered | IS weight | malformed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, cell in summary.items():
        filtered = "-" if cell["filtered_frac"] is None else f"{cell['filtered_frac']:.2f}"
        weight = "-" if cell["is_weight_mean"] is None else f"{cell['is_weight_mean']:.2f}"
        sd = "" if cell["change_sd"] is None else f" ± {cell['change_sd']:.3f}"
        print(
            f"| {name} | {cell['n']} | {cell['change_mean']:+.3f}{sd} | {format_interval(cell.get('vs_alone'))} | "
            f"{format_interval(cell.get('vs_alone_rows'))} | {format_interval(cell.get('vs_nois'))} | "
            f"{format_interval(cell.get('vs_f_tis'))} | {filtered} | {weight} | "
            f"{cell['malformed_after_mean']:.3f} |"
        )


def figure(summary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    partners = EXPERIMENTS["strong-learner"][1]
    fig, ax = plt.subplots(figsize=(7, 4))
    for setting in WITH_PARTNER:
        points = [summary.get(f"strong-learner/{p}/{setting}", {}).get("vs_alone") for p in partners]
        xs = [i for i, d in enumerate(points) if d]
        ax.errorbar(
            [x + 0.05 * WITH_PARTNER.index(setting) for x in xs],
            [points[i]["mean"] for i in xs],
            yerr=[
                [points[i]["mean"] - points[i]["low"] for i in xs],
                [points[i]["high"] - points[i]["mean"] for i in xs],
            ],
            marker="o", capsize=3, label=setting,
        )  # fmt: skip
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(partners)), [f"partner: {p}" for p in partners])
    ax.set_ylabel("Δ accuracy change vs alone (95% CI)")
    ax.set_title("A learner next to a frozen partner: divergence grows left to right")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 8 steps, 200 held-out problems")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ftis-divergence-cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/divergence.jsonl")
    parser.add_argument("--summary", type=Path, default=ROOT / "benchmarks/results/divergence-summary.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "benchmarks/results/divergence.png")
    parser.add_argument("--only-summary", action="store_true", help="summarise the records in --out, run nothing")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_size = 2, 8, 200
        suffix = lambda path: path.with_name(path.stem + "-quick" + path.suffix)  # noqa: E731
        args.out, args.summary, args.figure = suffix(args.out), suffix(args.summary), suffix(args.figure)
    args.cache.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = []
    if args.out.exists():
        done = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    if not args.only_summary:
        finished = {key(r) for r in done}
        todo = [s for s in specs(range(args.seeds), args.steps, args.eval_size, args.cache) if key(s) not in finished]
        # Warm checkpoints first, one process, so that workers never build the same one twice.
        for seed in range(args.seeds):
            for name in MODELS:
                warm_checkpoint(args.cache, name, seed)
        print(f"{len(todo)} runs to do, {len(done)} already in {args.out}", flush=True)
        start = time.time()
        context = multiprocessing.get_context("spawn")
        with context.Pool(args.workers) as pool, args.out.open("a") as sink:
            for index, record in enumerate(pool.imap_unordered(run_one, todo), 1):
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                done.append(record)
                print(
                    f"[{index}/{len(todo)} {time.time() - start:.0f}s] {record['experiment']} {record['partner']} "
                    f"{record['setting']} seed {record['seed']}: {record['accuracy_before']:.3f} -> "
                    f"{record['accuracy_after']:.3f}",
                    flush=True,
                )
    records = [r for r in done if r["steps"] == args.steps]
    summary = summarise(records)
    args.summary.write_text(json.dumps({"command": " ".join(sys.argv), "cells": summary}, indent=2))
    print_summary(summary)
    figure(summary, args.figure)


if __name__ == "__main__":
    main()
