"""Free-mode exchange against replays of a run's own genuine messages: each sender's messages are taken only in
order (a newer round of its newest start, or a newer start), whatever bounded memory holds, and only such messages
count as signs of life. The attacker needs no secret and no key: it copies bytes the exchange already held."""

import logging
import time
import uuid

import pytest
from swarm_helpers import make_swarm, publish_raw, rows, wire_message  # tests/ is on sys.path

from trl_ftis.exchange import decode_message, encode_message
from trl_ftis.exchange.transports import open_transport
from trl_ftis.swarm.exchange_modes.free_window import FreeWindow

SECRET = "swarm-secret"


@pytest.fixture
def url():
    return f"memory://replays-{uuid.uuid4().hex}"


class Recorder:
    """Reads the exchange as an eavesdropper does: every message's raw bytes, by (sender, round) as published."""

    def __init__(self, url):
        self.transport = open_transport(url)
        self.seen: dict[tuple[str, int], bytes] = {}

    def read(self):
        for envelope in self.transport.poll():
            self.seen[(envelope.sender_hint, envelope.round_hint)] = envelope.data
        return self.seen

    def replay(self, url, sender, round):
        publish_raw(url, self.read()[(sender, round)], sender=sender, round=round)


def free_receiver(url, tokenizer, peer_id="me", **overrides):
    return make_swarm(url, peer_id, tokenizer, window=FreeWindow, secret=SECRET, **overrides)


def keeping(url, tokenizer, peer_id="a"):
    """A sender that leaves its messages in the exchange (the recorder reads them whenever it likes)."""
    return make_swarm(url, peer_id, tokenizer, secret=SECRET, keep_rounds=10_000)


def pruning_sender_recorded(url, tokenizer, rounds):
    """A sender that keeps only its newest 2 messages in the exchange, its `rounds` published and recorded before a
    receiver joins: the receiver never sees them, the recorder kept them all."""
    sender, recorder = make_swarm(url, "a", tokenizer, secret=SECRET, keep_rounds=2), Recorder(url)
    for round in rounds:
        publish(sender, round)
        recorder.read()
    return sender, recorder


def publish(swarm, round, count=4):
    swarm.publish(rows(swarm.peer_id, count=count, group=f"{swarm.peer_id}-{round}", round=round), round)


def test_a_late_joiner_refuses_a_replay_of_an_older_round(tokenizer, url):
    """The joiner never saw round 1 (pruned before it started); a replay of it after round 5 is stale."""
    sender, recorder = pruning_sender_recorded(url, tokenizer, range(4))
    late = free_receiver(url, tokenizer, max_staleness=2)
    for round in range(4, 6):
        publish(sender, round)
        late.collect(round)
    assert late.window.sender_rounds == {"a": 5}
    recorder.replay(url, "a", 1)
    result = late.collect(6)
    assert result.rows == [] and result.refused == {"stale": 1}
    assert late.window.sender_rounds == {"a": 5}  # never moved back


def test_a_message_accepted_once_is_never_accepted_again_however_many_follow(tokenizer, url):
    """Digest memory is bounded; the order rule is not: 140 newer messages (and replays that would flush a digest
    cache) later, the round-2 message is still refused."""
    sender, recorder = keeping(url, tokenizer), Recorder(url)
    receiver = free_receiver(url, tokenizer)
    publish(sender, 2)
    assert len(receiver.collect(0).rows) == 4
    recorder.read()
    for round in range(3, 143):
        publish(sender, round, count=1)
        assert len(receiver.collect(round).rows) == 1
    for round in (2, 2, 100, 142):
        recorder.replay(url, "a", round)
    result = receiver.collect(200)
    assert result.rows == [] and result.refused["stale"] + result.refused["duplicate"] == 4
    assert receiver.window.sender_rounds == {"a": 142}


def test_a_replay_of_an_old_round_cannot_make_fresh_queued_rows_stale(tokenizer, url):
    """Rounds 37 and 38 arrived (queued for the trainer's next step); then a replay of round 9 is all a collect
    finds. The sender's newest round must stay 38: were it moved back to 9, the queue would drop the 16 fresh rows as
    "from after the sender's newest round" and train round 9 as age 0."""
    sender, recorder = pruning_sender_recorded(url, tokenizer, range(30))  # the receiver never saw round 9
    receiver = free_receiver(url, tokenizer, max_staleness=2)
    for round in range(30, 37):
        publish(sender, round)
        receiver.collect(round)
    for round in (37, 38):
        publish(sender, round)
    result = receiver.collect(37)
    assert sorted({row.round for row in result.rows}) == [37, 38] and receiver.window.sender_rounds == {"a": 38}
    recorder.replay(url, "a", 9)
    result = receiver.collect(38)
    assert result.rows == [] and result.refused == {"stale": 1}
    assert receiver.window.sender_rounds == {"a": 38}


def test_replays_of_a_dead_expected_peer_do_not_keep_it_alive(tokenizer, url):
    """`a` dies; its old messages are replayed while a live peer's traffic flushes any bounded digest memory. `a`
    must show as missing once silent for peer_timeout."""
    sender, recorder = keeping(url, tokenizer), Recorder(url)
    live = keeping(url, tokenizer, "b")
    receiver = free_receiver(url, tokenizer, expected_peers=["a", "b"], peer_timeout=0.3)
    for round in range(4):
        publish(sender, round)
        publish(live, round)
        assert receiver.collect(round).missing == []
    recorder.read()
    sender.close()  # dead, silently
    deadline, round = time.monotonic() + 0.5, 4
    while time.monotonic() < deadline:
        for _ in range(70):  # more than any digest memory of this size keeps
            publish(live, round, count=1)
            round += 1
            receiver.collect(round)
        for old in range(4):
            recorder.replay(url, "a", old)
        result = receiver.collect(round)
        assert not any(row.sender == "a" for row in result.rows)
        time.sleep(0.05)
    assert receiver.collect(round + 1).missing == ["a"]


def test_a_restart_from_an_older_checkpoint_is_a_newer_epoch_and_its_old_start_stays_refused(tokenizer, url, caplog):
    sender, recorder = keeping(url, tokenizer), Recorder(url)
    receiver = free_receiver(url, tokenizer)
    checkpoint = sender.state_dict()
    for round in range(48, 51):
        publish(sender, round)
    receiver.collect(0)
    assert receiver.window.sender_rounds == {"a": 50} and receiver.window.sender_epochs == {"a": sender.epoch}
    restarted = keeping(url, tokenizer)
    restarted.load_state_dict(checkpoint)  # resumed at step 41, from an older checkpoint
    assert restarted.epoch > sender.epoch
    publish(restarted, 41)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.exchange_modes.free_order"):
        result = receiver.collect(1)
    assert "Peer 'a' restarted (its messages now come from a new start, at its step 41, after step 50)" in caplog.text
    assert {row.round for row in result.rows} == {41} and receiver.window.sender_rounds == {"a": 41}
    assert receiver.window.sender_epochs == {"a": restarted.epoch}
    for round in (48, 50):  # the first start's messages: an older epoch now
        recorder.replay(url, "a", round)
    result = receiver.collect(2)
    assert result.rows == [] and result.refused["stale"] + result.refused["duplicate"] == 2
    assert receiver.window.sender_rounds == {"a": 41}


def test_one_collect_holding_two_starts_of_a_sender_keeps_the_newer_one(tokenizer, url):
    sender = make_swarm(url, "a", tokenizer, secret=SECRET)
    receiver = free_receiver(url, tokenizer)
    publish(sender, 60)
    restarted = make_swarm(url, "a", tokenizer, secret=SECRET)
    restarted.load_state_dict(sender.state_dict())
    publish(restarted, 12)  # read after round 60 (newest hint first): it replaces it
    result = receiver.collect(0)
    assert {row.round for row in result.rows} == {12} and result.peers["a"].rows_stale == 4
    assert (receiver.window.sender_epochs, receiver.window.sender_rounds) == ({"a": restarted.epoch}, {"a": 12})


def test_the_order_survives_a_checkpoint_of_the_receiver(tokenizer, url):
    sender, recorder = keeping(url, tokenizer), Recorder(url)
    receiver = free_receiver(url, tokenizer)
    for round in range(5):
        publish(sender, round)
    receiver.collect(0)
    state = receiver.state_dict()
    resumed = free_receiver(url, tokenizer, peer_id="me")
    resumed.load_state_dict(state)
    assert resumed.epoch > receiver.epoch  # its own messages are of a newer start too
    for round in range(5):
        recorder.replay(url, "a", round)
    publish(sender, 5)
    result = resumed.collect(1)
    assert {row.round for row in result.rows} == {5} and len(result.rows) == 4  # nothing of rounds 0-4 again


def test_the_epoch_is_signed_and_checked(tokenizer):
    message = wire_message(tokenizer, "a", round=3, epoch=1_700_000_000_000_000)
    data = encode_message(message, secret=SECRET)
    assert decode_message(data, secret=SECRET).epoch == 1_700_000_000_000_000
    assert decode_message(encode_message(wire_message(tokenizer, "a")), secret=None).epoch == 0  # not sent
    for bad in (-1, 2**63, 1.5, True, "7"):
        with pytest.raises(Exception, match="epoch"):
            encode_message(wire_message(tokenizer, "a", epoch=bad))
