"""A backend and a transport from outside the package (`tests/fixtures/stand_in_backend.py`,
`tests/fixtures/stand_in_transport.py`), registered by the test and used with no package file touched: the stand-in
backend's own config sections and checks, its command-line flag, a dry run and a launch; a swarm round between two
clients over the stand-in transport; and the launcher's check before start through the transport's probe."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path

from trl_ftis import cli
from trl_ftis.exchange.transports import open_transport
from trl_ftis.launcher import SwarmConfigError, backend_names, dry_run, load_swarm_config, restart_config, run_swarm
from trl_ftis.launcher.restart import restart_command

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import stand_in_backend  # noqa: E402
import stand_in_transport  # noqa: E402

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")


@pytest.fixture
def stand_ins():
    stand_in_backend.register()
    stand_in_transport.register()
    yield
    stand_in_backend.unregister()
    stand_in_transport.unregister()


def _config(tmp_path, **top):
    return {
        "script": PEER,
        "run_dir": str(tmp_path / "run"),
        "peers": [{"id": "a", "stand_in": {"slots": 2}}, {"id": "b"}],
        **top,
    }


def test_the_stand_in_backend_is_registered_and_taken_out_again(stand_ins):
    assert "stand_in" in backend_names()
    stand_in_backend.unregister()
    assert "stand_in" not in backend_names()
    with pytest.raises(SwarmConfigError, match=r"`launcher`.*must be one of python, accelerate, slurm, got 'stand_in"):
        load_swarm_config({"script": PEER, "launcher": "stand_in", "peers": [{"id": "a"}]})


def test_its_sections_resolve_into_the_config(stand_ins, tmp_path):
    config = load_swarm_config(_config(tmp_path, launcher="stand_in", stand_in={"queue": "q1", "slots": 3}))
    assert config.scheduler == "stand_in" and not config.exchange_started
    assert config.sections["stand_in"].queue == "q1" and config.sections["stand_in"].slots == 3
    assert [peer.sections["stand_in"].slots for peer in config.peers] == [2, 1]
    assert config.exchange_url == f"dir://{tmp_path / 'run' / 'exchange'}"  # the default exchange: nothing of its own


def test_its_checks_and_refusals_are_reported_with_the_others(stand_ins, tmp_path):
    raw = _config(tmp_path, launcher="stand_in", stand_in={"slots": 1, "queu": "x"})
    raw["peers"][1]["gpus"] = "0"
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    errors = info.value.errors
    assert any("unknown key `stand_in.queu`" in e and "did you mean `stand_in.queue`" in e for e in errors), errors
    assert "peers[0] (id 'a'): `stand_in.slots` is 2, but the queue has 1" in errors
    assert "peers[1] (id 'b'): `gpus` means nothing on the stand-in queue" in errors
    # Its sections are refused when another backend runs the swarm, naming how to choose it.
    with pytest.raises(SwarmConfigError, match=r"`stand_in` is only used on the stand-in queue: add `launcher: "
                       r"stand_in` at the top level \(or run with --stand-in\)"):  # fmt: skip
        load_swarm_config(_config(tmp_path))
    # Its placement rule.
    server = {"id": "c", "model": "m", "vllm_server": {"gpus": "1"}}
    with pytest.raises(SwarmConfigError, match="the stand-in queue runs no vLLM server"):
        load_swarm_config({**_config(tmp_path, launcher="stand_in"), "peers": [server]})


def test_a_dry_run_and_a_launch_on_the_stand_in_backend(stand_ins, tmp_path, capsys):
    path = tmp_path / "swarm.yaml"
    path.write_text(json.dumps(_config(tmp_path, stand_in={"queue": "q1"})))  # JSON is YAML
    # Its command-line flag selects it whatever the config says.
    assert cli.main(["swarm", str(path), "--stand-in", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# stand-in queue q1 (4 slots)" in out and "# would submit a (2 slots)" in out
    assert "# would submit b (1 slots)" in out
    config = load_swarm_config(path, backend="stand_in")
    assert restart_command(config).startswith(f"trl-ftis swarm {path} --run-dir {config.run_dir} --stand-in")
    assert run_swarm(config, grace=1, stream=io.StringIO()) == 0
    argv = json.loads((config.run_dir / "stand_in" / "a.json").read_text())
    assert "--peer_id" not in argv or argv[argv.index("--peer_id") + 1] == "a"
    assert json.loads((config.run_dir / "summary.json").read_text())["scheduler"] == "stand_in"
    # --only restarts a peer on it like on any other backend.
    only, said = restart_config(config, only=["b"])
    assert [peer.id for peer in only.peers] == ["b"] and only.scheduler == "stand_in"


def test_a_swarm_round_over_the_stand_in_transport(stand_ins, tokenizer):
    url = "stand-in://board-1?token=s3cret"
    a, b = make_swarm(url, "a", tokenizer), make_swarm(url, "b", tokenizer)
    assert a.publish(rows("a"), round=0) > 0
    b.publish(rows("b", count=2), round=0)
    got_a, got_b = a.collect(0), b.collect(0)
    assert [r.sender for r in got_a.rows] == ["b", "b"] and [r.sender for r in got_b.rows] == ["a"] * 4
    assert len(stand_in_transport.BOARDS["board-1"]) == 2
    with open_transport("STAND-IN://board-1") as reader:  # schemes are case-insensitive for every transport
        assert isinstance(reader, stand_in_transport.StandInTransport) and len(reader.poll()) == 2


def test_the_launcher_accepts_its_urls_probes_them_and_hides_their_secret(stand_ins, tmp_path, capsys):
    config = load_swarm_config(_config(tmp_path, launcher="stand_in", exchange_url="stand-in://board-2?token=s3cret"))
    assert config.exchange_url == "stand-in://board-2?token=s3cret"
    out = io.StringIO()
    dry_run(config, out)
    assert "exchange stand-in://board-2?token=s3cret" in out.getvalue()  # the backend's own line: as it was given
    assert run_swarm(config, grace=1, stream=io.StringIO()) == 0
    assert stand_in_transport.PROBED == ["stand-in://board-2?token=<hidden>"]
    stand_in_transport.PROBED.clear()
    down = load_swarm_config(_config(tmp_path, launcher="stand_in", exchange_url="stand-in://down?token=s3cret"))
    # The peers' script is not known to connect to the exchange: a warning (a known one would be refused).
    assert run_swarm(down, grace=1, stream=io.StringIO()) == 0
    warned = capsys.readouterr().err
    assert "cannot reach the stand-in board at stand-in://down?token=<hidden>" in warned and "s3cret" not in warned
    assert stand_in_transport.PROBED == ["stand-in://down?token=<hidden>"]
