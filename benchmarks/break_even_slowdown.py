"""What the step-time model's under-prediction does to the break-even generation share (a prediction, nothing measured
by this script).

    python benchmarks/break_even_slowdown.py | tee benchmarks/results/break-even-slowdown.txt

Part B of the peer-gain experiment (`results/peer_gain_wall-grid.txt`, 8 seeds, hidden 128 / 2 layers / 4-digit
chains, one process a core on this 2-core CPU) measured a swarm peer's step at 1.069 [1.030, 1.108] A_2 steps where
`trl_ftis.pays.step_ratio` predicted 0.968 from that grid's mean hardware factors: the swarm's step was about 10%
dearer than the model says. If that holds elsewhere, the generation share f from which joining pays rises. This
script makes the swarm step `k` times dearer (k = measured / predicted, and the ends of the measured interval over
the same prediction) by raising the exchange share r so that `1 / (1 - r)` grows k-fold, `r' = 1 - (1 - r) / k`
(the A_N/P step, q, is left as the model assumes it), and asks `trl_ftis.pays.break_even_share` for the smallest f
(on its grid of 0.005) at which the whole predicted range over phi's bootstrap interval and beta's t-interval lies
below the better alone run, with generation in proportion to the rows (s = P) and r = 0.02, as in
`results/peer_gain-grid.txt`'s prediction table. phi and beta are part A's (`results/peer_gain-grid.jsonl`,
recomputed here unrounded, as `peer_gain.py --summary-only` does). The slowdown was measured at one CPU
configuration only.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import peer_gain  # noqa: E402

from trl_ftis.pays import break_even_share  # noqa: E402

R = 0.02  # the exchange share of the prediction table in results/peer_gain-grid.txt
WALL = peer_gain.RESULTS / "peer_gain_wall-grid.txt"


def measured_slowdown() -> tuple[float, float, float, float]:
    """(predicted step ratio swarm / A_N, measured ratio, its 95% interval) from part B's summary."""
    text = WALL.read_text()
    predicted = float(re.search(r"step ratio swarm / A_N = ([0-9.]+)", text).group(1))
    ratio, low, high = map(float, re.search(r"^step_ratio: ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", text, re.M).groups())
    return predicted, ratio, low, high


def learning() -> dict[str, tuple[int, tuple[float, float], tuple[float, float]]]:
    """Per swarm arm: (P, phi interval, beta interval), unrounded, from part A's records."""
    choice = peer_gain.rate_choice(peer_gain.load(peer_gain.RESULTS / "peer_gain-lr.jsonl"))
    offset = peer_gain.target_offset(choice)
    rates = {arm: item["rate"] for arm, item in choice.items()}
    with contextlib.redirect_stdout(io.StringIO()):
        result = peer_gain.summarise_grid(peer_gain.load(peer_gain.RESULTS / "peer_gain-grid.jsonl"), offset, rates)
    out = {}
    for arm in peer_gain.SWARM_ARMS:
        p = peer_gain.ARMS[arm][2]
        phi, beta = result["phi"][arm], result["ratios"][f"beta_{p}: A_1 / A_{p}"]
        out[arm] = (p, (phi["low"], phi["high"]), (beta["low"], beta["high"]))
    return out


def main() -> None:
    predicted, ratio, low, high = measured_slowdown()
    factors = [("as modelled", 1.0), ("measured low end", low / predicted), ("measured point", ratio / predicted),
               ("measured high end", high / predicted)]  # fmt: skip
    print("# python benchmarks/break_even_slowdown.py: predictions (trl_ftis.pays), nothing measured by this script")
    print(f"step ratio swarm / A_N in {WALL.name}: predicted {predicted:.3f}, measured {ratio:.3f} [{low:.3f}, "
          f"{high:.3f}] (8 seeds, one CPU configuration)")  # fmt: skip
    print("slowdown k = measured / predicted: " + ", ".join(f"{name} {k:.3f}" for name, k in factors))
    print(f"the swarm step made k times dearer by r' = 1 - (1 - {R}) / k; s = P; q assumed from f and s")
    print()
    header = " | ".join(f"pays from f, k = {k:.3f} (r' = {1 - (1 - R) / k:.3f})" for _, k in factors)
    print(f"| arm | P | phi range | beta range | {header} |")
    print("|---" * (4 + len(factors)) + "|")
    for arm, (p, phi, beta) in learning().items():
        cells = []
        for _, k in factors:
            share = break_even_share(p, phi, beta, r=1.0 - (1.0 - R) / k)
            cells.append("never" if share is None else f"{share:.3f}")
        print(f"| {arm} | {p} | [{phi[0]:.2f}, {phi[1]:.2f}] | [{beta[0]:.2f}, {beta[1]:.2f}] | " + " | ".join(cells)
              + " |")  # fmt: skip


if __name__ == "__main__":
    main()
