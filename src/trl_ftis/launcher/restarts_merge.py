"""A launcher that ends after a later one restarted some of its peers keeps the later one's rows for them.

The case: `trl-ftis swarm CONFIG` runs peers a and b (`on_failure: continue`); b is killed and restarted from another
shell with `trl-ftis swarm CONFIG --only b --resume` (the console's hint), which finishes and writes `summary.json`;
the first launcher, still running a, ends last. Its own row for b is the killed process (failed, at the step it
died), so written as it is, its summary would say "failed: b", exit 1, and keep the good summary only as
`summary.json.<N>`. [`merge_restarts`] (called by the driver just before the summary is written) makes it one
summary of the swarm instead:

* every row this launcher ran is stamped with `started_at`, the wall clock its peer started at (the same clock as
  the files a peer writes), so that a later launcher can tell which run of a peer is the newer;
* a row of the existing `summary.json` for one of this launcher's peers, started after this launcher's run of that
  peer, replaces this launcher's row (it is the restart), with a note saying so and `restarted: true`;
* when a row was replaced and this launcher stopped no peer (the swarm ran until every peer exited), the exit code
  and reason are those of the merged rows: 0 when each peer's newest run finished.

Standard library only, like the rest of the launcher; never raises over a missing or malformed `summary.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .backend import PeerState, finished_outcome

__all__ = ["RESTARTED_NOTE", "merge_restarts", "newer_rows"]

RESTARTED_NOTE = "restarted by a later launcher (--only): its row of that launcher's summary"
MAX_SUMMARY_BYTES = 16 * 2**20  # an existing summary.json larger than this is not read
EXITED_ON_THEIR_OWN = ("ok", "failed")  # statuses of peers that ended without the launcher stopping them


def merge_restarts(run_dir: Path, summary: dict, states: Sequence[PeerState]) -> dict:
    """`summary` (the driver's, not yet written) with this launcher's rows stamped with their start and the rows of
    peers that a later launcher restarted taken from `run_dir/summary.json`; the exit code and reason follow the
    merged rows when a row was replaced and this launcher stopped no peer (see the module docstring)."""
    started = {state.command.id: state.started_at or None for state in states}
    rows = [stamped(row, started) for row in summary["peers"]]
    newer = newer_rows(read_summary(Path(run_dir) / "summary.json"), rows)
    if not newer:
        return {**summary, "peers": rows}
    merged = [restarted(newer[row["id"]]) if row["id"] in newer else row for row in rows]
    ran_here = [row for row in rows if row["id"] in started]
    if not all(row.get("status") in EXITED_ON_THEIR_OWN for row in ran_here):
        return {**summary, "peers": merged}  # stopped, interrupted or not started: this launcher's reason stands
    outcome = finished_outcome([row["id"] for row in merged if row.get("status") != "ok"])
    reason = f"{outcome.reason} ({', '.join(sorted(newer))}: restarted by a later launcher)"
    return {**summary, "exit_code": outcome.code, "reason": reason, "peers": merged}


def stamped(row: dict, started: dict[str, float | None]) -> dict:
    """A row this launcher ran (its id in `started`), with `started_at`; a row carried from an earlier summary keeps
    the stamp it has."""
    if row.get("earlier") or row.get("id") not in started:
        return row
    return {**row, "started_at": started[row["id"]]}


def newer_rows(existing: dict | None, rows: list[dict]) -> dict[str, dict]:
    """The rows of `existing` (a summary another launcher wrote) for peers of `rows` that it started later than
    `rows` did: peer id -> row. A row without a start time is never newer; one of ours without is older than any."""
    if existing is None:
        return {}
    ours = {row["id"]: start_time(row) for row in rows}
    newer = {}
    for row in existing.get("peers", []):
        if not isinstance(row, dict) or row.get("id") not in ours or not isinstance(row.get("status"), str):
            continue
        theirs, mine = start_time(row), ours[row["id"]]
        if theirs is not None and (mine is None or theirs > mine):
            newer[row["id"]] = row
    return newer


def restarted(row: dict) -> dict:
    """A later launcher's row, marked as such (said once, however often it is carried over)."""
    if row.get("restarted"):
        return dict(row)
    note = f"{RESTARTED_NOTE}; {row['note']}" if row.get("note") else RESTARTED_NOTE
    return {**row, "note": note, "restarted": True}


def start_time(row: dict) -> float | None:
    value = row.get("started_at")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def read_summary(path: Path) -> dict | None:
    """`summary.json` as a dict with a `peers` list, or None (missing, too large, unreadable, malformed)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_SUMMARY_BYTES:
            return None
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("peers"), list) else None
