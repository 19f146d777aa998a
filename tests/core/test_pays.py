"""The wall-time calculation of `trl_ftis.pays` against hand-computed values, its reading of run summaries, and the
`trl-ftis pays` command."""

from __future__ import annotations

import json
import math

import pytest

from trl_ftis import cli
from trl_ftis.pays import (
    VERDICT_WORDS,
    Hardware,
    factors_from_summaries,
    format_report,
    read_summary,
    step_ratio,
    steps_ratio,
    verdict,
    wall_ratio_range,
    wall_ratios,
)


def test_step_ratio_by_hand():
    assert step_ratio(0.5, 2.0) == pytest.approx(0.75)  # 1 - 0.5 + 0.5 / 2
    assert step_ratio(0.5, 2.0, 0.25) == pytest.approx(1.0)  # 0.75 / (1 - 0.25)
    assert step_ratio(0.4, 1.0) == pytest.approx(1.0)  # latency-bound generation saves nothing
    with pytest.raises(ValueError, match="r must be"):
        step_ratio(0.5, 2.0, 1.0)


def test_steps_ratio_by_hand():
    assert steps_ratio(1.0, 2.25, 2) == pytest.approx(1.0)  # peer rows worth own rows: A_N's steps
    assert steps_ratio(0.0, 2.25, 2) == pytest.approx(2.25)  # worth nothing: A_N/P's steps (beta)
    assert steps_ratio(0.5, 4.0, 2) == pytest.approx(4.0 / 1.5**2)  # gamma = 2, m = 1.5
    assert steps_ratio(1 / 3, 4.0, 4) == pytest.approx(2.0)  # gamma = 1, m = 2
    assert steps_ratio(-0.5, 3.0, 2) == pytest.approx(3.0)  # harmful rows count as none, not as fewer
    assert steps_ratio(0.5, 1.0, 2) == pytest.approx(1.0)  # beta 1: rows a step do not matter
    with pytest.raises(ValueError, match="beta"):
        steps_ratio(0.5, 0.0, 2)


def test_wall_ratios_by_hand():
    hardware = Hardware(peers=2, f=0.5, s=2.0, r=0.0, q=0.6)
    got = wall_ratios(hardware, phi=0.5, beta=4.0)
    assert got["step"] == pytest.approx(0.75)
    assert got["steps"] == pytest.approx(16 / 9)
    assert got["alone_wall"] == pytest.approx(2.4)  # beta x q
    assert got["vs_full"] == pytest.approx(0.75 * 16 / 9)
    assert got["vs_own"] == pytest.approx(0.75 * 16 / 9 / 2.4)
    assert got["vs_best"] == pytest.approx(got["vs_full"])  # A_N (wall 1) is the better alone run here
    faster_alone = wall_ratios(Hardware(peers=2, f=0.5, s=2.0, q=0.2), phi=0.5, beta=4.0)
    assert faster_alone["vs_best"] == pytest.approx(faster_alone["vs_own"])  # A_N/P wall 0.8 < 1


def test_alone_step_ratio_assumed_in_proportion_to_rows():
    assert Hardware(peers=2, f=0.5, s=2.0).alone_step_ratio == pytest.approx(0.25 + 0.25)
    assert Hardware(peers=4, f=0.2, s=1.0).alone_step_ratio == pytest.approx(0.2 + 0.2)
    assert Hardware(peers=4, f=0.2, s=1.0, q=0.9).alone_step_ratio == 0.9


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"peers": 1, "f": 0.5, "s": 2.0}, "peers"),
        ({"peers": 2, "f": 1.0, "s": 2.0}, "f "),
        ({"peers": 2, "f": math.nan, "s": 2.0}, "f "),
        ({"peers": 2, "f": 0.5, "s": 0.5}, "s "),
        ({"peers": 2, "f": 0.5, "s": math.inf}, "s "),
        ({"peers": 2, "f": 0.5, "s": 2.0, "r": -0.1}, "r "),
        ({"peers": 2, "f": 0.5, "s": 2.0, "q": 0.0}, "q "),
    ],
)
def test_hardware_refuses_impossible_factors(fields, message):
    with pytest.raises(ValueError, match=message):
        Hardware(**fields)


def test_range_spans_the_ends_of_the_intervals():
    hardware = Hardware(peers=2, f=0.5, s=2.0, q=0.6)
    ranges = wall_ratio_range(hardware, phi=(0.5, 1.0), beta=(4.0, 4.0))
    assert ranges["vs_full"] == pytest.approx((0.75, 0.75 * 16 / 9))
    # Several hardware settings: the range covers each.
    two = wall_ratio_range([hardware, Hardware(peers=2, f=0.5, s=1.0, q=0.6)], phi=(1.0, 1.0), beta=(4.0, 4.0))
    assert two["step"] == pytest.approx((0.75, 1.0))
    with pytest.raises(ValueError, match="not ordered"):
        wall_ratio_range(hardware, phi=(1.0, 0.5), beta=(4.0, 4.0))


def test_verdict():
    assert verdict(0.7, 0.95) == "pays"
    assert verdict(1.01, 1.5) == "does not pay"
    assert verdict(0.8, 1.2) == "not distinguishable"


def write_summary(path, *, steps, step, generation, exchange, own_rows, peer_rows=0):
    path.mkdir(parents=True, exist_ok=True)
    summary = {
        "steps": steps,
        "time_seconds": {
            "step": step,
            "generation": generation,
            "scoring": 0.0,
            "exchange": exchange,
            "training": 0.0,
            "other": 0.0,
        },
        "own_generation": {"rows": own_rows, "tokens": 10 * own_rows, "seconds": generation},
        "peer_value": {"rows_in_loss": peer_rows},
    }
    (path / "ftis_summary.json").write_text(json.dumps(summary))
    return path


def test_factors_measured_from_a_peer_and_both_alone_runs(tmp_path):
    peer = write_summary(
        tmp_path / "peer", steps=10, step=10.0, generation=2.0, exchange=1.0, own_rows=320, peer_rows=310
    )  # fmt: skip  (10 peer rows dropped: P still rounds to 2)
    full = write_summary(tmp_path / "full", steps=10, step=12.0, generation=6.0, exchange=0.0, own_rows=640)
    own = write_summary(tmp_path / "own", steps=20, step=10.0, generation=4.0, exchange=0.0, own_rows=640)
    hardware, read = factors_from_summaries([peer, full, own])
    assert hardware.peers == 2
    assert hardware.f == pytest.approx(0.5)  # 0.6 s of a 1.2 s A_N step
    assert hardware.s == pytest.approx(3.0)  # 0.6 s / 0.2 s
    assert hardware.r == pytest.approx(0.1)  # 0.1 s of the peer's 1.0 s step
    assert hardware.q == pytest.approx(0.5 / 1.2)
    assert hardware.assumed == ()
    assert len(read["runs"]) == 3


def test_factors_assumed_from_the_peer_alone(tmp_path):
    peer = write_summary(tmp_path / "peer", steps=10, step=10.0, generation=2.0, exchange=1.0, own_rows=320,
                         peer_rows=960)  # fmt: skip
    hardware, _ = factors_from_summaries([peer])
    assert hardware.peers == 4  # (32 + 96) / 32
    assert hardware.s == 4.0  # assumed: generation in proportion to the rows
    step_full = 1.0 - 0.1 - 0.2 + 4 * 0.2  # the peer's step without exchange, with 4x the generation
    assert hardware.f == pytest.approx(0.8 / step_full)
    assert hardware.q is None
    assert set(hardware.assumed) == {"s", "f", "q", "g", "t"}
    report = format_report(hardware, (0.8, 0.6, 1.0), (2.0, 1.5, 2.5))
    assert "assumed" in report and "No verdict" in report.splitlines()[0]
    # With assumed factors no verdict word is printed anywhere, only what to run to get one.
    assert not any(word in report for word in VERDICT_WORDS)
    assert "controls: [alone, alone-rows]" in report


def test_summaries_that_cannot_be_read_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="no ftis_summary.json"):
        read_summary(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ftis_summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        read_summary(bad)
    (bad / "ftis_summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_summary(bad)
    (bad / "ftis_summary.json").write_text(" " * (4 * 1024 * 1024 + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_summary(bad)
    write_summary(bad, steps=0, step=1.0, generation=0.5, exchange=0.0, own_rows=32)
    with pytest.raises(ValueError, match="'steps'"):
        read_summary(bad)
    (bad / "ftis_summary.json").write_text(
        '{"steps": 2, "time_seconds": {"step": NaN, "generation": 1, "exchange": 0}, "own_generation": {"rows": 2}}'
    )
    with pytest.raises(ValueError, match="time_seconds"):
        read_summary(bad)


def test_exactly_one_swarm_peer_and_matching_alone_runs(tmp_path):
    peer = write_summary(
        tmp_path / "p", steps=10, step=10.0, generation=2.0, exchange=1.0, own_rows=320, peer_rows=320
    )
    other = write_summary(
        tmp_path / "q", steps=10, step=10.0, generation=2.0, exchange=1.0, own_rows=320, peer_rows=320
    )
    odd = write_summary(tmp_path / "odd", steps=10, step=10.0, generation=2.0, exchange=0.0, own_rows=480)
    alone = write_summary(tmp_path / "alone", steps=10, step=10.0, generation=2.0, exchange=0.0, own_rows=320)
    with pytest.raises(ValueError, match="exactly one swarm peer"):
        factors_from_summaries([peer, other])
    with pytest.raises(ValueError, match="exactly one swarm peer"):
        factors_from_summaries([alone])
    with pytest.raises(ValueError, match="must generate 32 .* or 64"):
        factors_from_summaries([peer, odd])


def test_pays_command(tmp_path, capsys):
    peer = write_summary(tmp_path / "peer", steps=10, step=10.0, generation=2.0, exchange=1.0, own_rows=320,
                         peer_rows=320)  # fmt: skip
    full = write_summary(tmp_path / "full", steps=10, step=12.0, generation=6.0, exchange=0.0, own_rows=640)
    assert cli.main(["pays", str(peer), str(full), "--phi", "0.8", "0.6", "1.0", "--beta", "2"]) == 0
    out = capsys.readouterr().out
    # The A_N run measures f, t and the step ratio; s (A_N's generation over A_N/P's), g and q need an A_N/P run.
    hardware = Hardware(peers=2, f=0.5, s=2.0, r=0.1, t=(1.0 - 0.2 - 0.1) / 0.6, step=1.0 / 1.2)
    expected = wall_ratios(hardware, 0.8, 2.0)["vs_full"]
    assert f"against training alone on as many rows a step as it trains on (A_N): {expected:.2f}x" in out
    assert "q = " in out and "assumed: training in proportion to rows" in out
    assert "s = 2.00  generation a step of A_N over A_N/P (assumed)" in out
    assert "No verdict: g, s, q were assumed" in out and not any(word in out for word in VERDICT_WORDS)
    assert "break-even: " in out
    # With every factor measured (an A_N/P run too) and phi and beta given, the verdict is printed.
    own = write_summary(tmp_path / "own", steps=10, step=6.0, generation=2.0, exchange=0.0, own_rows=320)
    assert cli.main(["pays", str(peer), str(full), str(own), "--phi", "0.8", "0.6", "1.0", "--beta", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("this swarm peer: predicted wall time") and first.endswith(
        ("pays", "does not pay", "not distinguishable")
    )
    assert cli.main(["pays", str(peer), "--phi", "0.8", "1.0", "0.6", "--beta", "2"]) == 2
    assert "LOW <= EST <= HIGH" in capsys.readouterr().err
    assert cli.main(["pays", str(peer), "--phi", "0.8", "--beta", "0"]) == 2
    assert "--beta must be > 0" in capsys.readouterr().err
    assert cli.main(["pays", str(tmp_path / "nowhere"), "--phi", "0.8", "--beta", "2"]) == 2
    assert "no ftis_summary.json" in capsys.readouterr().err


def test_break_even_share_by_hand():
    from trl_ftis.pays import break_even_share

    # phi = 1, beta = 2, P = 2, s = 2, r = 0, q assumed: the swarm takes A_N's steps, its step is 1 - f/2 and A_N/P's
    # wall is beta x (f/2 + (1 - f)/2) = 1, so the better alone run has wall 1 and any f > 0 pays.
    assert break_even_share(2, (1.0, 1.0), (2.0, 2.0)) == pytest.approx(0.005)
    # With r = 0.2 the step is (1 - f/2) / 0.8 < 1 only for f > 0.4.
    assert break_even_share(2, (1.0, 1.0), (2.0, 2.0), r=0.2) == pytest.approx(0.405)
    # Latency-bound generation (s = 1) saves nothing: the step ratio is 1 whatever f, so joining never pays.
    assert break_even_share(2, (1.0, 1.0), (2.0, 2.0), s=1.0) is None
    # Worthless peer rows (phi = 0) take A_N/P's steps on a dearer step: never.
    assert break_even_share(2, (0.0, 0.0), (2.0, 2.0)) is None


def test_measured_learning_is_what_the_raw_summary_says():
    """`MEASURED_LEARNING` is copied from the peer-gain grid's summary: it must match the raw file line for line."""
    import re
    from pathlib import Path

    from trl_ftis.pays import MEASURED_LEARNING

    raw = (Path(__file__).resolve().parents[2] / "benchmarks/results/peer_gain-grid.txt").read_text()
    number = r"(-?[\d.]+)"
    for (partners, peers), values in MEASURED_LEARNING.items():
        phi = re.search(rf"^\| {partners}-{peers} \| {number} \| \[{number}, {number}\]", raw, re.MULTILINE)
        beta = re.search(
            rf"^\| beta_{peers}: A_1 / A_{peers} \| {number} \| \[{number}, {number}\]", raw, re.MULTILINE
        )
        assert phi and beta, (partners, peers)
        assert values["phi"] == tuple(map(float, phi.groups()))
        assert values["beta"] == tuple(map(float, beta.groups()))


def test_pays_command_with_the_measured_learning_factors(tmp_path, capsys):
    from trl_ftis.pays import MEASURED_LEARNING

    peer = write_summary(tmp_path / "peer", steps=10, step=10.0, generation=2.0, exchange=1.0, own_rows=320,
                         peer_rows=320)  # fmt: skip
    assert cli.main(["pays", str(peer), "--partners", "hetero"]) == 0
    out = capsys.readouterr().out
    phi, beta = MEASURED_LEARNING[("hetero", 2)]["phi"], MEASURED_LEARNING[("hetero", 2)]["beta"]
    assert "phi and beta as measured here for --partners hetero at P = 2" in out
    assert f"phi = {phi[0]:.2f} [{phi[1]:.2f}, {phi[2]:.2f}]  a peer row's value in own rows (assumed)" in out
    assert f"beta = {beta[0]:.2f} [{beta[1]:.2f}, {beta[2]:.2f}]  steps of A_N/P over A_N (assumed)" in out
    assert not any(word in out for word in VERDICT_WORDS)  # this library's phi is no measurement of your task
    # A value given by the user wins over the measured one.
    assert cli.main(["pays", str(peer), "--partners", "copy", "--phi", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "beta as measured here" in out and "phi = 0.50 [0.50, 0.50]" in out and "beta = 1.44" in out
    # Both given: nothing is taken from the measurement, and the output does not say it was.
    assert cli.main(["pays", str(peer), "--partners", "copy", "--phi", "0.5", "--beta", "2"]) == 0
    assert "as measured here" not in capsys.readouterr().out
    # Measured for P = 2 and 4 only; without --partners both factors are needed.
    assert cli.main(["pays", str(peer), "--partners", "copy", "--peers", "3"]) == 2
    assert "measured for P = 2 and 4, not P = 3" in capsys.readouterr().err
    assert cli.main(["pays", str(peer), "--phi", "0.5"]) == 2
    assert "give --phi and --beta, or --partners" in capsys.readouterr().err
