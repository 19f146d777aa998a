"""The launcher's own files and jobs give nothing away and run nothing they were not asked to: `.cmd` files hold only
what the launcher adds and, with the logs and submitit's batch scripts, are readable by their owner only whatever
the umask; the SLURM dry run hides secrets in `slurm.setup` / `slurm.extra`; no value of a config starts a line of
its own in a script or a comment; secret arguments reach the peers by environment, never on a command line; and the
launcher's Redis job gives the peers an ACL user that can publish and read its stream, nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from file_modes import file_mode, umask  # tests/ is on sys.path
from redis_jobs import redis_job_in, run_pickled

from trl_ftis import cli
from trl_ftis.launcher import (
    SwarmConfigError,
    build_commands,
    commands,
    load_swarm_config,
    run_swarm,
)
from trl_ftis.launcher.commands import keep_earlier, write_cmd_file
from trl_ftis.launcher.preflight import secret_warnings
from trl_ftis.launcher.slurm import backend as slurm
from trl_ftis.launcher.slurm import jobs as slurm_jobs
from trl_ftis.launcher.slurm.backend import SlurmBackend
from trl_ftis.launcher.slurm.schema import SlurmResources

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")
PW = "hunter2-pw"


# ----------------------------------------------------------------------------------------------------------------
# 1. .cmd files and logs
# ----------------------------------------------------------------------------------------------------------------


def test_cmd_file_holds_only_what_the_launcher_adds_and_files_are_private_whatever_theumask(tmp_path, monkeypatch):
    # Secrets whose names the redaction rule misses: the caller's own environment, never written by the launcher.
    for name in ("REDISCLI_AUTH", "MYSQL_PWD", "GH_PAT", "PGPASS_VALUE"):
        monkeypatch.setenv(name, f"{PW}-{name}")
    config = load_swarm_config(
        {"script": PEER, "run_dir": str(tmp_path / "run"), "env": {"MINE": "1"}, "peers": [{"id": "a"}]}
    )
    with umask(0):
        assert run_swarm(config, grace=2, stream=open(os.devnull, "w")) == 0  # noqa: SIM115
    logs = tmp_path / "run" / "logs"
    cmd = (logs / "a.cmd").read_text()
    assert PW not in cmd and "REDISCLI_AUTH" not in cmd and "MYSQL_PWD" not in cmd
    assert "#   MINE=1" in cmd and "#   FTIS_PEER_ID=a" in cmd  # the additions are still all there
    assert file_mode(logs / "a.cmd") == 0o600 and file_mode(logs / "a.log") == 0o600


def test_kept_earlier_files_become_private(tmp_path):
    cmd = tmp_path / "a.cmd"
    cmd.write_text("an earlier version's .cmd: the whole environment")
    cmd.chmod(0o644)
    assert keep_earlier([cmd], private=True) == 1
    assert file_mode(tmp_path / "a.cmd.1") == 0o600


# ----------------------------------------------------------------------------------------------------------------
# 2. The SLURM dry run hides secrets in setup and extra
# ----------------------------------------------------------------------------------------------------------------


def test_slurm_dry_run_redacts_setup_and_extra(tmp_path, capsys):
    path = tmp_path / "swarm.yaml"
    setup = [
        f"export GH_TOKEN={PW}",
        f"export HF_TOKEN='{PW} x'",
        f"curl -s https://user:{PW}@internal.example/env.sh | sh",
        f"vault login --password {PW}",
        f"tool --api_key={PW}",
    ]
    path.write_text(
        yaml.safe_dump(
            {
                "launcher": "slurm",
                "script": PEER,
                "run_dir": str(tmp_path / "run"),
                "slurm": {"setup": setup, "extra": [f"--comment=redis://:{PW}@h:6379/0"]},
                "redis": {"setup": [f"export REDIS_ADMIN_PASSWORD={PW}"]},
                "peers": [{"id": "a"}],
            }
        )
    )
    assert cli.main(["swarm", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert PW not in out
    assert "export GH_TOKEN=<redacted>" in out and "https://user:<redacted>@internal.example" in out
    assert "vault login --password <redacted>" in out


@pytest.mark.parametrize(
    "line, shown",
    [
        (f"export GH_TOKEN={PW}", "export GH_TOKEN=<redacted>"),
        (f'export A=1 MY_SECRET="{PW} {PW}"; run', "export A=1 MY_SECRET=<redacted>; run"),
        (f"cmd --password {PW} --x 1", "cmd --password <redacted> --x 1"),
        (f"cmd --db-password={PW}", "cmd --db-password=<redacted>"),
        (f"source <(curl https://:{PW}@h/x)", "source <(curl https://:<redacted>@h/x)"),
        (
            "export TOKENIZERS_PARALLELISM=false; module load cuda",
            "export TOKENIZERS_PARALLELISM=false; module load cuda",
        ),
    ],
)
def test_redact_shell_line(line, shown):
    assert commands.redact_shell_line(line) == shown


# ----------------------------------------------------------------------------------------------------------------
# 3. Nothing a config holds starts a line of its own
# ----------------------------------------------------------------------------------------------------------------


def test_a_run_dir_with_a_newline_is_refused(tmp_path):
    raw = {"script": PEER, "peers": [{"id": "a"}], "run_dir": f"{tmp_path}/x\ntouch {tmp_path}/pwned"}
    with pytest.raises(SwarmConfigError, match=r"`run_dir` must not contain a newline"):
        load_swarm_config(raw)
    raw.pop("run_dir")
    with pytest.raises(SwarmConfigError, match=r"`--run-dir` must not contain a newline"):
        load_swarm_config(raw, run_dir=f"{tmp_path}/x\rtouch y")
    path = tmp_path / "bad\nname.yaml"  # the default run_dir is runs/<config file stem>
    path.write_text(yaml.safe_dump({"script": PEER, "peers": [{"id": "a"}]}))
    with pytest.raises(SwarmConfigError, match=r"default run_dir"):
        load_swarm_config(path)


@pytest.mark.parametrize(
    "section, problem",
    [
        ({"env": {"FOO\n": "1"}}, "env name 'FOO\\n' is not a valid environment variable name"),
        ({"args": {"lr\n": 1}}, "args key 'lr\\n' is not a valid argument name"),
        ({"id": "a\nb"}, "invalid `id`"),
    ],
)
def test_names_with_a_trailing_newline_are_refused(section, problem):
    with pytest.raises(SwarmConfigError) as error:
        load_swarm_config({"script": PEER, "peers": [{"id": "a", **section}]})
    assert problem in str(error.value)


def test_values_with_newlines_stay_on_their_lines(tmp_path):
    config = load_swarm_config(
        {
            "script": PEER,
            "run_dir": str(tmp_path / "run"),
            "env": {"X": "a\nrm -rf ~"},
            "peers": [{"id": "a", "args": {"system_prompt": "one\ntwo"}}],
        }
    )
    (command,) = build_commands(config)
    command.cmd_path.parent.mkdir(parents=True)
    write_cmd_file(command)
    lines = command.cmd_path.read_text().splitlines()
    assert all(line == "" or line.startswith(("#", "cd ")) for line in lines), lines
    assert "#   X=$'a\\nrm -rf ~'" in lines
    # What the shell line says is what the peer gets.
    quoted = commands.shell_quote("a\nb c")
    assert subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, check=True).stdout == b"a\nb c"


def test_a_setup_item_holding_newlines_is_its_lines():
    assert SlurmResources(setup=["module load a\nmodule load b", "c"]).setup == ("module load a", "module load b", "c")


# ----------------------------------------------------------------------------------------------------------------
# 4. Secret arguments go by environment
# ----------------------------------------------------------------------------------------------------------------


def test_swarm_secret_and_hub_token_go_by_environment_never_argv(tmp_path):
    config = load_swarm_config(
        {
            "script": PEER,
            "run_dir": str(tmp_path / "run"),
            "args": {"swarm_secret": f"{PW}-s", "hub_token": f"{PW}-h", "lr": 0.1},
            "peers": [{"id": "a"}],
        }
    )
    (command,) = build_commands(config)
    assert not any(PW in item for item in command.argv)
    assert "--swarm_secret" not in command.argv and "--hub_token" not in command.argv and "--lr" in command.argv
    assert command.env["FTIS_SWARM_SECRET"] == f"{PW}-s" and command.env["HF_TOKEN"] == f"{PW}-h"
    warnings = secret_warnings(config, lambda name: "secret" in name or "token" in name, {"swarm_secret": "X_ENV"})
    assert any(
        w.startswith("`args.swarm_secret` holds a secret") and "the peers get it as X_ENV" in w for w in warnings
    )


# ----------------------------------------------------------------------------------------------------------------
# SLURM files: submitit's folder and the .cmd file's job lines
# ----------------------------------------------------------------------------------------------------------------


def test_submitit_folder_is_private_and_cmd_job_lines_are_redacted(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")

    class FakeExecutor:  # what submitit does at submission: write the batch script (here with the umask's mode)
        def __init__(self, folder):
            self.folder = Path(folder)

        def update_parameters(self, **params):
            pass

        def submit(self, function):
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / "1_submission.sh").write_text(f"export GH_TOKEN={PW}\n")
            return type("Job", (), {"job_id": "1"})()

    monkeypatch.setattr(submitit, "SlurmExecutor", FakeExecutor)
    config = load_swarm_config(
        {
            "launcher": "slurm",
            "script": PEER,
            "run_dir": str(tmp_path / "run"),
            "exchange_url": f"dir://{tmp_path}/x",
            "slurm": {"setup": [f"export GH_TOKEN={PW}"], "extra": [f"--comment=https://u:{PW}@h/"]},
            "peers": [{"id": "a"}],
        }
    )
    backend = SlurmBackend(config)
    backend._prepare()
    run = backend.runs[0]
    folder = backend.root / "a"
    with umask(0):
        backend._submit(run, object(), folder)
        run.command.cmd_path.parent.mkdir(parents=True, exist_ok=True)
        write_cmd_file(run.command)
        backend._append_job_to_cmd_file(run, folder)
    assert file_mode(folder) == 0o700 and file_mode(folder / "1_submission.sh") == 0o600
    cmd = run.command.cmd_path.read_text()
    assert "# setup: export GH_TOKEN=<redacted>" in cmd and PW not in cmd
    assert file_mode(run.command.cmd_path) == 0o600


# ----------------------------------------------------------------------------------------------------------------
# 5. The launcher's Redis job: an ACL user for the peers, nothing else
# ----------------------------------------------------------------------------------------------------------------


@contextmanager
def _redis_job(tmp_path, password: str | None, swarm: str = "run-7"):
    """RedisJob in a subprocess (as submitit's worker runs it); yields its redis.json."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not found on PATH (the launcher's Redis job needs redis-server >= 6)")
    pytest.importorskip("redis")
    secret = None
    if password is not None:
        secret = tmp_path / "redis.secret"
        secret.write_text(password + "\n")
    job = redis_job_in(tmp_path, secret_path=secret)
    job.swarm = swarm  # the peers' stream is ftis:<swarm>
    proc = run_pickled(job)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "redis.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        address = json.loads((tmp_path / "redis.json").read_text())
        assert "error" not in address, address
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


ADMIN = [
    ("CONFIG", "SET", "requirepass", "locked-out"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("FLUSHALL",),
    ("ACL", "SETUSER", "ftis", "off"),
    ("SHUTDOWN",),
    ("KEYS", "*"),
]


@pytest.mark.redis
def test_redis_job_peers_can_publish_and_read_but_not_administer(tmp_path, monkeypatch):
    import redis as redis_py

    from trl_ftis.exchange.transports.redis_streams import RedisTransport

    password = "pw-" + "x" * 20
    with _redis_job(tmp_path, password) as address:
        url = slurm.redis_job_url(address, "127.0.0.1")
        assert url == f"redis://{slurm_jobs.REDIS_USER}@127.0.0.1:{address['port']}/0?swarm=run-7"
        monkeypatch.setenv("FTIS_REDIS_PASSWORD", password)  # what the peers get (from redis.secret)
        writer, reader = RedisTransport(url), RedisTransport(url)
        try:
            writer.publish(b"hello", sender="a", round=1)
            assert [envelope.data for envelope in reader.poll()] == [b"hello"]
            writer.prune(sender="a", keep_rounds=0, current_round=5)  # XDEL of its own entries
            late = RedisTransport(url)  # reads the retained stream from its start: nothing left
            assert late.poll() == []
            late.close()
        finally:
            writer.close()
            reader.close()
        peer = redis_py.Redis(
            host="127.0.0.1", port=address["port"], username=slurm_jobs.REDIS_USER, password=password
        )
        for command in ADMIN:
            with pytest.raises(redis_py.exceptions.NoPermissionError):
                peer.execute_command(*command)
        with pytest.raises(redis_py.exceptions.NoPermissionError):
            peer.xadd("ftis:other-swarm", {"data": b"x"})  # only its own swarm's stream
        with pytest.raises(redis_py.exceptions.AuthenticationError):  # the default user is off
            redis_py.Redis(host="127.0.0.1", port=address["port"], password=password).ping()
        assert peer.ping()  # the server still serves after every refused attempt


@pytest.mark.redis
def test_redis_job_without_a_password_still_refuses_administration(tmp_path):
    import redis as redis_py

    with _redis_job(tmp_path, None, swarm="s") as address:
        assert slurm.redis_job_url(address, "127.0.0.1") == f"redis://127.0.0.1:{address['port']}/0?swarm=s"
        anyone = redis_py.Redis(host="127.0.0.1", port=address["port"])
        assert anyone.xadd("ftis:s", {"data": b"x"})
        for command in ADMIN:
            with pytest.raises(redis_py.exceptions.NoPermissionError):
                anyone.execute_command(*command)
