"""`<run_dir>/curves.png`: each peer's held-out accuracy against training time and against the rows it generated
itself, with 2-standard-error bars, and its reward on the same axes; each swarm peer and its controls in one colour
family (the peer solid, `alone` dashed, `alone-rows` dotted), under a title that states the run's reading.

Accuracy comes from each row's `run` (`trl_ftis.joining.arm_record`: every evaluation's step, training-clock seconds
and per-problem results, from which the standard error is `sqrt(p (1 - p) / n)`); reward from its `curve`
(`trl_ftis.evaluation.run_curve`). Needs matplotlib (the `demo` extra); without it nothing is drawn and the caller
says so."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

__all__ = ["accuracy_points", "plot_curves"]

FAMILIES = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys")
STYLES = {None: ("-", 0.85), "alone": ("--", 0.6), "alone-rows": (":", 0.45)}  # line style, shade in the family


def _points(row: dict) -> list[dict]:
    curve = row.get("curve")
    return [p for p in curve if isinstance(p, dict)] if isinstance(curve, list) else []


def accuracy_points(row: dict) -> list[dict[str, float]]:
    """A row's held-out evaluations as `seconds`, `rows` (own generated rows so far), `accuracy` and `se` (its
    standard error over the problems; 0 when the problems were not kept); empty when it has none with seconds."""
    run = row.get("run") if isinstance(row.get("run"), dict) else {}
    per_step = run.get("per_step") if isinstance(run.get("per_step"), dict) else {}
    own_rows = per_step.get("own_rows") if isinstance(per_step.get("own_rows"), (int, float)) else 0.0
    points = []
    for entry in run.get("accuracy_evaluations") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("seconds"), (int, float)):
            continue
        accuracy, items = entry.get("accuracy"), entry.get("items")
        if not isinstance(accuracy, (int, float)):
            continue
        n = len(items) if isinstance(items, str) else 0
        se = math.sqrt(accuracy * (1 - accuracy) / n) if n else 0.0
        points.append({"seconds": entry["seconds"], "rows": entry["step"] * own_rows, "accuracy": accuracy, "se": se})
    return points


def _family(rows: list[dict]) -> dict[str, tuple[str, str | None]]:
    """Each row's colour family (its swarm peer's) and control kind (None for the peer itself)."""
    peers = [row["id"] for row in rows if row.get("control_of") is None]
    out = {}
    for row in rows:
        owner = row.get("control_of") or row["id"]
        kind = row["id"][len(owner) + 1 :] if row.get("control_of") else None
        index = peers.index(owner) if owner in peers else len(peers)
        out[row["id"]] = (FAMILIES[index % len(FAMILIES)], kind if kind in STYLES else "alone")
    return out


def plot_curves(path: Path, rows: list[dict], title: str | None = None) -> str | None:
    """Draw the rows' curves into `path` under `title` (the run's reading); returns why nothing was drawn (no
    curves, no matplotlib), else None."""
    drawn = [row for row in rows if len(_points(row)) >= 2 or len(accuracy_points(row)) >= 2]
    if not drawn:
        return "no peer logged a curve"
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'trl-ftis[demo]')"
    families = _family(drawn)
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    for row in drawn:
        family, kind = families[row["id"]]
        linestyle, shade = STYLES[kind]
        colour = plt.get_cmap(family)(shade)
        label = row["id"] if kind is None else f"{row['id']} (control)"
        accuracy = accuracy_points(row)
        for axis, x_key in ((axes[0][0], "seconds"), (axes[0][1], "rows")):
            if accuracy:
                axis.errorbar(
                    [p[x_key] for p in accuracy],
                    [p["accuracy"] for p in accuracy],
                    yerr=[2 * p["se"] for p in accuracy],
                    color=colour, linestyle=linestyle, marker=".", capsize=2, label=label,
                )  # fmt: skip
        reward = [p for p in _points(row) if "reward" in p]
        for axis, x_key in ((axes[1][0], "seconds"), (axes[1][1], "tokens")):
            points = [p for p in reward if isinstance(p.get(x_key), (int, float))]
            if points:
                axis.plot([p[x_key] for p in points], [p["reward"] for p in points], color=colour,
                          linestyle=linestyle, marker=".", label=label)  # fmt: skip
    labels = {
        (0, 0): ("training time (s)", "held-out accuracy (bars: 2 SE, evaluation noise only)"),
        (0, 1): ("own generated rows", "held-out accuracy (bars: 2 SE, evaluation noise only)"),
        (1, 0): ("training time (s)", "reward (own rows)"),
        (1, 1): ("own generated tokens", "reward (own rows)"),
    }
    for (i, j), (x_label, y_label) in labels.items():
        axes[i][j].set_xlabel(x_label)
        axes[i][j].set_ylabel(y_label)
        if axes[i][j].lines:
            axes[i][j].legend(fontsize="small")
    if title:
        figure.suptitle("\n".join(textwrap.wrap(title, 140)), fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None
