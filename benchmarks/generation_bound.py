"""The generation-bound regime, by emulation: wall time to a target of two free-running copies against training
alone, with generation held by an emulated engine (`generation_cost.py`) so that an A_2 step is 80% generation, and
the calculator's prediction from the same runs' measured factors beside it. Pre-registered in
`benchmarks/partner_and_regime.md` (part B), committed before any graded run.

    OMP_NUM_THREADS=1 python benchmarks/generation_bound.py --stage calibrate        # seed 960: a and b
    OMP_NUM_THREADS=1 python benchmarks/generation_bound.py --stage grid --point 1   # s = 1.9, seeds 0-7
    OMP_NUM_THREADS=1 python benchmarks/generation_bound.py --stage grid --point 2   # s = 1.3, seeds 0-3
    python benchmarks/generation_bound.py --stage grid --point 1 --summary-only

The machine to itself: two slots a seed, [A_2, A_1] and [copy a, copy b] (`exchange_mode="free"`), one process a
core, a start barrier, ABBA slot order, cores swapped between even and odd seeds. Snapshots every `CHECKPOINT_STEPS`
steps stamped with the training clock (off the clock), evaluated offline on the test split. Every time below is an
emulated engine's: the real tokens are generated, then each call is held to `tokens x (a + b x rows)` seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import peer_gain as pg
import peer_gain_wall as pgw
import time_to_target as ttt
from free_running import t_interval
from generation_cost import GenerationCost

OWN_ROWS = pg.OWN_ROWS
STEPS, CHECKPOINT_STEPS = 120, 4
CALIBRATION_SEED, CALIBRATION_STEPS, CALIBRATION_FROM = 960, 30, 6
GENERATION_SHARE = 0.8  # an A_2 step's generation share the hold aims at
POINTS = {1: {"growth": 1.9, "seeds": tuple(range(8))}, 2: {"growth": 1.3, "seeds": tuple(range(4))}}
TARGET_OFFSET = 0.063  # peer_gain.md's target offset (results/peer_gain-grid.txt)
RATE = 6e-5  # peer_gain.md's choice for A_1, A_2 and copy-2
PEER_TIMEOUT = 60
ARMS = {"A_2": ("alone", ("A_2",)), "A_1": ("alone", ("A_1",)), "copy-2": ("copies", ("a", "b"))}
OVERRUN_LIMIT = 0.05


def slot_specs(slot: str, seed: int, cache: Path, work: Path, steps: int, cost: dict | None) -> dict[str, dict]:
    checkpoint = str(ttt.warm_checkpoint(cache, "big", seed))

    def spec(name, arm, rows, index, ids=None):
        return {
            "slot": slot, "arm": arm, "seed": seed, "peer": name, "checkpoint": checkpoint, "rows": rows, "lr": RATE,
            "stream_seed": 10_000 * (seed + 1) + index, "sampling_seed": 100 * seed + index, "out": str(work / name),
            "max_steps": steps, "stop_seconds": None, "checkpoint_steps": CHECKPOINT_STEPS, "checkpoint_scale": 1,
            "exclude_dev": True, "exchange_url": f"dir://{work / 'exchange'}" if ids else None,
            "mode": "free" if ids else None, "expected_peers": ids, "peer_timeout": PEER_TIMEOUT,
            "generation_cost": cost,
        }  # fmt: skip

    if slot == "alone":
        return {"A_2": spec("A_2", "A_2", 2 * OWN_ROWS, 0), "A_1": spec("A_1", "A_1", OWN_ROWS, 0)}
    ids = ["a", "b"]
    return {name: spec(name, "copy-2", OWN_ROWS, i, ids) for i, name in enumerate(ids)}


def run_slot(slot, seed, cache, work, index, steps, cost, **fields) -> list[dict]:
    """Two processes, one a core (swapped between even and odd seeds), behind one start barrier."""
    specs = slot_specs(slot, seed, cache, ttt.fresh_folder(work), steps, cost)
    cores = {name: (position + index) % 2 for position, name in enumerate(specs)}
    seconds = ttt.launch_processes(specs, cores, work, f"{slot} seed {seed}", timeout=3600)
    return ttt.slot_records(specs, cores, seed=seed, slot=slot, slot_wall_seconds=seconds, **fields)


# ---- calibration ----------------------------------------------------------------------------------------------------
def per_step(run: dict, first: int) -> tuple[list[float], list[float]]:
    """(step seconds, generation seconds) of each step from `first` on, from the run's `step_log`."""
    log = run["step_log"]
    steps, generation = [], []
    for (_, clock0, gen0), (step, clock1, gen1) in itertools.pairwise(log):
        if step >= first:
            steps.append(clock1 - clock0)
            generation.append(gen1 - gen0)
    return steps, generation


def calibration(records: list[dict]) -> dict:
    """The plan's calibration from the unheld A_2 run: `rest` (median step less generation, steps 6-30), `tokens`
    (median decode steps of its calls), and each point's cost: a 2B-row call held 4 x rest, growing s-fold."""
    run = next(r for r in records if r["kind"] == "run" and r["peer"] == "A_2")
    steps, generation = per_step(run, CALIBRATION_FROM)
    rest = statistics.median(s - g for s, g in zip(steps, generation, strict=True))
    tokens = run["held_generation"]["median_tokens"]
    full = rest * GENERATION_SHARE / (1 - GENERATION_SHARE)
    costs = {}
    for point, item in POINTS.items():
        cost = GenerationCost.calibrated(full, tokens, 2 * OWN_ROWS, item["growth"])
        costs[point] = {"a": cost.a, "b": cost.b}
    return {"rest": rest, "tokens": tokens, "held_full": full,
            "real_generation": statistics.median(generation), "costs": costs}  # fmt: skip


# ---- evaluation and analysis ----------------------------------------------------------------------------------------
def evaluate_pending(records: list[dict], sink, cache: Path) -> list[dict]:
    done = {(r["seed"], r["peer"], r["index"]) for r in records if r["kind"] == "checkpoint"}
    warm_done = {r["seed"] for r in records if r["kind"] == "warm"}
    items = []
    for run in (r for r in records if r["kind"] == "run"):
        model = str(cache / run["model"])
        if run["seed"] not in warm_done:
            warm_done.add(run["seed"])
            items.append({"model": model, "weights": None, "record": {"kind": "warm", "seed": run["seed"],
                                                                       "split": "test"}})  # fmt: skip
        for snap in run["snapshots"]:
            weights = Path(run["out"]) / f"ckpt-{snap['index']}.pt"
            if (run["seed"], run["peer"], snap["index"]) in done or not weights.exists():
                continue
            record = {"kind": "checkpoint", "seed": run["seed"], "slot": run["slot"], "arm": run["arm"],
                      "peer": run["peer"], "split": "test", **snap}  # fmt: skip
            items.append({"model": model, "weights": str(weights), "record": record})
    new = ttt.evaluate_items(items, __file__, sink, "ftis-bound-eval-")
    for item in items:
        if item["weights"]:
            Path(item["weights"]).unlink(missing_ok=True)
    return new


def curves(records: list[dict]) -> dict:
    """(seed, peer) -> [{step, clock, accuracy}] by step, the seed's warm accuracy at step 0 and clock 0."""
    warm = {r["seed"]: r["accuracy"] for r in records if r["kind"] == "warm"}
    out: dict = {}
    for r in records:
        if r["kind"] == "checkpoint":
            out.setdefault((r["seed"], r["peer"]), []).append(
                {"step": r["step"], "clock": r["clock"], "accuracy": r["accuracy"]}
            )
    for (seed, _), points in out.items():
        points.sort(key=lambda p: p["step"])
        if seed in warm:
            points.insert(0, {"step": 0, "clock": 0.0, "accuracy": warm[seed]})
    return out


def arm_run(run: dict):
    """`trl_ftis.joining.ArmRun` per step from the benchmark's own clock: its generation seconds include the hold."""
    from trl_ftis.joining import ArmRun

    steps = run["steps"]
    exchange = sum(e[2] for e in run["time_log"])
    return ArmRun(steps=steps, step_seconds=run["train_clock"] / steps, generation_seconds=run["generation_seconds"]
                  / steps, exchange_seconds=exchange / steps, own_rows=run["rows"])  # fmt: skip


def factors(records: list[dict]) -> dict[int, dict]:
    """Per seed, `trl_ftis.joining.hardware_factors` of each copy against A_1 and A_2, the mean over the copies."""
    from trl_ftis.joining import hardware_factors

    runs = {(r["seed"], r["peer"]): r for r in records if r["kind"] == "run"}
    out = {}
    for seed in sorted({k[0] for k in runs}):
        if not all((seed, p) in runs for p in ("A_2", "A_1", "a", "b")):
            continue
        full, alone = arm_run(runs[(seed, "A_2")]), arm_run(runs[(seed, "A_1")])
        each = [hardware_factors(arm_run(runs[(seed, p)]), alone, full) for p in ("a", "b")]
        out[seed] = {key: statistics.fmean(e[key] for e in each) for key in each[0]}
    return out


def staleness(records: list[dict]) -> dict:
    """The copies' peer rows trained on, by age in rounds (summed over runs), and their mean age."""
    ages: dict[int, int] = {}
    for r in records:
        if r["kind"] == "run" and r["arm"] == "copy-2":
            for age, count in (r.get("peer_row_ages") or {}).items():
                ages[int(age)] = ages.get(int(age), 0) + count
    total = sum(ages.values())
    return {"ages": dict(sorted(ages.items())), "mean": sum(a * c for a, c in ages.items()) / total if total else None}


def interval_line(name: str, logs: list[float]) -> dict:
    mean, low, high = t_interval(logs)
    item = {"ratio": math.exp(mean), "low": math.exp(low), "high": math.exp(high),
            "lower": sum(v < 0 for v in logs), "higher": sum(v > 0 for v in logs), "seeds": len(logs)}  # fmt: skip
    print(f"| {name} | {item['ratio']:.2f} | [{item['low']:.2f}, {item['high']:.2f}] | {item['lower']} / "
          f"{item['higher']} |")  # fmt: skip
    return item


def summarise(records: list[dict], point: int) -> dict:
    """The plan's analysis of one point, from its records only."""
    from trl_ftis.pays import hardware_from_measured, step_ratio, wall_ratio_range, wall_ratios

    curve = curves(records)
    runs = {(r["seed"], r["peer"]): r for r in records if r["kind"] == "run"}
    seeds = sorted({k[0] for k in curve})
    warm = {r["seed"]: r["accuracy"] for r in records if r["kind"] == "warm"}
    result: dict = {"point": point}
    print(f"point {point} (emulated engine, s = {POINTS[point]['growth']}); seeds {seeds}")
    held = [r["held_generation"] for r in runs.values() if r.get("held_generation")]
    calls, overruns = sum(h["calls"] for h in held), sum(h["overruns"] for h in held)
    print(
        f"held calls {calls}, overruns {overruns} ({overruns / max(calls, 1):.1%}); real generation "
        f"{sum(h['real_seconds'] for h in held):.0f} s of {sum(h['held_seconds'] for h in held):.0f} s held"
    )
    result["overrun_share"] = overruns / max(calls, 1)
    times = {}
    for seed in seeds:
        if seed not in warm:
            continue
        target = warm[seed] + TARGET_OFFSET
        for arm, (_, peers) in ARMS.items():
            got = [pgw.time_to_target(curve[(seed, p)], target) for p in peers if (seed, p) in curve]
            if len(got) == len(peers):
                times[(seed, arm)] = got
    complete = [s for s in seeds if all((s, arm) in times for arm in ARMS)]
    result["complete"] = complete
    print(f"target: warm test accuracy + {TARGET_OFFSET}; complete seeds {complete}")
    if len(complete) < 2:
        return result
    print("\n| arm | restricted mean time to target (s, emulated) | restricted mean steps | censored |")
    print("|---|---|---|---|")
    restricted = {}
    for arm in ARMS:
        got = [t for s in complete for t in times[(s, arm)]]
        restricted[arm] = statistics.fmean(t for t, _, _ in got)
        print(f"| {arm} | {restricted[arm]:.1f} | {statistics.fmean(st for _, st, _ in got):.1f} | "
              f"{sum(c for _, _, c in got)}/{len(got)} |")  # fmt: skip
    better = min(("A_2", "A_1"), key=lambda arm: restricted[arm])
    result["better"] = better

    def logs(arm, base, index):
        return [statistics.fmean(math.log(t[index]) for t in times[(s, arm)]) - math.log(times[(s, base)][0][index])
                for s in complete]  # fmt: skip

    print(f"\nMeasured (emulated engine), geometric means over {len(complete)} seeds, 95% t-interval; better alone: "
          f"{better}")  # fmt: skip
    print("| ratio | value | 95% interval | lower / higher |")
    print("|---|---|---|---|")
    result["measured"] = {}
    for base in ("A_2", "A_1"):
        wall, steps = logs("copy-2", base, 0), logs("copy-2", base, 1)
        result["measured"][base] = {
            "wall": interval_line(f"wall time copy-2 / {base}", wall),
            "steps": interval_line(f"  steps copy-2 / {base}", steps),
            "step": interval_line(
                f"  seconds a step copy-2 / {base}", [w - s for w, s in zip(wall, steps, strict=True)]
            ),
        }
    result["measured"]["better"] = result["measured"][better]
    hardware_seeds = factors(records)
    means = {key: statistics.fmean(f[key] for f in hardware_seeds.values() if f[key] is not None)
             for key in ("f", "s", "q", "r", "g", "t", "step_ratio")}  # fmt: skip
    print("\nHardware factors (means over seeds; measured on this point's runs, emulated engine): " +
          ", ".join(f"{k} {v:.3f}" for k, v in means.items()))  # fmt: skip
    stale = staleness(records)
    print(f"copies' peer rows by age in rounds: {stale['ages']}; mean age {stale['mean']}")
    exchange_wait = [r.get("exchange_blocking_seconds") for r in runs.values() if r["arm"] == "copy-2"]
    exchange_wait = [w for w in exchange_wait if w is not None]
    if exchange_wait:
        print(f"copies' exchange blocking seconds a run: mean {statistics.fmean(exchange_wait):.2f}")
    result["factors"], result["staleness"] = means, stale
    learning = pgw.part_a_learning()
    if learning is None:
        print("no part-A learning records: no prediction")
        return result
    hardware = hardware_from_measured(means, peers=2)
    point_values = wall_ratios(hardware, learning["phi"][0], learning["beta"][0])
    ranges = wall_ratio_range(hardware, learning["phi"][1:], learning["beta"][1:])
    key = {"A_2": "vs_full", "A_1": "vs_own"}
    print(f"\nPredicted (trl_ftis.pays: these factors; phi {learning['phi']} and beta_2 {learning['beta']} of "
          f"peer_gain.md's copy-2 over {learning['seeds']} seeds)")  # fmt: skip
    print("| comparison | predicted | predicted range | measured | holds |")
    print("|---|---|---|---|---|")
    result["predicted"] = {}
    for base in ("A_2", "A_1", "better"):
        name = better if base == "better" else base
        k = key[name]
        measured = result["measured"][name]["wall"]
        holds = pgw.prediction_holds((measured["low"], measured["high"]), ranges[k])
        result["predicted"][base] = {"point": point_values[k], "range": ranges[k], "holds": holds}
        label = f"copy-2 / {name}" + (" (better alone)" if base == "better" else "")
        print(
            f"| {label} | {point_values[k]:.2f} | [{ranges[k][0]:.2f}, {ranges[k][1]:.2f}] | "
            f"{measured['ratio']:.2f} [{measured['low']:.2f}, {measured['high']:.2f}] | {'yes' if holds else 'no'} |"
        )
    formula = step_ratio(means["f"], means["s"], means["r"], g=means["g"], t=means["t"])
    print(f"predicted step ratio copy-2 / A_2 from f, s, r, g, t (trl_ftis.pays.step_ratio): {formula:.3f}; "
          f"measured (whole runs) {means['step_ratio']:.3f}")  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=("quick", "calibrate", "grid"), default="grid")
    parser.add_argument("--point", type=int, choices=sorted(POINTS), default=1)
    pg.add_run_arguments(parser, "ftis-bound-work")
    options = parser.parse_args()
    if options.evaluate:
        return pg.evaluate_worker(options.evaluate)
    calibration_file = RESULTS / "generation_bound-calibration.jsonl"
    if options.stage == "calibrate":
        raw, seeds, steps, cost, slots = calibration_file, [CALIBRATION_SEED], CALIBRATION_STEPS, None, ["alone"]
    elif options.stage == "quick":
        raw, seeds, steps, slots = RESULTS / "generation_bound-quick.jsonl", [990], 12, ["alone", "copies"]
        cost = {"a": 0.0005, "b": 0.0001}
    else:
        found = pg.load(calibration_file)
        if not any(r["kind"] == "run" for r in found):
            raise SystemExit("run --stage calibrate first")
        cost = calibration(found)["costs"][options.point]
        raw, steps, slots = RESULTS / f"generation_bound-point{options.point}.jsonl", STEPS, ["alone", "copies"]
        seeds = ttt.parse_seeds(options.seeds) if options.seeds else list(POINTS[options.point]["seeds"])
    records = pg.load(raw)
    if not options.summary_only:
        print(ttt.run_header(f"; cost {cost}"), flush=True)
        options.cache.mkdir(parents=True, exist_ok=True)
        ttt.build_warm(options.cache, seeds, [], names=["big"])
        began = time.time()
        done = {(r["seed"], r["slot"]) for r in records if r["kind"] == "run"}
        # The calibration records a tiny hold only to count decode steps (20 x 64e-9 s a call).
        run_cost = cost or {"a": 0.0, "b": 1e-9}
        with open(raw, "a") as sink:
            for index, seed in enumerate(seeds):
                for slot in slots if index % 2 == 0 else list(reversed(slots)):
                    if (seed, slot) in done:
                        continue
                    if options.minutes is not None and time.time() - began > 60 * options.minutes:
                        break
                    got = run_slot(slot, seed, options.cache, options.work / f"{options.stage}-{seed}" / slot,
                                   index, steps, run_cost, point=options.point)  # fmt: skip
                    ttt.keep_slot(sink, records, got, f"seed {seed} {slot}", steps=True, slot_seconds=False)
            if options.stage != "calibrate":
                records += evaluate_pending(records, sink, options.cache)
    if options.stage == "calibrate":
        print(json.dumps(calibration(records)))
    else:
        summarise(records, options.point)


if __name__ == "__main__":
    main()
