"""Newcomers share one allowance, so the order in which a receiver reads them decides which of them a flood leaves
out. That order is keyed with a secret only the receiver holds: ids or hints ground to rank first in any order a
writer can compute rank where any other id does, so a member's sybils or a stranger's junk cannot starve a late
joiner by choosing names."""

import hashlib
import os
import uuid

import pytest
from swarm_helpers import make_swarm, publish_raw, rows, wire_message  # tests/ is on sys.path

from trl_ftis.exchange import encode_message

SECRET = "members-only"
ROUNDS = 20


@pytest.fixture
def url():
    return f"memory://newcomers-{uuid.uuid4().hex}"


def public_rank(receiver: str, round: int, hint: str) -> bytes:
    """The order any writer could compute before it was keyed: a hash of the receiver's id, the round, the hint."""
    text = f"{receiver!r}|{round}|{hint!r}".encode("utf-8", "backslashreplace")
    return hashlib.blake2b(text, digest_size=8, person=b"ftis-order").digest()


def ground(receiver: str, round: int, beat: str, count: int, prefix: str) -> list[str]:
    """`count` hints that rank before `beat` in `receiver`'s public order of `round` (what a writer can grind)."""
    found, k = [], 0
    while len(found) < count:
        hint = f"{prefix}-{round}-{k}"
        if public_rank(receiver, round, hint) < public_rank(receiver, round, beat):
            found.append(hint)
        k += 1
    return found


def late_joiner_reads(url, tokenizer, flood) -> int:
    """Rounds (of `ROUNDS`) in which the receiver reads the late joiner's message, with `flood(round)` written first
    each round. One expected peer `a`; a round takes 16 rows: `a` and the newcomers together have 8 each."""
    me = make_swarm(url, "me", tokenizer, secret=SECRET, expected_peers=["a"], peer_timeout=0.2)
    a, late = (make_swarm(url, peer, tokenizer, secret=SECRET) for peer in ("a", "late"))
    read = 0
    for round in range(ROUNDS):
        flood(round)
        a.publish(rows("a", group=f"a{round}"), round)
        late.publish(rows("late", group=f"l{round}"), round)
        result = me.collect(round, max_rows=16)
        read += any(row.sender == "late" for row in result.rows)
    return read


def test_sybils_with_ids_ground_to_rank_first_do_not_starve_a_late_joiner(tokenizer, url):
    def sybils(round):  # four 8-row messages a round: the first one read fills the newcomers' share
        for sybil in ground("me", round, "late", 4, "sybil"):
            data = encode_message(wire_message(tokenizer, sybil, round, count=8), secret=SECRET)
            publish_raw(url, data, sender=sybil, round=round)

    # Five newcomers a round, one of them read: 1 round in 5 on average whatever the names (0 of 20 when a writer
    # could grind the order; this receiver's fixed test key gives 2).
    assert late_joiner_reads(url, tokenizer, sybils) >= 2


def test_junk_under_hints_ground_to_rank_first_does_not_use_up_a_late_joiners_turn(tokenizer, url):
    def junk(round):  # a stranger's 64 files a round, the newcomers' whole message allowance
        for hint in ground("me", round, "late", 64, "junk"):
            publish_raw(url, os.urandom(64), sender=hint, round=round)

    assert late_joiner_reads(url, tokenizer, junk) >= ROUNDS - 3  # read unless it ranks last of 65


def test_the_order_key_is_random_per_start_and_never_leaves_the_peer(tokenizer, url):
    first, second = (make_swarm(url, "me", tokenizer, order_key=None) for _ in range(2))
    assert len(first.order_key) == 16 and first.order_key != second.order_key
    first.publish(rows("me"), 0)
    sent = b"".join(envelope.data for envelope in second.transport.poll())
    assert first.order_key not in sent and first.order_key.hex() not in str(first.state_dict())
