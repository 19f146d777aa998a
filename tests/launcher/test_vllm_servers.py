"""The local launcher starts, watches and stops each peer's vLLM server (a peer's `vllm_server:` block).

The servers are `tests/fixtures/vllm_stand_in.py` (`vllm_server.command`), which answers GET /health like `trl
vllm-serve`, or never does, or dies; the peers are a tiny script written by these tests that asks its server's
/health before anything else (so that a peer started too early fails). Every process writes its pid to a file; the
tests check those pids are gone (a zombie counts as gone) and kill any survivor afterwards.
"""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from file_modes import file_mode  # tests/ is on sys.path
from pids import alive, written_pids
from waits import PROCESS_HANG_GUARD, returns_within

from trl_ftis import cli
from trl_ftis.launcher import SwarmConfigError, load_swarm_config, run_swarm
from trl_ftis.launcher.local import LocalBackend
from trl_ftis.launcher.vllm_servers import health_answers, log_tail, port_problem

STAND_IN = str(Path(__file__).resolve().parents[1] / "fixtures" / "vllm_stand_in.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")

# A peer: asks its server's /health first (exit 4 when it does not answer 200), prints the server arguments it got,
# writes its pid, then holds, waits for a file, or waits until a process is gone.
PEER_SCRIPT = r"""
import argparse, os, sys, time, urllib.request

parser = argparse.ArgumentParser()
for name in ("peer_id", "exchange_url", "output_dir", "vllm_server_host", "vllm_server_port", "vllm_group_port",
             "use_vllm", "vllm_mode", "pid_dir", "wait_gone"):
    parser.add_argument("--" + name)
parser.add_argument("--hold", type=float, default=0.0)
parser.add_argument("--exit_code", type=int, default=0)
args, extra = parser.parse_known_args()
url = f"http://{args.vllm_server_host}:{args.vllm_server_port}/health"
try:
    status = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5).status
except Exception as exc:
    status = repr(exc)
print(f"peer {args.peer_id}: health {status} port={args.vllm_server_port} group_port={args.vllm_group_port} "
      f"use_vllm={args.use_vllm} mode={args.vllm_mode} cuda={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}", flush=True)
if status != 200:
    sys.exit(4)
if args.pid_dir:
    path = os.path.join(args.pid_dir, args.peer_id + ".pid")
    open(path + ".tmp", "w").write(str(os.getpid()))
    os.replace(path + ".tmp", path)
print("ready", flush=True)

def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True

if args.wait_gone:  # until the process whose pid that file holds has exited
    deadline = time.monotonic() + 30
    while not os.path.exists(args.wait_gone) or not gone(int(open(args.wait_gone).read())):
        if time.monotonic() > deadline:
            print("timed out waiting for " + args.wait_gone, flush=True)
            sys.exit(6)
        time.sleep(0.02)
    print("gone: " + args.wait_gone, flush=True)
time.sleep(args.hold)
print("done " + args.peer_id, flush=True)
sys.exit(args.exit_code)
"""


def _server(pid_dir: Path, peer_id: str, gpus: str = "3", **block) -> dict:
    """A `vllm_server:` block running the stand-in, which writes its pid to `<pid_dir>/<peer_id>.server.pid`."""
    args = {"pid_file": str(pid_dir / f"{peer_id}.server.pid"), **block.pop("args", {})}
    return {"gpus": gpus, "command": [sys.executable, STAND_IN], "ready_timeout": 30, "args": args, **block}


def _raw(tmp_path, pid_dir, peers, **top) -> dict:
    script = tmp_path / "peer.py"
    script.write_text(PEER_SCRIPT)
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    for index, peer in enumerate(peers):
        peer.setdefault("model", str(model))
        peer.setdefault("gpus", str(index))  # training GPUs apart from the servers' (3 and up): only a name on CPU
    raw = {"script": str(script), "run_dir": str(tmp_path / "run"), "args": {"pid_dir": str(pid_dir)}, "peers": peers}
    raw.update(top)
    return raw


def _run(tmp_path, pid_dir, peers, **top) -> tuple[int, str]:
    out = io.StringIO()
    code = run_swarm(load_swarm_config(_raw(tmp_path, pid_dir, peers, **top)), grace=2, stream=out)
    return code, out.getvalue()


def _summary(tmp_path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def _rows(tmp_path) -> dict[str, dict]:
    return {row["id"]: row for row in _summary(tmp_path)["peers"]}


def _none_alive(pid_dir: Path, output: str = "") -> None:
    running = {name: pid for name, pid in written_pids(pid_dir).items() if alive(pid)}
    assert not running, output


# ----------------------------------------------------------------------------------------------------------------
# The pieces: a port in use, /health, a log's tail
# ----------------------------------------------------------------------------------------------------------------


def test_port_problem_names_a_port_in_use_and_passes_a_free_one():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        problem = port_problem("127.0.0.1", port)
        assert problem is not None and str(port) in problem and "in use" in problem and "\n" not in problem
    assert port_problem("127.0.0.1", port) is None  # closed: free again
    assert "cannot" in port_problem("no-such-host.invalid", port)


def test_health_answers_only_200(tmp_path, pid_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    assert not health_answers(f"http://127.0.0.1:{closed_port}/health", timeout=2)  # nobody listens
    for mode, expected in (("healthy", True), ("never", False)):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        pid_file = pid_dir / f"{mode}.pid"
        proc = subprocess.Popen(
            [sys.executable, STAND_IN, "--model", "m", "--host", "127.0.0.1", "--port", str(port)]
            + ["--stand_in", mode, "--pid_file", str(pid_file)],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not pid_file.exists() and time.monotonic() < deadline:  # written once it listens
                time.sleep(0.02)
            assert health_answers(f"http://127.0.0.1:{port}/health", timeout=5) is expected
        finally:
            proc.kill()
            proc.wait()


def test_log_tail_keeps_whole_lines_and_the_last_state_of_progress_bars(tmp_path):
    path = tmp_path / "s.log"
    assert log_tail(path, 100) == ""  # no log (yet)
    path.write_bytes(b"first line that is long\nloading 10%\rloading 100%\nerror: out of memory\n")
    assert log_tail(path, 1000).splitlines() == ["first line that is long", "loading 100%", "error: out of memory"]
    assert log_tail(path, 50).splitlines() == ["loading 100%", "error: out of memory"]  # no half line first
    assert log_tail(path, 40).splitlines() == ["error: out of memory"]


# ----------------------------------------------------------------------------------------------------------------
# A healthy server: started first, its peer pointed at it, stopped with it
# ----------------------------------------------------------------------------------------------------------------


def test_peers_start_after_their_servers_answer_and_the_servers_stop_with_them(tmp_path, pid_dir, monkeypatch):
    monkeypatch.setenv("FTIS_SWARM_SECRET", "swarm-secret-xyz")
    peers = [
        # The server answers 503 for a second: a peer started before it answered would exit 4.
        {"id": "a", "gpus": "0", "vllm_server": _server(pid_dir, "a", "3", args={"delay": 1.0, "max_model_len": 64})},
        {"id": "b", "gpus": "1", "vllm_server": _server(pid_dir, "b", "4,5")},
    ]
    code, out = _run(tmp_path, pid_dir, peers, env={"MY_TOKEN": "tok-1"})
    assert code == 0, out
    logs = tmp_path / "run" / "logs"
    ports = {}
    for peer, server_gpus, peer_gpus in (("a", "3", "0"), ("b", "4,5", "1")):
        server_log = (logs / f"{peer}.vllm.log").read_text()
        served = re.search(r"stand-in vLLM server: model=(\S+) host=127.0.0.1 port=(\d+) cuda=(\S+)", server_log)
        assert served is not None, server_log
        assert (served.group(1), served.group(3)) == (str(tmp_path / "model"), server_gpus)
        peer_log = (logs / f"{peer}.log").read_text()
        peer_line = re.search(
            r"health (\S+) port=(\d+) group_port=(\d+) use_vllm=true mode=server cuda=(\S+)", peer_log
        )
        assert peer_line is not None and peer_line.group(1) == "200"
        assert peer_line.group(2) == served.group(2) and peer_line.group(4) == peer_gpus
        ports[peer] = (int(peer_line.group(2)), int(peer_line.group(3)))
        assert f"[swarm] vLLM server of {peer} ready at http://127.0.0.1:{served.group(2)} (" in out
        assert "stand-in: SIGTERM" in server_log  # stopped politely when its peer ended
        cmd = (logs / f"{peer}.vllm.cmd").read_text()
        assert f"--port {served.group(2)}" in cmd and f"CUDA_VISIBLE_DEVICES={server_gpus}" in cmd.replace("'", "")
        assert "MY_TOKEN='<redacted>'" in cmd and "tok-1" not in cmd and "swarm-secret-xyz" not in cmd
        assert file_mode(logs / f"{peer}.vllm.log") == 0o600 and file_mode(logs / f"{peer}.vllm.cmd") == 0o600
    assert "--max_model_len 64" in (logs / "a.vllm.log").read_text()
    assert len({port for pair in ports.values() for port in pair}) == 4  # two servers, four ports
    ready_a = out.index("vLLM server of a ready")
    assert ready_a < out.index("started a (pid") and out.index("vLLM server of b ready") < out.index("started a (pid")
    rows = _rows(tmp_path)
    assert rows["a"]["status"] == rows["b"]["status"] == "ok"
    assert rows["a"]["vllm_server"]["log"] == str(logs / "a.vllm.log") and rows["a"]["vllm_server"]["ready_s"] >= 1.0
    _none_alive(pid_dir, out)


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["stops-on-sigterm", "ignores-sigterm"])
def test_a_peer_that_ends_stops_its_server_while_the_others_run(tmp_path, pid_dir, monkeypatch, ignores_sigterm):
    """b runs until a's server is gone: a's server is stopped when a ends, not when the swarm does (with SIGKILL
    `server_grace` seconds after SIGTERM when it ignores SIGTERM)."""
    monkeypatch.setattr(LocalBackend, "server_grace", 0.5)
    stubborn = {"ignore_sigterm": "true"} if ignores_sigterm else {}
    peers = [
        {"id": "a", "vllm_server": _server(pid_dir, "a", "3", args=stubborn)},
        {"id": "b", "args": {"wait_gone": str(pid_dir / "a.server.pid")}, "vllm_server": _server(pid_dir, "b", "4")},
    ]
    code, out = _run(tmp_path, pid_dir, peers)
    assert code == 0, out
    assert f"gone: {pid_dir / 'a.server.pid'}" in (tmp_path / "run" / "logs" / "b.log").read_text()
    assert "stopping the vLLM server of a: its peer ended" in out
    assert ("vLLM server of a: processes left 0.5 s after SIGTERM; sending SIGKILL" in out) is ignores_sigterm
    assert _rows(tmp_path)["a"]["vllm_server"]["exit_code"] == (-signal.SIGKILL if ignores_sigterm else 0)
    _none_alive(pid_dir, out)


def test_server_logs_of_earlier_runs_are_kept_and_only_restarts_only_their_servers(tmp_path, pid_dir, capsys):
    raw = _raw(
        tmp_path,
        pid_dir,
        [
            {"id": "a", "vllm_server": _server(pid_dir, "a", "3")},
            {"id": "b", "vllm_server": _server(pid_dir, "b", "4")},
        ],
    )
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["swarm", str(path), "--only", "b", "--grace", "2"]) == 0
    assert cli.main(["swarm", str(path), "--only", "b", "--grace", "2"]) == 0
    out = capsys.readouterr().out
    logs = tmp_path / "run" / "logs"
    assert sorted(p.name for p in logs.iterdir() if ".vllm." in p.name) == [
        "b.vllm.cmd",
        "b.vllm.cmd.1",
        "b.vllm.log",
        "b.vllm.log.1",
    ]
    assert set(written_pids(pid_dir)) == {"b", "b.server"}  # a and its server never started
    assert "vLLM server of a" not in out and out.count("vLLM server of b ready") == 2
    _none_alive(pid_dir, out)


# ----------------------------------------------------------------------------------------------------------------
# A server that never answers, or dies
# ----------------------------------------------------------------------------------------------------------------


def test_a_server_never_healthy_fails_the_swarm_before_any_peer_starts(tmp_path, pid_dir):
    peers = [
        {"id": "a", "vllm_server": _server(pid_dir, "a", "3")},
        {"id": "b", "vllm_server": _server(pid_dir, "b", "4", ready_timeout=1.5, args={"stand_in": "never"})},
    ]
    # given up after b's 1.5 s ready_timeout: a launcher that waited on (for a default or for ever) trips the guard
    code, out = returns_within(lambda: _run(tmp_path, pid_dir, peers), PROCESS_HANG_GUARD, "the swarm")
    assert code == 1, out
    summary = _summary(tmp_path)
    assert summary["reason"].startswith("vLLM server of peer b never healthy after 1.5 s"), summary["reason"]
    assert "stand-in vLLM server: model=" in out  # the server log's last lines on the console
    assert set(written_pids(pid_dir)) == {"a.server", "b.server"}  # no peer started
    rows = _rows(tmp_path)
    assert rows["b"]["status"] == "failed to start" and "never healthy" in rows["b"]["note"]
    assert rows["a"]["status"] == "not started"
    _none_alive(pid_dir, out)


def test_a_server_that_dies_before_it_is_ready_fails_the_swarm_at_once(tmp_path, pid_dir):
    peers = [{"id": "a", "vllm_server": _server(pid_dir, "a", "3", ready_timeout=600, args={"stand_in": "die"})}]
    code, out = returns_within(lambda: _run(tmp_path, pid_dir, peers), PROCESS_HANG_GUARD, "the swarm")
    assert code == 1, out  # at once, not after the 600 s ready_timeout (which would trip the hang guard)
    assert _summary(tmp_path)["reason"] == "vLLM server of peer a exited with code 3 before it was ready"
    assert "stand-in: failing at start with code 3" in out  # its log tail
    assert set(written_pids(pid_dir)) == {"a.server"}
    _none_alive(pid_dir, out)


def test_a_server_that_dies_while_its_peer_runs_stops_the_swarm(tmp_path, pid_dir):
    die = {"stand_in": "die-later", "die_when": str(pid_dir / "a.pid"), "exit_code": 5}
    peers = [
        {"id": "a", "args": {"hold": 3600}, "vllm_server": _server(pid_dir, "a", "3", args=die)},
        {"id": "b", "args": {"hold": 3600}, "vllm_server": _server(pid_dir, "b", "4")},
    ]
    # stopped when the server died: waiting for the peers' hour-long hold would trip the hang guard
    code, out = returns_within(lambda: _run(tmp_path, pid_dir, peers), PROCESS_HANG_GUARD, "the swarm")
    assert code == 1, out
    assert _summary(tmp_path)["reason"] == "vLLM server of peer a exited with code 5 while its peer ran"
    rows = _rows(tmp_path)
    assert rows["a"]["status"] == rows["b"]["status"] == "stopped"
    assert "vLLM server exited with code 5" in rows["a"]["note"]
    _none_alive(pid_dir, out)


def test_with_on_failure_continue_a_dead_server_fails_only_its_peer(tmp_path, pid_dir):
    die = {"stand_in": "die-later", "die_when": str(pid_dir / "a.pid"), "exit_code": 5}
    peers = [
        {"id": "a", "args": {"hold": 60}, "vllm_server": _server(pid_dir, "a", "3", args=die)},
        {"id": "b", "args": {"wait_gone": str(pid_dir / "a.pid")}, "vllm_server": _server(pid_dir, "b", "4")},
    ]
    code, out = _run(tmp_path, pid_dir, peers, on_failure="continue")
    assert code == 1, out
    assert "vLLM server of a exited with code 5" in out
    rows = _rows(tmp_path)
    assert (rows["a"]["status"], rows["a"]["exit_code"]) == ("failed", -signal.SIGTERM)
    assert "vLLM server exited with code 5" in rows["a"]["note"]
    assert rows["b"]["status"] == "ok"  # went on, and finished once a was gone
    assert _summary(tmp_path)["reason"] == "all peers ended; failed: a"
    _none_alive(pid_dir, out)


def test_a_server_that_cannot_start_fails_the_swarm(tmp_path, pid_dir):
    program = tmp_path / "serve.sh"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o644)  # not executable
    peers = [
        {"id": "a", "vllm_server": _server(pid_dir, "a", "3")},
        {"id": "b", "vllm_server": {**_server(pid_dir, "b", "4"), "command": [str(program)]}},
    ]
    code, out = _run(tmp_path, pid_dir, peers)
    assert code == 1, out
    assert _summary(tmp_path)["reason"].startswith("could not start the vLLM server of peer b: [Errno 13]")
    rows = _rows(tmp_path)
    assert (rows["a"]["status"], rows["b"]["status"]) == ("not started", "failed to start")
    assert not (pid_dir / "a.pid").exists() and not (pid_dir / "b.pid").exists()
    _none_alive(pid_dir, out)  # a's server, started first, is stopped


# ----------------------------------------------------------------------------------------------------------------
# Refused before anything starts
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["port", "group_port"])
def test_a_server_port_in_use_is_refused_before_anything_starts(tmp_path, pid_dir, key):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        peers = [
            {"id": "a", "vllm_server": _server(pid_dir, "a", "3")},
            {"id": "b", "vllm_server": _server(pid_dir, "b", "4", **{key: port})},
        ]
        with pytest.raises(SwarmConfigError) as error:
            _run(tmp_path, pid_dir, peers)
    message = str(error.value)
    assert re.search(rf"peer 'b'.*`vllm_server\.{key}` {port}.*in use", message), message
    assert "peer 'a'" not in message
    assert not (tmp_path / "run").exists() and not written_pids(pid_dir)


def test_dry_run_warns_of_a_server_port_in_use(tmp_path, pid_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        config = load_swarm_config(
            _raw(tmp_path, pid_dir, [{"id": "a", "vllm_server": _server(pid_dir, "a", port=port)}])
        )
        out = io.StringIO()
        LocalBackend(config).dry_run(out)
    assert re.search(rf"# warning: peer 'a'.*`vllm_server\.port` {port}", out.getvalue()), out.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# Ctrl-C
# ----------------------------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("when", ["while-waiting-for-the-server", "while-the-peer-runs"])
def test_ctrl_c_stops_the_servers_and_the_peers(tmp_path, pid_dir, when):
    waiting = when == "while-waiting-for-the-server"
    server = _server(pid_dir, "a", "3", ready_timeout=600, args={"stand_in": "never" if waiting else "healthy"})
    raw = _raw(tmp_path, pid_dir, [{"id": "a", "args": {"hold": 60}, "vllm_server": server}])
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc, lines = _start_cli(["swarm", str(path), "--grace", "1"], tmp_path)
    seen = []
    try:
        deadline = time.monotonic() + 30

        def wait_for_line(wanted) -> None:
            while not seen or not wanted(seen[-1]):
                seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))

        if waiting:  # the launcher polls the server, which listens (its pid file is written then)
            wait_for_line(lambda line: line.startswith("[swarm] waiting for"))
            while not (pid_dir / "a.server.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        else:
            wait_for_line(lambda line: line.startswith("[a]") and line.rstrip().endswith("ready"))
        pids = written_pids(pid_dir)
        assert set(pids) == ({"a.server"} if waiting else {"a", "a.server"}), "".join(seen)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.2)  # the reader thread drains the last lines
    while not lines.empty():
        seen.append(lines.get())
    output = "".join(seen)
    assert "interrupted by SIGINT" in output
    assert not any(alive(pid) for pid in pids.values()), output
    assert _summary(tmp_path)["exit_code"] == 130
