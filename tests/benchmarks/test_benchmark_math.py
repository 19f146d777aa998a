"""The benchmarks' analysis helpers (benchmarks/ is not a package: loaded by path), against hand-computed values."""

import itertools
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import smollm_split
import time_to_target


def test_steps_ratio_follows_the_batch_scaling_and_the_value_of_peer_rows():
    # Peer rows worth own rows: the swarm trains on as many rows as A_N, so it needs as many steps.
    assert smollm_split.steps_ratio(1.0, 2.66, 0.5) == pytest.approx(1.0)
    # Worthless peer rows and steps halving with doubled rows (beta = 2): twice A_N's steps, A_N/2's own.
    assert smollm_split.steps_ratio(0.0, 2.0, 0.5) == pytest.approx(2.0)
    assert smollm_split.steps_ratio(0.0, 2.0, 1.0) == pytest.approx(1.0)
    # phi = 0.5 against A_N/2 with beta = 4: 1.5 x the rows, steps x 1.5^-2 = 0.444.
    assert smollm_split.steps_ratio(0.5, 4.0, 1.0) == pytest.approx(1 / 2.25)


def test_predicted_wall_ratio_is_the_step_ratio_times_the_steps_ratio_with_corner_intervals():
    ratios = {"alone-rows": {"ratio": 0.8, "low": 0.7, "high": 0.9}, "alone": {"ratio": 1.5, "low": 1.4, "high": 1.6}}
    got = {b: (p, h) for b, p, h in smollm_split.predicted_wall_ratios(ratios, (0.0, 0.0, 1.0), 2.0)}
    (point, low), high = got["alone-rows"]
    assert point == pytest.approx(0.8 * 2.0) and low == pytest.approx(0.7 * 1.0) and high == pytest.approx(0.9 * 2.0)
    (point, low), high = got["alone"]
    assert point == pytest.approx(1.5) and low == pytest.approx(1.4 * 0.5) and high == pytest.approx(1.6)


def test_time_to_target_needs_two_consecutive_checkpoints_and_censors_at_the_budget():
    points = [
        {"step": 0, "clock": 0.0, "own_tokens": 0, "accuracy": 0.5},  # the warm model never counts
        {"step": 10, "clock": 2.0, "own_tokens": 100, "accuracy": 0.4},
        {"step": 20, "clock": 4.0, "own_tokens": 200, "accuracy": 0.3},
        {"step": 30, "clock": 6.0, "own_tokens": 300, "accuracy": 0.4},
        {"step": 40, "clock": 8.0, "own_tokens": 400, "accuracy": 0.45},
    ]
    hit = time_to_target.time_to_target(points, 0.4, 30.0)
    assert hit == {"seconds": 6.0, "steps": 30, "tokens": 300, "censored": False}
    miss = time_to_target.time_to_target(points, 0.5, 30.0)
    assert miss == {"seconds": 30.0, "steps": 40, "tokens": 400, "censored": True}
    assert time_to_target.accuracy_at_step(points, 25) == pytest.approx(0.35)


def test_phi_is_the_ratio_of_mean_gains():
    # (swarm, A_N, A_N/2) gains: mean 0.15, 0.2, 0.1 -> (0.15 - 0.1) / (0.2 - 0.1) = 0.5.
    assert time_to_target.phi_of([(0.1, 0.2, 0.0, 10), (0.2, 0.2, 0.2, 10)]) == pytest.approx(0.5)
    assert time_to_target.phi_of([(0.1, 0.1, 0.1, 10)]) is None
    assert time_to_target.geo([1.0, 4.0]) == pytest.approx(2.0)


def test_peer_gain_measures_by_hand():
    import peer_gain

    points = [{"step": 0, "accuracy": 0.3}] + [
        {"step": 4 * i, "accuracy": a} for i, a in enumerate((0.3, 0.4, 0.5, 0.6), 1)
    ]
    assert peer_gain.mean_gain(points) == pytest.approx((0.3 + 0.4 + 0.5 + 0.6) / 4 - 0.3)
    assert peer_gain.end_gain(points) == pytest.approx((0.4 + 0.5 + 0.6) / 3 - 0.3)
    # Two consecutive snapshots at or above the target; the warm model (step 0) never counts.
    assert peer_gain.steps_to_target(points, 0.45, 80) == (12, False)
    assert peer_gain.steps_to_target(points, 0.6, 80) == (80, True)  # one snapshot at it is not enough
    assert peer_gain.steps_to_target([{"step": 0, "accuracy": 0.9}, {"step": 4, "accuracy": 0.1}], 0.5, 80) == (
        80,
        True,
    )


def test_peer_gain_phi_is_the_swarm_between_the_two_alone_arms():
    import peer_gain

    assert peer_gain.phi_value(0.10, 0.10, 0.02) == pytest.approx(1.0)  # as much as A_P
    assert peer_gain.phi_value(0.02, 0.10, 0.02) == pytest.approx(0.0)  # as little as A_1
    assert peer_gain.phi_value(0.06, 0.10, 0.02) == pytest.approx(0.5)
    assert peer_gain.phi_value(0.06, 0.05, 0.05) is None  # A_P and A_1 gain the same: undefined
    # The ratio of means over seeds, not the mean of per-seed ratios.
    triples = [(0.06, 0.10, 0.02), (0.05, 0.05, 0.0)]
    assert peer_gain.ratio_of_means_phi(triples) == pytest.approx((0.055 - 0.01) / (0.075 - 0.01))
    low, high = peer_gain.bootstrap(triples, peer_gain.ratio_of_means_phi, draws=200)
    assert 0.5 - 1e-9 <= low <= high <= 1.0 + 1e-9  # the per-seed values are 0.5 and 1.0


def test_peer_gain_reads_a_steps_ratio_only_after_holm():
    import peer_gain

    # An interval that excludes 1 is not a finding when the Holm-adjusted p-value is 0.05 or more.
    assert peer_gain.steps_reading(1.44, 0.141) == "not distinguishable"
    assert peer_gain.steps_reading(2.24, 0.001) == "above 1"
    assert peer_gain.steps_reading(0.57, 0.0193) == "below 1"
    assert peer_gain.steps_reading(0.9, 0.05) == "not distinguishable"
    # Width ~ 1/sqrt(seeds): 16 seeds at 0.6 wide need 64 for 0.3; a narrow one needs no more.
    assert peer_gain.seeds_for_width(16, 0.6) == 64
    assert peer_gain.seeds_for_width(16, 0.3) == 16


def test_peer_gain_rate_rule_and_target_offset_from_records():
    import peer_gain

    def run(seed, rate, slot, peer):
        return {"kind": "run", "seed": seed, "rate_key": f"{rate:g}", "slot": slot, "peer": peer,
                "model": "carry-big"}  # fmt: skip

    def snap(seed, rate, slot, peer, step, accuracy):
        return {"kind": "checkpoint", "seed": seed, "rate_key": f"{rate:g}", "slot": slot, "peer": peer,
                "split": "dev", "step": step, "accuracy": accuracy}  # fmt: skip

    records = []
    for seed in (1, 2):
        records.append({"kind": "warm", "seed": seed, "model": "carry-big", "split": "dev", "accuracy": 0.3})
        for rate, accs in ((6e-5, (0.4, 0.5, 0.6)), (2e-4, (0.5, 0.4, 0.3))):
            records.append(run(seed, rate, "alone", "A_1"))
            records += [snap(seed, rate, "alone", "A_1", 4 * i, a) for i, a in enumerate(accs, 1)]
    choice = peer_gain.rate_choice(records)
    # Mean gains: 6e-5 -> 0.5 - 0.3 = 0.2; 2e-4 -> 0.4 - 0.3 = 0.1; so A_1 takes 6e-5.
    assert choice["A_1"]["rate"] == 6e-5
    assert choice["A_1"]["table"][6e-5]["gain"] == pytest.approx(0.2)
    assert "A_2" not in choice  # no records, no rate
    # End gain at 6e-5 is 0.5 - 0.3 = 0.2 in both seeds: the offset is half of it.
    assert peer_gain.target_offset(choice) == pytest.approx(0.1)


def test_peer_gain_grid_analysis_on_made_up_curves(capsys, monkeypatch):
    import peer_gain

    monkeypatch.setattr(peer_gain, "BOOTSTRAP", 200)
    slopes = {"A_1": 0.1, "A_2": 0.2, "A_4": 0.3, "copy-2": 0.15, "hetero-2": 0.12, "copy-4": 0.2, "hetero-4": 0.1}
    records = []
    for seed in (1, 2, 3):
        records.append({"kind": "warm", "seed": seed, "model": "big", "split": "test", "accuracy": 0.3})
        records.append({"kind": "warm", "seed": seed, "model": "big", "split": "ood", "accuracy": 0.0, "reward": 0.1})
        for arm, (slot, peers, p) in peer_gain.ARMS.items():
            for peer in peers:
                run_id = f"{seed}-{slot}"
                records.append({"kind": "run", "run_id": run_id, "seed": seed, "rate_key": "chosen", "slot": slot,
                                "peer": peer, "model": "big", "steps": 80, "cpu_seconds": 36.0,
                                "peer_rows_in_loss": 80 * 32 * (p - 1) * 0.5,
                                # only copy-4's records keep the filter's count: the others print "not recorded"
                                **({"rows_filtered": 80 * 3} if arm == "copy-4" else {})})  # fmt: skip
                for index in range(20):
                    step = 4 * (index + 1)
                    records.append({"kind": "checkpoint", "run_id": run_id, "seed": seed, "rate_key": "chosen",
                                    "slot": slot, "peer": peer, "split": "test", "index": index, "step": step,
                                    "accuracy": 0.3 + slopes[arm] * step / 80})  # fmt: skip
                    records.append({"kind": "checkpoint", "run_id": run_id, "seed": seed, "rate_key": "chosen",
                                    "slot": slot, "peer": peer, "split": "ood", "index": index, "step": step,
                                    "accuracy": 0.0, "reward": 0.1 + seed * slopes[arm] * step / 800})  # fmt: skip
    rates = dict.fromkeys(peer_gain.ARMS, 6e-5)
    result = peer_gain.summarise_grid(records, 0.051, rates)
    out = capsys.readouterr().out
    assert result["complete_seeds"] == [1, 2, 3]
    # Mean gain = slope x mean(step / 80) = slope x 0.525: phi is a ratio of slopes.
    assert result["phi"]["copy-2"]["phi"] == pytest.approx((0.15 - 0.1) / (0.2 - 0.1))
    assert result["phi"]["hetero-2"]["phi"] == pytest.approx((0.12 - 0.1) / (0.2 - 0.1))
    assert result["phi"]["copy-4"]["phi"] == pytest.approx((0.2 - 0.1) / (0.3 - 0.1))
    assert result["phi"]["hetero-4"]["phi"] == pytest.approx(0.0, abs=1e-9)
    # Half the rows of the design reached the loss: phi per received row is twice phi.
    assert result["phi"]["copy-2"]["per_received_row"] == pytest.approx(2 * 0.5)
    # The rows the filter zeroed, a step, where every judged record kept them; "not recorded" where none did.
    assert result["phi"]["copy-4"]["filtered_a_step"] == pytest.approx(3.0)
    assert result["phi"]["copy-2"]["filtered_a_step"] is None
    assert "| 48.0 of 96 | 3.00 |" in out and "| 16.0 of 32 | not recorded |" in out
    # Target 0.351: A_1 first at or above it at step 44 (0.355), A_2 at 24 (0.36), A_4 at 16 (0.36).
    assert result["steps"]["A_1"]["mean"] == 44 and result["steps"]["A_2"]["mean"] == 24
    assert result["ratios"]["beta_2: A_1 / A_2"]["ratio"] == pytest.approx(44 / 24)
    assert result["ratios"]["beta_4: A_1 / A_4"]["ratio"] == pytest.approx(44 / 16)
    assert "Prediction (not measured)" in out and "training CPU time in these records: 0.33 h" in out  # 33 x 36 s
    # Out of distribution: reward gains seed x slope x 0.0525; copy-2 - A_1 = seed x 0.05 x 0.0525, mean over 1-3.
    peer_gain.summarise_ood(records, "reward")
    out = capsys.readouterr().out
    assert f"| copy-2 - A_1 | {2 * 0.05 * 0.0525:+.4f} |" in out


def test_peer_gain_wall_pilot_rule_by_hand():
    import peer_gain_wall

    def points(seed, accuracies):
        return [{"kind": "checkpoint", "seed": seed, "peer": "A_1", "step": 5 * (i + 1), "clock": float(i + 1),
                 "accuracy": a} for i, a in enumerate(accuracies)]  # fmt: skip

    records = [{"kind": "warm", "accuracy": 0.2}]
    records += points(1, [0.22, 0.26, 0.3, 0.34, 0.38, 0.4, 0.4, 0.4])  # end gain 0.2
    records += points(2, [0.21, 0.23, 0.25, 0.27, 0.29, 0.3, 0.3, 0.3])  # end gain 0.1
    rule = peer_gain_wall.pilot_rule(records)
    # Offset 0.5 x median(0.2, 0.1) = 0.075: target 0.275; seed 1 reaches it at step 15, seed 2 at step 25.
    assert rule["offset"] == pytest.approx(0.075)
    assert rule["budget"] == 35  # 25 / 0.8 = 31.25, up to a multiple of 5
    assert rule["lower_rate"] == []
    # Amendment 3: the offset must clear 3 sd of A_1's snapshot-to-snapshot changes (median over the seeds).
    changes = {
        1: [0.2, 0.22, 0.26, 0.3, 0.34, 0.38, 0.4, 0.4, 0.4],
        2: [0.2, 0.21, 0.23, 0.25, 0.27, 0.29, 0.3, 0.3, 0.3],
    }
    sds = [statistics.pstdev(b - a for a, b in itertools.pairwise(c)) for c in changes.values()]
    assert rule["floor"] == pytest.approx(3 * statistics.median(sds))
    wobbly = [{"kind": "warm", "accuracy": 0.2}]
    wobbly += points(1, [0.25, 0.15, 0.25, 0.15, 0.25, 0.15, 0.25, 0.25])  # a small end gain in +-0.1 swings
    wobbly += points(2, [0.25, 0.15, 0.25, 0.15, 0.25, 0.15, 0.25, 0.25])
    rule = peer_gain_wall.pilot_rule(wobbly)
    assert rule["offset"] == pytest.approx(0.5 * ((0.15 + 0.25 + 0.25) / 3 - 0.2))
    assert rule["floor"] > 0.2 and rule["budget"] is None
    records = [r for r in records if r.get("seed") != 2] + points(2, [0.2] * 8)  # seed 2 never learns
    assert peer_gain_wall.pilot_rule(records)["budget"] is None


def test_peer_gain_wall_rate_moves_down_only_for_an_arm_that_lost_in_every_pilot_seed():
    import peer_gain_wall

    def curve(start, end):
        return [
            {"step": 0, "accuracy": start},
            {"step": 5, "accuracy": (start + end) / 2},
            {"step": 10, "accuracy": end},
        ]

    curves = {(1, "A_2"): curve(0.2, 0.3), (2, "A_2"): curve(0.2, 0.1),  # lost in one seed only: stays
              (1, "A_1"): curve(0.2, 0.1), (2, "A_1"): curve(0.2, 0.15),  # lost in both: one step down
              (1, "a"): curve(0.2, 0.1), (1, "b"): curve(0.2, 0.35),  # copies' mean 0.225: not lost
              (2, "a"): curve(0.2, 0.1), (2, "b"): curve(0.2, 0.1)}  # fmt: skip
    assert peer_gain_wall.arms_that_lost(curves, [1, 2]) == ["A_1"]
    rates = {"A_2": 6e-5, "A_1": 6e-5, "copy-2": 2e-5}
    assert peer_gain_wall.graded_rates(rates, ["A_1", "copy-2"]) == {"A_2": 6e-5, "A_1": 2e-5, "copy-2": 2e-5}


def test_peer_gain_wall_measured_ratio_decomposes_into_steps_and_seconds_a_step(capsys, monkeypatch):
    import peer_gain_wall

    monkeypatch.setattr(peer_gain_wall, "part_a_learning", lambda: None)  # no prediction: the measurement alone

    def points(seed, peer, seconds_a_step, reach_step):
        # accuracy 0.2 until `reach_step`, 0.5 from there; snapshots every 5 steps up to 40
        return [{"kind": "checkpoint", "seed": seed, "peer": peer, "step": step, "clock": step * seconds_a_step,
                 "accuracy": 0.5 if step >= reach_step else 0.2} for step in range(5, 45, 5)]  # fmt: skip

    records = [{"kind": "warm", "accuracy": 0.2}]
    for seed, jitter in ((1, 1.0), (2, 1.1), (3, 0.9)):
        records += points(seed, "A_2", 2.0 * jitter, 20)  # 20 steps of 2 s: 40 s
        records += points(seed, "A_1", 1.0 * jitter, 35)  # 35 steps of 1 s: 35 s, the better alone run
        records += points(seed, "a", 1.5 * jitter, 20) + points(seed, "b", 1.5 * jitter, 20)  # 20 steps of 1.5 s
    peer_gain_wall.summarise(records, 0.1)
    out = capsys.readouterr().out
    assert "A_1: restricted mean time to target" in out
    assert "A_1 is the better alone run" in out
    # Per seed: wall 30 / 35, steps 20 / 35, seconds a step 1.5 / 1.0, whatever the seed's jitter.
    assert f"measured wall ratio copy-2 / A_1: {30 / 35:.2f} [{30 / 35:.2f}, {30 / 35:.2f}]" in out
    assert f"measured   steps ratio copy-2 / A_1: {20 / 35:.2f}" in out
    assert "measured   seconds-a-step ratio copy-2 / A_1: 1.50" in out
    assert "joining: pays" in out
    assert peer_gain_wall.prediction_holds((0.8, 0.9), (0.85, 1.2))
    assert not peer_gain_wall.prediction_holds((0.8, 0.9), (0.95, 1.2))
