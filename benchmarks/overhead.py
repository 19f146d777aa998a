"""Overhead of FTISTrainer over TRL's GRPOTrainer, per training step, on tiny local models (CPU).

(a) FTISTrainer without peers vs GRPOTrainer(loss_type="grpo", beta=0.0), same settings, same model, same seed and
    data (hidden 64 and 128, 2 layers; and hidden 512, 4 layers, where the model's own work is larger). Both trainers
    are built once and driven step by step (training_step + clip + optimizer step, as Trainer's loop does); blocks
    of k steps alternate A B / B A. Every step is seeded identically for both
    trainers, so both generate exactly the same completions and, since F-TIS without peers trains bit-identically to
    GRPO, do exactly the same work at every step (checked at the end: parameters equal).
(b) FTISTrainer with N peer rows per step (N = the local row count; rows sampled by a second, smaller tiny model,
    with its real generator log-probs, queued through `add_peer_rows`) vs GRPOTrainer with the same total number of
    rows per step (twice the per-device batch size), and the same FTISTrainer with a row listener registered (what a
    swarm member pays to hand out its own rows). The F-TIS bookkeeping (add_peer_rows, the F-TIS batch fields,
    merging peer rows, the F-TIS loss terms and their metrics) is timed separately, inside the same steps.
(c) cProfile over a few steps of each trainer: where the extra time of FTISTrainer goes.

No absolute time is a result (the machine is shared and noisy): the results are ratios FTIS/GRPO of paired blocks,
as median and interquartile range over blocks; raw medians are printed for context only.

    OMP_NUM_THREADS=1 python benchmarks/overhead.py            # a few minutes
    OMP_NUM_THREADS=1 python benchmarks/overhead.py --quick    # about a minute
"""

from __future__ import annotations

import os

OMP_GIVEN = os.environ.get("OMP_NUM_THREADS")  # as the caller set it, for the command line printed first
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import cProfile  # noqa: E402
import functools  # noqa: E402
import io  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import defaultdict  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(1)

GOAL = 1.03
LOCAL_ROWS = 16  # per-device batch: 2 prompts x 8 generations
NUM_GENERATIONS = 8

# --------------------------------------------------------------------------------------------------------------------
# Helpers shared with exchange.py
# --------------------------------------------------------------------------------------------------------------------


def quiet() -> None:
    """Silence library warnings and info logs that would drown the results."""
    warnings.filterwarnings("ignore")
    for name in ("transformers", "trl", "trl_ftis", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except Exception:
        pass


def quantiles(values):
    """(q25, median, q75) of a list (linear interpolation)."""
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[1], q[2]


def median_ci(values, *, level=0.95, resamples=2000, seed=0):
    """Bootstrap confidence interval of the median (resampling the paired blocks)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    low = medians[int((1 - level) / 2 * resamples)]
    high = medians[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return low, high


def fmt_ratio(values, digits=3, ci=False) -> str:
    q25, med, q75 = quantiles(values)
    text = f"{med:.{digits}f}  [IQR {q25:.{digits}f} - {q75:.{digits}f}]"
    if ci and len(values) > 2:
        low, high = median_ci(values)
        text += f"  (95% CI of the median {low:.{digits}f} - {high:.{digits}f})"
    return text


def verdict(values, goal=GOAL) -> str:
    """Whether the median ratio is at most `goal`, and whether the noise lets us tell."""
    med = statistics.median(values)
    low, high = median_ci(values)
    if high <= goal:
        return f"met: median {med:.3f}, whole 95% CI <= {goal}"
    if low > goal:
        return f"NOT met: median {med:.3f}, whole 95% CI > {goal}"
    return (
        f"{'met' if med <= goal else 'NOT met'} by the median ({med:.3f}), but the 95% CI ({low:.3f} - {high:.3f}) "
        f"straddles {goal}"
    )


def header(command_line: str | None = None) -> None:
    env = f"OMP_NUM_THREADS={OMP_GIVEN} " if OMP_GIVEN is not None else ""
    print(f"$ {command_line or env + ' '.join(shlex.quote(a) for a in ['python', *sys.argv])}")
    import transformers
    import trl

    print(
        f"python {platform.python_version()}, torch {torch.__version__} (threads {torch.get_num_threads()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}), transformers {transformers.__version__}, "
        f"trl {trl.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )


def trainer_args(config_class, output_dir: str, **overrides):
    """A ``config_class`` (TRL's GRPOConfig or FTISConfig) with the tests' CPU settings (the tiny models' settings of
    `trl_ftis.demo.tiny.tiny_grpo_config` with tests/conftest.py's batch and lr), plus the paper recipe GRPOTrainer
    needs to match F-TIS."""
    from trl_ftis.demo.tiny import tiny_grpo_config

    settings = {
        "max_steps": 100_000,
        "per_device_train_batch_size": LOCAL_ROWS,
        "num_generations": NUM_GENERATIONS,
        "learning_rate": 1e-3,
        "loss_type": "grpo",
        "beta": 0.0,
        "disable_dropout": True,
        "cast_lm_head_to_fp32": True,
    }
    settings.update(overrides)
    return tiny_grpo_config(output_dir, config_class=config_class, **settings)


def build_trainer(kind: str, model, tokenizer, dataset, output_dir: str, **overrides):
    """kind: "grpo" (TRL's GRPOTrainer) or "ftis" (FTISTrainer), same settings."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_ftis import FTISConfig, FTISTrainer
    from trl_ftis.tasks.addition import digit_match_reward

    config_class, trainer_class = (GRPOConfig, GRPOTrainer) if kind == "grpo" else (FTISConfig, FTISTrainer)
    args = trainer_args(config_class, output_dir, **overrides)
    return trainer_class(model, digit_match_reward, args=args, train_dataset=dataset, processing_class=tokenizer)


class StepDriver:
    """Drives a (GRPO or FTIS) trainer one optimizer step at a time, as Trainer's inner loop does for
    gradient_accumulation_steps=1: training_step (generation, scoring, loss, backward), gradient clipping,
    optimizer and scheduler step, zero_grad, global_step += 1. Returns the wall time of each step."""

    def __init__(self, trainer, num_training_steps: int = 100_000):
        self.trainer = trainer
        trainer.create_optimizer_and_scheduler(num_training_steps=num_training_steps)
        self.loader = trainer.get_train_dataloader()
        self.iterator = iter(self.loader)
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        self.before_step = None  # optional callable(trainer), timed as part of the step (e.g. add_peer_rows)

    def next_batch(self):
        try:
            return next(self.iterator)
        except StopIteration:  # a new epoch
            self.iterator = iter(self.loader)
            return next(self.iterator)

    def step(self, seed: int) -> float:
        trainer = self.trainer
        batch = self.next_batch()
        torch.manual_seed(seed)  # the same sampling randomness for every trainer at this step
        cpu_start = time.process_time()
        start = time.perf_counter()
        if self.before_step is not None:
            self.before_step(trainer)
        trainer.training_step(trainer.model, batch, None)
        if trainer.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.model.zero_grad()
        trainer.state.global_step += 1
        wall = time.perf_counter() - start
        self.last_cpu = time.process_time() - cpu_start
        return wall

    def trl_step_times(self) -> list[float]:
        """TRL's own `step_time` metric (training_step only), one per step so far."""
        return list(self.trainer._metrics["train"]["step_time"])


def run_alternating(drivers: dict, *, warmup: int, blocks: int, k: int, seed0: int = 1000, progress: str = ""):
    """Blocks of `k` steps of each driver, alternating the order (A B, B A, ...); every driver sees the same seed at
    the same step index. Returns ({name: [[wall seconds per step] per block]}, the same for CPU seconds)."""
    names = list(drivers)
    for i in range(warmup):
        for name in names:
            drivers[name].step(seed0 + i)
    times = {name: [] for name in names}
    cpu = {name: [] for name in names}
    step = warmup
    for b in range(blocks):
        order = names if b % 2 == 0 else names[::-1]
        for name in order:
            walls, cpus = [], []
            for j in range(k):
                walls.append(drivers[name].step(seed0 + step + j))
                cpus.append(drivers[name].last_cpu)
            times[name].append(walls)
            cpu[name].append(cpus)
        step += k
        if progress and (b + 1) % max(1, blocks // 4) == 0:
            print(f"  {progress}: block {b + 1}/{blocks}", file=sys.stderr, flush=True)
    return times, cpu


class SectionTimer:
    """Wraps instance methods with perf_counter timers (cost: two perf_counter calls per call, well under a
    microsecond), accumulating seconds per section; `take()` returns and resets the per-step totals."""

    def __init__(self):
        self.totals = defaultdict(float)
        self.calls = defaultdict(list)  # every call's seconds, per section

    def wrap(self, obj, method: str, section: str | None = None):
        original = getattr(obj, method)
        section = section or method

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.totals[section] += elapsed
                self.calls[section].append(elapsed)

        setattr(obj, method, timed)

    def take(self) -> dict:
        totals, self.totals = dict(self.totals), defaultdict(float)
        return totals


def ftis_bookkeeping_sections(trainer, timer: SectionTimer) -> list[str]:
    """Time what FTISTrainer does on top of GRPOTrainer (its own code paths only)."""
    sections = {"add_peer_rows": "add_peer_rows (checks)", "_merge_peer_rows": "merge peer rows"}
    hook_sections = {"apply": "F-TIS loss terms + metrics", "log_terms": "  of which metrics"}  # its FTISLossHook
    for method, section in sections.items():
        timer.wrap(trainer, method, section)
    for method, section in hook_sections.items():
        timer.wrap(trainer._loss_hook, method, section)
    return [*sections.values(), *hook_sections.values()]


# --------------------------------------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------------------------------------


def block_ratios(times: dict, a: str, b: str) -> list[float]:
    return [sum(tb) / sum(ta) for ta, tb in zip(times[a], times[b], strict=True)]


def step_median_ms(times: dict, name: str) -> float:
    return 1e3 * statistics.median(t for block in times[name] for t in block)


def report_pair(times, cpu, trl_steps, a="grpo", b="ftis", label="FTIS/GRPO"):
    ratios = block_ratios(times, a, b)
    print(f"  {label} per step (wall time, {len(ratios)} paired blocks): {fmt_ratio(ratios, ci=True)}")
    cpu_ratios = block_ratios(cpu, a, b)
    print(f"  {label} per step (CPU time of the process, same blocks): {fmt_ratio(cpu_ratios, ci=True)}")
    # TRL's own step_time metric (training_step only: generation + loss + backward), paired step by step.
    pairs = [tb / ta for ta, tb in zip(trl_steps[a], trl_steps[b], strict=True)]
    print(f"  {label} of TRL's step_time metric (per step, {len(pairs)} pairs): {fmt_ratio(pairs)}")
    return ratios, cpu_ratios


def raw_medians(times, labels: dict) -> None:
    print(
        "  raw medians (context only): "
        + ", ".join(f"{label} {step_median_ms(times, name):.1f} ms/step" for name, label in labels.items())
    )


def bench_no_peers(hidden: int, args, tokenizer, dataset, tmp: str, *, layers: int = 2, blocks=None, k=None) -> dict:
    from trl_ftis.demo.tiny import build_tiny_llama

    blocks, k = blocks or args.blocks, k or args.k
    model = build_tiny_llama(tokenizer, hidden_size=hidden, num_layers=layers, seed=0)
    grpo = build_trainer("grpo", copy.deepcopy(model), tokenizer, dataset, f"{tmp}/grpo{hidden}-{layers}")
    ftis = build_trainer("ftis", copy.deepcopy(model), tokenizer, dataset, f"{tmp}/ftis{hidden}-{layers}")
    drivers = {"grpo": StepDriver(grpo), "ftis": StepDriver(ftis)}
    timer = SectionTimer()
    names = ftis_bookkeeping_sections(ftis, timer)
    run_alternating(drivers, warmup=args.warmup, blocks=0, k=1)
    timer.take()  # not the warm-up steps
    times, cpu = run_alternating(drivers, warmup=0, blocks=blocks, k=k, progress=f"(a) hidden {hidden}")
    sections = timer.take()
    n_warm = args.warmup
    trl_steps = {name: driver.trl_step_times()[n_warm:] for name, driver in drivers.items()}
    identical = all(torch.equal(p, q) for p, q in zip(grpo.model.parameters(), ftis.model.parameters(), strict=True))
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"\n(a) no peers, hidden {hidden}, {layers} layers ({n_params / 1e3:.0f}k parameters), {LOCAL_ROWS} "
        f"rows/step, {blocks} blocks x {k} steps per trainer"
    )
    ratios, cpu_ratios = report_pair(times, cpu, trl_steps)
    raw_medians(times, {"grpo": "GRPO", "ftis": "FTIS"})
    total_ftis = sum(t for block in times["ftis"] for t in block)
    shares = {name: sections[name] / total_ftis for name in names if name in sections}
    steps = sum(len(block) for block in times["ftis"])
    print(
        "  F-TIS code paths, share of the FTIS step (ms per step): "
        + ", ".join(
            f"{name.strip()} {100 * share:.2f}% ({1e3 * sections[name] / steps:.2f})" for name, share in shares.items()
        )
    )
    print(
        f"  parameters identical after {len(trl_steps['ftis']) + n_warm} steps each (same work in both): {identical}"
    )
    print(f"  goal <= {GOAL}, wall time: {verdict(ratios)}")
    print(f"  goal <= {GOAL}, CPU time:  {verdict(cpu_ratios)}")
    return {"ratios": ratios, "cpu_ratios": cpu_ratios, "shares": shares, "identical": identical}


def collect_peer_pool(tokenizer, dataset, tmp: str, rounds: int, hidden: int = 32):
    """Rows sampled by a second tiny model (hidden 32, another seed), with the generator log-probs its trainer
    publishes to listeners: `rounds` lists of LOCAL_ROWS rows."""
    from trl_ftis.demo.tiny import build_tiny_llama

    peer = build_trainer(
        "ftis",
        build_tiny_llama(tokenizer, hidden_size=hidden, seed=7),
        tokenizer,
        dataset,
        f"{tmp}/peer",
        max_steps=rounds,
        seed=7,
        logging_steps=1000,
    )
    published = []
    peer.add_row_listener(published.append)
    with contextlib.redirect_stdout(io.StringIO()):  # Trainer prints its final metrics
        peer.train()
    for rows in published:
        for row in rows:
            row.sender = "small"
    return published


def bench_with_peers(hidden: int, args, tokenizer, dataset, tmp: str) -> dict:
    from trl_ftis.demo.tiny import build_tiny_llama

    pool = collect_peer_pool(tokenizer, dataset, f"{tmp}/pool{hidden}", rounds=args.pool)
    model = build_tiny_llama(tokenizer, hidden_size=hidden, seed=0)
    grpo = build_trainer(
        "grpo",
        copy.deepcopy(model),
        tokenizer,
        dataset,
        f"{tmp}/grpo2x{hidden}",
        per_device_train_batch_size=2 * LOCAL_ROWS,
    )
    ftis = build_trainer("ftis", copy.deepcopy(model), tokenizer, dataset, f"{tmp}/ftispeers{hidden}")
    listening = build_trainer("ftis", copy.deepcopy(model), tokenizer, dataset, f"{tmp}/ftislisten{hidden}")
    listening.add_row_listener(lambda rows: None)  # as in a swarm: own rows, with generator log-probs, handed out
    drivers = {"grpo": StepDriver(grpo), "ftis": StepDriver(ftis), "listen": StepDriver(listening)}
    rounds = defaultdict(int)

    def add_rows(trainer):
        trainer.add_peer_rows(pool[rounds[id(trainer)] % len(pool)])
        rounds[id(trainer)] += 1

    drivers["ftis"].before_step = drivers["listen"].before_step = add_rows
    timer = SectionTimer()
    names = ftis_bookkeeping_sections(ftis, timer)
    loss_timers = {name: SectionTimer() for name in ("grpo", "ftis")}
    for name, loss_timer in loss_timers.items():
        loss_timer.wrap(drivers[name].trainer, "compute_loss", "loss")
    own_rows_timer = SectionTimer()
    own_rows_timer.wrap(listening, "_own_rows", "own rows")
    run_alternating(drivers, warmup=args.warmup, blocks=0, k=1)
    timer.take()  # not the warm-up steps
    times, cpu = run_alternating(drivers, warmup=0, blocks=args.blocks, k=args.k, progress=f"(b) hidden {hidden}")
    sections = timer.take()
    n_warm = args.warmup
    trl_steps = {name: driver.trl_step_times()[n_warm:] for name, driver in drivers.items()}
    peer_rows = ftis._metrics["train"]["ftis/peer_rows"][n_warm:]
    print(
        f"\n(b) {LOCAL_ROWS} own + {LOCAL_ROWS} peer rows/step (FTIS) vs {2 * LOCAL_ROWS} own rows/step (GRPO), "
        f"hidden {hidden}, {args.blocks} blocks x {args.k} steps per trainer"
    )
    print(
        f"  peer rows merged per FTIS step: median {statistics.median(peer_rows):.0f} "
        f"(sampled by a hidden-32 peer; {len(pool)} recorded rounds reused in turn)"
    )
    filtered = ftis._metrics["train"].get("ftis/peer/filtered_frac", [])
    weights = ftis._metrics["train"].get("ftis/peer/is_weight_mean", [])
    if weights:
        print(
            f"  peer rows: mean truncated IS weight {statistics.mean(weights):.3f}, "
            f"filtered fraction {statistics.mean(filtered):.3f} (kl_threshold 50; the weights are really applied)"
        )
    ratios, cpu_ratios = report_pair(times, cpu, trl_steps)
    print("  (FTIS samples 16 rows and GRPO 32: the peer rows' sampling is paid by the peer, their merging by FTIS)")
    listen_ratios, listen_cpu = report_pair(times, cpu, trl_steps, a="ftis", b="listen", label="FTIS+listener/FTIS")
    print(
        "  (the listener's cost: generator log-probs recorded during generate, own rows turned into PeerRows, "
        "as every swarm member pays)"
    )
    raw_medians(times, {"grpo": "GRPO 32 rows", "ftis": "FTIS 16+16", "listen": "FTIS 16+16 + listener"})
    identical = all(
        torch.equal(p, q) for p, q in zip(ftis.model.parameters(), listening.model.parameters(), strict=True)
    )
    print(f"  FTIS with and without listener end with identical parameters: {identical}")
    total_ftis = sum(t for block in times["ftis"] for t in block)
    steps = sum(len(block) for block in times["ftis"])
    print(
        "  F-TIS bookkeeping, share of the FTIS step (same steps; median step "
        f"{step_median_ms(times, 'ftis'):.1f} ms):"
    )
    for name in names:
        seconds = sections.get(name, 0.0)
        print(f"    {name:<28} {100 * seconds / total_ftis:6.2f}%   ({1e3 * seconds / steps:.2f} ms/step)")
    own = sum(sections.get(n, 0.0) for n in names if not n.startswith("  "))
    print(f"    {'total':<28} {100 * own / total_ftis:6.2f}%   ({1e3 * own / steps:.2f} ms/step)")
    own_rows = own_rows_timer.calls["own rows"][n_warm:]
    listen_total = sum(t for block in times["listen"] for t in block)
    print(
        f"    {'(listener) _own_rows':<28} {100 * sum(own_rows) / listen_total:6.2f}%   "
        f"({1e3 * statistics.mean(own_rows):.2f} ms/step) of the FTIS+listener step"
    )
    loss = {name: loss_timer.calls["loss"][n_warm:] for name, loss_timer in loss_timers.items()}
    pairs = [f / g for g, f in zip(loss["grpo"], loss["ftis"], strict=True)]
    print(
        f"  compute_loss alone (forward + loss, {2 * LOCAL_ROWS} rows in both), FTIS/GRPO per step: "
        f"{fmt_ratio(pairs, ci=True)}; raw medians GRPO {1e3 * statistics.median(loss['grpo']):.2f} ms, "
        f"FTIS {1e3 * statistics.median(loss['ftis']):.2f} ms"
    )
    return {
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        "listen_ratios": listen_ratios,
        "listen_cpu": listen_cpu,
        "bookkeeping_share": own / total_ftis,
    }


def profile_steps(args, tokenizer, dataset, tmp: str, with_peers: bool) -> None:
    """cProfile a few steps of each trainer (hidden 64) and list where FTIS spends more time than GRPO."""
    from trl_ftis.demo.tiny import build_tiny_llama

    model = build_tiny_llama(tokenizer, hidden_size=64, seed=0)
    extra = {"per_device_train_batch_size": 2 * LOCAL_ROWS} if with_peers else {}
    grpo = build_trainer("grpo", copy.deepcopy(model), tokenizer, dataset, f"{tmp}/pg{with_peers}", **extra)
    ftis = build_trainer("ftis", copy.deepcopy(model), tokenizer, dataset, f"{tmp}/pf{with_peers}")
    drivers = {"grpo": StepDriver(grpo), "ftis": StepDriver(ftis)}
    if with_peers:
        pool = collect_peer_pool(tokenizer, dataset, tmp + f"/pp{with_peers}", rounds=args.pool)
        counter = {"round": 0}

        def add_rows(trainer):
            trainer.add_peer_rows(pool[counter["round"] % len(pool)])
            counter["round"] += 1

        drivers["ftis"].before_step = add_rows
    run_alternating(drivers, warmup=args.warmup, blocks=0, k=1)
    profiles = {name: cProfile.Profile() for name in drivers}
    for i in range(args.profile_steps):
        for name in list(drivers) if i % 2 == 0 else list(drivers)[::-1]:
            profiles[name].enable()
            drivers[name].step(9000 + i)
            profiles[name].disable()
    stats = {name: pstats.Stats(profile) for name, profile in profiles.items()}
    n = args.profile_steps
    total = {name: s.total_tt / n for name, s in stats.items()}
    label = f"{LOCAL_ROWS}+{LOCAL_ROWS} peer rows vs {2 * LOCAL_ROWS} own rows" if with_peers else "no peers"
    print(f"\n(c) cProfile, hidden 64, {label}, {n} steps each (profiling inflates Python-heavy code):")
    print(
        f"  profiled time per step: GRPO {1e3 * total['grpo']:.1f} ms, FTIS {1e3 * total['ftis']:.1f} ms, "
        f"ratio {total['ftis'] / total['grpo']:.3f}"
    )
    ftis_stats, grpo_stats = stats["ftis"].stats, stats["grpo"].stats  # {(file, line, name): (cc, nc, tt, ct, _)}
    own = [
        (ct / n, nc / n, short_name(key))
        for key, (cc, nc, tt, ct, callers) in ftis_stats.items()
        if f"{os.sep}trl_ftis{os.sep}" in key[0] and key[2] not in ("<module>", "<genexpr>", "<listcomp>")
    ]
    own.sort(reverse=True)
    print("  trl_ftis functions in the FTIS profile (cumulative time per step; nested calls overlap):")
    for ct, calls, name in own[: args.profile_rows]:
        print(f"    {1e3 * ct:7.2f} ms  {100 * ct / total['ftis']:5.1f}%  {calls:5.1f} calls  {name}")
    diffs = []
    for key, (cc, nc, tt, ct, callers) in ftis_stats.items():
        base = grpo_stats.get(key, (0, 0, 0.0, 0.0, None))
        if nc > base[1]:  # called more often in FTIS: work GRPO does not do (timing differences alone are noise)
            diffs.append(((tt - tt * base[1] / nc) / n, (nc - base[1]) / n, short_name(key)))
    diffs.sort(reverse=True)
    print("  functions FTIS calls more often than GRPO, by the self time of the extra calls (per step):")
    for dt, dcalls, name in diffs[: args.profile_rows]:
        print(f"    {1e3 * dt:+7.3f} ms  {dcalls:+7.1f} calls  {name}")


def short_name(key) -> str:
    filename, line, function = key
    if filename == "~":
        return function
    return f"{os.path.basename(filename)}:{line}({function})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Per-step overhead of FTISTrainer over GRPOTrainer on tiny CPU models (ratios, median and IQR "
        "over alternating paired blocks). Goal: <= 1.03 without peers.",
    )
    parser.add_argument("--quick", action="store_true", help="a minute or two: fewer blocks, hidden 64 only")
    parser.add_argument("--hidden", type=int, nargs="+", default=None, help="hidden sizes for (a) [64 128]")
    parser.add_argument("--blocks", type=int, default=None, help="paired blocks per comparison [40; quick 12]")
    parser.add_argument("--k", type=int, default=None, help="steps per trainer per block [10; quick 4]")
    parser.add_argument("--warmup", type=int, default=4, help="unmeasured steps per trainer first [4]")
    parser.add_argument("--pool", type=int, default=8, help="rounds of peer rows recorded from the peer model [8]")
    parser.add_argument("--profile-steps", type=int, default=None, help="cProfile steps per trainer [30; quick 10]")
    parser.add_argument("--profile-rows", type=int, default=12, help="rows of each profile table [12]")
    parser.add_argument(
        "--scale-hidden",
        type=int,
        default=None,
        help="(a) also on a larger model with this hidden size and 4 layers, 0 to skip [512; quick 0]",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip (c)")
    parser.add_argument("--skip-peers", action="store_true", help="skip (b)")
    args = parser.parse_args(argv)
    args.hidden = args.hidden or ([64] if args.quick else [64, 128])
    args.blocks = args.blocks or (12 if args.quick else 40)
    args.k = args.k or (4 if args.quick else 10)
    args.profile_steps = args.profile_steps or (10 if args.quick else 30)
    if args.scale_hidden is None:
        args.scale_hidden = 0 if args.quick else 512

    quiet()
    header()
    from trl_ftis.demo.tiny import build_char_tokenizer
    from trl_ftis.tasks.addition import addition_dataset

    tokenizer = build_char_tokenizer()
    dataset = addition_dataset(2048, seed=1)
    started = time.perf_counter()
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in args.hidden:
            result = bench_no_peers(hidden, args, tokenizer, dataset, tmp)
            summary.append((f"(a) no peers, hidden {hidden}", result))
        if args.scale_hidden:
            # A larger model: the F-TIS code paths cost the same per step, so their share falls (fewer, shorter
            # blocks).
            result = bench_no_peers(
                args.scale_hidden,
                args,
                tokenizer,
                dataset,
                tmp,
                layers=4,
                blocks=max(8, args.blocks // 2),
                k=max(2, args.k // 2 - 1),
            )
            summary.append((f"(a) no peers, hidden {args.scale_hidden}, 4 layers", result))
        if not args.skip_peers:
            for hidden in args.hidden[:1] if args.quick else args.hidden:
                result = bench_with_peers(hidden, args, tokenizer, dataset, tmp)
                summary.append((f"(b) FTIS 16+16 peer / GRPO 32 rows, hidden {hidden}", result))
                summary.append(
                    (
                        f"(b) FTIS listener on / off, hidden {hidden}",
                        {"ratios": result["listen_ratios"], "cpu_ratios": result["listen_cpu"]},
                    )
                )
        if not args.no_profile:
            profile_steps(args, tokenizer, dataset, tmp, with_peers=False)
            if not args.skip_peers:
                profile_steps(args, tokenizer, dataset, tmp, with_peers=True)
    print("\nSummary: FTIS/GRPO time per step, median [IQR] over paired blocks")
    for name, result in summary:
        print(f"  {name:<46} wall {fmt_ratio(result['ratios'])}   CPU {fmt_ratio(result['cpu_ratios'])}")
    print(f"(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
