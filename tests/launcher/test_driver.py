"""The driver every backend shares (`trl_ftis.launcher.driver.drive`), run on a fake backend that starts nothing:
signals stop the swarm, a failing peer stops the others, the exit codes, the summary, the stop that always runs. And
the schema's report of several mistakes at once.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest
from waits import returns_within  # tests/ is on sys.path

from trl_ftis.exit_codes import INTERRUPTED_EXIT_CODE
from trl_ftis.launcher import (
    SwarmConfigError,
    backend_kind,
    backend_names,
    build_commands,
    format_summary_table,
    load_swarm_config,
    run_swarm,
)
from trl_ftis.launcher.backend import Backend, Console, Outcome, PeerState, Signals
from trl_ftis.launcher.driver import backend_for, drive
from trl_ftis.launcher.local import LocalBackend
from trl_ftis.launcher.slurm.backend import SlurmBackend
from trl_ftis.peer_ids import peer_id_problem


class FakeBackend:
    """Plays a swarm from a script: `plan[i]` is what the i-th `poll` does, a callable given the backend (it may
    finish peers, raise, send a signal) returning an `Outcome` or None. Records every call the driver makes."""

    verb = "start"
    poll_interval = 0.01

    def __init__(self, config, plan=(), problems=(), start_outcome=None):
        self.config = config
        self.exchange_url = config.exchange_url
        self.states_ = [PeerState(command) for command in build_commands(config)]
        self.plan = list(plan)
        self.problems_ = list(problems)
        self.start_outcome = start_outcome
        self.calls: list[str] = []
        self.grace = None
        self.stop_signals = None

    def problems(self):
        self.calls.append("problems")
        return self.problems_

    def dry_run(self, stream):
        stream.write("fake dry run\n")

    def start(self, console, signals):
        self.calls.append("start")
        self.console, self.signals = console, signals
        for state in self.states_:
            state.status, state.started, state.started_at, state.pid = "running", time.monotonic(), time.time(), 4242
        console.say("started the fake peers")
        console.peer(self.states_[0].command.id, "hello from the first peer")
        return self.start_outcome

    def poll(self):
        self.calls.append("poll")
        if not self.plan:
            return None
        return self.plan.pop(0)(self)

    def stop(self, grace):
        self.calls.append("stop")
        self.grace = grace
        self.stop_signals = list(self.signals.received) if hasattr(self, "signals") else None
        for state in self.states_:
            if state.returncode is None and state.status == "running":
                state.status, state.returncode, state.ended = "stopped", -signal.SIGTERM, time.monotonic()

    def finish(self):
        self.calls.append("finish")

    def states(self):
        return self.states_

    def summary_row(self, state, row):
        row["fake"] = f"row of {state.command.id}"
        return row

    def summary_fields(self):
        return {"scheduler": "fake"}

    # helpers for the plans
    def end(self, index, code):
        state = self.states_[index]
        state.returncode, state.ended = code, time.monotonic()
        state.status = "ok" if code == 0 else "failed"


def _config(tmp_path, peers=("a", "bb")):
    return load_swarm_config(
        {"script": "never-run.py", "run_dir": str(tmp_path / "run"), "peers": [{"id": p} for p in peers]}
    )


def _summary(tmp_path):
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def _all_finish(backend):
    for index in range(len(backend.states_)):
        backend.end(index, 0)
    return Outcome(0, "all peers finished")


def test_success_runs_every_step_in_order_and_writes_the_summary(tmp_path):
    config = _config(tmp_path)
    backend = FakeBackend(config, plan=[lambda b: None, lambda b: None, _all_finish])
    out = io.StringIO()
    assert drive(backend, config, grace=3, stream=out) == 0
    assert backend.calls == ["problems", "start", "poll", "poll", "poll", "stop", "finish"]
    assert backend.grace == 3  # the stop always runs, after success too, with the caller's grace
    summary = _summary(tmp_path)
    assert (summary["exit_code"], summary["reason"], summary["scheduler"]) == (0, "all peers finished", "fake")
    assert summary["exchange_url"] == config.exchange_url and list(summary)[-1] == "peers"
    assert [(r["id"], r["status"], r["exit_code"], r["pid"], r["fake"]) for r in summary["peers"]] == [
        ("a", "ok", 0, 4242, "row of a"),
        ("bb", "ok", 0, 4242, "row of bb"),
    ]
    text = out.getvalue()
    # Prefixed, padded console lines; the table; the last line.
    assert "[swarm] started the fake peers" in text and "[a]  hello from the first peer" in text
    assert format_summary_table(summary["peers"]) in text
    assert text.rstrip().endswith(f"all peers finished; exit code 0; summary in {tmp_path / 'run' / 'summary.json'}")


def test_a_failing_peer_stops_the_others_and_exits_1(tmp_path):
    config = _config(tmp_path)

    def b_fails(backend):
        backend.end(1, 3)
        return Outcome(1, "peer bb exited with code 3")

    backend = FakeBackend(config, plan=[b_fails, lambda b: pytest.fail("polled after the failure")])
    assert drive(backend, config, grace=0, stream=io.StringIO()) == 1
    assert backend.calls[-3:] == ["poll", "stop", "finish"]
    rows = {row["id"]: row for row in _summary(tmp_path)["peers"]}
    assert (rows["bb"]["status"], rows["bb"]["exit_code"]) == ("failed", 3)
    assert (rows["a"]["status"], rows["a"]["exit_code"]) == ("stopped", -signal.SIGTERM)
    assert _summary(tmp_path)["reason"] == "peer bb exited with code 3"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_the_swarm_with_130_and_the_handlers_are_restored(tmp_path, sig):
    config = _config(tmp_path)
    before = signal.getsignal(sig)

    def signal_me(backend):
        os.kill(os.getpid(), sig)  # what Ctrl-C / kill / a closed terminal do; the driver's handler records it
        time.sleep(0.05)
        return None

    backend = FakeBackend(config, plan=[signal_me, lambda b: pytest.fail("polled after the signal")])
    out = io.StringIO()
    assert drive(backend, config, grace=1, stream=out) == INTERRUPTED_EXIT_CODE
    assert backend.calls == ["problems", "start", "poll", "stop", "finish"]
    assert backend.stop_signals == [sig]  # the backend's stop sees the signal (a second one skips the grace)
    assert signal.getsignal(sig) is before
    summary = _summary(tmp_path)
    assert summary["reason"] == f"interrupted by {sig.name}" and summary["exit_code"] == 130
    assert {row["status"] for row in summary["peers"]} == {"stopped"}
    assert f"interrupted by {sig.name}; exit code 130" in out.getvalue()


def test_an_error_in_the_backend_still_stops_everything(tmp_path):
    config = _config(tmp_path)

    def boom(backend):
        raise RuntimeError("squeue said something odd, redis://:pw-123@host:1/0")

    backend = FakeBackend(config, plan=[boom])
    out = io.StringIO()
    assert drive(backend, config, stream=out) == 1
    assert backend.calls[-2:] == ["stop", "finish"]
    reason = _summary(tmp_path)["reason"]
    assert reason.startswith("launcher error: RuntimeError: squeue said something odd")
    assert "pw-123" not in reason and "pw-123" not in out.getvalue()  # the driver's lines are redacted
    assert "[swarm] launcher error: RuntimeError" in out.getvalue()


def test_a_failed_start_is_stopped_and_reported_without_polling(tmp_path):
    config = _config(tmp_path)
    backend = FakeBackend(config, start_outcome=Outcome(1, "could not submit peer bb: no such partition"))
    assert drive(backend, config, stream=io.StringIO()) == 1
    assert backend.calls == ["problems", "start", "stop", "finish"]
    assert _summary(tmp_path)["reason"] == "could not submit peer bb: no such partition"


def test_the_pre_start_check_starts_and_writes_nothing(tmp_path):
    config = _config(tmp_path)
    backend = FakeBackend(config, problems=["peer 'a': script never-run.py does not exist", "no sbatch on PATH"])
    with pytest.raises(SwarmConfigError) as info:
        drive(backend, config, stream=io.StringIO())
    assert info.value.errors == ["peer 'a': script never-run.py does not exist", "no sbatch on PATH"]
    assert str(info.value).startswith("cannot start the swarm:\n  - peer 'a'")
    assert backend.calls == ["problems"] and not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="grace must be >= 0"):
        drive(FakeBackend(config), config, grace=-1, stream=io.StringIO())


def test_signals_wait_wakes_up_at_once():
    signals = Signals()
    threading.Timer(0.05, signals.wake).start()
    # a wait that slept through wake() or the signal would run to its timeout, far past the hang guard
    returns_within(lambda: signals.wait(600), what="a wait woken by wake()")
    assert signals.outcome() is None
    signals.handler(signal.SIGTERM, None)
    returns_within(lambda: signals.wait(600), what="a wait after SIGTERM")
    assert signals.count == 1 and signals.outcome() == Outcome(130, "interrupted by SIGTERM")


def test_console_prefixes_line_up_and_hide_url_passwords():
    out = io.StringIO()
    console = Console(out, ["a", "longer-id"])
    console.peer("a", "x")
    console.peer("longer-id", "y")
    console.say("exchange redis://:secret-pw@h:6379/0")
    assert out.getvalue().splitlines() == [
        "[a]         x",
        "[longer-id] y",
        "[swarm]     exchange redis://:<redacted>@h:6379/0",
    ]


def test_every_built_in_backend_follows_the_protocol(tmp_path):
    assert {"local", "slurm"} <= set(backend_names())
    members = {name for name in dir(Backend) if not name.startswith("_")} | set(Backend.__annotations__)
    for cls in (LocalBackend, SlurmBackend):
        missing = {name for name in members if not hasattr(cls, name)}
        instance_attrs = {"exchange_url"}  # set in __init__
        assert missing <= instance_attrs, (cls, missing)
    config = _config(tmp_path)
    assert isinstance(backend_for(config), LocalBackend)
    slurm_config = load_swarm_config({"launcher": "slurm", "script": "p.py", "peers": [{"id": "a"}]})
    assert isinstance(backend_for(slurm_config), SlurmBackend) and backend_for(slurm_config).exchange_url is None


def test_run_swarm_drives_the_configs_backend(tmp_path, monkeypatch):
    config = _config(tmp_path)
    made = []

    def fake(config):
        made.append(FakeBackend(config, plan=[_all_finish]))
        return made[-1]

    monkeypatch.setattr(backend_kind("local"), "create", fake)
    assert run_swarm(config, grace=2, stream=io.StringIO()) == 0
    assert made[0].calls[-2:] == ["stop", "finish"] and made[0].grace == 2


# ----------------------------------------------------------------------------------------------------------------
# The schema: every mistake at once, each with its location, a did-you-mean for unknown keys
# ----------------------------------------------------------------------------------------------------------------


def test_several_mistakes_are_reported_at_once_with_locations():
    raw = {
        "launcher": "slurm",
        "script": "train.py",
        "exchnage_url": "dir:///x",
        "slurm": {"gpus_per_node": 1, "time": "soon"},
        "redis": {"port": 70000, "gpus": 1},
        "args": {"lr": {"a": 1}},
        "peers": [
            {"id": "a", "lorra": True, "env": {"X": True}},
            {"id": "b", "slurm": {"gpus_per_node": 2, "nodes": 2}, "num_processes": 0},
            {"id": "c d"},
            "not-a-mapping",
        ],
    }
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    errors = info.value.errors
    expected = [
        "top level: unknown key `exchnage_url` (allowed: script, launcher, exchange_url, run_dir, args, env, "
        "on_failure, controls, seeds, peers, slurm, redis); did you mean `exchange_url`?",
        "top level: `args.lr` must be a string, number, boolean, null or a list of those, got dict",
        "top level: unknown key `slurm.gpus_per_node` (allowed: nodes, gpus, cpus, mem, time, partition, account, "
        "extra, setup); did you mean `slurm.gpus`?",
        'top level: `slurm.time` must be minutes (an integer >= 1) or a SLURM time such as "04:00:00" or '
        "\"1-12:00:00\" (quote it in YAML), got 'soon'",
        "top level: `redis.port` must be a TCP port (1-65535), or 0 for a free port on the job's node, got 70000",
        "top level: unknown key `redis.gpus` (allowed: start, port, password, server, start_timeout, cpus, mem, time, "
        "partition, account, extra, setup); did you mean `redis.cpus`? (the Redis job is one CPU job on one node)",
        "peers[0] (id 'a'): `env.X` must be a string or a number, got bool True (quote it: 'true' / '1')",
        "peers[0] (id 'a'): unknown key `lorra` (allowed: id, model, lora, args, env, script, launcher, "
        "accelerate_config, num_processes, gpus, gpu_share, vllm_server, controls, slurm); did you mean `lora`?",
        "peers[1] (id 'b'): `num_processes` must be an integer >= 1, got 0",
        "peers[1] (id 'b'): unknown key `slurm.gpus_per_node` (allowed: nodes, gpus, cpus, mem, time, partition, "
        "account, extra, setup); did you mean `slurm.gpus`?",
        f"peers[2] (id 'c d'): invalid `id`: {peer_id_problem('c d')}",
        "peers[3]: each peer must be a mapping with at least `id`, got str",
    ]
    assert sorted(errors) == sorted(expected), "\n".join(errors)
    message = str(info.value)
    assert message.startswith("invalid swarm config:\n  - top level: ")
    assert all(f"  - {error}" in message for error in errors)
    assert errors.index(expected[0]) < errors.index(expected[-1])  # the top level first, then peer by peer


def test_cross_key_checks_name_both_keys():
    raw = {
        "script": "p.py",
        "peers": [
            {"id": "a", "gpu_share": 0.5, "args": {"gpu_memory_fraction": 0.4}},
            {"id": "c", "model": "m", "lora": True, "args": {"model_name_or_path": "n", "use_peft": True}},
        ],
    }
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    assert info.value.errors == [
        "peers[0] (id 'a'): `gpu_share` and args.gpu_memory_fraction both set; keep one",
        "peers[1] (id 'c'): `model` and args.model_name_or_path both set; keep one; `lora` and args.use_peft both "
        "set; keep one",
    ]


def test_a_duplicate_id_is_reported_with_the_other_peers_mistakes():
    raw = {"script": "p.py", "peers": [{"id": "a"}, {"id": "a", "lora": "yes"}, {"id": "b", "gpus": "0;1"}]}
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    assert info.value.errors == [
        "peers[1] (id 'a'): duplicate `id` 'a' (also used by peers[0])",
        "peers[1] (id 'a'): `lora` must be true or false, got 'yes'",
        "peers[2] (id 'b'): `gpus` must be a device list such as \"0,1\", 0 or [0, 1], got '0;1'",
    ]
