"""What collaboration bought: where each step's time went, and what the peer rows were worth to this learner.

Two owners, both pure bookkeeping (no trainer, no collectives), composed into `FTISTrainer`:

* [`StepClock`]: the seconds of every optimizer step split into `generation` (TRL's `_generate`), `scoring` (the
  reward functions), `exchange` (the swarm round: waiting, admitting, sharing out), `training` (forward and backward
  of the loss) and `other` (the rest of the step: batch-time log-probs, merging peer rows, the optimizer), with the
  generation share `f = generation / step`;
* [`PeerValue`]: per source (this trainer's own rows and each peer), the rows and completion tokens merged into the
  loss, and sums of the rows' truncated importance weights from the loss, from which the effective sample size
  `(Σw)² / Σw²` and the rows a peer's rows are "worth" (`ESS fraction × rows in the loss`) follow.

[`collaboration_report`] turns both into the summary's numbers and the sentence a user reads at the end of a run:
"peers supplied N rows, as close to my own sampling as about M rows of mine; they stood in for about S s of my
generation; the exchange took B s". The pure formulas ([`effective_fraction`], [`generation_share`], [`stand_in_seconds`]) are checked against
hand-computed values in `tests/core/test_collaboration.py`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .exchange_report import exchange_warning  # stdlib-only home (the launcher words it too); importable here too
from .rules import SUMMARY_FILE

logger = logging.getLogger(__name__)

PHASES = ("generation", "scoring", "exchange", "training")
"""The timed phases of a step; `other` is the step's remainder."""
TIME_KEYS = ("step", *PHASES, "other")
"""The keys of `time_seconds` in the summary, in order."""
VALUE_FIELDS = ("rows", "tokens", "weighted_rows", "weight_sum", "weight_square_sum", "filtered")
"""Per source: rows and completion tokens merged into the loss (each row once), then, from every loss call, the rows
seen, the sum and the sum of squares of their row weights, and the rows the filter zeroed."""
MAX_SOURCES = 10_000
"""Sources a saved state may hold (the ledger's peer list is bounded by what the loss indexed)."""


# -- pure formulas -------------------------------------------------------------------------------------------------
def effective_fraction(weight_sum: float, weight_square_sum: float, rows: float) -> float | None:
    """The effective sample size of `rows` weights as a fraction of `rows`: `(Σw)² / (Σw² · rows)`, in `[0, 1]`;
    0 when every weight is 0 (every row filtered), `None` without rows."""
    if rows <= 0:
        return None
    if weight_square_sum <= 0:
        return 0.0
    return min(max(weight_sum * weight_sum / (weight_square_sum * rows), 0.0), 1.0)


def generation_share(generation_seconds: float, step_seconds: float) -> float | None:
    """`f`: the part of the step time spent generating; `None` before any step."""
    if step_seconds <= 0:
        return None
    return min(max(generation_seconds / step_seconds, 0.0), 1.0)


def stand_in_seconds(tokens: float, own_tokens: float, generation_seconds: float) -> float | None:
    """Seconds of this trainer's own generation that `tokens` completion tokens stand in for, at its measured cost
    (`generation_seconds / own_tokens`); `None` before it generated anything."""
    if own_tokens <= 0:
        return None
    return tokens * generation_seconds / own_tokens


def merge_counts(own: tuple[int, int], rows: Sequence[Any], source_index, num_sources: int) -> list[list[float]]:
    """`[rows, completion tokens]` per source index of a merged batch: `own` (this trainer's rows and tokens) at
    index 0, then each of `rows` (with a `sender` and `completion_ids`) at `source_index(sender)`."""
    counts = [[0.0, 0.0] for _ in range(num_sources)]
    counts[0] = [float(own[0]), float(own[1])]
    for row in rows:
        entry = counts[source_index(row.sender)]
        entry[0], entry[1] = entry[0] + 1.0, entry[1] + len(row.completion_ids)
    return counts


# -- the step clock ------------------------------------------------------------------------------------------------
class StepClock:
    """Seconds per phase of the current optimizer step, and totals over the run.

    [`begin`] starts a step, [`measure`] times a phase inside it (phases do not nest: a phase measured inside
    another is counted in both, so the trainer times disjoint spans), [`end`] closes the step and returns its split.
    `clock` is `time.perf_counter` (a test passes a fake one): two calls per timed span, nothing measurable.
    `synchronize` (`torch.cuda.synchronize` on a GPU) is called before every reading ([`now`]): GPU work is
    asynchronous, and without it a phase's kernels would be counted in whichever phase waits for them next.
    """

    def __init__(self, clock=time.perf_counter, synchronize: Callable[[], None] | None = None):
        self._clock = clock
        self.synchronize = synchronize
        self._started: float | None = None
        self._current = dict.fromkeys(PHASES, 0.0)
        self.totals: dict[str, float] = dict.fromkeys(TIME_KEYS, 0.0)
        self.steps = 0

    def begin(self) -> None:
        """Start an optimizer step (its phases so far are dropped: they belong to no step)."""
        self._started = self.now()
        self._current = dict.fromkeys(PHASES, 0.0)

    def now(self) -> float:
        """The clock's reading once the device's queued work is done."""
        if self.synchronize is not None:
            self.synchronize()
        return self._clock()

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        """Add the time spent in the block to `phase` of the current step (also when it raises)."""
        if phase not in self._current:
            raise KeyError(f"{phase!r} is not a phase ({', '.join(PHASES)})")
        start = self.now()
        try:
            yield
        finally:
            self._current[phase] += self.now() - start

    def add(self, phase: str, seconds: float) -> None:
        """Add `seconds` measured by the caller to `phase` of the current step."""
        if phase not in self._current:
            raise KeyError(f"{phase!r} is not a phase ({', '.join(PHASES)})")
        self._current[phase] += seconds

    def end(self) -> dict[str, float] | None:
        """Close the step: its `step` seconds, each phase's, `other` (the remainder, never negative) and
        `generation_share`; added to [`totals`]. `None` when no step was begun."""
        if self._started is None:
            return None
        split = {"step": self.now() - self._started, **self._current}
        split["other"] = max(split["step"] - sum(self._current.values()), 0.0)
        for key in TIME_KEYS:
            self.totals[key] += split[key]
        self.steps += 1
        self._started = None
        self._current = dict.fromkeys(PHASES, 0.0)
        split["generation_share"] = generation_share(split["generation"], split["step"]) or 0.0
        return split

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "steps": self.steps}

    def load_state_dict(self, state: Any) -> None:
        """Restore [`state_dict`]; `ValueError` (nothing changed) unless every total is a finite number >= 0."""
        if not isinstance(state, Mapping):
            raise ValueError("'time' is not an object")  # noqa: TRY004 - a malformed file, not a wrong argument
        totals = state.get("totals")
        if not isinstance(totals, Mapping) or set(totals) != set(TIME_KEYS):
            raise ValueError(f"'time.totals' must have exactly {', '.join(TIME_KEYS)}")
        values = {key: _non_negative(totals[key], f"time.totals.{key}") for key in TIME_KEYS}
        steps = state.get("steps")
        if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps <= 2**53:
            raise ValueError("'time.steps' is not a non-negative integer")
        self.totals, self.steps = values, steps


class StepClockCallback(TrainerCallback):
    """Opens and closes a [`StepClock`] around each optimizer step and logs its split with `log(name, seconds)` as
    `ftis/time/<phase>` (and `ftis/time/generation_share`).

    The clock runs from `on_step_begin` to `on_step_end`: the step's micro-batches and optimizer step, without the
    logging, saving and evaluation the Trainer does after `on_step_end`."""

    def __init__(self, clock: StepClock, log: Callable[[str, float], None]):
        self.clock, self.log = clock, log

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.begin()

    def on_step_end(self, args, state, control, **kwargs):
        split = self.clock.end()
        for name, seconds in (split or {}).items():
            self.log(f"ftis/time/{name}", seconds)


class SummaryCallback(TrainerCallback):
    """When training ends, writes `summary()` to `output_dir/ftis_summary.json` (on the main process) and says what
    collaboration bought: a warning (shown by default) for a peer of a swarm or a run with peer rows, else at info
    level."""

    def __init__(self, summary: Callable[[], dict[str, Any]], is_main_process: bool):
        self.summary, self.is_main_process = summary, is_main_process

    def on_train_end(self, args, state, control, **kwargs):
        if not self.is_main_process:
            return
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        (Path(args.output_dir) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
        in_swarm = getattr(args, "exchange_url", None) is not None
        with_peers = in_swarm or summary["peer_value"]["rows_in_loss"] > 0
        (logger.warning if with_peers else logger.info)("%s: %s.", summary["peer_id"], summary["collaboration"])
        problem = exchange_warning(summary) if in_swarm else None
        if problem is not None:
            logger.warning("%s", problem)


# -- the value of peer rows ----------------------------------------------------------------------------------------
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


def collaboration_report(
    clock: StepClock, value: PeerValue, accepted_by_peer: Mapping[str, int], peers: Sequence[str]
) -> dict[str, Any]:
    """The summary's ledger of what collaboration bought.

    Returns `time_seconds` (totals of [`TIME_KEYS`]), `generation_share`, `own_generation` (rows, tokens and seconds
    this trainer generated), `peer_value` (per peer and in total: `rows_accepted` from the swarm, `rows_in_loss`,
    `tokens`, `ess_frac`, `filtered_frac`, `rows_worth` and `generation_seconds_stood_in`: the peer rows' tokens at
    this trainer's own generation cost per token), and `collaboration`, the sentence for people.
    """
    totals = {key: round(value_, 6) for key, value_ in clock.totals.items()}
    own = value.report(OWN)
    own_tokens, generation_seconds = own["tokens"], clock.totals["generation"]
    per_peer = {}
    for name in sorted(set(map(str, peers)) | set(map(str, accepted_by_peer)) | set(value.peers)):
        report = value.report(name)
        report["rows_accepted"] = int(accepted_by_peer.get(name, 0))
        report["generation_seconds_stood_in"] = stand_in_seconds(report["tokens"], own_tokens, generation_seconds)
        per_peer[name] = report
    rows_in_loss = sum(report["rows_in_loss"] for report in per_peer.values())
    tokens = sum(report["tokens"] for report in per_peer.values())
    worth = sum(report["rows_worth"] or 0.0 for report in per_peer.values())
    weighted = {k: sum(entry[k] for entry in value.peers.values()) for k in VALUE_FIELDS}
    total = {
        "rows_accepted": sum(report["rows_accepted"] for report in per_peer.values()),
        "rows_in_loss": rows_in_loss,
        "tokens": tokens,
        "ess_frac": effective_fraction(
            weighted["weight_sum"], weighted["weight_square_sum"], weighted["weighted_rows"]
        ),
        "filtered_frac": weighted["filtered"] / weighted["weighted_rows"] if weighted["weighted_rows"] > 0 else None,
        "rows_worth": worth,
        "generation_seconds_stood_in": stand_in_seconds(tokens, own_tokens, generation_seconds),
    }
    share = generation_share(clock.totals["generation"], clock.totals["step"])
    return {
        "time_seconds": totals,
        "generation_share": share,
        "own_generation": {"rows": own["rows_in_loss"], "tokens": own_tokens, "seconds": round(generation_seconds, 6)},
        "peer_value": {**total, "peers": per_peer},
        "collaboration": collaboration_sentence(total, own["rows_in_loss"], share, clock.totals["exchange"]),
    }


def collaboration_sentence(total: Mapping[str, Any], own_rows: int, share: float | None, exchange: float) -> str:
    """One line for people: what the peers supplied and what it was worth, or that they supplied nothing."""
    f = "-" if share is None else f"{share:.2f}"
    if not total["rows_in_loss"]:
        return f"peers supplied no rows; {own_rows} own rows trained on; generation share f = {f}"
    saved = total["generation_seconds_stood_in"]
    saved = "-" if saved is None else f"{saved:.3g}"
    return (
        f"peers supplied {total['rows_in_loss']} rows ({total['tokens']} tokens), as close to my own sampling as about "
        f"{total['rows_worth']:.0f} rows of mine (effective sample size: not what they taught, which only a control "
        f"trained alone measures); they stood in for about {saved} s of my generation; the exchange took "
        f"{exchange:.3g} s; {own_rows} own rows; generation share f = {f}"
    )


def _value_entry(entry: Any, name: str) -> dict[str, float]:
    if not isinstance(entry, Mapping) or set(entry) != set(VALUE_FIELDS):
        raise ValueError(f"'peer_value.{name}' must have exactly {', '.join(VALUE_FIELDS)}")
    return {key: _non_negative(entry[key], f"peer_value.{name}.{key}") for key in VALUE_FIELDS}


def _non_negative(value: Any, name: str) -> float:
    # One range check refuses NaN, inf and integers too large for a float (math.isfinite would overflow on them).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**63:
        raise ValueError(f"{name!r} is not a finite number >= 0")
    return float(value)
