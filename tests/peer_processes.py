"""Real peers as separate processes (`examples/tiny_peer.py`), for the multi-process swarm tests."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = str(ROOT / "examples" / "tiny_peer.py")

COMMON = {
    "max_steps": 3,
    "per_device_train_batch_size": 16,
    "num_generations": 8,
    "max_completion_length": 6,
    "learning_rate": 1.0e-3,
    "preset": "paper",
    "reward": "digit_match",
    "bf16": False,
    "use_cpu": True,
    "gradient_checkpointing": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "disable_tqdm": True,
}


def peer_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "FTIS_SWARM_SECRET"}
    # FTIS_CONSOLE=dict: the examples print step lines by default; these tests read the metrics dicts in the logs.
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", FTIS_CONSOLE="dict")
    env.update(extra)
    return env


def summary(run_dir, peer):
    return json.loads((Path(run_dir) / peer / "ftis_summary.json").read_text())


def start_peer(tmp_path, peer_id, exchange, *, hidden_size, steps=3, env=None, log_mode="w", **args):
    """Start `examples/tiny_peer.py` as `peer_id`, logging to `tmp_path/<peer_id>.log` (`log_mode="a"` appends, for a
    restart); `args` become `--key value` flags."""
    settings = {**COMMON, "max_steps": steps, **args}
    command = [
        sys.executable,
        PEER_SCRIPT,
        "--peer_id",
        peer_id,
        "--exchange_url",
        exchange,
        "--output_dir",
        str(tmp_path / peer_id),
        "--hidden_size",
        str(hidden_size),
    ]
    for key, value in settings.items():
        command += [f"--{key}"] + (
            [str(v) for v in value]
            if isinstance(value, list)
            else [str(value).lower() if isinstance(value, bool) else str(value)]
        )
    log = open(tmp_path / f"{peer_id}.log", log_mode)
    return subprocess.Popen(command, cwd=ROOT, env=peer_env(**(env or {})), stdout=log, stderr=subprocess.STDOUT)


def start_together(start_file, peers, processes, timeout=600):
    """Wait until every one of `peers` (started with `start_file=start_file`) has built its model, then let them all
    start training at once: whatever each one's start-up took on a busy machine, their runs overlap."""
    deadline = time.monotonic() + timeout
    while not all(Path(f"{start_file}.{peer}.ready").exists() for peer in peers):
        exited = {peer: process.poll() for peer, process in zip(peers, processes, strict=True)}
        assert not any(code is not None for code in exited.values()), f"a peer exited before its start: {exited}"
        assert time.monotonic() < deadline, f"the peers {peers} were not ready within {timeout} s"
        time.sleep(0.1)
    Path(start_file).touch()


def rows_taken(result):
    """Rows a peer accepted, plus those it dropped for holding special tokens mid-completion (`special_tokens`): the
    tiny untrained models write `<pad>`, `<bos>` or `<unk>` inside some completions, which receivers refuse."""
    return result["rows_accepted"] + result["dropped"].get("special_tokens", 0)
