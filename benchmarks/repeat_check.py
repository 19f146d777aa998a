"""Are lock-step runs hardware-free? Compare two records files of the same `peer_gain.py` slots run under different
load: every evaluated snapshot (accuracy and reward, per split) and every run's steps and peer rows.

    python benchmarks/repeat_check.py A.jsonl B.jsonl
"""

import json
import sys


def keyed(path: str) -> tuple[dict, dict]:
    with open(path) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    snaps = {
        (r["seed"], r["slot"], r["peer"], r.get("split"), r.get("step", 0)): (r["accuracy"], r.get("reward"))
        for r in records
        if r["kind"] in ("checkpoint", "warm") and "peer" in r
    }
    runs = {
        (r["seed"], r["slot"], r["peer"]): (r["steps"], r.get("peer_rows_in_loss"), round(r["train_clock"], 1))
        for r in records
        if r["kind"] == "run"
    }
    return snaps, runs


def main(first: str, second: str) -> None:
    snaps_a, runs_a = keyed(first)
    snaps_b, runs_b = keyed(second)
    same = [k for k in snaps_a if snaps_b.get(k) == snaps_a[k]]
    print(f"evaluated snapshots: {len(snaps_a)} and {len(snaps_b)}; identical accuracy and reward: {len(same)}")
    for key in sorted(set(snaps_a) | set(snaps_b), key=str):
        if snaps_a.get(key) != snaps_b.get(key):
            print(f"  differs: {key}: {snaps_a.get(key)} vs {snaps_b.get(key)}")
    print("runs (steps, peer rows trained on, training clock s):")
    for key in sorted(runs_a):
        print(f"  {key}: {runs_a[key]} vs {runs_b.get(key)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
