"""`seeds:` in a swarm config: the whole swarm and its controls once per seed (every peer's `--seed N`, each seed in
`<run_dir>/seed-N`), then one reading over the seeds (`trl_ftis.worth_report`) in the console, the top
`summary.json` and each peer's own summary and model card. Stand-in peers (tests/fixtures/swarm_peer.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from trl_ftis import cli
from trl_ftis.exchange.transports.directory import dir_exchange_url
from trl_ftis.exit_codes import INTERRUPTED_EXIT_CODE
from trl_ftis.launcher import SwarmConfigError, dry_run, load_swarm_config, restart_config
from trl_ftis.launcher.seeds import run_seeds, seed_config

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")


def write_config(tmp_path, **top) -> Path:
    raw = {
        "script": PEER,
        "run_dir": str(tmp_path / "run"),
        "args": {"lines": 0, "summary": "trained"},
        "controls": ["alone", "alone-rows"],
        "peers": [{"id": "a"}, {"id": "b"}],
        **top,
    }
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_each_seed_runs_the_whole_swarm_in_its_own_folder(tmp_path):
    config = load_swarm_config(write_config(tmp_path, seeds=[3, 7]))
    assert config.seeds == (3, 7)
    one = seed_config(config, 7)
    assert one.run_dir == tmp_path / "run" / "seed-7" and one.seed == 7 and one.seeds == ()
    assert one.exchange_url == dir_exchange_url(tmp_path / "run" / "seed-7" / "exchange")
    assert all(peer.args["seed"] == 7 for peer in one.peers)  # the controls too: the pairing
    assert [peer.id for peer in one.peers] == ["a", "b", "a-alone", "a-alone-rows", "b-alone", "b-alone-rows"]
    given = load_swarm_config(write_config(tmp_path, seeds=[1], exchange_url="redis://localhost:6379/0"))
    assert seed_config(given, 1).exchange_url == "redis://localhost:6379/0"  # the run id keeps seeds apart
    shown = io.StringIO()
    assert dry_run(config, shown) == 0
    assert shown.getvalue().startswith("# seeds 3, 7: the whole swarm runs once per seed")
    assert "--seed 3" in shown.getvalue()


@pytest.mark.parametrize(
    ("seeds", "problem"),
    [
        ([1, 1], "lists a seed twice"),
        ([-1], "must be a list of 1 to 100 integers"),
        ("1", "must be a list"),
        ([], "must be a list of 1 to 100"),
        ([True], "must be a list"),
    ],  # fmt: skip
)
def test_a_wrong_seeds_list_is_named_before_anything_starts(tmp_path, seeds, problem):
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(write_config(tmp_path, seeds=seeds))
    assert any("`seeds`" in error and problem in error for error in info.value.errors), info.value.errors


def test_restarting_peers_of_a_seeded_run_is_refused_with_the_way_to_do_it(tmp_path):
    config = load_swarm_config(write_config(tmp_path, seeds=[0, 1]))
    for only, resume in ((["a"], False), ((), True)):
        with pytest.raises(SwarmConfigError, match="--run-dir <run_dir>/seed-N"):
            restart_config(config, only=only, resume=resume)


def test_the_seeds_are_read_together_at_the_end(tmp_path, capsys):
    assert cli.main(["swarm", str(write_config(tmp_path, seeds=[0, 1, 2]))]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "run"
    for seed in (0, 1, 2):
        assert json.loads((run / f"seed-{seed}" / "summary.json").read_text())["exit_code"] == 0
        argv = (run / f"seed-{seed}" / "logs" / "a-alone.cmd").read_text()
        assert f'"--seed", "{seed}"' in argv
    summary = json.loads((run / "summary.json").read_text())
    assert [entry["seed"] for entry in summary["seeds"]] == [0, 1, 2] and summary["exit_code"] == 0
    reading = summary["joining"]
    assert reading["seeds"] == 3 and set(reading["peers"]) == {"a", "b"}
    analysis = reading["peers"]["a"]["analysis"]
    assert analysis["interval_kind"] == "seeds" and "low" in analysis["phi"]
    assert reading["peers"]["a"]["pays"]["hardware"]["assumed"] == []
    assert "what joining was worth, read over 3 seeds:" in out
    assert "joining, 3 seeds: a: phi " in out
    assert out.count("what joining was worth (this run against its controls)") == 0  # no per-seed reading
    # Each seed's peers keep the reading over every seed.
    kept = json.loads((run / "seed-1" / "a" / "ftis_summary.json").read_text())
    assert kept["joining"]["seeds"] == 3 and kept["joining"]["lines"] == reading["peers"]["a"]["lines"]
    # And `trl-ftis pays` reads the same run again, measuring everything from its files.
    assert cli.main(["pays", str(run)]) == 0
    again = capsys.readouterr().out
    assert reading["peers"]["a"]["lines"][0] in again and "(assumed)" not in again


def test_a_failed_seed_stops_the_next_ones_and_is_reported(tmp_path):
    config = load_swarm_config(write_config(tmp_path, seeds=[0, 1, 2]))
    said, ran = [], []

    def run_one(one):
        ran.append(one.seed)
        return 1 if one.seed == 1 else 0

    assert run_seeds(config, run_one, say=said.append) == 1
    assert ran == [0, 1]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"] == "seed 1 ended 1; not run: seeds 2"
    assert said[-1].startswith("seed 1 ended 1; not run: seeds 2; exit code 1")
    ran.clear()
    going_on = load_swarm_config(write_config(tmp_path, seeds=[0, 1, 2], on_failure="continue"))
    assert run_seeds(going_on, run_one, say=said.append) == 1 and ran == [0, 1, 2]
    ran.clear()
    assert run_seeds(going_on, lambda one: ran.append(one.seed) or INTERRUPTED_EXIT_CODE, say=said.append) == 130
    assert ran == [0]  # Ctrl-C stops every seed
