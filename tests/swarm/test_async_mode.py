"""`exchange_mode="async"`: the round runs in a background worker while the step computes; its rows join the next
step. What arrives, when, what the training loop waits for, and that the worker never outlives `train()`."""

import logging
import threading
import time
import uuid

import pytest
from swarm_helpers import SyncModePartner, make_swarm  # tests/ is on sys.path
from tiny_trainers import exchange_trainer
from transformers import TrainerCallback
from waits import PROCESS_HANG_GUARD, returns_within

WORKER = "ftis-exchange"


def worker_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith(WORKER)]


def async_trainer(tokenizer, make_args, url, *, callbacks=(), **overrides):
    return exchange_trainer(tokenizer, make_args, url, "async", callbacks=callbacks, **overrides)


def step_entries(trainer):
    return [entry for entry in trainer.state.log_history if "loss" in entry]


@pytest.fixture
def url():
    return f"memory://async-{uuid.uuid4().hex}"


def test_async_rows_join_the_next_step_and_the_worker_ends_with_train(tokenizer, make_args, url):
    partner = make_swarm(url, "partner", tokenizer)
    trainer = async_trainer(
        tokenizer, make_args, url, callbacks=[SyncModePartner(partner)], expected_peers=["partner"]
    )
    merged = []
    original = trainer._merge_peer_rows
    trainer._merge_peer_rows = lambda output, rows: merged.append([r.group for r in rows]) or original(output, rows)
    trainer.train()
    # Step 0 trains on its own rows only; step r on the partner's round r - 1 (one round of lag).
    assert merged == [[], [("partner", 0, 0)] * 8, [("partner", 1, 0)] * 8]
    entries = step_entries(trainer)
    assert [entry["ftis/peer_rows"] for entry in entries] == [0, 8, 8]
    assert [entry.get("ftis/peers/partner/staleness") for entry in entries] == [None, 1.0, 1.0]
    assert all(entry["ftis/exchange/blocking_seconds"] >= 0 for entry in entries)
    assert trainer.summary()["rows_received"] == 24  # the last round was collected too, its rows never used
    assert not worker_threads()
    assert trainer.swarm.closed


def test_sync_mode_logs_the_whole_round_as_blocking(tokenizer, make_args, url):
    partner = make_swarm(url, "partner", tokenizer)
    trainer = async_trainer(tokenizer, make_args, url, callbacks=[SyncModePartner(partner)], exchange_mode="sync")
    trainer.train()
    entries = step_entries(trainer)
    assert [entry["ftis/peer_rows"] for entry in entries] == [8, 8, 8]  # no lag
    assert all(entry["ftis/exchange/blocking_seconds"] > 0 for entry in entries)
    assert not worker_threads()


def test_a_slow_round_runs_beside_the_step_in_async_and_inside_it_in_sync(tokenizer, make_args, url, monkeypatch):
    """A round that takes 0.3 s (a slow exchange): sync collects on the training loop's thread, and each step waits the
    0.3 s; async collects on its worker thread only, so the loop never runs the round itself. (How much of the round
    async hides is a timing: `benchmarks/async_exchange.py` measures it.)"""
    from trl_ftis.swarm.client import Swarm

    collect = Swarm.collect
    threads = []

    def slow_collect(self, *args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.3)
        return collect(self, *args, **kwargs)

    monkeypatch.setattr(Swarm, "collect", slow_collect)
    blocking, on_main_thread = {}, {}
    for mode in ("sync", "async"):
        threads.clear()
        trainer = async_trainer(tokenizer, make_args, f"{url}-{mode}", exchange_mode=mode)
        trainer.train()
        blocking[mode] = [entry["ftis/exchange/blocking_seconds"] for entry in step_entries(trainer)]
        on_main_thread[mode] = list(threads)
    assert on_main_thread["sync"] == [True] * len(blocking["sync"])
    assert on_main_thread["async"] and not any(on_main_thread["async"]), on_main_thread
    assert all(seconds >= 0.3 for seconds in blocking["sync"])  # the step waited for the whole round


def test_the_worker_stops_when_train_raises_and_a_waiting_round_is_interrupted(tokenizer, make_args, url):
    class Crash(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyboardInterrupt("killed")

    # An expected peer that never comes: the round in flight would wait 600 s for it, far past the hang guard.
    trainer = async_trainer(
        tokenizer, make_args, url, callbacks=[Crash()], expected_peers=["ghost"], peer_timeout=600, max_steps=2
    )
    with pytest.raises(KeyboardInterrupt):  # the round's wait was interrupted, not sat out
        returns_within(trainer.train, PROCESS_HANG_GUARD, "train() raising during a waiting round")
    assert not worker_threads()
    trainer.args.max_steps = 1
    assert trainer._rounds.mode.worker is None  # closed when train() raised
    trainer.swarm.reopen()
    assert not trainer.swarm._interrupted.is_set()  # a later train() waits for peers again


def test_a_failing_worker_is_reported_and_training_goes_on(tokenizer, make_args, url, monkeypatch, caplog):
    partner = make_swarm(url, "partner", tokenizer)
    trainer = async_trainer(tokenizer, make_args, url, callbacks=[SyncModePartner(partner)], max_steps=4)
    finish = trainer._rounds.finish_round

    def fail_in_round_1(own_rows, round, result, bytes_sent):
        if round == 1:
            raise RuntimeError("boom")
        return finish(own_rows, round, result, bytes_sent)

    monkeypatch.setattr(trainer._rounds, "finish_round", fail_in_round_1)
    with caplog.at_level(logging.ERROR, logger="trl_ftis"):
        trainer.train()
    assert "exchange worker failed in round 1" in caplog.text and "boom" in caplog.text
    entries = step_entries(trainer)
    assert [entry["ftis/peer_rows"] for entry in entries] == [0, 8, 0, 8]  # round 1's rows lost, round 2's used
    assert entries[2]["ftis/exchange/worker_errors"] == 1
    assert trainer.summary()["exchange_worker_errors"] == 1
    assert not worker_threads()


def test_async_checkpoints_wait_for_the_round_in_flight(tokenizer, make_args, url, tmp_path):
    partner = make_swarm(url, "partner", tokenizer)
    trainer = async_trainer(
        tokenizer,
        make_args,
        url,
        callbacks=[SyncModePartner(partner)],
        save_strategy="steps",
        save_steps=1,
        output_dir=str(tmp_path / "out"),
    )
    trainer.train()
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]
    assert (tmp_path / "out" / "checkpoint-2" / "ftis_state_0.json").is_file()
    assert not worker_threads()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"exchange_mode": "later"}, "exchange_mode must be one of 'sync', 'async', 'free'"),
        ({"exchange_mode": "async", "collaboration_mode": "horizontal"}, "cannot be combined"),
    ],
)
def test_exchange_mode_is_validated(make_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_args(**overrides)
