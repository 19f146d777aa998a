"""The paper's ablation at small scale: two heterogeneous tiny models, every objective variant, several seeds.

    python benchmarks/ablation.py                 # 3 seeds x 8 settings, about 25 minutes on 2 cores
    python benchmarks/ablation.py --quick         # 1 seed, fewer steps, about 5 minutes

A pair of Llamas that share a character tokenizer (hidden size 64, "big", and 32, "small") is warmed up by
supervised steps on 2-digit addition (one checkpoint per model and seed, reused by every setting, so all settings
start from the same weights). Then, for each setting, both peers train at the same time as two processes
(`examples/tiny_peer.py`), exchanging their completions every step through a `dir://` exchange:

    alone          each peer trains on its own completions only (plain GRPO): the same own generation
    alone-rows     the same, generating twice as many rows: as many rows per step as a peer trains on in the swarm
    nois ... f-tis the six objective variants, vertical mode (each peer samples full groups for its own prompts)
    horiz-f-tis    F-TIS in horizontal mode (same prompts, each peer samples half of every group)
    f-tis-text     F-TIS with every peer row treated as another tokenizer's text (`cross_tokenizer` with
                   `text_level_peer_rows`): re-tokenised, one weight min(exp(Σ ℓθ - Σ ℓgen), C) per completion, the
                   sequence statistic. Against f-tis on the same seeds: what the cross-tokenizer approximation costs
    f-tis-async    F-TIS with exchange_mode="async" (the round runs in a background worker, its rows join the next
                   step). Against f-tis on the same seeds: final accuracy and the training-reward curve

It prints, per setting and peer, the held-out greedy accuracy after training (mean ± standard deviation over seeds),
its change from the start, and the fraction of peer rows the filter zeroed. Accuracy is measured on problems
disjoint from training; the binomial standard error of one measurement is about 0.02 at 500 problems.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bound_run import bind_peers_to_this_run  # benchmarks/, the script's folder
from paired import format_interval, interval  # benchmarks/, the script's folder

bind_peers_to_this_run()

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = ROOT / "examples" / "tiny_peer.py"
SETTINGS = [
    *("alone", "alone-rows", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis", "horiz-f-tis"),
    *("f-tis-text", "f-tis-async"),
]
# Each run of these is also compared with the other on the same seed (setting - reference).
PAIRED_WITH = {"f-tis-text": "f-tis", "f-tis-async": "f-tis"}
PEERS = {"big": 64, "small": 32}


def warm_checkpoints(cache: Path, seeds, warmup_steps: int) -> dict:
    """One supervised warm-up per (peer, seed), saved as a checkpoint every setting starts from."""
    import torch

    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama, supervised_warmup, warmup_dev_problems
    from trl_ftis.tasks.addition import addition_problems

    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    paths = {}
    for seed in seeds:
        problems = addition_problems(4000, seed=1000 + seed, split="train")
        dev = warmup_dev_problems(100, seed=2000 + seed)  # disjoint from every held-out evaluation set
        for peer, hidden in PEERS.items():
            path = cache / f"{peer}-seed{seed}-devsplit"  # not the checkpoints warmed up on held-out problems
            if not (path / "config.json").exists():
                model = build_tiny_llama(tokenizer, hidden_size=hidden, seed=seed)
                # The small peer is warmed less: a weaker partner, as in the paper's 1.5B+3B pairs.
                target = 0.3 if peer == "big" else 0.15
                supervised_warmup(
                    model,
                    tokenizer,
                    problems,
                    steps=warmup_steps,
                    target_accuracy=target,
                    dev_problems=dev,
                    eval_every=25,
                    seed=seed,
                )
                model.save_pretrained(path)
            paths[(peer, seed)] = path
    return paths


def peer_command(peer: str, setting: str, seed: int, checkpoint: Path, run_dir: Path, steps: int, eval_size: int):
    from trl_ftis.demo.tiny import TINY_GRPO_SETTINGS

    horizontal = setting.startswith("horiz")
    variant = "f-tis" if setting in ("alone", "alone-rows", "horiz-f-tis", "f-tis-text", "f-tis-async") else setting
    args = {
        # The tiny models' CPU settings (the same as tiny_grpo_config's): 128 rows a step, constant lr 2e-4, ...
        **TINY_GRPO_SETTINGS,
        "preset": "paper",  # the paper's TRL options, as tiny_grpo_config's FTISConfig
        "peer_id": peer,
        "output_dir": run_dir / peer,
        "model_name_or_path": checkpoint,
        "max_steps": steps,
        # Vertical: 16 own prompts x 8 completions. Horizontal: 32 shared prompts x 4 completions from each peer.
        "num_generations": 4 if horizontal else 8,
        "reward": "exact",
        "variant": variant,
        "eval_size": eval_size,
        "dataset_seed": 3000 + seed if horizontal else (4000 if peer == "big" else 5000) + seed,
        "seed": seed,
        "report_to": "none",
        "logging_steps": 10,
    }
    if setting == "f-tis-text":  # the same tokenizer, but every peer row goes through the text path
        args.update(cross_tokenizer=True, text_level_peer_rows=True)
    if setting == "f-tis-async":
        args["exchange_mode"] = "async"
    if setting == "alone-rows":  # the fair baseline: as many rows per step as a peer trains on with its partner
        args["per_device_train_batch_size"] = 2 * TINY_GRPO_SETTINGS["per_device_train_batch_size"]
    if not setting.startswith("alone"):
        args.update(exchange_url=f"dir://{run_dir / 'exchange'}", peer_timeout=120)
        args["collaboration_mode"] = "horizontal" if horizontal else "vertical"
    command = [sys.executable, str(PEER_SCRIPT)]
    for key, value in args.items():
        command += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    if not setting.startswith("alone"):
        command += ["--expected_peers", *PEERS]
    return command


def run_pair(setting: str, seed: int, checkpoints: dict, work: Path, steps: int, eval_size: int) -> dict:
    run_dir = work / f"{setting}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    processes = {}
    for peer in PEERS:
        log = open(run_dir / f"{peer}.log", "w")
        command = peer_command(peer, setting, seed, checkpoints[(peer, seed)], run_dir, steps, eval_size)
        processes[peer] = (subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log)
    results = {}
    for peer, (process, log) in processes.items():
        code = process.wait()
        log.close()
        if code != 0:
            raise RuntimeError(
                f"{setting} seed {seed}: peer {peer} exited with {code}; see {run_dir / (peer + '.log')}"
            )
        summary = json.loads((run_dir / peer / "ftis_summary.json").read_text())
        log_text = (run_dir / f"{peer}.log").read_text()
        results[peer] = {
            # The training reward every `logging_steps` (the log lines of the peer): its learning curve.
            "rewards": [float(value) for value in re.findall(r"'reward': '([-0-9.e]+)'", log_text)],
            "before": summary["accuracy_before"],
            "after": summary["accuracy_after"],
            "rows_accepted": summary["rows_accepted"],
            "rows_filtered": summary["rows_filtered"],
            "rows_received": summary["rows_received"],
            "rows_retokenised": summary.get("rows_retokenised", 0),
            "dropped": summary.get("dropped", {}),
        }
    return results


def mean_sd(values):
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def report(results: dict, settings, seeds) -> str:
    lines = [
        f"{'setting':12s} {'peer':6s} {'accuracy after':>16s} {'change':>16s} {'peer rows':>10s} {'filtered':>9s}",
    ]
    for setting in settings:
        for peer in PEERS:
            runs = [results[(setting, seed)][peer] for seed in seeds if (setting, seed) in results]
            if not runs:
                continue
            after = [r["after"] for r in runs]
            change = [r["after"] - r["before"] for r in runs]
            accepted = sum(r["rows_accepted"] for r in runs)
            filtered = sum(r["rows_filtered"] for r in runs) / accepted if accepted else float("nan")
            lines.append(
                f"{setting:12s} {peer:6s} {mean_sd(after):>16s} {mean_sd(change):>16s} "
                f"{accepted // len(runs):>10d} {filtered:>9.3f}"
            )
    return "\n".join(lines)


def paired_report(results: dict, settings, seeds) -> str:
    """Per setting and peer: the change in accuracy minus the baseline's on the same seed, against both alone
    baselines (mean [95% t-interval] and sign count over seeds)."""

    def change(setting, seed, peer):
        run = results.get((setting, seed), {}).get(peer)
        return None if run is None else run["after"] - run["before"]

    lines = [f"{'setting':12s} {'peer':6s} {'vs alone (same own generation)':>40s} {'vs alone (same rows)':>40s}"]
    for setting in settings:
        if setting == "alone":
            continue
        for peer in PEERS:
            cells = []
            for baseline in ("alone", "alone-rows"):
                if baseline == setting:
                    cells.append("-")
                    continue
                diffs = [
                    change(setting, seed, peer) - change(baseline, seed, peer)
                    for seed in seeds
                    if change(setting, seed, peer) is not None and change(baseline, seed, peer) is not None
                ]
                cells.append(format_interval(interval(diffs)))
            lines.append(f"{setting:12s} {peer:6s} {cells[0]:>40s} {cells[1]:>40s}")
    for setting, reference in PAIRED_WITH.items():
        if setting not in settings or reference not in settings:
            continue
        lines.append("")
        lines.append(f"{setting} vs {reference} (same seeds), change in accuracy:")
        for peer in PEERS:
            diffs = [
                change(setting, seed, peer) - change(reference, seed, peer)
                for seed in seeds
                if change(setting, seed, peer) is not None and change(reference, seed, peer) is not None
            ]
            lines.append(f"  {peer:6s} {format_interval(interval(diffs))}")
        curves = [
            (seed, peer)
            for seed in seeds
            for peer in PEERS
            if all(results.get((s, seed), {}).get(peer, {}).get("rewards") for s in (setting, reference))
        ]
        if curves:
            lines.append(f"{setting} vs {reference}, mean training reward over the run (the learning curve's area):")
            for peer in PEERS:
                diffs = [
                    statistics.mean(results[(setting, seed)][peer]["rewards"])
                    - statistics.mean(results[(reference, seed)][peer]["rewards"])
                    for seed, who in curves
                    if who == peer
                ]
                lines.append(f"  {peer:6s} {format_interval(interval(diffs))}")
    return "\n".join(lines)


def records(results: dict) -> list[dict]:
    """One record per (setting, seed, peer) in the fields every learning benchmark writes (`is_weight_mean` is not
    collected by this script: `None`)."""
    out = []
    for (setting, seed), peers in sorted(results.items()):
        for peer, run in peers.items():
            accepted = run["rows_accepted"]
            out.append(
                {
                    "experiment": "ablation",
                    "learner": peer,
                    "partner": "-" if setting.startswith("alone") else next(p for p in PEERS if p != peer),
                    "setting": setting,
                    "seed": seed,
                    "accuracy_before": run["before"],
                    "accuracy_after": run["after"],
                    "filtered_frac": run["rows_filtered"] / accepted if accepted else None,
                    "is_weight_mean": None,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 40 steps, 300 held-out problems")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (quick: 0)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default 120, quick 40)")
    parser.add_argument("--settings", nargs="+", default=SETTINGS, choices=SETTINGS)
    parser.add_argument("--eval-size", type=int, default=None, help="held-out problems (default 500, quick 300)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where runs and checkpoints go (default: temp)")
    parser.add_argument("--json", type=Path, default=None, help="also write every number to this JSON file")
    parser.add_argument("--report-only", action="store_true", help="print the tables from --json, run nothing")
    parser.add_argument("--records", type=Path, default=None, help="also write one JSON line per run and peer here")
    options = parser.parse_args()
    if options.report_only:
        raw = json.loads(options.json.read_text())
        results = {(k.rsplit("/seed", 1)[0], int(k.rsplit("/seed", 1)[1])): v for k, v in raw.items()}
        seeds = sorted({seed for _, seed in results})
        settings = [s for s in SETTINGS if any(key[0] == s for key in results)]
        print(report(results, settings, seeds))
        print()
        print(paired_report(results, settings, seeds))
        if options.records:
            options.records.write_text("".join(json.dumps(r) + "\n" for r in records(results)))
        return
    seeds = options.seeds or ([0] if options.quick else [0, 1, 2])
    steps = options.steps or (40 if options.quick else 120)
    eval_size = options.eval_size or (300 if options.quick else 500)
    work = options.work_dir or Path(tempfile.mkdtemp(prefix="ftis-ablation-"))
    started = time.time()

    print(f"# warm-up checkpoints in {work / 'checkpoints'}", flush=True)
    checkpoints = warm_checkpoints(work / "checkpoints", seeds, warmup_steps=1500)
    results = {}
    for seed in seeds:
        for setting in options.settings:
            run_started = time.time()
            results[(setting, seed)] = run_pair(setting, seed, checkpoints, work / "runs", steps, eval_size)
            parts = ", ".join(
                f"{peer} {r['before']:.3f}->{r['after']:.3f} (filtered {r['rows_filtered']}/{r['rows_accepted']}"
                + (
                    f", re-tokenised {r['rows_retokenised']}, dropped {sum(r['dropped'].values())}"
                    if r.get("rows_retokenised")
                    else ""
                )
                + ")"
                for peer, r in results[(setting, seed)].items()
            )
            print(f"seed {seed} {setting:12s} {parts}  [{time.time() - run_started:.0f} s]", flush=True)

    print()
    print(
        f"# {len(seeds)} seed(s), {steps} GRPO steps per run, {eval_size} held-out problems; "
        f"big = hidden 64, small = hidden 32; total {time.time() - started:.0f} s"
    )
    print(report(results, options.settings, seeds))
    print()
    print(paired_report(results, options.settings, seeds))
    if options.json:
        options.json.write_text(json.dumps({f"{k[0]}/seed{k[1]}": v for k, v in results.items()}, indent=2))
    if options.records:
        options.records.write_text("".join(json.dumps(r) + "\n" for r in records(results)))


if __name__ == "__main__":
    main()
