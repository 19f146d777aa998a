"""`<run_dir>/curves.png`: each peer's reward and held-out accuracy against training time and against the completion
tokens it generated, swarm peers and their controls on the same axes (controls dashed), from the `curve` of each
peer's own summary file (`trl_ftis.evaluation.run_curve`). Needs matplotlib (the `demo` extra); without it nothing is
drawn and the caller says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_curves"]


def _points(row: dict) -> list[dict]:
    curve = row.get("curve")
    return [p for p in curve if isinstance(p, dict)] if isinstance(curve, list) else []


def plot_curves(path: Path, rows: list[dict]) -> str | None:
    """Draw the rows' curves into `path`; returns why nothing was drawn (no curves, no matplotlib), else None."""
    drawn = [row for row in rows if len(_points(row)) >= 2]
    if not drawn:
        return "no peer logged a curve"
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'trl-ftis[demo]')"
    figure, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    panels = [
        (axes[0][0], "seconds", "reward", "training time (s)"),
        (axes[0][1], "tokens", "reward", "own generated tokens"),
        (axes[1][0], "seconds", "accuracy", "training time (s)"),
        (axes[1][1], "tokens", "accuracy", "own generated tokens"),
    ]
    for axis, x_key, y_key, x_label in panels:
        for row in drawn:
            points = [p for p in _points(row) if isinstance(p.get(x_key), (int, float)) and y_key in p]
            if points:
                style: dict[str, Any] = {"linestyle": "--"} if row.get("control_of") else {}
                label = f"{row['id']} (control)" if row.get("control_of") else row["id"]
                axis.plot([p[x_key] for p in points], [p[y_key] for p in points], marker=".", label=label, **style)
        axis.set_xlabel(x_label)
        axis.set_ylabel("held-out accuracy" if y_key == "accuracy" else "reward (own rows)")
        if axis.lines:
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None
