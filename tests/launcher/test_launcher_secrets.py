"""`trl-ftis swarm` never shows a secret: every form a secret can take in a swarm config goes through the dry run, a
real run of the stdlib fixture peer (`tests/fixtures/swarm_peer.py`), its `.cmd` file, `summary.json` and the
launcher's own `[swarm]` status lines, and the secret is asserted absent from all of them.

(The peers' own output is theirs: the fixture prints its arguments, so its log and its console lines are not checked.)
"""

import io
import json
from pathlib import Path

import pytest
import yaml

from trl_ftis import cli, launcher
from trl_ftis.launcher import load_swarm_config, run_swarm
from trl_ftis.redaction import REDACTED

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")
PW = "hunter2-pw"  # distinctive: cannot occur by chance in paths, option names or peer ids

# id -> (top-level config keys, peer keys, caller environment, what the peer's log shows it received). Each puts PW
# somewhere the launcher shows; the peer itself must still get the real value.
SECRET_LEN = f"secret_len={len(PW)}"
FORMS = {
    "url-userinfo": ({"exchange_url": f"redis://:{PW}@localhost:6379/0"}, {}, {}, PW),
    "url-query": ({"exchange_url": f"redis://localhost:6379/0?password={PW}"}, {}, {}, PW),
    "url-both": ({"exchange_url": f"rediss://u:{PW}@localhost:6380/0?ssl_cert_reqs=none&password={PW}"}, {}, {}, PW),
    "flag=value": ({}, {"args": {"extra": [f"--swarm_secret={PW}"]}}, {}, PW),
    "flag value": ({}, {"args": {"swarm_secret": PW}}, {}, SECRET_LEN),  # passed as FTIS_SWARM_SECRET
    "hub_token=value": ({}, {"args": {"extra": [f"--hub_token={PW}"]}}, {}, PW),
    "env FTIS_SWARM_SECRET (caller)": ({}, {}, {"FTIS_SWARM_SECRET": PW}, SECRET_LEN),
    "env FTIS_SWARM_SECRET (config)": ({"env": {"FTIS_SWARM_SECRET": PW}}, {}, {}, SECRET_LEN),
    "env URL value": ({}, {"env": {"REDIS_URL": f"redis://localhost:6379/0?password={PW}"}}, {}, None),
    "arg URL value": ({}, {"args": {"vllm_server_url": f"http://user:{PW}@vllm.local:8000"}}, {}, PW),
}


def _raw(tmp_path, top, peer):
    raw = {"script": PEER, "run_dir": str(tmp_path / "run"), "peers": [{"id": "a", **peer}]}
    raw.update(top)
    return raw


@pytest.mark.parametrize("form", list(FORMS))
def test_dry_run_never_shows_a_secret(form, tmp_path, monkeypatch, capsys):
    top, peer, environ, _ = FORMS[form]
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path, top, peer)))
    assert cli.main(["swarm", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert PW not in out
    assert REDACTED in out
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("form", list(FORMS))
def test_a_real_run_never_writes_or_prints_a_secret(form, tmp_path, monkeypatch):
    top, peer, environ, received = FORMS[form]
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = load_swarm_config(_raw(tmp_path, top, peer))
    out = io.StringIO()
    assert run_swarm(config, grace=2, stream=out) == 0
    run = tmp_path / "run"
    cmd = (run / "logs" / "a.cmd").read_text()
    summary = (run / "summary.json").read_text()
    status_lines = "\n".join(line for line in out.getvalue().splitlines() if line.startswith("[swarm]"))
    for where, text in {".cmd": cmd, "summary.json": summary, "[swarm] lines": status_lines}.items():
        assert PW not in text, where
    if not environ:  # the caller's own environment is not written (only what the launcher adds)
        assert REDACTED in cmd
    assert json.loads(summary)["exit_code"] == 0
    if "exchange_url" in top:
        assert REDACTED in json.loads(summary)["exchange_url"]
        assert f"exchange {json.loads(summary)['exchange_url']}" in status_lines
    if received is not None:  # the peer itself got the real value (the fixture prints what it received)
        assert received in (run / "logs" / "a.log").read_text()


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["--swarm_secret", PW], ["--swarm_secret", "<redacted>"]),
        ([f"--swarm_secret={PW}"], ["--swarm_secret=<redacted>"]),
        ([f"--hub_token={PW}", "--lr", "0.1"], ["--hub_token=<redacted>", "--lr", "0.1"]),
        (["--HUB_TOKEN", PW, "--x"], ["--HUB_TOKEN", "<redacted>", "--x"]),
        (["--db_password", PW, PW, "--lr=1"], ["--db_password", "<redacted>", "<redacted>", "--lr=1"]),  # a list
        ([f"--openai_api_key={PW}"], ["--openai_api_key=<redacted>"]),
        (["--swarm_secret="], ["--swarm_secret=<redacted>"]),
        ([f"FTIS_SWARM_SECRET={PW}", "python"], ["FTIS_SWARM_SECRET=<redacted>", "python"]),
        ([f"--exchange_url=redis://:{PW}@h:6379/0"], ["--exchange_url=redis://:<redacted>@h:6379/0"]),
        (["--exchange_url", f"redis://h/0?password={PW}"], ["--exchange_url", "redis://h/0?password=<redacted>"]),
        # Not secrets: names that merely contain TOKENIZER, plain options and assignments.
        (["--tokenizer_name", "tok", "--max_steps", "5"], ["--tokenizer_name", "tok", "--max_steps", "5"]),
        (["--lr=0.1", "OMP_NUM_THREADS=1", "script.py"], ["--lr=0.1", "OMP_NUM_THREADS=1", "script.py"]),
    ],
)
def test_redact_argv_hides_secret_options_in_both_forms(argv, shown):
    assert launcher.redact_argv(argv) == shown
