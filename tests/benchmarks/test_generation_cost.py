"""The emulated generation engine of part B (`benchmarks/generation_cost.py`): a call is held to
`tokens x (a + b x rows)` seconds, checked against hand-computed values with a fake clock."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from generation_cost import GenerationCost, HeldCalls, held_generate


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def fake_generate(clock, real_seconds, completions):
    def generate(prompts):
        clock.now += real_seconds
        return ("prompt_ids", completions, "mask")

    return generate


def test_seconds_follow_the_formula():
    cost = GenerationCost(a=0.01, b=0.002)
    # 20 decode steps x (0.01 + 0.002 x 64) = 20 x 0.138 = 2.76
    assert cost.seconds(20, 64) == pytest.approx(2.76)
    assert cost.seconds(20, 32) == pytest.approx(20 * (0.01 + 0.064))
    assert cost.growth(64) == pytest.approx(0.138 / 0.074)


@pytest.mark.parametrize("growth", [1.9, 1.3, 2.0])
def test_calibration_gives_the_asked_hold_and_growth(growth):
    cost = GenerationCost.calibrated(full_seconds=0.4, tokens=20, rows=64, growth=growth)
    assert cost.seconds(20, 64) == pytest.approx(0.4)
    assert cost.seconds(20, 64) / cost.seconds(20, 32) == pytest.approx(growth)
    # by hand for s = 1.9: a = b x 32 x 0.1 / 0.9 = 3.5556 b; 20 (3.5556 b + 64 b) = 0.4 -> b = 0.4 / 1351.1
    if growth == 1.9:
        assert cost.b == pytest.approx(0.4 / (20 * (32 * 0.1 / 0.9 + 64)))
        assert cost.a == pytest.approx(cost.b * 32 * 0.1 / 0.9)
    if growth == 2.0:
        assert cost.a == 0.0  # an engine purely at throughput


@pytest.mark.parametrize("bad", [{"growth": 1.0}, {"growth": 2.5}, {"tokens": 0}, {"full_seconds": -1.0}])
def test_calibration_refuses_values_that_have_no_cost(bad):
    arguments = {"full_seconds": 0.4, "tokens": 20, "rows": 64, "growth": 1.9, **bad}
    with pytest.raises(ValueError):
        GenerationCost.calibrated(**arguments)


def test_a_cost_of_nothing_is_refused():
    with pytest.raises(ValueError, match="not both 0"):
        GenerationCost(a=0.0, b=0.0)


def test_a_call_is_held_to_the_formula_from_its_tokens_and_rows():
    clock, record = FakeClock(), HeldCalls()
    cost = GenerationCost(a=0.01, b=0.002)
    completions = [[1] * 7, [1] * 20, [1] * 12] + [[1] * 3] * 29  # 32 rows, longest 20 decode steps
    held = held_generate(fake_generate(clock, 0.25, completions), cost, record, clock=clock, sleep=clock.sleep)
    began = clock.now
    output = held(["p"] * 32)
    assert output[1] is completions  # the real output is returned unchanged
    expected = 20 * (0.01 + 0.002 * 32)  # 1.48 s
    assert clock.now - began == pytest.approx(expected)
    assert clock.slept == [pytest.approx(expected - 0.25)]
    assert record.calls == [(20, 32, pytest.approx(0.25), pytest.approx(expected))]
    assert record.overruns == 0


def test_a_call_slower_than_its_hold_is_not_held_and_is_counted():
    clock, record = FakeClock(), HeldCalls()
    cost = GenerationCost(a=0.0, b=0.001)
    held = held_generate(fake_generate(clock, 5.0, [[1] * 10] * 4), cost, record, clock=clock, sleep=clock.sleep)
    held(["p"] * 4)  # hold 10 x 0.004 = 0.04 s, real 5 s
    assert clock.slept == []
    assert record.overruns == 1
    assert record.summary() == {"calls": 1, "overruns": 1, "real_seconds": 5.0, "held_seconds": 5.0,
                                "median_tokens": 10}  # fmt: skip
