"""Does joining a swarm pay? The predicted wall-time ratio of a swarm peer against training alone.

Wall time to a target accuracy is steps x seconds per step. The two factors come from different places:

* **Seconds per step depend on the hardware.** A swarm peer of a swarm of P generates B own rows a step and trains on
  P x B (its own and the P - 1 peers'). Training alone, a user has two alternatives: **A_N** generates and trains on
  P x B rows a step; **A_N/P** generates and trains on B, the peer's own generation. With A_N's step as the unit:

  * f: the generation share of an A_N step;
  * s: the generation scaling gen(P x B) / gen(B) (s = P when generation grows in proportion to the rows, s = 1
    when it is latency-bound, as for tiny models on a CPU);
  * r: the exchange's share of the swarm peer's step;
  * q: the A_N/P step over the A_N step.

  Then the swarm peer's step is `(1 - f + f / s) / (1 - r)` A_N steps ([`step_ratio`]).

* **Steps depend on learning alone.** beta = steps(A_N/P) / steps(A_N) says how much P times the rows a step cut the
  steps to the target; phi is the value of a peer row relative to an own row. A peer's P x B rows are then worth
  `m = 1 + phi (P - 1)` own batches of B, and the steps to the target follow the power law through A_N/P (m = 1) and
  A_N (m = P): `steps(m) = beta x m^-gamma` A_N steps, gamma = ln beta / ln P ([`steps_ratio`]): phi = 1 gives A_N's
  steps, phi = 0 A_N/P's.

[`wall_ratios`] multiplies them: the swarm's wall time over A_N's, over A_N/P's, and over the better of the two (the
user's real alternative). [`wall_ratio_range`] gives their range over intervals of phi and beta (and, where known, of
the hardware factors). [`factors_from_summaries`] reads f, s, r and q from runs' `ftis_summary.json` files, saying
which factor was measured and which assumed. `trl-ftis pays RUN_DIR ...` prints the result.

Every formula here is checked against hand-computed values in `tests/test_pays.py`; `benchmarks/peer_gain.py`
measures phi and beta, `benchmarks/frontier.py` the hardware factors of a few configurations of this CPU.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .rules import SUMMARY_FILE

__all__ = [
    "Hardware",
    "break_even_share",
    "factors_from_summaries",
    "format_report",
    "measured_learning",
    "step_ratio",
    "steps_ratio",
    "wall_ratio_range",
    "wall_ratios",
]

#: phi and beta as this library measured them (estimate, low, high): tiny Llamas on carry-chain addition, every arm
#: at its best learning rate, 16 paired seeds, phi with a 95% bootstrap interval and beta with a 95% t-interval
#: (`benchmarks/peer_gain.py`, raw summary `benchmarks/results/peer_gain-grid.txt`, docs/benchmarks.md section 17.4).
#: Keys: (partners, P); "copy" = copies of one model, "hetero" = a learner fed by smaller partners' rows.
#: A default for `trl-ftis pays --partners` where a user has not measured their own.
MEASURED_LEARNING: dict[tuple[str, int], dict[str, tuple[float, float, float]]] = {
    ("copy", 2): {"phi": (1.16, 0.88, 1.72), "beta": (1.44, 1.07, 1.95)},
    ("hetero", 2): {"phi": (0.24, -0.16, 0.52), "beta": (1.44, 1.07, 1.95)},
    ("copy", 4): {"phi": (0.95, 0.84, 1.05), "beta": (2.24, 1.61, 3.10)},
    ("hetero", 4): {"phi": (0.47, 0.35, 0.60), "beta": (2.24, 1.61, 3.10)},
}


def measured_learning(partners: str, peers: int) -> dict[str, tuple[float, float, float]]:
    """phi and beta measured here for `partners` ("copy" or "hetero") at swarm size `peers` (2 or 4)."""
    kinds = sorted({kind for kind, _ in MEASURED_LEARNING})
    if partners not in kinds:
        raise ValueError(f"partners {partners!r}: measured for {', '.join(kinds)}")
    sizes = sorted(size for kind, size in MEASURED_LEARNING if kind == partners)
    if (partners, peers) not in MEASURED_LEARNING:
        raise ValueError(
            f"phi and beta were measured for P = {' and '.join(map(str, sizes))}, not P = {peers}: give --phi and "
            "--beta (or --peers)"
        )
    return MEASURED_LEARNING[(partners, peers)]


MAX_SUMMARY_BYTES = 4 * 1024 * 1024
"""A `ftis_summary.json` larger than this is not read (a run's summary is a few kilobytes)."""


@dataclass(frozen=True)
class Hardware:
    """The hardware factors of one setting, A_N's step as the unit (see the module docstring).

    `assumed` names the factors that were not measured but assumed (shown with the result)."""

    peers: int
    f: float
    s: float
    r: float = 0.0
    q: float | None = None
    assumed: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if not isinstance(self.peers, int) or self.peers < 2:
            raise ValueError(f"peers (P) must be an integer >= 2, got {self.peers!r}")
        if not 0.0 <= self.f < 1.0:
            raise ValueError(f"f (generation share of an A_N step) must be in [0, 1), got {self.f!r}")
        if not self.s >= 1.0 or math.isinf(self.s):
            raise ValueError(
                f"s (generation scaling gen(P x B) / gen(B)) must be a finite number >= 1, got {self.s!r}"
            )
        if not 0.0 <= self.r < 1.0:
            raise ValueError(f"r (exchange share of the swarm step) must be in [0, 1), got {self.r!r}")
        if self.q is not None and not 0.0 < self.q <= 1.0:
            raise ValueError(f"q (A_N/P step over A_N step) must be in (0, 1], got {self.q!r}")

    @property
    def alone_step_ratio(self) -> float:
        """q: the A_N/P step in A_N steps; when not measured, its generation (f / s) plus the rest of A_N's step
        scaled by the rows trained (1 - f) / P: training costs in proportion to the rows."""
        return self.q if self.q is not None else self.f / self.s + (1.0 - self.f) / self.peers


def step_ratio(f: float, s: float, r: float = 0.0) -> float:
    """The swarm peer's step over A_N's: it generates 1/P of the rows (saving `f (1 - 1/s)`), trains on as many, and
    spends the share `r` of its own step in the exchange."""
    if not 0.0 <= r < 1.0:
        raise ValueError(f"r must be in [0, 1), got {r!r}")
    return (1.0 - f + f / s) / (1.0 - r)


def steps_ratio(phi: float, beta: float, peers: int) -> float:
    """The swarm peer's steps to the target over A_N's: `beta x (1 + phi (P - 1))^-gamma`, gamma = ln beta / ln P.

    phi = 1 gives 1 (A_N's steps), phi = 0 gives beta (A_N/P's). A phi below 0 (peer rows that hurt) counts as 0
    rows gained, but not fewer: the power law is not defined below one batch of own rows."""
    if peers < 2:
        raise ValueError(f"peers (P) must be >= 2, got {peers!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    gamma = math.log(beta) / math.log(peers)
    batches = max(1.0 + phi * (peers - 1), 1.0)
    return beta * batches ** (-gamma)


def wall_ratios(hardware: Hardware, phi: float, beta: float) -> dict[str, float]:
    """The swarm peer's wall time to the target over A_N's (`vs_full`), over A_N/P's (`vs_own`) and over the better
    of the two (`vs_best`), with the factors: `step` (step ratio to A_N), `steps` (steps ratio to A_N) and
    `alone_wall` (A_N/P's wall time over A_N's, beta x q)."""
    step = step_ratio(hardware.f, hardware.s, hardware.r)
    steps = steps_ratio(phi, beta, hardware.peers)
    alone_wall = beta * hardware.alone_step_ratio
    swarm = step * steps
    return {
        "step": step,
        "steps": steps,
        "alone_wall": alone_wall,
        "vs_full": swarm,
        "vs_own": swarm / alone_wall,
        "vs_best": swarm / min(1.0, alone_wall),
    }


def wall_ratio_range(
    hardware: Hardware | Iterable[Hardware], phi: tuple[float, float], beta: tuple[float, float], points: int = 9
) -> dict[str, tuple[float, float]]:
    """The lowest and highest value of each of [`wall_ratios`] over phi in `phi` (low, high), beta in `beta` and each
    `hardware` setting given (one, or several: e.g. the ends of measured intervals), on a grid of `points` values per
    interval with both ends (the ratios are monotone in phi and, for phi <= 1, in beta, so the ends decide; the grid
    also covers phi above 1)."""
    settings = [hardware] if isinstance(hardware, Hardware) else list(hardware)
    if not settings:
        raise ValueError("no hardware setting given")
    for name, (low, high) in (("phi", phi), ("beta", beta)):
        if not low <= high:
            raise ValueError(f"{name} interval ({low}, {high}) is not ordered")

    def grid(low: float, high: float) -> list[float]:
        return [low + (high - low) * i / (points - 1) for i in range(points)] if high > low else [low]

    out: dict[str, list[float]] = {}
    for setting, x, b in itertools.product(settings, grid(*phi), grid(*beta)):
        for key, value in wall_ratios(setting, x, b).items():
            low_high = out.setdefault(key, [math.inf, -math.inf])
            low_high[0], low_high[1] = min(low_high[0], value), max(low_high[1], value)
    return {key: (low, high) for key, (low, high) in out.items()}


def break_even_share(
    peers: int,
    phi: tuple[float, float],
    beta: tuple[float, float],
    *,
    s: float | None = None,
    r: float = 0.0,
    q: float | None = None,
    resolution: int = 200,
) -> float | None:
    """The smallest generation share f (on a grid of `resolution` steps over [0, 1)) at which the whole predicted
    range of the swarm's wall time over the better alone run is below 1, for phi and beta in their intervals, the
    generation scaling `s` (default P: generation in proportion to the rows), exchange share `r` and A_N/P step `q`
    (default: assumed from f and s); `None` when no f below 1 makes joining pay."""
    for i in range(resolution):
        f = i / resolution
        setting = Hardware(peers=peers, f=f, s=float(peers) if s is None else s, r=r, q=q)
        if wall_ratio_range(setting, phi, beta, points=5)["vs_best"][1] < 1.0:
            return f
    return None


def verdict(low: float, high: float) -> str:
    """'pays' when the whole interval is below 1, 'does not pay' when it is above, else 'not distinguishable'."""
    if high < 1.0:
        return "pays"
    if low > 1.0:
        return "does not pay"
    return "not distinguishable"


# -- reading runs ----------------------------------------------------------------------------------------------------
def read_summary(path: str | Path) -> dict[str, Any]:
    """A run's `ftis_summary.json` (`path` is the file or the run's output dir), checked for what this module reads."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no {SUMMARY_FILE} (is this a finished trl-ftis run's output_dir?)")
    if path.stat().st_size > MAX_SUMMARY_BYTES:
        raise ValueError(f"{path}: larger than {MAX_SUMMARY_BYTES} bytes, not a run summary")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(summary, Mapping):
        raise ValueError(f"{path}: not a JSON object")  # noqa: TRY004 - one error type for every bad summary
    steps = summary.get("steps")
    times = summary.get("time_seconds")
    own = summary.get("own_generation")
    if not _positive_int(steps):
        raise ValueError(f"{path}: 'steps' is not a positive integer (did the run train?)")
    if not isinstance(times, Mapping) or not all(
        _non_negative(times.get(k)) for k in ("step", "generation", "exchange")
    ):
        raise ValueError(f"{path}: 'time_seconds' lacks step, generation or exchange seconds")
    if not times["step"] > 0:
        raise ValueError(f"{path}: 'time_seconds.step' is 0")
    if not isinstance(own, Mapping) or not _positive_int(own.get("rows")):
        raise ValueError(f"{path}: 'own_generation.rows' is not a positive integer")
    peer_rows = (
        (summary.get("peer_value") or {}).get("rows_in_loss", 0)
        if isinstance(summary.get("peer_value"), Mapping)
        else 0
    )
    if not _non_negative(peer_rows):
        raise ValueError(f"{path}: 'peer_value.rows_in_loss' is not a number >= 0")
    return {
        "path": str(path),
        "steps": steps,
        "step": times["step"] / steps,
        "generation": times["generation"] / steps,
        "exchange": times["exchange"] / steps,
        "own_rows": own["rows"] / steps,
        "peer_rows": peer_rows / steps,
    }


def factors_from_summaries(paths: Iterable[str | Path], peers: int | None = None) -> tuple[Hardware, dict[str, Any]]:
    """The hardware factors from runs' summaries: exactly one swarm peer (a run that trained on peer rows), and
    optionally alone runs of the same model and task: one generating P x B rows a step (A_N: gives f and s) and one
    generating B (A_N/P: gives q).

    From the swarm peer alone: r (exchange / step), B (own rows a step) and P (rows trained / own rows, rounded;
    `peers` overrides it). Without an A_N run, s is assumed to be P (generation in proportion to the rows) and A_N's
    step is predicted from the peer's (its generation x s, the exchange taken out); without an A_N/P run, q is
    predicted as in [`Hardware.alone_step_ratio`]. Returns the factors and what was read (`runs`, `assumed`)."""
    runs = [read_summary(p) for p in paths]
    swarm = [run for run in runs if run["peer_rows"] > 0]
    alone = [run for run in runs if run["peer_rows"] == 0]
    if len(swarm) != 1:
        raise ValueError(
            f"give exactly one swarm peer's run (one that trained on peer rows); got {len(swarm)} among {len(runs)}"
        )
    peer = swarm[0]
    if peers is None:
        peers = max(2, round((peer["own_rows"] + peer["peer_rows"]) / peer["own_rows"]))
    own_rows = peer["own_rows"]
    full = [run for run in alone if abs(run["own_rows"] - peers * own_rows) <= 0.05 * peers * own_rows]
    same = [run for run in alone if abs(run["own_rows"] - own_rows) <= 0.05 * own_rows]
    if len(alone) != len(full) + len(same):
        odd = [run["path"] for run in alone if run not in full and run not in same]
        raise ValueError(
            f"alone runs must generate {own_rows:g} (A_N/P) or {peers * own_rows:g} (A_N) rows a step; these do "
            f"not: {', '.join(odd)}"
        )
    if len(full) > 1 or len(same) > 1:
        raise ValueError("give at most one A_N run and one A_N/P run")
    assumed = []
    r = peer["exchange"] / peer["step"]
    if full:
        step_full = full[0]["step"]
        f = full[0]["generation"] / step_full
        s = max(full[0]["generation"] / peer["generation"], 1.0) if peer["generation"] > 0 else float(peers)
    else:
        s = float(peers)
        step_full = peer["step"] - peer["exchange"] - peer["generation"] + s * peer["generation"]
        f = s * peer["generation"] / step_full
        assumed += ["s", "f"]
    q = None
    if same:
        q = min(same[0]["step"] / step_full, 1.0)
    else:
        assumed.append("q")
    hardware = Hardware(peers=peers, f=f, s=s, r=r, q=q, assumed=tuple(assumed))
    return hardware, {"runs": runs, "assumed": assumed}


def format_report(hardware: Hardware, phi: tuple[float, float, float], beta: tuple[float, float, float]) -> str:
    """Lines for people: the factors (measured or assumed), the learning factors, and each ratio with its range and
    verdict. `phi` and `beta` are (estimate, low, high)."""
    point = wall_ratios(hardware, phi[0], beta[0])
    ranges = wall_ratio_range(hardware, phi[1:], beta[1:])

    def tag(name: str) -> str:
        return " (assumed)" if name in hardware.assumed else ""

    q_text = f"{hardware.alone_step_ratio:.3f}" + (
        " (assumed: training in proportion to rows)" if hardware.q is None else ""
    )
    lines = [
        (
            f"hardware: P = {hardware.peers}, f = {hardware.f:.3f}{tag('f')}, s = gen(P x B) / gen(B) = "
            f"{hardware.s:.2f}{tag('s')}, r = {hardware.r:.3f}, q = A_N/P step / A_N step = {q_text}"
        ),
        f"learning: phi = {phi[0]:.2f} [{phi[1]:.2f}, {phi[2]:.2f}], beta = {beta[0]:.2f} [{beta[1]:.2f}, {beta[2]:.2f}]",
        (
            f"step ratio swarm / A_N = {point['step']:.3f}; steps ratio swarm / A_N = {point['steps']:.3f} "
            f"[{ranges['steps'][0]:.3f}, {ranges['steps'][1]:.3f}]"
        ),
    ]
    names = {"vs_full": "A_N (as many rows a step)", "vs_own": "A_N/P (the same own generation)",
             "vs_best": "the better alone run"}  # fmt: skip
    for key, name in names.items():
        low, high = ranges[key]
        lines.append(f"wall time swarm / {name}: {point[key]:.2f} [{low:.2f}, {high:.2f}]: {verdict(low, high)}")
    share = break_even_share(hardware.peers, phi[1:], beta[1:], s=hardware.s, r=hardware.r)
    lines.append(
        "joining pays against the better alone run, over the whole phi and beta range, from a generation share f >= "
        + (f"{share:.3f}" if share is not None else "- (never below 1)")
        + " at this s and r (q assumed from f)"
    )
    if hardware.assumed:
        lines.append(
            "assumed factors are predictions: run alone with P x B rows (and with B) a step on the same hardware to "
            "measure them"
        )
    return "\n".join(lines)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**53


def _non_negative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e15
