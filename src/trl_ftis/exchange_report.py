"""What a swarm peer's end-of-run summary says about its exchange, in words: the warnings that must not stay quiet.

Two readers, one wording. The peer itself logs [`exchange_warning`] when its training ends
(`trl_ftis.summary_file.SummaryCallback`); the launcher (`trl-ftis swarm`) reads each peer's `ftis_summary.json` and
prints [`exchange_problem`], which says everything `exchange_warning` says and more that only matters seen from
outside (most messages refused, any refused for a missing or wrong signature). Standard library only: the launcher
must not load torch or transformers to word a warning.

A summary holds `peer_id`, `rows_received`, `rows_accepted`, `refused` (messages refused, by reason) and `dropped`
(rows dropped, by reason). Messages and rows are counted apart: a refused message never yields rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BINDING_REASONS",
    "SECRET_REASONS",
    "exchange_problem",
    "exchange_warning",
    "finite_number",
    "reason_counts",
    "total_count",
]

SECRET_REASONS = frozenset({"signature", "unsigned"})
"""Refusal reasons that mean the peers do not share one swarm secret or key set (`trl_ftis.exchange.errors`)."""
_SECRET_HINT = "; the peers do not share one swarm secret or key set (docs/security.md)"
BINDING_REASONS = frozenset({"swarm", "run"})
"""Refusal reasons that mean messages named another swarm or run: leftovers or replays of an earlier run, or peers
that were not given this run's id."""
_BINDING_HINT = (
    "; messages of another swarm or run were refused: leftovers of an earlier run, or a peer not given this run's id "
    "(a peer started by hand joins a `trl-ftis swarm` run with FTIS_SWARM_RUN set to its run_dir/swarm_run; "
    "docs/swarm.md)"
)


def reason_counts(value: Any) -> dict[str, int]:
    """A summary's `refused` or `dropped` as `{reason: count}`; anything that is not a count is left out (the file
    is another process's output: reading it must not raise)."""
    if not isinstance(value, Mapping):
        return {}
    counts = {}
    for reason, count in value.items():
        number = _number(count)
        if number is not None:
            counts[str(reason)] = number
    return counts


def finite_number(value: Any) -> float | None:
    """`value` as a finite float, or `None` for anything else (a bool, NaN, infinity, text, an int too large for a
    float: summary files are another process's, read as they are)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _number(value: Any) -> int | None:
    """`value` as a count, or `None` for anything else (see [`finite_number`])."""
    number = finite_number(value)
    return None if number is None else int(number)


def total_count(value: Any) -> int | None:
    """The sum of a summary's `refused` or `dropped` counts; `None` when the summary has no such entry."""
    if isinstance(value, Mapping):
        return sum(reason_counts(value).values())
    return _number(value)


def _count(summary: Mapping[str, Any], key: str) -> int:
    return _number(summary.get(key)) or 0


def _by_reason(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _sentence(summary: Mapping[str, Any], head: str) -> str:
    """`head`, then what was received, refused and dropped, by reason; a hint when signatures were refused."""
    refused, dropped = reason_counts(summary.get("refused")), reason_counts(summary.get("dropped"))
    parts = [f"received {_count(summary, 'rows_received')} rows"]
    parts.append(
        f"refused {sum(refused.values())} messages ({_by_reason(refused)})" if refused else "refused no messages"
    )
    if dropped:
        parts.append(f"dropped {sum(dropped.values())} rows ({_by_reason(dropped)})")
    hint = _SECRET_HINT if SECRET_REASONS & set(refused) else ""
    hint += _BINDING_HINT if BINDING_REASONS & set(refused) else ""
    return f"{head}: {'; '.join(parts)}{hint}."


def _peer_head(summary: Mapping[str, Any], peer_id: Any) -> str | None:
    accepted = _count(summary, "rows_accepted")
    dropped = sum(reason_counts(summary.get("dropped")).values())
    if accepted == 0:
        return f"{peer_id}: accepted no peer rows"
    if dropped > accepted:
        return f"{peer_id}: dropped more peer rows ({dropped}) than it accepted ({accepted})"
    return None


def exchange_warning(summary: Mapping[str, Any]) -> str | None:
    """What a swarm peer's end-of-run summary must not keep quiet: it accepted no peer rows, or dropped more peer rows
    than it accepted; with the counts by reason of the messages refused and the rows dropped. `None` when neither.

    Messages and rows are counted apart: a refused message (bad signature, another swarm, ...) never yields rows, so
    it is not compared with rows."""
    head = _peer_head(summary, summary.get("peer_id"))
    return None if head is None else _sentence(summary, head)


def exchange_problem(summary: Mapping[str, Any], peer_id: str | None = None) -> str | None:
    """What the launcher warns about at the end of a swarm for one peer (`peer_id`, default the summary's), `None`
    when nothing. Everything [`exchange_warning`] warns about, and:

    * **most messages refused**: more refused messages than rows received. The summary counts no accepted messages,
      but every accepted message brought at least one received row (peers only send messages with rows), so then
      the refused ones were certainly more than half of the messages the peer saw;
    * **any message refused for its signature** (`signature`, `unsigned`): all peers of one swarm share one secret
      or key set, so even a few mean that some peer lacks it, or has another, and its rows are lost to the others.

    A summary without `rows_accepted` (not a trl-ftis peer's, or an older one) says nothing about the exchange."""
    if summary.get("rows_accepted") is None:
        return None
    peer_id = summary.get("peer_id") if peer_id is None else peer_id
    head = _peer_head(summary, peer_id)
    if head is None:
        refused = reason_counts(summary.get("refused"))
        received = _count(summary, "rows_received")
        if sum(refused.values()) > received:
            head = f"{peer_id}: refused most messages ({sum(refused.values())} refused, {received} rows received)"
        elif SECRET_REASONS & set(refused):
            secret = sum(n for reason, n in refused.items() if reason in SECRET_REASONS)
            head = f"{peer_id}: refused {secret} messages for their signature"
    return None if head is None else _sentence(summary, head)
