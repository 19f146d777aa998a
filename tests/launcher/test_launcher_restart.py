"""Restarting peers and what the end of a run says: `trl-ftis swarm CONFIG --only PEER_ID [--resume]` starts only
those peers, with the command the full run gives them (resuming from their newest complete checkpoint); an earlier
run's logs, `.cmd` files and `summary.json` are kept, never overwritten; the summary table counts refused messages
and dropped rows, and a peer whose exchange went wrong gets a warning line.

The peers are `tests/fixtures/swarm_peer.py` (standard library only), as in test_launcher.py: a run takes a fraction
of a second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trl_ftis import cli
from trl_ftis.exchange_report import exchange_problem, exchange_warning
from trl_ftis.launcher import SwarmConfigError, build_commands, format_summary_table, load_swarm_config
from trl_ftis.launcher.commands import RUN_ID_FILE, keep_earlier, new_run_id, record_run_id
from trl_ftis.launcher.restart import (
    CHECKPOINT_PREFIX,
    TRAINER_STATE_FILE,
    latest_checkpoint,
    restart_config,
)
from trl_ftis.launcher.summary import TABLE_COLUMNS, peer_warning, read_peer_summary
from trl_ftis.shared_names import SWARM_NAME_ENV, SWARM_RUN_ENV

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _write_config(tmp_path, peers, **top) -> Path:
    raw = {"script": PEER, "run_dir": str(tmp_path / "run"), "args": {"lines": 1}, "peers": peers}
    raw.update(top)
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _argv_in_cmd_file(path: Path) -> list[str]:
    line = next(line for line in path.read_text().splitlines() if line.startswith("# argv (JSON): "))
    return json.loads(line[len("# argv (JSON): ") :])


def _checkpoint(output_dir: Path, step: int, complete: bool = True) -> Path:
    path = output_dir / f"{CHECKPOINT_PREFIX}-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / TRAINER_STATE_FILE).write_text("{}")
    return path


# ----------------------------------------------------------------------------------------------------------------
# An earlier run's files are kept
# ----------------------------------------------------------------------------------------------------------------


def test_keep_earlier_renames_to_the_next_free_number_and_keeps_pairs(tmp_path):
    log, cmd = tmp_path / "b.log", tmp_path / "b.cmd"
    assert keep_earlier([log, cmd]) is None  # nothing there yet: nothing renamed
    log.write_text("run 1")
    cmd.write_text("cmd 1")
    assert keep_earlier([log, cmd]) == 1
    assert not log.exists() and (tmp_path / "b.log.1").read_text() == "run 1" and (tmp_path / "b.cmd.1").exists()
    log.write_text("run 2")  # a run that wrote its log but no .cmd keeps the pair's numbering all the same
    (tmp_path / "b.cmd.7").write_text("kept by hand")
    assert keep_earlier([log, cmd]) == 8  # past every number either file has used
    assert (tmp_path / "b.log.8").read_text() == "run 2" and not (tmp_path / "b.cmd.8").exists()


def test_kept_files_never_take_another_peers_name(tmp_path):
    """Peer ids may hold dots and digits: `b.1.log` is peer `b.1`'s log, so the number goes after `.log`."""
    (tmp_path / "b.log").write_text("peer b")
    (tmp_path / "b.1.log").write_text("peer b.1")
    (tmp_path / "b.log.log").write_text("peer b.log")
    assert keep_earlier([tmp_path / "b.log"]) == 1
    assert keep_earlier([tmp_path / "b.1.log"]) == 1
    assert (tmp_path / "b.log.1").read_text() == "peer b" and (tmp_path / "b.1.log.1").read_text() == "peer b.1"
    assert (tmp_path / "b.log.log").read_text() == "peer b.log"


def test_a_second_run_keeps_the_first_runs_logs_and_summary(tmp_path, capsys):
    path = _write_config(tmp_path, [{"id": "a"}, {"id": "b.1"}])
    assert cli.main(["swarm", str(path)]) == 0
    assert cli.main(["swarm", str(path)]) == 0
    assert cli.main(["swarm", str(path)]) == 0
    logs = tmp_path / "run" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        f"{peer}.{kind}{n}" for peer in ("a", "b.1") for kind in ("log", "cmd") for n in ("", ".1", ".2")
    )
    assert all("hello from a" in (logs / name).read_text() for name in ("a.log", "a.log.1", "a.log.2"))
    run = tmp_path / "run"
    assert {p.name for p in run.glob("summary.json*")} == {"summary.json", "summary.json.1", "summary.json.2"}
    assert "summary in" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# --only
# ----------------------------------------------------------------------------------------------------------------


def test_only_starts_that_peer_with_the_full_runs_command(tmp_path, capsys):
    path = _write_config(tmp_path, [{"id": "a", "args": {"seed": 1}}, {"id": "b", "args": {"seed": 2}}, {"id": "c"}])
    assert cli.main(["swarm", str(path)]) == 0
    logs = tmp_path / "run" / "logs"
    full_argv = _argv_in_cmd_file(logs / "b.cmd")
    a_log = (logs / "a.log").read_text()
    capsys.readouterr()

    assert cli.main(["swarm", str(path), "--only", "b"]) == 0
    out = capsys.readouterr().out
    assert "started b" in out and "started a" not in out and "started c" not in out
    assert _argv_in_cmd_file(logs / "b.cmd") == full_argv  # the same command, exchange and output dir
    assert (logs / "b.log.1").exists() and (logs / "b.cmd.1").exists()  # the full run's, kept
    assert (logs / "a.log").read_text() == a_log and not (logs / "a.log.1").exists()  # the others untouched
    # One file covers the swarm: b's new row, then a's and c's rows of the full run, said so.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [row["id"] for row in summary["peers"]] == ["b", "a", "c"]
    rows = {row["id"]: row for row in summary["peers"]}
    assert "earlier" not in rows["b"] and rows["a"]["earlier"] and rows["c"]["earlier"]
    assert rows["a"]["note"].startswith("not restarted here: its row of the earlier launcher's summary")
    assert "note: a: not restarted here" in out
    earlier = json.loads((tmp_path / "run" / "summary.json.1").read_text())
    assert [row["id"] for row in earlier["peers"]] == ["a", "b", "c"]

    # Several --only: those peers, in the config's order, then the rest from the latest summary.
    assert cli.main(["swarm", str(path), "--only", "c", "--only", "a"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [row["id"] for row in summary["peers"]] == ["a", "c", "b"]


def test_only_builds_the_same_commands_as_the_full_run(tmp_path):
    config = load_swarm_config(yaml.safe_load(_write_config(tmp_path, [{"id": "a"}, {"id": "b"}]).read_text()))
    full = dataclasses.replace(config, run_id=new_run_id())
    record_run_id(full)  # what the full run's launcher does
    selected, said = restart_config(config, only=["b"])
    assert said == [f"joining run {full.run_id!r}"] and [peer.id for peer in config.peers] == ["a", "b"]
    (full_b,) = [command for command in build_commands(full) if command.id == "b"]
    (only_b,) = build_commands(selected)
    assert (only_b.argv, only_b.env, only_b.log_path) == (full_b.argv, full_b.env, full_b.log_path)
    assert only_b.env[SWARM_RUN_ENV] == full.run_id and only_b.env[SWARM_NAME_ENV] == "run"


def _says(out: str, peer: str, text: str) -> bool:
    return any(line.startswith(f"[{peer}]") and text in line for line in out.splitlines())


def _says_last(out: str, peer: str, text: str) -> bool:
    """Whether a line of `peer` ends with `text`."""
    return any(line.startswith(f"[{peer}]") and line.rstrip().endswith(text) for line in out.splitlines())


def test_each_run_is_bound_to_a_new_id_and_only_restarts_join_it(tmp_path, capsys):
    """Messages are bound to their run (issue 23): every full run draws a new id, kept in run_dir for `--only`; a run
    of an earlier version (no id recorded) restarts a peer unbound, as the others are."""
    path = _write_config(tmp_path, [{"id": "a"}, {"id": "b"}])
    runs = []
    for _ in range(2):
        assert cli.main(["swarm", str(path)]) == 0
        runs.append((tmp_path / "run" / RUN_ID_FILE).read_text().strip())
        out = capsys.readouterr().out
        assert _says(out, "a", f"swarm=run run={runs[-1]}") and _says(out, "b", f"swarm=run run={runs[-1]}")
    assert runs[0] != runs[1] and all(re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", run) for run in runs)
    assert cli.main(["swarm", str(path), "--only", "b"]) == 0
    out = capsys.readouterr().out
    assert f"joining run {runs[1]!r}" in out and _says(out, "b", f"swarm=run run={runs[1]}")
    assert f"FTIS_SWARM_RUN={runs[1]}" in (tmp_path / "run" / "logs" / "b.cmd").read_text()
    assert cli.main(["swarm", str(path), "--dry-run"]) == 0
    assert "FTIS_SWARM_RUN='<drawn at start>'" in capsys.readouterr().out
    (tmp_path / "run" / RUN_ID_FILE).unlink()
    assert cli.main(["swarm", str(path), "--only", "a"]) == 0
    out = capsys.readouterr().out
    assert "no run id recorded: messages unbound" in out and _says_last(out, "a", "swarm=- run=")  # unbound, said so


def test_a_damaged_run_id_file_stops_the_restart_naming_the_file(tmp_path, capsys):
    """Only a missing file means an unbound run: one that exists but holds no valid id (not UTF-8, a control
    character, over 128 characters, empty) stops `--only` with one line naming it, and starts nothing. Only a
    bounded prefix of the file is read."""
    path = _write_config(tmp_path, [{"id": "a"}, {"id": "b"}])
    run_file = tmp_path / "run" / RUN_ID_FILE
    run_file.parent.mkdir(parents=True)
    for junk, problem in (
        (b"\xff\xfe", "is not UTF-8"),
        (b"run\x00id\n", "printable"),
        (b"", "is empty"),
        (b"\n", "is empty"),
        (b"x" * 129, "printable"),
        (b"x" * 50_000_000, "printable"),
    ):
        run_file.write_bytes(junk)
        with pytest.raises(SwarmConfigError, match="damaged") as info:
            restart_config(load_swarm_config(path), only=["a"])
        assert str(run_file) in str(info.value) and problem in str(info.value)
        assert cli.main(["swarm", str(path), "--only", "a"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(run_file) in err and "damaged" in err
        assert not (tmp_path / "run" / "logs").exists()  # nothing started
    run_file.write_text("20261206T000000Z-0123abcd\n")  # a valid id: joined
    assert restart_config(load_swarm_config(path), only=["a"])[0].run_id == "20261206T000000Z-0123abcd"


def test_unknown_only_peer_is_one_line_with_a_did_you_mean(tmp_path, capsys):
    path = _write_config(tmp_path, [{"id": "alpha"}, {"id": "beta"}])
    assert cli.main(["swarm", str(path), "--only", "bta"]) == 2
    err = capsys.readouterr().err
    assert err == "trl-ftis swarm: error: --only 'bta': no such peer (peers: alpha, beta); did you mean 'beta'?\n"
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    assert cli.main(["swarm", str(path), "--only", "zzz", "--dry-run"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_only_refuses_a_redis_job_the_launcher_starts(tmp_path):
    """On SLURM the default exchange is a Redis job that lives as long as its launcher: a peer started by another
    launcher could not meet the rest of the swarm there. An exchange_url of your own works."""
    raw = {"launcher": "slurm", "script": PEER, "run_dir": str(tmp_path / "run"), "peers": [{"id": "a"}, {"id": "b"}]}
    config = load_swarm_config(raw)
    assert config.exchange_started and config.sections["redis"] is not None
    with pytest.raises(SwarmConfigError) as info:
        restart_config(config, only=["b"])
    message = str(info.value)
    assert "\n" not in message and "exchange_url: redis://HOST:PORT/0" in message and "--only" in message
    restart_config(config, resume=True)  # the whole swarm again, with a new Redis job: fine
    own = load_swarm_config({**raw, "exchange_url": "redis://redis.cluster:6379/0"})
    selected, _ = restart_config(own, only=["b"])
    assert [peer.id for peer in selected.peers] == ["b"] and selected.exchange_url == "redis://redis.cluster:6379/0"


# ----------------------------------------------------------------------------------------------------------------
# --resume
# ----------------------------------------------------------------------------------------------------------------


def test_latest_checkpoint_skips_incomplete_ones(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 9)
    best = _checkpoint(tmp_path, 20)
    _checkpoint(tmp_path, 30, complete=False)  # killed while saving
    (tmp_path / "checkpoint-40").write_text("a file, not a folder")
    _checkpoint(tmp_path, 100, complete=False)
    (tmp_path / "checkpoint-x").mkdir()
    assert latest_checkpoint(tmp_path) == best


def test_the_checkpoint_rule_is_the_trainers(tmp_path):
    """The launcher does not import transformers, so it names the checkpoint folders itself: the same names, and the
    same choice as `trl_ftis.swarm.checkpoint.last_complete_checkpoint`."""
    pytest.importorskip("transformers")
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    from trl_ftis.swarm.checkpoint import last_complete_checkpoint

    assert (CHECKPOINT_PREFIX, TRAINER_STATE_FILE) == (PREFIX_CHECKPOINT_DIR, TRAINER_STATE_NAME)
    for step, complete in ((5, True), (12, True), (50, False)):
        _checkpoint(tmp_path, step, complete)
    assert str(latest_checkpoint(tmp_path)) == last_complete_checkpoint(tmp_path)


def test_resume_passes_each_peers_newest_complete_checkpoint(tmp_path, capsys):
    path = _write_config(tmp_path, [{"id": "a"}, {"id": "b", "args": {"resume_from_checkpoint": "last"}}, {"id": "c"}])
    run = tmp_path / "run"
    _checkpoint(run / "b", 10)
    best = _checkpoint(run / "b", 20)
    _checkpoint(run / "b", 30, complete=False)
    _checkpoint(run / "c", 5, complete=False)

    assert cli.main(["swarm", str(path), "--only", "b", "--only", "c", "--resume", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"# b: resuming from {best}\n" in out
    assert f"# c: no complete checkpoint in {run / 'c'} yet; it starts from the beginning\n" in out
    assert "--peer_id a" not in out and not (run / "logs").exists()

    assert cli.main(["swarm", str(path), "--only", "b", "--only", "c", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"trl-ftis swarm: b: resuming from {best}" in out
    b_argv = _argv_in_cmd_file(run / "logs" / "b.cmd")
    assert b_argv.count("--resume_from_checkpoint") == 1  # --resume replaces the config's `last`
    assert b_argv[b_argv.index("--resume_from_checkpoint") + 1] == str(best)
    assert f"--resume_from_checkpoint {best}" in (run / "logs" / "b.log").read_text()  # what the peer got
    assert "--resume_from_checkpoint" not in _argv_in_cmd_file(run / "logs" / "c.cmd")


# ----------------------------------------------------------------------------------------------------------------
# The summary's new columns and the end-of-run warnings
# ----------------------------------------------------------------------------------------------------------------


def _summary(**fields):
    return {"peer_id": "me", "rows_received": 0, "rows_accepted": 0, "refused": {}, "dropped": {}, **fields}


def test_refused_and_dropped_columns_sum_the_reasons(tmp_path):
    path = tmp_path / "ftis_summary.json"
    path.write_text(json.dumps({"steps": 3, "refused": {"stale": 4, "signature": 2}, "dropped": {}}))
    fields, _ = read_peer_summary(path, None)
    assert (fields["messages_refused"], fields["rows_dropped"]) == (6, 0)  # an empty count is 0, not unknown
    path.write_text(json.dumps({"steps": 3, "refused": "lots", "dropped": {"a": "b", "c": 2, "d": float("inf")}}))
    fields, _ = read_peer_summary(path, None)
    assert (fields["messages_refused"], fields["rows_dropped"]) == (None, 2)  # junk is not a count
    path.write_text('{"steps": 3, "refused": {"stale": 1' + "0" * 400 + '}, "dropped": 1' + "0" * 400 + "}")
    fields, _ = read_peer_summary(path, None)  # counts too large for a float are no counts, never a crash
    assert (fields["messages_refused"], fields["rows_dropped"]) == (0, None)
    path.write_text(json.dumps({"steps": 3}))
    fields, _ = read_peer_summary(path, None)
    assert fields["messages_refused"] is None and fields["rows_dropped"] is None
    row = {"id": "a", "status": "ok", "exit_code": 0, "wall_time_s": 1.0, "note": None, **fields}
    table = format_summary_table([row])
    header, _, line = table.splitlines()
    assert re.split(r"\s{2,}", header.strip())[4:] == [name for name, _ in TABLE_COLUMNS]  # `ess rows` is one header
    cells = line.split()[4:]
    assert cells[[field for _, field in TABLE_COLUMNS].index("rows_dropped")] == "-"


def test_exchange_problem_says_what_exchange_warning_says_and_more():
    secret = _summary(refused={"signature": 12, "unsigned": 3})
    assert exchange_problem(secret) == exchange_warning(secret)  # one wording for the peer and the launcher
    assert exchange_problem(secret, "b").startswith("b: accepted no peer rows: received 0 rows; refused 15 messages")
    dropped = _summary(rows_received=40, rows_accepted=8, dropped={"too_long": 30})
    assert exchange_problem(dropped) == exchange_warning(dropped) and exchange_problem(dropped) is not None

    # Refused most messages: more refused messages than rows received, so more than the messages accepted.
    most = _summary(rows_received=10, rows_accepted=10, refused={"stale": 30})
    assert exchange_warning(most) is None
    assert exchange_problem(most) == (
        "me: refused most messages (30 refused, 10 rows received): received 10 rows; refused 30 messages (stale: 30)."
    )
    # A few refused for their signature: some peer lacks the secret, even though the others' rows came in.
    few = _summary(rows_received=300, rows_accepted=290, refused={"unsigned": 4, "stale": 1})
    assert exchange_problem(few) == (
        "me: refused 4 messages for their signature: received 300 rows; refused 5 messages (unsigned: 4, stale: 1); "
        "the peers do not share one swarm secret or key set (docs/security.md)."
    )
    assert exchange_problem(_summary(rows_received=300, rows_accepted=290, refused={"stale": 20})) is None
    assert exchange_problem({"steps": 7, "reward": 0.5}) is None  # says nothing about an exchange
    unbound = _summary(refused={"run": 6})  # a peer started by hand without this run's id
    assert exchange_problem(unbound).endswith(
        "refused 6 messages (run: 6); messages of another swarm or run were refused: leftovers of an earlier run, "
        "or a peer not given this run's id (a peer started by hand joins a `trl-ftis swarm` run with FTIS_SWARM_RUN "
        "set to its run_dir/swarm_run; docs/swarm.md)."
    )
    junk = {"rows_accepted": "many", "rows_received": float("nan"), "refused": [1], "dropped": {"x": "y"}}
    assert exchange_problem(junk, "j") == "j: accepted no peer rows: received 0 rows; refused no messages."


def test_the_launchers_hint_for_signature_refusals():
    text = peer_warning(_summary(refused={"signature": 12}), "b")
    assert text.startswith("b: accepted no peer rows: received 0 rows; refused 12 messages (signature: 12); ")
    assert "FTIS_SWARM_SECRET" in text and "--only" in text and text.endswith(".") and ".;" not in text
    assert "FTIS_SWARM_SECRET" not in peer_warning(_summary(refused={"stale": 1}), "b")


def test_a_peer_without_the_secret_is_warned_about_at_the_end(tmp_path, capsys):
    """A swarm where one peer has the secret and the others not: it refused every message (unsigned), another most of
    them; the launcher says so per peer, with the reasons and the hint, then ends with exit code 0 as before."""
    lonely = _summary(peer_id="lonely", refused={"unsigned": 12, "signature": 3})
    mostly = _summary(peer_id="mostly", rows_received=10, rows_accepted=10, refused={"stale": 30})
    healthy = _summary(peer_id="healthy", rows_received=300, rows_accepted=290, refused={"stale": 2})
    path = _write_config(
        tmp_path,
        [{"id": name, "args": {"summary_json": json.dumps(data)}} for name, data in
         (("lonely", lonely), ("mostly", mostly), ("healthy", healthy))],
    )  # fmt: skip
    assert cli.main(["swarm", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    warnings = [line for line in lines if line.startswith("[swarm]") and "warning:" in line]
    assert len(warnings) == 2, out
    assert (
        "warning: lonely: accepted no peer rows: received 0 rows; refused 15 messages (unsigned: 12, signature: 3)"
        in warnings[0]
    )
    assert "FTIS_SWARM_SECRET" in warnings[0]
    assert "warning: mostly: refused most messages (30 refused, 10 rows received)" in warnings[1]
    # After the table, before the last line, which counts them.
    table_end = max(i for i, line in enumerate(lines) if line.startswith("healthy "))
    assert table_end < lines.index(warnings[0]) < lines.index(warnings[1]) < len(lines) - 1
    assert lines[-1].endswith(
        f"all peers finished; exit code 0 (2 exchange warnings above); summary in {tmp_path / 'run' / 'summary.json'}"
    )
    rows = {row["id"]: row for row in json.loads((tmp_path / "run" / "summary.json").read_text())["peers"]}
    assert rows["lonely"]["messages_refused"] == 15 and rows["lonely"]["warning"] in warnings[0]
    assert rows["healthy"]["warning"] is None and rows["healthy"]["messages_refused"] == 2


# ----------------------------------------------------------------------------------------------------------------
# on_failure: continue, and restarting a failed peer while the others train
# ----------------------------------------------------------------------------------------------------------------


def test_on_failure_continue_lets_the_others_finish_and_the_run_still_fails(tmp_path):
    import io

    from trl_ftis.launcher import run_swarm

    crashed = tmp_path / "crashed"
    peers = [{"id": "crash", "args": {"fail_once": str(crashed)}}, {"id": "steady", "args": {"hold": 1.0}}]
    config = load_swarm_config(_write_config(tmp_path, peers, on_failure="continue"))
    out = io.StringIO()
    assert run_swarm(config, grace=2, stream=out) == 1
    text = out.getvalue()
    assert "peer crash exited with code 3; the others go on (on_failure: continue)" in text
    assert "stopping the other peers" not in text
    # The hint names this run's config file and run folder, not a placeholder: following it restarts this run.
    config_file, run_dir = tmp_path / "swarm.yaml", tmp_path / "run"
    assert f"restart it with `trl-ftis swarm {config_file} --run-dir {run_dir} --only crash --resume`" in text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = {row["id"]: row for row in summary["peers"]}
    assert (rows["crash"]["status"], rows["steady"]["status"]) == ("failed", "ok")
    assert summary["reason"] == "all peers ended; failed: crash"


def test_on_failure_takes_only_stop_or_continue(tmp_path):
    raw = yaml.safe_load(_write_config(tmp_path, [{"id": "a"}], on_failure="ignore").read_text())
    with pytest.raises(SwarmConfigError, match=r"`on_failure` must be 'stop' .* or 'continue'"):
        load_swarm_config(raw)
    assert load_swarm_config({**raw, "on_failure": "stop"}).on_failure == "stop"
    assert load_swarm_config({k: v for k, v in raw.items() if k != "on_failure"}).on_failure == "stop"


def test_a_failed_peer_restarts_with_only_while_the_others_keep_training(tmp_path):
    """The issue's case: one peer of a launcher swarm dies; the others go on, and `--only PEER --resume` in another
    shell starts it again (from its newest checkpoint), its first log kept, the others' files untouched."""
    crashed, release = tmp_path / "crashed", tmp_path / "release"
    peers = [
        {"id": "flaky", "args": {"fail_once": str(crashed)}},
        {"id": "steady", "args": {"wait_for": str(release)}},  # trains until the test lets it finish
    ]
    path = _write_config(tmp_path, peers, on_failure="continue")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "trl_ftis.cli", "swarm", str(path)]
    full = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        logs = tmp_path / "run" / "logs"
        for _ in range(300):  # the flaky peer crashed and the full run noticed
            if crashed.exists() and "crash flaky" in (logs / "flaky.log").read_text():
                break
            time.sleep(0.05)
        _checkpoint(tmp_path / "run" / "flaky", 4)
        restarted = subprocess.run(
            [*command, "--only", "flaky", "--resume"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert f"flaky: resuming from {tmp_path / 'run' / 'flaky' / 'checkpoint-4'}" in restarted.stdout
        assert full.poll() is None, "the full run, with its steady peer, is still going"
        assert "crash flaky" in (logs / "flaky.log.1").read_text() and "done flaky" in (logs / "flaky.log").read_text()
        assert not (logs / "steady.log.1").exists()
        release.write_text("go")
        output, _ = full.communicate(timeout=60)
    finally:
        if full.poll() is None:
            full.kill()
    # The full run saw its flaky peer fail, but ended after the restart had finished it: its summary is the swarm's,
    # with the restart's row for flaky, and the run succeeded.
    assert full.returncode == 0, output
    assert "peer steady finished (exit code 0)" in output and "the others go on" in output
    assert "done steady" in (logs / "steady.log").read_text()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = {row["id"]: row for row in summary["peers"]}
    assert (rows["flaky"]["status"], rows["steady"]["status"]) == ("ok", "ok")
    assert rows["flaky"]["restarted"] and "restarted by a later launcher (--only)" in rows["flaky"]["note"]
    assert summary["exit_code"] == 0 and summary["reason"].startswith("all peers finished (flaky: restarted")
    kept = json.loads((tmp_path / "run" / "summary.json.1").read_text())  # the restart's own summary, kept
    assert [row["id"] for row in kept["peers"] if not row.get("earlier")] == ["flaky"]


def _state(peer_id: str, started_at: float, status: str = "ok"):
    from types import SimpleNamespace

    return SimpleNamespace(command=SimpleNamespace(id=peer_id), started_at=started_at, status=status)


def _row(peer_id: str, status: str = "ok", **fields):
    return {"id": peer_id, "status": status, "exit_code": 0 if status == "ok" else -9, "note": None, **fields}


def test_a_launcher_ending_last_keeps_the_rows_of_the_peers_a_later_launcher_restarted(tmp_path):
    """b died at its step 150 and `--only b --resume`, started later, finished it and wrote summary.json: the first
    launcher's summary takes that row for b and ends 0, instead of "failed: b"."""
    from trl_ftis.launcher.restarts_merge import RESTARTED_NOTE, merge_restarts

    restart = {"peers": [_row("b", steps=300, started_at=2000.0), _row("a", earlier=True, started_at=500.0)]}
    (tmp_path / "summary.json").write_text(json.dumps(restart))
    summary = {"exit_code": 1, "reason": "all peers ended; failed: b", "peers": [_row("a"), _row("b", "failed")]}
    merged = merge_restarts(tmp_path, summary, [_state("a", 1000.0), _state("b", 1000.0, "failed")])
    rows = {row["id"]: row for row in merged["peers"]}
    assert rows["a"]["started_at"] == 1000.0 and "restarted" not in rows["a"]  # the restart's carried row is older
    assert rows["b"]["steps"] == 300 and rows["b"]["restarted"] and rows["b"]["note"] == RESTARTED_NOTE
    assert (merged["exit_code"], merged["reason"]) == (0, "all peers finished (b: restarted by a later launcher)")


def test_nothing_newer_leaves_the_summary_as_it_was_with_each_row_stamped(tmp_path):
    from trl_ftis.launcher.restarts_merge import merge_restarts

    summary = {"exit_code": 1, "reason": "all peers ended; failed: b", "peers": [_row("a"), _row("b", "failed")]}
    states = [_state("a", 1000.0), _state("b", 1000.0, "failed")]
    for existing in (None, "not json", json.dumps({"peers": [_row("b", started_at=900.0)]})):
        if existing is not None:
            (tmp_path / "summary.json").write_text(existing)
        merged = merge_restarts(tmp_path, summary, states)
        assert (merged["exit_code"], merged["reason"]) == (1, "all peers ended; failed: b")
        assert [row["started_at"] for row in merged["peers"]] == [1000.0, 1000.0]
        assert not any(row.get("restarted") for row in merged["peers"])


def test_a_launcher_that_stopped_its_peers_keeps_its_own_reason(tmp_path):
    """Interrupted (or stopping the others after a failure): the newer row is shown, the outcome stays this run's."""
    from trl_ftis.launcher.restarts_merge import merge_restarts

    (tmp_path / "summary.json").write_text(json.dumps({"peers": [_row("b", started_at=2000.0)]}))
    peers = [_row("a", "stopped"), _row("b", "failed")]
    summary = {"exit_code": 130, "reason": "interrupted by SIGINT", "peers": peers}
    merged = merge_restarts(tmp_path, summary, [_state("a", 1000.0, "stopped"), _state("b", 1000.0, "failed")])
    assert (merged["exit_code"], merged["reason"]) == (130, "interrupted by SIGINT")
    assert merged["peers"][1]["restarted"]


def test_no_speed_hint_when_a_peer_failed_or_was_restarted():
    """A peer killed and restarted makes the others wait for it: that is not a difference of speeds."""
    from trl_ftis.launcher.summary import wait_hint

    def row(peer, wait_share, train_s, **fields):
        return {"id": peer, "status": "ok", "wait_share": wait_share, "train_s": train_s, "steps": 10, **fields}

    fast, slow = row("fast", 0.4, 12.0), row("slow", 0.02, 30.0)
    assert wait_hint([fast, slow]) is not None
    assert wait_hint([fast, {**slow, "status": "failed"}]) is None
    assert wait_hint([fast, {**slow, "restarted": True}]) is None
    assert wait_hint([{**fast, "earlier": True}, slow]) is None  # a restart's summary: the other peer's old row


# ----------------------------------------------------------------------------------------------------------------
# controls: each peer's configuration run again without peers, next to the swarm
# ----------------------------------------------------------------------------------------------------------------


def replace_run(config):
    return dataclasses.replace(config, run_id="run-1")


def test_controls_run_each_peers_configuration_alone_beside_the_swarm(tmp_path, capsys):
    peers = [
        {"id": "a", "args": {"summary": "good"}},
        {"id": "b", "args": {"summary": "good"}, "controls": ["alone"]},  # its own list wins over the top level
    ]
    path = _write_config(
        tmp_path,
        peers,
        controls=["alone", "alone-rows"],
        args={"lines": 1, "expected_peers": ["a", "b"], "gradient_accumulation_steps": 3},
    )
    config = load_swarm_config(path)
    assert [(p.id, p.control_of) for p in config.peers] == [
        ("a", None),
        ("b", None),
        ("a-alone", "a"),
        ("a-alone-rows", "a"),
        ("b-alone", "b"),
    ]
    control = config.peer("a-alone-rows")
    assert "expected_peers" not in control.args and control.args["gradient_accumulation_steps"] == 6  # 2 peers' rows
    assert config.peer("a-alone").args["gradient_accumulation_steps"] == 3
    commands = build_commands(replace_run(config))
    bound = {command.id: SWARM_RUN_ENV in command.env for command in commands}
    assert bound == {"a": True, "b": True, "a-alone": False, "a-alone-rows": False, "b-alone": False}
    # A control runs as its peer (same --peer_id: the same data and seeds), in its own folder and log.
    as_peer = {command.id: command.argv[command.argv.index("--peer_id") + 1] for command in commands}
    assert as_peer == {"a": "a", "b": "b", "a-alone": "a", "a-alone-rows": "a", "b-alone": "b"}
    assert {command.id: command.output_dir.name for command in commands}["a-alone"] == "a-alone"
    assert cli.main(["swarm", str(path)]) == 0
    out = capsys.readouterr().out
    logs = tmp_path / "run" / "logs"
    for peer in ("a-alone", "a-alone-rows", "b-alone"):  # started for real, with no exchange and no run binding
        assert "exchange=None" in (logs / f"{peer}.log").read_text()
        assert "--exchange_url" not in _argv_in_cmd_file(logs / f"{peer}.cmd")
    assert "--exchange_url" in _argv_in_cmd_file(logs / "a.cmd")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = {row["id"]: row for row in summary["peers"]}
    assert {peer: row["control_of"] for peer, row in rows.items()} == {
        "a": None,
        "b": None,
        "a-alone": "a",
        "a-alone-rows": "a",
        "b-alone": "b",
    }
    assert all(row["status"] == "ok" for row in rows.values())
    assert (
        "a-alone-rows*" in out and "* control: the configuration of a (a-alone), a (a-alone-rows), b (b-alone)" in out
    )


@pytest.mark.parametrize(
    ("controls", "problem"),
    [
        (["alone", "lonely"], "unknown control 'lonely': the controls are alone, alone-rows"),
        (["alone", "alone"], "lists a control twice"),
        ("alone", "must be a list of alone, alone-rows"),
    ],
)
def test_a_wrong_controls_list_is_named_before_anything_starts(tmp_path, controls, problem):
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(_write_config(tmp_path, [{"id": "a"}], controls=controls))
    assert any("`controls`" in error and problem in error for error in info.value.errors), info.value.errors


def test_a_controls_files_are_its_peers_checked_once(tmp_path):
    from trl_ftis.launcher import check_files

    peers = [{"id": "a", "model": str(tmp_path / "no" / "model")}, {"id": "b"}]
    problems = check_files(load_swarm_config(_write_config(tmp_path, peers, controls=["alone", "alone-rows"])))
    assert problems == [f"`peers[0] (id 'a').model`: no such local model folder {tmp_path / 'no' / 'model'}"]


def test_a_control_id_that_clashes_with_a_peer_is_refused(tmp_path):
    with pytest.raises(SwarmConfigError, match="the control 'a-alone' of peer 'a': its id is also the id of a peer"):
        load_swarm_config(_write_config(tmp_path, [{"id": "a"}, {"id": "a-alone"}], controls=["alone"]))


def test_the_table_shows_waiting_and_accuracy_and_hints_at_free_running_when_speeds_differ():
    from trl_ftis.launcher.summary import wait_hint

    def row(peer, wait_share, train_s, steps, **fields):
        return {
            "id": peer,
            "status": "ok",
            "exit_code": 0,
            "wall_time_s": train_s,
            "note": None,
            "wait_share": wait_share,
            "train_s": train_s,
            "steps": steps,
            **fields,
        }

    fast = row("fast", 0.36, 12.0, 10, accuracy_before=0.46, accuracy_after=0.52)
    slow = row("slow", 0.02, 30.0, 10)
    table = format_summary_table([fast, slow])
    fast_line = next(line for line in table.splitlines() if line.startswith("fast"))
    assert fast_line.split()[-3:] == ["36%", "-", "0.46->0.52"]
    assert wait_hint([fast, slow]) == (
        "hint: peers waited on each other much of their training time (fast 36%) because their speeds differ (1.2 to "
        "3 s a step): `exchange_mode: free` lets each peer train at its own speed on the rows that have arrived "
        "(docs/swarm.md)"
    )
    assert table.splitlines()[-1] == wait_hint([fast, slow])
    assert wait_hint([fast, row("slow", 0.02, 13.0, 10)]) is None  # about as fast: waiting is not about speed
    assert wait_hint([row("a", 0.05, 12.0, 10), slow]) is None  # little waiting
    control = {**row("slow-alone", 0.0, 10.0, 10), "control_of": "slow"}
    assert wait_hint([fast, control]) is None  # a control never waits: not a swarm peer


def test_the_peer_rows_worth_column_says_it_counts_rows_not_a_value():
    """`peer_value.rows_worth` is the effective sample size of the received rows in own rows: 95.96 for 96 received
    rows read like a value under `worth`; the header says what it counts, and the guide explains it."""
    assert dict((field, header) for header, field in TABLE_COLUMNS)["peer_rows_worth"] == "ess rows"
    row = {"id": "a", "status": "ok", "exit_code": 0, "wall_time_s": 1.0, "note": None, "peer_rows_worth": 95.96}
    header = format_summary_table([row]).splitlines()[0]
    assert header.endswith("ess rows  accuracy") and "worth" not in header
    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "swarm-launcher.md").read_text().split())
    assert "`ess rows`, the effective sample size" in guide


def test_a_peer_and_its_control_are_compared_pair_by_pair_on_the_same_problems():
    from trl_ftis.launcher.summary import control_lines, paired_difference

    peer = [1] * 60 + [0] * 40  # 0.60
    control = [1] * 45 + [0] * 55  # 0.45, the same problems: 15 more right, none fewer
    compared = paired_difference(peer, control)
    assert compared["n"] == 100 and compared["difference"] == pytest.approx(0.15)
    # Differences are 15 ones and 85 zeros: sd = sqrt(0.15 * 0.85 * 100 / 99), SE = sd / 10.
    assert compared["se"] == pytest.approx((0.15 * 0.85 * 100 / 99) ** 0.5 / 10)
    assert compared["beyond_2se"]
    assert paired_difference(peer, control[:50]) is None  # not the same problems
    close = paired_difference([1, 0] * 50, [0, 1] * 50)  # the same accuracy, every problem different
    assert close["difference"] == 0 and not close["beyond_2se"]
    rows = [
        {"id": "big", "accuracy_after": 0.60},
        {"id": "big-alone", "control_of": "big", "accuracy_after": 0.45, "vs_peer": compared},
        {"id": "small-alone", "control_of": "small", "accuracy_after": 0.5, "vs_peer": close},
        {"id": "small", "accuracy_after": 0.5},
    ]
    # One run's standard error is evaluation noise only: no "ahead" or "behind" from it (intervals over seeds say
    # that, `trl_ftis.worth_report`), even 4 standard errors away.
    assert control_lines(rows) == [
        f"big vs big-alone: accuracy after 0.600 vs 0.450, difference +0.150 (SE {compared['se']:.3f} paired over 100 "
        "problems: evaluation noise only, one run)",
        f"small vs small-alone: accuracy after 0.500 vs 0.500, difference +0.000 (SE {close['se']:.3f} paired over "
        "100 problems: evaluation noise only, one run)",
    ]


def test_a_peer_that_trained_without_an_exchange_gets_no_exchange_warning(tmp_path, capsys):
    """`make demo`'s own alone baselines are peers that drop their exchange (`exchange_url` None in their summary): no
    "accepted no peer rows" warning for them, while a swarm peer that accepted nothing still gets one."""
    lonely = {"peer_id": "x", "steps": 2, "rows_received": 0, "rows_accepted": 0, "refused": {}, "dropped": {}}
    alone = json.dumps({**lonely, "exchange_url": None})
    starved = json.dumps({**lonely, "exchange_url": "dir:///somewhere"})
    peers = [{"id": "alone", "args": {"summary_json": alone}}, {"id": "starved", "args": {"summary_json": starved}}]
    assert cli.main(["swarm", str(_write_config(tmp_path, peers))]) == 0
    rows = {row["id"]: row for row in json.loads((tmp_path / "run" / "summary.json").read_text())["peers"]}
    assert rows["alone"]["warning"] is None and "accepted no peer rows" in rows["starved"]["warning"]
    assert "warning: alone" not in capsys.readouterr().out
