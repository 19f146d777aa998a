"""Was joining worth it? A swarm peer against its own controls, from the run itself.

A launcher run with `controls: [alone, alone-rows]` trains each swarm peer next to two runs of the same configuration
without peers: `alone` generates the peer's own rows a step (A_N/P: the same own generation), `alone-rows` as many
rows a step as the peer trains on (A_N). With a held-out evaluation every few steps (`eval_every` in the examples),
each run's summary holds every evaluation's step, accuracy, training-clock seconds and per-problem results
(`trl_ftis.evaluation`). From them, per swarm peer:

* **phi at equal steps** ([`phi_value`]): `(gain(swarm) - gain(alone)) / (gain(alone-rows) - gain(alone))`, a gain
  being the mean accuracy over the evaluations after step 0 minus the accuracy at step 0 (the area under the gain
  curve, as `benchmarks/peer_gain.py` measures it): 0 when peer rows taught nothing, 1 when as much as own rows.
* **the target and the time to it** ([`target_offset`], [`reach`]): the target is the accuracy before training plus
  half of the better control's end gain (median over seeds); each arm's steps, own rows and training-clock seconds to
  the first of two consecutive evaluations at or above it; beta = steps(alone) / steps(alone-rows).
* **the hardware factors** ([`hardware_factors`]): f, s, r, q and the two slowdowns a peer shows next to a partner
  (its own generation against `alone`'s, its training against `alone-rows`'), all measured; `trl_ftis.pays` turns
  them and phi and beta into the predicted wall-time ratios.

What an interval covers is part of the result: with several seeds (the launcher's `seeds:`), intervals are over
seeds, and only they may say "ahead" or "behind"; with one seed, the interval is a paired bootstrap over the
evaluation problems, which leaves training noise out, so the reading says what it saw and that another seed can move
each arm by more than that ([`INTERVAL_KINDS`]).

Standard library only (the launcher imports it); every formula is checked against hand-computed values in
`tests/core/test_joining.py`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ARMS",
    "INTERVAL_KINDS",
    "ArmRun",
    "Evaluation",
    "analyse_peer",
    "arm_record",
    "arm_run",
    "geometric_interval",
    "hardware_factors",
    "mean_gain",
    "phi_value",
    "reach",
    "t_interval",
    "target_offset",
]

ARMS = ("swarm", "alone", "alone-rows")
"""A swarm peer and its two controls (`trl_ftis.launcher.controls.CONTROL_KINDS`)."""
INTERVAL_KINDS = {
    "seeds": "95% interval over seeds (training noise included)",
    "problems": "95% paired bootstrap over the evaluation problems of one seed (evaluation noise only: training "
    "noise left out; another seed can move each arm by more than this)",
}
"""What an interval covers, said next to it."""
BOOTSTRAP_DRAWS = 2000
MAX_EVALUATIONS = 2000  # a run's evaluations read from another process's file
MAX_ITEMS = 100_000  # held-out problems per evaluation
CONSECUTIVE = 2  # evaluations at or above the target that count as reaching it (one could be a fluctuation)


@dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation: at `step`, `accuracy`, after `seconds` of training (None: not recorded), with the
    per-problem results `items` ('0'/'1' per problem, the same problems every time; None: not recorded)."""

    step: int
    accuracy: float
    seconds: float | None = None
    items: str | None = None


@dataclass(frozen=True)
class ArmRun:
    """One run of one arm, per optimizer step: `step_seconds`, `generation_seconds`, `exchange_seconds` (its own
    step clock's split) and `own_rows` generated; its `steps` and held-out `evaluations` (by step)."""

    steps: int
    step_seconds: float
    generation_seconds: float
    exchange_seconds: float
    own_rows: float
    evaluations: tuple[Evaluation, ...] = ()


# -- reading a run ---------------------------------------------------------------------------------------------------
def _number(value: Any, what: str, *, low: float = 0.0, high: float = 1e15) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{what} is not a number in [{low:g}, {high:g}]: {value!r:.40}")
    return float(value)


def _evaluations(entries: Any) -> tuple[Evaluation, ...]:
    if entries is None:
        return ()
    if not isinstance(entries, list) or len(entries) > MAX_EVALUATIONS:
        raise ValueError(f"'accuracy_evaluations' is not a list of at most {MAX_EVALUATIONS} evaluations")
    found: dict[int, Evaluation] = {}
    width = None
    for index, entry in enumerate(entries):
        where = f"accuracy_evaluations[{index}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} is not an object")  # noqa: TRY004 - one error type for every bad file
        step = entry.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**53:
            raise ValueError(f"{where}.step is not a step number")
        accuracy = _number(entry.get("accuracy"), f"{where}.accuracy", high=1.0)
        seconds = entry.get("seconds")
        seconds = None if seconds is None else _number(seconds, f"{where}.seconds")
        items = entry.get("items")
        if items is not None:
            if not isinstance(items, str) or not 0 < len(items) <= MAX_ITEMS or set(items) - {"0", "1"}:
                raise ValueError(f"{where}.items is not a string of 0s and 1s (at most {MAX_ITEMS})")
            if width is not None and len(items) != width:
                raise ValueError(f"{where}.items has {len(items)} problems, an earlier evaluation {width}")
            width = len(items)
        found[step] = Evaluation(step, accuracy, seconds, items)  # the last evaluation of a step counts
    return tuple(found[step] for step in sorted(found))


def arm_run(summary: Mapping) -> ArmRun:
    """The [`ArmRun`] of a run's `ftis_summary.json` (or of [`arm_record`]'s compact form); `ValueError` naming
    what is missing or malformed (another process's file: nothing in it is trusted)."""
    if not isinstance(summary, Mapping):
        raise ValueError("a run summary must be a JSON object")  # noqa: TRY004 - one error type for every bad file
    steps = summary.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 < steps < 2**53:
        raise ValueError("'steps' is not a positive integer (did the run train?)")
    if "per_step" in summary:  # arm_record's form
        per_step = summary["per_step"]
        if not isinstance(per_step, Mapping):
            raise ValueError("'per_step' is not an object")
        return ArmRun(
            steps=steps,
            step_seconds=_number(per_step.get("step_seconds"), "per_step.step_seconds"),
            generation_seconds=_number(per_step.get("generation_seconds"), "per_step.generation_seconds"),
            exchange_seconds=_number(per_step.get("exchange_seconds"), "per_step.exchange_seconds"),
            own_rows=_number(per_step.get("own_rows"), "per_step.own_rows"),
            evaluations=_evaluations(summary.get("accuracy_evaluations")),
        )
    times = summary.get("time_seconds")
    if not isinstance(times, Mapping):
        raise ValueError("'time_seconds' is missing (not a trl-ftis run summary?)")  # noqa: TRY004
    own = summary.get("own_generation")
    if not isinstance(own, Mapping):
        raise ValueError("'own_generation' is missing (not a trl-ftis run summary?)")  # noqa: TRY004
    return ArmRun(
        steps=steps,
        step_seconds=_number(times.get("step"), "time_seconds.step") / steps,
        generation_seconds=_number(times.get("generation"), "time_seconds.generation") / steps,
        exchange_seconds=_number(times.get("exchange"), "time_seconds.exchange") / steps,
        own_rows=_number(own.get("rows"), "own_generation.rows") / steps,
        evaluations=_evaluations(summary.get("accuracy_evaluations")),
    )


def arm_record(summary: Mapping) -> dict[str, Any]:
    """A run summary in the compact form the launcher keeps in `summary.json` (what [`arm_run`] reads back):
    `steps`, `per_step` seconds and rows, `accuracy_evaluations`. `ValueError` as [`arm_run`]."""
    run = arm_run(summary)
    return {
        "steps": run.steps,
        "per_step": {
            "step_seconds": run.step_seconds,
            "generation_seconds": run.generation_seconds,
            "exchange_seconds": run.exchange_seconds,
            "own_rows": run.own_rows,
        },
        "accuracy_evaluations": [
            {"step": e.step, "accuracy": e.accuracy, "seconds": e.seconds, "items": e.items} for e in run.evaluations
        ],
    }


# -- the learning side -----------------------------------------------------------------------------------------------
def common_steps(runs: Sequence[ArmRun]) -> list[int]:
    """The steps after 0 at which every run was evaluated: where arms are compared at equal steps."""
    sets = [{e.step for e in run.evaluations if e.step > 0} for run in runs]
    return sorted(set.intersection(*sets)) if sets else []


def _at(run: ArmRun, step: int) -> Evaluation | None:
    return next((e for e in run.evaluations if e.step == step), None)


def mean_gain(run: ArmRun, steps: Sequence[int]) -> float | None:
    """The mean accuracy over the evaluations at `steps` minus the accuracy at step 0; None without step 0."""
    start = _at(run, 0)
    points = [e.accuracy for e in run.evaluations if e.step in set(steps)]
    if start is None or not points:
        return None
    return statistics.fmean(points) - start.accuracy


def end_gain(run: ArmRun, last: int = 3) -> float | None:
    """The gain at the end: the mean of the last `last` evaluations after step 0 minus the accuracy at step 0."""
    start = _at(run, 0)
    trained = [e.accuracy for e in run.evaluations if e.step > 0][-last:]
    return None if start is None or not trained else statistics.fmean(trained) - start.accuracy


def phi_value(swarm: float, full: float, own: float) -> float | None:
    """phi = (swarm - own) / (full - own) of three gains; None when the two controls gained the same (then rows a
    step made no difference, and no row can be valued against them)."""
    if abs(full - own) < 1e-12:
        return None
    return (swarm - own) / (full - own)


def _problem_gains(run: ArmRun, steps: Sequence[int]) -> list[float] | None:
    """Each problem's contribution to [`mean_gain`] (its mean result over `steps` minus its result at step 0), or
    None when the run kept no per-problem results there: their mean is the gain."""
    start = _at(run, 0)
    points = [_at(run, step) for step in steps]
    if start is None or start.items is None or any(p is None or p.items is None for p in points):
        return None
    count = len(points)
    return [
        sum(p.items[i] == "1" for p in points) / count - (start.items[i] == "1")  # type: ignore[union-attr]
        for i in range(len(start.items))
    ]


def _percentile_interval(values: list[float]) -> tuple[float, float] | None:
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if len(values) < 20:
        return None
    return values[int(0.025 * len(values))], values[min(int(0.975 * len(values)), len(values) - 1)]


def bootstrap_problems(
    per_problem: Sequence[Sequence[float]], statistic, draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile 95% interval of `statistic(means)` over problems resampled with replacement, paired across arms:
    `per_problem[a][i]` is arm a's value on problem i, and `means[a]` the resampled mean of arm a."""
    n = len(per_problem[0])
    if n < 2 or any(len(values) != n for values in per_problem):
        return None
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        picks = [rng.randrange(n) for _ in range(n)]
        means = [sum(values[i] for i in picks) / n for values in per_problem]
        out.append(statistic(means))
    return _percentile_interval(out)


def bootstrap_seeds(
    rows: Sequence[Sequence[float]], statistic, draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile 95% interval of `statistic(rows)` over seeds (`rows[k]` holds seed k's values) resampled with
    replacement; None with fewer than 3 seeds."""
    if len(rows) < 3:
        return None
    rng = random.Random(seed)
    return _percentile_interval([statistic([rng.choice(rows) for _ in rows]) for _ in range(draws)])


def ratio_of_means_phi(rows: Sequence[Sequence[float]]) -> float | None:
    """phi of the mean gains over seeds: `rows[k]` = (swarm, alone-rows, alone) gains of seed k."""
    means = [statistics.fmean(row[i] for row in rows) for i in range(3)]
    return phi_value(*means)


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
        2.042)  # fmt: skip
"""Student's t 97.5% quantiles for 1 to 30 degrees of freedom (two-sided 95% intervals)."""


def t_interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the 95% t-interval of the mean of `values`; None with fewer than 2."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    quantile = T975[n - 2] if n - 1 <= len(T975) else 1.96 + 2.4 / (n - 1)
    half = quantile * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def geometric_interval(ratios: Sequence[float]) -> tuple[float, float, float] | None:
    """(geometric mean, low, high) of positive ratios, from the t-interval of their logarithms; None with fewer
    than 2 (a single ratio has no interval)."""
    found = t_interval([math.log(r) for r in ratios])
    return None if found is None else (math.exp(found[0]), math.exp(found[1]), math.exp(found[2]))


def target_offset(seeds: Sequence[Mapping[str, ArmRun]]) -> float | None:
    """The target's distance above the accuracy before training: half of the better control's end gain, median over
    seeds (the swarm peer's own curve is left out: the rule must not favour it). None when no control gained."""
    gains = []
    for runs in seeds:
        ends = [end_gain(runs[arm]) for arm in ("alone", "alone-rows") if runs.get(arm) is not None]
        ends = [gain for gain in ends if gain is not None]
        if ends:
            gains.append(max(ends))
    if not gains or statistics.median(gains) <= 0:
        return None
    return 0.5 * statistics.median(gains)


def reach(run: ArmRun, target: float) -> dict[str, float] | None:
    """The first of [`CONSECUTIVE`] consecutive evaluations after step 0 at or above `target`: its `step`, `seconds`
    of training (None when not recorded) and `own_rows` generated by then; None when the run never got there."""
    trained = [e for e in run.evaluations if e.step > 0]
    for index in range(len(trained) - CONSECUTIVE + 1):
        window = trained[index : index + CONSECUTIVE]
        if all(e.accuracy >= target for e in window):
            first = window[0]
            return {"step": first.step, "seconds": first.seconds, "own_rows": first.step * run.own_rows}
    return None


# -- the hardware side -----------------------------------------------------------------------------------------------
def hardware_factors(swarm: ArmRun, alone: ArmRun | None, full: ArmRun | None) -> dict[str, float | None]:
    """The step-time factors of one seed, each None where a run it needs is missing (A_N = `full`, the
    `alone-rows` control; A_N/P = `alone`):

    * f = A_N's generation share; s = A_N's generation a step over A_N/P's (the generation scaling gen(P x B) /
      gen(B)); q = A_N/P's step over A_N's;
    * r = the swarm peer's exchange share of its step;
    * g = the swarm peer's generation a step over A_N/P's (the same rows: how much slower it generated next to a
      partner); t = the swarm peer's training (its step less generation and exchange) over A_N's step less its
      generation (the same rows trained: how much slower it trained next to a partner);
    * step_ratio = the swarm peer's step over A_N's, measured.
    """

    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    found: dict[str, float | None] = dict.fromkeys(("f", "s", "q", "g", "t", "step_ratio"))
    found["r"] = ratio(swarm.exchange_seconds, swarm.step_seconds)
    if full is not None:
        found["f"] = ratio(full.generation_seconds, full.step_seconds)
        found["step_ratio"] = ratio(swarm.step_seconds, full.step_seconds)
        training = swarm.step_seconds - swarm.generation_seconds - swarm.exchange_seconds
        found["t"] = ratio(max(training, 0.0), full.step_seconds - full.generation_seconds)
    if alone is not None:
        found["g"] = ratio(swarm.generation_seconds, alone.generation_seconds)
    if full is not None and alone is not None:
        found["s"] = ratio(full.generation_seconds, alone.generation_seconds)
        found["q"] = ratio(alone.step_seconds, full.step_seconds)
    return found


# -- one swarm peer, over its seeds ----------------------------------------------------------------------------------
def _interval_of(values: Sequence[float], kind: str) -> dict[str, Any] | None:
    found = t_interval(values)
    if found is None:
        return None
    mean, low, high = found
    return {
        "mean": mean,
        "low": low,
        "high": high,
        "kind": kind,
        "seeds": len(values),
        "positive": sum(v > 0 for v in values),
        "negative": sum(v < 0 for v in values),
    }


def _gain_differences(per_seed: list[dict], problem_rows: list | None) -> dict[str, Any]:
    """swarm - control gains at equal steps, per control: over seeds, or one seed's problem bootstrap."""
    found: dict[str, Any] = {}
    for index, control in ((2, "alone"), (1, "alone-rows")):
        values = [seed["gains"][0] - seed["gains"][index] for seed in per_seed if seed.get("gains")]
        if not values:
            continue
        entry: dict[str, Any] = {"mean": statistics.fmean(values), "seeds": len(values)}
        if len(values) >= 2:
            entry.update(_interval_of(values, "seeds") or {})
        elif problem_rows is not None:
            interval = bootstrap_problems([problem_rows[0], problem_rows[index]], lambda m: m[0] - m[1])
            if interval is not None:
                entry.update({"low": interval[0], "high": interval[1], "kind": "problems"})
        found[control] = entry
    return found


def analyse_peer(seeds: Sequence[Mapping[str, ArmRun | None]], *, target: float | None = None) -> dict[str, Any]:
    """What joining was worth to one swarm peer, from its runs and its controls' in each seed (`seeds[k]` maps
    [`ARMS`] to that seed's runs; a missing control is None). `target`: an accuracy to reach, the same in every
    seed (default: [`target_offset`] above each seed's accuracy before training).

    Returns `seeds` (how many), `interval_kind` (a key of [`INTERVAL_KINDS`]), `phi` ({value, low, high} or None),
    `gain_vs` (swarm - control gain at equal steps, per control), `target` ({offset or accuracy, per seed}),
    `reached` (per arm: per-seed steps, seconds, own rows to the target or None), `beta` and the measured ratios
    to the target (`steps_vs`, `seconds_vs`, `rows_vs`, per control: geometric mean and interval over the seeds
    where both reached it), `hardware` (per-seed factors and their means) and `missing` (what could not be measured
    and why)."""
    seeds = [runs for runs in seeds if runs.get("swarm") is not None]
    missing: list[str] = []
    if not seeds:
        return {"seeds": 0, "missing": ["no swarm run"]}
    has = {arm: all(runs.get(arm) is not None for runs in seeds) for arm in ARMS}
    for arm in ("alone", "alone-rows"):
        if not has[arm]:
            missing.append(f"the {arm} control (add it to `controls:`)")
    evaluated = all(len(run.evaluations) >= 2 for runs in seeds for run in runs.values() if run is not None)
    if not evaluated:
        missing.append("held-out evaluations during training (e.g. tiny_peer's --eval_every)")
    result: dict[str, Any] = {"seeds": len(seeds), "interval_kind": "seeds" if len(seeds) >= 2 else "problems"}

    # The learning side: gains at equal steps.
    per_seed: list[dict[str, Any]] = []
    problem_rows = None
    for runs in seeds:
        arms = [runs[arm] for arm in ARMS if runs.get(arm) is not None]
        steps = common_steps(arms) if evaluated else []
        entry: dict[str, Any] = {}
        if steps and has["alone"] and has["alone-rows"]:
            gains = [mean_gain(runs[arm], steps) for arm in ("swarm", "alone-rows", "alone")]  # type: ignore[arg-type]
            if all(g is not None for g in gains):
                entry["gains"] = gains
                if len(seeds) == 1:
                    rows = [_problem_gains(runs[arm], steps) for arm in ("swarm", "alone-rows", "alone")]  # type: ignore[arg-type]
                    problem_rows = rows if all(r is not None for r in rows) else None
        per_seed.append(entry)
    triples = [entry["gains"] for entry in per_seed if "gains" in entry]
    result["gains"] = triples
    phi = None
    if triples and len(triples) == len(seeds):
        value = ratio_of_means_phi(triples)
        if value is not None:
            phi = {"value": value}
            if len(triples) >= 3:
                interval = bootstrap_seeds(triples, ratio_of_means_phi)
            elif problem_rows is not None:
                interval = bootstrap_problems(problem_rows, lambda m: phi_value(m[0], m[1], m[2]))
            else:
                interval = None
            if interval is not None:
                phi.update({"low": interval[0], "high": interval[1]})
        else:
            missing.append("phi: both controls gained the same, so rows a step made no difference to value against")
    result["phi"] = phi
    result["gain_vs"] = _gain_differences(per_seed, problem_rows)

    # The target and each arm's way to it.
    offset = None
    if target is None and evaluated:
        offset = target_offset([{arm: run for arm, run in runs.items() if run is not None} for runs in seeds])
        if offset is None:
            missing.append("a target: neither control gained accuracy")
    targets = []
    reached: dict[str, list[dict | None]] = {arm: [] for arm in ARMS}
    for runs in seeds:
        start = _at(runs["swarm"], 0)  # type: ignore[arg-type]
        goal = target if target is not None else (start.accuracy + offset if start and offset is not None else None)
        targets.append(goal)
        for arm in ARMS:
            run = runs.get(arm)
            reached[arm].append(reach(run, goal) if run is not None and goal is not None else None)
    result["target"] = {"accuracy": target, "offset": offset, "per_seed": targets}
    result["reached"] = reached
    for arm in ARMS:
        if has[arm] and any(goal is not None for goal in targets) and not all(reached[arm]):
            missing.append(f"{arm}: did not reach the target in every seed (train longer, or a lower target)")

    def ratios(control: str, key: str) -> dict[str, Any] | None:
        values = [
            mine[key] / theirs[key]
            for mine, theirs in zip(reached["swarm"], reached[control], strict=True)
            if mine and theirs and mine.get(key) and theirs.get(key)
        ]
        if not values:
            return None
        interval = geometric_interval(values)
        if interval is None:
            return {"value": values[0], "seeds": 1}
        value, low, high = interval
        return {"value": value, "low": low, "high": high, "seeds": len(values),
                "lower": sum(v < 1 for v in values), "higher": sum(v > 1 for v in values)}  # fmt: skip

    result["steps_vs"] = {control: ratios(control, "step") for control in ("alone", "alone-rows")}
    result["seconds_vs"] = {control: ratios(control, "seconds") for control in ("alone", "alone-rows")}
    result["rows_vs"] = {control: ratios(control, "own_rows") for control in ("alone", "alone-rows")}
    betas = [
        own["step"] / full["step"]
        for own, full in zip(reached["alone"], reached["alone-rows"], strict=True)
        if own and full
    ]
    beta = None
    if betas:
        interval = geometric_interval(betas)
        beta = {"value": betas[0], "seeds": 1} if interval is None else {
            "value": interval[0], "low": interval[1], "high": interval[2], "seeds": len(betas)}  # fmt: skip
    result["beta"] = beta

    # The hardware side: each seed's factors and their means.
    factors = [hardware_factors(runs["swarm"], runs.get("alone"), runs.get("alone-rows")) for runs in seeds]  # type: ignore[arg-type]
    means: dict[str, float | None] = {}
    for key in factors[0]:
        values = [f[key] for f in factors if f[key] is not None]
        means[key] = statistics.fmean(values) if len(values) == len(factors) else None
    result["hardware"] = {"per_seed": factors, "mean": means}
    result["missing"] = missing
    return result
