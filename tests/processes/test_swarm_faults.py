"""Faults in a real swarm of trainer processes (`examples/tiny_peer.py`): a peer killed and restarted with resume, a
late joiner, a stalled peer, the exchange folder deleted or made read-only, the Redis server restarted. Survivors
finish their steps and their logs say what happened. (The same faults at the transport level, with no trainer, are
in `tests/exchange/test_transport_faults.py`.)"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
from peer_processes import start_peer, start_together, summary  # tests/ is on sys.path

ROWS = 16  # rows a tiny peer publishes per round (per_device_train_batch_size)


def wait_for(condition, timeout, *processes):
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise AssertionError("timed out")
        for process in processes:
            if process.poll() is not None:
                raise AssertionError(f"a peer exited early with code {process.returncode}")
        time.sleep(0.05)


def finish(tmp_path, *pairs):
    for name, process in pairs:
        assert process.wait(timeout=400) == 0, (tmp_path / f"{name}.log").read_text()[-4000:]


def accepted_in_last_rounds(text, other, rounds):
    """Rows of `other` trained on in each of the last `rounds` logged steps (0 where none arrived)."""
    steps = [line for line in text.splitlines() if line.startswith("{'loss'")][-rounds:]
    found = [re.search(rf"'ftis/peers/{re.escape(other)}/rows_accepted': '(\d+)'", line) for line in steps]
    return [int(match.group(1)) if match else 0 for match in found]


def log(tmp_path, peer):
    return (tmp_path / f"{peer}.log").read_text()


def test_a_killed_peer_restarted_with_resume_rejoins_and_both_finish(tmp_path):
    exchange = f"dir://{tmp_path / 'exchange'}"
    common = dict(
        steps=8,
        expected_peers=["a", "b"],
        peer_timeout=180,  # a waits for b while b restarts: longer than a restart takes on any machine, however busy
        save_strategy="steps",
        save_steps=2,
        resume_from_checkpoint="last",  # the same command starts and restarts a peer
    )
    a = start_peer(tmp_path, "a", exchange, hidden_size=64, start_file=str(tmp_path / "start"), **common)
    b = start_peer(tmp_path, "b", exchange, hidden_size=32, start_file=str(tmp_path / "start"), **common)
    start_together(tmp_path / "start", ["a", "b"], [a, b])
    wait_for(lambda: (tmp_path / "b" / "checkpoint-2" / "trainer_state.json").exists(), 300, a, b)
    b.send_signal(signal.SIGKILL)
    b.wait(timeout=30)
    assert not (tmp_path / "b" / "ftis_summary.json").exists()  # it really died mid-run
    b = start_peer(tmp_path, "b", exchange, hidden_size=32, log_mode="a", **common)
    finish(tmp_path, ("a", a), ("b", b))

    b_log = log(tmp_path, "b")
    assert "Resumed the F-TIS state of step" in b_log
    a_summary, b_summary = summary(tmp_path, "a"), summary(tmp_path, "b")
    assert a_summary["steps"] == b_summary["steps"] == 8
    # b's counters went on from its checkpoint: 8 rounds of rows sent in all, not only those after the restart.
    assert b_summary["rows_sent"] == 8 * ROWS
    assert a_summary["peers"] == ["b"] and b_summary["peers"] == ["a"]
    # Both trained on the other's rows after the restart (b restarted from step 2 of 8): in the last 5 rounds. Not
    # necessarily in the very last ones: the peer that ends second may find the other gone.
    for peer, other in (("a", "b"), ("b", "a")):
        assert sum(accepted_in_last_rounds(log(tmp_path, peer), other, 5)) > 0, peer


@pytest.mark.slow
def test_a_late_joiner_and_a_stalled_peer_catch_up_and_everyone_finishes(tmp_path):
    """`stalled` (expected by everyone) is frozen with SIGSTOP for most of the run: the others wait for it once, then
    go on without it. `late` (expected by no one, it expects a and b) starts when the others are well into their
    run. Both find the swarm
    far ahead once they run, move to its round, and trade rows with it again."""
    exchange = tmp_path / "exchange"
    url = f"dir://{exchange}"
    common = dict(expected_peers=["a", "b", "stalled"], peer_timeout=10)
    # Long enough to outlive the other two: since peers announce leaving, a and b no longer lose a peer_timeout
    # when stalled ends, and 150 steps ran out before late and stalled were done.
    a = start_peer(tmp_path, "a", url, hidden_size=64, steps=400, **common)
    b = start_peer(tmp_path, "b", url, hidden_size=32, steps=400, **common)
    stalled = start_peer(tmp_path, "stalled", url, hidden_size=32, steps=20, **common)
    wait_for(lambda: rounds_of(exchange, "stalled") >= 2, 300, a, b, stalled)
    stalled.send_signal(signal.SIGSTOP)
    wait_for(lambda: rounds_of(exchange, "a") >= 30, 300, a, b)
    # The late joiner knows whom to meet (it waits for a and b); no one waits for it.
    late = start_peer(tmp_path, "late", url, hidden_size=32, steps=20, expected_peers=["a", "b"], peer_timeout=10)
    stalled.send_signal(signal.SIGCONT)
    finish(tmp_path, ("late", late), ("stalled", stalled))
    assert a.poll() is None and b.poll() is None, "a and b should still be running: the test proves nothing"
    finish(tmp_path, ("a", a), ("b", b))
    for peer in ("late", "stalled"):
        result = summary(tmp_path, peer)
        assert "moves to round" in log(tmp_path, peer), peer
        assert result["steps"] == 20 and {"a", "b"} <= set(result["peers"]) and result["rows_accepted"] > 0, peer
    for peer in ("a", "b"):
        result = summary(tmp_path, peer)
        assert result["steps"] == 400 and {"late", "stalled"} <= set(result["peers"]), peer
        assert "nothing new from stalled" in log(tmp_path, peer)


@contextlib.contextmanager
def read_only(folder):
    """`folder` read-only for everyone: mode 0555, and for root (whom modes do not stop) the immutable attribute.
    Skips the test where neither stops a write (e.g. root on a file system without `chattr`)."""
    folder.chmod(0o555)
    immutable = (
        os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    )
    try:
        probe = folder / "probe"
        try:
            probe.write_text("x")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("cannot make a folder read-only here (root without chattr): the deleted case covers the run")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def rounds_of(exchange, peer):
    """The newest round `peer` has in the exchange folder (files are named `<round>.<sender>.<unique>.ftis`)."""
    try:
        return max((int(path.name.split(".")[0]) for path in exchange.glob(f"*.{peer}.*.ftis")), default=-1)
    except FileNotFoundError:
        return -1


# read_only is `slow` (21 s, `make test-slow`): the default suite keeps the deleted folder.
@pytest.mark.parametrize("fault", ["deleted", pytest.param("read_only", marks=pytest.mark.slow)])
def test_the_exchange_folder_deleted_or_read_only_mid_run(tmp_path, fault):
    exchange = tmp_path / "exchange"
    url = f"dir://{exchange}"
    common = dict(steps=60, expected_peers=["a", "b"], peer_timeout=5, start_file=str(tmp_path / "start"))
    a = start_peer(tmp_path, "a", url, hidden_size=64, **common)
    b = start_peer(tmp_path, "b", url, hidden_size=32, **common)
    start_together(tmp_path / "start", ["a", "b"], [a, b])
    wait_for(lambda: rounds_of(exchange, "a") >= 2, 300, a, b)
    if fault == "deleted":
        shutil.rmtree(exchange)
    else:
        with read_only(exchange):
            time.sleep(3)  # no one can publish: the round waits for what never comes, then goes on
    assert a.poll() is None and b.poll() is None, "the fault came after the run: the test proves nothing"
    finish(tmp_path, ("a", a), ("b", b))
    if fault == "deleted":  # the first peer to notice creates it again (the other may never see it missing)
        assert any("had been deleted" in log(tmp_path, peer) for peer in ("a", "b"))
    else:  # a peer that published during the window said so (the other may have been waiting for it all along)
        assert any("Could not publish round" in log(tmp_path, peer) for peer in ("a", "b"))
    for peer, other in (("a", "b"), ("b", "a")):
        result = summary(tmp_path, peer)
        assert result["steps"] == 60 and result["peers"] == [other]
        # Exchanging again after the fault (at round 2-5 of 60): rows of the other in the last 40 rounds.
        assert sum(accepted_in_last_rounds(log(tmp_path, peer), other, 40)) > 0


@pytest.mark.slow
@pytest.mark.redis
def test_a_redis_restart_mid_run_costs_the_outage_not_the_run(tmp_path):
    from redis_server import start_redis_server

    url, stop = start_redis_server(tmp_path / "redis")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    swarm_url = f"{url}?swarm=faults&connect_timeout=1"  # an outage is declared after 1 s of retries
    common = dict(steps=80, expected_peers=["a", "b"], peer_timeout=10)
    a = start_peer(tmp_path, "a", swarm_url, hidden_size=64, **common)
    b = start_peer(tmp_path, "b", swarm_url, hidden_size=32, **common)
    try:
        wait_for(lambda: "'ftis/peers/b/rows_accepted'" in log(tmp_path, "a"), 300, a, b)
        stop(kill=True)  # a crash: every message in it is gone
        time.sleep(4)
        url, stop = start_redis_server(tmp_path / "redis", port=port)
        assert a.poll() is None and b.poll() is None, "the fault came after the run: the test proves nothing"
        finish(tmp_path, ("a", a), ("b", b))
    finally:
        stop()
    for peer, other in (("a", "b"), ("b", "a")):
        result = summary(tmp_path, peer)
        assert result["steps"] == 80 and result["peers"] == [other]
        text = log(tmp_path, peer)
        assert "is unreachable" in text and "is reachable again" in text
        assert sum(accepted_in_last_rounds(text, other, 40)) > 0  # exchanging again after the outage
