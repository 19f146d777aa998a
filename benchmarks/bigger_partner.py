"""A smaller learner fed by a bigger partner: phi measured in steps, every arm at its best learning rate, with the
filter and the truncation switched off in turn. Pre-registered in `benchmarks/partner_and_regime.md` (part A),
committed before any graded run.

    OMP_NUM_THREADS=1 python benchmarks/bigger_partner.py --stage quick              # smoke test, seed 950
    OMP_NUM_THREADS=1 python benchmarks/bigger_partner.py --stage lr --minutes 55    # rates, on the dev split
    OMP_NUM_THREADS=1 python benchmarks/bigger_partner.py --stage grid --minutes 55  # the graded seeds
    python benchmarks/bigger_partner.py --stage grid --summary-only | tee benchmarks/results/bigger_partner-grid.txt

Hardware-free by construction (as `peer_gain.py`): fixed steps, snapshots every `CHECKPOINT_STEPS` steps, every
swarm lock-step. One slot a seed and rate: the nine processes below, placed on the two cores alternately.

    A_1, A_2        the learner (`small`, hidden 32) alone with B and 2B rows a step
    partner-alone   the partner (`wide`, hidden 80: 6.1x the parameters) alone with B rows
    f-tis, tis, nois  learner + partner, both training, lock-step, `variant` f-tis (the defaults), tis, nois

Outputs `benchmarks/results/bigger_partner-<stage>.jsonl` (kind "run" per process, "checkpoint" per evaluated
snapshot and split, "warm" per warm model and split). Resumable: recorded slots are skipped.
"""

from __future__ import annotations

import argparse
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
import time_to_target as ttt
from free_running import holm, t_interval, t_pvalue

LEARNER, PARTNER = "small", "wide"
OWN_ROWS = pg.OWN_ROWS
STEPS, CHECKPOINT_STEPS = 80, 4
RATES = (2e-5, 6e-5, 2e-4)
EDGE_RATES = {"low": (6e-6, 2e-6), "high": (6e-4, 2e-3)}  # the edge rule's extensions, in order
LR_SEEDS = (400, 401, 402)
GRID_SEEDS = tuple(range(12))
QUICK_SEED = 950
SWARMS = ("f-tis", "tis", "nois")
#: arm -> (judged process, rows a step).
ARMS = {
    "A_1": ("A_1", OWN_ROWS),
    "A_2": ("A_2", 2 * OWN_ROWS),
    "partner-alone": ("partner-alone", OWN_ROWS),
    **{arm: (f"{arm}-learner", OWN_ROWS) for arm in SWARMS},
}
LEARNER_ARMS = ("A_1", "A_2", *SWARMS)
PARTNERS = {"partner-alone": "partner-alone", **{arm: f"{arm}-partner" for arm in SWARMS}}
HOLM_ALPHA = 0.05


# ---- the slot -------------------------------------------------------------------------------------------------------
def slot_specs(seed: int, rates: dict[str, float], cache: Path, work: Path) -> dict[str, dict]:
    """The nine processes of a seed: name -> spec for `time_to_target.py --peer`. `rates`: arm -> rate."""
    learner = str(ttt.warm_checkpoint(cache, LEARNER, seed))
    partner = str(ttt.warm_checkpoint(cache, PARTNER, seed))

    def spec(name, arm, checkpoint, rows, index, ids=None):
        # index 0: the learner's prompt stream and sampling seed in every arm (paired); 1: the partner's.
        return {
            "slot": "all", "arm": arm, "seed": seed, "peer": name, "checkpoint": checkpoint, "rows": rows,
            "lr": rates[arm], "stream_seed": 10_000 * (seed + 1) + index, "sampling_seed": 100 * seed + index,
            "out": str(work / name), "max_steps": STEPS, "stop_seconds": None, "checkpoint_steps": CHECKPOINT_STEPS,
            "checkpoint_scale": 1, "exclude_dev": True,
            "exchange_url": f"dir://{work / ('exchange-' + arm)}" if ids else None, "mode": "sync" if ids else None,
            "expected_peers": ids, "peer_timeout": pg.PEER_TIMEOUT, "variant": arm if ids else None,
        }  # fmt: skip

    specs = [
        spec("A_1", "A_1", learner, OWN_ROWS, 0),
        spec("A_2", "A_2", learner, 2 * OWN_ROWS, 0),
        spec("partner-alone", "partner-alone", partner, OWN_ROWS, 1),
    ]
    for arm in SWARMS:
        ids = [f"{arm}-learner", f"{arm}-partner"]
        specs += [spec(ids[0], arm, learner, OWN_ROWS, 0, ids), spec(ids[1], arm, partner, OWN_ROWS, 1, ids)]
    return {s["peer"]: s for s in specs}


def run_slot(seed: int, rates: dict, cache: Path, work: Path, seed_index: int) -> list[dict]:
    specs = slot_specs(seed, rates, cache, ttt.fresh_folder(work))
    cores = {name: (position + seed_index) % 2 for position, name in enumerate(specs)}
    slot_seconds = ttt.launch_processes(specs, cores, work, f"seed {seed} {rates['key']}", timeout=3600)
    run_id = f"{seed}-{rates['key']}-{time.time_ns()}"
    return ttt.slot_records(specs, cores, run_id=run_id, seed=seed, slot="all", rate_key=rates["key"],
                            slot_wall_seconds=slot_seconds)  # fmt: skip


# ---- offline evaluation ---------------------------------------------------------------------------------------------
def latest_runs(records: list[dict]) -> dict:
    """(seed, rate_key, peer) -> the last run record of that process (`peer_gain.latest_runs`; one slot here)."""
    return {(seed, key, peer): run for (seed, key, _, peer), run in pg.latest_runs(records).items()}


def snapshot_key(record: dict, index: int, split: str) -> tuple:
    return (record["run_id"], record["peer"], index, split)


def evaluate_pending(records: list[dict], sink, cache: Path, splits: dict[str, tuple[str, ...]]) -> list[dict]:
    """Evaluate every snapshot of every process on its splits (`splits`: "learner", "partner" (alone) and
    "swarm-partner" -> splits) and every warm model on its splits, in two pinned workers; drop evaluated snapshot
    files."""
    done = {snapshot_key(r, r["index"], r["split"]) for r in records if r["kind"] == "checkpoint"}
    warm_done = {(r["seed"], r["model"], r["split"]) for r in records if r["kind"] == "warm"}
    items = []
    for run in latest_runs(records).values():
        role = "learner" if run["model"].startswith(f"carry-{LEARNER}-") else "partner"
        role = "swarm-partner" if run["peer"].endswith("-partner") else role
        for split in splits[role]:
            for snap in run["snapshots"]:
                weights = Path(run["out"]) / f"ckpt-{snap['index']}.pt"
                if snapshot_key(run, snap["index"], split) in done or not weights.exists():
                    continue
                record = {"kind": "checkpoint", "run_id": run["run_id"], "seed": run["seed"],
                          "rate_key": run["rate_key"], "slot": "all", "peer": run["peer"], "arm": run["arm"],
                          "split": split, **snap}  # fmt: skip
                items.append({"model": str(cache / run["model"]), "weights": str(weights), "record": record})
            if (run["seed"], run["model"], split) not in warm_done:
                warm_done.add((run["seed"], run["model"], split))
                record = {"kind": "warm", "seed": run["seed"], "model": run["model"], "split": split}
                items.append({"model": str(cache / run["model"]), "weights": None, "record": record})
    new = ttt.evaluate_items(items, __file__, sink, "ftis-partner-eval-")
    for item in items:
        if item["weights"]:
            Path(item["weights"]).unlink(missing_ok=True)
    return new


# ---- the analysis: pure functions of the records --------------------------------------------------------------------
def curves(records: list[dict], split: str, metric: str = "accuracy") -> dict:
    """(seed, rate_key, peer) -> [{step, accuracy}] (`peer_gain.curves`; one slot here)."""
    return {(seed, key, peer): points for (seed, key, _, peer), points in pg.curves(records, split, metric).items()}


def rate_table(records: list[dict]) -> dict[str, dict[float, dict]]:
    """arm -> rate -> {gain: mean over seeds of the judged process's mean dev gain, seeds, end_gains}."""
    curve = curves(records, "dev")
    seeds = sorted({r["seed"] for r in records if r["kind"] == "run"})
    table: dict = {}
    for arm, (peer, _) in ARMS.items():
        for key in sorted({r["rate_key"] for r in records if r["kind"] == "run"}, key=float):
            points = [curve.get((seed, key, peer)) for seed in seeds]
            points = [p for p in points if p and len(p) > 1]
            if points:
                table.setdefault(arm, {})[float(key)] = {
                    "gain": statistics.fmean(pg.mean_gain(p) for p in points),
                    "seeds": len(points),
                    "end_gains": [pg.end_gain(p) for p in points],
                }
    return table


def choose_rate(rates: dict[float, dict]) -> float:
    """The highest mean dev gain; ties (within 1e-9) to the lower rate."""
    return max(rates.items(), key=lambda item: (round(item[1]["gain"], 9), -item[0]))[0]


def rate_choice(records: list[dict]) -> dict[str, dict]:
    """arm -> {rate, table, edge}: the plan's rule on the rates run so far; `edge` names the extension the edge rule
    asks for next ("low"/"high"), None when the choice is inside the grid or the extensions are spent."""
    out = {}
    for arm, rates in rate_table(records).items():
        best = choose_rate(rates)
        tried = sorted(rates)
        edge = None
        if best == tried[0] and any(r not in tried for r in EDGE_RATES["low"]):
            edge = "low"
        elif best == tried[-1] and any(r not in tried for r in EDGE_RATES["high"]):
            edge = "high"
        out[arm] = {"rate": best, "table": rates, "edge": edge}
    return out


def extension_rates(choice: dict[str, dict]) -> list[float]:
    """The rates the edge rule adds next (for every arm at an edge: the first extension not run yet)."""
    out = set()
    for item in choice.values():
        if item["edge"]:
            out.add(next(r for r in EDGE_RATES[item["edge"]] if r not in item["table"]))
    return sorted(out)


def target_offset(choice: dict[str, dict]) -> float:
    item = choice["A_1"]
    return 0.5 * statistics.median(item["table"][item["rate"]]["end_gains"])


def summarise_lr(records: list[dict]) -> dict[str, dict]:
    choice = rate_choice(records)
    rates = sorted({float(r["rate_key"]) for r in records if r["kind"] == "run"})
    print(pg.cpu_hours(records))
    print("Learning-rate choice (dev split; mean gain over the warm model across the snapshots, mean over seeds "
          f"{sorted({r['seed'] for r in records if r['kind'] == 'run'})})")  # fmt: skip
    print("| arm | " + " | ".join(f"{r:g}" for r in rates) + " | chosen | edge rule |")
    print("|---|" + "---|" * len(rates) + "---|---|")
    for arm, item in choice.items():
        cells = [f"{item['table'][r]['gain']:+.3f} ({item['table'][r]['seeds']})" if r in item["table"] else "-"
                 for r in rates]  # fmt: skip
        print(f"| {arm} | " + " | ".join(cells) + f" | {item['rate']:g} | {item['edge'] or 'inside'} |")
    if "A_1" in choice:
        print(f"target offset: 0.5 x median A_1 end gain = {target_offset(choice):+.3f}")
    return choice


def paired(values: list[float]) -> dict:
    mean, low, high = t_interval(values)
    return {"mean": mean, "low": low, "high": high, "p": t_pvalue(values),
            "lower": sum(v < 0 for v in values), "higher": sum(v > 0 for v in values)}  # fmt: skip


def summarise_grid(records: list[dict], offset: float) -> dict:
    """The plan's analysis of part A on the test split (and `ood`)."""
    test, ood = curves(records, "test"), curves(records, "ood", "reward")
    runs = latest_runs(records)
    seeds = sorted({k[0] for k in test})
    complete = [s for s in seeds if all(len(test.get((s, "chosen", ARMS[a][0]), [])) > 1 for a in ARMS)
                and all(len(test.get((s, "chosen", PARTNERS[a]), [])) > 1 for a in PARTNERS)]  # fmt: skip
    print(pg.cpu_hours(records))
    print(f"split test; seeds with every arm evaluated: {len(complete)} ({complete}); target offset {offset:+.3f}")
    result: dict = {"complete_seeds": complete, "offset": offset}
    if len(complete) < 2:
        return result

    def points(seed, arm, curve=test):
        return curve[(seed, "chosen", ARMS[arm][0])]

    # Steps to target.
    steps = {}
    print(f"\nSteps to target (budget {STEPS}; censored runs count as {STEPS}) and own generated rows to target")
    print("| arm | restricted mean steps | censored | own rows a step | restricted mean own rows |")
    print("|---|---|---|---|---|")
    for arm in LEARNER_ARMS:
        found = [pg.steps_to_target(points(s, arm), points(s, arm)[0]["accuracy"] + offset, STEPS) for s in complete]
        steps[arm] = [f[0] for f in found]
        rows = ARMS[arm][1] if arm in ("A_1", "A_2") else OWN_ROWS
        mean = statistics.fmean(steps[arm])
        print(f"| {arm} | {mean:.1f} | {sum(f[1] for f in found)}/{len(found)} | {rows} | {mean * rows:.0f} |")
    ratios = {"beta_2: A_1 / A_2": ("A_1", "A_2")}
    for arm in SWARMS:
        ratios[f"{arm} / A_1"] = (arm, "A_1")
        ratios[f"{arm} / A_2"] = (arm, "A_2")
    logs = {
        name: [math.log(steps[a][i] / steps[b][i]) for i in range(len(complete))] for name, (a, b) in ratios.items()
    }
    adjusted = holm({name: t_pvalue(v) for name, v in logs.items()})
    print(f"\nSteps ratios (geometric mean, 95% t-interval on the log ratios, lower/higher, Holm over {len(logs)})")
    print("| comparison | ratio | 95% interval | lower / higher | Holm p | reading |")
    print("|---|---|---|---|---|---|")
    result["ratios"] = {}
    for name, values in logs.items():
        ratio, low, high = pg.geo_interval(values)
        p = adjusted.get(name, math.nan)
        reading = pg.steps_reading(ratio, p)
        result["ratios"][name] = {"ratio": ratio, "low": low, "high": high, "holm": p, "reading": reading}
        print(f"| {name} | {ratio:.2f} | [{low:.2f}, {high:.2f}] | {sum(v < 0 for v in values)} / "
              f"{sum(v > 0 for v in values)} | {p:.3g} | {reading} |")  # fmt: skip

    # phi.
    gains = {arm: [pg.mean_gain(points(s, arm)) for s in complete] for arm in LEARNER_ARMS}
    ends = {arm: [pg.end_gain(points(s, arm)) for s in complete] for arm in LEARNER_ARMS}
    print(f"\nphi (mean test gain across the snapshots; ratio of mean gains over seeds; bootstrap {pg.BOOTSTRAP})")
    print("| arm | phi | 95% interval | width | phi at the end (last 3) | mean gain | seeds for a 0.3-wide interval |")
    print("|---|---|---|---|---|---|---|")
    result["phi"] = {}
    for arm in SWARMS:
        triples = list(zip(gains[arm], gains["A_2"], gains["A_1"], strict=True))
        phi = pg.ratio_of_means_phi(triples)
        low, high = pg.bootstrap(triples, pg.ratio_of_means_phi)
        end = pg.ratio_of_means_phi(list(zip(ends[arm], ends["A_2"], ends["A_1"], strict=True)))
        width = high - low
        needed = "decisive" if width <= pg.DECISIVE_WIDTH else str(pg.seeds_for_width(len(complete), width))
        result["phi"][arm] = {"phi": phi, "low": low, "high": high, "end": end, "seeds_needed": needed}
        print(f"| {arm} | {phi:.2f} | [{low:.2f}, {high:.2f}] | {width:.2f} | {end:.2f} | "
              f"{statistics.fmean(gains[arm]):+.4f} | {needed} |")  # fmt: skip
    print("| A_1 / A_2 (for reference) | - | - | - | - | "
          f"{statistics.fmean(gains['A_1']):+.4f} / {statistics.fmean(gains['A_2']):+.4f} | - |")  # fmt: skip

    # Not in the plan (descriptive): the gain itself, since phi's denominator G_2 - G_1 can be near 0.
    tests = {f"{arm} - {base}": (arm, base) for arm in SWARMS for base in ("A_1", "A_2")}
    tests["A_2 - A_1"] = ("A_2", "A_1")
    print("\nDescriptive, not in the plan: the learner's mean test gain against its alone runs")
    result["gain_differences"] = _differences(tests, gains, "learner's mean test gain", len(complete))
    # H3: the filter and the truncation.
    tests = {"f-tis - tis (the filter)": ("f-tis", "tis"), "tis - nois (the truncation)": ("tis", "nois")}
    result["objective"] = _differences(tests, gains, "learner's mean test gain", len(complete))
    # H4: the partner.
    partner_gain = {arm: [pg.mean_gain(test[(s, "chosen", peer)]) for s in complete] for arm, peer in PARTNERS.items()}
    tests = {f"partner in {arm} - partner-alone": (arm, "partner-alone") for arm in SWARMS}
    result["partner"] = _differences(tests, partner_gain, "partner's mean test gain", len(complete))
    print("partner-alone mean test gain: " + f"{statistics.fmean(partner_gain['partner-alone']):+.4f}")
    # What the filter dropped and kept.
    print("\nPeer rows a step and the objective's statistics (means over steps and seeds)")
    print("| process | peer rows in loss a step | zeroed by the filter a step | filtered_frac | is_weight_mean | "
          "capped_frac | kl_mean (D) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    result["peer_rows"] = {}
    for arm in SWARMS:
        for peer in (f"{arm}-learner", f"{arm}-partner"):
            rs = [runs[(s, "chosen", peer)] for s in complete]
            row = {
                "in_loss": statistics.fmean((r.get("peer_rows_in_loss") or 0) / r["steps"] for r in rs),
                "zeroed": statistics.fmean((r.get("rows_filtered") or 0) / r["steps"] for r in rs),
                **{k: _logged(rs, f"ftis/peer/{k}") for k in ("filtered_frac", "is_weight_mean",
                                                             "is_weight_capped_frac", "kl_mean")},
            }  # fmt: skip
            result["peer_rows"][peer] = row
            cells = [f"{row[k]:.3f}" if row[k] is not None else "-" for k in
                     ("filtered_frac", "is_weight_mean", "is_weight_capped_frac", "kl_mean")]  # fmt: skip
            print(f"| {peer} | {row['in_loss']:.1f} of {OWN_ROWS} | {row['zeroed']:.2f} | " + " | ".join(cells) + " |")
    # OOD.
    ood_gain = {arm: [pg.mean_gain(points(s, arm, ood)) for s in complete] for arm in LEARNER_ARMS}
    tests = {f"{arm} - {base}": (arm, base) for arm in SWARMS for base in ("A_1", "A_2")}
    print("\nOut of distribution (graded reward on `ood`)")
    result["ood"] = _differences(tests, ood_gain, "learner's mean ood reward gain", len(complete))
    return result


def _logged(runs: list[dict], key: str) -> float | None:
    values = [r["logged_means"][key] for r in runs if key in (r.get("logged_means") or {})]
    return statistics.fmean(values) if values else None


def _differences(tests: dict[str, tuple[str, str]], values: dict[str, list[float]], what: str, seeds: int) -> dict:
    """Paired differences of `what` per test, t-intervals, Holm over the tests; printed as a table."""
    diffs = {name: [x - y for x, y in zip(values[a], values[b], strict=True)] for name, (a, b) in tests.items()}
    adjusted = holm({name: t_pvalue(v) for name, v in diffs.items()})
    print(f"\n{what}: paired differences over {seeds} seeds (95% t-interval, lower/higher, Holm over {len(diffs)})")
    print("| comparison | difference | 95% interval | lower / higher | Holm p | reading |")
    print("|---|---|---|---|---|---|")
    out = {}
    for name, v in diffs.items():
        item = paired(v)
        item["holm"] = adjusted.get(name, math.nan)
        item["reading"] = "not distinguishable" if not item["holm"] < HOLM_ALPHA else (
            "above 0" if item["mean"] > 0 else "below 0")  # fmt: skip
        out[name] = item
        print(f"| {name} | {item['mean']:+.4f} | [{item['low']:+.4f}, {item['high']:+.4f}] | {item['lower']} / "
              f"{item['higher']} | {item['holm']:.3g} | {item['reading']} |")  # fmt: skip
    return out


def summarise_quick(records: list[dict]) -> None:
    for split, metric in (("dev", "accuracy"), ("test", "accuracy"), ("ood", "reward")):
        for (seed, rate, peer), points in sorted(curves(records, split, metric).items()):
            print(
                f"{split} {metric} seed {seed} lr {rate} {peer}: " + " ".join(f"{p['accuracy']:.2f}" for p in points)
            )
    for run in latest_runs(records).values():
        logged = run.get("logged_means") or {}
        print(
            f"{run['peer']}: {run['steps']} steps, {run['train_clock']:.0f} s, peer rows in loss "
            f"{run.get('peer_rows_in_loss')}, filtered {run.get('rows_filtered')}, "
            f"filtered_frac {logged.get('ftis/peer/filtered_frac')}, w {logged.get('ftis/peer/is_weight_mean')}"
        )


# ---- main -----------------------------------------------------------------------------------------------------------
def main() -> None:
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=("quick", "lr", "grid"), default="grid")
    pg.add_run_arguments(parser, "ftis-partner-work")
    options = parser.parse_args()
    if options.evaluate:
        return pg.evaluate_worker(options.evaluate)
    raw = RESULTS / f"bigger_partner-{options.stage}.jsonl"
    records = pg.load(raw)
    if options.stage == "quick":
        STEPS = 8
    stage_seeds = {"quick": (QUICK_SEED,), "lr": LR_SEEDS, "grid": GRID_SEEDS}[options.stage]
    seeds = ttt.parse_seeds(options.seeds) if options.seeds else list(stage_seeds)
    if not set(seeds) <= set(stage_seeds):
        raise SystemExit(f"the {options.stage} stage's seeds are {stage_seeds}")
    # The rate stage evaluates the judged processes only; the grid every process (the partner's H4).
    splits = {"learner": ("dev",), "partner": ("dev",), "swarm-partner": ()}
    if options.stage == "grid":
        splits = {"learner": ("test", "ood"), "partner": ("test",), "swarm-partner": ("test",)}
    if options.stage == "quick":
        splits = {"learner": ("dev", "test", "ood"), "partner": ("test",), "swarm-partner": ("test",)}
    lr_records = pg.load(RESULTS / "bigger_partner-lr.jsonl")
    if options.stage == "grid":
        choice = rate_choice(lr_records)
        missing = [a for a in ARMS if a not in choice or choice[a]["edge"]
                   or choice[a]["table"][choice[a]["rate"]]["seeds"] < len(LR_SEEDS)]  # fmt: skip
        if missing:
            raise SystemExit(f"the learning-rate stage is not complete for {missing}: run --stage lr first")
        settings = [{"key": "chosen", **{arm: choice[arm]["rate"] for arm in ARMS}}]
    elif options.stage == "lr":
        rates = list(RATES) + extension_rates(rate_choice(lr_records)) if lr_records else list(RATES)
        settings = [{"key": f"{rate:g}", **dict.fromkeys(ARMS, rate)} for rate in sorted(set(rates))]
    else:
        settings = [{"key": "2e-4", **dict.fromkeys(ARMS, 2e-4)}]
    if not options.summary_only:
        print(ttt.run_header(), flush=True)
        began = time.time()
        options.cache.mkdir(parents=True, exist_ok=True)
        ttt.build_warm(options.cache, seeds, [], names=[LEARNER, PARTNER])
        done = {(r["seed"], r["rate_key"]) for r in records if r["kind"] == "run"}
        RESULTS.mkdir(exist_ok=True)
        with open(raw, "a") as sink:
            for index, seed in enumerate(seeds):
                for rates in settings:
                    if (seed, rates["key"]) in done:
                        continue
                    if options.minutes is not None and time.time() - began > 60 * options.minutes:
                        break
                    work = options.work / f"{options.stage}-seed{seed}-{rates['key']}"
                    got = run_slot(seed, rates, options.cache, work, index)
                    ttt.keep_slot(sink, records, got, f"seed {seed} lr {rates['key']}", steps=False, slot_seconds=True)
                    records += evaluate_pending(records, sink, options.cache, splits)
            records += evaluate_pending(records, sink, options.cache, splits)
        print(f"stage {options.stage}: {time.time() - began:.0f} s this invocation", flush=True)
    if options.stage == "quick":
        summarise_quick(records)
    elif options.stage == "lr":
        choice = summarise_lr(records)
        if extension_rates(choice):
            print(f"edge rule: run --stage lr again for the rates {extension_rates(choice)}")
    else:
        choice = summarise_lr(lr_records)
        summarise_grid(records, target_offset(choice))


if __name__ == "__main__":
    main()
