"""Part B of the peer-gain experiment (`benchmarks/peer_gain.md`): wall time to a target at the frontier
configuration, measured, against the prediction of `trl_ftis.pays` from this part's hardware factors and part A's
phi and beta.

    OMP_NUM_THREADS=1 python benchmarks/peer_gain_wall.py --warm                  # the warm model, by the plan's rule
    OMP_NUM_THREADS=1 python benchmarks/peer_gain_wall.py --stage pilot           # seeds 950, 951: budget and target
    OMP_NUM_THREADS=1 python benchmarks/peer_gain_wall.py --stage grid --minutes 55
    python benchmarks/peer_gain_wall.py --stage grid --summary-only

The machine to itself. Two slots a seed, each two processes pinned one a core: [A_2, A_1] and [copy-2 a, b]
(lock-step), ABBA order across seeds, cores swapped between even and odd seeds, a start barrier; snapshots every
`CHECKPOINT_STEPS` steps, each stamped with the training clock (the snapshot itself off the clock), evaluated offline
on `EVAL_SIZE` held-out problems of the configuration's digits. The processes are `time_to_target.py --peer`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import itertools

import peer_gain
import time_to_target as ttt
from free_running import t_interval

#: The configuration (the frontier rule's order under amendments 1 and 2 of the plan: the first candidate that fits
#: part B's budget and whose warm-up reached 20%) and its warm-up rule.
CONFIG = {"hidden": 128, "layers": 2, "digits": 4}
WARM_TARGET, WARM_MAX_STEPS, WARM_EVERY, WARM_DEV = 0.2, 4000, 100, 100
CHECKPOINT_STEPS = 5
EVAL_SIZE = 300
PILOT_SEEDS = (950, 951)
PILOT_STEPS, LONGER_PILOT_STEPS = 200, 600  # amendment 3: the longer pilot, when the first one's target is noise
NOISE_FLOOR_SDS = 3
GRID_SEEDS = tuple(range(8))
ARMS = {"A_2": ("alone", ("A_2",)), "A_1": ("alone", ("A_1",)), "copy-2": ("copies", ("a", "b"))}


def completion_tokens() -> int:
    from trl_ftis.tasks.carry_chain import max_chain_tokens

    return max_chain_tokens(CONFIG["digits"])


def warm_model(cache: Path) -> Path:
    """The warm model of `CONFIG`: supervised carry-chain steps (AdamW 3e-3, batch 64) until the dev accuracy on
    `WARM_DEV` dev-split problems reaches `WARM_TARGET` (checked every `WARM_EVERY` steps), at most `WARM_MAX_STEPS`;
    `warmup.json` records whether it did. Built once."""
    name = f"wall-h{CONFIG['hidden']}-l{CONFIG['layers']}-d{CONFIG['digits']}"
    path = cache / name
    if (path / "config.json").exists():
        return path
    import torch

    from trl_ftis.demo.tiny import build_tiny_causal_lm
    from trl_ftis.tasks.carry_chain import carry_chain_problems, carry_chain_warmup

    torch.set_num_threads(1)
    tok = ttt.tokenizer()
    digits = CONFIG["digits"]
    dev = carry_chain_problems(WARM_DEV, seed=2000, split="dev", digits=digits)
    size = min(20000, 6 * 10 ** (2 * digits - 1))  # 2 digits have 8,100 problems in all
    problems = carry_chain_problems(size, seed=1000, split="train", digits=digits, exclude={p["prompt"] for p in dev})
    model = build_tiny_causal_lm(
        tok, hidden_size=CONFIG["hidden"], num_layers=CONFIG["layers"], seed=0,
        max_position_embeddings=2 * digits + 2 + completion_tokens() + 8,
    )  # fmt: skip
    started = time.time()
    steps, accuracy = carry_chain_warmup(
        model, tok, problems, steps=WARM_MAX_STEPS, batch_size=64, lr=3e-3, seed=0, target_accuracy=WARM_TARGET,
        dev_problems=dev, eval_every=WARM_EVERY,
    )  # fmt: skip
    reached = accuracy is not None and accuracy >= WARM_TARGET
    print(f"warm {name}: {steps} steps, dev {accuracy}, reached {reached}, {time.time() - started:.0f} s", flush=True)
    temporary = path.with_name(f"{name}.tmp{os.getpid()}")
    model.save_pretrained(temporary)
    (temporary / "warmup.json").write_text(json.dumps({"steps": steps, "dev_accuracy": accuracy, "reached": reached}))
    os.replace(temporary, path)
    return path


def slot_specs(slot: str, seed: int, rates: dict[str, float], checkpoint: Path, work: Path, steps: int) -> dict:
    def spec(name, arm, rows, index, ids=None):
        return {
            "slot": slot, "arm": arm, "seed": seed, "peer": name, "checkpoint": str(checkpoint), "rows": rows,
            "lr": rates[arm], "stream_seed": 10_000 * (seed + 1) + index, "sampling_seed": 100 * seed + index,
            "out": str(work / name), "max_steps": steps, "stop_seconds": None, "checkpoint_steps": CHECKPOINT_STEPS,
            "checkpoint_scale": 1, "exclude_dev": False, "digits": CONFIG["digits"],
            "max_completion": completion_tokens(), "exchange_url": f"dir://{work / 'exchange'}" if ids else None,
            "mode": "sync" if ids else None, "expected_peers": ids, "peer_timeout": peer_gain.PEER_TIMEOUT,
        }  # fmt: skip

    if slot == "alone":
        return {"A_2": spec("A_2", "A_2", 2 * peer_gain.OWN_ROWS, 0), "A_1": spec("A_1", "A_1", peer_gain.OWN_ROWS, 0)}
    ids = ["a", "b"]
    return {name: spec(name, "copy-2", peer_gain.OWN_ROWS, i, ids) for i, name in enumerate(ids)}


def run_slot(slot: str, seed: int, rates: dict, checkpoint: Path, work: Path, index: int, steps: int) -> list[dict]:
    """Two processes, one a core (cores swap between even and odd seeds), started together."""
    specs = slot_specs(slot, seed, rates, checkpoint, ttt.fresh_folder(work), steps)
    cores = {name: (position + index) % 2 for position, name in enumerate(specs)}
    ttt.launch_processes(specs, cores, work, f"{slot} seed {seed}", timeout=7200)
    return ttt.slot_records(specs, cores, seed=seed, slot=slot)


def evaluate_worker(job_path: str) -> None:
    """Exact-answer accuracy of each listed snapshot on the first `EVAL_SIZE` held-out problems of the digits."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_ftis.tasks.carry_chain import carry_chain_accuracy, carry_chain_problems

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    CONFIG.update(job["config"])
    problems = carry_chain_problems(EVAL_SIZE, seed=7, digits=CONFIG["digits"], split="test")
    tok, model, warm = ttt.tokenizer(), None, None
    for item in job["items"]:
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(item["model"])
            warm = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(torch.load(item["weights"]) if item.get("weights") else warm)
        accuracy = carry_chain_accuracy(model, tok, problems, max_new_tokens=completion_tokens())
        print(json.dumps({**item["record"], "accuracy": accuracy}), flush=True)


def evaluate_pending(records: list[dict], sink, checkpoint: Path) -> list[dict]:
    done = {(r["seed"], r["peer"], r["index"]) for r in records if r["kind"] == "checkpoint"}
    items = []
    if not any(r["kind"] == "warm" for r in records):
        items.append({"model": str(checkpoint), "weights": None, "record": {"kind": "warm"}})
    for run in (r for r in records if r["kind"] == "run"):
        for snap in run["snapshots"]:
            if (run["seed"], run["peer"], snap["index"]) not in done:
                record = {"kind": "checkpoint", "seed": run["seed"], "slot": run["slot"], "arm": run["arm"],
                          "peer": run["peer"], **snap}  # fmt: skip
                weights = str(Path(run["out"]) / f"ckpt-{snap['index']}.pt")
                items.append({"model": str(checkpoint), "weights": weights, "record": record})
    new = ttt.evaluate_items(items, __file__, sink, "ftis-wall-eval-", config=CONFIG)
    for item in items:
        if item["weights"]:
            Path(item["weights"]).unlink(missing_ok=True)
    return new


# ---- analysis -------------------------------------------------------------------------------------------------------
def curves(records: list[dict]) -> dict:
    """(seed, peer) -> [{step, clock, accuracy}] by step, the warm accuracy at step 0 and clock 0."""
    warm = next((r["accuracy"] for r in records if r["kind"] == "warm"), None)
    out: dict = {}
    for r in records:
        if r["kind"] == "checkpoint":
            out.setdefault((r["seed"], r["peer"]), []).append(
                {"step": r["step"], "clock": r["clock"], "accuracy": r["accuracy"]}
            )
    for points in out.values():
        points.sort(key=lambda p: p["step"])
        if warm is not None:
            points.insert(0, {"step": 0, "clock": 0.0, "accuracy": warm})
    return out


def time_to_target(points: list[dict], target: float) -> tuple[float, int, bool]:
    """(training-clock seconds, steps, censored) at the first of two consecutive snapshots at or above `target`;
    censored at the last snapshot."""
    trained = [p for p in points if p["step"] > 0]
    for first, second in itertools.pairwise(trained):
        if first["accuracy"] >= target and second["accuracy"] >= target:
            return first["clock"], first["step"], False
    return trained[-1]["clock"], trained[-1]["step"], True


def hardware_factors(records: list[dict]) -> dict:
    """Per seed, from the runs' own step logs (`time_log`: step seconds and exchange seconds per step; `step_log`'s
    generation seconds): f of A_2, s = A_2's generation a step / A_1's, r of the copies, q = A_1's step / A_2's."""
    runs = {(r["seed"], r["peer"]): r for r in records if r["kind"] == "run"}
    out = {}
    for seed in sorted({k[0] for k in runs}):
        need = [(seed, p) for p in ("A_2", "A_1", "a", "b")]
        if not all(k in runs for k in need):
            continue
        full, one = runs[(seed, "A_2")], runs[(seed, "A_1")]
        copies = [runs[(seed, "a")], runs[(seed, "b")]]

        def per_step(run, key):
            return run[key] / run["steps"]

        out[seed] = {
            "f": full["generation_seconds"] / full["train_clock"],
            "s": per_step(full, "generation_seconds") / per_step(one, "generation_seconds"),
            "r": statistics.fmean(sum(e[2] for e in c["time_log"]) / sum(e[1] for e in c["time_log"]) for c in copies),
            "q": per_step(one, "train_clock") / per_step(full, "train_clock"),
            "step_ratio": statistics.fmean(per_step(c, "train_clock") for c in copies) / per_step(full, "train_clock"),
        }
    return out


def part_a_learning() -> dict | None:
    """Part A's phi of copy-2 and beta_2 with their intervals (estimate, low, high), from its records; None before
    its grid is complete."""
    import contextlib
    import io

    lr_records = peer_gain.load(RESULTS / "peer_gain-lr.jsonl")
    grid = peer_gain.load(RESULTS / "peer_gain-grid.jsonl")
    choice = peer_gain.rate_choice(lr_records)
    offset = peer_gain.target_offset(choice)
    if not grid or offset is None:
        return None
    rates = {arm: item["rate"] for arm, item in choice.items()}
    with contextlib.redirect_stdout(io.StringIO()):
        result = peer_gain.summarise_grid(grid, offset, rates)
    if len(result["complete_seeds"]) < 2:
        return None
    phi, beta = result["phi"]["copy-2"], result["ratios"]["beta_2: A_1 / A_2"]
    return {"phi": (phi["phi"], phi["low"], phi["high"]), "beta": (beta["ratio"], beta["low"], beta["high"]),
            "seeds": len(result["complete_seeds"])}  # fmt: skip


def mean_hardware(factors: dict):
    """`trl_ftis.pays.Hardware` from this part's hardware factors, their means over seeds."""
    from trl_ftis.pays import Hardware

    means = {key: statistics.fmean(f[key] for f in factors.values()) for key in ("f", "s", "r", "q")}
    return Hardware(peers=2, f=means["f"], s=max(means["s"], 1.0), r=means["r"], q=min(means["q"], 1.0))


def predicted(factors: dict, learning: dict) -> str:
    """`trl_ftis.pays` on this part's mean hardware factors and part A's phi and beta (their intervals)."""
    from trl_ftis.pays import format_report

    return format_report(mean_hardware(factors), learning["phi"], learning["beta"])


def prediction_holds(measured: tuple[float, float], predicted_range: tuple[float, float]) -> bool:
    """The plan's check: the measured interval overlaps the predicted range."""
    return measured[0] <= predicted_range[1] and predicted_range[0] <= measured[1]


def pilot_rule(records: list[dict]) -> dict | None:
    """The plan's rules on the pilot's records: the target offset is 0.5 x the median over the pilot seeds of A_1's
    end gain (mean of its last 3 snapshots over the warm accuracy); the budget is the smallest multiple of
    `CHECKPOINT_STEPS` within 80% of which A_1 reached that target in every pilot seed. None when A_1 did not reach it
    in every pilot seed (then the pilot runs again with a longer `--steps`)."""
    curve = curves(records)
    seeds = sorted({seed for seed, peer in curve if peer == "A_1"})
    if not seeds:
        return None
    lower = arms_that_lost(curve, seeds)
    gains = [statistics.fmean(p["accuracy"] for p in curve[(s, "A_1")][-3:]) - curve[(s, "A_1")][0]["accuracy"]
             for s in seeds]  # fmt: skip
    offset = 0.5 * statistics.median(gains)
    floor = noise_floor(curve, seeds)
    if offset < floor:  # amendment 3: a target within the snapshots' fluctuation measures noise, not learning
        return {"offset": offset, "budget": None, "gains": gains, "lower_rate": lower, "floor": floor}
    warm = curve[(seeds[0], "A_1")][0]["accuracy"]
    reached = [time_to_target(curve[(s, "A_1")], warm + offset) for s in seeds]
    if any(censored for _, _, censored in reached):
        return {"offset": offset, "budget": None, "gains": gains, "lower_rate": lower, "floor": floor}
    needed = max(steps for _, steps, _ in reached) / 0.8
    budget = CHECKPOINT_STEPS * math.ceil(needed / CHECKPOINT_STEPS)
    return {"offset": offset, "budget": budget, "gains": gains, "lower_rate": lower, "floor": floor}


def noise_floor(curve: dict, seeds: list[int]) -> float:
    """Amendment 3's floor for the target offset: `NOISE_FLOOR_SDS` x the median over the pilot seeds of the standard
    deviation of A_1's snapshot-to-snapshot accuracy changes."""
    sds = []
    for seed in seeds:
        accuracy = [p["accuracy"] for p in curve[(seed, "A_1")]]
        sds.append(statistics.pstdev(b - a for a, b in itertools.pairwise(accuracy)))
    return NOISE_FLOOR_SDS * statistics.median(sds)


def pilot_file(steps: int) -> Path:
    """The pilot's records: the registered 200 steps in `peer_gain_wall-pilot.jsonl`, a longer one apart."""
    return RESULTS / ("peer_gain_wall-pilot.jsonl" if steps == PILOT_STEPS else f"peer_gain_wall-pilot{steps}.jsonl")


def graded_rule() -> dict | None:
    """The rule the graded seeds follow: that of the first pilot (200 steps, then `LONGER_PILOT_STEPS`) whose target
    clears the noise floor and gives a budget (amendment 3); None before there is one."""
    for steps in (PILOT_STEPS, LONGER_PILOT_STEPS):
        rule = pilot_rule(peer_gain.load(pilot_file(steps)))
        if rule is not None and rule["budget"] is not None:
            return rule
    return None


def arms_that_lost(curve: dict, seeds: list[int]) -> list[str]:
    """The plan's rate check: the arms whose accuracy at the end (copies: their mean) is below the warm accuracy in
    every pilot seed; each moves one step down `peer_gain.RATES` before the graded seeds."""
    lost = []
    for arm, (_, peers) in ARMS.items():
        if all((seed, peer) in curve for seed in seeds for peer in peers) and all(
            statistics.fmean(curve[(seed, peer)][-1]["accuracy"] for peer in peers)
            < curve[(seed, peers[0])][0]["accuracy"]
            for seed in seeds
        ):
            lost.append(arm)
    return lost


def graded_rates(rates: dict[str, float], lower: list[str]) -> dict[str, float]:
    """Part A's rates, each arm in `lower` one step down `peer_gain.RATES` (the lowest stays)."""
    out = dict(rates)
    for arm in lower:
        index = peer_gain.RATES.index(rates[arm])
        out[arm] = peer_gain.RATES[max(index - 1, 0)]
    return out


def summarise(records: list[dict], target_offset: float | None) -> None:
    curve = curves(records)
    seeds = sorted({k[0] for k in curve})
    warm = next((r["accuracy"] for r in records if r["kind"] == "warm"), None)
    print(f"warm accuracy {warm}; seeds {seeds}")
    for (seed, peer), points in sorted(curve.items()):
        print(f"  seed {seed} {peer}: " + " ".join(f"{p['accuracy']:.2f}@{p['clock']:.0f}s" for p in points))
    factors = hardware_factors(records)
    for key in ("f", "s", "r", "q", "step_ratio"):
        values = [f[key] for f in factors.values()]
        if values:
            mean, low, high = t_interval(values) if len(values) > 1 else (values[0], math.nan, math.nan)
            print(f"{key}: {mean:.3f} [{low:.3f}, {high:.3f}] over {len(values)} seeds")
    learning = part_a_learning()
    if factors and learning:
        print(f"prediction (part A: {learning['seeds']} seeds; this part's mean factors):")
        print(predicted(factors, learning))
    if target_offset is None or warm is None:
        return
    target = warm + target_offset
    times = {}
    for seed in seeds:
        for arm, (_, peers) in ARMS.items():
            got = [time_to_target(curve[(seed, p)], target) for p in peers if (seed, p) in curve]
            if len(got) == len(peers):
                times[(seed, arm)] = got
    complete = [s for s in seeds if all((s, arm) in times for arm in ARMS)]
    print(f"target {target:.3f} (warm + {target_offset:.3f}); complete seeds {complete}")
    restricted = {}
    for arm in ARMS:
        values = [t for s in complete for t, _, _ in times[(s, arm)]]
        censored = sum(c for s in complete for _, _, c in times[(s, arm)])
        restricted[arm] = statistics.fmean(values) if values else math.nan
        print(f"  {arm}: restricted mean time to target {restricted[arm]:.1f} s, censored {censored}/{len(values)}")
    better = min(("A_2", "A_1"), key=lambda arm: restricted[arm])
    logs = [
        statistics.fmean(math.log(t) for t, _, _ in times[(s, "copy-2")]) - math.log(times[(s, better)][0][0])
        for s in complete
    ]
    if len(logs) < 2:
        return
    step_logs = [
        statistics.fmean(math.log(steps) for _, steps, _ in times[(s, "copy-2")]) - math.log(times[(s, better)][0][1])
        for s in complete
    ]
    per_step_logs = [wall - steps for wall, steps in zip(logs, step_logs, strict=True)]
    for name, values in (
        ("wall ratio", logs),
        ("  steps ratio", step_logs),
        ("  seconds-a-step ratio", per_step_logs),
    ):
        mean, low, high = t_interval(values)
        lower, higher = sum(v < 0 for v in values), sum(v > 0 for v in values)
        print(f"measured {name} copy-2 / {better}: {math.exp(mean):.2f} [{math.exp(low):.2f}, {math.exp(high):.2f}] "
              f"over {len(values)} seeds (lower / higher {lower} / {higher})")  # fmt: skip
    mean, low, high = t_interval(logs)
    verdict = "not distinguishable" if low <= 0 <= high else ("pays" if high < 0 else "does not pay")
    print(f"{better} is the better alone run (lower restricted mean time to target); on this CPU joining: {verdict}")
    learning = part_a_learning()
    if factors and learning:
        from trl_ftis.pays import wall_ratio_range

        key = "vs_full" if better == "A_2" else "vs_own"
        ranges = wall_ratio_range(mean_hardware(factors), learning["phi"][1:], learning["beta"][1:])[key]
        holds = prediction_holds((math.exp(low), math.exp(high)), ranges)
        print(
            f"predicted range copy-2 / {better}: [{ranges[0]:.2f}, {ranges[1]:.2f}]; the prediction "
            f"{'holds' if holds else 'does not hold'} (measured interval {'overlaps' if holds else 'misses'} it)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm", action="store_true", help="build the warm model (the plan's rule) and stop")
    parser.add_argument("--stage", choices=("quick", "pilot", "grid"), default="grid")
    parser.add_argument("--steps", type=int, default=None, help="the budget (the pilot's; the grid uses BUDGET_STEPS)")
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ftis-gain-warm")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ftis-wall-work")
    parser.add_argument("--config", nargs=3, type=int, metavar=("HIDDEN", "LAYERS", "DIGITS"),
                        help="another configuration: a candidate of the rule's order with --warm, or a smoke test "
                        "(--stage quick --config 64 2 2)")  # fmt: skip
    parser.add_argument("--evaluate", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.config:
        CONFIG.update(zip(("hidden", "layers", "digits"), options.config, strict=True))
    if options.evaluate:
        return evaluate_worker(options.evaluate)
    if options.warm:
        options.cache.mkdir(parents=True, exist_ok=True)
        warm_model(options.cache)
        return None
    if options.config and options.stage != "quick":
        raise SystemExit("--config is for a candidate's warm-up (--warm) and smoke tests (--stage quick); CONFIG is "
                         "the plan's choice")  # fmt: skip
    pilot_steps = options.steps or PILOT_STEPS
    raw = pilot_file(pilot_steps) if options.stage == "pilot" else RESULTS / f"peer_gain_wall-{options.stage}.jsonl"
    records = peer_gain.load(raw)
    rule = graded_rule() if options.stage == "grid" else None
    if options.summary_only:  # the records only: the warm model, the runs and their evaluation take minutes
        return report(records, rule, options.stage)
    steps = {"quick": 10, "pilot": pilot_steps, "grid": rule and rule["budget"]}[options.stage]
    seeds = {"quick": (990,), "pilot": PILOT_SEEDS, "grid": GRID_SEEDS}[options.stage]
    if steps is None:
        raise SystemExit("the budget comes from a pilot whose target clears the noise floor (benchmarks/peer_gain.md, "
                         "part B, amendment 3): run --stage pilot (then --steps 600) first")  # fmt: skip
    choice = peer_gain.rate_choice(peer_gain.load(RESULTS / "peer_gain-lr.jsonl"))
    if options.stage != "quick" and any(arm not in choice for arm in ARMS):
        raise SystemExit("part A's learning-rate stage is not complete: its rates are this part's")
    rates = {arm: choice[arm]["rate"] if arm in choice else 2e-4 for arm in ARMS}
    if rule is not None:
        rates = graded_rates(rates, rule["lower_rate"])
    options.cache.mkdir(parents=True, exist_ok=True)
    checkpoint = warm_model(options.cache)
    began = time.time()
    done = {(r["seed"], r["slot"]) for r in records if r["kind"] == "run"}
    with open(raw, "a") as sink:
        for index, seed in enumerate(seeds):
            for slot in ("alone", "copies") if index % 2 == 0 else ("copies", "alone"):
                if (seed, slot) in done:
                    continue
                if options.minutes is not None and time.time() - began > 60 * options.minutes:
                    break
                got = run_slot(slot, seed, rates, checkpoint, options.work / f"{options.stage}-{seed}" / slot,
                               index, steps)  # fmt: skip
                ttt.keep_slot(sink, records, got, f"seed {seed} {slot}", steps=True, slot_seconds=False)
        records += evaluate_pending(records, sink, checkpoint)
    return report(records, rule, options.stage)


def report(records: list[dict], rule: dict | None, stage: str) -> None:
    """The summary of `records` (and, for the pilot, the rule it gives): reads records only, runs nothing."""
    summarise(records, rule["offset"] if rule else None)
    if stage == "pilot":
        print(f"pilot rule (benchmarks/peer_gain.md, part B): {pilot_rule(records)}")


if __name__ == "__main__":
    main()
