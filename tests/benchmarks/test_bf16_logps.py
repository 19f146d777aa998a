"""benchmarks/bf16_logps.py in its dry mode (a tiny random model, 8 rows of 8 tokens, seconds): the report and its
JSON are written, the reference pairing is exactly the reference, bf16 moves every model's log-probs, and the counts
of flipped filter decisions agree with the per-row statistics the JSON records."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bf16_logps.py"
LEARNERS = ("self", "near", "far", "pruned")
PAIRINGS = ("fp32/fp32", "fp32/bf16+fp32head", "fp32/bf16", "bf16/bf16", "bf16+fp32head/bf16+fp32head")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--out", str(out / "report.txt"), "--json", str(out / "report.json")],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, (out / "report.txt").read_text(), json.loads((out / "report.json").read_text())


def test_the_report_starts_with_the_command_and_has_every_section(dry_run):
    stdout, text, _ = dry_run
    first = text.splitlines()[0]
    assert first.startswith("$ OMP_NUM_THREADS=1 python ") and "bf16_logps.py --dry" in first
    assert text == stdout  # the file is what was printed
    for section in ("bf16 emulation check", "(1)", "(2)", "(3)", "(4)", "(5)"):
        assert section in text
    assert "tiny random-init Llama" in text


def test_the_reference_pairing_changes_nothing_and_the_generator_is_on_policy(dry_run):
    _, _, report = dry_run
    assert report["rows"] == 8 and 0 < report["tokens"] <= 64
    terms = {(r["learner"], r["pairing"]): r for r in report["terms"]}
    assert set(terms) == {(learner, pairing) for learner in LEARNERS for pairing in PAIRINGS}
    for learner in LEARNERS:
        r = terms[(learner, "fp32/fp32")]
        assert r["abs_delta_log_ratio"]["max"] == 0 and r["abs_delta_w_max"] == 0 and r["cap_flips"] == 0
        assert r["filter_flips_g10"] == r["filter_flips_g50"] == 0
    own = terms[("self", "fp32/fp32")]
    assert own["w_mean"] == pytest.approx(1.0) and own["D_ref"]["max"] == 0  # ℓθ = ℓgen: w = 1, D = 0
    # Learner and generator computed the same way: identical log-probs, whatever the precision.
    for pairing in ("bf16/bf16", "bf16+fp32head/bf16+fp32head"):
        assert terms[("self", pairing)]["abs_delta_log_ratio"]["max"] == 0
    # An fp32 learner against bf16-recorded log-probs of itself: w moves off 1 and D off 0.
    noisy = terms[("self", "fp32/bf16")]
    assert noisy["abs_delta_w_mean"] > 0 and noisy["abs_delta_D_max"] > 0


def test_bf16_moves_every_models_log_probs(dry_run):
    _, _, report = dry_run
    rows = {(r["model"], r["precision"]): r for r in report["logp"]}
    assert set(rows) == {(m, p) for m in LEARNERS for p in ("bf16+fp32head", "bf16")}
    for r in rows.values():
        assert 0 < r["p50"] <= r["p99"] <= r["max"] and 0 < r["mean"] <= r["max"]
        assert abs(r["signed_mean"]) <= r["mean"]
    assert report["emulation"]["emulated_vs_fp32"]["max"] > 0


def test_the_flip_counts_agree_with_the_per_row_statistics(dry_run):
    _, text, report = dry_run
    listed = 0
    for r in report["terms"]:
        assert len(r["D_per_row"]) == r["rows"]
        for g in (10, 50):
            flips = sum((before > g) != (after > g) for before, after in r["D_per_row"])
            assert r[f"filter_flips_g{g}"] == flips
            assert r[f"filtered_g{g}"] == sum(after > g for _, after in r["D_per_row"])
            listed += flips
        assert 0 <= r["cap_flips"] <= r["tokens"]
    section = text.split("(5)")[1].splitlines()[1:]
    flip_lines = [line for line in section if " -> " in line]
    assert len(flip_lines) == listed
