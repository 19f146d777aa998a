"""Where a step of the time-to-target runs goes: each process's ledger split (`ftis_summary.json` `time_seconds`:
generation, scoring, exchange, training, other), as shares of the step, mean over seeds.

    python benchmarks/step_split.py benchmarks/results/time_to_target-part3.jsonl \
        | tee benchmarks/results/time_to_target-part3-split.txt
"""

import json
import statistics
import sys


def main(path: str) -> None:
    with open(path) as handle:
        rs = [json.loads(line) for line in handle if line.strip()]
    rows = {}
    for r in rs:
        if r["kind"] != "run":
            continue
        t = r.get("summary_time_seconds") or {}
        if not t.get("step"):
            continue
        rows.setdefault((r["slot"], r["peer"]), []).append(
            {k: v / t["step"] for k, v in t.items() if k != "step"} | {"ms": 1000 * t["step"] / r["steps"]}
        )
    print(
        "share of the step (ftis_summary.json time_seconds), mean over seeds; whole run, the last lock-step wait "
        "included"
    )
    print("| slot | peer | generation | scoring | exchange | training | other | ms/step |")
    print("|---|---|---|---|---|---|---|---|")
    for (slot, peer), v in rows.items():
        m = {k: statistics.fmean(x[k] for x in v) for k in v[0]}
        print(
            f"| {slot} | {peer} | {m['generation']:.3f} | {m['scoring']:.3f} | {m['exchange']:.3f} | "
            f"{m['training']:.3f} | {m['other']:.3f} | {m['ms']:.0f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
