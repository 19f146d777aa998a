"""What `trl-ftis demo` tells its user: the noise rule, the verdicts, the table, `results.json` and `curves.png`.

One function, [`assess`], decides every verdict; the console lines ([`verdict_lines`], [`format_table`]) and the
`assessment` of `results.json` are both rendered from its output, so the two cannot disagree.

**Noise.** An accuracy `p` measured on `n` held-out problems has a standard error `sqrt(p (1 - p) / n)`; the change
between two accuracies (before and after, or a peer and a baseline) has `sqrt((p0 (1 - p0) + p1 (1 - p1)) / n)`,
taken as for independent samples (conservative, since both are measured on the same problems). A change counts as
outside the noise when it is larger than two of these standard errors.

**Rounding.** Every float in `results.json` is rounded to [`SIGNIFICANT_DIGITS`] (4) significant digits (0.3250000179
-> 0.325, 1.0000300248 -> 1.0, 0.0012345 -> 0.001234), non-finite floats are written as `null`; integers are kept.
The verdicts are decided on the unrounded numbers, the console prints the rounded ones to 3 decimals.

**Curves.** The reward panel shows each peer's per-step reward (a mean over one step's 8 or 16 completions) faintly
and its trailing moving average over [`SMOOTHING_WINDOW`] steps ([`moving_average`]) in full; the accuracy panel
draws +/- 2 standard errors around each point; the last two panels show, per swarm peer and step, the peer rows
accepted and filtered and the mean (and max) truncated importance weight `w` of the peer rows' tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

BASELINES = ("alone", "alone-rows")
SIGNIFICANT_DIGITS = 4
SMOOTHING_WINDOW = 4
"""Steps in the reward panel's trailing moving average (fewer at the start of a run)."""
PEER_ROW_METRICS = {
    "accepted": "ftis/peer_rows_accepted",
    "filtered": "ftis/peer_rows_filtered",
    "is_weight_mean": "ftis/peer/is_weight_mean",
    "is_weight_max": "ftis/peer/is_weight_max",
}
"""The per-step F-TIS metrics a peer logs (its `log_history.json`) that `curves.png` plots, by their short name."""
OUTSIDE, INSIDE = "outside two standard errors", "inside the noise"


# ----------------------------------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------------------------------
def round_significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float | None:
    """`value` rounded to `digits` significant digits; `None` for NaN and infinities (JSON has neither)."""
    if not math.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def rounded(data, digits: int = SIGNIFICANT_DIGITS):
    """`data` (dicts, lists, tuples, numbers, strings) with every float through [`round_significant`]; tuples become
    lists, as JSON writes them."""
    if isinstance(data, bool) or data is None or isinstance(data, (int, str)):
        return data
    if isinstance(data, float):
        return round_significant(data, digits)
    if isinstance(data, dict):
        return {key: rounded(value, digits) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [rounded(value, digits) for value in data]
    return data


def standard_error(p: float, n: int) -> float:
    """The standard error of an accuracy `p` measured on `n` problems: `sqrt(p (1 - p) / n)`."""
    return math.sqrt(p * (1 - p) / max(n, 1))


def two_standard_errors(before: float, after: float, n: int) -> float:
    """Two standard errors of the change between two accuracies measured on `n` problems, taken as for independent
    samples (`2 sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n)`: conservative for the same problems)."""
    return 2 * math.sqrt((before * (1 - before) + after * (1 - after)) / max(n, 1))


def moving_average(values: Sequence[float], window: int = SMOOTHING_WINDOW) -> list[float]:
    """The trailing moving average: point `i` is the mean of `values[max(0, i - window + 1) : i + 1]` (fewer than
    `window` values at the start)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Verdicts: one assessment, rendered on the console and stored in results.json
# ----------------------------------------------------------------------------------------------------------------
def _difference(p0: float, p1: float, n: int) -> dict:
    two_se = two_standard_errors(p0, p1, n)
    return {"difference": p1 - p0, "standard_error": two_se / 2, "two_standard_errors": two_se}


def assess(results: dict, eval_size: int) -> dict:
    """Every verdict of a demo run, JSON-able and rounded ([`rounded`]): per finished peer its accuracy before and
    after, the change, its standard error and two of them, whether it is outside two standard errors and the
    verdict's words, and its final accuracy against each baseline's (`versus`); the peers that moved (`moved`); and
    the console's verdict lines (`console`, rendered from the rounded numbers by [`verdict_lines`])."""
    finals = {
        peer: r["accuracy_after"]
        for peer, r in results.items()
        if "error" not in r and r.get("accuracy_after") is not None and math.isfinite(r["accuracy_after"])
    }
    peers = {}
    for peer, r in results.items():
        if peer not in finals or r.get("accuracy_before") is None or not math.isfinite(r["accuracy_before"]):
            continue
        before, after = r["accuracy_before"], r["accuracy_after"]
        change = _difference(before, after, eval_size)
        beyond = abs(change["difference"]) > change["two_standard_errors"]
        versus = {}
        for baseline in BASELINES:
            if baseline in finals and baseline != peer:
                entry = _difference(finals[baseline], after, eval_size)
                versus[baseline] = {**entry, "beyond_noise": abs(entry["difference"]) > entry["two_standard_errors"]}
        peers[peer] = {
            "accuracy_before": before,
            "accuracy_after": after,
            "change": change["difference"],
            "standard_error": change["standard_error"],
            "two_standard_errors": change["two_standard_errors"],
            "beyond_noise": beyond,
            "verdict": OUTSIDE if beyond else INSIDE,
            "versus": versus,
        }
    assessment = rounded(
        {
            "eval_size": eval_size,
            "rule": "a change counts when it is larger than two standard errors, "
            "SE = sqrt((p0 (1 - p0) + p1 (1 - p1)) / n), as for independent samples (conservative for the same "
            "problems)",
            "peers": peers,
            "moved": [peer for peer, entry in peers.items() if entry["beyond_noise"]],
        }
    )
    assessment["console"] = verdict_lines(assessment)
    return assessment


def verdict_lines(assessment: dict) -> list[str]:
    """The console's verdict, from an [`assess`] result: one line per peer (its change against two standard errors),
    one on which peers moved, one on the swarm peers against the baselines ([`baseline_sentence`])."""
    n = assessment["eval_size"]
    lines = [
        f"{peer:10s} change {e['change']:+.3f}, standard error {e['standard_error']:.3f}, two standard errors "
        f"{e['two_standard_errors']:.3f}: {e['verdict']}"
        for peer, e in assessment["peers"].items()
    ]
    if assessment["moved"]:
        lines.append(f"Changed by more than two standard errors: {', '.join(assessment['moved'])}.")
    else:
        lines.append(
            f"No peer's held-out accuracy changed by more than two standard errors ({n} problems): this run "
            "shows the swarm working, not a measurable learning effect."
        )
    lines.append(baseline_sentence(assessment))
    return lines


def baseline_sentence(assessment: dict) -> str:
    """Which swarm peers' final accuracy differs from a baseline's by more than two standard errors (one run, so a
    difference inside them cannot rank the two)."""
    pairs = [
        (peer, baseline, entry)
        for peer, e in assessment["peers"].items()
        if peer not in BASELINES
        for baseline, entry in e["versus"].items()
    ]
    if not pairs:
        return "No swarm peer and baseline both finished: nothing to compare."
    apart = [f"{peer} vs {b} {entry['difference']:+.3f}" for peer, b, entry in pairs if entry["beyond_noise"]]
    if apart:
        return f"Final accuracies more than two standard errors apart: {', '.join(apart)}."
    return (
        "No swarm peer's final accuracy differs from a baseline's by more than two standard errors: one run on "
        f"{assessment['eval_size']} problems cannot rank them (the benchmarks compare settings over paired seeds)."
    )


def format_table(results: dict, assessment: dict) -> str:
    """One line per peer: rows generated and trained on a step, accuracy before/after, the change against two
    standard errors, the difference to each baseline's final accuracy, rows received and filtered (the accuracy
    columns from an [`assess`] result)."""
    header = (
        f"{'peer':10s} {'model':26s} {'gen/step':>8s} {'rows/step':>9s} {'before':>6s} {'after':>6s} "
        f"{'change':>7s} {'2 SE':>5s} {'vs alone':>8s} {'vs rows':>8s} {'received':>8s} {'filtered':>8s}"
    )
    lines = [header, "-" * len(header)]
    for peer, r in results.items():
        if "error" in r:
            lines.append(f"{peer:10s} {r['error']}")
            continue
        model = ("LoRA " if r.get("lora") else "") + Path(r.get("model", "?")).name
        e = assessment["peers"].get(peer)
        if e is None:
            accuracy = f"{'-':>6s} {'-':>6s} {'-':>7s} {'-':>5s} {'':>8s} {'':>8s}"
        else:
            versus = [f"{e['versus'][b]['difference']:+.3f}" if b in e["versus"] else "" for b in BASELINES]
            accuracy = (
                f"{e['accuracy_before']:>6.3f} {e['accuracy_after']:>6.3f} {e['change']:>+7.3f} "
                f"{e['two_standard_errors']:>5.3f} {versus[0]:>8s} {versus[1]:>8s}"
            )
        lines.append(
            f"{peer:10s} {model[:26]:26s} {r.get('own_rows_per_step', 0):>8d} {r.get('rows_per_step', 0):>9.1f} "
            f"{accuracy} {r.get('rows_accepted', 0):>8d} {r.get('rows_filtered', 0):>8d}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# curves.png: one small function per panel
# ----------------------------------------------------------------------------------------------------------------
def _finished(results: dict) -> dict:
    return {peer: r for peer, r in results.items() if "error" not in r}


def _colors(results: dict) -> dict:
    """One colour per peer, the same in every panel."""
    palette = [f"C{i}" for i in range(10)]
    return {peer: palette[i % len(palette)] for i, peer in enumerate(results)}


def plot_reward(axis, results: dict, colors: dict, window: int = SMOOTHING_WINDOW) -> None:
    """Per-step reward faintly, its [`moving_average`] over `window` steps in full (labelled)."""
    for peer, r in _finished(results).items():
        if not r.get("reward_curve"):
            continue
        steps, rewards = zip(*r["reward_curve"])
        axis.plot(steps, rewards, color=colors[peer], alpha=0.25, linewidth=1)
        axis.plot(steps, moving_average(rewards, window), color=colors[peer], linewidth=2, label=peer)
    axis.set(
        title=f"training reward, own rows\n(line: mean of the last {window} steps; faint: each step)",
        xlabel="step",
        ylabel="reward",
    )


def plot_accuracy(axis, results: dict, colors: dict, eval_size: int) -> None:
    """Held-out accuracy at each evaluation with +/- 2 standard errors, the peers dodged a little along x."""
    finished = {peer: r for peer, r in _finished(results).items() if r.get("accuracy_curve")}
    last = max((step for r in finished.values() for step, _ in r["accuracy_curve"]), default=1)
    dodge = 0.015 * max(last, 1)
    for index, (peer, r) in enumerate(finished.items()):
        points = [(s, a) for s, a in r["accuracy_curve"] if a is not None and math.isfinite(a)]
        if not points:
            continue
        steps, accuracy = zip(*points)
        shift = (index - (len(finished) - 1) / 2) * dodge
        axis.errorbar(
            [s + shift for s in steps],
            accuracy,
            yerr=[2 * standard_error(a, eval_size) for a in accuracy],
            color=colors[peer],
            marker="o",
            capsize=3,
            label=peer,
        )
    axis.set(
        title=f"held-out greedy accuracy, {eval_size} problems\n(bars: +/- 2 standard errors)",
        xlabel="step",
        ylabel="accuracy",
    )


def _curve(r: dict, name: str) -> tuple[tuple, tuple]:
    points = (r.get("peer_row_curves") or {}).get(name) or []
    return tuple(zip(*points)) if points else ((), ())


def _swarm_peers(results: dict) -> dict:
    """The finished peers that trained on peer rows (not the `train_alone` baselines) and logged them."""
    return {
        peer: r
        for peer, r in _finished(results).items()
        if not r.get("train_alone") and peer not in BASELINES and _curve(r, "accepted")[0]
    }


def plot_peer_rows(axis, results: dict, colors: dict) -> None:
    """Peer rows accepted (solid) and filtered (dashed) at each step, per swarm peer."""
    for peer, r in _swarm_peers(results).items():
        axis.plot(*_curve(r, "accepted"), color=colors[peer], marker="o", label=f"{peer} accepted")
        steps, filtered = _curve(r, "filtered")
        if steps:
            axis.plot(steps, filtered, color=colors[peer], linestyle="--", marker="x", label=f"{peer} filtered")
    axis.set(
        title="peer rows a step\n(solid: accepted into the batch; dashed: filtered out by F-TIS)",
        xlabel="step",
        ylabel="rows",
    )
    axis.set_ylim(bottom=0)


def plot_importance_weight(axis, results: dict, colors: dict) -> None:
    """The truncated importance weight `w` of peer rows' tokens at each step: its mean (solid) and max (dotted),
    with `w = 1` (on-policy) as a reference."""
    for peer, r in _swarm_peers(results).items():
        steps, mean = _curve(r, "is_weight_mean")
        if steps:
            axis.plot(steps, mean, color=colors[peer], marker="o", label=f"{peer} mean w")
        steps, peak = _curve(r, "is_weight_max")
        if steps:
            axis.plot(steps, peak, color=colors[peer], linestyle=":", alpha=0.6, label=f"{peer} max w")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set(
        title="importance weight w of peer-row tokens\n(solid: mean; dotted: max; grey: w = 1, on-policy)",
        xlabel="step",
        ylabel="w",
    )


def curves_figure(results: dict, eval_size: int, window: int = SMOOTHING_WINDOW):
    """The 2 x 2 figure of `curves.png`: reward, accuracy, peer rows, importance weight (matplotlib must be
    importable; the caller picks the backend)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colors = _colors(results)
    plot_reward(axes[0, 0], results, colors, window)
    plot_accuracy(axes[0, 1], results, colors, eval_size)
    plot_peer_rows(axes[1, 0], results, colors)
    plot_importance_weight(axes[1, 1], results, colors)
    for axis in axes.flat:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, "nothing logged", transform=axis.transAxes, ha="center", color="grey")
    figure.tight_layout()
    return figure


def plot_curves(results: dict, path: Path, eval_size: int) -> bool:
    """Writes [`curves_figure`] to `path`; `False` (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure = curves_figure(results, eval_size)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
