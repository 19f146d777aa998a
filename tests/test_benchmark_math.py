"""The benchmarks' analysis helpers (benchmarks/ is not a package: loaded by path), against hand-computed values."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

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
