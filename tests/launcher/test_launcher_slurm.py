"""`launcher: slurm`: the schema of the `slurm` / `redis` keys, the dry run and the in-job code (no SLURM needed), and
real swarms on a real SLURM cluster (`slurm` marker; the `slurm_cluster` fixture starts one on localhost as root, or
the tests skip with the reason).

The SLURM tests run the launcher as `python -m trl_ftis.cli swarm` in a subprocess (a hard timeout each, and the
fixture cancels whatever a failed test leaves), and check through `squeue` that none of the swarm's jobs is left.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from redis_jobs import redis_job_in, run_pickled  # tests/ is on sys.path

from trl_ftis import cli
from trl_ftis.launcher import SwarmConfigError, build_commands, dry_run, load_swarm_config, run_swarm
from trl_ftis.launcher.slurm.backend import LogTail
from trl_ftis.launcher.slurm.cli import squeue
from trl_ftis.launcher.slurm.jobs import PeerJob, answers_ping
from trl_ftis.launcher.slurm.schema import REDIS_JOB_EXCHANGE, SlurmResources, parse_slurm_time
from trl_ftis.launcher.slurm.watch import TERMINAL_STATES
from trl_ftis.launcher.summary import SUMMARY_FIELDS, format_summary_table

# `make test` runs on two pytest-xdist workers (`--dist loadgroup`): this module's tests share one, so that the
# throwaway SLURM cluster starts once and never twice side by side.
pytestmark = pytest.mark.xdist_group("slurm")

ROOT = Path(__file__).resolve().parents[2]
PEER = str(ROOT / "tests" / "fixtures" / "swarm_peer.py")
TINY_PEER = str(ROOT / "examples" / "tiny_peer.py")
EXAMPLE = ROOT / "examples" / "swarms" / "slurm_two_nodes.yaml"
HAS_SUBMITIT = importlib.util.find_spec("submitit") is not None  # dry runs show submitit's script only with it


def _slurm(peers, **top):
    raw = {"launcher": "slurm", "script": "p.py", "peers": peers}
    raw.update(top)
    return raw


# ----------------------------------------------------------------------------------------------------------------
# Schema (no SLURM needed)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        (
            {"script": "p.py", "peers": [{"id": "a", "launcher": "slurm"}]},
            ["peers[0] (id 'a')", "`launcher: slurm` is for the whole swarm", "top level"],
        ),
        ({"script": "p.py", "launcher": "slurmm", "peers": [{"id": "a"}]}, ["`launcher` must be one of", "slurm"]),
        (
            _slurm([{"id": "a"}], slurm={"gpu": 1}),
            ["top level", "unknown key `slurm.gpu`", "did you mean `slurm.gpus`"],
        ),
        (_slurm([{"id": "a", "slurm": {"nodes": 0}}]), ["peers[0] (id 'a')", "`slurm.nodes` must be an integer >= 1"]),
        (_slurm([{"id": "a", "slurm": {"gpus": -1}}]), ["peers[0] (id 'a')", "`slurm.gpus` must be an integer >= 0"]),
        (_slurm([{"id": "a", "slurm": {"gpus": True}}]), ["`slurm.gpus` must be an integer"]),
        (_slurm([{"id": "a"}], slurm={"cpus": "4"}), ["top level", "`slurm.cpus` must be an integer >= 1"]),
        (_slurm([{"id": "a", "slurm": {"mem": "lots"}}]), ["peers[0] (id 'a')", "`slurm.mem` must be a memory size"]),
        (_slurm([{"id": "a", "slurm": {"time": "1:75"}}]), ["peers[0] (id 'a')", "`slurm.time` must be minutes"]),
        (_slurm([{"id": "a", "slurm": {"time": 0}}]), ["`slurm.time` must be minutes"]),
        (_slurm([{"id": "a", "slurm": {"time": "soon"}}]), ["`slurm.time`", "'soon'"]),
        (_slurm([{"id": "a", "slurm": {"partition": "a b"}}]), ["peers[0] (id 'a')", "`slurm.partition` must be"]),
        (_slurm([{"id": "a"}], slurm={"account": 3}), ["top level", "`slurm.account` must be"]),
        (_slurm([{"id": "a", "slurm": {"extra": ["-q high"]}}]), ["`slurm.extra[0]`", "long form", "--qos=high"]),
        (
            _slurm([{"id": "a", "slurm": {"extra": ["--time=5"]}}]),
            ["`slurm.extra[0]` --time: use the key `slurm.time`"],
        ),
        (
            _slurm([{"id": "a", "slurm": {"extra": ["--output=x"]}}]),
            ["`slurm.extra[0]` --output is set by the launcher"],
        ),
        (_slurm([{"id": "a"}], slurm={"extra": ["--qos=a", "--qos b"]}), ["`slurm.extra[1]` --qos is given twice"]),
        (  # every bad item at once, not only the first
            _slurm([{"id": "a"}], slurm={"extra": ["--nodes=2", "qos", "--exclusive", "--exclusive"]}),
            [
                "`slurm.extra[0]` --nodes: use the key `slurm.nodes`",
                "`[1]`: write the long form",
                "`[3]`: --exclusive is given twice",
            ],
        ),
        (_slurm([{"id": "a"}], slurm={"extra": ["--qos="]}), ["`slurm.extra[0]`", "has no value"]),
        (_slurm([{"id": "a"}], slurm={"extra": {"qos": "high"}}), ["`slurm.extra` must be a list of sbatch options"]),
        (_slurm([{"id": "a"}], slurm={"setup": 5}), ["top level", "`slurm.setup` must be shell lines"]),
        (_slurm([{"id": "a"}], slurm=["gpus"]), ["top level", "`slurm` must be a mapping"]),
        (
            _slurm([{"id": "a"}, {"id": "b", "slurm": {"nodes": 2}}]),
            ["peers[1] (id 'b')", "`slurm.nodes` is 2", "launcher: accelerate"],
        ),
        (_slurm([{"id": "a", "gpus": "0"}]), ["peers[0] (id 'a')", "`gpus` picks devices", "`slurm.gpus`"]),
        (
            {"script": "p.py", "slurm": {"gpus": 1}, "peers": [{"id": "a"}]},
            ["top level", "`slurm` is only used on SLURM", "launcher: slurm"],
        ),
        (
            {"script": "p.py", "peers": [{"id": "a", "slurm": {"gpus": 1}}]},
            ["peers[0] (id 'a')", "`slurm` is only used on SLURM"],
        ),
        ({"script": "p.py", "redis": {"start": True}, "peers": [{"id": "a"}]}, ["`redis` is only used on SLURM"]),
        (
            _slurm([{"id": "a"}], exchange_url="redis://h:6379/0", redis={"start": True}),
            ["top level", "`exchange_url` and `redis.start: true` both set"],
        ),
        (
            _slurm([{"id": "a"}], redis={"password": "hunter2"}),
            ["`redis.password` must be true or false", "never write"],
        ),
        (_slurm([{"id": "a"}], redis={"port": 70000}), ["`redis.port` must be a TCP port"]),
        (_slurm([{"id": "a"}], redis={"start": "yes"}), ["`redis.start` must be true or false"]),
        (_slurm([{"id": "a"}], redis={"gpus": 1}), ["unknown key `redis.gpus`", "one CPU job on one node"]),
        (_slurm([{"id": "a"}], redis={"start_timeout": 0}), ["`redis.start_timeout` must be a number of seconds"]),
        (_slurm([{"id": "a"}], redis={"server": ""}), ["`redis.server` must be the redis-server program"]),
        (_slurm([{"id": "a"}], redis={"time": "x"}), ["`redis.time` must be minutes"]),
        (_slurm([{"id": "a"}], redis="yes"), ["`redis` must be a mapping"]),
    ],
)
def test_invalid_slurm_config_names_the_peer_and_the_key(raw, expected):
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"


def test_slurm_password_never_appears_in_the_error():
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(_slurm([{"id": "a"}], redis={"password": "hunter2"}))
    assert "hunter2" not in str(info.value)


def test_slurm_resources_merge_key_by_key(tmp_path):
    config = load_swarm_config(
        _slurm(
            [
                {"id": "a"},
                {"id": "b", "launcher": "accelerate", "slurm": {"nodes": 2, "gpus": 4, "partition": None}},
            ],
            run_dir=str(tmp_path / "run"),
            slurm={
                "gpus": 1,
                "cpus": 8,
                "mem": "64g",
                "time": "04:00:00",
                "partition": "gpu",
                "account": "proj",
                "extra": ["--qos=high", "#SBATCH --exclusive", "--constraint a100"],
                "setup": "module load cuda\n\nsource env.sh",
            },
        )
    )
    assert config.scheduler == "slurm"
    a, b = config.peers
    assert a.launcher == "python" and b.launcher == "accelerate"
    assert a.sections["slurm"] == SlurmResources(
        nodes=1,
        gpus=1,
        cpus=8,
        mem="64G",
        time=240,
        partition="gpu",
        account="proj",
        extra=(("qos", "high"), ("exclusive", True), ("constraint", "a100")),
        setup=("module load cuda", "source env.sh"),
    )
    assert (
        b.sections["slurm"].nodes,
        b.sections["slurm"].gpus,
        b.sections["slurm"].partition,
        b.sections["slurm"].cpus,
    ) == (2, 4, None, 8)  # null: cluster default
    options = a.sections["slurm"].sbatch_options()
    assert options["gpus-per-node"] == "1" and options["time"] == "240" and options["exclusive"] is True
    assert options["ntasks-per-node"] == "1"
    params = a.sections["slurm"].submitit_parameters()
    assert params["additional_parameters"] == {"qos": "high", "exclusive": True, "constraint": "a100"}
    assert (
        params["time"] == 240 and params["wckey"] is None and params["setup"] == ["module load cuda", "source env.sh"]
    )
    # Without `time`, no --time line: the partition's default applies (submitit's own default would be 5 minutes).
    assert load_swarm_config(_slurm([{"id": "a"}])).peers[0].sections["slurm"].submitit_parameters()["time"] is None
    # The Redis job: inherits partition, account, time, extra and setup; never GPUs, CPUs, memory or nodes.
    redis = config.sections["redis"]
    assert redis is not None and config.exchange_url == REDIS_JOB_EXCHANGE
    assert (redis.port, redis.password, redis.server) == (0, True, "redis-server")
    assert redis.resources.partition == "gpu" and redis.resources.time == 240 and redis.resources.account == "proj"
    assert redis.resources.setup == ("module load cuda", "source env.sh")
    assert (redis.resources.gpus, redis.resources.cpus, redis.resources.mem, redis.resources.nodes) == (
        None,
        1,
        None,
        1,
    )


def test_slurm_exchange_defaults(tmp_path):
    run = str(tmp_path / "run")
    # No exchange_url: a Redis job is the default on SLURM.
    assert load_swarm_config(_slurm([{"id": "a"}], run_dir=run)).sections["redis"] is not None
    # redis.start: false without an exchange_url: the shared-directory default.
    config = load_swarm_config(_slurm([{"id": "a"}], run_dir=run, redis={"start": False}))
    assert config.sections["redis"] is None and config.exchange_url == f"dir://{tmp_path}/run/exchange"
    # An external Redis: no job.
    config = load_swarm_config(_slurm([{"id": "a"}], exchange_url="REDIS://h:1/0"))
    assert config.sections["redis"] is None and config.exchange_url == "redis://h:1/0"
    custom = load_swarm_config(
        _slurm([{"id": "a"}], redis={"port": 6380, "password": False, "partition": "cpu", "time": 600, "cpus": 2})
    ).sections["redis"]
    assert (custom.port, custom.password, custom.resources.partition, custom.resources.time) == (
        6380,
        False,
        "cpu",
        600,
    )
    assert custom.resources.cpus == 2
    # Local swarms are unchanged.
    local = load_swarm_config({"script": "p.py", "peers": [{"id": "a", "gpus": 0}]})
    assert local.scheduler == "local" and local.sections == {} and local.peers[0].sections == {}


def test_slurm_flag_forces_slurm_and_keeps_the_inner_launcher(tmp_path):
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump({"script": "p.py", "launcher": "accelerate", "peers": [{"id": "a"}]}))
    assert load_swarm_config(path).scheduler == "local"
    config = load_swarm_config(path, backend="slurm")
    assert (
        config.scheduler == "slurm"
        and config.peers[0].launcher == "accelerate"
        and config.sections["redis"] is not None
    )


@pytest.mark.parametrize(
    "value, minutes",
    [
        (90, 90),
        ("90", 90),
        ("30:00", 30),
        ("30:01", 31),
        ("04:00:00", 240),
        ("1-00:00:00", 1440),
        ("2-12", 3600),
        ("1-2:30", 1590),
        (" 5 ", 5),
        (0, None),
        (-1, None),
        (True, None),
        ("1:60", None),
        ("1-", None),
        ("1h", None),
        ([1], None),
    ],
)
def test_slurm_time_forms(value, minutes):
    assert parse_slurm_time(value) == minutes


def test_unquoted_yaml_times_mean_what_slurm_means(tmp_path):
    """YAML 1.1 reads `time: 4:00:00` as the number 14400; the loader keeps the text, so it is 4 hours (and `30:00`
    is 30 minutes), as sbatch would read it. Other base-60 looking values stay plain integers."""
    path = tmp_path / "swarm.yaml"
    path.write_text(
        "launcher: slurm\nscript: p.py\nargs: {x: 1:30}\nslurm: {time: 4:00:00}\n"
        "peers:\n  - id: a\n  - id: b\n    slurm: {time: 30:00}\n"
    )
    config = load_swarm_config(path)
    assert config.peers[0].sections["slurm"].time == 240 and config.peers[1].sections["slurm"].time == 30
    assert config.peers[0].args["x"] == 90  # as before: only `time` reads the text
    assert "--x 90" in " ".join(build_commands(config)[0].argv)


# ----------------------------------------------------------------------------------------------------------------
# Dry run, CLI and checks before submitting (no SLURM needed)
# ----------------------------------------------------------------------------------------------------------------


def test_slurm_dry_run_prints_each_job_and_hides_secrets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FTIS_SWARM_SECRET", "s3cr3t-swarm")
    monkeypatch.setenv("FTIS_REDIS_PASSWORD", "s3cr3t-redis")
    monkeypatch.setenv("HF_TOKEN", "hf_s3cr3t")
    path = tmp_path / "swarm.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "script": PEER,
                "run_dir": str(tmp_path / "run"),
                "slurm": {"partition": "gpu", "gpus": 2, "time": "04:00:00", "extra": ["--qos=high"]},
                "redis": {"partition": "cpu", "setup": ["module load redis"]},
                "env": {"WANDB_API_KEY": "wandb-s3cr3t"},
                "args": {"hub_token": "hub-s3cr3t"},
                "peers": [{"id": "a", "slurm": {"setup": ["module load cuda/12"]}}, {"id": "b"}],
            }
        )
    )
    code = cli.main(["swarm", str(path), "--dry-run", "--slurm"])
    out = capsys.readouterr().out
    assert code == 0
    for text in (
        "2 peer(s) on SLURM",
        "the exchange's Redis server",
        "--partition=cpu",  # the Redis job's own partition
        "module load redis",
        "peer a (launcher python; 1 node, 2 GPUs/node, time 4:00:00, partition gpu)",
        "--gpus-per-node=2",
        "--time=240",
        "--qos=high",
        "module load cuda/12",
        *(
            ["#   | #SBATCH --partition=cpu", "#   | #SBATCH --gpus-per-node=2", "#   | #SBATCH --qos=high"]
            if HAS_SUBMITIT
            else []
        ),
        "--exchange_url 'redis://<redis-job-host>:<port>/0'",
        "FTIS_REDIS_PASSWORD (set here)",
        "passed to the jobs from your environment",
        "FTIS_SWARM_SECRET",
        *(["srun --unbuffered", "submitit.core._submit"] if HAS_SUBMITIT else []),
    ):
        assert text in out, f"{text!r} not in:\n{out}"
    assert out.count("#!/bin/bash" if HAS_SUBMITIT else "install submitit") == 3
    assert "module load cuda/12" not in out.split("peer b")[1]  # a peer's own setup is its own
    for secret in ("s3cr3t-swarm", "s3cr3t-redis", "hf_s3cr3t", "wandb-s3cr3t", "hub-s3cr3t"):
        assert secret not in out
    assert not (tmp_path / "run").exists()  # wrote nothing


def test_slurm_dry_run_notes_a_shared_directory_exchange(tmp_path):
    config = load_swarm_config(_slurm([{"id": "a"}], script=PEER, exchange_url=f"dir://{tmp_path}/x"))
    stream = io.StringIO()
    assert dry_run(config, stream) == 0
    out = stream.getvalue()
    assert f"note: dir:// exchange on SLURM: {tmp_path}/x must be a directory every node shares" in out
    assert f"--exchange_url dir://{tmp_path}/x" in out


def test_example_slurm_config_loads_and_dry_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # its paths are relative to the repository
    config = load_swarm_config(EXAMPLE)
    assert (
        config.scheduler == "slurm"
        and config.sections["redis"] is not None
        and config.sections["redis"].resources.partition == "cpu"
    )
    small, large = config.peers
    assert (small.sections["slurm"].gpus, large.sections["slurm"].gpus, large.num_processes) == (1, 2, 2)
    assert small.launcher == large.launcher == "accelerate"
    assert small.sections["slurm"].time == 360 and config.sections["redis"].resources.time == 480
    assert small.args["expected_peers"] == [small.id, large.id]
    stream = io.StringIO()
    dry_run(config, stream)
    out = stream.getvalue()
    assert out.count("#!/bin/bash" if HAS_SUBMITIT else "install submitit") == 3
    assert "does not exist" not in out  # the example's script and accelerate configs are there


def test_missing_slurm_commands_are_refused_before_submitting(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(_slurm([{"id": "a"}], script=PEER, run_dir=str(tmp_path / "run"))))
    with pytest.raises(SwarmConfigError) as info:
        run_swarm(load_swarm_config(path))
    assert "sbatch, srun, squeue, scancel, scontrol on PATH" in str(info.value)
    assert cli.main(["swarm", str(path)]) == 2
    assert "cannot submit the swarm" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_summary_table_has_a_job_column_for_slurm_rows():
    row = {"id": "a", "status": "ok", "exit_code": 0, "wall_time_s": 3.0, "note": None, "job_id": "1234"}
    row.update(dict.fromkeys(SUMMARY_FIELDS))
    table = format_summary_table([row])
    assert table.splitlines()[0].split()[:4] == ["peer", "status", "job", "exit"] and "1234" in table
    del row["job_id"]
    assert "job" not in format_summary_table([row]).splitlines()[0]


def test_log_tail_yields_complete_lines_and_survives_truncation(tmp_path):
    path = tmp_path / "a.log"
    tail = LogTail(path)
    assert tail.read() == []  # not there yet
    path.write_bytes(b"one\ntw")
    assert tail.read() == ["one"]
    with open(path, "ab") as handle:
        handle.write(b"o\r\nbar 1\rbar 2\npart")
    assert tail.read() == ["two", "bar 2"]
    assert tail.flush() == ["part"]
    path.write_bytes(b"new\n")
    assert tail.read() == ["new"]


# ----------------------------------------------------------------------------------------------------------------
# What runs inside the jobs, called here without SLURM
# ----------------------------------------------------------------------------------------------------------------


def test_peer_job_runs_the_command_logs_and_reports_its_exit_code(tmp_path):
    secret = tmp_path / "redis.secret"
    secret.write_text("pw-123\n")
    script = (
        "import os, sys; print('peer', os.environ['X'], len(os.environ['FTIS_REDIS_PASSWORD'])); "
        "sys.exit(int(sys.argv[1]))"
    )
    job = PeerJob(
        peer_id="a",
        argv=[sys.executable, "-c", script, "0"],
        env={"X": "x1"},
        cwd=str(tmp_path),
        log_path=str(tmp_path / "a.log"),
        exit_path=str(tmp_path / "a.exit"),
        secret_path=str(secret),
    )
    assert job() == 0
    assert (tmp_path / "a.log").read_text() == "peer x1 6\n"
    assert json.loads((tmp_path / "a.exit").read_text())["exit_code"] == 0
    job.argv[-1] = "3"
    with pytest.raises(RuntimeError, match="peer a exited with code 3"):
        job()
    assert (tmp_path / "a.log").read_text() == "peer x1 6\npeer x1 6\n"  # appended, never truncated
    assert json.loads((tmp_path / "a.exit").read_text())["exit_code"] == 3
    job.argv[0] = str(tmp_path / "no-such-python")
    with pytest.raises(RuntimeError, match="could not start"):
        job()
    assert json.loads((tmp_path / "a.exit").read_text())["exit_code"] == 127


def test_peer_job_on_several_nodes_runs_accelerate_per_node():
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "8", "s.py", "--peer_id", "a"]
    job = PeerJob("a", argv, {}, "/", "/r/logs/a.log", "/r/slurm/a.exit", nodes=2)
    assert job.command(1, 2, ["n0", "n1"]) == [
        sys.executable, "-m", "accelerate.commands.launch",
        "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "n0",
        "--num_processes", "8", "s.py", "--peer_id", "a",
    ]  # fmt: skip
    assert job.command(0, 1, ["n0"]) == argv
    assert job._per_node(job.log_path, 1, ".log") == "/r/logs/a.node1.log"
    assert job._per_node(job.exit_path, 0, ".exit") == "/r/slurm/a.exit"


@pytest.mark.redis
def test_redis_job_serves_with_a_password_and_stops_on_sigterm(tmp_path):
    _requires_redis_server()
    secret = tmp_path / "redis.secret"
    secret.write_text('p"w\\x\n')  # quotes and backslashes survive the config file
    job = redis_job_in(tmp_path, secret_path=secret)
    proc = run_pickled(job, then="print('served')", stdout=subprocess.PIPE, text=False)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "redis.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        address = json.loads((tmp_path / "redis.json").read_text())
        assert address["port"] > 0 and address["password"] is True and "error" not in address
        assert answers_ping("127.0.0.1", address["port"])
        with socket.create_connection(("127.0.0.1", address["port"]), timeout=5) as sock:
            sock.sendall(b"PING\r\n")
            assert sock.recv(64).startswith(b"-NOAUTH")  # up, and it wants the password
        import redis as redis_py

        client = redis_py.Redis(host="127.0.0.1", port=address["port"], username="ftis", password='p"w\\x')
        assert client.ping()
        conf = tmp_path / "redis" / "redis.conf"
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
        proc.send_signal(signal.SIGTERM)  # what scancel does
        assert proc.wait(timeout=15) == 0 and proc.stdout.read().strip() == b"served"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_redis_job_reports_a_missing_server(tmp_path):
    job = redis_job_in(tmp_path, server=str(tmp_path / "no-redis-server"))
    with pytest.raises(RuntimeError, match="cannot run"):
        job()
    error = json.loads((tmp_path / "redis.json").read_text())["error"]
    assert "install Redis on the nodes" in error and "redis.server" in error


# ----------------------------------------------------------------------------------------------------------------
# On a real SLURM cluster
# ----------------------------------------------------------------------------------------------------------------


def _launch(tmp_path, config: dict, *extra: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, Path]:
    """`trl-ftis swarm` on `config` in a subprocess (what a user runs); returns its result and run dir."""
    run_dir = tmp_path / "run"
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("FTIS_SWARM_SECRET", None)
    result = subprocess.run(
        [sys.executable, "-m", "trl_ftis.cli", "swarm", str(path), "--run-dir", str(run_dir), *extra],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, run_dir


def _job_ids(run_dir: Path) -> list[str]:
    return [line.split()[0] for line in (run_dir / "slurm" / "jobs.txt").read_text().splitlines()]


def _assert_no_job_left(cluster, run_dir: Path):
    """Every job of this swarm has ended: none pending, running or completing (squeue; no accounting needed)."""
    ids = _job_ids(run_dir)
    states = squeue(ids)
    assert states is not None
    active = {job: state for job, (state, _, _) in states.items() if state not in TERMINAL_STATES}
    assert not active, f"jobs left: {active}"
    assert not [job for job in cluster.jobs() if job[0] in ids], cluster.jobs()


def _requires_redis_server() -> None:
    """Skip, naming what is missing, when the launcher's Redis job cannot run here (no redis-server on PATH)."""
    if shutil.which("redis-server") is None:
        pytest.skip(
            "redis-server not installed: the launcher's Redis job runs it (tests/provision_services.sh, run by "
            "`make test`, installs it where the machine allows)"
        )


def _stand_in_config(cluster, **args) -> dict:
    return {
        "launcher": "slurm",
        "script": PEER,
        "slurm": {"cpus": 1, "time": 10, "partition": cluster.partition},
        "args": {"lines": 2, "hold": 120, **args},
        "env": {"OMP_NUM_THREADS": 1},
        "peers": [{"id": "a"}, {"id": "b"}],
    }


@pytest.mark.slurm
def test_slurm_two_tiny_peers_train_through_the_launchers_redis_job(tmp_path, slurm_cluster):
    """A real swarm on SLURM: a Redis job, then two tiny peers (examples/tiny_peer.py) as two jobs that exchange their
    completions through it (with a password the launcher made and never showed), logs and summaries gathered."""
    _requires_redis_server()
    from peer_processes import COMMON

    config = {
        "launcher": "slurm",
        "script": TINY_PEER,
        "slurm": {"cpus": 1, "time": "00:10:00", "partition": slurm_cluster.partition},
        "redis": {"start": True, "password": True, "time": 15},
        "args": {**COMMON, "expected_peers": ["big", "small"], "peer_timeout": 180},
        "env": {
            "OMP_NUM_THREADS": 1,
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "FTIS_CONSOLE": "dict",
        },
        "peers": [{"id": "big", "args": {"hidden_size": 64}}, {"id": "small", "args": {"hidden_size": 32}}],
    }
    started = time.monotonic()
    result, run_dir = _launch(tmp_path, config, timeout=480)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    print(f"two tiny peers on SLURM: {time.monotonic() - started:.1f}s")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["scheduler"] == "slurm" and summary["exit_code"] == 0
    assert summary["exchange_url"].startswith("redis://") and summary["redis_job"]["job_id"]
    for row in summary["peers"]:
        other = {"big": "small", "small": "big"}[row["id"]]
        assert row["status"] == "ok" and row["job_id"] and row["node"], row
        # 3 rounds of 16 rows each way, every one of them accepted, but for the completions in which the untrained
        # tiny models wrote <pad>/<unk> (special_tokens: the peers' own summaries count them).
        assert (row["steps"], row["rows_sent"], row["rows_received"]) == (3, 48, 48), row
        peer = json.loads((run_dir / row["id"] / "ftis_summary.json").read_text())
        assert row["rows_accepted"] + peer["dropped"].get("special_tokens", 0) == 48, peer["dropped"]
        log = (run_dir / "logs" / f"{row['id']}.log").read_text()
        assert f"'ftis/peers/{other}/rows_accepted': '" in log
        assert f"[{row['id']}]" in result.stdout and "'ftis/peers/" in result.stdout  # streamed to the console
    assert "running on" in result.stdout and "peer big finished (exit code 0)" in result.stdout
    assert "Ready to accept connections" in (run_dir / "logs" / "redis.server.log").read_text()
    secret_file = run_dir / "slurm" / "redis.secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    password = secret_file.read_text().strip()
    shown = [result.stdout, result.stderr, (run_dir / "summary.json").read_text()]
    shown += [p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()]
    assert all(password not in text for text in shown)
    _assert_no_job_left(slurm_cluster, run_dir)


@pytest.mark.slurm
@pytest.mark.parametrize("how", ["exit_code", "job_setup_fails"])
def test_slurm_failing_peer_cancels_every_other_job(tmp_path, slurm_cluster, how):
    """Peer b fails (its command exits 3, or its job dies before the peer starts): the launcher cancels peer a (which
    would run 2 more minutes) and the Redis job, and exits 1."""
    config = _stand_in_config(slurm_cluster)
    if how == "exit_code":
        _requires_redis_server()  # the other case exchanges over a directory
        config["peers"][1]["args"] = {"hold": 1, "exit_code": 3}
    else:  # and over a shared directory instead of the Redis job
        config["peers"][1]["slurm"] = {"setup": ["echo setup failed >&2", "exit 7"]}
        config["exchange_url"] = f"dir://{tmp_path}/exchange"
    result, run_dir = _launch(tmp_path, config, "--grace", "3", timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = {row["id"]: row for row in summary["peers"]}
    # a was cancelled ("stopped"), not left to finish its 2 minutes ("ok")
    assert rows["a"]["status"] == "stopped" and rows["b"]["status"] == "failed", output
    if how == "exit_code":
        assert rows["b"]["exit_code"] == 3 and "peer b exited with code 3" in summary["reason"]
        assert rows["a"]["exit_code"] == -signal.SIGTERM  # scancel --signal=TERM reached the peer
    else:
        assert "ended FAILED" in summary["reason"], summary
        assert "setup failed" in output  # the tail of submitit's job log, shown under the peer
        assert "dir:// exchange on SLURM" in output and summary["redis_job"] is None
    assert ("cancelling the Redis job" in output) == (how == "exit_code")
    _assert_no_job_left(slurm_cluster, run_dir)


def _start_launcher(tmp_path, config, *extra):
    """Start `trl-ftis swarm` on `config` in the background; `(run_dir, output file, process)`."""
    run_dir = tmp_path / "run"
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(config))
    out_path = tmp_path / "launcher.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trl_ftis.cli", "swarm", str(path), "--run-dir", str(run_dir), *extra],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return run_dir, out_path, proc


@pytest.mark.slurm
def test_slurm_sigint_cancels_every_job(tmp_path, slurm_cluster):
    """Ctrl-C (SIGINT) to the launcher: the running peers get SIGTERM, b ignores it and is cancelled after the grace
    period, the Redis job is cancelled, nothing of the swarm is left in the queue; exit code 130."""
    _requires_redis_server()
    config = _stand_in_config(slurm_cluster)
    config["peers"][1]["args"] = {"ignore_sigterm": True}
    run_dir, out_path, proc = _start_launcher(tmp_path, config, "--grace", "2")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = out_path.read_text()
            if "[a] ready" in text and "[b] ready" in text:
                break
            assert proc.poll() is None, text
            time.sleep(0.2)
        else:
            pytest.fail(f"peers never became ready:\n{out_path.read_text()}")
        ids = _job_ids(run_dir)
        assert len(ids) == 3 and all(squeue(ids)[job][0] == "RUNNING" for job in ids)
        proc.send_signal(signal.SIGINT)
        # b ignores SIGTERM and holds for 120 s: a launcher that did not cancel it after the grace runs into this
        assert proc.wait(timeout=90) == 130, out_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out_path.read_text()
    assert "stopping peers a" in text and "interrupted by SIGINT; exit code 130" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [row["status"] for row in summary["peers"]] == ["stopped", "stopped"]
    _assert_no_job_left(slurm_cluster, run_dir)


@pytest.mark.slurm
def test_slurm_refused_submission_cancels_the_rest(tmp_path, slurm_cluster):
    """sbatch refuses peer b's job (no such partition): nothing runs, the Redis job and peer a are cancelled, exit 1,
    and the error names the peer."""
    _requires_redis_server()
    config = _stand_in_config(slurm_cluster)
    config["peers"][1]["slurm"] = {"partition": "no-such-partition"}
    result, run_dir = _launch(tmp_path, config, "--grace", "2", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "could not submit peer b" in output and "partition" in output.lower()
    rows = {row["id"]: row for row in json.loads((run_dir / "summary.json").read_text())["peers"]}
    assert rows["b"]["status"] == "failed to submit" and rows["a"]["status"] == "stopped"
    _assert_no_job_left(slurm_cluster, run_dir)


@pytest.mark.slurm
@pytest.mark.parametrize("waiting", ["redis", "peers"])
def test_slurm_sigint_while_jobs_wait_in_the_queue(tmp_path, slurm_cluster, waiting):
    """Ctrl-C while the Redis job, or the peers' jobs, still wait in the queue (here: not before an hour from now)
    cancels them; exit code 130, nothing left."""
    config = _stand_in_config(slurm_cluster)
    later = ["--begin=now+3600"]
    if waiting == "redis":
        config["redis"] = {"extra": later}
        marker = "the Redis job: job"
    else:
        config["exchange_url"] = f"dir://{tmp_path}/exchange"
        config["slurm"]["extra"] = later
        marker = "peer b: job"
    run_dir, out_path, proc = _start_launcher(tmp_path, config)
    try:
        deadline = time.monotonic() + 60
        while marker not in out_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out_path.read_text()
            time.sleep(0.1)
        assert "pending (BeginTime)" in out_path.read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, out_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out_path.read_text()
    assert ("cancelling queued jobs: a" in text) == (waiting == "peers"), text
    assert len(_job_ids(run_dir)) == (1 if waiting == "redis" else 2)
    _assert_no_job_left(slurm_cluster, run_dir)


@pytest.mark.slurm
def test_slurm_redis_job_that_cannot_start_is_reported(tmp_path, slurm_cluster):
    """No redis-server on the node (here: a path that does not exist): exit 1 with the reason; no peer submitted."""
    config = _stand_in_config(slurm_cluster)
    config["redis"] = {"server": str(tmp_path / "no-redis-server")}
    result, run_dir = _launch(tmp_path, config, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "the Redis job" in output and "cannot run" in output and "install Redis on the nodes" in output
    assert [row["status"] for row in json.loads((run_dir / "summary.json").read_text())["peers"]] == [
        "not submitted",
        "not submitted",
    ]
    assert len(_job_ids(run_dir)) == 1
    _assert_no_job_left(slurm_cluster, run_dir)
