"""`trl-ftis swarm` catches the usual config mistakes before any peer starts, each with one line naming the field:
args a peer's script does not take, a missing local model folder, `expected_peers` naming no peer, a `peer_timeout`
of 0, GPUs that are no devices, duplicate ids together with the rest, an unreachable external Redis; and it warns
once about secrets written in the config (docs/swarm-launcher.md, "Checks before start").

Where a test runs the launcher, the peers are `tests/fixtures/swarm_peer.py` (standard library only, its options
unknown to the launcher) or a script that would write a marker file if it ever ran.
"""

import io
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from waits import returns_within  # tests/ is on sys.path

from trl_ftis import cli
from trl_ftis.exchange.transports.redis_streams import reach_problem
from trl_ftis.launcher import SwarmConfigError, check_files, dry_run, load_swarm_config, run_swarm
from trl_ftis.launcher.preflight import script_options
from trl_ftis.model_paths import local_model_problem, looks_like_local_path

ROOT = Path(__file__).resolve().parents[2]
PEER = str(ROOT / "tests" / "fixtures" / "swarm_peer.py")
TINY = str(ROOT / "examples" / "tiny_peer.py")
EXAMPLES = sorted((ROOT / "examples" / "swarms").rglob("*.yaml"))
TINY_CLASSES = "tiny_peer.py takes the fields of TinyPeerArguments, FTISConfig, ModelConfig"


def _errors(raw) -> list[str]:
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    return info.value.errors


def _ftis_script(tmp_path: Path, name: str = "ftis_peer.py") -> tuple[str, Path]:
    """A peer script that parses FTISConfig, and the marker file it would write if it ever ran."""
    marker = tmp_path / f"{name}.ran"
    script = tmp_path / name
    script.write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import HfArgumentParser\n"
        "from trl_ftis import FTISConfig\n"
        "(config,) = HfArgumentParser(FTISConfig).parse_args_into_dataclasses()\n"
    )
    return str(script), marker


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nobody listens once it is closed


# ----------------------------------------------------------------------------------------------------------------
# Every example still loads
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_every_example_config_loads_and_its_args_were_checked(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # their paths are relative to the repository
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # as on a machine with the Hub (nothing is downloaded here)
    config = load_swarm_config(path)
    for peer in config.peers:
        # The check ran: the examples' scripts parse dataclasses whose fields the launcher reads.
        options = script_options(peer.script)
        assert options is not None and all(options.accepts(key) for key in peer.args), peer.id
    assert not [p for p in check_files(config) if "model" in p]  # Hub ids are not local folders


def test_examples_exist():
    assert len(EXAMPLES) >= 5


# ----------------------------------------------------------------------------------------------------------------
# 1. args the peer's script does not take
# ----------------------------------------------------------------------------------------------------------------


def test_an_args_typo_names_the_peer_the_key_and_the_fix():
    errors = _errors({"script": TINY, "peers": [{"id": "a"}, {"id": "b", "args": {"learning_rat": 1e-3}}]})
    assert errors == [
        f"peers[1] (id 'b'): unknown argument `args.learning_rat` ({TINY_CLASSES}); did you mean `args.learning_rate`?"
    ]


def test_a_top_level_typo_is_reported_once_not_once_per_peer():
    errors = _errors({"script": TINY, "args": {"max_step": 3}, "peers": [{"id": "a"}, {"id": "b"}, {"id": "c"}]})
    assert errors == [f"top level: unknown argument `args.max_step` ({TINY_CLASSES}); did you mean `args.max_steps`?"]


def test_values_the_peer_script_would_refuse_are_named_before_anything_starts(tmp_path, capsys):
    """Values, not only keys: each enumerated or typed field of the script's (imported) dataclasses is checked as the
    script's parser would, with the allowed values named, instead of every peer printing its whole usage text."""
    raw = {
        "script": TINY,
        "args": {"exchange_mode": "fre", "max_steps": "many"},
        "peers": [
            {"id": "a", "args": {"kl_threshold": "abc", "learning_rate": 1e-3}},
            {"id": "b", "args": {"use_peft": "maybe", "report_to": ["none"]}},
        ],
    }
    assert _errors(raw) == [
        (
            "top level: `args.exchange_mode`: invalid choice: 'fre' (choose from 'sync', 'async', 'free') "
            "(tiny_peer.py would refuse it at start)"
        ),
        "top level: `args.max_steps`: invalid int value: 'many' (tiny_peer.py would refuse it at start)",
        "peers[0] (id 'a'): `args.kl_threshold`: invalid float value: 'abc' (tiny_peer.py would refuse it at start)",
        (
            "peers[1] (id 'b'): `args.use_peft`: Truthy value expected: got maybe but expected one of yes/no, "
            "true/false, t/f, y/n, 1/0 (case insensitive). (tiny_peer.py would refuse it at start)"
        ),
    ]
    path, run = tmp_path / "swarm.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump({**raw, "run_dir": str(run)}))
    assert cli.main(["swarm", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'fre'" in err and "usage:" not in err and len(err.splitlines()) == 5
    assert not run.exists()
    good = {**raw, "args": {"exchange_mode": "free", "max_steps": 3}, "peers": [{"id": "a"}, {"id": "b"}]}
    assert load_swarm_config(good).peers[0].args == {"exchange_mode": "free", "max_steps": 3}  # values it takes


def test_accepted_spellings_of_the_scripts_options():
    # Dashes for underscores (HfArgumentParser adds them), TrlParser's --config, the script's own dataclass fields.
    config = load_swarm_config(
        {
            "script": TINY,
            "args": {"learning-rate": 1e-3, "config": "x.yaml", "hidden_size": 32, "dtype": "float32"},
            "peers": [{"id": "a", "model": "org/m", "lora": True, "gpu_share": 0.5}],
        }
    )
    assert config.peers[0].args["learning-rate"] == 1e-3


def test_an_args_typo_stops_the_cli_before_anything_starts(tmp_path, capsys):
    path = tmp_path / "swarm.yaml"
    run = tmp_path / "run"
    path.write_text(
        yaml.safe_dump({"script": TINY, "run_dir": str(run), "peers": [{"id": "a", "args": {"lerning_rate": 1}}]})
    )
    for argv in (["swarm", str(path)], ["swarm", str(path), "--dry-run"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "peers[0] (id 'a'): unknown argument `args.lerning_rate`" in err
        assert "did you mean `args.learning_rate`?" in err
    assert not run.exists()


def test_a_users_own_argument_dataclass_is_read_without_running_the_script(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "mine.py"
    script.write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from dataclasses import dataclass, field\n"
        "from typing import ClassVar\n"
        "from transformers import HfArgumentParser\n\n"
        "@dataclass\nclass Base:\n    seed: int = 0\n\n"
        "@dataclass\nclass MyArgs(Base):\n    NAME: ClassVar[str] = 'x'\n"
        "    steps: int = field(default=1, metadata={'aliases': ['--num_steps']})\n"
        "    verbose: bool = True\n    cache: dict = field(default_factory=dict, init=False)\n\n"
        "(args,) = HfArgumentParser((MyArgs,)).parse_args_into_dataclasses()\n"
    )
    load_swarm_config(
        {
            "script": str(script),
            "args": {"seed": 1, "steps": 2, "num_steps": 2, "no_verbose": True},
            "peers": [{"id": "a"}],
        }
    )
    errors = _errors({"script": str(script), "args": {"step": 2, "NAME": "y", "cache": 1}, "peers": [{"id": "a"}]})
    assert errors[0] == (
        "top level: unknown argument `args.step` (mine.py takes the fields of MyArgs); did you mean `args.steps`?"
    )
    assert [e.split("`")[1] for e in errors] == ["args.step", "args.NAME", "args.cache"]
    # The sugar is checked through the argument it sets.
    assert _errors({"script": str(script), "peers": [{"id": "a", "model": "org/m"}]}) == [
        "peers[0] (id 'a'): `model` sets `args.model_name_or_path`, which mine.py does not take"
    ]
    assert not marker.exists()


@pytest.mark.parametrize(
    "source",
    [
        "import argparse\nargparse.ArgumentParser().parse_args()\n",  # not a dataclass parser
        "from mylib import MyArgs\nfrom transformers import HfArgumentParser\nHfArgumentParser(MyArgs)\n",  # elsewhere
        (
            "from trl import TrlParser, ModelConfig\n"
            "TrlParser((ModelConfig,)).parse_args_and_config(fail_with_unknown_args=False)\n"
        ),  # lets unknown args through
        (
            "from transformers import HfArgumentParser\nfrom trl import ModelConfig\n"
            "HfArgumentParser(ModelConfig)\nHfArgumentParser(ModelConfig)\n"
        ),  # which parser reads argv: unknown
        "this is not python\n",
    ],
    ids=["argparse", "unknown-module", "lenient", "two-parsers", "syntax-error"],
)
def test_scripts_whose_arguments_cannot_be_known_are_not_checked(tmp_path, source):
    script = tmp_path / "user.py"
    script.write_text(source)
    assert script_options(script) is None
    config = load_swarm_config({"script": str(script), "args": {"learning_rat": 1}, "peers": [{"id": "a"}]})
    assert config.peers[0].args == {"learning_rat": 1}


def test_unknown_scripts_keep_the_check_off_the_heavy_libraries(tmp_path):
    # The fixture peer (argparse): loading its config imports neither torch nor trl.
    probe = (
        "import sys; from trl_ftis.launcher import load_swarm_config; "
        f"load_swarm_config({{'script': {PEER!r}, 'args': {{'lines': 1}}, 'peers': [{{'id': 'a'}}]}}); "
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


# ----------------------------------------------------------------------------------------------------------------
# 2. local model folders
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, local",
    [
        ("/models/Qwen2.5-1.5B", True),
        ("./models/q", True),
        ("../q", True),
        ("~/models/q", True),
        ("models/org/q", True),
        ("Qwen/Qwen2.5-1.5B", False),
        ("gpt2", False),
        (None, False),
    ],
)
def test_what_looks_like_a_local_model_path(value, local):
    assert looks_like_local_path(value) is local


def test_a_missing_local_model_folder_is_refused_before_any_peer_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the Hub ids are fine with the Hub (nothing is downloaded)
    missing = tmp_path / "models" / "Qwen2.5-1.5B"
    present = tmp_path / "present"
    present.mkdir()
    run = tmp_path / "run"
    raw = {
        "script": PEER,
        "run_dir": str(run),
        "peers": [
            {"id": "a", "model": str(missing)},
            {"id": "b", "model": "Qwen/Qwen2.5-1.5B"},  # a Hub id: left alone
            {"id": "c", "args": {"model_name_or_path": str(present)}},
            {"id": "d", "args": {"model_name_or_path": str(tmp_path / "nope" / "m")}},
        ],
    }
    config = load_swarm_config(raw)
    with pytest.raises(SwarmConfigError) as info:
        run_swarm(config, grace=1, stream=io.StringIO())
    assert info.value.errors == [
        f"`peers[0] (id 'a').model`: no such local model folder {missing}",
        f"`peers[3] (id 'd').args.model_name_or_path`: no such local model folder {tmp_path / 'nope' / 'm'}",
    ]
    assert not run.exists()  # nothing started, nothing written
    # The dry run shows it as a warning and starts nothing either.
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["swarm", str(path), "--dry-run"]) == 0
    assert f"# warning: `peers[0] (id 'a').model`: no such local model folder {missing}" in capsys.readouterr().out
    assert not run.exists()


def test_a_local_model_written_like_a_hub_id_is_named_in_one_line(tmp_path, monkeypatch):
    """`model: models/tiny46` (no `./`) is a Hub id to transformers: with no folder of that name where the peers
    start, a folder of that name beside the config is pointed at; with none anywhere and no Hub, one line says so
    (instead of a minute of retries and a network error)."""
    work, configs = tmp_path / "work", tmp_path / "configs"
    (configs / "models" / "tiny46").mkdir(parents=True)
    work.mkdir()
    monkeypatch.chdir(work)
    path = configs / "swarm.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "script": PEER,
                "run_dir": str(tmp_path / "run"),
                "peers": [{"id": "a", "model": "models/tiny46"}, {"id": "b", "model": "models/absent"}],
            }
        )
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problems = check_files(load_swarm_config(path))
    assert problems == [
        f"`peers[0] (id 'a').model`: 'models/tiny46' is read as a Hugging Face Hub id: there is no folder of that "
        f"name in the peers' working directory {work}, but there is one at {configs / 'models' / 'tiny46'}; write "
        "that path (or `./models/tiny46` relative to where you start the launcher)",
        "`peers[1] (id 'b').model`: no local folder 'models/absent' and no Hub access (HF_HUB_OFFLINE is set; not "
        "in the Hugging Face cache)",
    ]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert len(check_files(load_swarm_config(path))) == 1  # with the Hub, models/absent may be a Hub id
    monkeypatch.chdir(configs)
    assert check_files(load_swarm_config(path)) == []  # started beside it: transformers reads the folder


def test_a_file_is_no_model_folder(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_text("")
    assert "is not a folder" in local_model_problem(str(weights))
    assert local_model_problem(str(tmp_path)) is None


# ----------------------------------------------------------------------------------------------------------------
# 3. expected_peers
# ----------------------------------------------------------------------------------------------------------------


def test_expected_peers_naming_no_peer_is_refused_with_a_did_you_mean():
    peers = [{"id": "big"}, {"id": "lora", "args": {"expected_peers": ["big", "smal"]}}]
    errors = _errors({"script": PEER, "args": {"expected_peers": ["big", "lorra"]}, "peers": peers})
    assert errors == [
        (
            "top level: `args.expected_peers` names 'lorra', which is no peer of this config (peers: big, lora); "
            "did you mean 'lora'?"
        ),
        (
            "peers[1] (id 'lora'): `args.expected_peers` names 'smal', which is no peer of this config (peers: big, "
            "lora)"
        ),
    ]


def test_expected_peers_of_an_external_exchange_may_join_from_elsewhere(tmp_path, capsys):
    # Another launcher's peers may meet this one's on a shared exchange: a warning at start, not an error.
    raw = {
        "script": PEER,
        "run_dir": str(tmp_path / "run"),
        "exchange_url": f"dir://{tmp_path / 'shared'}",
        "args": {"expected_peers": ["a", "b", "elsewhere"]},
        "peers": [{"id": "a"}, {"id": "b"}],
    }
    assert run_swarm(load_swarm_config(raw), grace=1, stream=io.StringIO()) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "`args.expected_peers` names 'elsewhere'" in warnings[0]


# ----------------------------------------------------------------------------------------------------------------
# 4, 5, 6: peer_timeout, gpus, duplicate ids
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, 0.0, "x", True, [1]])
def test_a_peer_timeout_that_never_waits_is_refused(value):
    top = _errors({"script": "p.py", "args": {"peer_timeout": value}, "peers": [{"id": "a"}]})
    assert top == [
        (
            "top level: `args.peer_timeout` must be a number of seconds > 0 (how long a round waits for the expected "
            f"peers), got {value!r}"
        )
    ]
    peer = _errors({"script": "p.py", "peers": [{"id": "a", "args": {"peer_timeout": value}}]})
    assert len(peer) == 1 and peer[0].startswith("peers[0] (id 'a'): `args.peer_timeout` must be")


def test_a_positive_peer_timeout_is_kept():
    config = load_swarm_config({"script": "p.py", "args": {"peer_timeout": 60}, "peers": [{"id": "a", "args": {}}]})
    assert config.peers[0].args["peer_timeout"] == 60
    assert load_swarm_config({"script": "p.py", "args": {"peer_timeout": "1.5"}, "peers": [{"id": "a"}]})


@pytest.mark.parametrize("value", [1.5, "two", -1, "0,x", "1.5", True, [0, 1.5]])
def test_gpus_that_are_no_devices_are_refused(value):
    assert _errors({"script": "p.py", "peers": [{"id": "a", "gpus": value}]}) == [
        f"peers[0] (id 'a'): `gpus` must be a device list such as \"0,1\", 0 or [0, 1], got {value!r}"
    ]


@pytest.mark.parametrize(
    "value, shown", [("0,1", "0,1"), ([0, 1], "0,1"), (0, "0"), ("GPU-8f2c-11ab", "GPU-8f2c-11ab")]
)
def test_gpu_lists_and_uuids_are_kept(value, shown):
    assert load_swarm_config({"script": "p.py", "peers": [{"id": "a", "gpus": value}]}).peers[0].gpus == shown


def test_duplicate_ids_are_reported_together_with_every_other_problem():
    raw = {
        "script": TINY,
        "args": {"peer_timeout": 0},
        "peers": [{"id": "a", "args": {"learning_rat": 1}}, {"id": "a", "lora": "yes"}, {"id": "b", "gpus": "two"}],
    }
    errors = _errors(raw)
    assert len(errors) == 5, errors
    assert errors[0].startswith("top level: `args.peer_timeout`")
    assert errors[1].startswith("peers[0] (id 'a'): unknown argument `args.learning_rat`")
    assert "peers[1] (id 'a'): duplicate `id` 'a' (also used by peers[0])" in errors
    assert any(e.startswith("peers[1] (id 'a'): `lora` must be true or false") for e in errors)
    assert errors[-1].startswith("peers[2] (id 'b'): `gpus` must be a device list")


# ----------------------------------------------------------------------------------------------------------------
# 7. secrets written in the config
# ----------------------------------------------------------------------------------------------------------------


def test_a_secret_written_in_the_config_is_warned_about_once(tmp_path, capsys):
    secret = "s3cr3t-in-yaml"
    raw = {
        "script": PEER,
        "run_dir": str(tmp_path / "run"),
        "args": {"swarm_secret": secret},
        "env": {"HF_TOKEN": secret},
        "peers": [{"id": "a"}, {"id": "b"}],
    }
    assert run_swarm(load_swarm_config(raw), grace=1, stream=io.StringIO()) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("warning: `args.swarm_secret` holds a secret written in the config, for every peer")
    assert "export FTIS_SWARM_SECRET in your shell instead" in warnings[0]
    assert warnings[1].startswith("warning: `env.HF_TOKEN` holds a secret")
    assert secret not in err
    # --dry-run says so too, as comment lines of what it prints.
    shown = io.StringIO()
    assert dry_run(load_swarm_config(raw), stream=shown) == 0
    assert [line for line in shown.getvalue().splitlines() if line.startswith("# warning:")] == [
        f"# {line}" for line in warnings
    ]
    assert secret not in shown.getvalue()


def test_no_warning_without_secrets(tmp_path, capsys):
    raw = {"script": PEER, "run_dir": str(tmp_path / "run"), "args": {"lines": 1}, "peers": [{"id": "a"}]}
    assert run_swarm(load_swarm_config(raw), grace=1, stream=io.StringIO()) == 0
    assert "warning:" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# 8. an unreachable Redis
# ----------------------------------------------------------------------------------------------------------------


def test_an_unreachable_redis_fails_in_seconds_without_showing_its_password(tmp_path, capsys):
    script, marker = _ftis_script(tmp_path)
    port = _closed_port()
    run = tmp_path / "run"
    raw = {
        "script": script,
        "run_dir": str(run),
        "exchange_url": f"redis://:hunter2-pw@127.0.0.1:{port}/0",
        "peers": [{"id": "a"}, {"id": "b"}],
    }
    config = load_swarm_config(raw)
    with pytest.raises(SwarmConfigError) as info:  # refused at the check, not retried for ever (the hang guard)
        returns_within(lambda: run_swarm(config, grace=1, stream=io.StringIO()), what="the swarm's start")
    assert info.value.errors == [f"cannot reach Redis at redis://:<redacted>@127.0.0.1:{port}/0: Connection refused"]
    assert "hunter2-pw" not in str(info.value)
    assert not run.exists() and not marker.exists()  # no peer started
    # The CLI says it in one line and exits 2.
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["swarm", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Redis at redis://:<redacted>@127.0.0.1" in err and "hunter2-pw" not in err
    assert not run.exists() and not marker.exists()


def test_a_server_that_is_not_redis_is_caught_too():
    pytest.importorskip("redis")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def hang_up():
        connection, _ = server.accept()
        connection.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        problem = reach_problem(f"redis://127.0.0.1:{server.getsockname()[1]}/0", timeout=3)
    finally:
        thread.join(5)
        server.close()
    assert problem is not None and problem.startswith("cannot reach Redis at redis://127.0.0.1:")


def test_a_reachable_redis_passes(redis_url):
    assert reach_problem(redis_url) is None
    # ?swarm= and ?connect_timeout= are the transport's own, not redis-py's (which refused them: "unexpected keyword").
    joiner = "&" if "?" in redis_url else "?"
    assert reach_problem(f"{redis_url}{joiner}swarm=run-1&connect_timeout=2") is None


def test_for_unknown_scripts_an_unreachable_redis_is_only_a_warning(tmp_path, capsys):
    # The fixture peer never connects: the launcher cannot know whether a script of unknown options uses the exchange.
    raw = {
        "script": PEER,
        "run_dir": str(tmp_path / "run"),
        "exchange_url": f"redis://127.0.0.1:{_closed_port()}/0",
        "peers": [{"id": "a"}],
    }
    assert run_swarm(load_swarm_config(raw), grace=1, stream=io.StringIO()) == 0
    err = capsys.readouterr().err
    assert "warning: cannot reach Redis at redis://127.0.0.1:" in err and "starting anyway" in err


def test_the_launchers_own_exchange_is_not_probed(tmp_path, monkeypatch):
    # The default dir:// exchange: nothing to reach.
    config = load_swarm_config({"script": PEER, "run_dir": str(tmp_path / "run"), "peers": [{"id": "a"}]})
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed"))
    assert run_swarm(config, grace=1, stream=io.StringIO()) == 0
    assert os.path.isdir(tmp_path / "run")


def test_a_secret_or_keys_given_to_some_peers_only_stop_the_swarm_before_it_starts(tmp_path, capsys, monkeypatch):
    """One-sided credentials would make the peers refuse each other's messages for a whole run (each round waiting
    `peer_timeout`): said before anything starts, naming the peers, never the values."""
    from trl_ftis.launcher.preflight import credential_problems

    monkeypatch.delenv("FTIS_SWARM_SECRET", raising=False)
    run = tmp_path / "run"
    raw = {
        "script": PEER,
        "run_dir": str(run),
        "peers": [{"id": "a", "env": {"FTIS_SWARM_SECRET": "s3cret-value"}}, {"id": "b"}, {"id": "c"}],
    }
    assert credential_problems(load_swarm_config(raw)) == [
        "a swarm secret is given to a but not to b, c: the peers with one refuse every message of the others "
        "(unsigned) and the others cannot check theirs; give every peer the same secret (export FTIS_SWARM_SECRET in "
        "the shell that runs the launcher)"
    ]
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["swarm", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot start the swarm" in err and "given to a but not to b, c" in err and "s3cret-value" not in err
    assert not run.exists()
    # From the launcher's environment every peer has it; two different ones are refused too, values unshown.
    monkeypatch.setenv("FTIS_SWARM_SECRET", "shared")
    assert credential_problems(load_swarm_config(raw)) == [
        "the peers are given different swarm secrets (values not shown): each refuses the others' messages "
        "(signature); give every peer the same one"
    ]
    raw["peers"][0]["env"] = {}
    assert credential_problems(load_swarm_config(raw)) == []
    keys = {
        **raw,
        "peers": [{"id": "a", "args": {"private_key_file": "a.key", "peer_keys_file": "p.yaml"}}, {"id": "b"}],
    }
    problems = credential_problems(load_swarm_config(keys))
    assert len(problems) == 2 and all("set for a but not for b" in problem for problem in problems)
    controls = {**raw, "controls": ["alone"]}  # a control trains alone: it needs no secret
    assert credential_problems(load_swarm_config(controls)) == []


def test_a_hub_id_in_the_local_cache_loads_offline_and_is_no_problem(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from trl_ftis.model_paths import hub_model_problem

    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert hub_model_problem("org/cached") is None
    assert "no Hub access" in hub_model_problem("org/absent")
