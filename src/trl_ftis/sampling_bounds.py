"""The numbers a sampled completion must respect, as `FTISConfig` and the wire format agree: the largest generator
log-prob ([`MAX_LOGP`]) and the sampling temperatures ([`MIN_TEMPERATURE`], [`MAX_TEMPERATURE`],
[`check_temperature`])."""

from __future__ import annotations

MAX_LOGP = 1e-4
"""Largest generator log-prob accepted: log-probs are <= 0, up to this much float rounding above 0."""
MIN_TEMPERATURE = 1e-2
"""Lowest sampling temperature `FTISConfig` and the wire format accept: below it sampling is greedy in all but name and
generator log-probs explode (a softmax at logits / 0.01 over logits within +-100 reaches about -2e4)."""
MAX_TEMPERATURE = 1e2
"""Highest sampling temperature `FTISConfig` and the wire format accept: above it sampling is uniform in all but
name."""


def check_temperature(value: object, what: str = "temperature") -> float:
    """`value` as a float when it is a sampling temperature in [`MIN_TEMPERATURE`, `MAX_TEMPERATURE`]; else
    `ValueError` naming `what` (NaN and non-numbers are refused too). Log-probs are compared at this temperature and
    the wire format carries no other."""
    try:
        temperature = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        temperature = float("nan")
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:  # also rejects NaN
        raise ValueError(
            f"{what} must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] (log-probs are compared at it, and the wire "
            f"format carries no other), got {value!r}."
        )
    return temperature
