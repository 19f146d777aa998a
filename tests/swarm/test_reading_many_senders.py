"""Many senders (issue 20): a receiver reads what its round can use, fairly across rounds, whatever the swarm's size.

Once the round's rows (`max_rows`) are spent, the other envelopes are dropped unread (`round_budget`), so a receiver's
cost is set by what it trains on, not by how many peers publish; the order in which senders are read is drawn afresh
every round (regulars first), so over rounds every sender is read; and a hint still costs only its writer.
"""

import logging

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path

from trl_ftis.exchange import encode_message, tokenizer_fingerprint
from trl_ftis.exchange.transports import open_transport
from trl_ftis.swarm.peer_messages import rows_to_message
from trl_ftis.swarm.round_budget import ROW_MISSES

SECRET = "members-only"


# `url` (memory:// and dir://) and `memory_url` come from conftest.py.


def publish(tokenizer, url, sender, round=0, *, count=4, prompt=None, signed_as=None, round_hint=None):
    """Publish one signed message of `count` rows, as the exchange's writer `sender` (signed as `signed_as`, filed
    under `round_hint`, when a test makes it lie)."""
    signer = signed_as or sender
    message = rows_to_message(
        rows(signer, count=count, prompt=prompt or f"{signer}:{round}"),
        sender=signer,
        round=round,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        tokenizer_name="char",
        temperature=1.0,
        reward_names=["digit_match_reward"],
    )
    with open_transport(url) as transport:
        transport.publish(
            encode_message(message, secret=SECRET),
            sender=sender,
            round=round if round_hint is None else round_hint,
        )


def receiver(tokenizer, url, **overrides):
    return make_swarm(url, "receiver", tokenizer, secret=SECRET, **overrides)


def senders_of(result):
    return {row.sender for row in result.rows}


# --------------------------------------------------------------------------------------------------------------------
# (a) a spent row allowance leaves the rest unread
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("regulars", ["known", "none"])
def test_a_hundred_senders_cost_what_the_rows_taken_cost(tokenizer, url, regulars, caplog):
    senders = [f"s{k:03d}" for k in range(100)]
    for sender in senders:
        publish(tokenizer, url, sender)
    a = receiver(tokenizer, url)
    if regulars == "known":  # met them all before: every sender has its own allowance
        a.known_peers = set(senders)
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        result = a.collect(0, max_rows=8)  # two messages' rows
    assert len(result.rows) == 8 and len(senders_of(result)) == 2
    assert result.messages_read == 2, "the other 98 were dropped unread"
    assert result.refused["round_budget"] == 98 and sum(result.refused.values()) == 98
    assert any("dropped unread" in record.getMessage() for record in caplog.records)


def test_messages_that_do_not_fit_end_the_reading_after_a_few_senders(tokenizer, memory_url):
    senders = [f"s{k:03d}" for k in range(100)]
    for sender in senders:
        publish(tokenizer, memory_url, sender, count=3)
    for regulars in ("known", "none"):
        a = receiver(tokenizer, memory_url)
        if regulars == "known":
            a.known_peers = set(senders)
        result = a.collect(0, max_rows=8)  # two messages of 3 rows fit, then 2 rows are left that nothing fills
        assert len(result.rows) == 6, regulars
        assert result.messages_read == 2 + ROW_MISSES, regulars
        assert result.refused["round_budget"] == 98, regulars


def test_a_round_that_can_take_no_rows_reads_nothing(tokenizer, memory_url):
    for sender in ("b", "c", "d"):
        publish(tokenizer, memory_url, sender)
    a = receiver(tokenizer, memory_url, expected_peers=["b", "c", "d"], peer_timeout=0.0)
    result = a.collect(0, max_rows=0)
    assert result.rows == [] and result.messages_read == 0 and result.refused["round_budget"] == 3


def test_with_unbounded_rows_everyone_is_still_read(tokenizer, memory_url):
    senders = [f"s{k:02d}" for k in range(40)]
    for sender in senders:
        publish(tokenizer, memory_url, sender)
    a = receiver(tokenizer, memory_url)
    a.known_peers = set(senders)
    result = a.collect(0)
    assert senders_of(result) == set(senders) and result.messages_read == 40 and not result.refused


# --------------------------------------------------------------------------------------------------------------------
# (b) fair over rounds: every sender is read, regulars every round
# --------------------------------------------------------------------------------------------------------------------
def test_every_newcomer_is_read_over_rounds_and_the_regulars_every_round(tokenizer, memory_url):
    newcomers = [f"n{k}" for k in range(10)]
    a = receiver(tokenizer, memory_url, expected_peers=["r1", "r2"])
    read = {sender: 0 for sender in newcomers}
    for round in range(30):
        for sender in newcomers + ["r1", "r2"]:  # the newcomers first in the exchange, every round alike
            publish(tokenizer, memory_url, sender, round)
        result = a.collect(round, max_rows=24)  # regulars: 8 rows; newcomers share 24 // 3 = 8 rows, two messages
        assert {"r1", "r2"} <= senders_of(result) and result.missing == []
        assert result.messages_read == 4 and len(result.rows) == 16
        for sender in senders_of(result) - {"r1", "r2"}:
            read[sender] += 1
    assert all(count >= 1 for count in read.values()), read
    assert sum(read.values()) == 60 and max(read.values()) <= 15, read


def test_every_regular_is_read_over_rounds_when_they_do_not_all_fit(tokenizer, memory_url):
    regulars = [f"r{k}" for k in range(10)]
    a = receiver(tokenizer, memory_url)
    a.known_peers = set(regulars)
    read = {sender: 0 for sender in regulars}
    for round in range(60):
        for sender in regulars:
            publish(tokenizer, memory_url, sender, round)
        result = a.collect(round, max_rows=8)  # two of the ten a round
        assert result.messages_read == 2
        for sender in senders_of(result):
            read[sender] += 1
    assert all(count >= 1 for count in read.values()), read


def test_two_receivers_read_different_senders_in_the_same_round(tokenizer, memory_url):
    senders = [f"s{k:02d}" for k in range(20)]
    for sender in senders:
        publish(tokenizer, memory_url, sender)
    taken = []
    for peer in ("receiver-1", "receiver-2"):
        a = make_swarm(memory_url, peer, tokenizer, secret=SECRET)
        a.known_peers = set(senders)
        taken.append(senders_of(a.collect(0, max_rows=16)))
    assert len(taken[0]) == len(taken[1]) == 4 and taken[0] != taken[1]


# --------------------------------------------------------------------------------------------------------------------
# (c) a lying hint, a flood or an oversized message costs only its writer
# --------------------------------------------------------------------------------------------------------------------
def test_a_message_filed_under_a_regulars_name_costs_that_regular_nothing_but_a_place(tokenizer, memory_url):
    a = receiver(tokenizer, memory_url, expected_peers=["b", "c"])
    publish(tokenizer, memory_url, "b", signed_as="liar")  # first in the exchange, under b's name
    publish(tokenizer, memory_url, "c")
    publish(tokenizer, memory_url, "b")
    result = a.collect(0, max_rows=12)  # a share of 12 // 3 = 4 rows each for b, c and the newcomers
    assert senders_of(result) == {"b", "c"} and len(result.rows) == 8
    assert result.refused["sender_hint"] == 1 and result.missing == []


def test_a_lying_round_hint_costs_only_its_writer(tokenizer, memory_url):
    honest = [f"h{k}" for k in range(4)]
    a = receiver(tokenizer, memory_url)
    a.known_peers = set(honest) | {"liar"}  # a regular: its far-ahead envelopes are read (it may lead the swarm)
    publish(tokenizer, memory_url, "liar", round=0, round_hint=9)  # an old message filed as the current round
    publish(tokenizer, memory_url, "liar", round=9, round_hint=500)  # a current one filed far ahead: comes last
    for sender in honest:
        publish(tokenizer, memory_url, sender, round=9)
    result = a.collect(9, max_rows=24)  # a share of 24 // 6 = 4 rows for each regular and the newcomers
    assert sum(row.sender in honest for row in result.rows) == 16  # every honest row, whatever the lies
    # The old one is read in the liar's turn and refused (`stale`); the far-ahead one comes last and gets what is left
    # of the liar's own share: the lies cost the liar its places, and nobody else anything.
    assert result.refused["stale"] == 1 and sum(row.sender == "liar" for row in result.rows) <= 4


def test_a_flood_under_ones_own_name_is_read_after_everyone_elses_first_message(tokenizer, memory_url):
    honest = [f"n{k}" for k in range(4)]
    for k in range(30):  # distinct messages, all filed before the honest ones, in and around the round
        publish(tokenizer, memory_url, "flood", round=5, round_hint=5 + k % 3 - 1, prompt=f"flood {k}")
    for sender in honest:
        publish(tokenizer, memory_url, sender, round=5)
    result = receiver(tokenizer, memory_url).collect(5, max_rows=20)  # five messages' rows, no regulars
    assert set(honest) <= senders_of(result)
    assert sum(row.sender == "flood" for row in result.rows) == 4  # one message: its first turn
    assert result.messages_read == 5 and result.refused["round_budget"] == 29


def test_an_oversized_message_costs_only_its_sender(tokenizer, memory_url):
    a = receiver(tokenizer, memory_url, expected_peers=["big", "c", "d"], peer_timeout=0.0)
    publish(tokenizer, memory_url, "big", count=20)  # more than the whole round can take
    publish(tokenizer, memory_url, "c")
    publish(tokenizer, memory_url, "d")
    result = a.collect(0, max_rows=16)  # c and d fit their shares (16 // 4 = 4 rows), whichever is read first
    assert senders_of(result) == {"c", "d"} and len(result.rows) == 8
    assert result.refused["round_budget"] == 1 and result.messages_read == 3


# --------------------------------------------------------------------------------------------------------------------
# The bound keeps the round protocol's other guarantees
# --------------------------------------------------------------------------------------------------------------------
def test_a_lagging_group_whose_own_rows_fill_its_rounds_still_catches_up(tokenizer, memory_url):
    level, ahead = [f"s{k}" for k in range(4)], [f"f{k}" for k in range(6)]
    me = receiver(tokenizer, memory_url)
    me.known_peers = set(level + ahead)  # all regulars; most of them are 40 rounds ahead of this peer
    for step in range(2):
        for sender in level:  # stalled with this peer: their rows alone fill its rounds
            publish(tokenizer, memory_url, sender, step)
        for sender in ahead:
            publish(tokenizer, memory_url, sender, 40 + step)
        result = me.collect(step, max_rows=44)  # a share of 4 rows for each of the 10 regulars and the newcomers
        assert sum(row.sender in level for row in result.rows) == 16  # the level peers' rows, every step
    assert me.round_offset == 40  # at its step 1 the median regular showed round 41, ahead and live: it moved there
