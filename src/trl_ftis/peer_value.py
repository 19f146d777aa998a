"""What the peer rows were worth to this learner: per source (this trainer's own rows and each peer), the rows and
completion tokens merged into the loss, and sums of the rows' truncated importance weights from the loss, from which
the effective sample size `(Σw)² / Σw²` ([`effective_fraction`]) and the rows a peer's rows are "worth" (`ESS fraction
× rows in the loss`) follow. Pure bookkeeping (no trainer, no collectives): `FTISTrainer` owns one [`PeerValue`] and
saves it in checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .step_clock import non_negative_total

VALUE_FIELDS = ("rows", "tokens", "weighted_rows", "weight_sum", "weight_square_sum", "filtered")
"""Per source: rows and completion tokens merged into the loss (each row once), then, from every loss call, the rows
seen, the sum and the sum of squares of their row weights, and the rows the filter zeroed."""
MAX_SOURCES = 10_000
"""Sources a saved state may hold (the ledger's peer list is bounded by what the loss indexed)."""


def effective_fraction(weight_sum: float, weight_square_sum: float, rows: float) -> float | None:
    """The effective sample size of `rows` weights as a fraction of `rows`: `(Σw)² / (Σw² · rows)`, in `[0, 1]`;
    0 when every weight is 0 (every row filtered), `None` without rows."""
    if rows <= 0:
        return None
    if weight_square_sum <= 0:
        return 0.0
    return min(max(weight_sum * weight_sum / (weight_square_sum * rows), 0.0), 1.0)


def merge_counts(own: tuple[int, int], rows: Sequence[Any], source_index, num_sources: int) -> list[list[float]]:
    """`[rows, completion tokens]` per source index of a merged batch: `own` (this trainer's rows and tokens) at
    index 0, then each of `rows` (with a `sender` and `completion_ids`) at `source_index(sender)`."""
    counts = [[0.0, 0.0] for _ in range(num_sources)]
    counts[0] = [float(own[0]), float(own[1])]
    for row in rows:
        entry = counts[source_index(row.sender)]
        entry[0], entry[1] = entry[0] + 1.0, entry[1] + len(row.completion_ids)
    return counts


OWN = None
"""The source name of this trainer's own rows in [`PeerValue`] (a peer may be called anything, even "own")."""


class PeerValue:
    """Per source (this trainer's own rows, [`OWN`], and each peer id), what reached the loss and how much weight it
    carried.

    The trainer calls [`record_merge`] once per generation batch (rows and tokens summed over its processes, each row
    once) and [`record_loss`] after every loss call with the per-source sums of `trl_ftis.loss_metrics.source_sums`
    (over every process, every micro-batch and every `num_iterations` pass: the fractions are ratios, so counting a
    row once per pass does not change them).
    """

    def __init__(self):
        self.own: dict[str, float] = dict.fromkeys(VALUE_FIELDS, 0.0)
        self.peers: dict[str, dict[str, float]] = {}

    def _source(self, name: str | None) -> dict[str, float]:
        return self.own if name is OWN else self.peers.setdefault(str(name), dict.fromkeys(VALUE_FIELDS, 0.0))

    def record_merge(self, counts: Mapping[str | None, tuple[float, float]]) -> None:
        """`counts`: source ([`OWN`] or a peer id) -> (rows, completion tokens) merged into this generation batch."""
        for name, (rows, tokens) in counts.items():
            if rows or tokens:
                entry = self._source(name)
                entry["rows"] += float(rows)
                entry["tokens"] += float(tokens)

    def record_loss(
        self, name: str | None, *, rows: float, weight_sum: float, weight_square_sum: float, filtered: float
    ):
        """One loss call's rows of source `name`: how many, the sum and sum of squares of their row weights (the
        mean truncated weight over a row's tokens, 0 for a row the filter zeroed), and how many were filtered."""
        if rows <= 0:
            return
        entry = self._source(name)
        entry["weighted_rows"] += float(rows)
        entry["weight_sum"] += float(weight_sum)
        entry["weight_square_sum"] += float(weight_square_sum)
        entry["filtered"] += float(filtered)

    def report(self, name: str | None) -> dict[str, float | None]:
        """One source's `rows_in_loss`, `tokens`, `ess_frac`, `filtered_frac` and `rows_worth` (`ess_frac` x rows)."""
        entry = self.own if name is OWN else self.peers.get(str(name), dict.fromkeys(VALUE_FIELDS, 0.0))
        ess = effective_fraction(entry["weight_sum"], entry["weight_square_sum"], entry["weighted_rows"])
        filtered = entry["filtered"] / entry["weighted_rows"] if entry["weighted_rows"] > 0 else None
        return {
            "rows_in_loss": int(entry["rows"]),
            "tokens": int(entry["tokens"]),
            "ess_frac": ess,
            "filtered_frac": filtered,
            "rows_worth": None if ess is None else ess * entry["rows"],
        }

    def state_dict(self) -> dict[str, Any]:
        return {"own": dict(self.own), "peers": {name: dict(entry) for name, entry in self.peers.items()}}

    def load_state_dict(self, state: Any) -> None:
        """Restore [`state_dict`]; `ValueError` (nothing changed) unless `own` and each of at most [`MAX_SOURCES`]
        `peers` (string names) have exactly [`VALUE_FIELDS`], as finite numbers >= 0."""
        if not isinstance(state, Mapping) or set(state) != {"own", "peers"}:
            raise ValueError("'peer_value' must be an object with exactly 'own' and 'peers'")
        peers = state["peers"]
        if not isinstance(peers, Mapping) or len(peers) > MAX_SOURCES:
            raise ValueError(f"'peer_value.peers' is not an object of at most {MAX_SOURCES} peers")
        own = _value_entry(state["own"], "own")
        parsed = {}
        for name, entry in peers.items():
            if not isinstance(name, str):
                raise ValueError("'peer_value.peers' has a name that is not a string")  # noqa: TRY004
            parsed[name] = _value_entry(entry, f"peers.{name[:80]}")
        self.own, self.peers = own, parsed


def _value_entry(entry: Any, name: str) -> dict[str, float]:
    if not isinstance(entry, Mapping) or set(entry) != set(VALUE_FIELDS):
        raise ValueError(f"'peer_value.{name}' must have exactly {', '.join(VALUE_FIELDS)}")
    return {key: non_negative_total(entry[key], f"peer_value.{name}.{key}") for key in VALUE_FIELDS}
