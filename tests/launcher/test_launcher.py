"""`trl-ftis swarm`: config validation, command building, dry run, and real runs of tiny stand-in peers.

The peers are `tests/fixtures/swarm_peer.py` (standard library only), so a whole swarm starts in a fraction of a
second. Every process a test starts writes its pid to a file; the tests check those pids are gone (a zombie counts
as gone: it has exited, only its parent has not collected it yet) and kill any survivor afterwards.
"""

import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from pids import alive, written_pids
from waits import PROCESS_HANG_GUARD, returns_within

from trl_ftis import cli, launcher
from trl_ftis.exchange.transports.registry import transport_kind, transport_schemes
from trl_ftis.launcher import SwarmConfigError, build_commands, load_swarm_config, local, render_args, run_swarm
from trl_ftis.launcher.summary import TABLE_COLUMNS, read_peer_summary
from trl_ftis.peer_ids import PEER_ID_RULE, is_peer_id, peer_id_problem

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _config(tmp_path, peers, **top):
    raw = {"script": PEER, "run_dir": str(tmp_path / "run"), "peers": peers}
    raw.update(top)
    return raw


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"script": "p.py"}, ["top level", "`peers` is missing"]),
        ({"script": "p.py", "peers": []}, ["`peers` must be a non-empty list"]),
        ({"script": "p.py", "peers": [{"id": "a"}, {"id": "a"}]}, ["peers[1] (id 'a')", "duplicate `id` 'a'"]),
        ({"script": "p.py", "peers": [{"id": "a b"}]}, ["peers[0] (id 'a b')", "invalid `id`", PEER_ID_RULE]),
        ({"script": "p.py", "peers": [{"id": ".."}]}, ["peers[0] (id '..')", "invalid `id`"]),
        ({"script": "p.py", "peers": [{"id": "x" * 65}]}, ["invalid `id`", "1-64 characters, got 65"]),
        ({"script": "p.py", "peers": [{"id": 3}]}, ["peers[0]", "invalid `id`", "must be a string, got int"]),
        ({"script": "p.py", "peers": [{"model": "m"}]}, ["peers[0]", "`id` is missing"]),
        (
            {"script": "p.py", "peer": [], "peers": [{"id": "a"}]},
            ["top level", "unknown key `peer`", "did you mean `peers`"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "a", "lorra": True}]},
            ["peers[0] (id 'a')", "unknown key `lorra`", "`lora`"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "a"}, {"id": "b", "accelerate_config": "c.yaml"}]},
            ["peers[1] (id 'b')", "`accelerate_config` needs `launcher: accelerate`"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "b", "num_processes": 2}]},
            ["peers[0] (id 'b')", "`num_processes` needs `launcher: accelerate`"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "a", "env": {"FOO": {"x": 1}}}]},
            ["peers[0] (id 'a')", "env.FOO", "dict"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "a", "env": {"FOO": [1, 2]}}]},
            ["peers[0] (id 'a'): `env.FOO` must be a string or a number, got list [1, 2]"],
        ),
        ({"script": "p.py", "peers": [{"id": "a", "env": {"FOO": True}}]}, ["env.FOO", "quote it"]),
        ({"script": "p.py", "env": {"FOO": None}, "peers": [{"id": "a"}]}, ["top level", "env.FOO", "NoneType"]),
        (
            {"script": "p.py", "peers": [{"id": "a", "env": {"FTIS_PEER_ID": "x"}}]},
            ["peers[0] (id 'a'): `env.FTIS_PEER_ID` is set by the launcher"],
        ),
        (
            {"script": "p.py", "launcher": "torchrun", "peers": [{"id": "a"}]},
            ["top level", "`launcher` must be one of"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "a", "args": {"output_dir": "x"}}]},
            ["peers[0] (id 'a'): `args.output_dir` is set by the launcher"],
        ),
        (
            {"script": "p.py", "args": {"lr": {"a": 1}}, "peers": [{"id": "a"}]},
            ["top level: `args.lr` must be a string, number, boolean, null or a list of those, got dict"],
        ),
        ({"script": "p.py", "args": {"--lr": 1}, "peers": [{"id": "a"}]}, ["not a valid argument name"]),
        (
            {"script": "p.py", "peers": [{"id": "a", "model": "m", "args": {"model_name_or_path": "n"}}]},
            ["peers[0] (id 'a')", "`model` and args.model_name_or_path both set"],
        ),
        ({"script": "p.py", "peers": [{"id": "a", "gpu_share": 1.5}]}, ["peers[0] (id 'a')", "`gpu_share`", "(0, 1]"]),
        (
            {
                "script": "p.py",
                "peers": [{"id": "a", "gpus": 0, "gpu_share": 0.6}, {"id": "b", "gpus": "0", "gpu_share": 0.5}],
            },
            ["'a', 'b'", "add up to 1.1 > 1"],
        ),
        ({"script": "p.py", "peers": [{"id": "a", "gpus": "0;1"}]}, ["`gpus` must be a device list"]),
        ({"peers": [{"id": "a"}]}, ["peers[0] (id 'a')", "no `script`"]),
        (
            {"script": "p.py", "exchange_url": "memory://x", "peers": [{"id": "a"}]},
            ["memory:// only works inside one process"],
        ),
        ({"script": "p.py", "exchange_url": "/tmp/x", "peers": [{"id": "a"}]}, ["`exchange_url` must be a URL"]),
        (
            {"script": "p.py", "exchange_url": "http://u:pw@host/x", "peers": [{"id": "a"}]},
            ["`exchange_url` must be a URL", "dir://, redis://, rediss://", "http://u:<redacted>@host/x"],
        ),
    ],
)
def test_invalid_config_names_the_peer_and_the_key(raw, expected):
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"


@pytest.mark.parametrize("peer_id", ["-x", ".x", "x..y", "a b", ".", "..", "", "x" * 65, "é", "a/b"])
def test_peer_ids_follow_the_shared_rule(peer_id):
    """The launcher refuses exactly the ids `trl_ftis.peer_ids` refuses (config, wire and transports would too), naming
    the peer and the `id` key, with the rule's own reason."""
    assert peer_id_problem(peer_id) is not None
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config({"script": "p.py", "peers": [{"id": "ok"}, {"id": peer_id}]})
    (error,) = info.value.errors
    assert error.startswith(f"peers[1] (id {peer_id!r}): " if peer_id else "peers[1]: ")
    assert error.endswith(f"invalid `id`: {peer_id_problem(peer_id)}")


def test_accepted_peer_ids():
    ids = ["qwen2.5-1.5b", "node_3", "_a", "A.b-c_d", "x" * 64]
    config = load_swarm_config({"script": "p.py", "peers": [{"id": peer_id} for peer_id in ids]})
    assert [peer.id for peer in config.peers] == ids
    assert all(is_peer_id(peer_id) for peer_id in ids)


def test_exchange_url_follows_the_shared_schemes(tmp_path):
    """Schemes are case-insensitive (as everywhere in trl-ftis); in-process schemes are refused with a hint."""
    assert load_swarm_config(_config(tmp_path, [{"id": "a"}], exchange_url="REDIS://h:6379/0")).exchange_url == (
        "redis://h:6379/0"
    )
    assert load_swarm_config(_config(tmp_path, [{"id": "a"}], exchange_url="Dir:///x/y")).exchange_url == "dir:///x/y"
    in_process = [s for s in transport_schemes() if transport_kind(f"{s}://").in_process]
    assert in_process == ["memory"]
    for scheme in in_process:
        with pytest.raises(SwarmConfigError, match=f"{scheme}:// only works inside one process"):
            load_swarm_config(_config(tmp_path, [{"id": "a"}], exchange_url=f"{scheme.upper()}://x"))
    with pytest.raises(SwarmConfigError, match="dir:// needs a directory"):
        load_swarm_config(_config(tmp_path, [{"id": "a"}], exchange_url="dir://"))


def test_every_problem_is_reported_at_once():
    raw = {"script": "p.py", "bogus": 1, "peers": [{"id": "a", "env": {"X": []}}, {"id": "b", "lora": "yes"}]}
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    assert len(info.value.errors) == 3
    assert any("peers[1] (id 'b')" in e and "`lora`" in e for e in info.value.errors)


def test_yaml_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("peers: [id: a\n")
    with pytest.raises(SwarmConfigError, match="bad.yaml is not valid YAML"):
        load_swarm_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(SwarmConfigError, match="empty"):
        load_swarm_config(empty)
    with pytest.raises(SwarmConfigError, match="cannot read"):
        load_swarm_config(tmp_path / "missing.yaml")


def test_yaml_defaults_run_dir_and_exchange(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "my-swarm.yaml"
    path.write_text(
        yaml.safe_dump({"script": "peer.py", "env": {"OMP_NUM_THREADS": 1, "X": 0.5}, "peers": [{"id": "a"}]})
    )
    config = load_swarm_config(path)
    assert config.run_dir == tmp_path / "runs" / "my-swarm"
    # The default exchange is absolute, so every peer and every log names the same directory.
    assert config.exchange_url == f"dir://{tmp_path}/runs/my-swarm/exchange"
    assert config.exchange_url.startswith("dir:///")
    assert config.peers[0].script == tmp_path / "peer.py"
    assert config.peers[0].env == {"OMP_NUM_THREADS": "1", "X": "0.5"}
    # --run-dir wins over the default and over the config's run_dir; a relative dir:// exchange is made absolute.
    path.write_text(
        yaml.safe_dump({"script": "p.py", "run_dir": "cfg", "exchange_url": "dir://ex", "peers": [{"id": "a"}]})
    )
    assert load_swarm_config(path).run_dir == tmp_path / "cfg"
    config = load_swarm_config(path, run_dir="cli")
    assert config.run_dir == tmp_path / "cli"
    assert config.exchange_url == f"dir://{tmp_path}/ex"


# ----------------------------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------------------------


def test_render_args():
    args = {
        "lr": 0.001,
        "steps": 20,
        "use_peft": True,
        "bf16": False,
        "report_to": ["a", "b"],
        "skip": None,
        "s": "x y",
    }
    assert render_args(args) == [
        "--lr", "0.001", "--steps", "20", "--use_peft", "true", "--bf16", "false",
        "--report_to", "a", "b", "--s", "x y",
    ]  # fmt: skip


def test_python_command(tmp_path):
    config = load_swarm_config(
        _config(
            tmp_path,
            [
                {"id": "big", "model": "org/big", "lora": True, "args": {"seed": 1, "drop": None}},
                {"id": "small", "script": "other.py", "gpus": [1, 2], "gpu_share": 0.45, "env": {"A": "2"}},
            ],
            args={"max_steps": 20, "seed": 0, "drop": "x"},
            env={"A": "1", "CUDA_VISIBLE_DEVICES": "7"},
        )
    )
    big, small = build_commands(config)
    run = tmp_path / "run"
    assert big.argv == [
        sys.executable, PEER,
        "--peer_id", "big", "--exchange_url", f"dir://{run}/exchange", "--output_dir", str(run / "big"),
        "--max_steps", "20", "--seed", "1", "--model_name_or_path", "org/big", "--use_peft", "true",
        "--project", "run",  # trackio groups the swarm's runs under the run directory's name
    ]  # fmt: skip
    assert big.env == {
        "FTIS_PEER_ID": "big", "PYTHONUNBUFFERED": "1", "A": "1", "CUDA_VISIBLE_DEVICES": "7",
        "WANDB_RUN_GROUP": "run",
        "FTIS_CONSOLE": "lines",  # one short line per logged step (trl_ftis.console)
    }  # fmt: skip
    assert small.argv[1] == os.path.abspath("other.py")
    # gpu_share is sugar for args.gpu_memory_fraction (FTISConfig caps the peer's GPU memory to it), after the args.
    assert small.argv[-10:] == [
        "--max_steps", "20", "--seed", "0", "--drop", "x", "--gpu_memory_fraction", "0.45", "--project", "run",
    ]  # fmt: skip
    # gpus wins over a top-level CUDA_VISIBLE_DEVICES; a peer's env wins over the top-level env.
    assert small.env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert small.env["FTIS_PEER_ID"] == "small" and small.env["A"] == "2"
    assert config.peers[1].args["gpu_memory_fraction"] == 0.45 and "gpu_memory_fraction" not in config.peers[0].args
    assert "--gpu_memory_fraction" not in big.argv
    assert not any("GPU_MEMORY" in name for command in (big, small) for name in command.env)  # a flag, not the env
    assert (big.log_path, big.cmd_path, big.main_process_port) == (run / "logs/big.log", run / "logs/big.cmd", None)


def test_accelerate_commands_get_unique_ports(tmp_path):
    (tmp_path / "ddp.yaml").write_text("{}")
    peers = [{"id": f"p{i}"} for i in range(4)]
    peers[0].update(accelerate_config=str(tmp_path / "ddp.yaml"), num_processes=2)
    peers[3]["launcher"] = "python"
    config = load_swarm_config(_config(tmp_path, peers, launcher="accelerate", args={"lr": 0.5}))
    commands = build_commands(config)
    first = commands[0].argv
    port = commands[0].main_process_port
    assert first[:9] == [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "ddp.yaml"),
        "--num_processes", "2", "--main_process_port", str(port),
    ]  # fmt: skip
    assert first[9:] == [PEER, "--peer_id", "p0", "--exchange_url", config.exchange_url, "--output_dir",
                         str(tmp_path / "run" / "p0"), "--lr", "0.5", "--project", "run"]  # fmt: skip
    assert commands[1].argv[3:6] == ["--main_process_port", str(commands[1].main_process_port), PEER]
    ports = [c.main_process_port for c in commands[:3]]
    assert len(set(ports)) == 3 and all(1024 <= p <= 65535 for p in ports)
    assert commands[3].main_process_port is None and commands[3].argv[:2] == [sys.executable, PEER]


def test_dry_run_prints_commands_and_hides_secrets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FTIS_SWARM_SECRET", "s3cr3t-value-1")
    path = tmp_path / "swarm.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "script": PEER,
                "exchange_url": "redis://:p4ssw0rd@localhost:6379/0",
                "env": {"HF_TOKEN": "hf_tokenvalue", "OMP_NUM_THREADS": "1"},
                "peers": [{"id": "a", "args": {"hub_token": "tok-abc"}}, {"id": "b", "launcher": "accelerate"}],
            }
        )
    )
    run_dir = tmp_path / "never-created"
    assert cli.main(["swarm", str(path), "--run-dir", str(run_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{PEER} --peer_id a --exchange_url 'redis://:<redacted>@localhost:6379/0'" in out
    assert "accelerate.commands.launch --main_process_port" in out and "--peer_id b" in out
    assert "OMP_NUM_THREADS=1" in out and "FTIS_PEER_ID=b" in out
    assert "FTIS_SWARM_SECRET=<redacted>" in out and "HF_TOKEN=<redacted>" in out
    assert "--hub_token" not in out  # passed as HF_TOKEN, never on the command line
    for secret in ("s3cr3t-value-1", "hf_tokenvalue", "p4ssw0rd", "tok-abc"):
        assert secret not in out
    assert not run_dir.exists()
    assert launcher.redact_env({"TOKENIZERS_PARALLELISM": "false", "db_password": "x"}) == {
        "TOKENIZERS_PARALLELISM": "false",
        "db_password": "<redacted>",
    }


def test_cli_reports_config_errors(tmp_path, capsys):
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump({"script": PEER, "peers": [{"id": "a", "lora": 3}]}))
    assert cli.main(["swarm", str(path), "--dry-run"]) == 2
    assert "peers[0] (id 'a'): `lora` must be true or false" in capsys.readouterr().err
    assert cli.main(["swarm", str(path), "--grace", "-1"]) == 2
    assert cli.main([]) == 2


def test_missing_script_is_refused_before_anything_starts(tmp_path):
    config = load_swarm_config(_config(tmp_path, [{"id": "a", "script": str(tmp_path / "nope.py")}]))
    with pytest.raises(SwarmConfigError, match="peer 'a': script .*nope.py does not exist"):
        run_swarm(config, stream=io.StringIO())
    assert not (tmp_path / "run").exists()


def test_peer_summary_reading_never_raises(tmp_path):
    path = tmp_path / "ftis_summary.json"
    assert read_peer_summary(path, None) == (None, None)
    path.write_text("[1, 2]")
    assert "not hold a JSON object" in read_peer_summary(path, None)[1]
    path.write_text(json.dumps({"steps": 3}))
    assert "older than this run" in read_peer_summary(path, time.time() + 60)[1]
    fields, note = read_peer_summary(path, time.time())
    assert fields["steps"] == 3 and fields["reward"] is None and note is None
    path.unlink()
    path.mkdir()  # unreadable as a file
    assert "could not read" in read_peer_summary(path, None)[1]


# ----------------------------------------------------------------------------------------------------------------
# Real runs
# ----------------------------------------------------------------------------------------------------------------


def test_real_run_streams_logs_and_writes_summary(tmp_path, pid_dir, monkeypatch):
    monkeypatch.setenv("FTIS_SWARM_SECRET", "swarm-secret-xyz")
    peers = [
        {"id": "alpha", "args": {"summary": "good"}},
        {"id": "b", "args": {"summary": "partial", "use_flag": True}, "gpus": "3"},
        {"id": "c3", "args": {"summary": "malformed"}},
    ]
    config = load_swarm_config(
        _config(tmp_path, peers, args={"lines": 3, "hold": 0.2, "pid_dir": str(pid_dir)}, env={"MY_TOKEN": "tok-1"})
    )
    out = io.StringIO()
    assert run_swarm(config, grace=2, stream=out) == 0
    text = out.getvalue()
    run = tmp_path / "run"

    # Console: every peer line prefixed with its id, padded so that output columns line up.
    for peer in ("alpha", "b", "c3"):
        lines = [line for line in text.splitlines() if line.startswith(f"[{peer}] ")]
        assert [line[8:] for line in lines][3:6] == ["line 0", "line 1", "line 2"]
        assert all(line.startswith(f"[{peer}]".ljust(7) + " ") for line in lines)
        # Log: the same lines, unprefixed.
        log = (run / "logs" / f"{peer}.log").read_text().splitlines()
        assert log[0] == f"hello from {peer} env={peer} exchange=dir://{run}/exchange"
        assert log[3:6] == ["line 0", "line 1", "line 2"] and log[-1] == f"done {peer}"
        assert [line[8:] for line in lines] == log
        cmd = (run / "logs" / f"{peer}.cmd").read_text()
        assert f"--peer_id {peer}" in cmd and "MY_TOKEN='<redacted>'" in cmd
        assert "FTIS_SWARM_SECRET" not in cmd  # the caller's environment is theirs: only the additions are written
        assert "swarm-secret-xyz" not in cmd and "tok-1" not in cmd
    log_b = (run / "logs" / "b.log").read_text()
    assert "cuda=3" in log_b and "--use_flag true" in log_b
    assert "secret_len=16" in log_b  # passed through to the peer, never printed
    assert "swarm-secret-xyz" not in text

    table = text[text.index("peer   ") :]
    header = re.split(r"\s{2,}", table.splitlines()[0].strip())  # columns are 2 spaces apart; `ess rows` is one
    assert header == ["peer", "status", "exit", "wall", *(name for name, _ in TABLE_COLUMNS)]
    rows_text = [line for line in table.splitlines()[:5]]  # the header, its rule and the three peers
    assert max(len(line) for line in rows_text) <= 120, rows_text  # fits a 120-column terminal
    alpha_row = next(line for line in table.splitlines() if line.startswith("alpha"))
    # `drop` sums the peer's counts by reason; `gen` and `ess rows` are the ledger's, read from nested entries of the
    # peer's summary file (all the fields are in summary.json).
    assert alpha_row.split()[:2] == ["alpha", "ok"]
    assert alpha_row.split()[-10:] == ["20", "160", "320", "300", "20", "0.8125", "25%", "-", "150", "-"]
    b_row = next(line for line in table.splitlines() if line.startswith("b "))
    assert b_row.split()[-10:] == ["7", "-", "-", "-", "-", "0.5", "-", "-", "-", "-"]
    assert "note: c3: could not read" in table

    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_code"] == 0
    rows = {row["id"]: row for row in summary["peers"]}
    assert rows["alpha"]["rows_accepted"] == 300 and rows["alpha"]["exit_code"] == 0
    alpha = rows["alpha"]
    assert (alpha["rows_dropped"], alpha["messages_refused"], alpha["warning"]) == (20, 2, None)
    assert rows["b"]["rows_dropped"] is None and rows["b"]["messages_refused"] is None and rows["b"]["warning"] is None
    assert "warning:" not in text  # a healthy exchange (and a summary that says nothing of one) warns of nothing
    assert rows["b"]["steps"] == 7 and rows["b"]["rows_sent"] is None
    assert rows["c3"]["steps"] is None and "could not read" in rows["c3"]["note"]
    assert all(0 < row["wall_time_s"] < 10 and row["status"] == "ok" for row in rows.values())
    assert not any(alive(pid) for pid in written_pids(pid_dir).values())


def test_accelerate_peer_runs(tmp_path, pid_dir):
    """The real `accelerate launch` command line: flags before the script, the peer's own arguments after it."""
    pytest.importorskip("accelerate")
    peers = [{"id": "acc", "launcher": "accelerate", "num_processes": 1, "args": {"summary": "good"}}, {"id": "py"}]
    config = load_swarm_config(_config(tmp_path, peers, args={"lines": 1, "pid_dir": str(pid_dir)}))
    out = io.StringIO()
    assert run_swarm(config, grace=2, stream=out) == 0, out.getvalue()
    log = (tmp_path / "run" / "logs" / "acc.log").read_text()
    assert f"hello from acc env=acc exchange=dir://{tmp_path}/run/exchange" in log and "done acc" in log
    assert (
        "accelerate.commands.launch --num_processes 1 --main_process_port"
        in (tmp_path / "run/logs/acc.cmd").read_text()
    )
    rows = json.loads((tmp_path / "run" / "summary.json").read_text())["peers"]
    assert [(r["id"], r["status"], r["steps"]) for r in rows] == [("acc", "ok", 20), ("py", "ok", None)]


def test_failing_peer_stops_the_others_quickly(tmp_path, pid_dir):
    peers = [
        {"id": "crash", "args": {"exit_code": 3, "wait_for": str(pid_dir / "sleeper.pid")}},
        {"id": "sleeper", "args": {"hold": 3600}},
    ]
    config = load_swarm_config(_config(tmp_path, peers, args={"pid_dir": str(pid_dir)}))
    out = io.StringIO()
    # The sleeper exits on SIGTERM: waiting for the 600 s grace, let alone its hour-long sleep, trips the hang guard.
    code = returns_within(lambda: run_swarm(config, grace=600, stream=out), PROCESS_HANG_GUARD, "the swarm")
    assert code == 1
    assert not alive(written_pids(pid_dir)["sleeper"])
    assert "peer crash exited with code 3; stopping the other peers" in out.getvalue()
    assert (
        f"(resume the swarm from its checkpoints with `trl-ftis swarm CONFIG --run-dir {tmp_path / 'run'} --resume`)"
        in (out.getvalue())
    )  # a config given as a dict has no file to name
    rows = {row["id"]: row for row in json.loads((tmp_path / "run" / "summary.json").read_text())["peers"]}
    assert (rows["crash"]["status"], rows["crash"]["exit_code"]) == ("failed", 3)
    assert (rows["sleeper"]["status"], rows["sleeper"]["exit_code"]) == ("stopped", -signal.SIGTERM)


def test_peer_that_cannot_start_stops_the_started_ones(tmp_path, pid_dir, monkeypatch):
    real_popen = subprocess.Popen

    def popen(argv, **kwargs):
        if "b" in argv and argv[argv.index("b") - 1] == "--peer_id":
            raise PermissionError(13, "Permission denied", argv[0])
        return real_popen(argv, **kwargs)

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    peers = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    config = load_swarm_config(_config(tmp_path, peers, args={"hold": 3600, "pid_dir": str(pid_dir)}))
    out = io.StringIO()
    # a stops at once on SIGTERM: waiting for its hour-long hold or the 600 s grace trips the hang guard
    code = returns_within(lambda: run_swarm(config, grace=600, stream=out), PROCESS_HANG_GUARD, "the swarm")
    assert code == 1
    assert "peer b: could not start: [Errno 13] Permission denied" in out.getvalue()
    rows = {row["id"]: row for row in json.loads((tmp_path / "run" / "summary.json").read_text())["peers"]}
    assert [rows[p]["status"] for p in "abc"] == ["stopped", "failed to start", "not started"]
    assert rows["a"]["exit_code"] is not None
    assert not any(alive(pid) for pid in written_pids(pid_dir).values())


@pytest.mark.parametrize(
    "child, crash",
    [("group", True), ("session", True), ("group", False), ("session", False)],
    ids=["same-group-on-failure", "own-session-on-failure", "same-group-left-behind", "own-session-left-behind"],
)
def test_sigterm_ignoring_grandchild_is_killed(tmp_path, pid_dir, child, crash):
    """A peer's child that ignores SIGTERM gets SIGKILL after the grace period, whether it stayed in the peer's
    process group or moved to its own session (as torchrun workers do), whether the swarm failed or succeeded."""
    if child == "session" and not os.path.exists("/proc/self/stat"):
        pytest.skip("finding processes outside the peer's process group needs /proc")
    # hold 1 s: the launcher sees the child while its parent is still alive, then the parent exits and leaves it.
    peers = [{"id": "parent", "args": {"child": child, "hold": 60 if crash else 1.0}}]
    if crash:
        peers.append({"id": "crash", "args": {"exit_code": 2, "wait_for": str(pid_dir / "parent.pid")}})
    config = load_swarm_config(_config(tmp_path, peers, args={"pid_dir": str(pid_dir)}))
    out = io.StringIO()
    start = time.monotonic()
    code = returns_within(lambda: run_swarm(config, grace=1, stream=out), PROCESS_HANG_GUARD, "the swarm")
    assert code == (1 if crash else 0)
    elapsed = time.monotonic() - start
    pids = written_pids(pid_dir)
    assert not alive(pids["parent.child"]) and not alive(pids["parent"])
    assert elapsed >= 1.0, out.getvalue()  # SIGKILL only after the grace period (a lower bound)
    assert "sending SIGKILL" in out.getvalue()


def _start_cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trl_ftis.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return proc, lines


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_launcher_stops_everything(tmp_path, pid_dir, sig):
    config = _config(
        tmp_path,
        [{"id": "a"}, {"id": "b", "args": {"child": "group"}}],
        args={"hold": 60, "pid_dir": str(pid_dir)},
    )
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(config))
    proc, lines = _start_cli(["swarm", str(path), "--grace", "1"], tmp_path)
    seen = []
    try:
        ready = set()
        deadline = time.monotonic() + 30
        while ready != {"a", "b"}:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            seen.append(line)
            for peer in ("a", "b"):
                if line.startswith(f"[{peer}] ") and line.rstrip().endswith("ready"):
                    ready.add(peer)
        pids = written_pids(pid_dir)
        assert set(pids) == {"a", "b", "b.child"}
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.2)  # the reader thread drains the last lines
    while not lines.empty():
        seen.append(lines.get())
    output = "".join(seen)
    assert f"interrupted by {sig.name}" in output
    running = {name: pid for name, pid in pids.items() if alive(pid)}
    assert not running, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exit_code"] == 130 and {row["status"] for row in summary["peers"]} == {"stopped"}


def test_cli_is_light_and_has_help():
    code = (
        "import sys, trl_ftis.cli as c\n"
        # What the launcher runs to the end of a swarm (the summary, --only/--resume, the exchange warnings) too.
        "import trl_ftis.launcher, trl_ftis.launcher.summary, trl_ftis.launcher.restart, trl_ftis.exchange_report\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'accelerate', 'peft', 'datasets') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert c.main(['--help']) == 0 and c.main(['swarm', '--help']) == 0\n"
    )
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "trl-ftis swarm" in result.stdout and "--dry-run" in result.stdout


def test_tracker_grouping_yields_to_the_user(tmp_path, monkeypatch):
    """The swarm's runs are grouped (wandb group, trackio project) unless the user chose a group or project."""
    monkeypatch.setenv("WANDB_RUN_GROUP", "mine")
    config = load_swarm_config(_config(tmp_path, [{"id": "a"}, {"id": "b", "args": {"project": "own"}}]))
    a, b = build_commands(config)
    assert "WANDB_RUN_GROUP" not in a.env and "WANDB_RUN_GROUP" not in b.env  # inherited from the launcher's env
    assert a.argv[-2:] == ["--project", "run"]
    assert b.argv.count("--project") == 1 and b.argv[b.argv.index("--project") + 1] == "own"
