"""The demo's report: smoothing and rounding by hand, the console and results.json from one assessment, the figure's
panels and artists (matplotlib's Agg backend, synthetic results; no model runs here)."""

import json
import math

import pytest

from trl_ftis.demo.driver import report
from trl_ftis.demo.report import (
    SMOOTHING_WINDOW,
    assess,
    moving_average,
    round_significant,
    rounded,
    standard_error,
)


def _results() -> dict:
    """Two swarm peers, both baselines and one that did not finish, as `collect_results` returns them."""

    def peer(before, after, *, alone=False, rewards=(0.1, 0.3, 0.2, 0.6, 0.5)):
        steps = range(1, len(rewards) + 1)
        curves = {"accepted": [], "filtered": [], "is_weight_mean": [], "is_weight_max": []}
        if not alone:
            curves = {
                "accepted": [(s, 8.0) for s in steps],
                "filtered": [(s, float(s % 2)) for s in steps],
                "is_weight_mean": [(s, 1.0 + 0.01 * s) for s in steps],
                "is_weight_max": [(s, 1.5) for s in steps],
            }
        return {
            "steps": len(rewards),
            "rows_accepted": 0 if alone else 40,
            "rows_filtered": 0 if alone else 3,
            "accuracy_before": before,
            "accuracy_after": after,
            "accuracy_curve": [(0, before), (len(rewards), after)],
            "reward_curve": list(zip(steps, rewards)),
            "peer_row_curves": curves,
            "train_alone": alone,
            "own_rows_per_step": 8,
            "rows_per_step": 8.0 if alone else 16.0,
            "model": "/x/smollm2",
        }

    return {
        "full": peer(0.16, 0.4533333333),
        "lora": peer(0.16, 0.2),
        "alone": peer(0.16, 0.38, alone=True),
        "alone-rows": peer(0.16, 0.21, alone=True),
        "small": {"error": "no summary (the peer did not finish)"},
    }


def test_the_moving_average_matches_hand_computed_values():
    # window 3: 1, (1+2)/2, (1+2+3)/3, (2+3+7)/3, (3+7+2)/3
    assert moving_average([1.0, 2.0, 3.0, 7.0, 2.0], 3) == pytest.approx([1.0, 1.5, 2.0, 4.0, 4.0])
    assert moving_average([0.5, 0.25], 1) == [0.5, 0.25]
    assert moving_average([2.0, 4.0], 10) == [2.0, 3.0]
    assert moving_average([], 3) == []
    with pytest.raises(ValueError):
        moving_average([1.0], 0)


def test_numbers_are_rounded_to_four_significant_digits():
    assert round_significant(0.32500001788139343) == 0.325
    assert round_significant(1.0000300248463947) == 1.0
    assert round_significant(0.0012345678) == 0.001235
    assert round_significant(-0.123456) == -0.1235
    assert round_significant(1234.5678) == 1235.0
    assert round_significant(0.0) == 0.0
    assert round_significant(float("nan")) is None and round_significant(float("inf")) is None
    assert rounded({"a": [(1, 0.123456), True, "x"], "b": None}) == {"a": [[1, 0.1235], True, "x"], "b": None}


def test_the_console_and_results_json_come_from_one_assessment(tmp_path, capsys):
    results = _results()
    settings = {"eval_size": 30, "steps": 5}
    printed = report(tmp_path, settings, results)
    written = json.loads((tmp_path / "results.json").read_text())
    assessment = written["assessment"]
    assert assessment == assess(results, 30)
    assert "4 significant digits" in written["rounding"]
    # The verdict lines are printed as results.json holds them.
    lines = printed.splitlines()
    assert all(line in lines for line in assessment["console"])
    full = assessment["peers"]["full"]
    # full: 0.16 -> 0.4533, change +0.2933; SE sqrt((.16 * .84 + .4533 * .5467) / 30) = 0.1129, 2 SE 0.2257
    assert full["change"] == 0.2933 and full["standard_error"] == 0.1129 and full["two_standard_errors"] == 0.2257
    assert full["beyond_noise"] is True and full["verdict"] == "outside two standard errors"
    # alone: +0.22 against 2 SE 2 sqrt((.1344 + .38 * .62) / 30) = 0.2221, just inside
    assert assessment["peers"]["alone"]["two_standard_errors"] == 0.2221
    assert assessment["peers"]["alone"]["verdict"] == assessment["peers"]["lora"]["verdict"] == "inside the noise"
    assert assessment["moved"] == ["full"]
    assert "small" not in assessment["peers"]
    # The table row shows the same rounded numbers.
    row = next(line for line in lines if line.startswith("full "))
    assert f"{full['change']:+.3f}" in row and f"{full['two_standard_errors']:.3f}" in row
    assert f"{full['versus']['alone']['difference']:+.3f}" in row  # +0.073
    verdict = next(line for line in lines if line.startswith("full ") and "change" in line)
    assert verdict == assessment["console"][0]
    assert verdict.endswith(full["verdict"])
    # Rounded numbers throughout results.json, the curves included.
    assert written["peers"]["full"]["accuracy_after"] == 0.4533
    assert written["peers"]["full"]["peer_row_curves"]["is_weight_mean"][0] == [1, 1.01]
    assert (tmp_path / "curves.png").stat().st_size > 0 and "curves:" in printed


def test_the_figure_has_its_four_panels_and_their_artists():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trl_ftis.demo.report import curves_figure

    results = _results()
    figure = curves_figure(results, 30)
    try:
        reward, accuracy, rows, weight = figure.axes
        assert "reward" in reward.get_title() and f"last {SMOOTHING_WINDOW} steps" in reward.get_title()
        assert "2 standard errors" in accuracy.get_title()
        assert "accepted" in rows.get_title() and "filtered" in rows.get_title()
        assert "importance weight w" in weight.get_title()

        # Reward: per finished peer a faint raw line and a labelled moving average.
        finished = ["full", "lora", "alone", "alone-rows"]
        raw, smooth = reward.lines[0::2], reward.lines[1::2]
        assert len(reward.lines) == 2 * len(finished)
        assert [line.get_label() for line in smooth] == finished
        assert all(line.get_alpha() < 0.5 for line in raw) and all(line.get_alpha() is None for line in smooth)
        assert list(smooth[0].get_ydata()) == pytest.approx(moving_average([0.1, 0.3, 0.2, 0.6, 0.5]))

        # Accuracy: one error-bar container per finished peer, bars of 2 SE.
        assert len(accuracy.containers) == len(finished)
        _, _, (bars,) = accuracy.containers[0]
        segments = bars.get_segments()
        assert [seg[1][1] - seg[0][1] for seg in segments] == pytest.approx(
            [4 * standard_error(0.16, 30), 4 * standard_error(0.4533333333, 30)]
        )

        # Peer rows and w: the swarm peers only (the baselines train on no peer rows).
        assert [line.get_label() for line in rows.lines] == [
            "full accepted", "full filtered", "lora accepted", "lora filtered",
        ]  # fmt: skip
        assert list(rows.lines[1].get_ydata()) == [1.0, 0.0, 1.0, 0.0, 1.0]
        labels = [line.get_label() for line in weight.lines]
        assert labels[:4] == ["full mean w", "full max w", "lora mean w", "lora max w"]
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in weight.lines)  # the w = 1 reference
        assert all(axis.get_legend() is not None for axis in figure.axes)
    finally:
        plt.close(figure)


def test_a_run_without_peer_rows_says_so_in_the_panel():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trl_ftis.demo.report import curves_figure

    results = {peer: r for peer, r in _results().items() if peer in ("alone", "alone-rows")}
    figure = curves_figure(results, 30)
    try:
        rows = figure.axes[2]
        assert not rows.lines and [t.get_text() for t in rows.texts] == ["nothing logged"]
    finally:
        plt.close(figure)


def test_the_standard_error_is_the_binomial_one():
    assert standard_error(0.5, 100) == pytest.approx(0.05)
    assert standard_error(0.2, 30) == pytest.approx(math.sqrt(0.16 / 30))
