"""`exchange_mode="free"`: the training loop never waits for a peer. The arrival queue (ages in the sender's own steps,
newest first, stale rows dropped), the free-mode swarm window, and the trainer's steps, checkpoints and resume."""

import json
import time
import uuid

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path
from tiny_trainers import exchange_trainer
from transformers import TrainerCallback

from trl_ftis import PeerRow
from trl_ftis.swarm.exchange_modes.free_queue import FreeQueue
from trl_ftis.swarm.exchange_modes.free_window import FreeWindow


def received(sender, round, count=2, index=0):
    """`count` received rows of one group of `sender`'s round `round`."""
    return [
        PeerRow(
            prompt="1+2=",
            completion_ids=[3],
            generator_logps=[-0.5],
            reward=float(k),
            group=(sender, round, index),
            sender=sender,
            round=round,
        )
        for k in range(count)
    ]


def ages(taken):
    return [(row.round, taken.ages[(row.sender, row.group)][0]) for row in taken.rows]


# -- the arrival queue -----------------------------------------------------------------------------------------------
def test_the_queue_gives_fresh_rows_newest_first_and_keeps_the_rest_for_later():
    queue = FreeQueue(max_rows=100, max_staleness=2)
    queue.add(received("a", 5) + received("a", 6) + received("a", 7), now=100.0)
    taken = queue.take(4, {"a": 7}, now=101.0)
    # Two groups fit the cap: rounds 7 and 6 (ages 0 and 1), round 5 stays queued.
    assert ages(taken) == [(7, 0), (7, 0), (6, 1), (6, 1)]
    assert len(queue) == 2 and not taken.stale
    # The sender moved on to its step 8: round 5 is 3 of its steps old now, more than max_staleness.
    taken = queue.take(4, {"a": 8}, now=102.0)
    assert taken.rows == [] and taken.stale == {"a": 2} and len(queue) == 0


def test_ages_are_counted_in_each_senders_own_steps_and_seconds():
    queue = FreeQueue(max_rows=100, max_staleness=2)
    # A fast sender at its step 90 and a slow one at its step 3: no shared counter.
    queue.add(received("fast", 89), created={("fast", 89): 95.0}, now=100.0)
    queue.add(received("slow", 3), created={("slow", 3): 90.0}, now=100.0)
    taken = queue.take(None, {"fast": 90, "slow": 3}, now=100.0)
    assert taken.ages == {("fast", ("fast", 89, 0)): (1, 5.0), ("slow", ("slow", 3, 0)): (0, 10.0)}


def test_rows_from_after_a_senders_newest_round_are_stale_it_restarted():
    queue = FreeQueue(max_rows=100, max_staleness=2)
    queue.add(received("a", 9))
    taken = queue.take(None, {"a": 4})  # its newest message is of step 4 now: resumed from an older checkpoint
    assert taken.rows == [] and taken.stale == {"a": 2}


def test_the_queue_is_bounded_dropping_the_oldest_arrivals():
    queue = FreeQueue(max_rows=4, max_staleness=2)
    assert not queue.add(received("a", 1) + received("a", 2), now=1.0)
    dropped = queue.add(received("b", 1), now=2.0)
    assert dropped == {"a": 2} and len(queue) == 4
    assert sorted({(row.sender, row.round) for row in queue.rows()}) == [("a", 2), ("b", 1)]


def test_a_step_shares_its_cap_fairly_between_senders():
    queue = FreeQueue(max_rows=100, max_staleness=2)
    queue.add(received("fast", 10) + received("fast", 11) + received("fast", 12) + received("slow", 2))
    taken = queue.take(4, {"fast": 12, "slow": 2})
    assert sorted({(row.sender, row.round) for row in taken.rows}) == [("fast", 12), ("slow", 2)]


# -- the free-mode swarm ----------------------------------------------------------------------------------------------
@pytest.fixture
def url():
    return f"memory://free-{uuid.uuid4().hex}"


def count_waits(swarm):
    """The timeouts of every `wait` `swarm` makes on its exchange from now on (a round that waits for a peer waits
    there): a list that grows as it waits, so that a test counts waits instead of timing them."""
    waits, wait = [], swarm.transport.wait
    swarm.transport.wait = lambda timeout: waits.append(timeout) or wait(timeout)
    return waits


def test_a_free_running_collect_never_waits_and_judges_each_sender_by_its_own_steps(tokenizer, url):
    fast = make_swarm(url, "fast", tokenizer)
    receiver = make_swarm(url, "me", tokenizer, window=FreeWindow, expected_peers=["fast", "slow"], peer_timeout=60)
    for round in range(10):
        fast.publish(rows("fast", group=f"g{round}", round=round), round)
    waits = count_waits(receiver)
    result = receiver.collect(0)  # the receiver's own step is 0; the fast sender is at its step 9
    assert waits == []  # the silent expected peer "slow" is not waited for (peer_timeout 60)
    assert sorted({row.round for row in result.rows}) == [7, 8, 9]  # max_staleness = 2 of the sender's steps
    # The sender keeps its newest max_staleness + 2 messages in the exchange (5-9): 5 and 6 are too old.
    assert result.refused["stale"] == 2 and result.peers["fast"].rows_stale == 8
    assert receiver.window.sender_rounds == {"fast": 9}
    assert sorted(result.peers["fast"].staleness) == [0, 1, 2]
    assert result.missing == []  # silent for less than peer_timeout
    # A sender far "ahead" of the receiver is not refused: rounds are each sender's own.
    fast.publish(rows("fast", group="g100", round=100), 100)
    assert {row.round for row in receiver.collect(1).rows} == {100}
    assert receiver.window.sender_rounds == {"fast": 100}


def test_a_silent_expected_peer_is_counted_missing_after_peer_timeout_never_waited_for(tokenizer, url):
    receiver = make_swarm(url, "me", tokenizer, window=FreeWindow, expected_peers=["slow"], peer_timeout=0.2)
    assert receiver.collect(0).missing == []
    time.sleep(0.3)
    waits = count_waits(receiver)
    assert receiver.collect(1).missing == ["slow"]
    assert waits == []  # counted missing, and not waited for
    slow = make_swarm(url, "slow", tokenizer)
    slow.publish(rows("slow", round=0), 0)
    assert receiver.collect(2).missing == []  # heard from again


def test_a_sender_that_restarted_from_an_older_checkpoint_is_followed_back(tokenizer, url):
    sender = make_swarm(url, "a", tokenizer)
    checkpoint = sender.state_dict()
    receiver = make_swarm(url, "me", tokenizer, window=FreeWindow)
    sender.publish(rows("a", group="older", round=41), 41)
    sender.publish(rows("a", group="late", round=50), 50)
    assert {row.round for row in receiver.collect(0).rows} == {50}  # 41 is too old next to 50
    assert receiver.collect(1).rows == [] and receiver.window.sender_rounds == {"a": 50}
    resumed = make_swarm(url, "a", tokenizer)
    resumed.load_state_dict(checkpoint)  # a new start, resumed at step 41: a newer epoch
    resumed.publish(rows("a", group="again", round=41), 41)
    result = receiver.collect(2)
    assert {row.round for row in result.rows} == {41} and receiver.window.sender_rounds == {"a": 41}
    restored = make_swarm(url, "me2", tokenizer, window=FreeWindow)
    restored.load_state_dict(receiver.state_dict())
    assert restored.window.sender_rounds == {"a": 41} and restored.window.sender_epochs == {"a": resumed.epoch}


# -- the trainer ------------------------------------------------------------------------------------------------------
class FastPartner(TrainerCallback):
    """A peer three times as fast as the trainer: three rounds of its own (8 rows each) per trainer step."""

    def __init__(self, swarm):
        self.swarm, self.round = swarm, 0

    def on_step_begin(self, args, state, control, **kwargs):
        for _ in range(3):
            self.swarm.publish(rows("partner", count=8, group=f"g{self.round}", round=self.round), self.round)
            self.round += 1


def free_trainer(tokenizer, make_args, url, *, callbacks=(), **overrides):
    return exchange_trainer(tokenizer, make_args, url, "free", callbacks=callbacks, **{"max_steps": 4, **overrides})


def test_free_running_steps_train_on_what_arrived_without_waiting_for_a_silent_peer(tokenizer, make_args, url):
    partner = make_swarm(url, "partner", tokenizer)
    trainer = free_trainer(
        tokenizer,
        make_args,
        url,
        callbacks=[FastPartner(partner)],
        expected_peers=["partner", "gone"],  # "gone" never sends: never waited for
        peer_timeout=60,
    )
    merged = []
    original = trainer._merge_peer_rows
    trainer._merge_peer_rows = lambda output, batch: merged.append(batch) or original(output, batch)
    waits = count_waits(trainer.swarm)
    trainer.train()
    assert waits == []  # no step waited on the exchange (for "gone" or anyone)
    entries = [entry for entry in trainer.state.log_history if "loss" in entry]
    # Every step after the first trains on the partner's rows that are at most 2 of its own steps old.
    assert merged[0] == [] and all(batch for batch in merged[2:])
    for batch in merged:
        assert all(row.age is not None and 0 <= row.age <= 2 for row in batch)
        rounds = {row.round for row in batch}
        assert not rounds or max(rounds) - min(rounds) <= 2
    assert all(entry["ftis/exchange/blocking_seconds"] < 1.0 for entry in entries)
    assert any("ftis/peers/partner/age_steps" in entry for entry in entries)
    assert any("ftis/peer_age/0/is_weight_mean" in entry for entry in entries)
    summary = trainer.summary()
    assert summary["rows_accepted"] == sum(len(batch) for batch in merged) > 0
    assert sum(summary["peer_row_ages"].values()) == summary["rows_accepted"]
    assert summary["dropped"].get("stale", 0) >= 0 and trainer.swarm.closed


def test_a_free_running_checkpoint_holds_the_queue_and_resume_admits_it_again(tokenizer, make_args, url, tmp_path):
    partner = make_swarm(url, "partner", tokenizer)
    out = tmp_path / "out"
    trainer = free_trainer(
        tokenizer,
        make_args,
        url,
        callbacks=[FastPartner(partner)],
        save_strategy="steps",
        save_steps=2,
        output_dir=str(out),
        max_peer_rows=8,  # one group a step: the rest stays queued, and is saved
    )
    trainer.train()
    state_file = out / "checkpoint-2" / "ftis_state_0.json"
    state = json.loads(state_file.read_text())
    queue = state["exchange_mode"]["state"]  # the free mode's own state, under its name
    assert state["exchange_mode"]["name"] == "free"
    assert len(queue["arrived_rows"]) == len(queue["arrived_created"]) > 0
    queued = len(queue["arrived_rows"])
    # A hostile edit: the newest arrived row gets a token id outside the vocabulary.
    queue["arrived_rows"][-1]["completion_ids"] = [10**9, 1, 2]
    state_file.write_text(json.dumps(state))
    resumed = free_trainer(tokenizer, make_args, url, output_dir=str(out), max_peer_rows=8)
    assert resumed.load_ftis_state(out / "checkpoint-2")
    assert len(resumed._rounds.mode.arrivals) == queued  # queued as they were: admitted when a step takes them
    newest = max(row["round"] for row in queue["arrived_rows"])
    taken = resumed._rounds.mode.arrivals.take(None, {"partner": newest})
    with resumed._rounds.lock:
        admitted = resumed._rounds.mode.admit(taken)
    # Admitted like any arrived row: the hostile one dropped and counted, the others trained on.
    assert resumed._ledger.dropped_totals["bad_ids"] == 1
    assert len(admitted) == len(taken.rows) - 1 > 0
    assert all(row.age in (0, 1, 2) for row in admitted)
    queue["arrived_created"] = ["soon"] * queued
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="arrived_created"):
        resumed.load_ftis_state(out / "checkpoint-2")


@pytest.mark.parametrize("mode", ["async", "free"])
def test_horizontal_mode_needs_the_sync_exchange(make_args, mode):
    with pytest.raises(ValueError, match="cannot be combined"):
        make_args(exchange_mode=mode, collaboration_mode="horizontal")


class HostilePartner(TrainerCallback):
    """A partner whose every other group is malformed (a chat role no template has), and garbage files."""

    def __init__(self, swarm, folder):
        self.swarm, self.folder, self.round = swarm, folder, 0

    def on_step_begin(self, args, state, control, **kwargs):
        good = rows("partner", count=8, group=f"g{self.round}", round=self.round)
        bad = rows(
            "partner", count=8, group=f"b{self.round}", round=self.round, prompt=[{"role": "wizard", "content": "x"}]
        )
        self.swarm.publish(good + bad, self.round)
        (self.folder / f"{self.round:010d}.partner.garbage.ftis").write_bytes(b"\x00" * 64)
        self.round += 1


def test_free_running_rows_go_through_the_same_admission_and_budgets(tokenizer, make_args, tmp_path):
    folder = tmp_path / "exchange"
    url = f"dir://{folder}"
    partner = make_swarm(url, "partner", tokenizer)
    trainer = free_trainer(tokenizer, make_args, url, callbacks=[HostilePartner(partner, folder)])
    merged = []
    original = trainer._merge_peer_rows
    trainer._merge_peer_rows = lambda output, batch: merged.append(batch) or original(output, batch)
    trainer.train()
    summary = trainer.summary()
    assert summary["steps"] == 4
    assert summary["dropped"].get("bad_chat_prompt", 0) >= 8  # taken from the queue, refused by the admission
    assert sum(summary["refused"].values()) >= 1  # the garbage files, refused by the swarm as in the sync mode
    trained = [row for batch in merged for row in batch]
    assert trained and all(isinstance(row.prompt, str) for row in trained)


@pytest.mark.parametrize("mode", ["sync", "async", "free"])
def test_joining_a_swarm_logs_one_line_saying_how_messages_are_authenticated(tokenizer, make_args, caplog, mode):
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.rounds"):
        trainer = exchange_trainer(
            tokenizer, make_args, f"memory://auth-{uuid.uuid4().hex}", mode, swarm_secret="s3cret", max_steps=1
        )
        trainer.train()
        trainer.train()  # a second training run of the same trainer (and its background worker) says nothing new
    lines = [r.getMessage() for r in caplog.records if "message authentication" in r.getMessage()]
    assert lines == ["Peer 'me': message authentication: a shared swarm secret (HMAC)."]
    assert all("s3cret" not in r.getMessage() for r in caplog.records)  # the secret itself is never logged
