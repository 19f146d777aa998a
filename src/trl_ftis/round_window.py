"""The round window's defaults and checks, as `FTISConfig` and `Swarm` agree: how long a round waits
([`DEFAULT_PEER_TIMEOUT`]), which rounds' messages it takes ([`DEFAULT_MAX_STALENESS`], [`DEFAULT_MAX_ROUNDS_AHEAD`],
[`check_round_window`]) and whom it waits for ([`check_expected_peers`])."""

from __future__ import annotations

import numbers

DEFAULT_PEER_TIMEOUT = 60.0
"""Seconds a round waits for the expected peers (`FTISConfig.peer_timeout`, `Swarm(peer_timeout=...)`)."""
DEFAULT_MAX_STALENESS = 2
"""Messages from rounds older than `round - max_staleness` are dropped as `stale`."""
DEFAULT_MAX_ROUNDS_AHEAD = 4
"""Messages from rounds later than `round + max_rounds_ahead` are refused as `ahead`."""


def check_round_window(max_staleness: object, max_rounds_ahead: object) -> tuple[int, int]:
    """`(max_staleness, max_rounds_ahead)` as ints when both are whole numbers of rounds >= 0 (Python or numpy
    integers, not bools); else `ValueError` naming the field. `FTISConfig` and `Swarm` both check with it."""
    window = []
    for name, value in (("max_staleness", max_staleness), ("max_rounds_ahead", max_rounds_ahead)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be a whole number of rounds >= 0, got {value!r}.")
        window.append(int(value))
    return window[0], window[1]


def check_expected_peers(expected_peers: object, num_expected_peers: object) -> None:
    """`ValueError` when a round is told whom to wait for twice: `expected_peers` (named peers; non-empty) and
    `num_expected_peers` (a number of peers, whatever their ids) are alternatives. Also when `num_expected_peers`
    is not a whole number >= 0. `FTISConfig` and `Swarm` both check with it."""
    if num_expected_peers is None:
        return
    if (
        isinstance(num_expected_peers, bool)
        or not isinstance(num_expected_peers, numbers.Integral)
        or num_expected_peers < 0
    ):
        raise ValueError(f"num_expected_peers must be a whole number of peers >= 0, got {num_expected_peers!r}.")
    if expected_peers:
        raise ValueError(
            "expected_peers and num_expected_peers are alternatives: set expected_peers to name the peers a round "
            "waits for, or num_expected_peers to wait for that many other peers whatever their ids, not both "
            f"(got expected_peers={list(expected_peers)!r} and num_expected_peers={num_expected_peers!r})."
        )
