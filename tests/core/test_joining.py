"""`trl_ftis.joining`: what joining was worth to a swarm peer against its own controls, checked against values
computed by hand, and its refusal of malformed run summaries (another process's file)."""

from __future__ import annotations

import math

import pytest

from trl_ftis.joining import (
    ArmRun,
    Evaluation,
    analyse_peer,
    arm_record,
    arm_run,
    geometric_interval,
    hardware_factors,
    mean_gain,
    phi_value,
    reach,
    t_interval,
    target_offset,
)


def run(accuracies, *, every=5, seconds_a_step=1.0, step=1.0, generation=0.4, exchange=0.0, rows=32, items=None):
    """An ArmRun evaluated at step 0 and every `every` steps after it."""
    evaluations = tuple(
        Evaluation(k * every, a, k * every * seconds_a_step, None if items is None else items[k])
        for k, a in enumerate(accuracies)
    )
    steps = (len(accuracies) - 1) * every
    return ArmRun(steps, step, generation, exchange, rows, evaluations)


def test_gains_and_phi_by_hand():
    swarm, own, full = run([0.2, 0.3, 0.4]), run([0.2, 0.25, 0.3]), run([0.2, 0.3, 0.5])
    assert mean_gain(swarm, [5, 10]) == pytest.approx(0.15)  # (0.3 + 0.4) / 2 - 0.2
    assert mean_gain(own, [5, 10]) == pytest.approx(0.075)
    assert mean_gain(full, [5, 10]) == pytest.approx(0.2)
    assert phi_value(0.15, 0.2, 0.075) == pytest.approx(0.6)  # (0.15 - 0.075) / (0.2 - 0.075)
    assert phi_value(0.1, 0.05, 0.05) is None  # the controls gained the same: nothing to value rows against
    assert mean_gain(ArmRun(10, 1, 0, 0, 1, (Evaluation(5, 0.3),)), [5]) is None  # no step 0


def test_reaching_a_target_takes_two_evaluations_in_a_row():
    arm = run([0.2, 0.31, 0.25, 0.32, 0.33, 0.2], seconds_a_step=2.0, rows=32)
    # 0.31 at step 5 alone does not count; 0.32 at 15 and 0.33 at 20 do: the first of them.
    assert reach(arm, 0.3) == {"step": 15, "seconds": 30.0, "own_rows": 15 * 32}
    assert reach(arm, 0.5) is None


def test_target_is_half_the_better_controls_end_gain_median_over_seeds():
    seeds = [
        {"alone": run([0.2, 0.3, 0.3, 0.3]), "alone-rows": run([0.2, 0.4, 0.4, 0.4])},  # end gains 0.1, 0.2
        {"alone": run([0.1, 0.1, 0.2, 0.2]), "alone-rows": run([0.1, 0.1, 0.1, 0.1])},  # 0.0667, 0.0
        {"alone": run([0.3, 0.6, 0.6, 0.6]), "alone-rows": run([0.3, 0.3, 0.3, 0.3])},  # 0.3, 0.0
    ]
    assert target_offset(seeds) == pytest.approx(0.5 * 0.2)  # median of (0.2, 0.0667, 0.3)
    flat = [{"alone": run([0.2, 0.2, 0.1]), "alone-rows": run([0.2, 0.2, 0.2])}]
    assert target_offset(flat) is None  # no control gained: no target


def test_hardware_factors_by_hand():
    swarm = ArmRun(10, step_seconds=1.0, generation_seconds=0.25, exchange_seconds=0.1, own_rows=32)
    own = ArmRun(10, step_seconds=0.5, generation_seconds=0.2, exchange_seconds=0.0, own_rows=32)
    full = ArmRun(10, step_seconds=0.8, generation_seconds=0.3, exchange_seconds=0.0, own_rows=64)
    got = hardware_factors(swarm, own, full)
    assert got["f"] == pytest.approx(0.3 / 0.8)
    assert got["s"] == pytest.approx(0.3 / 0.2)  # A_N's generation over A_N/P's: one definition
    assert got["q"] == pytest.approx(0.5 / 0.8)
    assert got["r"] == pytest.approx(0.1)
    assert got["g"] == pytest.approx(0.25 / 0.2)
    assert got["t"] == pytest.approx((1.0 - 0.25 - 0.1) / (0.8 - 0.3))
    assert got["step_ratio"] == pytest.approx(1.0 / 0.8)
    # The step model with g and t is the measured step ratio, split into its parts.
    f, s, r, g, t = (got[k] for k in "fsrgt")
    assert ((1 - f) * t + f * g / s) / (1 - r) == pytest.approx(got["step_ratio"])
    alone_only = hardware_factors(swarm, own, None)
    assert alone_only["f"] is None and alone_only["s"] is None and alone_only["g"] == pytest.approx(1.25)


def test_intervals_by_hand():
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert (
        mean == 2.0 and low == pytest.approx(2.0 - 4.303 / math.sqrt(3)) and high == pytest.approx(2 + 4.303 / 3**0.5)
    )
    assert t_interval([1.0]) is None
    value, low, high = geometric_interval([0.5, 2.0])
    assert value == pytest.approx(1.0) and low < 1.0 < high
    assert geometric_interval([2.0]) is None


def seed_runs(swarm, own, full, **kw):
    return {"swarm": run(swarm, **kw), "alone": run(own, **kw), "alone-rows": run(full, **kw)}


def test_over_seeds_phi_is_the_ratio_of_mean_gains_and_verdicts_are_over_seeds():
    seeds = [
        seed_runs([0.2, 0.3, 0.4, 0.4], [0.2, 0.25, 0.3, 0.3], [0.2, 0.3, 0.5, 0.5]),
        seed_runs([0.2, 0.35, 0.4, 0.45], [0.2, 0.2, 0.25, 0.3], [0.2, 0.35, 0.45, 0.5]),
        seed_runs([0.1, 0.2, 0.3, 0.3], [0.1, 0.15, 0.2, 0.2], [0.1, 0.2, 0.3, 0.35]),
    ]
    got = analyse_peer(seeds)
    gains = [[mean_gain(s[a], [5, 10, 15]) for a in ("swarm", "alone-rows", "alone")] for s in seeds]
    means = [sum(g[i] for g in gains) / 3 for i in range(3)]
    assert got["interval_kind"] == "seeds" and got["seeds"] == 3
    assert got["phi"]["value"] == pytest.approx((means[0] - means[2]) / (means[1] - means[2]))
    assert got["phi"]["low"] <= got["phi"]["value"] <= got["phi"]["high"]
    differences = [g[0] - g[2] for g in gains]
    assert got["gain_vs"]["alone"]["mean"] == pytest.approx(sum(differences) / 3)
    assert got["gain_vs"]["alone"]["kind"] == "seeds" and got["gain_vs"]["alone"]["positive"] == 3
    # Target: half the better control's end gain (median over seeds) above each seed's accuracy before training.
    ends = [(0.3 + 0.5 + 0.5) / 3 - 0.2, (0.35 + 0.45 + 0.5) / 3 - 0.2, (0.2 + 0.3 + 0.35) / 3 - 0.1]
    offset = 0.5 * sorted(ends)[1]
    assert got["target"]["offset"] == pytest.approx(offset)
    assert got["target"]["per_seed"] == pytest.approx([0.2 + offset, 0.2 + offset, 0.1 + offset])
    for arm in ("swarm", "alone", "alone-rows"):
        for seed, reached in zip(seeds, got["reached"][arm], strict=True):
            assert reached == reach(seed[arm], seed["swarm"].evaluations[0].accuracy + offset)
    assert got["hardware"]["mean"]["s"] == pytest.approx(1.0)  # same generation seconds in every arm here


def test_one_seed_interval_is_a_bootstrap_over_problems_and_says_so():
    n = 40
    before = "0" * n
    swarm_items = [before, "1" * 12 + "0" * 28, "1" * 16 + "0" * 24]
    own_items = [before, "1" * 4 + "0" * 36, "1" * 8 + "0" * 32]
    full_items = [before, "1" * 14 + "0" * 26, "1" * 20 + "0" * 20]

    def arm(items):
        return run([it.count("1") / n for it in items], items=items)

    got = analyse_peer([{"swarm": arm(swarm_items), "alone": arm(own_items), "alone-rows": arm(full_items)}])
    assert got["interval_kind"] == "problems"
    # Gains: swarm (0.3 + 0.4) / 2 = 0.35, alone 0.15, alone-rows 0.425: phi = 0.2 / 0.275.
    assert got["phi"]["value"] == pytest.approx(0.2 / 0.275)
    assert got["phi"]["low"] < got["phi"]["value"] < got["phi"]["high"]
    vs_alone = got["gain_vs"]["alone"]
    assert vs_alone["mean"] == pytest.approx(0.2) and vs_alone["kind"] == "problems"
    assert vs_alone["low"] < 0.2 < vs_alone["high"]


def test_what_cannot_be_measured_is_said():
    lonely = analyse_peer([{"swarm": run([0.2, 0.3, 0.4]), "alone": run([0.2, 0.2, 0.3]), "alone-rows": None}])
    assert lonely["phi"] is None
    assert any("alone-rows control" in item for item in lonely["missing"])
    unevaluated = analyse_peer([{"swarm": run([0.2]), "alone": run([0.2]), "alone-rows": run([0.2])}])
    assert any("evaluations during training" in item for item in unevaluated["missing"])
    assert analyse_peer([]) == {"seeds": 0, "missing": ["no swarm run"]}


SUMMARY = {
    "steps": 10,
    "time_seconds": {"step": 5.0, "generation": 2.0, "exchange": 0.5},
    "own_generation": {"rows": 320},
    "accuracy_evaluations": [
        {"step": 0, "accuracy": 0.5, "seconds": 0.0, "items": "10"},
        {"step": 10, "accuracy": 1.0, "seconds": 5.0, "items": "11"},
    ],
}


def test_a_run_summary_is_read_and_kept_compact():
    arm = arm_run(SUMMARY)
    assert (arm.steps, arm.step_seconds, arm.generation_seconds, arm.exchange_seconds, arm.own_rows) == (
        10, 0.5, 0.2, 0.05, 32.0)  # fmt: skip
    assert arm.evaluations[1] == Evaluation(10, 1.0, 5.0, "11")
    assert arm_run(arm_record(SUMMARY)) == arm  # the launcher's compact form reads back the same


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": True}, "steps"),
        ({"steps": 0}, "steps"),
        ({"time_seconds": None}, "time_seconds"),
        ({"time_seconds": {"step": float("nan"), "generation": 1, "exchange": 0}}, "time_seconds.step"),
        ({"own_generation": {"rows": -1}}, "own_generation.rows"),
        ({"accuracy_evaluations": {"step": 0}}, "not a list"),
        ({"accuracy_evaluations": [{"step": 0, "accuracy": 0.5}] * 2001}, "not a list"),
        ({"accuracy_evaluations": [{"step": -1, "accuracy": 0.5}]}, "step"),
        ({"accuracy_evaluations": [{"step": 0, "accuracy": 1.5}]}, "accuracy"),
        ({"accuracy_evaluations": [{"step": 0, "accuracy": 0.5, "seconds": -1}]}, "seconds"),
        ({"accuracy_evaluations": [{"step": 0, "accuracy": 0.5, "items": "10x"}]}, "items"),
        ({"accuracy_evaluations": [{"step": 0, "accuracy": 0.5, "items": "1" * 100_001}]}, "items"),
        (
            {
                "accuracy_evaluations": [
                    {"step": 0, "accuracy": 0.5, "items": "10"},
                    {"step": 5, "accuracy": 0.5, "items": "101"},
                ]
            },  # fmt: skip
            "3 problems",
        ),
    ],
)
def test_malformed_run_summaries_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        arm_run({**SUMMARY, **change})
