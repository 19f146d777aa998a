"""What a peer gains: phi and beta measured in steps, every arm at its best learning rate. Pre-registered in
`benchmarks/peer_gain.md` (hypotheses, arms, rules, analysis, decision rule), committed before any graded run.

    OMP_NUM_THREADS=1 python benchmarks/peer_gain.py --stage pilot             # seeds 900, 901: sizes the plan
    OMP_NUM_THREADS=1 python benchmarks/peer_gain.py --stage lr --minutes 55   # learning-rate choice, on the dev split
    OMP_NUM_THREADS=1 python benchmarks/peer_gain.py --stage grid --minutes 55 # the graded seeds, at the chosen rates
    python benchmarks/peer_gain.py --stage grid --summary-only | tee benchmarks/results/peer_gain-grid.txt

Hardware-free by construction. Every run trains for a fixed number of optimizer steps (`STEPS`) and is snapshot every
`CHECKPOINT_STEPS` steps; every swarm is lock-step (`exchange_mode="sync"`, a round waits up to `PEER_TIMEOUT` for
every expected peer), so which rows a step trains on does not depend on how fast a process runs. Steps and own
generated rows to a target, and accuracy at equal steps, are therefore properties of learning alone: the slots may
share the cores however they like. The wall time of a step is measured elsewhere (`benchmarks/frontier.py`, and the
wall-time part of the plan) and combined with these by `trl_ftis.pays`.

Task, models and training (`time_to_target.py`'s processes, step-clocked): carry-chain addition of two 2-digit
numbers, 20 completion tokens; a tiny Llama (hidden 64, 2 layers) warmed per seed to 25% dev accuracy (`big`) and a
hidden-32 one warmed to 15% (`small`); GRPO with `FTISTrainer` (F-TIS defaults), 8 completions a prompt, B = 32 own
rows a step, beta 0, constant learning rate. No training stream contains a dev-split problem (`exclude_dev`), so the
dev split is fit for choosing learning rates.

Arms (P = 2 and P = 4; the judged peers run the `big` model of the seed):
    A_1        alone, B rows a step: the same own generation as a swarm peer (A_N/P for both P)
    A_2, A_4   alone, 2B / 4B rows a step: as many rows as a swarm peer of P = 2 / 4 trains on (A_N)
    copy-P     P copies of `big`, each its own prompt stream and sampling seed, lock-step; judged: every copy
    hetero-P   `big` next to P - 1 `small` partners (hidden 32), all training, lock-step; judged: `big` (the
               direction a recent paper reports collapsing for truncated IS: a bigger learner fed by smaller
               partners' rows)
Slots (4 processes each, two per core: every process of every arm shares its core with exactly one other):
    alone      A_4, A_1, A_2, A_1-small (the small model alone, so that the slot packs like the others)
    pairs      copy-2 (2 processes) and hetero-2 (2), two swarms on two exchanges
    copy-4     4 processes;  hetero-4  4 processes

Outputs: `benchmarks/results/peer_gain-<stage>.jsonl` (kind "run" per process, "checkpoint" per evaluated snapshot and
split, "warm" per warm model and split). Resumable: recorded slots are skipped, evaluated snapshots not evaluated
again; `--minutes` stops starting slots after that many minutes, then evaluates what was trained.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import time_to_target as ttt
from free_running import holm, t_interval, t_pvalue

OWN_ROWS = 32
STEPS = 80  # the pilot (150 steps, snapshots every 10) plateaued after about 70 steps at 6e-5
CHECKPOINT_STEPS = 4
RATES = (2e-5, 6e-5, 2e-4, 6e-4)
PEER_TIMEOUT = 900  # lock-step rounds wait for every peer however loaded the machine is
PILOT_SEEDS = (900, 901)
PILOT_RATES = (6e-5, 2e-4)
LR_SEEDS = (300, 301, 302)
GRID_SEEDS = tuple(range(16))
SLOTS = ("alone", "pairs", "copy-4", "hetero-4")
#: arm -> (slot, judged processes, P). P = 1 for A_1; the alone arm with P x B rows is A_P.
ARMS = {
    "A_1": ("alone", ("A_1",), 1),
    "A_2": ("alone", ("A_2",), 2),
    "A_4": ("alone", ("A_4",), 4),
    "copy-2": ("pairs", ("copy2-a", "copy2-b"), 2),
    "hetero-2": ("pairs", ("hetero2-big",), 2),
    "copy-4": ("copy-4", ("copy4-a", "copy4-b", "copy4-c", "copy4-d"), 4),
    "hetero-4": ("hetero-4", ("hetero4-big",), 4),
}
SWARM_ARMS = ("copy-2", "hetero-2", "copy-4", "hetero-4")
#: Processes evaluated at their last snapshot only (descriptive: the small partners and the small model alone).
DESCRIPTIVE = {("alone", "A_1-small"), ("pairs", "hetero2-small"), ("hetero-4", "hetero4-small1")}
OOD_SIZE = 500
#: The target: each seed's warm test accuracy + TARGET_FRACTION x the median gain of A_1 (its chosen rate) on the
#: dev split at the end of the learning-rate seeds' budget (mean of the last 3 snapshots).
TARGET_FRACTION = 0.5
BOOTSTRAP = 10_000
DECISIVE_WIDTH = 0.3  # the plan calls phi decisive where its interval is at most this wide


# ---- the evaluation splits -----------------------------------------------------------------------------------------
def split_problems(split: str) -> list[dict]:
    """dev: every 2-digit dev-split problem; test: the 822 held-out 2-digit problems (`time_to_target.held_out`);
    ood: `OOD_SIZE` problems with operands of lengths never trained on (a 1-digit and a 2-digit number, either
    order); ood3: `OOD_SIZE` held-out 3-digit problems (longer operands). Each in a fixed order."""
    from trl_ftis.tasks.addition import in_dev_split
    from trl_ftis.tasks.carry_chain import carry_chain, carry_chain_problems

    def problems(pairs):
        return [{"prompt": f"{a}+{b}=", "answer": str(a + b), "chain": carry_chain(a, b)} for a, b in pairs]

    if split == "test":
        return ttt.held_out()
    if split == "dev":
        out = problems((a, b) for a in range(10, 100) for b in range(10, 100) if in_dev_split(f"{a}+{b}="))
        random.Random(0).shuffle(out)
        return out
    if split == "ood":
        pairs = [(a, b) for a in range(1, 10) for b in range(10, 100)] + [
            (a, b) for a in range(10, 100) for b in range(1, 10)
        ]
        random.Random(0).shuffle(pairs)
        return problems(pairs[:OOD_SIZE])
    if split == "ood3":
        return carry_chain_problems(OOD_SIZE, seed=7, digits=3, split="test")
    raise ValueError(split)


def evaluate_worker(job_path: str) -> None:
    """Evaluate the snapshots listed in `job` (JSON) on their split, one JSON line each on stdout: the exact-answer
    accuracy of the greedy completion and its mean carry-chain reward (graded: right steps count)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_ftis.tasks.addition import greedy_texts
    from trl_ftis.tasks.carry_chain import carry_chain_reward, final_answer, max_chain_tokens

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    tok, problems, models = ttt.tokenizer(), {}, {}
    for item in job["items"]:
        split = item["record"]["split"]
        if split not in problems:
            problems[split] = split_problems(split)
        if item["model"] not in models:
            model = AutoModelForCausalLM.from_pretrained(item["model"])
            models[item["model"]] = (model, {k: v.clone() for k, v in model.state_dict().items()})
        model, warm = models[item["model"]]
        model.load_state_dict(torch.load(item["weights"]) if item.get("weights") else warm)
        batch = problems[split]
        length = max_chain_tokens(max(len(x) for p in batch for x in p["prompt"][:-1].split("+")))
        texts = greedy_texts(model, tok, [p["prompt"] for p in batch], max_new_tokens=length, batch_size=256)
        right = sum(";" in t and final_answer(t) == p["answer"] for t, p in zip(texts, batch, strict=True))
        rewards = carry_chain_reward(texts, [p["answer"] for p in batch], [p["chain"] for p in batch])
        record = {**item["record"], "accuracy": right / len(batch), "reward": statistics.fmean(rewards)}
        print(json.dumps({**record, "eval_size": len(batch)}), flush=True)


# ---- the slots -----------------------------------------------------------------------------------------------------
def slot_specs(slot: str, seed: int, rates: dict[str, float], cache: Path, work: Path) -> dict[str, dict]:
    """The four processes of `slot` for `seed`: name -> spec for `time_to_target.py --peer`. `rates`: arm -> rate."""
    big = str(ttt.warm_checkpoint(cache, "big", seed))
    small = str(ttt.warm_checkpoint(cache, "small", seed))

    def spec(name, arm, checkpoint, rows, index, exchange=None, ids=None):
        return {
            "slot": slot,
            "arm": arm,
            "seed": seed,
            "peer": name,
            "checkpoint": checkpoint,
            "rows": rows,
            "lr": rates[arm],
            "stream_seed": 10_000 * (seed + 1) + index,
            "sampling_seed": 100 * seed + index,
            "out": str(work / name),
            "max_steps": STEPS,
            "stop_seconds": None,
            "checkpoint_steps": CHECKPOINT_STEPS,
            "checkpoint_scale": 1,
            "exclude_dev": True,
            "exchange_url": f"dir://{work / ('exchange-' + exchange)}" if exchange else None,
            "mode": "sync" if exchange else None,
            "expected_peers": ids,
            "peer_timeout": PEER_TIMEOUT,
        }

    if slot == "alone":
        specs = [
            spec("A_4", "A_4", big, 4 * OWN_ROWS, 0),
            spec("A_1", "A_1", big, OWN_ROWS, 0),
            spec("A_2", "A_2", big, 2 * OWN_ROWS, 0),
            spec("A_1-small", "A_1", small, OWN_ROWS, 1),
        ]
    elif slot == "pairs":
        copies, hetero = ["copy2-a", "copy2-b"], ["hetero2-big", "hetero2-small"]
        specs = [
            spec("copy2-a", "copy-2", big, OWN_ROWS, 0, "copy", copies),
            spec("hetero2-big", "hetero-2", big, OWN_ROWS, 0, "hetero", hetero),
            spec("copy2-b", "copy-2", big, OWN_ROWS, 1, "copy", copies),
            spec("hetero2-small", "hetero-2", small, OWN_ROWS, 1, "hetero", hetero),
        ]
    elif slot == "copy-4":
        ids = [f"copy4-{c}" for c in "abcd"]
        specs = [spec(name, "copy-4", big, OWN_ROWS, i, "copy", ids) for i, name in enumerate(ids)]
    elif slot == "hetero-4":
        ids = ["hetero4-big", "hetero4-small1", "hetero4-small2", "hetero4-small3"]
        specs = [
            spec(name, "hetero-4", big if i == 0 else small, OWN_ROWS, i, "hetero", ids) for i, name in enumerate(ids)
        ]
    else:
        raise ValueError(slot)
    return {s["peer"]: s for s in specs}


def run_slot(slot: str, seed: int, rates: dict[str, float], cache: Path, work: Path, seed_index: int) -> list[dict]:
    """Train the four processes of a slot together, two per core (cores swap between even and odd seeds)."""
    specs = slot_specs(slot, seed, rates, cache, ttt.fresh_folder(work))
    cores = {name: (position + seed_index) % 2 for position, name in enumerate(specs)}
    slot_seconds = ttt.launch_processes(specs, cores, work, f"{slot} seed {seed}", timeout=3600)
    run_id = f"{seed}-{rates['key']}-{slot}-{time.time_ns()}"
    return ttt.slot_records(specs, cores, run_id=run_id, seed=seed, slot=slot, rate_key=rates["key"],
                            slot_wall_seconds=slot_seconds)  # fmt: skip


# ---- offline evaluation ---------------------------------------------------------------------------------------------
class Run(dict):
    """A run record usable as a dict key (by its run id and process)."""

    def __hash__(self):
        return hash((self.get("run_id"), self["seed"], self["rate_key"], self["slot"], self["peer"]))


def snapshot_key(record: dict, index: int, split: str) -> tuple:
    """One evaluation of one snapshot of one run (records written before run ids have `None`)."""
    return (record.get("run_id"), record["seed"], record["rate_key"], record["slot"], record["peer"], index, split)


def latest_runs(records: list[dict]) -> dict:
    """(seed, rate_key, slot, peer) -> the last run record of that process (a slot trained again replaces it)."""
    return {(r["seed"], r["rate_key"], r["slot"], r["peer"]): r for r in records if r["kind"] == "run"}


def pending_snapshots(records: list[dict], splits: tuple[str, ...]) -> dict:
    """Each latest run that is evaluated -> [(split, snapshot)] it needs: every snapshot of a judged process, the
    last of a descriptive one."""
    judged = {(slot, peer) for slot, peers, _ in ARMS.values() for peer in peers}
    out = {}
    for run in latest_runs(records).values():
        key = (run["slot"], run["peer"])
        if key not in judged and key not in DESCRIPTIVE:
            continue
        snaps = run["snapshots"] if key in judged else run["snapshots"][-1:]
        out[Run(run, run_id=run.get("run_id"))] = [(split, snap) for split in splits for snap in snaps]
    return out


def lost_slots(records: list[dict], splits: tuple[str, ...]) -> set:
    """(seed, rate_key, slot) whose latest runs miss an evaluation whose snapshot file is gone: trained again."""
    done = {snapshot_key(r, r["index"], r["split"]) for r in records if r["kind"] == "checkpoint"}
    lost = set()
    for run, snaps in pending_snapshots(records, splits).items():
        for split, snap in snaps:
            missing = snapshot_key(run, snap["index"], split) not in done
            if missing and not (Path(run["out"]) / f"ckpt-{snap['index']}.pt").exists():
                lost.add((run["seed"], run["rate_key"], run["slot"]))
    return lost


def evaluate_pending(records: list[dict], sink, cache: Path, splits: tuple[str, ...]) -> list[dict]:
    """Evaluate, on each of `splits`, every snapshot of a judged process (the last snapshot of a descriptive one) and
    every warm model without an evaluation record, in two pinned worker processes; drop evaluated snapshot files."""
    done = {snapshot_key(r, r["index"], r["split"]) for r in records if r["kind"] == "checkpoint"}
    warm_done = {(r["seed"], r["model"], r["split"]) for r in records if r["kind"] == "warm"}
    items = []
    for run, snaps in pending_snapshots(records, splits).items():
        for split, snap in snaps:
            if snapshot_key(run, snap["index"], split) in done:
                continue
            weights = Path(run["out"]) / f"ckpt-{snap['index']}.pt"
            if not weights.exists():  # lost with a chunk cut short: its slot is trained again (`lost_slots`)
                continue
            record = {"kind": "checkpoint", "run_id": run["run_id"], "seed": run["seed"], "rate_key": run["rate_key"],
                      "slot": run["slot"], "peer": run["peer"], "arm": run["arm"], "split": split, **snap}  # fmt: skip
            items.append({"model": str(cache / run["model"]), "weights": str(weights), "record": record})
        for split in splits:
            if (run["seed"], run["model"], split) not in warm_done:
                warm_done.add((run["seed"], run["model"], split))
                record = {"kind": "warm", "seed": run["seed"], "model": run["model"], "split": split}
                items.append({"model": str(cache / run["model"]), "weights": None, "record": record})
    new = ttt.evaluate_items(items, __file__, sink, "ftis-gain-eval-")
    for item in items:  # every split of these snapshots is now recorded: their weights are not needed again
        if item["weights"]:
            Path(item["weights"]).unlink(missing_ok=True)
    return new


# ---- the analysis: pure functions of the records --------------------------------------------------------------------
def curves(records: list[dict], split: str, metric: str = "accuracy") -> dict:
    """(seed, rate_key, slot, peer) -> [{step, accuracy}] sorted by step, the warm model's value at step 0; the
    "accuracy" key holds `metric` ("accuracy" or "reward")."""
    warm = {(r["seed"], r["model"]): r[metric] for r in records if r["kind"] == "warm" and r["split"] == split}
    runs = latest_runs(records)
    out: dict = {}
    for r in records:
        key = (r["seed"], r.get("rate_key"), r.get("slot"), r.get("peer"))
        latest = runs.get(key)
        if r["kind"] == "checkpoint" and r["split"] == split and latest and r.get("run_id") == latest.get("run_id"):
            out.setdefault((r["seed"], r["rate_key"], r["slot"], r["peer"]), []).append(
                {"step": r["step"], "accuracy": r[metric]}
            )
    for key, points in out.items():
        points.sort(key=lambda p: p["step"])
        run = runs.get(key)
        if run is not None and (key[0], run["model"]) in warm:
            points.insert(0, {"step": 0, "accuracy": warm[(key[0], run["model"])]})
    return out


def mean_gain(points: list[dict]) -> float:
    """The mean accuracy gain over the warm model (step 0) across the snapshots after it: the area under the gain
    curve per snapshot, the learning measure of phi and of the learning-rate choice."""
    return statistics.fmean(p["accuracy"] for p in points[1:]) - points[0]["accuracy"]


def end_gain(points: list[dict], last: int = 3) -> float:
    """The gain over the warm model at the end of the budget: mean of the last `last` snapshots."""
    return statistics.fmean(p["accuracy"] for p in points[-last:]) - points[0]["accuracy"]


def steps_to_target(points: list[dict], target: float, budget: int) -> tuple[int, bool]:
    """(steps, censored): the step of the first of two consecutive snapshots (step > 0) at or above `target`;
    `(budget, True)` when none is."""
    trained = [p for p in points if p["step"] > 0]
    for first, second in itertools.pairwise(trained):
        if first["accuracy"] >= target and second["accuracy"] >= target:
            return first["step"], False
    return budget, True


def phi_value(swarm: float, full: float, one: float) -> float | None:
    """phi = (gain(swarm) - gain(A_1)) / (gain(A_P) - gain(A_1)): 0 when peer rows teach nothing, 1 when they teach
    as much as own rows; `None` when A_P and A_1 gain the same."""
    return (swarm - one) / (full - one) if abs(full - one) > 1e-12 else None


def ratio_of_means_phi(triples: list[tuple[float, float, float]]) -> float | None:
    return phi_value(*(statistics.fmean(t[i] for t in triples) for i in range(3)))


def bootstrap(triples: list, statistic, draws: int | None = None, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of `statistic` over seeds resampled with replacement, `draws` times (default
    `BOOTSTRAP`; None draws left out)."""
    draws = draws or BOOTSTRAP
    rng = random.Random(seed)
    values = sorted(
        v for v in (statistic([rng.choice(triples) for _ in triples]) for _ in range(draws)) if v is not None
    )
    if not values:
        return math.nan, math.nan
    return values[int(0.025 * len(values))], values[min(int(0.975 * len(values)), len(values) - 1)]


def geo_interval(logs: list[float]) -> tuple[float, float, float]:
    mean, low, high = t_interval(logs)
    return math.exp(mean), math.exp(low), math.exp(high)


def rate_choice(records: list[dict]) -> dict[str, dict]:
    """The learning-rate rule: per arm, the rate with the highest mean over the learning-rate seeds of the judged
    processes' mean dev gain (`mean_gain`); ties (within 1e-9) to the lower rate. Returns arm -> {rate, table}."""
    curve = curves(records, "dev")
    seeds = sorted({r["seed"] for r in records if r["kind"] == "run"})
    choice = {}
    for arm, (slot, peers, _) in ARMS.items():
        table = {}
        for rate in RATES:
            key = f"{rate:g}"
            gains = []
            for seed in seeds:
                points = [curve.get((seed, key, slot, peer)) for peer in peers]
                if all(p and len(p) > 1 for p in points):
                    gains.append(statistics.fmean(mean_gain(p) for p in points))
            if gains:
                table[rate] = {"gain": statistics.fmean(gains), "seeds": len(gains), "end_gains": [
                    statistics.fmean(end_gain(curve[(seed, key, slot, peer)]) for peer in peers) for seed in seeds
                    if all(curve.get((seed, key, slot, peer)) for peer in peers)]}  # fmt: skip
        if table:
            best = max(table.items(), key=lambda item: (item[1]["gain"], -item[0]))[0]
            choice[arm] = {"rate": best, "table": table}
    return choice


def target_offset(choice: dict[str, dict]) -> float | None:
    """TARGET_FRACTION x the median over the learning-rate seeds of A_1's end-of-budget dev gain at its rate."""
    if "A_1" not in choice:
        return None
    gains = choice["A_1"]["table"][choice["A_1"]["rate"]]["end_gains"]
    return TARGET_FRACTION * statistics.median(gains) if gains else None


# ---- summaries ------------------------------------------------------------------------------------------------------
def cpu_hours(records: list[dict]) -> str:
    """The training processes' CPU time in the records (every run, latest or not; evaluation not included)."""
    runs = [r for r in records if r["kind"] == "run"]
    hours = sum(r["cpu_seconds"] for r in runs) / 3600
    return f"training CPU time in these records: {hours:.2f} h over {len(runs)} processes"


def summarise_lr(records: list[dict]) -> None:
    print(cpu_hours(records))
    choice = rate_choice(records)
    print("Learning-rate choice (dev split; mean gain over the warm model across the budget's snapshots, mean over "
          f"seeds {sorted({r['seed'] for r in records if r['kind'] == 'run'})})")  # fmt: skip
    print("| arm | " + " | ".join(f"{rate:g}" for rate in RATES) + " | chosen |")
    print("|---" * (len(RATES) + 2) + "|")
    for arm, item in choice.items():
        cells = [f"{item['table'][r]['gain']:+.3f} ({item['table'][r]['seeds']})" if r in item["table"] else "-"
                 for r in RATES]  # fmt: skip
        print(f"| {arm} | " + " | ".join(cells) + f" | {item['rate']:g} |")
    offset = target_offset(choice)
    if offset is not None:
        gains = choice["A_1"]["table"][choice["A_1"]["rate"]]["end_gains"]
        print(f"target offset: {TARGET_FRACTION} x median A_1 end gain {statistics.median(gains):+.3f} = "
            f"{offset:+.3f} "
              f"(per seed: {', '.join(f'{g:+.3f}' for g in gains)})")  # fmt: skip


def summarise_grid(records: list[dict], offset: float, rates: dict[str, float], split: str = "test") -> dict:
    """The pre-registered analysis (benchmarks/peer_gain.md); returns the numbers it prints."""
    print(cpu_hours(records))
    curve = curves(records, split)
    seeds = sorted({r["seed"] for r in records if r["kind"] == "run"})
    runs = {(r["seed"], r["slot"], r["peer"]): r for r in records if r["kind"] == "run"}
    key = "chosen"
    result: dict = {"seeds": seeds, "offset": offset, "rates": rates}

    def arm_points(seed, arm):
        slot, peers, _ = ARMS[arm]
        points = [curve.get((seed, key, slot, peer)) for peer in peers]
        return points if all(p and len(p) > 1 for p in points) else None

    complete = [s for s in seeds if all(arm_points(s, arm) for arm in ARMS)]
    result["complete_seeds"] = complete
    print(f"split {split}; seeds with every arm evaluated: {len(complete)} ({complete}); target offset {offset:+.3f}")
    # Steps to target per seed and arm (copy arms: each copy; their log steps are averaged).
    steps: dict = {}
    for seed in complete:
        target = curve[(seed, key, "alone", "A_1")][0]["accuracy"] + offset
        for arm in ARMS:
            steps[(seed, arm)] = [steps_to_target(p, target, STEPS) for p in arm_points(seed, arm)]
    print(f"\nSteps to target (budget {STEPS}; censored runs count as {STEPS}) and own generated rows to target")
    print("| arm | rate | restricted mean steps | censored | own rows a step | restricted mean own rows |")
    print("|---|---|---|---|---|---|")
    result["steps"] = {}
    for arm, (_, peers, p) in ARMS.items():
        values = [s for seed in complete for s, _ in steps[(seed, arm)]]
        censored = sum(c for seed in complete for _, c in steps[(seed, arm)])
        own = OWN_ROWS * (p if arm.startswith("A_") else 1)
        mean = statistics.fmean(values) if values else math.nan
        result["steps"][arm] = {"mean": mean, "censored": censored, "runs": len(values)}
        print(f"| {arm} | {rates[arm]:g} | {mean:.1f} | {censored}/{len(values)} | {own} | {own * mean:.0f} |")

    def log_steps(seed, arm):
        return statistics.fmean(math.log(s) for s, _ in steps[(seed, arm)])

    comparisons, pvalues = {}, {}
    for p in (2, 4):
        full = f"A_{p}"
        comparisons[f"beta_{p}: A_1 / {full}"] = [log_steps(s, "A_1") - log_steps(s, full) for s in complete]
        for arm in (f"copy-{p}", f"hetero-{p}"):
            comparisons[f"{arm} / {full}"] = [log_steps(s, arm) - log_steps(s, full) for s in complete]
            comparisons[f"{arm} / A_1"] = [log_steps(s, arm) - log_steps(s, "A_1") for s in complete]
    for name, logs in comparisons.items():
        pvalues[name] = t_pvalue(logs)
    adjusted = holm(pvalues)
    print("\nSteps ratios (geometric mean, 95% t-interval on the log ratios, seeds lower/higher, Holm over these 10)")
    print("| comparison | ratio | 95% interval | lower / higher | Holm p | reading |")
    print("|---|---|---|---|---|---|")
    result["ratios"] = {}
    for name, logs in comparisons.items():
        ratio, low, high = geo_interval(logs)
        reading = steps_reading(ratio, adjusted[name])
        result["ratios"][name] = {"ratio": ratio, "low": low, "high": high, "holm": adjusted[name], "reading": reading}
        lower, higher = sum(v < 0 for v in logs), sum(v > 0 for v in logs)
        print(
            f"| {name} | {ratio:.2f} | [{low:.2f}, {high:.2f}] | {lower} / {higher} | {adjusted[name]:.3g} | "
            f"{reading} |"
        )
    # phi from the mean gain across the budget, and at the end; per received row.
    print(f"\nphi (mean gain across the budget's snapshots; ratio of mean gains over seeds; bootstrap {BOOTSTRAP})")
    print(
        "| arm | phi | 95% interval | width | phi at the end (last 3 snapshots) | peer rows in loss a step | "
        "of which the filter zeroed | phi per received row |"
    )
    print("|---|---|---|---|---|---|---|---|")
    result["phi"] = {}
    for arm in SWARM_ARMS:
        slot, peers, p = ARMS[arm]
        triples, ends = [], []
        for seed in complete:
            swarm = statistics.fmean(mean_gain(q) for q in arm_points(seed, arm))
            triples.append((swarm, mean_gain(arm_points(seed, f"A_{p}")[0]), mean_gain(arm_points(seed, "A_1")[0])))
            ends.append((statistics.fmean(end_gain(q) for q in arm_points(seed, arm)),
                         end_gain(arm_points(seed, f"A_{p}")[0]), end_gain(arm_points(seed, "A_1")[0])))  # fmt: skip
        phi = ratio_of_means_phi(triples)
        low, high = bootstrap(triples, ratio_of_means_phi)
        end_phi = ratio_of_means_phi(ends)
        received = [
            runs[(s, slot, peer)]["peer_rows_in_loss"] / runs[(s, slot, peer)]["steps"]
            for s in complete
            for peer in peers
            if runs.get((s, slot, peer), {}).get("peer_rows_in_loss") is not None
        ]
        per_step = statistics.fmean(received) if received else math.nan
        # Peer rows admitted (above) are those left after the drops before the filter (special tokens, ...); the
        # filter then zeroes some of them (`rows_filtered` of `ftis_summary.json`; records made before it was kept
        # lack it, and the table says "not recorded").
        judged = [runs.get((s, slot, peer), {}) for s in complete for peer in peers]
        zeroed = [r["rows_filtered"] / r["steps"] for r in judged if r.get("rows_filtered") is not None]
        filtered = statistics.fmean(zeroed) if zeroed and len(zeroed) == len(judged) else None
        per_row = phi * (p - 1) * OWN_ROWS / per_step if phi is not None and per_step > 0 else math.nan
        result["phi"][arm] = {
            "phi": phi,
            "low": low,
            "high": high,
            "end": end_phi,
            "rows_a_step": per_step,
            "filtered_a_step": filtered,
            "per_received_row": per_row,
            "triples": triples,
        }
        zeroed_text = "not recorded" if filtered is None else f"{filtered:.2f}"
        print(
            f"| {arm} | {phi:.2f} | [{low:.2f}, {high:.2f}] | {high - low:.2f} | {end_phi:.2f} | {per_step:.1f} of "
            f"{(p - 1) * OWN_ROWS} | {zeroed_text} | {per_row:.2f} |"
        )
    wide = {arm: v for arm, v in result["phi"].items() if v["high"] - v["low"] > DECISIVE_WIDTH}
    for arm, v in wide.items():
        print(f"{arm}: phi not decisive (interval {v['high'] - v['low']:.2f} wide > {DECISIVE_WIDTH}); this spread "
              f"implies about {seeds_for_width(len(complete), v['high'] - v['low'])} seeds")  # fmt: skip
    print_break_even(result)
    return result


def steps_reading(ratio: float, holm_p: float, alpha: float = 0.05) -> str:
    """The plan's reading of one steps ratio: a direction only where it is distinguishable after Holm."""
    if not holm_p < alpha:
        return "not distinguishable"
    return "above 1" if ratio > 1 else "below 1"


def seeds_for_width(seeds: int, width: float, aim: float = 0.3) -> int:
    """Seeds a bootstrap interval `width` wide over `seeds` seeds needs to be `aim` wide (width ~ 1/sqrt(seeds))."""
    return math.ceil(seeds * (width / aim) ** 2)


def print_break_even(result: dict) -> None:
    """The decision rule's prediction for other hardware: per swarm arm, the smallest generation share f from which
    the whole predicted range against the better alone run is below 1, with generation in proportion to the rows
    (s = P), for r = 0.02 and 0.1 (`trl_ftis.pays.break_even_share`, phi's bootstrap and beta's t-interval)."""
    from trl_ftis.pays import break_even_share

    print("\nPrediction (not measured): the generation share f from which joining pays against the better alone run, "
          "s = P, q assumed")  # fmt: skip
    print("| arm | phi range | beta range | f from (r = 0.02) | f from (r = 0.1) |")
    print("|---|---|---|---|---|")
    for arm in SWARM_ARMS:
        p = ARMS[arm][2]
        phi = result["phi"].get(arm)
        beta = result["ratios"].get(f"beta_{p}: A_1 / A_{p}")
        if not phi or not beta or any(math.isnan(x) for x in (phi["low"], phi["high"], beta["low"], beta["high"])):
            continue
        phis, betas = (phi["low"], phi["high"]), (beta["low"], beta["high"])
        cells = [break_even_share(p, phis, betas, r=r) for r in (0.02, 0.1)]
        text = ["never" if c is None else f"{c:.3f}" for c in cells]
        print(f"| {arm} | [{phis[0]:.2f}, {phis[1]:.2f}] | [{betas[0]:.2f}, {betas[1]:.2f}] | {text[0]} | {text[1]} |")


def summarise_ood(records: list[dict], metric: str = "reward") -> None:
    """Out-of-distribution gains (operand lengths never trained on) across the budget, in `metric`: each swarm arm
    against A_1 and against A_P, paired differences with t-intervals and Holm over the 8."""
    curve = curves(records, "ood", metric)
    seeds = sorted({r["seed"] for r in records if r["kind"] == "run"})
    gains = {}
    for seed in seeds:
        for arm, (slot, peers, _) in ARMS.items():
            points = [curve.get((seed, "chosen", slot, peer)) for peer in peers]
            if all(p and len(p) > 1 for p in points):
                gains[(seed, arm)] = statistics.fmean(mean_gain(p) for p in points)
    complete = [s for s in seeds if all((s, arm) in gains for arm in ARMS)]
    if len(complete) < 2:
        print("\nOOD: fewer than 2 complete seeds")
        return
    print(f"\nOut of distribution ({metric}; mean gain across the budget; {len(complete)} seeds)")
    print(f"| arm | mean OOD {metric} gain |")
    print("|---|---|")
    for arm in ARMS:
        print(f"| {arm} | {statistics.fmean(gains[(s, arm)] for s in complete):+.4f} |")
    diffs = {}
    for arm in SWARM_ARMS:
        p = ARMS[arm][2]
        for base in ("A_1", f"A_{p}"):
            diffs[f"{arm} - {base}"] = [gains[(s, arm)] - gains[(s, base)] for s in complete]
    adjusted = holm({name: t_pvalue(v) for name, v in diffs.items()})
    print("| comparison | difference | 95% interval | Holm p |")
    print("|---|---|---|---|")
    for name, values in diffs.items():
        mean, low, high = t_interval(values)
        print(f"| {name} | {mean:+.4f} | [{low:+.4f}, {high:+.4f}] | {adjusted[name]:.3g} |")


def pilot_budgets(records: list[dict]) -> None:
    """The pilot's phi of the P = 2 swarms per seed, from the mean gain over the snapshots up to a shorter budget S:
    how the budget and the seeds were sized."""
    for split in ("test", "dev"):
        curve = curves(records, split)
        keys = {(k[0], k[1]) for k in curve}
        for budget in (40, 60, 80, 150):
            for rate in sorted({k[1] for k in keys}):
                cells = []
                for seed in sorted({k[0] for k in keys if k[1] == rate}):

                    def gain(slot, peers, seed=seed, rate=rate, budget=budget, curve=curve):
                        return statistics.fmean(
                            mean_gain([p for p in curve[(seed, rate, slot, q)] if p["step"] <= budget]) for q in peers
                        )

                    g1, g2 = gain("alone", ["A_1"]), gain("alone", ["A_2"])
                    copy, hetero = gain("pairs", ["copy2-a", "copy2-b"]), gain("pairs", ["hetero2-big"])
                    cells.append(
                        f"seed {seed}: G_1 {g1:+.3f} G_2 {g2:+.3f} copy {copy:+.3f} hetero {hetero:+.3f} "
                        f"phi copy {phi_value(copy, g2, g1):+.2f} hetero {phi_value(hetero, g2, g1):+.2f}"
                    )
                print(f"{split} S {budget} lr {rate}: " + " | ".join(cells))


def summarise_pilot(records: list[dict]) -> None:
    """Per seed, rate and arm: the warm accuracy and the accuracy at each snapshot, per split; then phi by budget
    (`pilot_budgets`)."""
    for split, metric in (("dev", "accuracy"), ("test", "accuracy"), ("ood", "reward"), ("ood", "accuracy"),
                          ("ood3", "reward")):  # fmt: skip
        curve = curves(records, split, metric)
        if not curve:
            continue
        print(f"\nsplit {split}: {metric} at steps " + ", ".join(str(p["step"]) for p in next(iter(curve.values()))))
        for (seed, rate, slot, peer), points in sorted(curve.items()):
            print(f"  seed {seed} lr {rate} {peer}: " + " ".join(f"{p['accuracy']:.2f}" for p in points)
                  + f"  mean gain {mean_gain(points):+.3f} end gain {end_gain(points):+.3f}")  # fmt: skip


# ---- main -----------------------------------------------------------------------------------------------------------
def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def add_run_arguments(parser: argparse.ArgumentParser, work: str) -> None:
    """The options every resumable experiment script here shares: seeds, a time limit, summary only, the warm-model
    cache (shared by the scripts: one warm model per name and seed), a work folder `work` under the temporary
    directory, and the hidden `--evaluate JOB` of its evaluation workers."""
    parser.add_argument("--seeds", help="a subset of the stage's seeds, e.g. 0-3 or 0,5")
    parser.add_argument("--minutes", type=float, default=None, help="start no slot after this many minutes")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ftis-gain-warm")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / work)
    parser.add_argument("--evaluate", help=argparse.SUPPRESS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--stage",
        choices=("quick", "pilot", "lr", "grid"),
        default="grid",
        help="quick: one seed, 20 steps, every slot: a smoke test",
    )
    parser.add_argument(
        "--slots", nargs="+", choices=SLOTS, default=None, help="default: every slot (the pilot: alone and pairs)"
    )
    add_run_arguments(parser, "ftis-gain-work")
    options = parser.parse_args()
    if options.evaluate:
        return evaluate_worker(options.evaluate)
    raw = RESULTS / f"peer_gain-{options.stage}.jsonl"
    records = load(raw)
    global STEPS, CHECKPOINT_STEPS
    if options.stage == "quick":
        STEPS = 20
    if options.stage == "pilot":  # the pilot's settings, before the budget was sized from it
        STEPS, CHECKPOINT_STEPS = 150, 10
    stage_seeds = {"quick": (950,), "pilot": PILOT_SEEDS, "lr": LR_SEEDS, "grid": GRID_SEEDS}[options.stage]
    seeds = ttt.parse_seeds(options.seeds) if options.seeds else list(stage_seeds)
    if not set(seeds) <= set(stage_seeds):
        raise SystemExit(f"the {options.stage} stage's seeds are {stage_seeds}")
    splits = {
        "quick": ("dev", "ood"),
        "pilot": ("dev", "test", "ood", "ood3"),
        "lr": ("dev",),
        "grid": ("test", "ood"),
    }[options.stage]
    if options.stage == "grid":
        choice = rate_choice(load(RESULTS / "peer_gain-lr.jsonl"))
        missing = [
            arm
            for arm in ARMS
            if arm not in choice or choice[arm]["table"][choice[arm]["rate"]]["seeds"] < len(LR_SEEDS)
        ]
        if missing:
            raise SystemExit(f"the learning-rate stage is not complete for {missing}: run --stage lr first")
        settings = [{"key": "chosen", **{arm: choice[arm]["rate"] for arm in ARMS}}]
        offset = target_offset(choice)
    else:
        rates = {"quick": (2e-4,), "pilot": PILOT_RATES, "lr": RATES}[options.stage]
        settings = [{"key": f"{rate:g}", **dict.fromkeys(ARMS, rate)} for rate in rates]
    if options.slots is None:
        options.slots = ["alone", "pairs"] if options.stage == "pilot" else list(SLOTS)
    if not options.summary_only:
        print(ttt.run_header(), flush=True)
        began = time.time()
        options.cache.mkdir(parents=True, exist_ok=True)
        ttt.build_warm(options.cache, seeds, ["hetero"])
        done = {(r["seed"], r["rate_key"], r["slot"]) for r in records if r["kind"] == "run"} - lost_slots(
            records, splits
        )
        RESULTS.mkdir(exist_ok=True)
        with open(raw, "a") as sink:
            stopped = False
            for index, seed in enumerate(seeds):
                for rates in settings:
                    order = options.slots if index % 2 == 0 else list(reversed(options.slots))
                    for slot in order:
                        if (seed, rates["key"], slot) in done:
                            continue
                        if options.minutes is not None and time.time() - began > 60 * options.minutes:
                            stopped = True
                            break
                        work = options.work / f"{options.stage}-seed{seed}-{rates['key']}" / slot
                        got = run_slot(slot, seed, rates, options.cache, work, index)
                        label = f"seed {seed} lr {rates['key']} {slot}"
                        ttt.keep_slot(sink, records, got, label, steps=True, slot_seconds=True)
                        # Evaluate each slot as soon as it is trained: a chunk cut short leaves no snapshot behind.
                        records += evaluate_pending(records, sink, options.cache, splits)
                    if stopped:
                        break
                if stopped:
                    break
            records += evaluate_pending(records, sink, options.cache, splits)
        print(f"stage {options.stage}: {time.time() - began:.0f} s this invocation", flush=True)
    if options.stage in ("quick", "pilot"):
        summarise_pilot(records)
        if options.stage == "pilot":
            print("\nphi of the P = 2 swarms by budget (mean gain over the snapshots up to step S)")
            pilot_budgets(records)
    elif options.stage == "lr":
        summarise_lr(records)
    else:
        summarise_lr(load(RESULTS / "peer_gain-lr.jsonl"))
        summarise_grid(records, offset, settings[0])
        summarise_ood(records, "reward")
        summarise_ood(records, "accuracy")


if __name__ == "__main__":
    main()
