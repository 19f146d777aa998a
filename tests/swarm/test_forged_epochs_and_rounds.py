"""A member with the shared secret (no per-peer keys) signs messages under another peer's name with a start (epoch)
or a round far in the future. What that costs the peer it names must be bounded in time and never outlive the
forgery: every later message the named peer makes is taken again, in both exchange modes, also after either side
resumes from a checkpoint."""

import logging
import time
import uuid

import pytest
from swarm_helpers import make_swarm, publish_raw, rows, wire_message  # tests/ is on sys.path

from trl_ftis.exchange import encode_message
from trl_ftis.exchange.transports import open_transport
from trl_ftis.swarm import clocks
from trl_ftis.swarm.exchange_modes.free_window import FreeWindow

SECRET = "members-only"
FAR = 2**63 - 1  # the largest epoch (and round) the wire format carries


@pytest.fixture
def url():
    return f"memory://forged-{uuid.uuid4().hex}"


def forge(url, tokenizer, sender, round, *, epoch, created=None, prompt="forged"):
    """A message signed with the shared secret under `sender`'s name, filed under its name too."""
    message = wire_message(tokenizer, sender, round, prompt=prompt, epoch=epoch, created=created)
    publish_raw(url, encode_message(message, secret=SECRET), sender=sender, round=min(round, 10**10 - 1))


def free(url, tokenizer, peer_id="me", **overrides):
    return make_swarm(url, peer_id, tokenizer, window=FreeWindow, secret=SECRET, **overrides)


def genuine(result, sender="victim"):
    return sorted({row.round for row in result.rows if row.sender == sender and row.prompt != "forged"})


# -- the free mode ----------------------------------------------------------------------------------------------------
def test_free_a_start_far_in_the_future_is_refused_and_recorded_nowhere(tokenizer, url):
    victim, me = make_swarm(url, "victim", tokenizer, secret=SECRET), free(url, tokenizer)
    victim.publish(rows("victim", group="g0"), 0)
    me.collect(0)
    forge(url, tokenizer, "victim", 1, epoch=FAR)
    result = me.collect(1)
    assert result.rows == [] and result.refused == {"epoch": 1}
    assert me.window.sender_epochs == {"victim": victim.epoch}  # never recorded
    victim.publish(rows("victim", group="g2"), 2)
    assert genuine(me.collect(2)) == [2]


@pytest.mark.parametrize("kind", ["start", "round"])
def test_free_a_forged_newer_start_or_round_stops_the_peer_only_until_it_sends_again(tokenizer, url, kind, caplog):
    """Within the bound a forged start (or a far round of the peer's own start) is taken, once: the peer's next
    message, made later, is taken too and followed from there, with no restart."""
    victim, me = make_swarm(url, "victim", tokenizer, secret=SECRET), free(url, tokenizer)
    victim.publish(rows("victim", group="g0"), 0)
    me.collect(0)
    if kind == "start":
        forge(url, tokenizer, "victim", 1, epoch=clocks.now_epoch() + 1800 * 10**6)  # half an hour ahead
    else:
        forge(url, tokenizer, "victim", 10**9, epoch=victim.epoch)
    me.collect(1)
    time.sleep(0.01)  # the victim's next message is made after the forged one
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.exchange_modes.free_order"):
        victim.publish(rows("victim", group="g1"), 1)
        assert genuine(me.collect(2)) == [1]
    assert "a member signed it under its name" in caplog.text
    assert (me.window.sender_epochs, me.window.sender_rounds) == ({"victim": victim.epoch}, {"victim": 1})
    for step in (2, 3):
        victim.publish(rows("victim", group=f"g{step}"), step)
        assert genuine(me.collect(step + 1)) == [step]


def test_free_the_genuine_messages_of_a_forged_peer_are_still_taken_only_once(tokenizer, url):
    """Following a peer back from a forged far round never lets a replay of a message taken before in: a message is
    taken when it is newer than every one taken, or made later than every one."""
    victim, me = make_swarm(url, "victim", tokenizer, secret=SECRET, keep_rounds=100), free(url, tokenizer)
    for step in range(3):
        victim.publish(rows("victim", group=f"g{step}"), step)
    with open_transport(url) as eavesdropper:
        recorded = {envelope.round_hint: envelope.data for envelope in eavesdropper.poll()}
    assert genuine(me.collect(0)) == [0, 1, 2]
    forge(url, tokenizer, "victim", 10**9, epoch=victim.epoch, created=time.time() - 3600)  # made an hour ago
    me.collect(1)
    time.sleep(0.01)
    victim.publish(rows("victim", group="g3"), 3)
    assert genuine(me.collect(2)) == [3]
    for step, data in recorded.items():
        publish_raw(url, data, sender="victim", round=step)
    result = me.collect(3)
    assert result.rows == [] and result.refused["stale"] + result.refused["duplicate"] == 3


class Clock:
    """Stands in for the `time` module of the code under test: `time()` and `monotonic()` move only when told."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)


def test_free_a_forged_created_counts_at_most_a_minute_ahead(tokenizer, url, monkeypatch):
    """A far round made "in the future" holds the peer's messages back until its `created`, bounded by
    `CREATED_SLACK` (60 s, 0.3 here) ahead of the receiver's clock, is passed."""
    clock = Clock(time.time() + 100)  # the receiver's clock, ahead of the victim's: its messages made "earlier"
    monkeypatch.setattr(clocks, "time", clock)
    monkeypatch.setattr(clocks, "CREATED_SLACK", 0.3)
    victim, me = make_swarm(url, "victim", tokenizer, secret=SECRET), free(url, tokenizer)
    victim.publish(rows("victim", group="g0"), 0)
    me.collect(0)
    forge(url, tokenizer, "victim", 10**9, epoch=victim.epoch, created=clock.now + 10**6)  # counts as now + 0.3
    me.collect(1)
    victim.publish(rows("victim", group="g1"), 1)  # made before the forged message counts as made
    assert genuine(me.collect(2)) == []
    clock.now += 1
    later = wire_message(tokenizer, "victim", 2, epoch=victim.epoch, created=clock.now - 0.5)  # after now + 0.3
    publish_raw(url, encode_message(later, secret=SECRET), sender="victim", round=2)
    assert genuine(me.collect(3)) == [2]


@pytest.mark.parametrize("epoch", [FAR, "half an hour ahead"])
def test_free_a_receiver_resumed_from_a_state_holding_a_forged_start_takes_the_peer_again(tokenizer, url, epoch):
    victim = make_swarm(url, "victim", tokenizer, secret=SECRET)
    me = free(url, tokenizer)
    victim.publish(rows("victim", group="g0"), 0)
    victim.publish(rows("victim", group="g1"), 1)
    me.collect(0)
    state = me.state_dict()
    forged = FAR if epoch == FAR else clocks.now_epoch() + 1800 * 10**6
    state["window"]["state"] = {"sender_rounds": {"victim": 10**9}, "sender_epochs": {"victim": forged}}
    resumed = free(url, tokenizer)
    resumed.load_state_dict(state)
    victim.publish(rows("victim", group="g2"), 2)
    assert genuine(resumed.collect(1)) == [2]


# -- the sync mode ----------------------------------------------------------------------------------------------------
def lock_step(url, tokenizer, peer_id="me", **overrides):
    return make_swarm(url, peer_id, tokenizer, secret=SECRET, peer_timeout=0.2, **overrides)


def test_lock_step_a_start_far_in_the_future_is_refused_before_it_is_recorded(tokenizer, url):
    victim, me = lock_step(url, tokenizer, "victim"), lock_step(url, tokenizer, expected_peers=["victim"])
    victim.publish(rows("victim", group="g0"), 0)
    me.collect(0)
    forge(url, tokenizer, "victim", 10**6, epoch=FAR)  # far ahead in both
    forge(url, tokenizer, "victim", 1, epoch=FAR, prompt="forged in the window")
    victim.publish(rows("victim", group="g1"), 1)
    result = me.collect(1)
    assert result.refused["epoch"] == 2 and genuine(result) == [1]
    assert me.state_dict()["window"]["state"]["newest_epochs"] == {"victim": victim.epoch}


def test_lock_step_a_forged_newer_start_stops_the_peer_only_until_it_sends_again(tokenizer, url):
    victim, me = lock_step(url, tokenizer, "victim"), lock_step(url, tokenizer, expected_peers=["victim"])
    victim.publish(rows("victim", group="g0"), 0)
    me.collect(0)
    forge(url, tokenizer, "victim", 1, epoch=clocks.now_epoch() + 1800 * 10**6)
    me.collect(1)
    time.sleep(0.01)
    for step in (2, 3):
        victim.publish(rows("victim", group=f"g{step}"), step)
        assert genuine(me.collect(step)) == [step]


def test_lock_step_forged_leads_of_two_regulars_are_undone_by_their_next_messages(tokenizer, url, caplog):
    """A member signs far rounds as two of three regulars, twice, and moves this peer to round ~1e9 (their leads are
    the median). The regulars' next messages, made later but of earlier rounds, disown those leads: this peer moves
    back, and trains on every live row of the three (48 over four rounds)."""
    regulars = ["a", "b", "c"]
    me = lock_step(url, tokenizer, expected_peers=regulars)
    peers = {peer: lock_step(url, tokenizer, peer) for peer in regulars}
    for step in range(2):
        for peer in regulars:
            peers[peer].publish(rows(peer, group=f"{peer}{step}"), step)
        me.collect(step)
    for step in (2, 3):  # the forged leads, read with this peer's steps 2 and 3
        for peer in ("a", "b"):
            forge(url, tokenizer, peer, 10**9 - 4 + step, epoch=peers[peer].epoch)
        me.collect(step)
    assert me.round_offset > 10**8  # moved: the median regular showed a live lead
    time.sleep(0.01)
    taken = 0
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.exchange_modes.sync_window"):
        for step in range(4, 8):
            for peer in regulars:
                peers[peer].publish(rows(peer, group=f"{peer}{step}"), step)
            result = me.collect(step)
            taken += sum(row.sender in regulars and row.prompt != "forged" for row in result.rows)
    assert "those leads were not theirs" in caplog.text
    assert me.round_offset == 0 and taken == 48


def test_lock_step_a_legitimate_catch_up_stands(tokenizer, url):
    """The leaders of a real catch-up go on from the round they showed: nothing disowns their leads."""
    regulars = ["a", "b", "c"]
    me = lock_step(url, tokenizer, expected_peers=regulars)
    peers = {peer: lock_step(url, tokenizer, peer) for peer in regulars}
    for step in range(6):
        for peer in regulars:
            peers[peer].publish(rows(peer, group=f"{peer}{step}"), 40 + step if peer != "c" else step)
        me.collect(step)
    assert me.round_offset == 40


# -- a start's epoch -------------------------------------------------------------------------------------------------
def test_a_start_resumed_from_a_far_future_epoch_takes_the_clock_and_says_so(tokenizer, url, caplog):
    peer = make_swarm(url, "a", tokenizer)
    state = {**peer.state_dict(), "epoch": FAR}
    before = clocks.now_epoch()
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.clocks"):
        resumed = make_swarm(url, "a", tokenizer)
        resumed.load_state_dict(state)
    assert before <= resumed.epoch < FAR and "takes the clock's epoch" in caplog.text
    again = make_swarm(url, "a", tokenizer)
    again.load_state_dict(resumed.state_dict())
    assert again.epoch > resumed.epoch  # every start after it is newer again


@pytest.mark.parametrize(
    ("saved", "now", "expected"),
    [
        (100, 50, 101),  # the clock went back: newer than the saved start all the same
        (100, 500, 500),  # the clock
        (FAR - 1, 10**15, 10**15),  # far ahead of the clock: the clock, not a start stuck at the largest epoch
        (10**15 + 3599 * 10**6, 10**15, 10**15 + 3599 * 10**6 + 1),  # within the hour peers accept
    ],
)
def test_start_epoch(saved, now, expected):
    assert clocks.start_epoch(saved, now) == expected


# -- the free-mode sender table ---------------------------------------------------------------------------------------
@pytest.fixture
def small_table(monkeypatch):
    """A sender table of 6 (10,000 in a real swarm), so that a flood fills it in one collect; its clock moves only
    when a test says so (`peer_timeout` is 0.2 s of it)."""
    from trl_ftis.swarm.exchange_modes import free_order, free_window

    monkeypatch.setattr(free_window, "MAX_KNOWN_PEERS", 6)
    clock = Clock(time.time())
    monkeypatch.setattr(free_order, "time", clock)
    return clock


def flood(url, tokenizer, count, start=0):
    for k in range(start, start + count):
        sybil = make_swarm(url, f"sybil-{k}", tokenizer, secret=SECRET)
        sybil.publish(rows(f"sybil-{k}", count=1, group="s"), 0)


def test_free_a_table_filled_by_invented_ids_makes_room_once_they_are_silent(tokenizer, url, small_table):
    me = free(url, tokenizer, peer_timeout=0.2)
    flood(url, tokenizer, 6)
    me.collect(0)
    assert len(me.window.sender_rounds) == 6
    late = make_swarm(url, "late", tokenizer, secret=SECRET)
    late.publish(rows("late", group="l0"), 0)
    small_table.now += 0.1
    refused = me.collect(1)  # the invented ids were heard just now: they keep their places for peer_timeout
    assert genuine(refused, "late") == [] and refused.refused["round_budget"] == 1
    small_table.now += 0.2
    late.publish(rows("late", group="l1"), 1)
    assert genuine(me.collect(2), "late") == [1]  # the least recently heard gave its place away
    assert "late" in me.window.sender_rounds and len(me.window.sender_rounds) == 6


def test_free_a_regular_keeps_its_place_however_long_it_is_silent(tokenizer, url, small_table):
    me = free(url, tokenizer, peer_timeout=0.2, expected_peers=["a"])
    a = make_swarm(url, "a", tokenizer, secret=SECRET)
    a.publish(rows("a", group="a0"), 0)
    me.collect(0)
    flood(url, tokenizer, 5)
    me.collect(1)
    small_table.now += 0.3
    flood(url, tokenizer, 5, start=5)  # five more newcomers, once the first five and `a` are silent
    me.collect(2)
    assert "a" in me.window.sender_rounds and sum(s.startswith("sybil") for s in me.window.sender_rounds) == 5


def test_free_one_message_senders_are_not_kept_in_checkpoints(tokenizer, url, small_table):
    me = free(url, tokenizer)
    a = make_swarm(url, "a", tokenizer, secret=SECRET)
    for step in range(2):
        a.publish(rows("a", group=f"a{step}"), step)
        me.collect(step)
    flood(url, tokenizer, 5)
    me.collect(2)
    assert len(me.window.sender_rounds) == 6
    state = me.state_dict()
    window = state["window"]["state"]
    assert window["sender_rounds"] == {"a": 1} and list(window["sender_epochs"]) == ["a"]
    resumed = free(url, tokenizer)
    resumed.load_state_dict(state)
    late = make_swarm(url, "late", tokenizer, secret=SECRET)
    late.publish(rows("late", group="l0"), 0)
    assert genuine(resumed.collect(3), "late") == [0]  # the table has room: the flood was not carried over
