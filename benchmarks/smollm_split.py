"""The real model, systems side: where a SmolLM2-135M step goes on this CPU, and what a two-peer swarm saves per step.

    OMP_NUM_THREADS=1 python benchmarks/smollm_split.py | tee benchmarks/results/smollm_split.txt
    OMP_NUM_THREADS=1 python benchmarks/smollm_split.py --configs demo --steps 3      # shorter

For each configuration, two slots run one after the other, each with exactly two training processes, one pinned core
each (`taskset`, one thread), so that every arm has the same hardware:

  * slot "alone": `alone` (own rows only, B = prompts x G rows a step) next to `alone-rows` (own rows only, 2B rows a
    step: as many as a swarm peer trains on);
  * slot "swarm": the two swarm peers (`dir://` exchange, lock-step, `expected_peers` both), each generating B rows
    and training on 2B.

Configurations: `demo` (the `make demo` settings: word problems, 2 prompts x 4 completions of at most 20 tokens,
temperature 0.7; `full` fine-tuning next to a `lora` copy; the alone arms full fine-tuning) and `long` (the same
prompts, a 128-token completion budget, every process LoRA). No evaluation runs: this measures time only
(`demo/peer.py` with `--eval_size 0`).

From each process's `ftis_summary.json` and `log_history.json` (the ledger, `ftis/time/...`): the generation share
f = generation / step, the exchange share r = exchange / step, seconds per step (the first step, which warms caches,
is left out). Reported: f of every arm; the step-time ratio swarm peer / alone-rows (same rows per step) and swarm
peer / alone (same own generation), each the ratio of mean step times with a 95% bootstrap interval over steps
(2,000 resamples, seed 0); and the prediction 1 - f(1 - 1/P) + r (P = 2), from f of `alone-rows` and r of the swarm
peer. Steps are few (model loading dominates a short run), so the intervals are wide; no learning claim is made.
Raw records (one JSON line per process) go to `benchmarks/results/smollm_split.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bound_run import bind_peers_to_this_run  # benchmarks/, the script's folder

bind_peers_to_this_run()

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
CONFIGS = {
    "demo": {"num_generations": 4, "prompts": 2, "max_completion_length": 20, "swarm": ("full", "lora"),
             "lora_alone": False},
    "long": {"num_generations": 4, "prompts": 2, "max_completion_length": 128, "swarm": ("lora-a", "lora-b"),
             "lora_alone": True},
}  # fmt: skip
LORA_ARGS = ["--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.0",
             "--lora_target_modules", "q_proj", "k_proj", "v_proj", "o_proj"]  # fmt: skip
LEARNING_RATE = {False: "1e-5", True: "5e-4"}  # full fine-tuning, LoRA (the demo's)
#: The learning side, transferred from the tiny models (not measured on SmolLM2): phi of the swarm's partner kind with
#: its 95% bootstrap interval (benchmarks/results/time_to_target-part3.txt: a LoRA partner of a full model for `demo`,
#: a copy of the learner for `long`'s two LoRA copies) and the batch scaling beta = steps(A_N/2) / steps(A_N)
#: (benchmarks/results/time_to_target.txt, a censored lower bound).
PHI = {"demo": (0.65, 0.46, 0.87), "long": (1.07, 0.87, 1.33)}
BETA = 2.66


def peer_command(model: Path, data: Path, out: Path, peer_id: str, config: dict, *, lora: bool, rows: int, steps: int,
                 exchange: str | None, expected: tuple[str, ...], seed: int) -> list[str]:  # fmt: skip
    batch = config["prompts"] * config["num_generations"]
    command = [
        sys.executable, "-m", "trl_ftis.demo.peer",
        "--model_name_or_path", str(model), "--data_dir", str(data), "--eval_size", "0",
        "--output_dir", str(out / peer_id), "--peer_id", peer_id, "--max_steps", str(steps),
        "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", str(rows),
        "--num_generations", str(config["num_generations"]),
        "--max_completion_length", str(config["max_completion_length"]),
        "--temperature", "0.7", "--reward_weights", "1.0", "0.2", "--lr_scheduler_type", "constant",
        "--preset", "paper",
        "--max_grad_norm", "1.0", "--learning_rate", LEARNING_RATE[lora], "--bf16", "false", "--use_cpu", "true",
        "--gradient_checkpointing", "false", "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1",
        "--disable_tqdm", "true", "--seed", str(seed), "--peer_timeout", "900",
    ]  # fmt: skip
    if exchange is None:
        command += ["--train_alone", "true"]
    else:
        command += ["--exchange_url", exchange, "--expected_peers", *expected]
    assert rows in (batch, 2 * batch)
    return command + (LORA_ARGS if lora else [])


def run_slot(commands: dict[str, list[str]], out: Path) -> None:
    """Both processes at once, process k pinned to core k; raises naming the log of a process that failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    processes = {}
    for core, (peer_id, command) in enumerate(commands.items()):
        log = open(out / f"{peer_id}.log", "w")  # noqa: SIM115 - closed with the process
        processes[peer_id] = subprocess.Popen(["taskset", "-c", str(core), *command], cwd=ROOT, env=env, stdout=log,
                                              stderr=subprocess.STDOUT)  # fmt: skip
    for peer_id, process in processes.items():
        if process.wait() != 0:
            raise RuntimeError(f"{peer_id} failed: see {out / f'{peer_id}.log'}")


def read_process(out: Path, peer_id: str) -> dict:
    summary = json.loads((out / peer_id / "ftis_summary.json").read_text())
    history = json.loads((out / peer_id / "log_history.json").read_text())
    steps = [entry for entry in history if "ftis/time/step" in entry]
    return {
        "peer_id": peer_id,
        "step_seconds": [entry["ftis/time/step"] for entry in steps],
        "generation_seconds": [entry["ftis/time/generation"] for entry in steps],
        "exchange_seconds": [entry["ftis/time/exchange"] for entry in steps],
        "time_seconds": summary["time_seconds"],
        "generation_share": summary["generation_share"],
        "own_generation": summary["own_generation"],
        "peer_value": {key: value for key, value in summary["peer_value"].items() if key != "peers"},
        "collaboration": summary["collaboration"],
    }


def ratio_interval(numerator: list[float], denominator: list[float], resamples: int = 2000) -> dict:
    """Ratio of mean step times and its 95% bootstrap interval (each list resampled on its own: different runs)."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.fmean(rng.choices(numerator, k=len(numerator)))
        / statistics.fmean(rng.choices(denominator, k=len(denominator)))
        for _ in range(resamples)
    )
    return {
        "ratio": statistics.fmean(numerator) / statistics.fmean(denominator),
        "low": ratios[int(0.025 * resamples)],
        "high": ratios[int(0.975 * resamples) - 1],
    }


def shares(record: dict) -> tuple[float, float]:
    """f and r over the steps after the first."""
    step = sum(record["step_seconds"][1:])
    return sum(record["generation_seconds"][1:]) / step, sum(record["exchange_seconds"][1:]) / step


def steps_ratio(phi: float, beta: float, own_share: float) -> float:
    """Steps to a target of a swarm peer against an alone arm, when steps scale as rows^-log2(beta) and a peer row
    counts phi of an own row: the swarm trains on own_share x (1 + phi) of the alone arm's rows (own_share 1/2 against
    A_N, 1 against A_N/2). The formula is `trl_ftis.pays.steps_ratio`'s (against A_N; divided by beta against
    A_N/2)."""
    from trl_ftis.pays import steps_ratio as against_full

    if own_share not in (0.5, 1.0):
        raise ValueError(f"own_share is 0.5 (against A_N) or 1 (against A_N/2), not {own_share}")
    ratio = against_full(phi, beta, 2)
    return ratio if own_share == 0.5 else ratio / beta


def predicted_wall_ratios(ratios: dict, phi: tuple[float, float, float], beta: float):
    """(baseline, (point, low), high) of the predicted wall ratio: the measured step-time ratio (with its bootstrap
    interval) times [`steps_ratio`] (at phi's point and interval ends); the interval spans the corners."""
    out = []
    for baseline, own_share in (("alone-rows", 0.5), ("alone", 1.0)):
        step = ratios[baseline]
        corners = [s * steps_ratio(p, beta, own_share) for s in (step["low"], step["high"]) for p in phi[1:]]
        point = step["ratio"] * steps_ratio(phi[0], beta, own_share)
        out.append((baseline, (point, min(corners)), max(corners)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "smollm_split.jsonl")
    options = parser.parse_args()
    print("$ " + " ".join(["OMP_NUM_THREADS=1", "python", *sys.argv]), flush=True)
    from trl_ftis.demo.smollm import prepare_smollm2
    from trl_ftis.tasks.word_problems import train_test_split_problems

    model = prepare_smollm2()
    work = Path(tempfile.mkdtemp(prefix="ftis-smollm-split-"))
    data = work / "data"
    data.mkdir()
    train, test = train_test_split_problems(300, 10, seed=0)
    for name, problems in (("train", train), ("test", test)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    records = []
    for name in options.configs:
        config = CONFIGS[name]
        batch = config["prompts"] * config["num_generations"]
        lora_alone = config["lora_alone"]
        alone_out, swarm_out = work / name / "alone", work / name / "swarm"
        alone_out.mkdir(parents=True), swarm_out.mkdir(parents=True)
        common = {"config": config, "steps": options.steps, "seed": 0}
        run_slot(
            {
                "alone": peer_command(model, data, alone_out, "alone", lora=lora_alone, rows=batch, exchange=None,
                                      expected=(), **common),
                "alone-rows": peer_command(model, data, alone_out, "alone-rows", lora=lora_alone, rows=2 * batch,
                                           exchange=None, expected=(), **common),
            },
            alone_out,
        )  # fmt: skip
        exchange = f"dir://{swarm_out / 'exchange'}"
        swarm = config["swarm"]
        run_slot(
            {
                peer_id: peer_command(model, data, swarm_out, peer_id, lora=peer_id != "full", rows=batch,
                                      exchange=exchange, expected=swarm, **{**common, "seed": index})
                for index, peer_id in enumerate(swarm)
            },
            swarm_out,
        )  # fmt: skip
        arms = {"alone": read_process(alone_out, "alone"), "alone-rows": read_process(alone_out, "alone-rows")}
        arms.update({peer_id: read_process(swarm_out, peer_id) for peer_id in swarm})
        for arm, record in arms.items():
            record.update(experiment="smollm_split", configuration=name, arm=arm)
            records.append(record)
        print(f"\n== {name}: {config['prompts']} prompts x {config['num_generations']} completions of <= "
              f"{config['max_completion_length']} tokens; {options.steps} steps (the first left out)")  # fmt: skip
        for arm, record in arms.items():
            f, r = shares(record)
            mean = statistics.fmean(record["step_seconds"][1:])
            print(f"  {arm:10s} f = {f:.3f}  r = {r:.3f}  {mean:6.1f} s/step (context only)  "
                  f"{record['own_generation']['tokens']} own tokens")  # fmt: skip
        learner = arms[swarm[0]]
        f_rows, _ = shares(arms["alone-rows"])
        _, r_swarm = shares(learner)
        predicted = 1 - f_rows * (1 - 1 / 2) + r_swarm
        for baseline in ("alone-rows", "alone"):
            result = ratio_interval(learner["step_seconds"][1:], arms[baseline]["step_seconds"][1:])
            print(f"  step time {swarm[0]} / {baseline}: {result['ratio']:.3f} [95% bootstrap {result['low']:.3f}, "
                  f"{result['high']:.3f}]")  # fmt: skip
        print(f"  predicted {swarm[0]} / alone-rows: 1 - f(1 - 1/2) + r = 1 - {f_rows:.3f}/2 + {r_swarm:.3f} = "
              f"{predicted:.3f}")  # fmt: skip
        print(f"  {swarm[0]}: {learner['collaboration']}")
        ratios = {
            b: ratio_interval(learner["step_seconds"][1:], arms[b]["step_seconds"][1:])
            for b in ("alone-rows", "alone")
        }
        for baseline, low, high in predicted_wall_ratios(ratios, PHI[name], BETA):
            print(f"  predicted wall ratio to a target, {swarm[0]} / {baseline}: {low[0]:.2f} (interval {low[1]:.2f}-"
                  f"{high:.2f}; step-time ratio x steps ratio ((1 + phi) / P')^-log2(beta), phi {PHI[name][0]} "
                  f"[{PHI[name][1]}, {PHI[name][2]}] and beta {BETA} from the tiny models)")  # fmt: skip
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text("".join(json.dumps(record) + "\n" for record in records))


if __name__ == "__main__":
    main()
