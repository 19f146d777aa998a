"""The regime frontier: how a training step's time splits, and how generation grows with the rows generated, for a
few model widths, depths and completion lengths on this machine.

    OMP_NUM_THREADS=1 python benchmarks/frontier.py | tee benchmarks/results/frontier.txt
    OMP_NUM_THREADS=1 python benchmarks/frontier.py --quick          # two small configurations, 3 steps: a smoke test
    OMP_NUM_THREADS=1 python benchmarks/frontier.py --tag amended | tee benchmarks/results/frontier-amended.txt

Why. Wall time to a target is steps x seconds per step. A swarm peer generates B own rows a step and trains on P x B;
A_N generates and trains on P x B. Their step times differ by what generating B instead of P x B rows saves, so the
step ratio swarm / A_N is `1 - f + f / s` (before the exchange's share r), with f the generation share of an A_N step
and s = gen(P x B) / gen(B) the generation scaling (s = P when generation grows in proportion to the rows, s = 1 when
it is latency-bound). This script measures f and s (P = 2) for each configuration; `trl_ftis.pays` turns them, with
the learning factors phi and beta, into a predicted wall-time ratio.

How. One process per configuration, pinned to one core (`taskset`, OMP_NUM_THREADS=1), two configurations at a time.
Each builds a randomly initialised tiny Llama (character tokenizer), then trains it alone with `FTISTrainer` on
carry-chain addition of `digits`-digit numbers (so that the answers really need the completion length), first at
2B rows a step (A_N) then at B rows (A_N/2), each for `steps` + 1 steps; the first step of each is not counted.
Completions are forced to the full length (`min_new_tokens` = `max_completion_length`), so that the measurement does
not depend on when an untrained model happens to stop. Per step, the trainer's own split (`ftis/time/step` and
`ftis/time/generation` in the log history) gives the seconds; the medians over the counted steps are reported.

Reported per configuration: gen(B) and gen(2B) (seconds, for context only: no absolute time is a result on this
shared machine), s = gen(2B) / gen(B), f of A_N, the step ratio A_N/2 / A_N, and the predicted step ratio swarm /
A_N `1 - f + f / s` (r = 0). Raw records: one JSON line per configuration in `benchmarks/results/frontier.jsonl`.

Choice rule for the wall-time measurement (written before this ran): among the configurations whose A_N step takes
at most `MAX_STEP_SECONDS` here (so that >= 6 paired seeds to a target fit in the machine's hours), the one with the
lowest predicted step ratio swarm / A_N; a tie (within 0.02) goes to the cheaper A_N step.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

OWN_ROWS = 32  # B: 4 prompts x 8 completions
NUM_GENERATIONS = 8
#: (hidden size, layers, digits, measured steps). Completion length = `max_chain_tokens(digits)` (20 / 40 / 70 / 140).
CONFIGS = [
    (64, 2, 2, 12),  # the phi / beta experiment's model and task
    (64, 2, 7, 8),
    (128, 2, 7, 8),
    (256, 2, 7, 6),
    (256, 4, 7, 5),
    (128, 4, 14, 5),
    (256, 4, 14, 4),
    (512, 4, 7, 4),
    # Amendment 1 of benchmarks/peer_gain.md: 4-digit chains (40 tokens), which a 128-wide model learns.
    (64, 2, 4, 10),
    (128, 2, 4, 8),
    (256, 2, 4, 6),
]
QUICK_CONFIGS = [(64, 2, 2, 3), (64, 2, 7, 3)]
MAX_STEP_SECONDS = 6.0


def predicted_step_ratio(f: float, s: float) -> float:
    """Step time of a swarm peer (generating B rows, training on 2B) over A_N's (2B and 2B), exchange left out."""
    return 1.0 - f + f / s


def measure(spec: dict) -> dict:
    """Train one configuration alone at 2B then B rows a step; per-step seconds from the trainer's own split."""
    import torch

    from trl_ftis import FTISTrainer
    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_causal_lm, tiny_grpo_config
    from trl_ftis.tasks.carry_chain import (
        CARRY_CHAIN_ALPHABET,
        carry_chain_dataset,
        carry_chain_reward,
        max_chain_tokens,
    )

    torch.set_num_threads(1)
    hidden, layers, digits, steps = spec["hidden"], spec["layers"], spec["digits"], spec["steps"]
    length = max_chain_tokens(digits)
    tok = build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)
    model = build_tiny_causal_lm(
        tok, hidden_size=hidden, num_layers=layers, seed=0, max_position_embeddings=length + 4 * digits + 16
    )
    dataset = carry_chain_dataset(2000, seed=1, split="train", digits=digits)
    out = {"parameters": sum(p.numel() for p in model.parameters()), "completion_tokens": length}
    for arm, rows in (("A_N", 2 * OWN_ROWS), ("A_N/2", OWN_ROWS)):
        args = tiny_grpo_config(
            tempfile.mkdtemp(prefix="ftis-frontier-"),
            max_steps=steps + 1,
            per_device_train_batch_size=rows,
            num_generations=NUM_GENERATIONS,
            max_completion_length=length,
            generation_kwargs={"min_new_tokens": length},
            beta=0.0,
        )
        trainer = FTISTrainer(model, carry_chain_reward, args=args, train_dataset=dataset, processing_class=tok)
        trainer.train()
        log = [e for e in trainer.state.log_history if "ftis/time/step" in e][1:]  # the first step warms up
        out[arm] = {
            "rows": rows,
            "step_seconds": [e["ftis/time/step"] for e in log],
            "generation_seconds": [e["ftis/time/generation"] for e in log],
            "completion_length": [e.get("completions/mean_length") for e in log],
        }
    return out


def summarise_config(record: dict) -> dict:
    """The medians and ratios of one configuration's record."""
    full, half = record["A_N"], record["A_N/2"]
    gen_full = statistics.median(full["generation_seconds"])
    gen_half = statistics.median(half["generation_seconds"])
    step_full = statistics.median(full["step_seconds"])
    step_half = statistics.median(half["step_seconds"])
    f = statistics.median(g / s for g, s in zip(full["generation_seconds"], full["step_seconds"], strict=True))
    s = gen_full / gen_half
    return {
        "gen_B": gen_half,
        "gen_2B": gen_full,
        "s": s,
        "f": f,
        "step_A_N": step_full,
        "half_over_full": step_half / step_full,
        "predicted": predicted_step_ratio(f, s),
    }


def choose(summaries: list[tuple[dict, dict]]) -> dict | None:
    """The choice rule of the module docstring: the lowest predicted step ratio among configurations with an A_N
    step of at most `MAX_STEP_SECONDS`; within 0.02 of the lowest, the cheaper step."""
    eligible = [(spec, s) for spec, s in summaries if s["step_A_N"] <= MAX_STEP_SECONDS]
    if not eligible:
        return None
    best = min(s["predicted"] for _, s in eligible)
    near = [(spec, s) for spec, s in eligible if s["predicted"] <= best + 0.02]
    return min(near, key=lambda item: item[1]["step_A_N"])[0]


def rule_order(summaries: list[tuple[dict, dict]]) -> list[dict]:
    """The eligible configurations in the order the choice rule takes them: `choose`, then `choose` among the rest
    (the fallback order of benchmarks/peer_gain.md, part B)."""
    order, rest = [], list(summaries)
    while (chosen := choose(rest)) is not None:
        order.append(chosen)
        rest = [(spec, s) for spec, s in rest if spec is not chosen]
    return order


def print_table(records: list[dict]) -> None:
    print(f"B = {OWN_ROWS} rows; medians over counted steps; seconds are context only, ratios are the result")
    print("| hidden | layers | digits | tokens | params | gen(B) s | gen(2B) s | s = gen(2B)/gen(B) | f (A_N) | "
          "step A_N s | step A_N/2 / A_N | predicted swarm / A_N |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    summaries = []
    for record in records:
        s = summarise_config(record)
        summaries.append((record["spec"], s))
        spec = record["spec"]
        print(
            f"| {spec['hidden']} | {spec['layers']} | {spec['digits']} | {record['completion_tokens']} | "
            f"{record['parameters'] / 1e6:.2f}M | {s['gen_B']:.3f} | {s['gen_2B']:.3f} | {s['s']:.2f} | {s['f']:.2f} "
            f"| {s['step_A_N']:.2f} | {s['half_over_full']:.2f} | {s['predicted']:.2f} |"
        )
    chosen = choose(summaries)
    if chosen is None:
        print(f"no configuration has an A_N step of at most {MAX_STEP_SECONDS} s")
    else:
        print(
            f"chosen by the rule (A_N step <= {MAX_STEP_SECONDS} s, lowest predicted ratio, ties to the cheaper "
            f"step): hidden {chosen['hidden']}, {chosen['layers']} layers, {chosen['digits']} digits"
        )
        order = ", ".join(f"{c['hidden']}/{c['layers']}/{c['digits']}" for c in rule_order(summaries))
        print(f"the rule's order (hidden/layers/digits): {order}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small configurations, 3 steps each")
    parser.add_argument("--summary-only", action="store_true", help="print the table from the raw records")
    parser.add_argument("--tag", default="", help="results file suffix: frontier-TAG.jsonl (a rerun keeps the first)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.measure:
        spec = json.loads(Path(options.measure).read_text())
        result = measure(spec)
        Path(spec["out"]).write_text(json.dumps({"spec": spec, **result}))
        return
    tag = "-quick" if options.quick else f"-{options.tag}" if options.tag else ""
    raw = RESULTS / f"frontier{tag}.jsonl"
    if not options.summary_only:
        git = ["git", "rev-parse", "--short", "HEAD"]
        rev = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
        print(f"# {' '.join(sys.argv)} at {rev} ({time.strftime('%Y-%m-%d %H:%M')})", flush=True)
        configs = QUICK_CONFIGS if options.quick else CONFIGS
        work = Path(tempfile.mkdtemp(prefix="ftis-frontier-"))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "FTIS_CONSOLE": "quiet"}
        pending = list(enumerate(configs))
        running: dict[int, tuple[subprocess.Popen, Path]] = {}
        records = []
        while pending or running:
            for core in (0, 1):
                if core not in running and pending:
                    index, (hidden, layers, digits, steps) = pending.pop(0)
                    spec = {"hidden": hidden, "layers": layers, "digits": digits, "steps": steps,
                            "out": str(work / f"config{index}.json")}  # fmt: skip
                    (work / f"spec{index}.json").write_text(json.dumps(spec))
                    argv = [
                        "taskset",
                        "-c",
                        str(core),
                        sys.executable,
                        __file__,
                        "--measure",
                        str(work / f"spec{index}.json"),
                    ]
                    log = open(work / f"log{index}.txt", "w")  # noqa: SIM115 - closed with the process
                    running[core] = (
                        subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                        Path(spec["out"]),
                    )
            time.sleep(0.5)
            for core, (process, out) in list(running.items()):
                if process.poll() is not None:
                    del running[core]
                    if process.returncode != 0:
                        raise SystemExit(f"a configuration failed: see {work}")
                    records.append(json.loads(out.read_text()))
                    print(f"measured {records[-1]['spec']}", flush=True)
        RESULTS.mkdir(exist_ok=True)
        with open(raw, "w") as sink:
            sink.writelines(
                json.dumps(record) + "\n"
                for record in sorted(
                    records,
                    key=lambda r: configs.index(tuple(r["spec"][k] for k in ("hidden", "layers", "digits", "steps"))),
                )
            )
    records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    print_table(records)


if __name__ == "__main__":
    main()
