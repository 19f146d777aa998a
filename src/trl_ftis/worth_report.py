"""What joining was worth to each swarm peer of a launcher run, in words: the launcher's end-of-run reading and
`trl-ftis pays RUN_DIR`.

From the rows of a launcher's `summary.json` (one per seed: each row's `run` is `trl_ftis.joining.arm_record` of the
peer's own summary), [`peer_seeds`] gathers each swarm peer's runs and its controls', `trl_ftis.joining.analyse_peer`
measures them, and [`peer_reading`] says it: a plain sentence per control first (how long training alone took to the
target against this run), then phi, the gains at equal steps, the steps, own rows and seconds to the target, and the
`trl_ftis.pays` prediction from the run's own factors. Verdict words ("ahead", "behind", "faster", "pays") appear only
with intervals over seeds; one seed says what it saw and that another seed can move each arm by more.

Standard library only (the launcher imports it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import joining, pays

__all__ = [
    "card_section",
    "control_kind",
    "is_launcher_run",
    "launcher_run_report",
    "launcher_run_rows",
    "overall_line",
    "peer_reading",
    "peer_seeds",
    "record_in_peer_outputs",
    "run_reading",
    "undecided",
]

CONTROL_NAMES = {
    "alone": "training alone on its own rows",
    "alone-rows": "training alone on as many rows a step as it trains on",
}
ONE_SEED = (
    "one seed: what this run saw, not a verdict; another seed can move each arm by more than its evaluation noise "
    "(add `seeds: [0, 1, 2, ...]` to the config for intervals over seeds)"
)


def control_kind(row: Mapping[str, Any]) -> str | None:
    """The kind of control a summary row is (`alone`, `alone-rows`), from its id `<peer>-<kind>`; None for a peer."""
    of = row.get("control_of")
    peer_id = row.get("id")
    if not isinstance(of, str) or not isinstance(peer_id, str) or not peer_id.startswith(f"{of}-"):
        return None
    kind = peer_id[len(of) + 1 :]
    return kind if kind in joining.ARMS else None


def peer_seeds(seeds: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, list[dict[str, joining.ArmRun | None]]]:
    """Each swarm peer that has a control: for each seed (`seeds[k]` is that seed's summary rows), its run and its
    controls' (`trl_ftis.joining.ARMS`; None where missing or unreadable). A row whose `run` is malformed counts as
    missing: it came from another process's file."""

    def run_of(row: Mapping[str, Any] | None) -> joining.ArmRun | None:
        if row is None or not isinstance(row.get("run"), Mapping):
            return None
        try:
            return joining.arm_run(row["run"])
        except ValueError:
            return None

    found: dict[str, list[dict[str, joining.ArmRun | None]]] = {}
    for rows in seeds:
        rows = [row for row in rows if isinstance(row, Mapping)]
        controlled = {row.get("control_of") for row in rows if control_kind(row)}
        for row in rows:
            if row.get("control_of") is not None or row.get("id") not in controlled:
                continue
            arms: dict[str, joining.ArmRun | None] = {"swarm": run_of(row)}
            for kind in ("alone", "alone-rows"):
                match = next((c for c in rows if c.get("control_of") == row["id"] and control_kind(c) == kind), None)
                arms[kind] = run_of(match)
            found.setdefault(row["id"], []).append(arms)
    return found


def _ratio_text(entry: Mapping[str, Any] | None, *, invert: bool = False) -> str:
    if not entry:
        return "-"
    value = 1 / entry["value"] if invert else entry["value"]
    if "low" not in entry:
        return f"{value:.2f}x"
    low, high = (1 / entry["high"], 1 / entry["low"]) if invert else (entry["low"], entry["high"])
    return f"{value:.2f}x [{low:.2f}, {high:.2f}]"


def _faster(entry: Mapping[str, Any]) -> str:
    """The verdict on a control's time over the swarm peer's (over seeds only)."""
    low, high = 1 / entry["high"], 1 / entry["low"]
    if low > 1:
        return "joining was faster"
    if high < 1:
        return "training alone was faster"
    return "not distinguishable"


def _target_text(analysis: Mapping[str, Any]) -> str:
    target = analysis.get("target") or {}
    if target.get("accuracy") is not None:
        return f"accuracy {target['accuracy']:.3f}"
    goals = [goal for goal in target.get("per_seed", []) if goal is not None]
    if target.get("offset") is None or not goals:
        return "-"
    shown = f"{goals[0]:.3f}" if len(goals) == 1 else f"{min(goals):.3f}-{max(goals):.3f} by seed"
    return f"accuracy before + {target['offset']:.3f} ({shown})"


def learning_factors(analysis: Mapping[str, Any]) -> tuple[tuple | None, tuple | None]:
    """(phi, beta) as `trl_ftis.pays` takes them, (estimate, low, high), from an analysis; None where not measured.
    A point without an interval (one seed) stands for its own interval."""

    def triple(entry: Mapping[str, Any] | None) -> tuple | None:
        if not entry:
            return None
        value = entry["value"]
        return (value, entry.get("low", value), entry.get("high", value))

    return triple(analysis.get("phi")), triple(analysis.get("beta"))


def undecided(analysis: Mapping[str, Any]) -> str | None:
    """Why the run's phi and beta cannot back a verdict (no interval over seeds), or None when they can."""
    reasons = []
    if analysis.get("interval_kind") != "seeds":
        reasons.append("one seed (its intervals leave training noise out)")
    else:
        if "low" not in (analysis.get("phi") or {}):
            reasons.append("phi has no interval over seeds (it needs 3 seeds)")
        if "low" not in (analysis.get("beta") or {}):
            reasons.append(
                "beta has no interval over seeds (it needs 2 seeds in which both controls reached the target)"
            )
    return "; ".join(reasons) or None


def peer_reading(peer_id: str, analysis: Mapping[str, Any], peers: int) -> dict[str, Any]:
    """The reading of one swarm peer: `lines` for people and `pays` (the prediction's numbers, or why there is
    none). `peers` is the swarm's size P."""
    seeds = analysis.get("seeds", 0)
    over_seeds = analysis.get("interval_kind") == "seeds"
    target = _target_text(analysis)
    reached = analysis.get("reached") or {}
    lines: list[str] = []
    for control, name in CONTROL_NAMES.items():
        entry = (analysis.get("seconds_vs") or {}).get(control)
        runs = reached.get(control) or []
        if not runs or not any(r is not None for r in runs):
            if runs:
                lines.append(f"peer {peer_id}: {name} ({peer_id}-{control}) did not reach the target ({target})")
            continue
        if entry is None:
            lines.append(f"peer {peer_id}: {name} reached the target ({target}), this run did not")
            continue
        share = _ratio_text(entry, invert=True)
        text = f"peer {peer_id}: {name} reached the target ({target}) in {share} this run's time"
        if over_seeds and "low" in entry:
            lines.append(f"{text} over {entry['seeds']} seeds: {_faster(entry)}")
        else:
            lines.append(f"{text} ({ONE_SEED if seeds == 1 else 'too few seeds reached it for an interval'})")
    detail = [f"  target: {target}, reached at the first of {joining.CONSECUTIVE} evaluations in a row at or above it"]
    phi = analysis.get("phi")
    kind_text = joining.INTERVAL_KINDS.get(analysis.get("interval_kind", ""), "")
    if phi:
        interval = f" [{phi['low']:.2f}, {phi['high']:.2f}]" if "low" in phi else " (no interval)"
        detail.append(
            f"  phi = {phi['value']:.2f}{interval}: a peer row's value in own rows at equal steps; {kind_text}"
        )
    for control, entry in (analysis.get("gain_vs") or {}).items():
        text = f"  accuracy gain at equal steps, this run - {control}: {entry['mean']:+.3f}"
        if "low" in entry:
            text += f" [{entry['low']:+.3f}, {entry['high']:+.3f}]"
            if entry.get("kind") == "seeds":
                word = "ahead" if entry["low"] > 0 else "behind" if entry["high"] < 0 else "not distinguishable"
                text += f" over {entry['seeds']} seeds: {word}"
            else:
                text += " (evaluation noise only)"
        detail.append(text)
    for key, label in (("steps_vs", "steps"), ("rows_vs", "own generated rows"), ("seconds_vs", "training seconds")):
        parts = [f"{control} {_ratio_text(entry)}" for control, entry in (analysis.get(key) or {}).items() if entry]
        if parts:
            detail.append(f"  {label} to the target, this run over: {', '.join(parts)}")
    beta = analysis.get("beta")
    if beta:
        detail.append(f"  beta = {_ratio_text(beta).rstrip('x').replace('x [', ' [')}: steps of alone over alone-rows")
    detail += [f"  not measured: {item}" for item in analysis.get("missing", [])]

    prediction: dict[str, Any] = {}
    phi3, beta3 = learning_factors(analysis)
    means = (analysis.get("hardware") or {}).get("mean") or {}
    try:
        if phi3 is None or beta3 is None or beta3[1] <= 0:
            raise ValueError("phi and beta need both controls, evaluations during training and a target reached")
        hardware = pays.hardware_from_measured(means, peers)
        prediction = {
            "hardware": {
                "peers": hardware.peers,
                "f": hardware.f,
                "s": hardware.s,
                "r": hardware.r,
                "q": hardware.alone_step_ratio,
                "g": hardware.g,
                "t": hardware.t,
                "step": hardware.step_ratio,
                "assumed": list(hardware.assumed),
            },
            "ratios": pays.wall_ratios(hardware, phi3[0], beta3[0]),
            "ranges": pays.wall_ratio_range(hardware, phi3[1:], beta3[1:]),
        }
        report = pays.format_report(
            hardware,
            phi3,
            beta3,
            who=f"peer {peer_id} (trl-ftis pays, from this run)",
            without_verdict=undecided(analysis),
        )
        detail += ["  " + line for line in report.splitlines()]
    except ValueError as error:
        prediction = {"none": str(error)}
        detail.append(f"  trl-ftis pays: no prediction: {error}")
    return {"lines": lines + detail, "pays": prediction}


def run_reading(seeds: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Every controlled swarm peer's analysis and reading, from the summary rows of each seed; `peers` is P (the
    swarm peers of the first seed)."""
    swarm_size = max(2, sum(1 for row in (seeds[0] if seeds else []) if row.get("control_of") is None))
    out: dict[str, Any] = {"seeds": len(seeds), "peers": {}}
    for peer_id, runs in peer_seeds(seeds).items():
        analysis = joining.analyse_peer(runs)
        reading = peer_reading(peer_id, analysis, swarm_size)
        out["peers"][peer_id] = {"analysis": analysis, **reading}
    return out


def overall_line(reading: Mapping[str, Any]) -> str | None:
    """One line over every controlled peer: phi, and the time to the target against the faster control."""
    parts = []
    for peer_id, entry in (reading.get("peers") or {}).items():
        analysis = entry["analysis"]
        phi = analysis.get("phi")
        phi_text = (
            "phi -"
            if not phi
            else f"phi {phi['value']:.2f}" + (f" [{phi['low']:.2f}, {phi['high']:.2f}]" if "low" in phi else "")
        )
        times = [(c, e) for c, e in (analysis.get("seconds_vs") or {}).items() if e]
        if times:
            control, best = max(times, key=lambda item: item[1]["value"])  # the control that got there soonest
            verdict = _faster(best) if "low" in best and analysis.get("interval_kind") == "seeds" else "one run"
            parts.append(
                f"{peer_id}: {phi_text}; {control} took {_ratio_text(best, invert=True)} its time ({verdict})"
            )
        else:
            parts.append(f"{peer_id}: {phi_text}; time to the target not measured")
    if not parts:
        return None
    seeds = reading.get("seeds", 1)
    return f"joining, {seeds} seed{'s' if seeds != 1 else ''}: " + "; ".join(parts)


MAX_RUN_SUMMARY_BYTES = 64 * 2**20  # a launcher summary.json larger than this is not read
LAUNCHER_SUMMARY = "summary.json"  # the launcher's (`trl_ftis.launcher.summary`); a run's own is SUMMARY_FILE


def is_launcher_run(path: str | Path) -> bool:
    """Whether `path` is a launcher run directory (it holds the launcher's `summary.json`)."""
    return Path(path).is_dir() and (Path(path) / LAUNCHER_SUMMARY).is_file()


def _read_json(path: Path, limit: int) -> Any:
    if not path.is_file():
        raise ValueError(f"{path}: missing")
    if path.stat().st_size > limit:
        raise ValueError(f"{path}: larger than {limit} bytes, not a launcher summary")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None


def launcher_run_rows(run_dir: str | Path) -> list[list[dict[str, Any]]]:
    """The summary rows of each seed of a launcher run (one list for a run without `seeds:`), read from its
    `summary.json` files: a seed's file is `seed-N/summary.json` under `run_dir`, whatever the top file says."""
    run_dir = Path(run_dir)
    top = _read_json(run_dir / LAUNCHER_SUMMARY, MAX_RUN_SUMMARY_BYTES)
    if not isinstance(top, Mapping):
        raise ValueError(f"{run_dir / LAUNCHER_SUMMARY}: not a JSON object")  # noqa: TRY004
    if isinstance(top.get("peers"), list):
        return [[row for row in top["peers"] if isinstance(row, dict)]]
    seeds = top.get("seeds")
    if not isinstance(seeds, list):
        raise ValueError(f"{run_dir / LAUNCHER_SUMMARY}: neither peers nor seeds (not a launcher summary?)")  # noqa: TRY004
    rows = []
    for entry in seeds:
        seed = entry.get("seed") if isinstance(entry, Mapping) else None
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            continue
        try:
            data = _read_json(run_dir / f"seed-{seed}" / LAUNCHER_SUMMARY, MAX_RUN_SUMMARY_BYTES)
        except ValueError:
            continue  # a seed that did not finish: read the others
        if isinstance(data, Mapping) and isinstance(data.get("peers"), list):
            rows.append([row for row in data["peers"] if isinstance(row, dict)])
    if not rows:
        raise ValueError(f"{run_dir}: no seed's summary.json could be read")
    return rows


def launcher_run_report(run_dir: str | Path) -> str:
    """`trl-ftis pays RUN_DIR` for a launcher run: each controlled swarm peer's reading (`trl_ftis.worth_report`)."""
    reading = run_reading(launcher_run_rows(run_dir))
    if not reading["peers"]:
        raise ValueError(
            f"{run_dir}: no swarm peer with a control: run the swarm with `controls: [alone, alone-rows]` (and a "
            "held-out evaluation during training) to measure what joining was worth"
        )
    lines = [line for entry in reading["peers"].values() for line in entry["lines"]]
    overall = overall_line(reading)
    return "\n".join([*lines, *([overall] if overall else [])])


CARD_BEGIN = "<!-- trl-ftis: what joining was worth -->"
CARD_END = "<!-- /trl-ftis: what joining was worth -->"
MAX_PEER_FILE_BYTES = 16 * 2**20  # a peer's summary or card larger than this is left alone


def card_section(peer_id: str, entry: Mapping[str, Any]) -> str:
    """The model card's section on what joining was worth to `peer_id` (the reading's lines), between markers so
    that a later reading replaces it."""
    lines = "\n".join(entry.get("lines", []))
    return (
        f"{CARD_BEGIN}\n## What joining was worth\n\nMeasured by the launcher against this peer's own controls "
        f"(the same configuration trained alone); `trl-ftis pays RUN_DIR` prints it again.\n\n```text\n{lines}\n```\n"
        f"{CARD_END}\n"
    )


def record_in_peer_outputs(output_dirs: Mapping[str, Any], reading: Mapping[str, Any]) -> list[str]:
    """Keep each controlled peer's reading in its own output directory (`output_dirs[peer_id]`): as `joining` in its
    `ftis_summary.json` and as a section of its model card (`README.md`), where those files exist. Returns what
    could not be written (never raises: the run's summary matters more)."""
    from .shared_names import SUMMARY_FILE

    problems = []
    for peer_id, entry in (reading.get("peers") or {}).items():
        if peer_id not in output_dirs:
            continue
        folder = Path(output_dirs[peer_id])
        kept = {"analysis": entry.get("analysis"), "pays": entry.get("pays"), "lines": entry.get("lines"),
                "seeds": reading.get("seeds")}  # fmt: skip
        for name in (SUMMARY_FILE, "README.md"):
            path = folder / name
            try:
                if not path.is_file() or path.stat().st_size > MAX_PEER_FILE_BYTES:
                    continue
                text = path.read_text(encoding="utf-8")
                if name == SUMMARY_FILE:
                    data = json.loads(text)
                    if not isinstance(data, dict):
                        continue
                    data["joining"] = kept
                    path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
                else:
                    if CARD_BEGIN in text and CARD_END in text:
                        text = text[: text.index(CARD_BEGIN)] + text[text.index(CARD_END) + len(CARD_END) + 1 :]
                    path.write_text(text.rstrip("\n") + "\n\n" + card_section(peer_id, entry), encoding="utf-8")
            except (OSError, ValueError, UnicodeDecodeError) as error:
                problems.append(f"{path}: {error}")
    return problems
