"""`trl_ftis.worth_report`: what joining was worth to each swarm peer of a launcher run, in words, from its
`summary.json` rows, and `trl-ftis pays RUN_DIR` on a launcher run. Verdict words only with intervals over seeds;
one seed says what it saw; hostile rows count as missing."""

from __future__ import annotations

import json

import pytest

from trl_ftis import cli
from trl_ftis.pays import VERDICT_WORDS
from trl_ftis.worth_report import (
    CARD_BEGIN,
    ONE_SEED,
    overall_line,
    peer_seeds,
    record_in_peer_outputs,
    run_reading,
    undecided,
)


def record(accuracies, *, step=1.0, generation=0.4, exchange=0.0, rows=32, every=5, n=100):
    """A launcher row's `run` (trl_ftis.joining.arm_record's form): evaluated every `every` steps."""
    evaluations = []
    for k, accuracy in enumerate(accuracies):
        ones = round(accuracy * n)
        evaluations.append(
            {
                "step": k * every,
                "accuracy": ones / n,
                "seconds": k * every * step,
                "items": "1" * ones + "0" * (n - ones),
            }
        )
    return {
        "steps": (len(accuracies) - 1) * every,
        "per_step": {
            "step_seconds": step,
            "generation_seconds": generation,
            "exchange_seconds": exchange,
            "own_rows": rows,
        },  # fmt: skip
        "accuracy_evaluations": evaluations,
    }


def seed_rows(swarm, alone, full, *, slower=1.0):
    """One seed's summary rows: peer `a` beside its two controls, and peer `b` without controls."""
    return [
        {"id": "a", "control_of": None, "run": record(swarm, step=1.2 * slower, generation=0.45, exchange=0.1)},
        {"id": "b", "control_of": None, "run": record(swarm)},
        {"id": "a-alone", "control_of": "a", "run": record(alone, step=0.7, generation=0.4)},
        {"id": "a-alone-rows", "control_of": "a", "run": record(full, step=1.0, generation=0.5, rows=64)},
    ]


SEEDS = [
    seed_rows([0.20, 0.30, 0.40, 0.45, 0.45], [0.20, 0.24, 0.30, 0.34, 0.36], [0.20, 0.30, 0.40, 0.47, 0.50]),
    seed_rows([0.25, 0.33, 0.45, 0.50, 0.52], [0.25, 0.28, 0.33, 0.38, 0.41], [0.25, 0.34, 0.47, 0.52, 0.55]),
    seed_rows([0.22, 0.32, 0.42, 0.46, 0.48], [0.22, 0.25, 0.30, 0.35, 0.38], [0.22, 0.30, 0.44, 0.49, 0.51]),
]


def test_only_peers_with_controls_are_read_and_malformed_runs_count_as_missing():
    found = peer_seeds(SEEDS)
    assert list(found) == ["a"] and len(found["a"]) == 3
    assert all(arms["alone"] is not None and arms["alone-rows"] is not None for arms in found["a"])
    hostile = [dict(row) for row in SEEDS[0]]
    hostile[2]["run"] = {"steps": True, "per_step": {}}  # another process's file: never trusted
    hostile[3]["run"] = "not an object"
    arms = peer_seeds([hostile])["a"][0]
    assert arms["alone"] is None and arms["alone-rows"] is None and arms["swarm"] is not None
    reading = run_reading([hostile])
    assert any("alone control" in item for item in reading["peers"]["a"]["analysis"]["missing"])


def test_one_seed_says_what_it_saw_without_a_verdict():
    reading = run_reading(SEEDS[:1])
    lines = reading["peers"]["a"]["lines"]
    assert lines[0].startswith("peer a: training alone on its own rows ")
    assert ONE_SEED in lines[0]
    assert undecided(reading["peers"]["a"]["analysis"]).startswith("one seed")
    assert "No verdict: one seed" in "\n".join(lines)
    text = "\n".join(lines)
    for word in (*VERDICT_WORDS, "ahead", "behind", "joining was faster", "training alone was faster"):
        assert f": {word}" not in text, word
    assert "(evaluation noise only)" in text
    assert "one run" in overall_line(reading)


def test_several_seeds_give_intervals_over_seeds_and_verdicts():
    reading = run_reading(SEEDS)
    entry = reading["peers"]["a"]
    analysis = entry["analysis"]
    assert analysis["interval_kind"] == "seeds" and analysis["seeds"] == 3
    assert "low" in analysis["phi"] and "low" in analysis["beta"]
    assert undecided(analysis) is None
    text = "\n".join(entry["lines"])
    assert "over 3 seeds: " in entry["lines"][0]
    assert entry["lines"][0].endswith(("joining was faster", "training alone was faster", "not distinguishable"))
    assert "accuracy gain at equal steps, this run - alone: " in text and "over 3 seeds: ahead" in text
    pays_line = next(line for line in entry["lines"] if "(trl-ftis pays, from this run)" in line)
    assert pays_line.rstrip().endswith(VERDICT_WORDS)  # every factor measured: the calculator's verdict
    hardware = entry["pays"]["hardware"]
    assert hardware["assumed"] == [] and hardware["s"] == pytest.approx(1.25)  # 0.5 / 0.4, A_N over A_N/P
    assert hardware["step"] == pytest.approx(1.2)  # the measured step ratio is used as it is
    assert overall_line(reading).startswith("joining, 3 seeds: a: phi ")


def test_the_reading_is_kept_in_each_peers_summary_and_model_card(tmp_path):
    reading = run_reading(SEEDS)
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "ftis_summary.json").write_text(json.dumps({"steps": 20}))
    (folder / "README.md").write_text("# card\n")
    assert record_in_peer_outputs({"a": folder, "b": tmp_path / "b"}, reading) == []
    kept = json.loads((folder / "ftis_summary.json").read_text())
    assert kept["steps"] == 20 and kept["joining"]["lines"] == reading["peers"]["a"]["lines"]
    card = (folder / "README.md").read_text()
    assert card.startswith("# card\n") and card.count(CARD_BEGIN) == 1 and reading["peers"]["a"]["lines"][0] in card
    record_in_peer_outputs({"a": folder}, run_reading(SEEDS[:1]))  # a later reading replaces the section
    card = (folder / "README.md").read_text()
    assert card.count(CARD_BEGIN) == 1 and ONE_SEED in card
    (folder / "ftis_summary.json").write_text("[1, 2]")  # not an object: left alone
    assert record_in_peer_outputs({"a": folder}, reading) == []
    assert (folder / "ftis_summary.json").read_text() == "[1, 2]"


def write_launcher_run(run_dir, seeds):
    run_dir.mkdir(parents=True)
    for index, rows in enumerate(seeds):
        (run_dir / f"seed-{index}").mkdir()
        (run_dir / f"seed-{index}" / "summary.json").write_text(json.dumps({"peers": rows}))
    top = {"seeds": [{"seed": index, "summary": "elsewhere/../../etc/passwd"} for index in range(len(seeds))]}
    (run_dir / "summary.json").write_text(json.dumps(top))


def test_pays_reads_a_launcher_run_directory(tmp_path, capsys):
    write_launcher_run(tmp_path / "run", SEEDS)
    assert cli.main(["pays", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert out == "\n".join(run_reading(SEEDS)["peers"]["a"]["lines"] + [overall_line(run_reading(SEEDS))]) + "\n"
    assert "(assumed)" not in out  # every factor measured by the run itself
    # One seed's folder is a launcher run too (its own summary.json holds the rows).
    assert cli.main(["pays", str(tmp_path / "run" / "seed-0")]) == 0
    assert ONE_SEED in capsys.readouterr().out
    assert cli.main(["pays", str(tmp_path / "run"), "--phi", "0.5"]) == 2
    assert "measures phi and beta itself" in capsys.readouterr().err
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "summary.json").write_text(json.dumps({"peers": [{"id": "a", "control_of": None}]}))
    assert cli.main(["pays", str(lonely)]) == 2
    assert "controls: [alone, alone-rows]" in capsys.readouterr().err
    (lonely / "summary.json").write_text("{not json")
    assert cli.main(["pays", str(lonely)]) == 2
    assert "not JSON" in capsys.readouterr().err
