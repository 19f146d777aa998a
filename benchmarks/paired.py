"""Paired differences over seeds, shared by the learning benchmarks: mean, 95% t-interval, sign count, verdict."""

from __future__ import annotations

import math
import statistics

# Student's t 97.5% quantiles by degrees of freedom (two-sided 95% intervals; no scipy needed).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 19: 2.093, 24: 2.064, 29: 2.045}  # fmt: skip


def interval(values, null: float = 0.0) -> dict | None:
    """Mean, 95% t-interval, sign count and verdict of paired differences `values` (None when fewer than 2), against
    `null` (0 for differences; 1 for ratios): "not distinguishable" when the interval holds it, and the signs count
    values above and below it."""
    values = list(values)
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = T975.get(n - 1, 1.96) * sd / math.sqrt(n)
    return {
        "n": n,
        "mean": mean,
        "low": mean - half,
        "high": mean + half,
        "positive": sum(v > null for v in values),
        "negative": sum(v < null for v in values),
        "verdict": "higher" if mean - half > null else "lower" if mean + half < null else "not distinguishable",
    }


def format_interval(diff: dict | None) -> str:
    """`+0.012 [-0.004, +0.029] 6+/2-`, or `-`."""
    if diff is None:
        return "-"
    return f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}] {diff['positive']}+/{diff['negative']}-"
