"""Real swarms: tiny peers as separate processes exchanging rows over dir:// and Redis."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from peer_processes import (
    COMMON,
    PEER_SCRIPT,
    ROOT,
    peer_env,
    rows_taken,
    start_peer,
    start_together,
    summary,
)  # tests/ is on sys.path


def run_launcher(tmp_path, config):
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "trl_ftis.cli", "swarm", str(path), "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        env=peer_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )


def three_peer_config(exchange_url):
    return {
        "script": PEER_SCRIPT,
        "exchange_url": exchange_url,
        "args": {**COMMON, "expected_peers": ["big", "small", "lora"], "peer_timeout": 120},
        "env": {"OMP_NUM_THREADS": "1", "FTIS_CONSOLE": "dict"},  # the logs checked hold the metrics dicts
        "peers": [
            {"id": "big", "args": {"hidden_size": 64}},
            {"id": "small", "args": {"hidden_size": 32}},
            {"id": "lora", "lora": True, "args": {"hidden_size": 64, "lora_target_modules": ["q_proj", "v_proj"]}},
        ],
    }


def check_three_peers(run_dir, output):
    for peer in ("big", "small", "lora"):
        result = summary(run_dir, peer)
        others = {"big", "small", "lora"} - {peer}
        assert result["steps"] == 3, output
        assert set(result["peers"]) == others
        # Each round every peer publishes 16 rows; with expected peers, every round gets both others' rows.
        assert result["rows_sent"] == 48
        assert result["rows_received"] == 96 and rows_taken(result) == 96
        assert set(result["dropped"]) <= {"special_tokens"}, result["dropped"]
        log = (Path(run_dir) / "logs" / f"{peer}.log").read_text()
        for other in others:
            assert f"'ftis/peers/{other}/rows_accepted': '" in log
            assert f"'ftis/peers/{other}/is_weight_mean'" in log  # their rows reached the loss
    assert (Path(run_dir) / "lora" / "adapter_config.json").exists()
    assert (Path(run_dir) / "big" / "model.safetensors").exists()


@pytest.mark.slow  # the default suite runs three peers of different architectures, one LoRA, over a shared directory
def test_three_heterogeneous_peers_over_a_shared_directory(tmp_path):
    result = run_launcher(tmp_path, three_peer_config(f"dir://{tmp_path / 'exchange'}"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    check_three_peers(tmp_path / "run", result.stdout[-3000:])
    assert "[big" in result.stdout and "[lora" in result.stdout  # prefixed, interleaved logs


# Slow: the default suite trains over Redis in test_slurm_two_tiny_peers_train_through_the_launchers_redis_job.
@pytest.mark.slow
@pytest.mark.redis
def test_three_heterogeneous_peers_over_redis(tmp_path, redis_url):
    result = run_launcher(tmp_path, three_peer_config(f"{redis_url}?swarm=test-{tmp_path.name}"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    check_three_peers(tmp_path / "run", result.stdout[-3000:])


# Slow: the default suite trains the async mode in one process (tests/swarm/test_async_mode.py).
@pytest.mark.slow
def test_async_peers_train_on_each_others_rows_one_round_late(tmp_path):
    """Two processes with exchange_mode="async": each trains on the other's rows from the second step on."""
    config = three_peer_config(f"dir://{tmp_path / 'exchange'}")
    config["peers"] = config["peers"][:2]
    config["args"].update(expected_peers=["big", "small"], exchange_mode="async", max_steps=4)
    result = run_launcher(tmp_path, config)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for peer, other in (("big", "small"), ("small", "big")):
        outcome = summary(tmp_path / "run", peer)
        assert outcome["steps"] == 4 and outcome["exchange_worker_errors"] == 0
        # Steps 1-3 merge the other's rounds 0-2 (16 rows each); round 3 was collected after the last step.
        assert rows_taken(outcome) >= 48, outcome
        log = (tmp_path / "run" / "logs" / f"{peer}.log").read_text()
        assert f"'ftis/peers/{other}/staleness': '1'" in log  # one round of lag
        assert "'ftis/exchange/blocking_seconds'" in log
        assert "nothing new from" not in log


# Slow: the default suite trains the free mode beside a silent peer in one process (tests/swarm/test_free_mode.py).
@pytest.mark.slow
def test_free_running_peers_never_make_a_fast_peer_wait_for_a_slow_one(tmp_path):
    """exchange_mode="free": a small peer (hidden 32) and a slow one (hidden 384, and a 1 s sleep after each step),
    both expected. The fast one runs its 150 steps at its own pace (in lock-step it would wait for the slow one every
    round) and still trains on the slow one's rows; the slow one trains on the fast one's newest. Both start training
    together once both have built their models (`start_file`), so their runs overlap whatever their start-up took;
    nothing here depends on how fast one process runs next to the other (the time a step spends on the exchange is a
    benchmark's: `benchmarks/free_running.py`)."""
    exchange = f"dir://{tmp_path / 'exchange'}"
    start_file = tmp_path / "start"
    settings = {
        "exchange_mode": "free",
        "expected_peers": ["fast", "slow"],
        "peer_timeout": 120,
        "start_file": str(start_file),
    }
    slow = start_peer(tmp_path, "slow", exchange, hidden_size=384, steps=8, step_delay=1.0, **settings)
    fast = start_peer(tmp_path, "fast", exchange, hidden_size=32, steps=150, **settings)
    start_together(start_file, ["slow", "fast"], [slow, fast])
    for process in (slow, fast):
        assert process.wait(timeout=600) == 0, (tmp_path / "fast.log").read_text()[-3000:] + (
            tmp_path / "slow.log"
        ).read_text()[-3000:]
    quick, slowpoke = summary(tmp_path, "fast"), summary(tmp_path, "slow")
    assert quick["steps"] == 150 and slowpoke["steps"] == 8
    fast_log, slow_log = (tmp_path / "fast.log").read_text(), (tmp_path / "slow.log").read_text()
    assert "nothing new from" not in fast_log  # never a wait for the slow one, not even a timed-out one
    # Each trained on the other's rows, no older than max_staleness (2) of the sender's own steps.
    assert quick["rows_accepted"] > 0 and slowpoke["rows_accepted"] > 0, (quick, slowpoke)
    assert set(quick["peer_row_ages"]) | set(slowpoke["peer_row_ages"]) <= {"0", "1", "2"}
    assert "'ftis/peers/slow/age_steps'" in fast_log and "'ftis/peers/fast/age_seconds'" in slow_log
    assert "'ftis/peer_age/0/is_weight_mean'" in slow_log  # the correction, by age
    # The slow one published at most one message of 16 rows per step: the fast one never took more. (Counted as
    # `rows_taken`: the untrained tiny models' rows holding special tokens are dropped at admission.)
    assert rows_taken(quick) <= 16 * 8, quick


def test_three_architectures_one_of_them_lora_train_on_each_others_rows(tmp_path):
    """A Llama, a Qwen2 (LoRA) and a Gemma2 sharing one tokenizer: every peer trains on both others' rows."""
    peers = {"llama": ("llama", 64, False), "qwen2": ("qwen2", 48, True), "gemma2": ("gemma2", 32, False)}
    config = {
        "script": PEER_SCRIPT,
        "exchange_url": f"dir://{tmp_path / 'exchange'}",
        "args": {**COMMON, "expected_peers": list(peers), "peer_timeout": 120},
        "env": {"OMP_NUM_THREADS": "1", "FTIS_CONSOLE": "dict"},  # the logs checked hold the metrics dicts
        "peers": [
            {
                "id": peer,
                "lora": lora,
                "args": {"architecture": architecture, "hidden_size": hidden}
                | ({"lora_target_modules": ["q_proj", "v_proj"]} if lora else {}),
            }
            for peer, (architecture, hidden, lora) in peers.items()
        ],
    }
    result = run_launcher(tmp_path, config)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    run_dir = tmp_path / "run"
    for peer, (architecture, _, _) in peers.items():
        outcome = summary(run_dir, peer)
        assert outcome["steps"] == 3 and set(outcome["peers"]) == set(peers) - {peer}
        # Each round every peer publishes 16 rows; with expected peers, every round gets both others' rows.
        assert outcome["rows_sent"] == 48 and outcome["rows_received"] == 96 and rows_taken(outcome) == 96, outcome
        assert set(outcome["dropped"]) <= {"special_tokens"}, outcome["dropped"]
        log = (run_dir / "logs" / f"{peer}.log").read_text()
        for other in set(peers) - {peer}:
            assert f"'ftis/peers/{other}/rows_accepted': '" in log
            assert f"'ftis/peers/{other}/is_weight_mean'" in log  # their rows reached the loss
        assert "nothing new from" not in log  # no round timed out (a peer a round ahead once cost 120 s here)
    saved = json.loads((run_dir / "gemma2" / "config.json").read_text())
    assert saved["model_type"] == "gemma2"
    adapter = json.loads((run_dir / "qwen2" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert (run_dir / "llama" / "model.safetensors").exists()
    assert "[llama" in result.stdout and "[qwen2" in result.stdout  # prefixed, interleaved logs


def test_peers_with_different_tokenizers_train_on_each_others_texts(tmp_path):
    """A character-level Llama and a BPE Qwen2 (LoRA): with cross_tokenizer each re-tokenises the other's texts and
    trains on them at the text level; the examples/swarms/mixed_tokenizers.yaml setting, made small."""
    # A BPE token is a whole number (up to 3 characters): the character peer gets room for 6 of them, and more.
    peers = {"char": ("char", "llama", 64, False, 20), "bpe": ("bpe", "qwen2", 48, True, 6)}
    config = {
        "script": PEER_SCRIPT,
        "exchange_url": f"dir://{tmp_path / 'exchange'}",
        "args": {**COMMON, "expected_peers": list(peers), "peer_timeout": 120, "cross_tokenizer": True},
        "env": {"OMP_NUM_THREADS": "1", "FTIS_CONSOLE": "dict"},  # the logs checked hold the metrics dicts
        "peers": [
            {
                "id": peer,
                "lora": lora,
                "args": {"tokenizer": kind, "architecture": architecture, "hidden_size": hidden}
                | {"max_completion_length": length}
                | ({"lora_target_modules": ["q_proj", "v_proj"]} if lora else {}),
            }
            for peer, (kind, architecture, hidden, lora, length) in peers.items()
        ],
    }
    result = run_launcher(tmp_path, config)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    run_dir = tmp_path / "run"
    for peer in peers:
        (other,) = set(peers) - {peer}
        outcome = summary(run_dir, peer)
        assert outcome["steps"] == 3 and outcome["peers"] == [other]
        assert outcome["refused"].get("tokenizer", 0) == 0
        assert outcome["rows_received"] == 48
        # Every received row was trained on or dropped for a counted reason: untrained models also write their
        # special tokens (<unk>, <pad>) mid-completion, which the other reads as its own (text_special_tokens), and
        # a text too long for the receiver is dropped from its length, before it is tokenised (too_long).
        assert outcome["rows_accepted"] + sum(outcome["dropped"].values()) == 48
        assert set(outcome["dropped"]) <= {"text_special_tokens", "too_long"}, outcome["dropped"]
        assert outcome["rows_accepted"] >= 10 and outcome["rows_retokenised"] >= outcome["rows_accepted"]
        log = (run_dir / "logs" / f"{peer}.log").read_text()
        assert f"'ftis/peers/{other}/is_weight_mean'" in log  # their re-tokenised rows reached the loss
        assert "nothing new from" not in log


@pytest.mark.slow  # the default suite kills a peer mid-run in test_swarm_faults (killed, then restarted with resume)
def test_a_killed_peer_costs_a_timeout_not_the_run(tmp_path):
    exchange = tmp_path / "exchange"
    peers = ["a", "b", "victim"]
    common = dict(expected_peers=peers, peer_timeout=4)
    a = start_peer(tmp_path, "a", f"dir://{exchange}", hidden_size=64, steps=4, **common)
    b = start_peer(tmp_path, "b", f"dir://{exchange}", hidden_size=32, steps=4, **common)
    victim = start_peer(tmp_path, "victim", f"dir://{exchange}", hidden_size=32, steps=50, **common)
    deadline = time.time() + 200
    while not list(exchange.glob("*.victim.*.ftis")) and time.time() < deadline and victim.poll() is None:
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    assert b.wait(timeout=300) == 0, (tmp_path / "b.log").read_text()[-3000:]
    for peer in ("a", "b"):
        result = summary(tmp_path, peer)
        assert result["steps"] == 4 and "victim" in result["peers"]
        log = (tmp_path / f"{peer}.log").read_text()
        assert "nothing new from victim" in log
        assert "'ftis/exchange/peers_missing': '1'" in log


# Slow: the default suite checks that a peer that left is not waited for (tests/swarm/test_leaving_messages.py).
@pytest.mark.slow
def test_peers_that_end_on_different_rounds_are_not_waited_for(tmp_path):
    """Three peers that all expect each other, with a long peer_timeout, run 2, 4 and 6 steps: each one that ends
    announces it, and the others go on at once, never waiting out the timeout for a peer that has finished. They
    start training together (`start_file`): whatever their start-ups took, no wait depends on another's speed."""
    exchange, timeout, start_file = f"dir://{tmp_path / 'exchange'}", 120, tmp_path / "start"
    common = {"expected_peers": ["short", "middle", "long"], "peer_timeout": timeout, "start_file": str(start_file)}
    plan = {"short": 2, "middle": 4, "long": 6}
    processes = {
        name: start_peer(tmp_path, name, exchange, hidden_size=32, steps=steps, **common)
        for name, steps in plan.items()
    }
    start_together(start_file, list(processes), list(processes.values()))
    for name, process in processes.items():
        assert process.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    for name, steps in plan.items():
        assert summary(tmp_path, name)["steps"] == steps
        # A wait that ran out its peer_timeout logs "nothing new from <peer>": a finished peer was never waited for.
        assert "nothing new from" not in (tmp_path / f"{name}.log").read_text()
    # The long peer trained on the others' rows while they were there: 16 a round from each.
    assert rows_taken(summary(tmp_path, "long")) == 16 * 2 + 16 * 4


def test_a_launcher_swarm_with_a_secret_on_one_peer_only_is_refused_before_it_starts(tmp_path):
    """Issue 22: a secret set on one peer only; that peer refused every message and trained on 0 peer rows, and the
    launcher printed "all peers finished; exit code 0" and nothing else. The peers' end-of-run warning said so
    afterwards; now the launcher sees the one-sided secret before anything starts and says which peers lack it
    (the secret's value never shown), so no training time is spent on a swarm that cannot exchange."""
    config = {
        "script": PEER_SCRIPT,
        "args": {**COMMON, "max_steps": 2, "expected_peers": ["locked", "open"], "peer_timeout": 5},
        "env": {"OMP_NUM_THREADS": "1"},
        "peers": [
            {"id": "locked", "args": {"hidden_size": 32}, "env": {"FTIS_SWARM_SECRET": "only-mine"}},
            {"id": "open", "args": {"hidden_size": 32}},
        ],
    }
    result = run_launcher(tmp_path, config)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-4000:]
    assert "cannot start the swarm" in output and "a swarm secret is given to locked but not to open" in output
    assert "only-mine" not in output
    assert not (tmp_path / "run" / "logs").exists()  # nothing started


def test_strangers_and_garbage_are_refused_counted_and_ignored(tmp_path):
    from trl_ftis import PeerRow
    from trl_ftis.demo.tiny import build_char_tokenizer
    from trl_ftis.exchange import encode_message, tokenizer_fingerprint
    from trl_ftis.swarm.peer_messages import rows_to_message

    exchange = tmp_path / "exchange"
    exchange.mkdir()
    (exchange / "0000000000.noise.0.ftis").write_bytes(b"not a message at all")
    (exchange / "notes.txt").write_text("garbage")
    stranger = rows_to_message(
        [PeerRow(prompt="12+34=", completion_ids=[8, 9, 2], generator_logps=[-0.1] * 3, reward=1.0, group=0)] * 8,
        sender="stranger",
        round=0,
        tokenizer_fingerprint=tokenizer_fingerprint(build_char_tokenizer()),
        tokenizer_name="char",
        temperature=1.0,
        reward_names=["digit_match_reward"],
    )
    (exchange / "0000000000.stranger.1.ftis").write_bytes(encode_message(stranger))  # unsigned
    secret = {"FTIS_SWARM_SECRET": "let-me-in"}
    common = dict(expected_peers=["a", "b"], peer_timeout=60, start_file=str(tmp_path / "start"))
    a = start_peer(tmp_path, "a", f"dir://{exchange}", hidden_size=64, env=secret, **common)
    b = start_peer(tmp_path, "b", f"dir://{exchange}", hidden_size=32, env=secret, **common)
    start_together(tmp_path / "start", ["a", "b"], [a, b])  # however long each start-up takes, no round times out
    assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    assert b.wait(timeout=300) == 0, (tmp_path / "b.log").read_text()[-3000:]
    for peer, other in (("a", "b"), ("b", "a")):
        result = summary(tmp_path, peer)
        assert result["peers"] == [other] and rows_taken(result) == 48
        assert result["refused"]["unsigned"] == 1 and result["refused"]["unrecognised"] == 1
        assert sum(result["refused"].values()) == 3
        assert "let-me-in" not in (tmp_path / f"{peer}.log").read_text()
        assert b"let-me-in" not in (tmp_path / peer / "training_args.bin").read_bytes()


def test_a_two_process_peer_talks_through_its_main_process_and_shares_rows_evenly(tmp_path):
    """One peer is a 2-rank torch.distributed job (gloo on CPU): only rank 0 talks to the swarm, received rows are
    shared out in equal halves (an odd count is trimmed), and no rank hangs."""
    exchange = f"dir://{tmp_path / 'exchange'}"
    common = {**COMMON, "max_steps": 2, "expected_peers": ["dp", "solo"], "peer_timeout": 120}
    # solo sends 9 rows a round (3 prompts x 3 completions): dp's two ranks merge 4 each.
    solo = start_peer(
        tmp_path,
        "solo",
        exchange,
        hidden_size=32,
        **{**common, "per_device_train_batch_size": 9, "num_generations": 3},
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        PEER_SCRIPT,
        "--peer_id",
        "dp",
        "--exchange_url",
        exchange,
        "--output_dir",
        str(tmp_path / "dp"),
        "--hidden_size",
        "64",
    ]
    for key, value in {**common, "per_device_train_batch_size": 8}.items():
        command += [f"--{key}"] + (
            [str(v) for v in value]
            if isinstance(value, list)
            else [str(value).lower() if isinstance(value, bool) else str(value)]
        )
    with open(tmp_path / "dp.log", "w") as log:
        dp = subprocess.run(command, cwd=ROOT, env=peer_env(), stdout=log, stderr=subprocess.STDOUT, timeout=400)
    assert dp.returncode == 0, (tmp_path / "dp.log").read_text()[-3000:]
    assert solo.wait(timeout=300) == 0, (tmp_path / "solo.log").read_text()[-3000:]
    dp_log = (tmp_path / "dp.log").read_text()
    assert summary(tmp_path, "dp")["rows_sent"] == 2 * 16  # both ranks' rows, published by rank 0
    # Each rank trains on an equal share of solo's 16 rows (fewer when the untrained model wrote <pad>/<unk> inside
    # some: special_tokens), logged once per step by rank 0.
    shares = re.findall(r"'ftis/peer_rows': '(\d+)'", dp_log)
    dropped = summary(tmp_path, "dp")["dropped"]
    assert len(shares) == 2 and all(0 < int(n) <= 8 for n in shares), shares
    assert set(dropped) <= {"special_tokens", "batch_split"}, dropped
    assert dp_log.count("[dp] done") == 1
    assert summary(tmp_path, "solo")["rows_received"] == 2 * 16


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # four tiny trainers with their evaluations: about half a minute on 2 cores
def test_tiny_trainers_beside_their_controls_are_compared_on_the_same_problems(tmp_path):
    """`controls: [alone]` with real tiny trainers (examples/tiny_peer.py): each control trains as its peer, without
    peers, and the launcher compares the two on the same held-out problems from their own evaluations."""
    config = {
        "script": PEER_SCRIPT,
        "controls": ["alone"],
        "args": {**COMMON, "max_steps": 2, "eval_size": 40, "expected_peers": ["big", "small"], "peer_timeout": 60},
        "env": {"OMP_NUM_THREADS": "1"},
        "peers": [{"id": "big", "args": {"hidden_size": 64}}, {"id": "small", "args": {"hidden_size": 32}}],
    }
    result = run_launcher(tmp_path, config)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    rows = {row["id"]: row for row in json.loads((tmp_path / "run" / "summary.json").read_text())["peers"]}
    assert set(rows) == {"big", "small", "big-alone", "small-alone"}
    for peer in ("big", "small"):
        control = rows[f"{peer}-alone"]
        assert control["control_of"] == peer and control["rows_accepted"] == 0 and control["warning"] is None
        assert rows[peer]["rows_accepted"] > 0
        # The same start: the control trains as its peer (same id, data and seeds) from the same model.
        assert control["accuracy_before"] == rows[peer]["accuracy_before"]
        compared = control["vs_peer"]
        assert compared["n"] == 40 and compared["se"] >= 0
        assert f"{peer} vs {peer}-alone: accuracy after" in output
