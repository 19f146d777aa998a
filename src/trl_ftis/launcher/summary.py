"""The end-of-run summary every backend shares: each peer's own summary file (`trl_ftis.shared_names.SUMMARY_FILE`,
written by the trainer into its output directory), one row per peer (`summary_rows`, from each backend's
`PeerState`s), the table the driver prints (`format_summary_table`), the peers' exchange warnings
(`exchange_warnings`) and `summary.json` (`report_summary`).

Reading a peer's file never raises: a missing, unreadable, malformed or stale file shows `-` with a note.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

from ..exchange_report import SECRET_REASONS, exchange_problem, finite_number, reason_counts, total_count
from ..joining import arm_record
from ..shared_names import SUMMARY_FILE
from ..worth_report import overall_line
from .backend import PeerState
from .commands import keep_earlier

__all__ = [
    "SUMMARY_FIELDS",
    "TABLE_COLUMNS",
    "control_lines",
    "describe_code",
    "earlier_rows",
    "exchange_warnings",
    "format_summary_table",
    "paired_difference",
    "peer_fields",
    "peer_warning",
    "read_peer_file",
    "read_peer_summary",
    "report_summary",
    "say_reading",
    "summary_rows",
    "wait_hint",
    "write_summary_file",
]

SUMMARY_FIELDS = (
    "steps",
    "rows_sent",
    "rows_received",
    "rows_accepted",
    "rows_filtered",
    "rows_dropped",
    "messages_refused",
    "reward",
    "generation_share",
    "peer_rows_worth",
    "generation_saved_s",
    "exchange_s",
    "train_s",
    "wait_s",
    "accuracy_before",
    "accuracy_after",
)
"""The fields of `summary.json`'s rows from each peer's own summary file (see [`SUMMARY_SOURCES`]); the table shows
[`TABLE_COLUMNS`] of them."""
TABLE_COLUMNS = (
    ("steps", "steps"),
    ("sent", "rows_sent"),
    ("recv", "rows_received"),
    ("used", "rows_accepted"),
    ("drop", "rows_dropped"),
    ("reward", "reward"),
    ("gen", "generation_share"),
    ("wait", "wait_share"),
    ("ess rows", "peer_rows_worth"),
    ("accuracy", "accuracy"),
)
"""The table's columns after peer, status, exit and wall: (header, row field), short so that a table fits 120
columns. `wait` is the share of the peer's training time spent waiting on the exchange; `ess rows` counts rows, not a
value: the effective sample size of the received peer rows in own rows (`peer_value.rows_worth`: how close to the
peer's own sampling they were, at most the rows trained on); `accuracy` is before -> after when the peer's script
evaluates (as `examples/tiny_peer.py` does)."""
ACCURACY_ITEMS = "accuracy_items_after"
"""A peer summary's per-problem correctness after training (0/1, the same problems for every peer, as
`examples/tiny_peer.py` writes it): a peer and its control are compared pair by pair ([`paired_difference`])."""
MAX_ACCURACY_ITEMS = 100_000  # read no longer list from another process's file
WAIT_HINT_SHARE = 0.2  # a sync-mode peer waiting this much of its time, ...
WAIT_HINT_SPEEDS = (
    1.5  # ... in a swarm whose peers' seconds a step differ this much, is told about `exchange_mode: free`
)
SUMMARY_SOURCES = {
    "peer_rows_worth": ("peer_value", "rows_worth"),
    "generation_saved_s": ("peer_value", "generation_seconds_stood_in"),
    "exchange_s": ("time_seconds", "exchange"),
    "train_s": ("train_seconds",),
    "wait_s": ("exchange_blocking_seconds",),
}
"""Where a column that is not a top-level key of the peer's summary file is read (a path of keys)."""
SUMMARY_TOTALS = {"rows_dropped": "dropped", "messages_refused": "refused"}
"""Columns that sum the counts by reason of an entry of the peer's summary file (`{reason: count}`): `-` when the
file has no such entry, 0 when it is empty."""
SECRET_HINT = (
    "give every peer the same FTIS_SWARM_SECRET (peers inherit the launcher's environment: set it in the shell that "
    "runs `trl-ftis swarm`, for --only too)"
)
"""What the launcher adds to a warning about messages refused for their signature (`SECRET_REASONS`)."""


def describe_code(code: int | None) -> str:
    """An exit code for people: `-15 (SIGTERM)` for a signal, `-` when unknown."""
    if code is None:
        return "-"
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _format_field(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and abs(value) >= 100_000:
        return f"{value / 1e6:.1f}M" if abs(value) >= 1_000_000 else f"{value / 1e3:.0f}k"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 10_000 else _format_field(round(value))
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def _table_cell(row: dict, field: str) -> str:
    if field == "accuracy":
        before, after = finite_number(row.get("accuracy_before")), finite_number(row.get("accuracy_after"))
        return "-" if before is None or after is None else f"{before:.2f}->{after:.2f}"
    if field in ("generation_share", "wait_share"):
        share = finite_number(row.get(field))
        return "-" if share is None else f"{share:.0%}"
    return _format_field(row.get(field))


def read_peer_summary(path: Path, not_before: float | None) -> tuple[dict | None, str | None]:
    """(fields, note): the `SUMMARY_FIELDS` of the peer's own summary file, or a note saying why it is not shown.
    Never raises."""
    data, note = read_peer_file(path, not_before)
    return (None if data is None else peer_fields(data)), note


def peer_fields(data: dict) -> dict:
    """The `SUMMARY_FIELDS` of a peer's summary file (`SUMMARY_SOURCES`, `SUMMARY_TOTALS`); `None` when missing."""
    fields = {}
    for key in SUMMARY_FIELDS:
        if key in SUMMARY_TOTALS:
            fields[key] = total_count(data.get(SUMMARY_TOTALS[key]))
        else:
            fields[key] = _lookup(data, SUMMARY_SOURCES.get(key, (key,)))
    return fields


def read_peer_file(path: Path, not_before: float | None) -> tuple[dict | None, str | None]:
    """(the whole file, note): the peer's own summary file as a dict, or a note saying why it is not shown (`None`
    for both when there is no file). Never raises."""
    try:
        if not path.exists():
            return None, None
        if not_before is not None and path.stat().st_mtime < not_before - 1.0:
            return None, f"{path} is older than this run (left from an earlier one?); not shown"
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return None, f"could not read {path}: {exc}"
    if not isinstance(data, dict):
        return None, f"{path} does not hold a JSON object; not shown"
    return data, None


def _lookup(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def summary_rows(states: list[PeerState]) -> list[dict]:
    """One row per peer: its status, exit code, wall time, pid and log, the `SUMMARY_FIELDS` of its own summary file,
    a note (why that file is not shown, or the backend's own note before it) and its exchange `warning` (see
    `peer_warning`; `None` when there is nothing to say)."""
    rows = []
    items: dict[str, list[int]] = {}  # id -> per-problem correctness after training (`accuracy_items_after`)
    for state in states:
        wall = (state.ended - state.started) if state.ended is not None and state.started else None
        data, note = read_peer_file(state.command.output_dir / SUMMARY_FILE, state.started_at or None)
        fields = None if data is None else peer_fields(data)
        row = {
            "id": state.command.id,
            "status": state.status,
            "exit_code": state.returncode,
            "wall_time_s": None if wall is None else round(wall, 3),
            "pid": state.pid,
            "log": str(state.command.log_path),
            "control_of": state.command.control_of,
        }
        for key in SUMMARY_FIELDS:
            row[key] = fields.get(key) if fields else None
        if data is not None and _is_items(data.get(ACCURACY_ITEMS)):
            items[state.command.id] = [int(item) for item in data[ACCURACY_ITEMS]]
        wait, train = finite_number(row.get("wait_s")), finite_number(row.get("train_s"))
        row["wait_share"] = min(wait / train, 1.0) if wait is not None and train else None
        if state.note:
            note = state.note if not note else f"{state.note}; {note}"
        row["note"] = note
        curve = data.get("curve") if data is not None else None
        if isinstance(curve, list) and len(curve) <= 1000:  # bounded: another process's file
            row["curve"] = curve
        row["run"] = _arm_record(data)
        # A control, or a peer that trained without an exchange (its own summary says so), is alone on purpose: no
        # exchange warning ("accepted no peer rows") for it.
        in_swarm = state.command.control_of is None and (data or {}).get("exchange_url", "") is not None
        row["warning"] = None if data is None or not in_swarm else peer_warning(data, state.command.id)
        rows.append(row)
    peers = {row["id"]: row for row in rows}
    for row in rows:
        control_of = row.get("control_of")
        if control_of in items and row["id"] in items and control_of in peers:
            row["vs_peer"] = paired_difference(items[control_of], items[row["id"]])
    return rows


def _arm_record(data: dict | None) -> dict | None:
    """The peer's steps, step-time split and held-out evaluations, compact (`trl_ftis.joining.arm_record`), which
    `trl_ftis.worth_report` reads; None when its summary holds no training (or is malformed)."""
    if data is None:
        return None
    try:
        return arm_record(data)
    except ValueError:
        return None


def _is_items(value: Any) -> bool:
    ok = isinstance(value, list) and 0 < len(value) <= MAX_ACCURACY_ITEMS
    return ok and all(item in (0, 1) and not isinstance(item, float) for item in value)


def paired_difference(peer: list[int], control: list[int]) -> dict | None:
    """A swarm peer's accuracy after training minus its control's, over the same problems: the mean of the per-problem
    differences, its standard error (their standard deviation over sqrt(n)), n, and whether it is beyond 2 standard
    errors. None when the lists are not of one length."""
    n = len(peer)
    if n != len(control) or n < 2:
        return None
    differences = [a - b for a, b in zip(peer, control)]
    mean = sum(differences) / n
    variance = sum((d - mean) ** 2 for d in differences) / (n - 1)
    se = math.sqrt(variance / n)
    return {"difference": mean, "se": se, "n": n, "beyond_2se": abs(mean) > 2 * se}


def control_lines(rows: list[dict]) -> list[str]:
    """One line per control that can be compared with its peer (`vs_peer`): the peer's accuracy after training
    against the control's, the paired difference with its standard error, and what it says."""
    by_id = {row["id"]: row for row in rows}

    def accuracy(row: dict) -> str:
        value = finite_number(row.get("accuracy_after"))
        return "-" if value is None else f"{value:.3f}"

    lines = []
    for row in rows:
        compared = row.get("vs_peer")
        if not compared:
            continue
        d, se, n = compared["difference"], compared["se"], compared["n"]
        # One run's standard error is the evaluation's noise only: training noise (another seed) can move each arm
        # by more, so no "ahead" or "behind" here; `seeds:` gives intervals over seeds (`trl_ftis.worth_report`).
        lines.append(
            f"{row['control_of']} vs {row['id']}: accuracy after {accuracy(by_id.get(row['control_of'], {}))} vs "
            f"{accuracy(row)}, difference {d:+.3f} (SE {se:.3f} paired over {n} problems: evaluation noise only, "
            "one run)"
        )
    return lines


def peer_warning(data: dict, peer_id: str) -> str | None:
    """What the launcher warns about one peer at the end (`trl_ftis.exchange_report.exchange_problem`: it accepted no
    peer rows, dropped more rows than it accepted, refused most messages or refused some for their signature), with
    the launcher's hint when signatures were refused; `None` when nothing."""
    try:
        text = exchange_problem(data, peer_id)
    except Exception:  # noqa: BLE001 - another process's file: a bad one must not cost the summary
        return None
    if text is not None and SECRET_REASONS & set(reason_counts(data.get("refused"))):
        text = f"{text.rstrip('.')}; {SECRET_HINT}."
    return text


def exchange_warnings(rows: list[dict]) -> list[str]:
    """The warning lines of the summary rows, one per peer that has one (`peer_warning`), in the rows' order."""
    return [f"warning: {row['warning']}" for row in rows if row.get("warning")]


def format_summary_table(rows: list[dict]) -> str:
    """The end-of-run table: one line per peer ([`TABLE_COLUMNS`]), `-` for anything unknown; controls marked `*`;
    then the notes, and a hint when sync-mode peers of different speeds waited much ([`wait_hint`]). Rows with a
    `job_id` (the SLURM launcher's) get a `job` column."""
    jobs = any("job_id" in row for row in rows)
    header = ["peer", "status", *(["job"] if jobs else []), "exit", "wall", *(name for name, _ in TABLE_COLUMNS)]
    table = [header]
    for row in rows:
        table.append(
            [
                row["id"] if row.get("control_of") is None else f"{row['id']}*",
                row["status"],
                *([_format_field(row.get("job_id"))] if jobs else []),
                describe_code(row["exit_code"]),
                _format_seconds(row["wall_time_s"]),
                *(_table_cell(row, field) for _, field in TABLE_COLUMNS),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = []
    for n, line in enumerate(table):
        cells = [cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    controls = [row for row in rows if row.get("control_of") is not None]
    if controls:
        lines.append(
            "* control: the configuration of "
            + ", ".join(f"{row['control_of']} ({row['id']})" for row in controls)
            + ", trained alone (no peers)"
        )
    notes = [f"note: {row['id']}: {row['note']}" for row in rows if row.get("note")]
    hint = wait_hint(rows)
    return "\n".join(lines + control_lines(rows) + notes + ([hint] if hint else []))


def wait_hint(rows: list[dict]) -> str | None:
    """A line for a swarm whose peers waited much of their time on each other because their speeds differ: then
    `exchange_mode: free` lets each train at its own speed. None otherwise, when the times are unknown, or when a
    peer failed or was restarted (the wait is then the restart's, not the speeds')."""
    peers = [row for row in rows if row.get("control_of") is None]
    if any(_interrupted(row) for row in peers):
        return None  # the others waited for a peer that failed or was restarted, whatever the speeds
    waited = [row for row in peers if (finite_number(row.get("wait_share")) or 0.0) >= WAIT_HINT_SHARE]
    per_step = [
        train / steps
        for row in peers
        if (train := finite_number(row.get("train_s"))) and (steps := finite_number(row.get("steps")))
    ]
    if not waited or len(per_step) < 2 or max(per_step) < WAIT_HINT_SPEEDS * min(per_step):
        return None
    who = ", ".join(f"{row['id']} {row['wait_share']:.0%}" for row in waited)
    return (
        f"hint: peers waited on each other much of their training time ({who}) because their speeds differ "
        f"({min(per_step):.2g} to {max(per_step):.2g} s a step): `exchange_mode: free` lets each peer train at its "
        "own speed on the rows that have arrived (docs/swarm.md)"
    )


def _interrupted(row: dict) -> bool:
    """Whether a peer's run was cut short: it failed (or failed to start), a later launcher restarted it, or its row
    was carried over from an earlier launcher's summary (the launcher restarted the others with `--only`)."""
    return str(row.get("status", "")).startswith("failed") or bool(row.get("restarted") or row.get("earlier"))


MAX_SUMMARY_BYTES = 16 * 2**20  # an earlier summary.json larger than this is not read


def earlier_rows(run_dir: Path, ids: list[str]) -> list[dict]:
    """The rows of the peers `ids` from `run_dir`'s existing `summary.json` (the run that `--only` restarts some peers
    of), each with a note saying so, in the order of `ids`; none for a peer it does not hold. Never raises."""
    path = Path(run_dir) / "summary.json"
    try:
        if not ids or not path.is_file() or path.stat().st_size > MAX_SUMMARY_BYTES:
            return []
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    found = {}
    for row in data.get("peers", []) if isinstance(data, dict) and isinstance(data.get("peers"), list) else []:
        if isinstance(row, dict) and row.get("id") in ids and isinstance(row.get("status"), str):
            found.setdefault(row["id"], row)
    rows = []
    for peer_id in ids:
        if peer_id in found:
            row = dict(found[peer_id])
            note = "not restarted here: its row of the earlier launcher's summary"
            if not row.get("earlier"):  # carried over once already: said once
                row["note"] = f"{note}; {row['note']}" if row.get("note") else note
            row["earlier"] = True
            rows.append(row)
    return rows


def write_summary_file(run_dir: Path, summary: dict, *, say) -> Path:
    """Write `summary` to `run_dir/summary.json`, an earlier one kept as `summary.json.<N>`
    (`commands.keep_earlier`); a file that cannot be written is said, not raised. Returns its path."""
    path = Path(run_dir) / "summary.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        keep_earlier([path])
        path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        say(f"could not write {path}: {exc}")
    return path


def say_reading(reading: dict, heading: str, *, say) -> None:
    """Say what joining was worth (`trl_ftis.worth_report.run_reading`): `heading`, each peer's lines, the overall
    line."""
    say(heading)
    for entry in reading["peers"].values():
        for line in entry["lines"]:
            say(line)
    overall = overall_line(reading)
    if overall:
        say(overall)


def report_summary(run_dir: Path, summary: dict, *, say, emit) -> None:
    """Write `summary` (its `peers` are the table's rows) to `run_dir/summary.json`, then print the summary table, one
    `[swarm] warning: ...` line per peer whose exchange went wrong (`exchange_warnings`) and the swarm's last line
    (`say`: the launcher's own lines, `emit`: plain output). An earlier run's `summary.json` is kept, renamed to
    `summary.json.<N>` (`commands.keep_earlier`). A summary that cannot be written is said, not raised: the peers'
    exit codes decide the launcher's; warnings never change the exit code either."""
    path = write_summary_file(run_dir, summary, say=say)
    emit("")
    emit(format_summary_table(summary["peers"]))
    if any(row.get("curve") or row.get("run") for row in summary["peers"]):
        from .curves import plot_curves

        title = overall_line(summary.get("joining") or {}) or "each peer beside its controls (one run)"
        try:
            why = plot_curves(Path(run_dir) / "curves.png", summary["peers"], title=title)
        except Exception as exc:  # noqa: BLE001 - a picture must never cost the summary
            why = f"{type(exc).__name__}: {exc}"
        say(f"curves in {Path(run_dir) / 'curves.png'}" if why is None else f"no curves.png: {why}")
    reading = summary.get("joining") or {}
    if reading.get("peers"):
        say_reading(reading, "what joining was worth (this run against its controls):", say=say)
    warnings = exchange_warnings(summary["peers"])
    for line in warnings:
        say(line)
    said = f" ({len(warnings)} exchange warning{'s' if len(warnings) != 1 else ''} above)" if warnings else ""
    say(f"{summary['reason']}; exit code {summary['exit_code']}{said}; summary in {path}")
