"""Peers at different speeds: lock-step (`exchange_mode="sync"`) against free-running (`"free"`), with real processes.

Every peer is a real `examples/tiny_peer.py` process (a tiny Llama, hidden 64, character tokenizer, 2-digit addition,
16 own rows a step), pinned to one core (`taskset`; with 4 peers, peers 0 and 2 share core 0, 1 and 3 core 1, in
every arm alike), exchanging over `dir://`. One peer is R times slower than the others: it sleeps `(R - 1) x` the
fast peers' step time after each step (`--step_delay`; the fast step time is measured in the same run, in the alone
arm at R = 1), a slower peer without the CPU a bigger model would take from the others on 2 cores.

Part `speed`: for P = 2 and 4 peers and R = 1, 3, 10, three arms run one after the other (their order alternates
between repeats; the same seeds in every arm):
  * alone: every peer with the exchange off, the same processes, pinning, steps and delays;
  * sync: lock-step, `expected_peers` = all (every peer runs the slow one's number of steps: it cannot do more);
  * free: `exchange_mode="free"`, `expected_peers` = all; fast peers run R times the slow one's steps.
Reported per peer: its blocking share (`exchange_blocking_seconds / train_seconds`, from its `ftis_summary.json`), its
steps per second relative to the same peer in the alone arm of the same repeat, and the ages (in the sender's own
steps) of the peer rows it trained on. Goal (issue 20): blocking <= 2% for every peer at every R in the free arm,
and each peer's step rate within noise of alone plus the cost of the rows it trains on.

Part `learning`: paired seeds, two peers starting from the same warm model (`warm_models.py`, "big", per seed),
64 own rows a step (8 prompts x 8), 60 own steps each, exact-answer reward, lr 2e-4; held-out greedy accuracy on
500 problems before and after (outside the training clock). Speeds: equal (R = 1) and unequal (the "slow" peer
R = 10 x slower). Modes sync and free alternate per seed. Outcomes per peer role (fast, slow): the accuracy gain at
equal own steps (= equal own generated rows: learning per own generated token) and the gain per training second.
The hypotheses and the analysis are written in docs/benchmarks.md section 11 before the run; the summary prints
paired differences free - sync per seed, their mean with a 95% t-interval, sign counts, and Holm-adjusted p-values
over the four gain-per-token comparisons (and, separately, the four gain-per-second ones).

    OMP_NUM_THREADS=1 python benchmarks/free_running.py --part speed      # about 10 minutes
    OMP_NUM_THREADS=1 python benchmarks/free_running.py --part learning   # about 12 minutes
    OMP_NUM_THREADS=1 python benchmarks/free_running.py --part speed --quick

Raw records (one JSON line per peer and run) go to `benchmarks/results/free_running-<part>.jsonl`; the printed summary
is what `docs/benchmarks.md` quotes (saved with `| tee benchmarks/results/free_running-<part>.txt`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
PEER = ROOT / "examples" / "tiny_peer.py"
RESULTS = HERE / "results"
TARGET_SECONDS = 8.0  # training time of the slow peer in the speed part
OWN_ROWS = 16  # own rows a step in the speed part (per_device_train_batch_size)
sys.path.insert(0, str(HERE))

COMMON = {
    "per_device_train_batch_size": 16,
    "num_generations": 8,
    "max_completion_length": 6,
    "learning_rate": 1e-3,
    "preset": "paper",
    "reward": "digit_match",
    "bf16": False,
    "use_cpu": True,
    "gradient_checkpointing": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "disable_tqdm": True,
    "peer_timeout": 120,
}
LEARNING = {
    **COMMON,
    "per_device_train_batch_size": 64,
    "learning_rate": 2e-4,
    "lr_scheduler_type": "constant",
    "reward": "exact",
    "beta": 0.0,
    "eval_size": 500,
}


def command(peer_id: str, out: Path, settings: dict) -> list[str]:
    argv = [sys.executable, str(PEER), "--peer_id", peer_id, "--output_dir", str(out / peer_id)]
    for key, value in settings.items():
        if value is None:
            continue
        if isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def run_peers(
    peers: dict[str, dict], out: Path, cores: dict[str, int], timeout: float = 900, start_seconds: float = 20.0
) -> dict[str, dict]:
    """Start every peer (pinned; they all begin training at the same moment, `--start_at`, so that start-up times
    do not count: `start_seconds` is well over a peer's start-up), wait for all; their summaries, with the log tail
    when one fails."""
    start_at = time.time() + start_seconds
    peers = {peer: {**settings, "start_at": round(start_at, 3)} for peer, settings in peers.items()}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("FTIS_SWARM_SECRET", None)
    processes = {}
    out.mkdir(parents=True, exist_ok=True)
    for peer_id, settings in peers.items():
        log = open(out / f"{peer_id}.log", "w")
        argv = ["taskset", "-c", str(cores[peer_id]), *command(peer_id, out, settings)]
        processes[peer_id] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    for peer_id, process in processes.items():
        code = process.wait(timeout=max(deadline - time.monotonic(), 1))
        if code != 0:
            raise SystemExit(f"{peer_id} exited {code}:\n" + (out / f"{peer_id}.log").read_text()[-3000:])
    return {peer_id: json.loads((out / peer_id / "ftis_summary.json").read_text()) for peer_id in peers}


def t_cdf(x: float, df: int) -> float:
    """Student's t distribution function (Simpson's rule over the density; no SciPy in the project's dependencies)."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(t):
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))

    steps = 4000
    h = x / steps
    total = density(0.0) + density(x) + sum((4 if k % 2 else 2) * density(k * h) for k in range(1, steps))
    return 0.5 + total * h / 3


def t_quantile(p: float, df: int) -> float:
    low, high = 0.0, 1000.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def t_pvalue(values: list[float]) -> float:
    """Two-sided one-sample t-test of mean 0."""
    if len(values) < 2 or statistics.stdev(values) == 0:
        return math.nan
    t = statistics.fmean(values) / (statistics.stdev(values) / math.sqrt(len(values)))
    return 2 * (1 - t_cdf(abs(t), len(values) - 1))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values (step-down, monotone)."""
    order = sorted((p, name) for name, p in pvalues.items() if not math.isnan(p))
    adjusted, running = {}, 0.0
    for rank, (p, name) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[name] = running
    return {name: adjusted.get(name, math.nan) for name in pvalues}


# --------------------------------------------------------------------------------------------------------------------
# Part speed
# --------------------------------------------------------------------------------------------------------------------
def speed_arm(arm, peers, ratio, slow_steps, fast_step, work, seed):
    """One arm: P peers, the last R times slower; fast peers run R x `slow_steps` steps (sync: `slow_steps`)."""
    ids = [f"p{i}" for i in range(peers)]
    slow = ids[-1]
    cores = {peer: i % 2 for i, peer in enumerate(ids)}
    exchange = f"dir://{work / 'exchange'}"
    specs = {}
    for peer in ids:
        steps = slow_steps if (peer == slow or arm == "sync") else slow_steps * ratio
        settings = {**COMMON, "max_steps": steps, "seed": seed, "model_seed": seed, "hidden_size": 64}
        if peer == slow and ratio > 1:
            settings["step_delay"] = round((ratio - 1) * fast_step, 4)
        if arm != "alone":
            settings.update(exchange_url=exchange, exchange_mode=arm, expected_peers=ids)
        specs[peer] = settings
    summaries = run_peers(specs, work / "out", cores)
    records = []
    for peer, summary in summaries.items():
        records.append(
            {
                "part": "speed",
                "arm": arm,
                "peers": peers,
                "ratio": ratio,
                "seed": seed,
                "peer": peer,
                "role": "slow" if peer == slow else "fast",
                "steps": summary["steps"],
                "train_seconds": summary["train_seconds"],
                "blocking_seconds": summary["exchange_blocking_seconds"],
                "rows_accepted": summary["rows_accepted"],
                "ages": summary["peer_row_ages"],
                "dropped": summary["dropped"],
            }
        )
    return records


def calibrate(peers, work, steps=40) -> float:
    """The fast peers' step time in this layout: every peer alone (exchange off), pinned as in the arms."""
    got = speed_arm("alone", peers, 1, steps, 0.0, work, seed=99)
    return statistics.median(r["train_seconds"] / r["steps"] for r in got)


def part_speed(args, sink):
    ratios, layouts = ([1, 10], [2]) if args.quick else ([1, 3, 10], [2, 4])
    target = TARGET_SECONDS / (4 if args.quick else 1)
    records = []
    for peers in layouts:
        work = Path(tempfile.mkdtemp(prefix="ftis-free-"))
        try:
            fast_step = calibrate(peers, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"P={peers}: fast step {fast_step * 1000:.0f} ms (alone, for the delays)", flush=True)
        for ratio in ratios:
            slow_steps = max(round(target / (ratio * fast_step)), 5)
            for repeat in range(args.repeats):
                arms = ["alone", "sync", "free"] if repeat % 2 == 0 else ["free", "sync", "alone"]
                for arm in arms:
                    work = Path(tempfile.mkdtemp(prefix="ftis-free-"))
                    try:
                        got = speed_arm(arm, peers, ratio, slow_steps, fast_step, work, seed=repeat)
                    finally:
                        shutil.rmtree(work, ignore_errors=True)
                    for record in got:
                        record["fast_step"] = fast_step
                        record["repeat"] = repeat
                        sink.write(json.dumps(record) + "\n")
                        sink.flush()
                    records += got
                    print(
                        f"P={peers} R={ratio} {arm:5s} rep {repeat}: "
                        + ", ".join(
                            f"{r['peer']} {r['steps']} st {r['steps'] / r['train_seconds']:.1f} st/s "
                            f"blk {100 * r['blocking_seconds'] / r['train_seconds']:.1f}%"
                            for r in got
                        ),
                        flush=True,
                    )
    summarize_speed(records)


def summarize_speed(records):
    print(
        "\n== speed: per peer role, over its peers and repeats; relative to the same peer alone in the same repeat =="
    )
    print(
        "| P | R | role | arm | blocking share, max | step rate vs alone, median (range) | "
        "seconds per trained row vs alone, median (range) | peer rows per step | ages trained on (sender steps) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["peers"], r["ratio"]) for r in records})
    for peers, ratio in keys:
        for role in ("fast", "slow"):
            for arm in ("sync", "free"):
                key = (peers, ratio, role, arm)
                rows = [r for r in records if (r["peers"], r["ratio"], r["role"], r["arm"]) == key]
                if not rows:
                    continue
                shares = [r["blocking_seconds"] / r["train_seconds"] for r in rows]
                rates, per_row, peer_rows = [], [], []
                for r in rows:
                    alone = [
                        a
                        for a in records
                        if a["arm"] == "alone"
                        and (a["peers"], a["ratio"], a["peer"], a["repeat"]) == (peers, ratio, r["peer"], r["repeat"])
                    ]
                    if alone:
                        a = alone[0]
                        rates.append((r["steps"] / r["train_seconds"]) / (a["steps"] / a["train_seconds"]))
                        trained = trained_rows(r)
                        per_row.append((r["train_seconds"] / trained) / (a["train_seconds"] / trained_rows(a)))
                    peer_rows.append((trained_rows(r) - OWN_ROWS * r["steps"]) / r["steps"])
                ages: dict[str, int] = {}
                for r in rows:
                    for age, count in r["ages"].items():
                        ages[age] = ages.get(age, 0) + count
                total = sum(ages.values()) or 1
                age_text = ", ".join(f"{age}: {100 * count / total:.0f}%" for age, count in sorted(ages.items()))
                print(
                    f"| {peers} | {ratio} | {role} | {arm} | {100 * max(shares):.2f}% | "
                    f"{statistics.median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) | "
                    f"{statistics.median(per_row):.2f} ({min(per_row):.2f}-{max(per_row):.2f}) | "
                    f"{statistics.fmean(peer_rows):.0f} | {age_text or '-'} |"
                )


def trained_rows(record) -> int:
    """Own rows plus the peer rows merged (accepted minus those trimmed for an even split)."""
    return OWN_ROWS * record["steps"] + record["rows_accepted"] - record["dropped"].get("batch_split", 0)


# --------------------------------------------------------------------------------------------------------------------
# Part learning
# --------------------------------------------------------------------------------------------------------------------
def learning_run(mode, ratio, seed, cache, fast_step, work):
    from warm_models import warm_checkpoint

    model = warm_checkpoint(cache, "big", seed)
    ids = ["fast", "slow"]
    specs = {}
    for peer in ids:
        settings = {
            **LEARNING,
            "max_steps": 60,
            "seed": seed,
            "model_name_or_path": str(model),
            "exchange_url": f"dir://{work / 'exchange'}",
            "exchange_mode": mode,
            "expected_peers": ids,
        }
        if peer == "slow" and ratio > 1:
            settings["step_delay"] = round((ratio - 1) * fast_step, 4)
        specs[peer] = settings
    summaries = run_peers(specs, work / "out", {"fast": 0, "slow": 1}, start_seconds=12.0)
    return [
        {
            "part": "learning",
            "mode": mode,
            "ratio": ratio,
            "seed": seed,
            "role": peer,
            "steps": s["steps"],
            "train_seconds": s["train_seconds"],
            "blocking_seconds": s["exchange_blocking_seconds"],
            "rows_accepted": s["rows_accepted"],
            "ages": s["peer_row_ages"],
            "accuracy_before": s["accuracy_before"],
            "accuracy_after": s["accuracy_after"],
            "fast_step": fast_step,
        }
        for peer, s in summaries.items()
    ]


def calibrate_learning(cache: Path) -> float:
    """The step time of a learning peer (warm model, 64 own rows), both peers alone and pinned as in the runs."""
    from warm_models import warm_checkpoint

    model = str(warm_checkpoint(cache, "big", 0))
    work = Path(tempfile.mkdtemp(prefix="ftis-learn-"))
    try:
        settings = {**LEARNING, "max_steps": 20, "eval_size": 0, "model_name_or_path": model}
        got = run_peers({"fast": settings, "slow": settings}, work / "out", {"fast": 0, "slow": 1})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return statistics.median(s["train_seconds"] / s["steps"] for s in got.values())


def part_learning(args, sink):
    cache = Path(args.cache)
    seeds = range(args.seeds)
    records = []
    fast_step = args.fast_step or calibrate_learning(cache)
    print(f"learning: fast step {fast_step * 1000:.0f} ms (alone; the slow peer sleeps 9x it at R = 10)", flush=True)
    for seed in seeds:
        for ratio in (1, 10):
            modes = ["sync", "free"] if (seed + ratio) % 2 == 0 else ["free", "sync"]
            for mode in modes:
                work = Path(tempfile.mkdtemp(prefix="ftis-learn-"))
                try:
                    got = learning_run(mode, ratio, seed, cache, fast_step, work)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                for record in got:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                records += got
                print(
                    f"seed {seed} R={ratio} {mode}: "
                    + ", ".join(
                        f"{r['role']} {r['accuracy_before']:.3f}->{r['accuracy_after']:.3f} "
                        f"in {r['train_seconds']:.1f}s"
                        for r in got
                    ),
                    flush=True,
                )
    summarize_learning(records)


def summarize_learning(records):
    print("\n== learning: paired differences free - sync per seed ==")
    families = {"gain per own token": {}, "gain per second": {}}
    lines = []
    for ratio in (1, 10):
        for role in ("fast", "slow"):
            per_token, per_second, signs = [], [], []
            for seed in sorted({r["seed"] for r in records}):
                pair = {
                    r["mode"]: r
                    for r in records
                    if (r["ratio"], r["role"], r["seed"]) == (ratio, role, seed)
                }
                if set(pair) != {"sync", "free"}:
                    continue
                gain = {m: pair[m]["accuracy_after"] - pair[m]["accuracy_before"] for m in pair}
                per_token.append(gain["free"] - gain["sync"])
                per_second.append(
                    gain["free"] / pair["free"]["train_seconds"] - gain["sync"] / pair["sync"]["train_seconds"]
                )
            name = f"R={ratio} {role}"
            families["gain per own token"][name] = (per_token, t_pvalue(per_token))
            families["gain per second"][name] = (per_second, t_pvalue(per_second))
    for family, comparisons in families.items():
        adjusted = holm({name: p for name, (_, p) in comparisons.items()})
        print(f"\n{family} (free - sync), Holm over {len(comparisons)} comparisons:")
        print("| comparison | per seed | mean | 95% t-interval | free better / worse | Holm p |")
        print("|---|---|---|---|---|---|")
        for name, (values, _) in comparisons.items():
            mean, low, high = t_interval(values) if values else (math.nan,) * 3
            better = sum(v > 0 for v in values)
            worse = sum(v < 0 for v in values)
            print(
                f"| {name} | {', '.join(f'{v:+.4f}' for v in values)} | {mean:+.4f} | [{low:+.4f}, {high:+.4f}] | "
                f"{better} / {worse} | {adjusted[name]:.3f} |"
            )
    print("\nmeans per arm (accuracy gain; training seconds):")
    for ratio in (1, 10):
        for role in ("fast", "slow"):
            for mode in ("sync", "free"):
                rows = [r for r in records if (r["ratio"], r["role"], r["mode"]) == (ratio, role, mode)]
                if rows:
                    gains = [r["accuracy_after"] - r["accuracy_before"] for r in rows]
                    print(
                        f"  R={ratio} {role:4s} {mode}: gain {statistics.fmean(gains):+.3f}, "
                        f"train {statistics.fmean(r['train_seconds'] for r in rows):.1f} s, "
                        f"peer rows {statistics.fmean(r['rows_accepted'] for r in rows):.0f}, "
                        "blocking "
                        f"{100 * statistics.fmean(r['blocking_seconds'] / r['train_seconds'] for r in rows):.1f}%"
                    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["speed", "learning"], required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument(
        "--fast-step", type=float, default=None, help="learning: the fast peer's step time in s (default: measured)"
    )
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "ftis-warm-models"))
    parser.add_argument("--summary-only", action="store_true", help="summarise the raw records, run nothing")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    raw = RESULTS / f"free_running-{args.part}{'-quick' if args.quick else ''}.jsonl"
    if args.summary_only:
        records = [json.loads(line) for line in raw.read_text().splitlines()]
        (summarize_speed if args.part == "speed" else summarize_learning)(records)
        return
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"# {' '.join(sys.argv)} at {rev.strip()} ({time.strftime('%Y-%m-%d %H:%M')})", flush=True)
    with open(raw, "w") as sink:
        (part_speed if args.part == "speed" else part_learning)(args, sink)


if __name__ == "__main__":
    main()
