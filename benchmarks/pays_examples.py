"""Worked examples of `trl_ftis.pays` for docs/when-it-pays.md: the predicted wall-time ratio of a swarm peer
against training alone, for the learning factors measured here (`MEASURED_LEARNING`: phi and beta of part A of the
peer-gain experiment) and a few hardware settings.

    python benchmarks/pays_examples.py | tee benchmarks/results/pays-examples.txt

Nothing here is measured: the hardware rows are (1) this CPU's regime frontier at its best configuration
(`results/frontier-amended.txt`: f and s of A_N measured; r = 0.1 assumed, the low end of the lock-step exchange's
0.086-0.225 measured in docs/benchmarks.md section 13), and (2) GPU-like
factors that are assumptions (f from the 60-90% generation share large RL systems report, generation in proportion
to the rows, a small exchange), labelled as predictions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from trl_ftis.pays import MEASURED_LEARNING, Hardware, break_even_share, verdict, wall_ratio_range, wall_ratios


def frontier_best() -> dict:
    """The amended frontier's configuration with the lowest predicted step ratio (its A_N step within 6 s)."""
    sys.path.insert(0, str(HERE))
    import frontier

    records = [json.loads(line) for line in (HERE / "results/frontier-amended.jsonl").read_text().splitlines() if line]
    summaries = [(record["spec"], frontier.summarise_config(record)) for record in records]
    spec = frontier.choose(summaries)
    return next(s for sp, s in summaries if sp is spec) | {"spec": spec}


def main() -> None:
    best = frontier_best()
    spec = best["spec"]
    settings = [
        (f"this CPU, frontier best ({spec['hidden']}/{spec['layers']}/{spec['digits']}), r 0.1 assumed", best["f"],
         best["s"], 0.1),
        ("GPU-like (assumed): f 0.6, s = P, r 0.02", 0.6, None, 0.02),
        ("GPU-like (assumed): f 0.8, s = P, r 0.02", 0.8, None, 0.02),
        ("GPU-like (assumed): f 0.9, s = P, r 0.02", 0.9, None, 0.02),
    ]  # fmt: skip
    print("# python benchmarks/pays_examples.py: predictions from trl_ftis.pays, nothing measured by this script")
    print("| hardware | arm | P | f | s | r | step ratio swarm / A_N | wall swarm / A_N | wall swarm / A_N/P | "
          "wall swarm / better alone [range] | verdict | pays from f |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, f, s, r in settings:
        for (partners, peers), learning in MEASURED_LEARNING.items():
            if s is not None and peers != 2:
                continue  # the frontier measured s for P = 2 only
            scaling = s if s is not None else float(peers)
            hardware = Hardware(peers=peers, f=f, s=scaling, r=r)
            phi, beta = learning["phi"], learning["beta"]
            point = wall_ratios(hardware, phi[0], beta[0])
            low, high = wall_ratio_range(hardware, phi[1:], beta[1:])["vs_best"]
            share = break_even_share(peers, phi[1:], beta[1:], s=scaling, r=r)
            print(
                f"| {name} | {partners}-{peers} | {peers} | {f:.2f} | {scaling:.2f} | {r:.2f} | {point['step']:.2f} | "
                f"{point['vs_full']:.2f} | {point['vs_own']:.2f} | {point['vs_best']:.2f} [{low:.2f}, {high:.2f}] | "
                f"{verdict(low, high)} | {'never' if share is None else f'{share:.3f}'} |"
            )


if __name__ == "__main__":
    main()
