"""Does joining a swarm pay? The predicted wall-time ratio of a swarm peer against training alone.

Wall time to a target accuracy is steps x seconds per step. The two factors come from different places:

* **Seconds per step depend on the hardware.** A swarm peer of a swarm of P generates B own rows a step and trains on
  P x B (its own and the P - 1 peers'). Training alone, a user has two alternatives: **A_N** generates and trains on
  P x B rows a step; **A_N/P** generates and trains on B, the peer's own generation. With A_N's step as the unit:

  * f: the generation share of an A_N step;
  * s: the generation scaling gen(P x B) / gen(B), measured as A_N's generation a step over A_N/P's (s = P when
    generation grows in proportion to the rows, s = 1 when it is latency-bound, as for tiny models on a CPU);
  * r: the exchange's share of the swarm peer's step;
  * q: the A_N/P step over the A_N step;
  * g and t: how much slower the swarm peer generates its own rows than A_N/P does, and trains on its P x B rows
    than A_N does, next to a partner (1 when it runs as fast as alone; shared cores and memory make them larger).

  Then the swarm peer's step is `((1 - f) t + f g / s) / (1 - r)` A_N steps ([`step_ratio`]); with every factor
  measured from the same runs this is the measured step ratio, split into its parts, and where a swarm run and an
  A_N run are both given the measured ratio is used as it is (`Hardware.step`).

* **Steps depend on learning alone.** beta = steps(A_N/P) / steps(A_N) says how much P times the rows a step cut the
  steps to the target; phi is the value of a peer row relative to an own row. A peer's P x B rows are then worth
  `m = 1 + phi (P - 1)` own batches of B, and the steps to the target follow the power law through A_N/P (m = 1) and
  A_N (m = P): `steps(m) = beta x m^-gamma` A_N steps, gamma = ln beta / ln P ([`steps_ratio`]): phi = 1 gives A_N's
  steps, phi = 0 A_N/P's.

[`wall_ratios`] multiplies them: the swarm's wall time over A_N's, over A_N/P's, and over the better of the two (the
user's real alternative). [`wall_ratio_range`] gives their range over intervals of phi and beta (and, where known, of
the hardware factors). [`factors_from_summaries`] reads the factors from runs' `ftis_summary.json` files, and
[`hardware_from_measured`] from a launcher run's controls (`trl_ftis.joining`), saying which factor was measured
and which assumed; with any factor assumed, [`format_report`] gives no verdict, only what to run to get one.
`trl-ftis pays RUN_DIR ...` prints the result.

Every formula here is checked against hand-computed values in `tests/core/test_pays.py`; `benchmarks/peer_gain.py`
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

from .joining import ArmRun, hardware_factors
from .shared_names import SUMMARY_FILE

__all__ = [
    "VERDICT_WORDS",
    "Hardware",
    "break_even_share",
    "factors_from_summaries",
    "format_report",
    "hardware_from_measured",
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
    g: float = 1.0
    t: float = 1.0
    step: float | None = None
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
        for name in ("g", "t"):
            if not 0.0 < getattr(self, name) < 100.0:
                raise ValueError(
                    f"{name} (slowdown next to a partner) must be in (0, 100), got {getattr(self, name)!r}"
                )
        if self.step is not None and not 0.0 < self.step < 100.0:
            raise ValueError(f"step (measured swarm step over A_N step) must be in (0, 100), got {self.step!r}")

    @property
    def step_ratio(self) -> float:
        """The swarm peer's step over A_N's: measured where given, else [`step_ratio`] of the factors."""
        return self.step if self.step is not None else step_ratio(self.f, self.s, self.r, g=self.g, t=self.t)

    @property
    def alone_step_ratio(self) -> float:
        """q: the A_N/P step in A_N steps; when not measured, its generation (f / s) plus the rest of A_N's step
        scaled by the rows trained (1 - f) / P: training costs in proportion to the rows."""
        return self.q if self.q is not None else self.f / self.s + (1.0 - self.f) / self.peers


def step_ratio(f: float, s: float, r: float = 0.0, *, g: float = 1.0, t: float = 1.0) -> float:
    """The swarm peer's step over A_N's: it generates 1/P of the rows (A_N/P's generation, f / s of an A_N step, `g`
    times slower next to a partner), trains on as many as A_N (the rest of A_N's step, `t` times slower), and spends
    the share `r` of its own step in the exchange."""
    if not 0.0 <= r < 1.0:
        raise ValueError(f"r must be in [0, 1), got {r!r}")
    return ((1.0 - f) * t + f * g / s) / (1.0 - r)


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
    step = hardware.step_ratio
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
    g: float = 1.0,
    t: float = 1.0,
    resolution: int = 200,
) -> float | None:
    """The smallest generation share f (on a grid of `resolution` steps over [0, 1)) at which the whole predicted
    range of the swarm's wall time over the better alone run is below 1, for phi and beta in their intervals, the
    generation scaling `s` (default P: generation in proportion to the rows), exchange share `r`, slowdowns `g` and
    `t` next to a partner and A_N/P step `q` (default: assumed from f and s); `None` when no f below 1 makes joining
    pay."""
    for i in range(resolution):
        f = i / resolution
        setting = Hardware(peers=peers, f=f, s=float(peers) if s is None else s, r=r, q=q, g=g, t=t)
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


def _arm(run: Mapping[str, Any]) -> ArmRun:
    return ArmRun(
        steps=run["steps"],
        step_seconds=run["step"],
        generation_seconds=run["generation"],
        exchange_seconds=run["exchange"],
        own_rows=run["own_rows"],
    )


def factors_from_summaries(paths: Iterable[str | Path], peers: int | None = None) -> tuple[Hardware, dict[str, Any]]:
    """The hardware factors from runs' summaries: exactly one swarm peer (a run that trained on peer rows), and
    optionally alone runs of the same model and task: one generating P x B rows a step (A_N) and one generating B
    (A_N/P). Each factor is measured as `trl_ftis.joining.hardware_factors` defines it (s: A_N's generation a step
    over A_N/P's) where its runs are given, and assumed otherwise ([`hardware_from_measured`]).

    From the swarm peer alone: r (exchange / step), B (own rows a step) and P (rows trained / own rows, rounded;
    `peers` overrides it). Returns the factors and what was read (`runs`, `assumed`)."""
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
    swarm_arm = _arm(peer)
    factors = hardware_factors(swarm_arm, _arm(same[0]) if same else None, _arm(full[0]) if full else None)
    hardware = hardware_from_measured(factors, peers, swarm_arm)
    return hardware, {"runs": runs, "assumed": list(hardware.assumed)}


def hardware_from_measured(factors: Mapping[str, float | None], peers: int, swarm=None) -> Hardware:
    """[`Hardware`] from measured factors (`trl_ftis.joining.hardware_factors`, or their means over seeds), each
    missing one assumed and named in `assumed`: g and t as 1 (no slowdown next to a partner), s as P (generation
    in proportion to the rows), f from the swarm peer's own step (`swarm`, a `trl_ftis.joining.ArmRun`: A_N's step
    predicted as the peer's training plus s times its generation), q from f and s
    ([`Hardware.alone_step_ratio`]). The measured swarm / A_N step ratio is kept as `step` where there is one."""

    def measured(name: str, low: float = 0.0) -> float | None:
        value = factors.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok and value > low else None

    assumed = []
    r = measured("r", low=-1.0)
    if r is None:
        raise ValueError("r (the swarm peer's exchange share) was not measured: no swarm run")
    g, t, s = measured("g"), measured("t"), measured("s")
    if g is None:
        g = 1.0
        assumed.append("g")
    if t is None:
        t = 1.0
        assumed.append("t")
    if s is None:
        s = float(peers)
        assumed.append("s")
    f = measured("f", low=-1.0)
    if f is None:
        if swarm is None:
            raise ValueError("f (A_N's generation share) was neither measured nor predictable without the swarm run")
        own_generation = swarm.generation_seconds / g  # A_N/P's generation a step
        training = (swarm.step_seconds - swarm.exchange_seconds - swarm.generation_seconds) / t
        f = s * own_generation / (training + s * own_generation) if training + s * own_generation > 0 else 0.0
        assumed.append("f")
    q = measured("q")
    if q is None:
        assumed.append("q")
    step = measured("step_ratio")
    return Hardware(
        peers=peers,
        f=min(max(f, 0.0), 0.999),
        s=max(s, 1.0),  # a measured s below 1 (noise on latency-bound generation) counts as no saving
        r=min(max(r, 0.0), 0.999),
        q=None if q is None else min(q, 1.0),
        g=g,
        t=t,
        step=step,
        assumed=tuple(assumed),
    )


VERDICT_WORDS = ("pays", "does not pay", "not distinguishable")
"""The words a verdict can say ([`verdict`]); none is printed where a factor was assumed."""
COMPARISONS = {
    "vs_own": "training alone on its own rows (A_N/P: the same own generation)",
    "vs_full": "training alone on as many rows a step as it trains on (A_N)",
}
HOW_TO_MEASURE = (
    "run the same configuration alone with B and with P x B rows a step on the same hardware (the launcher's "
    "`controls: [alone, alone-rows]`, with a held-out evaluation during training) and give that run directory"
)


def format_report(
    hardware: Hardware,
    phi: tuple[float, float, float],
    beta: tuple[float, float, float],
    *,
    assumed_learning: Iterable[str] = (),
    who: str = "this swarm peer",
    without_verdict: str | None = None,
) -> str:
    """Lines for people: a plain sentence first (the predicted wall time to a target against the better alone run,
    with its range and, only where nothing was assumed, a verdict), then each comparison, then the factors, each
    marked measured or assumed. `phi` and `beta` are (estimate, low, high); `assumed_learning` names those of them
    not measured on the user's own runs (e.g. taken from this library's benchmark); `without_verdict`, a reason the
    measurements cannot decide (e.g. phi without an interval over seeds), withholds the verdict too."""
    point = wall_ratios(hardware, phi[0], beta[0])
    ranges = wall_ratio_range(hardware, phi[1:], beta[1:])
    assumed = [*hardware.assumed, *assumed_learning]

    def judged(key: str) -> str:
        low, high = ranges[key]
        text = f"{point[key]:.2f}x [{low:.2f}, {high:.2f}]"
        return text if assumed or without_verdict else f"{text}: {verdict(low, high)}"

    if assumed:
        were = "was" if len(assumed) == 1 else "were"
        lines = [
            (
                f"{who}: predicted wall time to a target accuracy, over the better alone run: {judged('vs_best')}. "
                f"No verdict: {', '.join(assumed)} {were} assumed, not measured. "
                f"To measure {'it' if len(assumed) == 1 else 'them'}, {HOW_TO_MEASURE}."
            )
        ]
    elif without_verdict:
        lines = [
            (
                f"{who}: predicted wall time to a target accuracy, over the better alone run: {judged('vs_best')}. "
                f"No verdict: {without_verdict}."
            )
        ]
    else:
        lines = [f"{who}: predicted wall time to a target accuracy, over the better alone run: {judged('vs_best')}"]
    lines += [f"  against {name}: {judged(key)}" for key, name in COMPARISONS.items()]

    def tag(name: str) -> str:
        return "assumed" if name in assumed else "measured"

    q_tag = "assumed: training in proportion to rows" if hardware.q is None else "measured"
    step_tag = "measured" if hardware.step is not None else "from the factors above"
    lines += [
        "factors (A_N: alone with P x B rows a step; A_N/P: alone with B rows, the peer's own generation):",
        f"  P = {hardware.peers} peers",
        f"  f = {hardware.f:.3f}  generation share of an A_N step ({tag('f')})",
        f"  s = {hardware.s:.2f}  generation a step of A_N over A_N/P ({tag('s')})",
        f"  r = {hardware.r:.3f}  exchange share of the swarm peer's step ({tag('r')})",
        f"  q = {hardware.alone_step_ratio:.3f}  A_N/P step over A_N step ({q_tag})",
        f"  g = {hardware.g:.2f}  the swarm peer's own generation over A_N/P's, next to a partner ({tag('g')})",
        f"  t = {hardware.t:.2f}  the swarm peer's training over A_N's, next to a partner ({tag('t')})",
        f"  step ratio swarm / A_N = {point['step']:.3f} ({step_tag})",
        f"  phi = {phi[0]:.2f} [{phi[1]:.2f}, {phi[2]:.2f}]  a peer row's value in own rows ({tag('phi')})",
        f"  beta = {beta[0]:.2f} [{beta[1]:.2f}, {beta[2]:.2f}]  steps of A_N/P over A_N ({tag('beta')})",
        f"  steps ratio swarm / A_N = {point['steps']:.3f} [{ranges['steps'][0]:.3f}, {ranges['steps'][1]:.3f}]",
    ]
    share = break_even_share(hardware.peers, phi[1:], beta[1:], s=hardware.s, r=hardware.r, g=hardware.g, t=hardware.t)
    where = "at this s, r, g and t (q then in proportion to the rows)"
    lines.append(
        f"  break-even: over the whole phi and beta range, joining would beat the better alone run from a generation "
        f"share f of {share:.3f} upward {where}"
        if share is not None
        else f"  break-even: at no generation share f below 1 would joining beat the better alone run over the whole "
        f"phi and beta range {where}"
    )
    return "\n".join(lines)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**53


def _non_negative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e15
