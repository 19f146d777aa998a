"""What collaboration bought, in numbers and in one sentence: [`collaboration_report`] turns the step clock
(`trl_ftis.step_clock`) and the value of the peer rows (`trl_ftis.peer_value`) into the summary's numbers and the
sentence a user reads at the end of a run: "peers supplied N rows, as close to my own sampling as about M rows of
mine; they stood in for about S s of my generation; the exchange took B s". The formulas are checked against
hand-computed values in `tests/core/test_collaboration.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .peer_value import OWN, VALUE_FIELDS, PeerValue, effective_fraction
from .step_clock import StepClock, generation_share


def stand_in_seconds(tokens: float, own_tokens: float, generation_seconds: float) -> float | None:
    """Seconds of this trainer's own generation that `tokens` completion tokens stand in for, at its measured cost
    (`generation_seconds / own_tokens`); `None` before it generated anything."""
    if own_tokens <= 0:
        return None
    return tokens * generation_seconds / own_tokens


def collaboration_report(
    clock: StepClock, value: PeerValue, accepted_by_peer: Mapping[str, int], peers: Sequence[str]
) -> dict[str, Any]:
    """The summary's ledger of what collaboration bought.

    Returns `time_seconds` (totals of `trl_ftis.step_clock.TIME_KEYS`), `generation_share`, `own_generation` (rows,
    tokens and seconds this trainer generated), `peer_value` (per peer and in total: `rows_accepted` from the swarm,
    `rows_in_loss`, `tokens`, `ess_frac`, `filtered_frac`, `rows_worth` and `generation_seconds_stood_in`: the peer
    rows' tokens at this trainer's own generation cost per token), and `collaboration`, the sentence for people.
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
        f"peers supplied {total['rows_in_loss']} rows ({total['tokens']} tokens), as close to my own sampling as "
        f"about {total['rows_worth']:.0f} rows of mine (effective sample size: not what they taught, which only a "
        f"control trained alone measures); they stood in for about {saved} s of my generation; the exchange took "
        f"{exchange:.3g} s; {own_rows} own rows; generation share f = {f}"
    )
