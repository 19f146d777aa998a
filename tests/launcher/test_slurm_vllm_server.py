"""A peer's vLLM server on SLURM: its job (`slurm_jobs.PeerJob` with a `ServerJob`) starts the server on the job's
first node, on the job's GPUs at the block's positions, waits until its /health answers, runs the peer on the other
GPUs and stops the server when the peer ends. Called here without SLURM (in this process, or in a subprocess fed its
pickle as submitit's worker is), with a stand-in server written by the tests: no GPU, no vLLM.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from redis_jobs import run_pickled  # tests/ is on sys.path

from trl_ftis import cli
from trl_ftis.launcher import load_swarm_config
from trl_ftis.launcher.slurm.backend import SlurmBackend
from trl_ftis.launcher.slurm.jobs import PeerFailedError, PeerJob, ServerJob, split_gpus

ROOT = Path(__file__).resolve().parents[2]
PEER = str(ROOT / "tests" / "fixtures" / "swarm_peer.py")

# The stand-in server: `--port`/`--host` as the launcher passes them, `--mode` says what it does, `--record` where it
# writes its pid, its CUDA_VISIBLE_DEVICES and the pid of a child it starts (to show that all it started stops).
STAND_IN = r"""
import argparse, http.server, json, os, signal, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--host"); parser.add_argument("--port", type=int); parser.add_argument("--model")
parser.add_argument("--mode"); parser.add_argument("--record")
args, _ = parser.parse_known_args()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
record = {"pid": os.getpid(), "child": child.pid, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}
with open(args.record + ".tmp", "w") as handle:
    json.dump(record, handle)
os.replace(args.record + ".tmp", args.record)
print("stand-in: up", flush=True)
if args.mode == "exit":
    print("stand-in: no GPU here, giving up", flush=True)
    child.kill()
    sys.exit(3)
if args.mode == "silent":  # never listens
    time.sleep(600)
if args.mode == "stubborn":  # SIGTERM does nothing: only SIGKILL stops it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

http.server.HTTPServer((args.host, args.port), Health).serve_forever()
"""

# The peer: records its pid, its CUDA_VISIBLE_DEVICES and what the server's /health answered when it started.
PEER_SCRIPT = r"""
import json, os, sys, time, urllib.request
url, record, then = sys.argv[1], sys.argv[2], sys.argv[3]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    status = opener.open(url, timeout=5).status
except OSError as exc:
    status = repr(exc)
with open(record + ".tmp", "w") as handle:
    json.dump({"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "health": status}, handle)
os.replace(record + ".tmp", record)
print("peer: trained", flush=True)
if then == "sleep":
    time.sleep(600)
sys.exit(int(then) if then.isdigit() else 0)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gone(pid: int, wait: float = 10.0) -> bool:
    """`pid` has exited (a zombie waiting for its reaper counts as gone); waits up to `wait` s for its reaper."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _job(tmp_path: Path, mode: str = "healthy", *, gpus: str = "3", peer_then: str = "0", **server) -> PeerJob:
    """A peer job whose server is the stand-in in `mode`, on the job's GPUs at `gpus`."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    port, group_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}/health"
    spec = ServerJob(
        argv=[sys.executable, str(stand_in), "--model", "m", "--host", "127.0.0.1", "--port", str(port)]
        + ["--mode", mode, "--record", str(tmp_path / "server.json")],
        env={"PYTHONUNBUFFERED": "1"},
        cwd=str(tmp_path),
        log_path=str(tmp_path / "a.vllm.log"),
        host="127.0.0.1",
        port=port,
        group_port=group_port,
        gpus=gpus,
        health_url=url,
        ready_timeout=server.pop("ready_timeout", 60.0),
        poll=0.05,
        **server,
    )
    return PeerJob(
        peer_id="a",
        argv=[sys.executable, "-c", PEER_SCRIPT, url, str(tmp_path / "peer.json"), peer_then],
        env={"X": "1"},
        cwd=str(tmp_path),
        log_path=str(tmp_path / "a.log"),
        exit_path=str(tmp_path / "a.exit"),
        server=spec,
    )


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(autouse=True)
def _job_environment(monkeypatch):
    """A job on the first of one node, whose GPUs SLURM set to 4,5,6,7."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    for name in ("SLURM_NODEID", "SLURM_JOB_NUM_NODES", "SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)


# ----------------------------------------------------------------------------------------------------------------
# GPUs: positions among the job's
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "positions, job_devices, job_gpus, expected",
    [
        ("3", "4,5,6,7", 0, ("7", "4,5,6")),
        ("0,1", "4,5,6,7", 4, ("4,5", "6,7")),
        ("2", "GPU-aa,GPU-bb,GPU-cc", 3, ("GPU-cc", "GPU-aa,GPU-bb")),
        ("1", None, 2, ("1", "0")),  # no CUDA_VISIBLE_DEVICES: the job's `slurm.gpus`
        ("1", None, 0, ("1", None)),  # neither: the positions are the ids; the peer's devices stay as they are
        ("0", "0", 1, ("0", "")),  # the server takes the job's only GPU
    ],
)
def test_split_gpus_gives_the_server_its_positions_and_the_peer_the_rest(positions, job_devices, job_gpus, expected):
    assert split_gpus(positions, job_devices, job_gpus) == expected


@pytest.mark.parametrize(
    "positions, job_devices, job_gpus, words",
    [
        ("4", "4,5,6,7", 4, ["`vllm_server.gpus` '4'", "position 4", "4 GPU(s)", "positions 0 to 3", "`slurm.gpus`"]),
        ("2", None, 2, ["position 2", "2 GPU(s) (`slurm.gpus`", "positions 0 to 1"]),
        ("0", "", 0, ["position 0", "0 GPU(s)", "no position"]),
        ("GPU-aa", "4,5", 2, ["positions among the job's GPUs", "not device ids (GPU-aa)"]),
    ],
)
def test_split_gpus_refuses_a_position_the_job_lacks(positions, job_devices, job_gpus, words):
    with pytest.raises(ValueError) as info:
        split_gpus(positions, job_devices, job_gpus)
    for word in words:
        assert word in str(info.value)


# ----------------------------------------------------------------------------------------------------------------
# The job
# ----------------------------------------------------------------------------------------------------------------


def test_the_peer_runs_once_the_server_answers_on_the_other_gpus_and_the_server_stops_after(tmp_path):
    job = _job(tmp_path, gpus="3")
    assert job() == 0
    server, peer = _read(tmp_path / "server.json"), _read(tmp_path / "peer.json")
    assert server["cvd"] == "7"  # position 3 of the job's 4,5,6,7
    assert peer["cvd"] == "4,5,6"
    assert peer["health"] == 200  # the server answered when the peer started
    assert _gone(server["pid"]) and _gone(server["child"])  # it and all it started are stopped
    assert _read(tmp_path / "a.exit")["exit_code"] == 0
    log = (tmp_path / "a.log").read_text()
    assert "starting the vLLM server of peer a" in log and "CUDA_VISIBLE_DEVICES='7'" in log
    assert log.index("answers at http://127.0.0.1:") < log.index("peer: trained") < log.index("stopped the vLLM")
    assert "stand-in: up" in (tmp_path / "a.vllm.log").read_text()


def test_a_server_that_never_answers_fails_the_job_and_the_peer_never_runs(tmp_path):
    job = _job(tmp_path, "silent", ready_timeout=0.3)
    with pytest.raises(PeerFailedError, match="vLLM server of peer a did not answer"):
        job()
    result = _read(tmp_path / "a.exit")
    assert result["exit_code"] == 1
    assert "the vLLM server of peer a did not answer at http://127.0.0.1:" in result["error"]
    assert "within 0.3s (`vllm_server.ready_timeout`)" in result["error"]
    assert not (tmp_path / "peer.json").exists()
    assert "[vllm a] stand-in: up" in (tmp_path / "a.log").read_text()  # its log's last lines, in the peer's
    server = _read(tmp_path / "server.json")
    assert _gone(server["pid"]) and _gone(server["child"])


def test_a_server_that_dies_before_it_answers_fails_the_job_with_its_last_lines(tmp_path):
    job = _job(tmp_path, "exit")
    with pytest.raises(PeerFailedError, match="exited with code 3 before it answered"):
        job()
    result = _read(tmp_path / "a.exit")
    assert result["exit_code"] == 1 and "the vLLM server of peer a exited with code 3" in result["error"]
    assert not (tmp_path / "peer.json").exists()
    log = (tmp_path / "a.log").read_text()
    assert "exited with code 3 before it answered" in log
    assert "[vllm a] stand-in: no GPU here, giving up" in log


def test_a_taken_port_fails_the_job_before_the_server_starts(tmp_path):
    job = _job(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", job.server.port))
        taken.listen()
        with pytest.raises(PeerFailedError, match=f"port {job.server.port}"):
            job()
    error = _read(tmp_path / "a.exit")["error"]
    assert f"its port {job.server.port} (`vllm_server.port`) is not free on 127.0.0.1 on node" in error
    assert "set a free one in `vllm_server.port`, or leave it out and launch again" in error
    assert error in (tmp_path / "a.log").read_text()
    assert not (tmp_path / "server.json").exists() and not (tmp_path / "peer.json").exists()


def test_a_position_outside_the_job_fails_it_naming_the_key(tmp_path):
    job = _job(tmp_path, gpus="4")
    with pytest.raises(PeerFailedError, match=r"`vllm_server.gpus` '4': position 4 is not one of the job's 4 GPU"):
        job()
    assert not (tmp_path / "server.json").exists()


def test_a_server_that_ignores_sigterm_is_killed_after_its_grace(tmp_path):
    job = _job(tmp_path, "stubborn", stop_grace=0.5)
    assert job() == 0
    server = _read(tmp_path / "server.json")
    assert _gone(server["pid"]) and _gone(server["child"])
    assert "still runs 0.5s after SIGTERM: SIGKILL" in (tmp_path / "a.log").read_text()


def test_a_failing_peer_still_stops_its_server(tmp_path):
    job = _job(tmp_path, peer_then="5")
    with pytest.raises(PeerFailedError, match="peer a exited with code 5"):
        job()
    assert _read(tmp_path / "a.exit")["exit_code"] == 5
    assert _gone(_read(tmp_path / "server.json")["pid"])


def test_other_nodes_run_their_part_without_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    job = _job(tmp_path)
    assert job() == 0
    assert not (tmp_path / "server.json").exists() and not (tmp_path / "a.vllm.log").exists()
    assert _read(tmp_path / "peer.json")["cvd"] == "4,5,6,7"  # its node's GPUs, all of them
    assert (tmp_path / "a.node1.log").exists() and _read(tmp_path / "a.node1.exit")["exit_code"] == 0


def test_sigterm_to_the_job_stops_the_peer_and_its_server(tmp_path):
    job = _job(tmp_path, peer_then="sleep")
    proc = run_pickled(job, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # as submitit's worker runs it
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "peer.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # what scancel does
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    server, peer = _read(tmp_path / "server.json"), _read(tmp_path / "peer.json")
    assert _gone(peer["pid"]) and _gone(server["pid"]) and _gone(server["child"])
    assert _read(tmp_path / "a.exit")["exit_code"] == -signal.SIGTERM


def test_sigterm_while_the_server_starts_stops_it_and_never_starts_the_peer(tmp_path):
    job = _job(tmp_path, "silent", ready_timeout=120)
    proc = run_pickled(job, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "server.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    result = _read(tmp_path / "a.exit")
    assert result["exit_code"] == -signal.SIGTERM and "while waiting for the vLLM server of peer a" in result["error"]
    assert not (tmp_path / "peer.json").exists()
    assert _gone(_read(tmp_path / "server.json")["pid"])


# ----------------------------------------------------------------------------------------------------------------
# The launcher's side: what it submits and shows
# ----------------------------------------------------------------------------------------------------------------


def _config(tmp_path: Path) -> dict:
    return {
        "launcher": "slurm",
        "script": PEER,
        "run_dir": str(tmp_path / "run"),
        "slurm": {"gpus": 4},
        "peers": [
            {
                "id": "a",
                "model": "Qwen/Qwen2.5-0.5B",
                "vllm_server": {"gpus": "3", "args": {"max_model_len": 1024}, "ready_timeout": 300},
            },
            {"id": "b"},
        ],
    }


def test_slurm_dry_run_shows_each_server_with_its_peers_job(tmp_path, capsys):
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path)))
    assert cli.main(["swarm", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    job_a, job_b = out.split("# ---- job ")[2:4]
    assert "peer a" in job_a and "peer b" in job_b
    assert "its vLLM server on the job's GPUs at positions 3" in job_a
    assert "the peer gets the job's other GPUs" in job_a and "(within 300s)" in job_a
    server_line = next(line for line in job_a.splitlines() if line.startswith("#   server: "))
    assert "-m trl.cli.main vllm-serve --model Qwen/Qwen2.5-0.5B --host 127.0.0.1 --port" in server_line
    assert "--max_model_len 1024" in server_line and "CUDA_VISIBLE_DEVICES" not in server_line
    assert job_a.index("#   server: ") < job_a.index("#   runs: ")  # started before the peer
    assert "--vllm_mode server" in job_a
    assert "vLLM" not in job_b
    assert not (tmp_path / "run").exists()


class _Console:
    def __init__(self):
        self.lines: list[str] = []

    def say(self, message: str):
        self.lines.append(message)


class _Signals:
    received = False


def test_the_launcher_submits_the_server_inside_its_peers_job(tmp_path, monkeypatch):
    config = load_swarm_config(_config(tmp_path))
    backend = SlurmBackend(config)
    backend.exchange_url = config.exchange_url  # as if its Redis job answered: the commands as built
    backend.console, backend.signals = _Console(), _Signals()
    submitted = {}

    def submit(job, function, folder):
        submitted[job.command.id] = function
        job.job_id = str(100 + len(submitted))

    monkeypatch.setattr(backend, "_submit", submit)
    backend._prepare()
    logs = config.run_dir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "a.vllm.log").write_text("an earlier run's server\n")
    assert backend.submit_peers() is None
    server = backend.commands[0].server
    job = submitted["a"].server
    assert isinstance(job, ServerJob) and submitted["b"].server is None
    assert (job.port, job.group_port, job.gpus, job.job_gpus) == (server.port, server.group_port, "3", 4)
    assert job.argv == server.argv and job.ready_timeout == 300 and job.health_url == server.health_url
    assert job.log_path == str(logs / "a.vllm.log") and "CUDA_VISIBLE_DEVICES" not in job.env
    assert (logs / "a.vllm.log").read_text() == ""  # emptied for this run; the earlier one kept aside
    assert (logs / "a.vllm.log.1").read_text() == "an earlier run's server\n"
    assert "vllm-serve" in (logs / "a.vllm.cmd").read_text()
    assert "its vLLM server on the job's GPUs at positions 3" in (logs / "a.cmd").read_text()
