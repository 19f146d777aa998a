"""Time to target (issue 21, part 2): does joining a two-peer swarm reach a held-out accuracy target sooner in wall
time than training alone, in a generation-bound regime? A pre-registered experiment (`benchmarks/time_to_target.md`).

    OMP_NUM_THREADS=1 python benchmarks/time_to_target.py --quick            # 1 seed, short runs: a smoke test
    OMP_NUM_THREADS=1 python benchmarks/time_to_target.py --pilot            # seeds 100, 101: fixes TARGET
    OMP_NUM_THREADS=1 python benchmarks/time_to_target.py | tee benchmarks/results/time_to_target.txt   # the grid
    OMP_NUM_THREADS=1 python benchmarks/time_to_target.py --seeds 0-3 --slots alone homog-sync   # a piece
    python benchmarks/time_to_target.py --summary-only | tee benchmarks/results/time_to_target.txt
    OMP_NUM_THREADS=1 python benchmarks/time_to_target.py --part3 \
        | tee benchmarks/results/time_to_target-part3.txt  # part 3

Task and model. Carry-chain addition of two 2-digit numbers ([`trl_ftis.tasks.carry_chain`]): the prompt
`"37+86="` (6 characters) is answered by the chain `"7+6=13,3+8+1=12;123"` (up to 20 tokens with EOS), so a step is
generation-bound. The learner is a tiny Llama (hidden 64, 2 layers, character tokenizer), warmed up per seed by
supervised steps to a 25% accuracy on 200 dev problems (checked every 10 steps; the dev split `in_dev_split`, disjoint
from the held-out split and left out of the warm-up's training problems; cached under /tmp, built once per seed);
GRPO with the carry-chain reward
(1.0 for the exact answer + 0.5 x the fraction of right steps), 8 completions a prompt, up to 20 completion tokens,
beta 0, constant learning rate `LR`. Own rows a step: `OWN_ROWS` = 32 (4 prompts x 8). Measured generation share f
(TRL's `_generate` seconds / step seconds, one pinned process): 0.52 at 64 rows, 0.60 at 32 rows (random weights,
20 tokens, measured when these settings were chosen; that profile was not kept. The runs' own split by the
ledger: `benchmarks/step_split.py`, results `time_to_target-part3-split.txt`).

Pre-registration (verbatim in `benchmarks/time_to_target.md`, written before the grid was run).

Hypotheses. H1: a homogeneous two-peer swarm reaches the target sooner in wall time than the same model alone with
as many rows a step (A_N). H2: ... sooner than alone with the same own generation (A_N/2). H3, H4: the same for the
heterogeneous co-training swarm (the big learner next to a hidden-32 model, both training), judged on the big peer.
Each for exchange_mode "sync" and "free".

Equal hardware. One pinned core per process (`taskset -c 0` / `-c 1`, OMP_NUM_THREADS=1); always exactly two
training processes on the machine at once: the swarm's two peers together, or the two alone arms together. Slots
per seed: [A_N + A_N/2 together], [homog sync], [homog free], [hetero free], [hetero sync]; their order is ABBA
across seeds (even seeds in that order, odd seeds reversed), and the cores of the two processes swap between even
and odd seeds. Each process logs its wall and CPU time (`time.process_time`, `resource.getrusage`). Start-up is
not timed: the processes of a slot start training together (each waits, once built, for the other).

Arms (per paired seed: the same warm model per seed in every arm; distinct prompt streams per peer, per seed):
    A_N       alone, 2 x OWN_ROWS = 64 rows a step (as many rows as a swarm peer trains on)
    A_N/2     alone, OWN_ROWS = 32 rows a step (the same own generation as a swarm peer)
    homog     two peers `a`, `b`, the same warm model, own prompt streams and sampling seeds, each generating
              OWN_ROWS and training on its own rows + the partner's (sent rows count); sync and free
    hetero    the big learner (`big`) next to a hidden-32 warm model (`small`), both training; judged on `big`;
              free, and one lock-step (sync) run
Each run trains for the budget: `BUDGET_SECONDS` of training clock; every process stops on its own clock a second
after it (a lock-step peer whose partner has stopped waits `PEER_TIMEOUT` s at its last step, outside the budget).

End point. Model weights are snapshot (in memory, written after training) every `CHECKPOINT_SECONDS` of training
clock (the snapshot time is excluded from the clock) and evaluated OFFLINE after all training (a separate phase: no
clock contains evaluation) by greedy exact-final-answer accuracy on the whole held-out split of 2-digit problems
(`carry_chain.in_test_split`, 822 problems). Time to target = the training-clock seconds at the first of two
consecutive checkpoint evaluations at or above `TARGET`, the same rule for every arm. `TARGET` was fixed beforehand
from pilot seeds 100, 101 (never reused): the highest accuracy on a 0.01 grid at which A_N/2's median pilot time
to target (the same rule) is at most half the budget: 0.39 (from the pilot rerun with the disjoint dev split).
Runs that never reach it are censored at the budget (time = `BUDGET_SECONDS`, a lower bound) and counted.
Secondary: accuracy at the budget (the last checkpoint at or before it), own generated tokens to target.

Analysis. >= 12 paired seeds (0-11). Per seed and swarm arm, the log ratio of times to target (homog: the mean of
the two peers' log times, which are not independent), against A_N and against A_N/2: geometric-mean ratios with 95%
t-intervals on the log ratios, sign counts, and Holm-adjusted p-values (two-sided one-sample t-tests on the log
ratios) over the 8 comparisons (4 swarm arms x 2 alone arms). Censored runs: time = budget (a lower bound on the
true time), counted per arm; a pair with both runs censored has ratio 1 and is counted as such. Decomposition of
each ratio: wall ratio = step-time ratio (seconds per step over the steps that ended within the budget, swarm /
alone) x steps ratio (steps to target, swarm / alone). Against A_N the step-time ratio is compared with the prediction
1 - f(1 - 1/P) + r (P = 2, f the measured generation share of A_N, r = exchange seconds / step seconds of the swarm
peer, both within the budget, from the per-step logs `step_log` and `time_log`); against A_N/2 it is
reported as measured. Batch scaling beta = steps_to_target(A_N/2) / steps_to_target(A_N). Partner value phi = the
value of a peer row relative to an own row, from the accuracy gains over the warm model at equal steps (the last
step all three arms reached, accuracy interpolated by step): phi = (gain_swarm - gain_A_N/2) / (gain_A_N -
gain_A_N/2), the ratio of mean gains over seeds, with a bootstrap interval over seeds (2000 resamples).

Success / refutation (pre-registered): "the value claim is supported where both wall-time ratios have upper bounds
below 1 with point estimates <= 0.9; refuted at this scale where the ratio against A_N/2 has a lower bound above
0.9; otherwise inconclusive, with the decomposition showing which factor fell short."

Outputs. Raw records, one JSON line per run (kind "run") and per evaluated checkpoint (kind "checkpoint"), plus one
per warm model (kind "warm", its accuracy at step 0), to `benchmarks/results/time_to_target.jsonl` (`-pilot`,
`-quick`); the printed summary is saved with `tee` into `benchmarks/results/time_to_target.txt`. Resumable: a slot
whose run records are in the file is skipped, and so is a checkpoint already evaluated; the snapshots wait under
`--work` (default /tmp/ftis-ttt-work) until evaluated.

Part 3 (`--part3`, pre-registered in `time_to_target.md`, "Part 3"): the same protocol for the slots `PART3_SLOTS`,
into `time_to_target-part3.jsonl`: the alone and homog-sync baselines rerun, co-trainers of other kinds (a LoRA copy,
a Qwen2, a Llama with a BPE tokenizer and `cross_tokenizer`), and two options (shared prompts with and without
`collaboration_mode="horizontal"`; `peer_weighting="ess"` next to the BPE partner); summarised by `summarise_part3`
(phi per partner kind, the options' gain differences at equal steps with Holm over `PART3_COMPARISONS`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bound_run import bind_peers_to_this_run  # noqa: E402  # benchmarks/, the script's folder

bind_peers_to_this_run()

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

# ---- the pre-registered settings -------------------------------------------------------------------------------
DIGITS = 2
MAX_COMPLETION = 20  # carry_chain.max_chain_tokens(2): the longest 2-digit chain and EOS
BIG_HIDDEN, SMALL_HIDDEN, LAYERS = 64, 32, 2
NUM_GENERATIONS = 8
OWN_ROWS = 32  # own rows a step of a swarm peer and of A_N/2 (4 prompts x 8); A_N has 2 x OWN_ROWS
LR = 2e-4  # the tiny models' GRPO default; 1e-3 collapsed to 0 accuracy and 3e-4 fell in a one-seed check
BUDGET_SECONDS = 30.0  # training clock of every run; censoring point
CHECKPOINT_SECONDS = 2.0  # a weight snapshot every this many seconds of training clock
MAX_STEPS = 2000  # cap on any run's steps (every run stops on its clock; `--steps` lowers the cap)
#: A lock-step round waits at most this long for the partner: far above a step (0.2-0.7 s), so it only matters after
#: the partner has stopped at the end of the budget (the last step of the later peer then waits this long, outside
#: the budget).
PEER_TIMEOUT = 10
#: Warm models: name -> (hidden size, warm-up dev accuracy target, architecture, tokenizer).
WARM = {
    "big": (BIG_HIDDEN, 0.25, "llama", "char"),
    "small": (SMALL_HIDDEN, 0.15, "llama", "char"),
    # Part 3's partners: another architecture and another tokenizer, of the big model's size and warm-up target.
    "qwen2": (BIG_HIDDEN, 0.25, "qwen2", "char"),
    "bpe": (BIG_HIDDEN, 0.25, "llama", "bpe"),
    # partner_and_regime.md, part A: a partner 6x the small learner's parameters, warmed further than `big`.
    "wide": (80, 0.35, "llama", "char"),
}
#: Part 3: the LoRA co-trainer's adapter and learning rate (5x the full model's; chosen before running, not tuned).
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
LORA_LR = 1e-3
PILOT_SEEDS = (100, 101)
GRID_SEEDS = tuple(range(12))
QUICK_SEEDS = (900,)
#: Fixed from the pilot (seeds 100, 101; benchmarks/results/time_to_target-pilot.jsonl, rerun with the disjoint dev
#: split): the highest accuracy, on a 0.01 grid, at which A_N/2's median pilot time to target (the same
#: two-consecutive rule) is at most half the budget (0.39: 16 s and 12 s). Warm held-out accuracy 0.339 (mean).
TARGET = 0.39
SLOTS = ("alone", "homog-sync", "homog-free", "hetero-free", "hetero-sync")
#: The judged runs: arm -> (slot, peers judged).
ARMS = {
    "A_N": ("alone", ("A_N",)),
    "A_N/2": ("alone", ("A_N/2",)),
    "homog-sync": ("homog-sync", ("a", "b")),
    "homog-free": ("homog-free", ("a", "b")),
    "hetero-free": ("hetero-free", ("big",)),
    "hetero-sync": ("hetero-sync", ("big",)),
}
SWARM_ARMS = ("homog-sync", "homog-free", "hetero-free", "hetero-sync")
ALONE_ARMS = ("A_N", "A_N/2")
#: Part 3 (pre-registered in time_to_target.md, "Part 3"): the alone and homog-sync baselines rerun, co-trainers
#: of other kinds, and two options.
PART3_SLOTS = (
    "alone",
    "homog-sync",
    "shared-sync",
    "horiz-sync",
    "lora-free",
    "arch-free",
    "tok-free",
    "tok-ess-free",
)
PART3_ARMS = {
    "A_N": ("alone", ("A_N",)),
    "A_N/2": ("alone", ("A_N/2",)),
    "homog-sync": ("homog-sync", ("a", "b")),
    "shared-sync": ("shared-sync", ("a", "b")),
    "horiz-sync": ("horiz-sync", ("a", "b")),
    "lora-free": ("lora-free", ("big",)),
    "arch-free": ("arch-free", ("big",)),
    "tok-free": ("tok-free", ("big",)),
    "tok-ess-free": ("tok-ess-free", ("big",)),
}
PART3_SWARM_ARMS = ("homog-sync", "shared-sync", "horiz-sync", "lora-free", "arch-free", "tok-free", "tok-ess-free")
#: The option comparisons (option arm, baseline arm), Holm-adjusted together: H5, H5a, sharing prompts alone, H6.
PART3_COMPARISONS = (
    ("horiz-sync", "homog-sync"),
    ("horiz-sync", "shared-sync"),
    ("shared-sync", "homog-sync"),
    ("tok-ess-free", "tok-free"),
)
JUDGED = {**ARMS, **PART3_ARMS}
LR_OVERRIDE = None


# ---- warm models ------------------------------------------------------------------------------------------------
def tokenizer(kind: str = "char"):
    """The character tokenizer of the task; `kind="bpe"`: a BPE tokenizer trained on the train split's texts."""
    from trl_ftis.demo.tiny import build_bpe_tokenizer, build_char_tokenizer
    from trl_ftis.tasks.carry_chain import CARRY_CHAIN_ALPHABET, carry_chain_problems

    if kind == "char":
        return build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)
    corpus = [p["prompt"] + p["chain"] for p in carry_chain_problems(4000, seed=0, split="train", digits=DIGITS)]
    return build_bpe_tokenizer(corpus, alphabet=CARRY_CHAIN_ALPHABET)


def checkpoint_tokenizer(checkpoint: str):
    """The tokenizer saved with a warm checkpoint (the BPE partner's), else the character tokenizer."""
    if (Path(checkpoint) / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(checkpoint)
    return tokenizer()


def warm_checkpoint(cache: Path, name: str, seed: int) -> Path:
    """Model `name` ("big" or "small") of `seed`, warmed up by supervised carry-chain steps to its dev target (up to
    1200 steps, checked every 10), built on first use under a temporary name and renamed."""
    path = Path(cache) / f"carry-{name}-seed{seed}"
    if (path / "config.json").exists():
        return path
    import torch

    from trl_ftis.demo.tiny import build_tiny_causal_lm
    from trl_ftis.tasks.carry_chain import carry_chain_problems, carry_chain_warmup

    torch.set_num_threads(1)
    hidden, target, architecture, kind = WARM[name]
    tok = tokenizer(kind)
    # Early stopping on the dev split, disjoint from the held-out evaluation split, and never trained on.
    dev = carry_chain_problems(200, seed=2000 + seed, split="dev", digits=DIGITS)
    problems = carry_chain_problems(
        4000, seed=1000 + seed, split="train", digits=DIGITS, exclude={p["prompt"] for p in dev}
    )
    model = build_tiny_causal_lm(tok, architecture, hidden_size=hidden, num_layers=LAYERS, seed=seed)
    start = time.time()
    steps, accuracy = carry_chain_warmup(
        model, tok, problems, steps=1200, batch_size=64, lr=3e-3, seed=seed, target_accuracy=target,
        dev_problems=dev, eval_every=10,
    )  # fmt: skip
    print(f"warm {name} seed {seed}: {steps} steps, dev {accuracy}, {time.time() - start:.0f} s", flush=True)
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    model.save_pretrained(temporary)
    if kind != "char":  # the partner's peer process loads its tokenizer from here
        tok.save_pretrained(temporary)
    (temporary / "warmup.json").write_text(json.dumps({"steps": steps, "dev_accuracy": accuracy}))
    if path.exists():
        shutil.rmtree(temporary)
    else:
        os.replace(temporary, path)
    return path


def held_out(size: int | None = None) -> list[dict]:
    """The whole held-out split of 2-digit problems (822), in a fixed order; the first `size` with `size`."""
    from trl_ftis.tasks.addition import in_test_split
    from trl_ftis.tasks.carry_chain import carry_chain

    problems = [
        {"prompt": f"{a}+{b}=", "answer": str(a + b), "chain": carry_chain(a, b)}
        for a in range(10, 100)
        for b in range(10, 100)
        if in_test_split(f"{a}+{b}=")
    ]
    random.Random(0).shuffle(problems)
    return problems[:size] if size else problems


# ---- one training process -----------------------------------------------------------------------------------------
def peer(spec_path: str) -> None:
    """One training process of a slot; `spec` (JSON) says what to train. Writes `run.json` and the snapshots."""
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trl_ftis import FTISTrainer
    from trl_ftis.demo.tiny import tiny_grpo_config
    from trl_ftis.tasks.carry_chain import carry_chain_dataset, carry_chain_reward

    torch.set_num_threads(1)
    tok = checkpoint_tokenizer(spec["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(spec["checkpoint"])
    settings = {
        "per_device_train_batch_size": spec["rows"],
        "num_generations": NUM_GENERATIONS,
        "max_completion_length": spec.get("max_completion", MAX_COMPLETION),
        "learning_rate": spec["lr"],
        "beta": 0.0,
        "seed": spec["sampling_seed"],
    }
    if spec.get("exchange_url"):
        settings.update(
            exchange_url=spec["exchange_url"],
            peer_id=spec["peer"],
            expected_peers=spec["expected_peers"],
            exchange_mode=spec["mode"],
            peer_timeout=spec.get("peer_timeout", PEER_TIMEOUT),
        )
    for option in ("cross_tokenizer", "collaboration_mode", "peer_weighting", "variant"):  # part 3's, bigger_partner
        if spec.get(option) is not None:
            settings[option] = spec[option]
    peft_config = None
    if spec.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(**LORA)
    exclude = None
    if spec.get("exclude_dev"):  # peer_gain.py selects learning rates on the dev split: no stream trains on it
        from trl_ftis.tasks.addition import in_dev_split

        low, high = 10 ** (spec.get("digits", DIGITS) - 1), 10 ** spec.get("digits", DIGITS)
        exclude = {f"{a}+{b}=" for a in range(low, high) for b in range(low, high) if in_dev_split(f"{a}+{b}=")}
    out = Path(spec["out"])
    args = tiny_grpo_config(str(out / "trainer"), max_steps=spec["max_steps"], **settings)
    trainer = FTISTrainer(
        model,
        carry_chain_reward,
        args=args,
        train_dataset=carry_chain_dataset(
            6000, seed=spec["stream_seed"], split="train", digits=spec.get("digits", DIGITS), exclude=exclude
        ),
        processing_class=tok,
        peft_config=peft_config,
    )
    state = {"own_tokens": 0, "generation": 0.0, "start": None, "paused": 0.0, "next": 0.0}
    snapshots, step_ends, first_prompts = [], [], []
    generate, generate_and_score = trainer._generate, trainer._generate_and_score_completions
    held_calls = None
    if spec.get("generation_cost"):  # generation_bound.py: an emulated engine holds each call (generation_cost.py)
        from generation_cost import GenerationCost, HeldCalls, held_generate

        held_calls = HeldCalls()
        generate = held_generate(generate, GenerationCost(**spec["generation_cost"]), held_calls)

    def timed_generate(prompts):
        started = time.perf_counter()
        try:
            return generate(prompts)
        finally:
            state["generation"] += time.perf_counter() - started

    def counting(inputs):
        if len(first_prompts) < 3:  # the shared-prompt slots check that both peers answer the same prompts
            first_prompts.append(sorted({str(x["prompt"]) for x in inputs}))
        output = generate_and_score(inputs)  # own rows first, then the merged peer rows
        state["own_tokens"] += int(output["completion_mask"][: len(inputs)].sum().item())
        return output

    trainer._generate, trainer._generate_and_score_completions = timed_generate, counting

    def clock() -> float:
        return time.perf_counter() - state["start"] - state["paused"]

    def snapshot(step: int) -> None:
        paused = time.perf_counter()
        snapshots.append(
            {
                "index": len(snapshots),
                "step": step,
                "clock": clock(),
                "own_tokens": state["own_tokens"],
                "generation_seconds": state["generation"],
                "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            }
        )
        state["paused"] += time.perf_counter() - paused

    class Budget(TrainerCallback):
        def on_train_begin(self, cb_args, cb_state, control, **kwargs):
            # Start together: each process marks itself ready (built), then waits for the slot's other process.
            barrier = Path(spec["barrier"])
            (barrier / f"{spec['peer'].replace('/', '_')}.ready").write_text("")
            deadline = time.time() + 300
            while len(list(barrier.glob("*.ready"))) < spec["processes"] and time.time() < deadline:
                time.sleep(0.01)
            if spec.get("reseed") is not None:
                # Shared-prompt slots: the same sampler seed (prompt order) for both peers, their own sampling seed.
                torch.manual_seed(spec["reseed"])
            state["start"] = time.perf_counter()
            state["cpu0"], state["usage0"] = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            state["next"] = CHECKPOINT_SECONDS * spec["checkpoint_scale"]

        def on_step_end(self, cb_args, cb_state, control, **kwargs):
            now = clock()
            step_ends.append([cb_state.global_step, round(now, 4), round(state["generation"], 4)])
            if spec.get("checkpoint_steps"):  # a snapshot every so many steps, whatever the clock (peer_gain.py)
                if cb_state.global_step % spec["checkpoint_steps"] == 0:
                    snapshot(cb_state.global_step)
            elif now >= state["next"]:
                snapshot(cb_state.global_step)
                while state["next"] <= now:
                    state["next"] += CHECKPOINT_SECONDS * spec["checkpoint_scale"]
            if spec["stop_seconds"] is not None and now >= spec["stop_seconds"]:
                control.should_training_stop = True

    trainer.add_callback(Budget())
    trainer.train()
    wall = clock()
    cpu = time.process_time() - state["cpu0"]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    if not snapshots or snapshots[-1]["step"] != trainer.state.global_step:
        snapshot(trainer.state.global_step)
    for item in snapshots:
        torch.save(item.pop("weights"), out / f"ckpt-{item['index']}.pt")
    summary_path = out / "trainer" / "ftis_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    steps = trainer.state.global_step
    run = {
        "steps": steps,
        "train_clock": wall,
        "cpu_seconds": cpu,
        "user_seconds": usage.ru_utime - state["usage0"].ru_utime,
        "system_seconds": usage.ru_stime - state["usage0"].ru_stime,
        "involuntary_switches": usage.ru_nivcsw - state["usage0"].ru_nivcsw,
        "generation_seconds": state["generation"],
        "own_tokens": state["own_tokens"],
        "seconds_per_step": wall / max(steps, 1),
        "generation_share": state["generation"] / wall if wall > 0 else None,
        "summary_time_seconds": summary.get("time_seconds"),
        "summary_generation_share": summary.get("generation_share"),
        "exchange_blocking_seconds": summary.get("exchange_blocking_seconds"),
        "rows_accepted": summary.get("rows_accepted"),
        "rows_received": summary.get("rows_received"),
        "dropped": summary.get("dropped"),
        "peer_row_ages": summary.get("peer_row_ages"),
        "peer_rows_in_loss": (summary.get("peer_value") or {}).get("rows_in_loss"),
        # Peer rows the F-TIS filter zeroed (after admission; `dropped` counts rows refused before the filter).
        "rows_filtered": summary.get("rows_filtered"),
        "snapshots": snapshots,
        "first_prompts": first_prompts,
        "held_generation": held_calls.summary() if held_calls is not None else None,
        # Means over logged steps of the objective's own- and peer-row statistics (filtered_frac, is_weight_mean, ...).
        "logged_means": {
            key: statistics.fmean(values)
            for key in sorted(
                {k for e in trainer.state.log_history for k in e if k.startswith(("ftis/peer/", "ftis/own/"))}
            )
            for values in [[e[key] for e in trainer.state.log_history if isinstance(e.get(key), (int, float))]]
            if values
        },
        # Mean over logged steps of the peer rows' ESS fraction and (peer_weighting="ess") of the scale it applied.
        **{
            name: statistics.fmean(values) if values else None
            for name, key in (("peer_ess_frac", "ftis/peer/ess_frac"), ("peer_ess_scale", "ftis/peer/ess_scale"))
            for values in [[e[key] for e in trainer.state.log_history if key in e]]
        },
        # Per step: [step, clock at its end, generation seconds so far]; and the trainer's own split of each step
        # [step, step seconds, exchange seconds] (`ftis/time/*` in the log history), so that the summary measures
        # step time, f and r within the budget (a lock-step peer's last step may wait for a stopped partner).
        "step_log": step_ends,
        "time_log": [
            [entry["step"], entry["ftis/time/step"], entry.get("ftis/time/exchange", 0.0)]
            for entry in trainer.state.log_history
            if "ftis/time/step" in entry
        ],
    }
    (out / "run.json").write_text(json.dumps(run))


# ---- the slots ------------------------------------------------------------------------------------------------------
def slot_specs(slot: str, seed: int, cache: Path, work: Path, quick: bool) -> dict[str, dict]:
    """The two processes of `slot` for `seed`: peer name -> spec (cores assigned by the caller)."""
    big = str(warm_checkpoint(cache, "big", seed))
    budget = BUDGET_SECONDS / (6 if quick else 1)
    exchange = f"dir://{work / 'exchange'}"
    base = {
        "seed": seed,
        "lr": LR_OVERRIDE or LR,
        "checkpoint_scale": 1 / (4 if quick else 1),
        "exchange_url": None,
        "mode": None,
    }

    def spec(peer_id, checkpoint, rows, stream, sampling, **extra):
        return {
            **base,
            "slot": slot,
            "peer": peer_id,
            "checkpoint": checkpoint,
            "rows": rows,
            "stream_seed": 10_000 * (seed + 1) + stream,
            "sampling_seed": 100 * seed + sampling,
            "out": str(work / peer_id.replace("/", "_")),
            **extra,
        }

    clocked = {"max_steps": MAX_STEPS, "stop_seconds": budget + 1.0}
    if slot == "alone":
        return {
            "A_N": spec("A_N", big, 2 * OWN_ROWS, 0, 0, **clocked),
            "A_N/2": spec("A_N/2", big, OWN_ROWS, 0, 0, **clocked),
        }
    family, mode = slot.rsplit("-", 1)
    swarm = {"exchange_url": exchange, "mode": mode, **clocked}
    if family in ("shared", "horiz"):
        # Both peers draw the same prompts (dataset and sampler seed); each samples with its own seed (`reseed`).
        ids = ["a", "b"]
        extra = {"collaboration_mode": "horizontal" if family == "horiz" else "vertical", **swarm}
        return {
            "a": spec("a", big, OWN_ROWS, 0, 0, expected_peers=ids, reseed=100 * seed + 50, **extra),
            "b": spec("b", big, OWN_ROWS, 0, 0, expected_peers=ids, reseed=100 * seed + 51, **extra),
        }
    if family in ("lora", "arch", "tok", "tok-ess"):
        partner = {"lora": "lora", "arch": "qwen2", "tok": "bpe", "tok-ess": "bpe"}[family]
        ids = ["big", partner]
        extra = dict(swarm)
        if family.startswith("tok"):
            extra["cross_tokenizer"] = True
        if family == "tok-ess":
            extra["peer_weighting"] = "ess"
        if family == "lora":
            partner_spec = spec(
                partner, big, OWN_ROWS, 1, 1, expected_peers=ids, lora=True, **{**extra, "lr": LORA_LR}
            )
        else:
            checkpoint = str(warm_checkpoint(cache, partner, seed))
            partner_spec = spec(partner, checkpoint, OWN_ROWS, 1, 1, expected_peers=ids, **extra)
        return {"big": spec("big", big, OWN_ROWS, 0, 0, expected_peers=ids, **extra), partner: partner_spec}
    if family == "homog":
        ids = ["a", "b"]
        return {
            "a": spec("a", big, OWN_ROWS, 0, 0, expected_peers=ids, **swarm),
            "b": spec("b", big, OWN_ROWS, 1, 1, expected_peers=ids, **swarm),
        }
    small = str(warm_checkpoint(cache, "small", seed))
    ids = ["big", "small"]
    return {
        "big": spec("big", big, OWN_ROWS, 0, 0, expected_peers=ids, **swarm),
        "small": spec("small", small, OWN_ROWS, 1, 1, expected_peers=ids, **swarm),
    }


def fresh_folder(work: Path) -> Path:
    """`work`, emptied: a slot run before and not recorded starts afresh (its exchange folder included)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


def launch_processes(specs: dict[str, dict], cores: dict[str, int], work: Path, label: str, timeout: float) -> float:
    """Train one `--peer` process per spec together, each pinned to its core, all behind one start barrier; wait for
    every one. A failure kills the rest and stops the benchmark with the failed process's log. The slot's seconds."""
    barrier = work / "barrier"
    barrier.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "FTIS_CONSOLE": "quiet"}  # fmt: skip
    env.pop("FTIS_SWARM_SECRET", None)
    processes, began = {}, time.time()
    for name, spec in specs.items():
        spec.update(barrier=str(barrier), processes=len(specs))
        out = Path(spec["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "spec.json").write_text(json.dumps(spec))
        log = open(out / "log.txt", "w")  # noqa: SIM115 - closed with the process
        argv = ["taskset", "-c", str(cores[name]), sys.executable, str(HERE / "time_to_target.py"), "--peer",
                str(out / "spec.json")]  # fmt: skip
        processes[name] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    for name, process in processes.items():
        if process.wait(timeout=timeout) != 0:
            for other in processes.values():
                other.kill()
            log = (Path(specs[name]["out"]) / "log.txt").read_text()[-3000:]
            raise SystemExit(f"{label} {name} failed:\n{log}")
    return time.time() - began


def run_slot(slot: str, seed: int, cache: Path, work: Path, quick: bool, seed_index: int) -> list[dict]:
    """Train the two processes of a slot together, pinned one a core; their run records."""
    specs = slot_specs(slot, seed, cache, fresh_folder(work), quick)
    names = list(specs)
    cores = {names[0]: seed_index % 2, names[1]: 1 - seed_index % 2}  # swap cores between even and odd seeds
    slot_seconds = launch_processes(specs, cores, work, f"{slot} seed {seed}", timeout=900)
    return slot_records(specs, cores, seed=seed, slot=slot, slot_wall_seconds=slot_seconds)


def slot_records(specs: dict[str, dict], cores: dict[str, int], **fields) -> list[dict]:
    """One run record per process of a finished slot: `fields`, what its spec says, and its own `run.json`."""
    records = []
    for name, spec in specs.items():
        run = json.loads((Path(spec["out"]) / "run.json").read_text())
        arm = {"arm": spec["arm"]} if "arm" in spec else {}
        records.append(
            {
                "kind": "run",
                **fields,
                **arm,
                "peer": name,
                "core": cores[name],
                "rows": spec["rows"],
                "lr": spec["lr"],
                "model": Path(spec["checkpoint"]).name,
                "out": spec["out"],
                **run,
            }
        )
    return records


# ---- offline evaluation ---------------------------------------------------------------------------------------------
def evaluate_worker(job_path: str) -> None:
    """Evaluate the checkpoints listed in `job` (JSON), one JSON line per checkpoint on stdout."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_ftis.tasks.carry_chain import carry_chain_accuracy

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    tok, problems = tokenizer(), held_out(job["eval_size"])
    models = {}
    for item in job["items"]:
        if item["model"] not in models:
            model = AutoModelForCausalLM.from_pretrained(item["model"])
            models[item["model"]] = (model, {k: v.clone() for k, v in model.state_dict().items()})
        model, warm = models[item["model"]]
        model.load_state_dict(torch.load(item["weights"]) if item.get("weights") else warm)
        accuracy = carry_chain_accuracy(model, tok, problems, max_new_tokens=MAX_COMPLETION)
        print(json.dumps({**item["record"], "accuracy": accuracy, "eval_size": len(problems)}), flush=True)


def run_header(extra: str = "") -> str:
    """The first line of a driver's output: `# <its command line> at <git revision> (<local time>)<extra>`."""
    git = ["git", "rev-parse", "--short", "HEAD"]
    rev = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    return f"# {' '.join(sys.argv)} at {rev} ({time.strftime('%Y-%m-%d %H:%M')}){extra}"


def keep_slot(sink, records: list[dict], got: list[dict], label: str, *, steps: bool, slot_seconds: bool) -> None:
    """Append one trained slot's records to the raw file (flushed: a stopped invocation loses no finished slot) and to
    `records`, and print its progress line: `label: peer [N steps] T s, ...[; slot S s]`."""
    sink.writelines(json.dumps(record) + "\n" for record in got)
    sink.flush()
    records += got
    peers = ", ".join(
        f"{r['peer']}" + (f" {r['steps']} steps" if steps else "") + f" {r['train_clock']:.0f} s" for r in got
    )
    tail = f"; slot {got[0]['slot_wall_seconds']:.0f} s" if slot_seconds else ""
    print(f"{label}: {peers}{tail}", flush=True)


def evaluate_pending(records: list[dict], sink, cache: Path, eval_size: int | None) -> list[dict]:
    """Evaluate every snapshot (and warm model) without an evaluation record, in two pinned worker processes."""
    done = {(r["seed"], r["slot"], r["peer"], r["index"]) for r in records if r["kind"] == "checkpoint"}
    warm_done = {(r["seed"], r["model"]) for r in records if r["kind"] == "warm"}
    items = []
    for run in [r for r in records if r["kind"] == "run"]:
        judged = any(run["slot"] == slot and run["peer"] in peers for slot, peers in JUDGED.values())
        if not judged:
            continue
        for snap in run["snapshots"]:
            if (run["seed"], run["slot"], run["peer"], snap["index"]) in done:
                continue
            weights = Path(run["out"]) / f"ckpt-{snap['index']}.pt"
            record = {"kind": "checkpoint", "seed": run["seed"], "slot": run["slot"], "peer": run["peer"], **snap}
            items.append({"model": str(cache / run["model"]), "weights": str(weights), "record": record})
        if (run["seed"], run["model"]) not in warm_done:
            warm_done.add((run["seed"], run["model"]))
            record = {"kind": "warm", "seed": run["seed"], "model": run["model"]}
            items.append({"model": str(cache / run["model"]), "weights": None, "record": record})
    return evaluate_items(items, __file__, sink, "ftis-ttt-eval-", eval_size=eval_size)


def evaluate_items(items: list[dict], script: str, sink, prefix: str, **job) -> list[dict]:
    """Run `script --evaluate JOB` in two worker processes pinned one a core, each on every other item of `items`
    (JOB: `{"items": [...], **job}`); write each JSON line they print to `sink` and return the records."""
    if not items:
        return []
    print(f"evaluating {len(items)} checkpoints offline", flush=True)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    processes = []
    for core in (0, 1):
        path = work / f"job{core}.json"
        path.write_text(json.dumps({**job, "items": items[core::2]}))
        argv = ["taskset", "-c", str(core), sys.executable, script, "--evaluate", str(path)]
        log = open(work / f"out{core}.jsonl", "w")  # noqa: SIM115 - a file, not a pipe: no worker blocks on output
        processes.append((subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log), log))
    for process, log in processes:
        code = process.wait()
        log.close()
        if code != 0:
            raise SystemExit(f"evaluation failed: {work}")
    new = []
    for core in (0, 1):
        for line in (work / f"out{core}.jsonl").read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                sink.write(json.dumps(record) + "\n")
                new.append(record)
    sink.flush()
    return new


# ---- the summary ----------------------------------------------------------------------------------------------------
def curves(records: list[dict]) -> dict:
    """(seed, slot, peer) -> checkpoints sorted by clock, each with its accuracy; plus the warm accuracy at 0."""
    warm = {(r["seed"], r["model"]): r["accuracy"] for r in records if r["kind"] == "warm"}
    runs = {(r["seed"], r["slot"], r["peer"]): r for r in records if r["kind"] == "run"}
    out = {}
    for r in records:
        if r["kind"] == "checkpoint":
            out.setdefault((r["seed"], r["slot"], r["peer"]), []).append(r)
    for key, points in out.items():
        points.sort(key=lambda p: p["clock"])
        run = runs.get(key)
        if run is not None and (key[0], run["model"]) in warm:
            points.insert(0, {"step": 0, "clock": 0.0, "own_tokens": 0, "accuracy": warm[(key[0], run["model"])]})
    return out


def time_to_target(points: list[dict], target: float, budget: float) -> dict:
    """The first of two consecutive checkpoints (step > 0) at or above `target`, within the budget; censored at
    the budget when none."""
    trained = [p for p in points if p["step"] > 0 and p["clock"] <= budget + 1e-9]
    for first, second in itertools.pairwise(trained):
        if first["accuracy"] >= target and second["accuracy"] >= target:
            return {
                "seconds": first["clock"],
                "steps": first["step"],
                "tokens": first["own_tokens"],
                "censored": False,
            }
    last = trained[-1] if trained else {"step": 0, "own_tokens": 0}
    return {"seconds": budget, "steps": last["step"], "tokens": last["own_tokens"], "censored": True}


def accuracy_at(points: list[dict], budget: float) -> float | None:
    before = [p for p in points if p["clock"] <= budget + 1e-9]
    return before[-1]["accuracy"] if before else None


def accuracy_at_step(points: list[dict], step: float) -> float | None:
    """Accuracy at `step`, linearly interpolated between checkpoints (by step)."""
    for left, right in itertools.pairwise(points):
        if left["step"] <= step <= right["step"]:
            if right["step"] == left["step"]:
                return right["accuracy"]
            w = (step - left["step"]) / (right["step"] - left["step"])
            return left["accuracy"] + w * (right["accuracy"] - left["accuracy"])
    return None


def summarise(records: list[dict], target: float | None, budget: float, pilot: bool) -> None:
    from free_running import holm, t_interval, t_pvalue

    curve = curves(records)
    runs = {(r["seed"], r["slot"], r["peer"]): r for r in records if r["kind"] == "run"}
    seeds = sorted({r["seed"] for r in records if r["kind"] == "run"})
    print(f"\n== time to target: {len(seeds)} seeds {seeds}, budget {budget:.0f} s of training clock ==")
    print(
        "\nslots (per process: training clock and steps of the whole run; ms/step, f = generation share and r ="
        " exchange share within the budget; CPU/wall of the run; slot wall incl. start-up):"
    )
    slot_table(runs, SLOTS, budget)
    print(
        "\naccuracy (held-out greedy, exact final answer) per arm: warm, at half budget, at budget (mean over seeds):"
    )
    for arm, (slot, peers) in ARMS.items():
        warm, half, end = [], [], []
        for seed in seeds:
            for name in peers:
                points = curve.get((seed, slot, name))
                if not points:
                    continue
                warm.append(points[0]["accuracy"])
                half.append(accuracy_at(points, budget / 2))
                end.append(accuracy_at(points, budget))
        if warm:
            print(
                f"  {arm:11s} warm {statistics.fmean(warm):.3f}  half "
                f"{statistics.fmean(x for x in half if x is not None):.3f}"
                f"  budget {statistics.fmean(x for x in end if x is not None):.3f}  (n={len(warm)})"
            )
    if pilot or target is None:
        propose_target(curve, seeds, budget)
        if target is None:
            return
    print(f"\n== end point: time to target {target:.3f} (first of two consecutive checkpoints >= target) ==")
    per_arm = {}
    for arm, (slot, peers) in ARMS.items():
        for seed in seeds:
            hits = [time_to_target(curve[(seed, slot, p)], target, budget) for p in peers if (seed, slot, p) in curve]
            if len(hits) != len(peers):
                continue
            seconds = math.exp(statistics.fmean(math.log(h["seconds"]) for h in hits))
            steps = statistics.fmean(h["steps"] for h in hits)
            per_arm.setdefault(arm, {})[seed] = {
                "seconds": seconds,
                "steps": steps,
                "tokens": statistics.fmean(h["tokens"] for h in hits),
                "censored": sum(h["censored"] for h in hits),
                "peers": len(hits),
                "at_budget": statistics.fmean(accuracy_at(curve[(seed, slot, p)], budget) for p in peers),
            }
    print(
        "| arm | seeds | reached (peers) | time to target, geo-mean s | steps to target | own tokens to target | "
        "accuracy at budget |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm, got in per_arm.items():
        values = list(got.values())
        reached = sum(v["peers"] - v["censored"] for v in values)
        total = sum(v["peers"] for v in values)
        print(
            f"| {arm} | {len(values)} | {reached}/{total} | "
            f"{math.exp(statistics.fmean(math.log(v['seconds']) for v in values)):.1f} | "
            f"{statistics.fmean(v['steps'] for v in values):.0f} | "
            f"{statistics.fmean(v['tokens'] for v in values):.0f} | "
            f"{statistics.fmean(v['at_budget'] for v in values):.3f} |"
        )
    comparisons, pvalues = {}, {}
    for arm in SWARM_ARMS:
        for alone in ALONE_ARMS:
            common = sorted(set(per_arm.get(arm, {})) & set(per_arm.get(alone, {})))
            logs = [math.log(per_arm[arm][s]["seconds"] / per_arm[alone][s]["seconds"]) for s in common]
            both_censored = sum(
                per_arm[arm][s]["censored"] == per_arm[arm][s]["peers"] and per_arm[alone][s]["censored"]
                for s in common
            )
            comparisons[(arm, alone)] = (common, logs, both_censored)
            pvalues[f"{arm} vs {alone}"] = t_pvalue(logs) if len(logs) >= 2 else math.nan
    adjusted = holm(pvalues)
    print("\nwall-time ratio swarm / alone (geometric mean, 95% t-interval on log ratios, Holm over 8):")
    print("| comparison | n | ratio | 95% interval | swarm faster / slower | both censored | Holm p |")
    print("|---|---|---|---|---|---|---|")
    bounds = {}
    for (arm, alone), (common, logs, both) in comparisons.items():
        if not logs:
            continue
        mean, low, high = t_interval(logs)
        bounds[(arm, alone)] = (math.exp(mean), math.exp(low), math.exp(high))
        print(
            f"| {arm} vs {alone} | {len(logs)} | {math.exp(mean):.3f} | [{math.exp(low):.3f}, {math.exp(high):.3f}] | "
            f"{sum(v < 0 for v in logs)} / {sum(v > 0 for v in logs)} | {both} | {adjusted[f'{arm} vs {alone}']:.3f} |"
        )
    print("\ndecomposition: wall ratio = step-time ratio x steps ratio; prediction of the step-time ratio vs A_N:")
    print("1 - f(1 - 1/2) + r (f of A_N, r = exchange share of the swarm peer)")
    print("| comparison | step-time ratio | predicted | steps ratio |")
    print("|---|---|---|---|")
    for (arm, alone), (common, logs, both) in comparisons.items():
        if not common:
            continue
        slot, peers = ARMS[arm]
        step_ratios, predicted, steps_ratios = [], [], []
        for seed in common:
            swarm_runs = [runs[(seed, slot, p)] for p in peers]
            alone_run = runs[(seed, "alone", alone)]
            swarm_step = statistics.fmean(within_budget(r, budget)["seconds_per_step"] for r in swarm_runs)
            step_ratios.append(swarm_step / within_budget(alone_run, budget)["seconds_per_step"])
            full = within_budget(runs[(seed, "alone", "A_N")], budget)
            r_share = statistics.fmean(within_budget(r, budget)["r"] for r in swarm_runs)
            predicted.append(1 - full["f"] * 0.5 + r_share)
            steps_ratios.append(max(per_arm[arm][seed]["steps"], 1) / max(per_arm[alone][seed]["steps"], 1))
        pred = f"{statistics.fmean(predicted):.3f}" if alone == "A_N" else "-"
        print(f"| {arm} vs {alone} | {geo(step_ratios):.3f} | {pred} | {geo(steps_ratios):.3f} |")
    common = sorted(set(per_arm.get("A_N", {})) & set(per_arm.get("A_N/2", {})))
    if common:
        beta = geo([max(per_arm["A_N/2"][s]["steps"], 1) / max(per_arm["A_N"][s]["steps"], 1) for s in common])
        print(f"\nbatch scaling beta = steps_to_target(A_N/2) / steps_to_target(A_N): {beta:.3f} (geo-mean, "
            f"{len(common)} seeds; "
              "censored runs at their last step)")  # fmt: skip
    print("\npartner value phi = (gain_swarm - gain_A_N/2) / (gain_A_N - gain_A_N/2), gains at equal steps:")
    phi_report(curve, seeds, {arm: ARMS[arm] for arm in SWARM_ARMS})
    print("\nverdict (pre-registered): \"the value claim is supported where both wall-time ratios have upper bounds "
        "below 1"
          " with point estimates <= 0.9; refuted at this scale where the ratio against A_N/2 has a lower bound above "
          "0.9;"
          " otherwise inconclusive, with the decomposition showing which factor fell short.\"")  # fmt: skip
    for arm in SWARM_ARMS:
        full, half = bounds.get((arm, "A_N")), bounds.get((arm, "A_N/2"))
        if not full or not half:
            continue
        if all(b[2] < 1 and b[0] <= 0.9 for b in (full, half)):
            verdict = "supported"
        elif half[1] > 0.9:
            verdict = "refuted at this scale"
        else:
            verdict = "inconclusive"
        print(f"  {arm}: {verdict}")


def phi_report(curve: dict, seeds: list[int], arms: dict) -> None:
    """Print phi of each swarm arm (`arm -> (slot, judged peers)`) against the alone arms of the same seeds: the ratio
    of mean gains over the warm model at the last step all three arms reached, with a bootstrap interval."""
    for arm, (slot, peers) in arms.items():
        gains = []
        for seed in seeds:
            keys = [(seed, slot, p) for p in peers] + [(seed, "alone", "A_N"), (seed, "alone", "A_N/2")]
            if not all(k in curve for k in keys):
                continue
            step = min(curve[k][-1]["step"] for k in keys)
            values = [accuracy_at_step(curve[k], step) for k in keys]
            if any(v is None for v in values):
                continue
            warm = curve[keys[0]][0]["accuracy"]
            swarm_gain = statistics.fmean(values[: len(peers)]) - warm
            gains.append((swarm_gain, values[-2] - warm, values[-1] - warm, step))
        if len(gains) < 2:
            continue
        phi = phi_of(gains)
        rng = random.Random(0)
        boot = sorted(x for x in (phi_of([rng.choice(gains) for _ in gains]) for _ in range(2000)) if x is not None)
        low, high = (boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]) if boot else (math.nan, math.nan)
        print(
            f"  {arm:11s} phi {phi:+.2f} [{low:+.2f}, {high:+.2f}] (bootstrap over {len(gains)} seeds; at steps "
            f"{min(g[3] for g in gains)}-{max(g[3] for g in gains)}; mean gains swarm "
            f"{statistics.fmean(g[0] for g in gains):+.3f}, "
            f"A_N {statistics.fmean(g[1] for g in gains):+.3f}, A_N/2 {statistics.fmean(g[2] for g in gains):+.3f})"
        )


def slot_table(runs: dict, slots, budget: float) -> None:
    """Per slot and process: training clock, steps, ms/step, f and r within the budget, CPU/wall, slot wall."""
    for slot in slots:
        rows = [r for r in runs.values() if r["slot"] == slot]
        for name in sorted({r["peer"] for r in rows}):
            mine = [r for r in rows if r["peer"] == name]
            inside = [within_budget(r, budget) for r in mine]
            print(
                f"  {slot:11s} {name:5s} n={len(mine):2d}  clock "
                f"{statistics.fmean(r['train_clock'] for r in mine):5.1f} s  "
                f"steps {statistics.fmean(r['steps'] for r in mine):6.1f}  "
                f"{1000 * statistics.fmean(b['seconds_per_step'] for b in inside):5.0f} ms/step  "
                f"f {statistics.fmean(b['f'] for b in inside):.3f}  "
                f"r {statistics.fmean(b['r'] for b in inside):.3f}  "
                f"cpu/wall {statistics.fmean(r['cpu_seconds'] / r['train_clock'] for r in mine):.2f}  "
                f"slot {statistics.fmean(r['slot_wall_seconds'] for r in mine):5.1f} s"
            )


def summarise_part3(records: list[dict], target: float, budget: float) -> None:
    """Part 3 (pre-registered in time_to_target.md): phi of each co-trainer kind and the two options' comparisons,
    all from part 3's own runs (the alone arms were rerun with it)."""
    from free_running import holm, t_interval, t_pvalue

    curve = curves(records)
    runs = {(r["seed"], r["slot"], r["peer"]): r for r in records if r["kind"] == "run"}
    seeds = sorted({r["seed"] for r in records if r["kind"] == "run"})
    print(f"\n== part 3: {len(seeds)} seeds {seeds}, budget {budget:.0f} s of training clock ==")
    print("\nslots (per process, as in the grid's table):")
    slot_table(runs, PART3_SLOTS, budget)
    for slot in ("shared-sync", "horiz-sync"):
        pairs = [(runs[(s, slot, "a")], runs[(s, slot, "b")]) for s in seeds if (s, slot, "b") in runs]
        same = sum(bool(a.get("first_prompts")) and a.get("first_prompts") == b.get("first_prompts") for a, b in pairs)
        print(f"  {slot}: the two peers' first 3 prompt batches are the same in {same} of {len(pairs)} seeds")
    print("\naccuracy (held-out greedy) and time to target per arm (mean over seeds; homog: over both peers):")
    print("| arm | runs | warm | at half budget | at budget | reached target | time to target, geo-mean s |")
    print("|---|---|---|---|---|---|---|")
    for arm, (slot, peers) in PART3_ARMS.items():
        points = [curve[(seed, slot, p)] for seed in seeds for p in peers if (seed, slot, p) in curve]
        if not points:
            continue
        hits = [time_to_target(c, target, budget) for c in points]
        print(
            f"| {arm} | {len(points)} | {statistics.fmean(c[0]['accuracy'] for c in points):.3f} | "
            f"{statistics.fmean(accuracy_at(c, budget / 2) for c in points):.3f} | "
            f"{statistics.fmean(accuracy_at(c, budget) for c in points):.3f} | "
            f"{sum(not h['censored'] for h in hits)}/{len(hits)} | "
            f"{math.exp(statistics.fmean(math.log(h['seconds']) for h in hits)):.1f} |"
        )
    print("\nphi = (gain_swarm - gain_A_N/2) / (gain_A_N - gain_A_N/2) at equal steps:")
    phi_report(curve, seeds, {arm: PART3_ARMS[arm] for arm in PART3_SWARM_ARMS})

    def judged_times(arm, seed):
        slot, peers = PART3_ARMS[arm]
        keys = [(seed, slot, p) for p in peers]
        if not all(k in curve for k in keys):
            return None
        return math.exp(statistics.fmean(math.log(time_to_target(curve[k], target, budget)["seconds"]) for k in keys))

    print(
        f"\nwall-time ratio swarm / alone, time to target {target:.2f} (descriptive; geometric mean, 95% t-interval):"
    )
    print("| comparison | n | ratio | 95% interval | swarm faster / slower |")
    print("|---|---|---|---|---|")
    for arm in PART3_SWARM_ARMS:
        for alone in ALONE_ARMS:
            logs = [
                math.log(judged_times(arm, s) / judged_times(alone, s))
                for s in seeds
                if judged_times(arm, s) and judged_times(alone, s)
            ]
            if len(logs) >= 2:
                mean, low, high = t_interval(logs)
                print(
                    f"| {arm} vs {alone} | {len(logs)} | {math.exp(mean):.3f} | [{math.exp(low):.3f}, "
                    f"{math.exp(high):.3f}] | {sum(v < 0 for v in logs)} / {sum(v > 0 for v in logs)} |"
                )
    print(
        "\noption comparisons (pre-registered H5, H5a, sharing, H6): gain difference at equal steps (option - "
        "baseline; accuracy over"
    )
    print(
        "the warm model at the last step both reached), 95% t-interval, sign counts, Holm over the 4; time-to-target"
    )
    print("ratio option / baseline (secondary):")
    print(
        "| comparison | n | gain option | gain baseline | difference | 95% interval | + / - | Holm p | time-to-target "
        "ratio [95%] |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows, pvalues = [], {}
    for option, baseline in PART3_COMPARISONS:
        (slot_o, peers_o), (slot_b, peers_b) = PART3_ARMS[option], PART3_ARMS[baseline]
        diffs, gains, logs = [], [], []
        for seed in seeds:
            keys_o = [(seed, slot_o, p) for p in peers_o]
            keys_b = [(seed, slot_b, p) for p in peers_b]
            if not all(k in curve for k in keys_o + keys_b):
                continue
            step = min(curve[k][-1]["step"] for k in keys_o + keys_b)
            warm = curve[keys_o[0]][0]["accuracy"]
            at_o = [accuracy_at_step(curve[k], step) for k in keys_o]
            at_b = [accuracy_at_step(curve[k], step) for k in keys_b]
            if any(v is None for v in at_o + at_b):
                continue
            gain_o, gain_b = statistics.fmean(at_o) - warm, statistics.fmean(at_b) - warm
            diffs.append(gain_o - gain_b)
            gains.append((gain_o, gain_b))
            logs.append(math.log(judged_times(option, seed) / judged_times(baseline, seed)))
        name = f"{option} vs {baseline}"
        pvalues[name] = t_pvalue(diffs) if len(diffs) >= 2 else math.nan
        rows.append((name, diffs, gains, logs))
    adjusted = holm(pvalues)
    for name, diffs, gains, logs in rows:
        if len(diffs) < 2:
            continue
        mean, low, high = t_interval(diffs)
        lmean, llow, lhigh = t_interval(logs)
        print(
            f"| {name} | {len(diffs)} | {statistics.fmean(g[0] for g in gains):+.3f} | "
            f"{statistics.fmean(g[1] for g in gains):+.3f} | "
            f"{mean:+.3f} | [{low:+.3f}, {high:+.3f}] | {sum(d > 0 for d in diffs)} / {sum(d < 0 for d in diffs)} | "
            f"{adjusted[name]:.3f} | {math.exp(lmean):.2f} [{math.exp(llow):.2f}, {math.exp(lhigh):.2f}] |"
        )
    print("\ndecision rule (pre-registered): an option becomes a default only where its comparison is positive and")
    print(
        "distinguishable after Holm, and its time-to-target ratio is not above 1 by its interval; otherwise it stays "
        "an option."
    )


def target_rule(curves: list[list[dict]], budget: float) -> float | None:
    """The highest accuracy on a 0.01 grid at which the median time to target of `curves` (one per seed, of the
    baseline arm; censored = budget) is at most half the budget; `None` when no grid point qualifies."""
    proposal = None
    for hundredths in range(1, 100):
        target = hundredths / 100
        times = [time_to_target(points, target, budget)["seconds"] for points in curves]
        if statistics.median(times) <= budget / 2:
            proposal = target
    return proposal


def propose_target(curve: dict, seeds: list[int], budget: float) -> float | None:
    """The pilot's rule: the highest accuracy on a 0.01 grid at which A_N/2's median time to target over the seeds
    (censored = budget) is at most half the budget; printed with every arm's times at it and the next grid point."""
    halves = [curve[(seed, "alone", "A_N/2")] for seed in seeds if (seed, "alone", "A_N/2") in curve]
    if not halves:
        return None
    proposal = target_rule(halves, budget)
    if proposal is None:
        print("\nno target: A_N/2 reaches none by half the budget in the median seed")
        return None
    print(f"\nproposed TARGET: {proposal:.2f} (highest with A_N/2's median time to target <= half the budget, "
          f"{len(halves)} seeds); times to target per arm (s, c = censored):")  # fmt: skip
    for target in (proposal, round(proposal + 0.01, 2)):
        cells = []
        for arm, (slot, peers) in ARMS.items():
            hits = [
                time_to_target(curve[(s, slot, p)], target, budget)
                for s in seeds
                for p in peers
                if (s, slot, p) in curve
            ]
            cells.append(f"{arm} " + ",".join(f"{h['seconds']:.0f}{'c' if h['censored'] else ''}" for h in hits))
        print(f"  {target:.2f}: " + "; ".join(cells))
    return proposal


def phi_of(gains) -> float | None:
    swarm = statistics.fmean(g[0] for g in gains)
    full = statistics.fmean(g[1] for g in gains)
    half = statistics.fmean(g[2] for g in gains)
    return (swarm - half) / (full - half) if abs(full - half) > 1e-9 else None


def geo(values) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in values))


def within_budget(run: dict, budget: float) -> dict:
    """Seconds per step, generation share f and exchange share r of `run` over its steps that ended within
    `budget` (from its step log; the whole run for records without one)."""
    log = [entry for entry in run.get("step_log") or [] if entry[1] <= budget + 1e-9]
    if not log:
        return {"seconds_per_step": run["seconds_per_step"], "f": run["generation_share"], "r": exchange_share(run)}
    step, clock, generation = log[-1]
    times = [entry for entry in run.get("time_log") or [] if entry[0] <= step]
    step_seconds = sum(entry[1] for entry in times)
    r = sum(entry[2] for entry in times) / step_seconds if step_seconds > 0 else exchange_share(run)
    return {"seconds_per_step": clock / max(step, 1), "f": generation / clock if clock > 0 else None, "r": r}


def exchange_share(run: dict) -> float:
    """Exchange seconds / step seconds over the whole run (`ftis_summary.json`'s `time_seconds`)."""
    split = run.get("summary_time_seconds") or {}
    if split.get("step"):
        return split.get("exchange", 0.0) / split["step"]
    blocking = run.get("exchange_blocking_seconds") or 0.0
    return blocking / run["train_clock"] if run["train_clock"] else 0.0


# ---- main -----------------------------------------------------------------------------------------------------------
def parse_seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-")
            seeds += list(range(int(low), int(high) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def main() -> None:
    global MAX_STEPS, LR_OVERRIDE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, budget / 6: a smoke test")
    parser.add_argument("--pilot", action="store_true", help=f"pilot seeds {PILOT_SEEDS}: fixes TARGET")
    parser.add_argument("--seeds", help="e.g. 0-11 or 0,3,5 (default: the grid's 0-11, the pilot's, quick's)")
    parser.add_argument(
        "--part3", action="store_true", help="part 3's slots (PART3_SLOTS) into time_to_target-part3.jsonl, "
            "summarised "
        "with the grid's alone and swarm runs of the same seeds"
    )  # fmt: skip
    parser.add_argument("--slots", nargs="+", choices=sorted(set(SLOTS + PART3_SLOTS)), default=None)
    parser.add_argument("--steps", type=int, help=f"cap on the steps of every run (default {MAX_STEPS})")
    parser.add_argument("--summary-only", action="store_true", help="summarise the raw records, run nothing")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out problems (default: all 822)")
    parser.add_argument("--lr", type=float, default=None, help="override LR (not for the grid)")
    parser.add_argument("--tag", default=None, help="results file suffix (default: -quick, -pilot or none)")
    parser.add_argument("--target", type=float, default=None, help="override TARGET (summary)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ftis-ttt-warm")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ftis-ttt-work")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", help=argparse.SUPPRESS)
    parser.add_argument("--warm", nargs=2, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.peer:
        return peer(options.peer)
    if options.evaluate:
        return evaluate_worker(options.evaluate)
    if options.warm:
        warm_checkpoint(options.cache, options.warm[0], int(options.warm[1]))
        return None
    if options.steps:
        MAX_STEPS = options.steps
    LR_OVERRIDE = options.lr
    if options.slots is None:
        options.slots = list(PART3_SLOTS if options.part3 else SLOTS)
    default_tag = "-quick" if options.quick else "-pilot" if options.pilot else ""
    tag = options.tag if options.tag is not None else ("-part3" + default_tag if options.part3 else default_tag)
    seeds = (
        parse_seeds(options.seeds)
        if options.seeds
        else list(QUICK_SEEDS if options.quick else PILOT_SEEDS if options.pilot else GRID_SEEDS)
    )
    if not options.quick and not options.pilot and set(seeds) & set(PILOT_SEEDS):
        raise SystemExit("pilot seeds are not reused in the grid")
    eval_size = options.eval_size or (200 if options.quick else None)
    budget = BUDGET_SECONDS / (6 if options.quick else 1)
    target = options.target if options.target is not None else (None if options.pilot else TARGET)
    RESULTS.mkdir(exist_ok=True)
    raw = RESULTS / f"time_to_target{tag}.jsonl"
    records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()] if raw.exists() else []
    if options.summary_only:
        if options.part3:
            return summarise_part3(records, target, budget)
        return summarise(records, target, budget, options.pilot)
    print(run_header(), flush=True)
    options.cache.mkdir(parents=True, exist_ok=True)
    build_warm(options.cache, seeds, options.slots)
    done = {(r["seed"], r["slot"]) for r in records if r["kind"] == "run"}
    with open(raw, "a") as sink:
        for index, seed in enumerate(seeds):
            order = options.slots if index % 2 == 0 else list(reversed(options.slots))  # ABBA across seeds
            for slot in order:
                if (seed, slot) in done:
                    print(f"seed {seed} {slot}: in {raw.name}, skipped", flush=True)
                    continue
                got = run_slot(
                    slot,
                    seed,
                    options.cache,
                    options.work / f"{tag or 'grid'}-seed{seed}" / slot,
                    options.quick,
                    index,
                )
                for record in got:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                records += got
                print(
                    f"seed {seed} {slot}: "
                    + ", ".join(
                        f"{r['peer']} {r['steps']} steps {r['train_clock']:.1f} s ({1000 * r['seconds_per_step']:.0f} "
                        f"ms/step, f {r['generation_share']:.2f}, cpu/wall {r['cpu_seconds'] / r['train_clock']:.2f})"
                        for r in got
                    )
                    + f"; slot {got[0]['slot_wall_seconds']:.0f} s",
                    flush=True,
                )
        records += evaluate_pending(records, sink, options.cache, eval_size)
    if options.part3:
        summarise_part3(records, target, budget)
    else:
        summarise(records, target, budget, options.pilot)


def build_warm(cache: Path, seeds: list[int], slots: list[str], names: list[str] | None = None) -> None:
    """Build the missing warm models (those the `slots` use, or `names`), two at a time (one a core)."""
    if names is None:
        names = ["big"] + (["small"] if any(s.startswith("hetero") for s in slots) else [])
        names += [n for prefix, n in (("arch", "qwen2"), ("tok", "bpe")) if any(s.startswith(prefix) for s in slots)]
    missing = [(n, s) for s in seeds for n in names if not (cache / f"carry-{n}-seed{s}" / "config.json").exists()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    running: list[subprocess.Popen] = []
    for i, (name, seed) in enumerate(missing):
        if len(running) == 2 and running.pop(0).wait() != 0:
            raise SystemExit("warm-up failed")
        argv = [
            "taskset",
            "-c",
            str(i % 2),
            sys.executable,
            __file__,
            "--warm",
            name,
            str(seed),
            "--cache",
            str(cache),
        ]
        running.append(subprocess.Popen(argv, cwd=ROOT, env=env))
    for process in running:
        if process.wait() != 0:
            raise SystemExit("warm-up failed")


if __name__ == "__main__":
    main()
