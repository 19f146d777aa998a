"""The round protocol of `trl_ftis.swarm.client.Swarm` against hostile writers (issue 10): each attack first, then the
fix.

Decode once and verify first; the round window (`stale`, `ahead`) instead of wall clocks; duplicates that cannot
silence a peer; budgets that invented sender ids cannot break; per-peer keys (`trl-ftis keygen`); the temperature
range shared by the config and the wire.
"""

import hashlib
import hmac
import logging
import os
import time

import numpy as np
import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path
from swarm_helpers import publish_raw as write
from swarm_helpers import wire_message as message
from waits import returns_within

from trl_ftis.cli import main as cli_main
from trl_ftis.exchange import (
    Limits,
    decode_message,
    encode_message,
    generate_keypair,
    layout,
    load_private_key,
    load_public_keys,
    public_key_text,
    save_private_key,
    save_public_keys,
)
from trl_ftis.exchange import wire as wire_module
from trl_ftis.exchange.transports import MemoryTransport
from trl_ftis.peer_rows import select_rows
from trl_ftis.round_window import DEFAULT_MAX_ROUNDS_AHEAD
from trl_ftis.sampling_bounds import MAX_TEMPERATURE, MIN_TEMPERATURE
from trl_ftis.swarm.round_budget import RoundBudget

SECRET = "members-only"


# `url` (memory:// and dir://) and `memory_url` come from conftest.py.


def prompts(result, sender):
    return [row.prompt for row in result.rows if row.sender == sender]


# --------------------------------------------------------------------------------------------------------------------
# 1. Decode once, verify first; publishing never raises
# --------------------------------------------------------------------------------------------------------------------
def test_each_message_is_decoded_once_and_the_unauthenticated_header_is_never_parsed(
    tokenizer, memory_url, monkeypatch
):
    import trl_ftis.swarm.client as swarm_module

    calls = []
    decode = swarm_module.decode_message
    monkeypatch.setattr(swarm_module, "decode_message", lambda data, **kw: calls.append(kw) or decode(data, **kw))
    monkeypatch.setattr(wire_module, "peek_header", lambda *a, **kw: pytest.fail("peek_header parses unsigned JSON"))
    parsed = []
    parse = wire_module._parse_header
    monkeypatch.setattr(wire_module, "_parse_header", lambda frame, limits: parsed.append(1) or parse(frame, limits))
    limits = Limits.for_receiver(max_completion_length=16, max_rows=64)
    a = make_swarm(memory_url, "a", tokenizer, secret=SECRET, limits=limits)
    b = make_swarm(memory_url, "b", tokenizer, secret=SECRET, limits=limits)
    a.publish(rows("a"), 0)  # our own: skipped before decoding
    b.publish(rows("b"), 0)
    write(memory_url, encode_message(message(tokenizer, "c")), sender="c", round=0)  # unsigned
    write(memory_url, encode_message(message(tokenizer, "d"), secret="wrong"), sender="d", round=0)
    parsed.clear()
    result = a.collect(0)
    assert prompts(result, "b") == ["12+34="] * 4
    assert len(calls) == 3 and all(kw["limits"] is limits and kw["secret"] == SECRET for kw in calls)
    assert result.refused["unsigned"] == 1 and result.refused["signature"] == 1
    assert len(parsed) == 1, "only the verified message's header was parsed"
    assert a.transport.max_message_bytes == limits.max_message_bytes


def test_publish_leaves_out_groups_the_wire_would_refuse_and_never_raises(tokenizer, memory_url, caplog):
    a, observer = make_swarm(memory_url, "a", tokenizer), make_swarm(memory_url, "observer", tokenizer)
    good, huge = rows("a", group="good"), rows("a", group="huge", reward=1e7)  # |r| > Limits.max_abs_reward
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        assert a.publish(good + huge, 0) > 0
        assert a.publish(huge, 1) == 0  # nothing left to send
        assert a.publish(huge, 2) == 0
    assert [r.round for r in observer.collect(0).rows] == [0] * 4  # the good group went out
    assert a.unpublished["out_of_range"] == 12
    assert sum("wire format refuses" in r.getMessage() for r in caplog.records) == 1  # logged once

    tiny = make_swarm(memory_url, "tiny", tokenizer, limits=Limits(max_message_bytes=200))
    with caplog.at_level(logging.ERROR, logger="trl_ftis"):
        assert tiny.publish(rows("tiny"), 0) == 0
        assert tiny.publish(rows("tiny"), 1) == 0
    assert tiny.unpublished["too_large"] == 8
    assert sum("Could not encode" in r.getMessage() for r in caplog.records) == 1


# --------------------------------------------------------------------------------------------------------------------
# 2. Rounds far ahead
# --------------------------------------------------------------------------------------------------------------------
def test_rounds_far_ahead_are_refused(tokenizer, memory_url):
    a = make_swarm(memory_url, "a", tokenizer, secret=SECRET)  # max_rounds_ahead = 4
    # The transport caps its round hint at 10**10 - 1; a message can still claim any round up to 2**63 - 1.
    write(memory_url, encode_message(message(tokenizer, "b", 2**63 - 1), secret=SECRET), sender="b", round=10)
    write(memory_url, encode_message(message(tokenizer, "b", 2**63 - 1), secret=SECRET), sender="b", round=12)
    for round in (15, 14, 13):
        write(memory_url, encode_message(message(tokenizer, "b", round), secret=SECRET), sender="b", round=round)
    result = a.collect(10)
    assert sorted({row.round for row in result.rows}) == [13, 14]
    # 2**63 - 1 twice (read: their round hints lie) and 15 (refused unread, from its hint).
    assert result.refused["ahead"] == 3 and result.messages_read == 4
    assert sorted(result.peers["b"].staleness) == [-4, -3]


# --------------------------------------------------------------------------------------------------------------------
# 3. Duplicates cannot silence a genuine peer
# --------------------------------------------------------------------------------------------------------------------
def test_forged_messages_for_a_peers_future_rounds_do_not_silence_it(tokenizer, memory_url):
    """Was: a member pre-published messages under b's name for b's future rounds; (sender, round) deduplication then
    refused every genuine message of b as a `duplicate`. Now only identical bytes are duplicates."""
    forger = make_swarm(memory_url, "b", tokenizer, secret=SECRET, keep_rounds=100)  # holds the secret, writes as b
    for round in range(12):
        forger.publish(rows("b", prompt="forged"), round)
    a = make_swarm(memory_url, "a", tokenizer, secret=SECRET, expected_peers=["b"], peer_timeout=2.0)
    b = make_swarm(memory_url, "b", tokenizer, secret=SECRET)
    for round in range(6):
        b.publish(rows("b", prompt="genuine"), round)
        result = a.collect(round)
        assert prompts(result, "b").count("genuine") == 4, round
        assert result.refused["duplicate"] == 0 and result.missing == []
        # What the forger gets: at most b's share of the round (the window), never more.
        assert len(result.rows) <= 4 * (a.max_staleness + a.max_rounds_ahead + 1)


def test_a_forger_under_a_peers_name_does_not_keep_its_rows_out_of_training(tokenizer, make_args, memory_url):
    from trl_ftis import FTISTrainer
    from trl_ftis.demo.tiny import build_tiny_llama
    from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

    forger = make_swarm(memory_url, "b", tokenizer, keep_rounds=100)
    for round in range(4):
        forger.publish(rows("b", count=2, prompt="99+99=", group=f"forged{round}"), round)
    make_swarm(memory_url, "b", tokenizer).publish(rows("b", count=8, group="genuine"), 0)
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer, seed=0),
        digit_match_reward,
        args=make_args(exchange_url=memory_url, peer_id="me", max_steps=1),
        train_dataset=addition_dataset(64, seed=1),
        processing_class=tokenizer,
    )
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peers/b/rows_accepted"] == 16  # b's 8 genuine rows, and the forger's 8 within b's share
    assert entry.get("ftis/exchange/refused/duplicate", 0) == 0


def test_identical_bytes_are_used_once_but_two_messages_of_one_round_are_not_duplicates(tokenizer, memory_url):
    a = make_swarm(memory_url, "a", tokenizer)
    data = encode_message(message(tokenizer, "b", 0))
    for _ in range(3):
        write(memory_url, data, sender="b", round=0)  # a publish retried twice
    write(memory_url, encode_message(message(tokenizer, "b", 0, prompt="again")), sender="b", round=0)
    result = a.collect(0)
    assert prompts(result, "b") == ["12+34="] * 4 + ["again"] * 4
    assert result.refused["duplicate"] == 2


# --------------------------------------------------------------------------------------------------------------------
# 4. Invented ids buy nothing; every round has a budget
# --------------------------------------------------------------------------------------------------------------------
def flood(tokenizer, url, count, *, round=0):
    for k in range(count):
        sender = f"fake-{k}"
        write(url, encode_message(message(tokenizer, sender, round), secret=SECRET), sender=sender, round=round)


@pytest.mark.parametrize("regulars", ["expected", "known"])
def test_a_thousand_invented_ids_do_not_crowd_out_the_honest_peers(tokenizer, memory_url, regulars):
    budget = RoundBudget(max_bytes=4 * 2**20, max_messages=200, max_rows=2000, newcomer_messages=32)
    options = {"expected_peers": ["b", "c"]} if regulars == "expected" else {}
    # a flood that hid b's or c's message would make the round wait the whole timeout, far past the hang guard
    a = make_swarm(memory_url, "a", tokenizer, secret=SECRET, budget=budget, peer_timeout=600.0, **options)
    b, c = (make_swarm(memory_url, peer, tokenizer, secret=SECRET) for peer in ("b", "c"))
    round = 0
    if regulars == "known":  # the honest peers were met in an earlier round, before the flood
        b.publish(rows("b", count=8), 0)
        c.publish(rows("c", count=8), 0)
        assert len(a.collect(0).rows) == 16
        round = 1
    flood(tokenizer, memory_url, 1000, round=round)  # each a valid message signed with the shared secret
    b.publish(rows("b", count=8, prompt="honest"), round)
    c.publish(rows("c", count=8, prompt="honest"), round)
    result = returns_within(lambda: a.collect(round), what="a round under a flood")
    assert prompts(result, "b") == ["honest"] * 8 and prompts(result, "c") == ["honest"] * 8
    assert result.regulars == {"b", "c"}
    # The flood cost the newcomers' one shared allowance, and the round stayed within its budget.
    assert len({row.sender for row in result.rows} - {"b", "c"}) <= budget.newcomer_messages
    assert result.messages_read <= budget.newcomer_messages + 2 and result.bytes_read <= budget.max_bytes
    assert len(result.rows) <= budget.max_rows
    assert result.refused["round_budget"] == 1000 - budget.newcomer_messages
    # Selection: the invented ids share one turn of the round-robin, so the honest rows are taken in full.
    chosen = select_rows(result.rows, 32, regulars=result.regulars)
    assert [row.prompt for row in chosen].count("honest") == 16
    assert len(select_rows(result.rows, 32)) == 32  # (without regulars every invented id has its own turn)
    assert [row.prompt for row in select_rows(result.rows, 32)].count("honest") < 16


def test_a_member_cannot_jump_the_queue_with_a_regular_peers_name_in_the_transport(tokenizer, memory_url):
    a = make_swarm(memory_url, "a", tokenizer, secret=SECRET, expected_peers=["b"], peer_timeout=1.0)
    stranger = encode_message(message(tokenizer, "stranger"), secret=SECRET)
    write(memory_url, stranger, sender="b", round=0)  # filed under b: served first, then refused
    result = a.collect(0)
    assert result.rows == [] and result.refused["sender_hint"] == 1 and result.missing == ["b"]


def test_the_round_drains_the_exchange_beyond_one_poll(tokenizer, memory_url):
    a = make_swarm(memory_url, "a", tokenizer, transport=MemoryTransport(memory_url, max_batch=2))
    for peer in "bcdefg":
        make_swarm(memory_url, peer, tokenizer).publish(rows(peer), 0)
    assert len(a.collect(0).rows) == 24  # three polls of two, no waiting


def test_a_round_budget_of_bytes_messages_rows_and_time(tokenizer, memory_url):
    for peer in "bcd":
        make_swarm(memory_url, peer, tokenizer).publish(rows(peer), 0)
    size = len(encode_message(message(tokenizer, "b", epoch=time.time_ns() // 1000)))  # as published: with an epoch
    budgets = {
        "bytes": RoundBudget(max_bytes=2 * size + 10),
        "messages": RoundBudget(max_messages=2),
        "rows": RoundBudget(max_rows=8),
        "sender": RoundBudget(messages_per_sender=1),
    }
    for name, budget in budgets.items():
        result = make_swarm(memory_url, f"a-{name}", tokenizer, budget=budget).collect(0)
        if name == "sender":
            assert len(result.rows) == 12, name
            continue
        assert len(result.rows) == 8 and result.refused["round_budget"] == 1, name
    assert len(make_swarm(memory_url, "a-rows", tokenizer).collect(0, max_rows=4).rows) == 4
    late = make_swarm(memory_url, "a-late", tokenizer, peer_timeout=0.0, budget=RoundBudget(max_seconds=0.0))
    result = late.collect(0)
    assert result.rows == [] and result.refused["round_budget"] == 3 and result.messages_read == 0
    with pytest.raises(ValueError, match="max_rows"):
        RoundBudget(max_rows=-1)


def test_an_endless_flood_costs_a_round_at_most_its_time_budget(tokenizer, memory_url):
    from trl_ftis.exchange.transports import Envelope

    class Endless(MemoryTransport):
        polls = 0

        def _poll(self):
            Endless.polls += 1
            return [Envelope(b"FTIS" + bytes(60), f"{self.polls}.{k}", f"x{k}", 0, 64) for k in range(100)]

    budget = RoundBudget(max_seconds=0.3)
    a = make_swarm(memory_url, "a", tokenizer, transport=Endless(memory_url), budget=budget)
    started = time.monotonic()
    result = returns_within(lambda: a.collect(0), what="a round under an endless flood")  # not drained for ever
    assert time.monotonic() - started >= 0.3 and Endless.polls > 1  # it read for its time budget (a lower bound)
    assert result.messages_read == budget.newcomer_messages  # the rest was dropped unread
    assert sum(result.refused.values()) == 100 * Endless.polls


def test_select_rows_gives_regulars_a_turn_each_and_everyone_else_one_shared_turn():
    pool = rows("b", count=2, group="b1") + rows("b", count=2, group="b2")
    for k in range(6):
        pool += rows(f"x{k}", count=2, group="x")
    chosen = select_rows(pool, 6, regulars={"b"})
    assert [(row.sender, row.group) for row in chosen[::2]] == [("b", "b1"), ("x0", "x"), ("b", "b2")]
    assert select_rows(pool, 6, regulars=set()) == select_rows(pool, 6)  # all newcomers: the old alternation
    assert select_rows(pool, None, regulars={"b"}) == pool


# --------------------------------------------------------------------------------------------------------------------
# 5. Staleness without wall clocks
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("offset", [-600.0, 600.0, -10 * 365 * 86400.0])
def test_a_peer_whose_clock_is_off_is_not_refused(tokenizer, memory_url, offset):
    """Was: a message `created` more than 5 minutes before the receiver started was refused as `stale`, so a peer whose
    clock lagged had every message refused. Now only rounds count."""
    a = make_swarm(memory_url, "a", tokenizer, secret=SECRET)
    data = encode_message(message(tokenizer, "b", 3, created=time.time() + offset), secret=SECRET)
    write(memory_url, data, sender="b", round=3)
    result = a.collect(3)
    assert prompts(result, "b") == ["12+34="] * 4 and not result.refused


def test_leftovers_of_an_earlier_run_in_a_reused_exchange(tokenizer, url):
    old = make_swarm(url, "b", tokenizer)  # an earlier run that reached round 40 (it pruned its older messages)
    for round in range(30, 41):
        old.publish(rows("b", prompt="old"), round)
    a = make_swarm(url, "a", tokenizer)
    result = a.collect(0)
    assert result.rows == [] and result.refused["ahead"] == 5 and result.messages_read == 0  # refused unread


# --------------------------------------------------------------------------------------------------------------------
# 5b. Catching up with a swarm that is ahead (late joiners, stalled or resumed peers)
# --------------------------------------------------------------------------------------------------------------------
def test_a_late_joiner_catches_up_once_a_live_peer_shows_it_is_ahead(tokenizer, url, caplog):
    live = make_swarm(url, "live", tokenizer, secret=SECRET)
    for round in range(47, 51):  # the swarm is at round 50
        live.publish(rows("live", prompt=f"r{round}"), round)
    joiner = make_swarm(url, "joiner", tokenizer, secret=SECRET)
    first = joiner.collect(0)  # the first sight of a far-ahead sender: refused unread, like leftovers
    assert first.rows == [] and first.refused["ahead"] == 4 and first.messages_read == 0
    live.publish(rows("live", prompt="r51"), 51)
    second = joiner.collect(1)  # read now, but one message shows no progress yet
    assert second.rows == [] and second.refused["ahead"] == 1 and joiner.round_offset == 0
    live.publish(rows("live", prompt="r52"), 52)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        third = joiner.collect(2)  # 52 after 51: a live peer 50 rounds ahead; the joiner moves to round 52
    assert prompts(third, "live") == ["r52"] * 4 and not third.refused
    assert joiner.round_offset == 50 and "moves to round 52" in caplog.text
    joiner.publish(rows("joiner", prompt="hello"), 3)  # its step 3 is swarm round 53
    assert prompts(live.collect(53), "joiner") == ["hello"] * 4


def test_leftovers_of_an_earlier_run_never_move_a_peer(tokenizer, url):
    old = make_swarm(url, "b", tokenizer, keep_rounds=100)
    for round in range(30, 41):
        old.publish(rows("b", prompt="old"), round)
    for expected in ([], ["b"]):  # with or without b among the expected peers
        a = make_swarm(url, f"a{len(expected)}", tokenizer, expected_peers=expected, peer_timeout=0.2)
        for step in range(4):
            result = a.collect(step)
            assert result.rows == [] and a.round_offset == 0


def test_the_median_regular_decides_so_one_member_cannot_move_a_peer_alone(tokenizer, memory_url):
    peers = ["a", "b", "mallory"]
    me = make_swarm(memory_url, "me", tokenizer, secret=SECRET, expected_peers=peers, peer_timeout=0.2)
    swarms = {peer: make_swarm(memory_url, peer, tokenizer, secret=SECRET) for peer in peers}
    for round in range(3):  # mallory races ahead; a and b are level with me
        far = encode_message(message(tokenizer, "mallory", 2**63 - 10 + round, prompt="far"), secret=SECRET)
        write(memory_url, far, sender="mallory", round=10**10 - 1)  # the largest round a transport files
        for peer in ("a", "b"):
            swarms[peer].publish(rows(peer), round)
        result = me.collect(round)
        assert me.round_offset == 0 and set(prompts(result, "a") + prompts(result, "b")) == {"12+34="}
        assert prompts(result, "mallory") == []
    for round in (40, 41, 42):  # a and b really are ahead (me was stalled): the median moves me
        for peer in ("a", "b"):
            swarms[peer].publish(rows(peer, prompt=f"r{round}"), round)
        me.collect(3 + round - 40)
    assert me.round_offset == 37  # at its step 3 it saw a and b at round 40, and moved there


def test_strangers_cannot_move_a_peer(tokenizer, memory_url):
    me = make_swarm(memory_url, "me", tokenizer, secret=SECRET)
    for round in range(100, 110):  # unsigned, ever newer, under a known name
        write(memory_url, encode_message(message(tokenizer, "b", round)), sender="b", round=round)
        me.collect(round - 100)
    assert me.round_offset == 0


def test_a_member_claiming_the_last_rounds_moves_a_lone_peer_at_most_to_round_1e9(tokenizer, memory_url):
    me = make_swarm(memory_url, "me", tokenizer, secret=SECRET)  # no expected peers, no keys: any member counts
    for step in range(3):
        data = encode_message(message(tokenizer, "member", 2**63 - 3 + step), secret=SECRET)
        write(memory_url, data, sender="member", round=10**10 - 1)
        me.collect(step)
    assert me.round_offset == 10**9 - 2
    assert me.publish(rows("me"), 3) > 0  # its rounds stay valid for every transport


def test_the_alignment_is_saved_with_the_swarm_state(tokenizer, memory_url):
    live = make_swarm(memory_url, "live", tokenizer)
    joiner = make_swarm(memory_url, "joiner", tokenizer)
    for step, round in enumerate((20, 21, 22)):
        live.publish(rows("live"), round)
        joiner.collect(step)
    assert joiner.round_offset == 20
    restarted = make_swarm(memory_url, "joiner", tokenizer)
    restarted.load_state_dict(joiner.state_dict())
    assert restarted.round_offset == 20 and restarted.epoch > joiner.epoch  # a new start: a newer epoch
    assert {**restarted.state_dict(), "epoch": joiner.epoch} == joiner.state_dict()


# --------------------------------------------------------------------------------------------------------------------
# 6. Per-peer keys
# --------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def keyring(tmp_path):
    """Key files of a, b and c (registered) and d (not registered)."""
    pairs = {peer: generate_keypair()[0] for peer in "abcd"}
    paths = {}
    for peer, key in pairs.items():
        paths[peer] = save_private_key(tmp_path / f"{peer}.key", key)
    public = save_public_keys(tmp_path / "peers.json", {peer: pairs[peer] for peer in "abc"})
    return paths, public


def forged_identity(tokenizer, signer_key, signer: str, sender: str) -> bytes:
    """Signed with `signer`'s own key, but naming `sender` in the header (the wire refuses it: `identity`)."""
    data = bytearray(encode_message(message(tokenizer, sender)))
    flags = int.from_bytes(data[6:8], "little") | layout.FLAG_ED25519 | layout.FLAG_SIGNED
    data[6:8] = flags.to_bytes(2, "little")
    data = bytes(data) + bytes([len(signer)]) + signer.encode()
    data += signer_key.sign(data)
    return data + hmac.new(SECRET.encode(), data, hashlib.sha256).digest()


def test_with_per_peer_keys_a_member_cannot_write_as_another(tokenizer, url, keyring):
    paths, public = keyring
    keys = {"secret": SECRET, "public_keys": str(public)}
    a = make_swarm(url, "a", tokenizer, private_key=str(paths["a"]), **keys)
    b = make_swarm(url, "b", tokenizer, private_key=paths["b"], **keys)
    b.publish(rows("b", prompt="genuine"), 0)
    # c holds the swarm secret and its own registered key, but not b's.
    make_swarm(url, "b", tokenizer, private_key=paths["c"], secret=SECRET).publish(rows("b", prompt="c as b"), 0)
    c_key = load_private_key(paths["c"])
    write(url, encode_message(message(tokenizer, "c"), secret=SECRET, private_key=c_key), sender="b", round=0)
    write(url, forged_identity(tokenizer, c_key, "c", "b"), sender="b", round=0)
    make_swarm(url, "b", tokenizer, secret=SECRET).publish(rows("b", prompt="unsigned"), 0)  # HMAC only
    make_swarm(url, "d", tokenizer, private_key=paths["d"], secret=SECRET).publish(rows("d"), 0)  # not registered
    result = a.collect(0)
    assert prompts(result, "b") == ["genuine"] * 4 and {row.sender for row in result.rows} == {"b"}
    assert result.refused == {"signature": 1, "sender_hint": 1, "identity": 1, "unsigned": 1, "unknown_peer": 1}
    assert result.regulars == {"b", "c"}
    # And b reads a's signed messages the same way.
    a.publish(rows("a", prompt="from a"), 0)
    assert prompts(b.collect(0), "a") == ["from a"] * 4


def test_a_private_key_without_the_public_keys_only_signs(tokenizer, memory_url, keyring):
    paths, public = keyring
    a = make_swarm(memory_url, "a", tokenizer, private_key=paths["a"])
    plain = make_swarm(memory_url, "plain", tokenizer)  # verifies nothing
    strict = make_swarm(memory_url, "strict", tokenizer, public_keys=load_public_keys(public))
    a.publish(rows("a"), 0)
    assert len(plain.collect(0).rows) == 4 and len(strict.collect(0).rows) == 4


def test_mismatched_keys_fail_when_the_swarm_is_built(tokenizer, memory_url, keyring):
    paths, public = keyring
    with pytest.raises(ValueError, match="another key for this peer .'a'. than its private key"):
        make_swarm(memory_url, "a", tokenizer, private_key=paths["b"], public_keys=public)
    with pytest.raises(ValueError, match="another key for this peer .'a'. than its private key"):
        make_swarm(memory_url, "a", tokenizer, private_key=paths["b"], public_keys=load_public_keys(public))
    with pytest.raises(TypeError):
        make_swarm(memory_url, "a", tokenizer, private_key=b"not a key")
    with pytest.raises(TypeError, match=r"public_keys\['b'\] must be an Ed25519"):
        make_swarm(memory_url, "a", tokenizer, public_keys={"b": b"not a key"})
    # A private key in the mapping stands for its public half.
    private_b = load_private_key(paths["b"])
    swarm = make_swarm(memory_url, "a2", tokenizer, public_keys={"b": private_b})
    assert public_key_text(swarm.public_keys["b"]) == public_key_text(private_b)
    assert not isinstance(swarm.public_keys["b"], type(private_b))
    with pytest.raises(ValueError, match="temperature"):
        make_swarm(memory_url, "a", tokenizer, temperature=MAX_TEMPERATURE * 2)


def test_keygen_round_trip(tokenizer, tmp_path, capsys, memory_url):
    keys_dir, peers = tmp_path / "keys", tmp_path / "peers.yaml"
    assert cli_main(["keygen", "a", "--dir", str(keys_dir), "--keys-file", str(peers)]) == 0
    assert cli_main(["keygen", "123", "--dir", str(keys_dir)]) == 0  # an id YAML would read as a number
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('"a": "') and out[1].startswith('"123": "')
    with open(peers, "a") as f:
        f.write(out[1] + "\n")  # what the printed line is for
    for peer in ("a", "123"):
        key_file = keys_dir / f"{peer}.key"
        assert os.stat(key_file).st_mode & 0o777 == 0o600
    registered = load_public_keys(peers)
    assert set(registered) == {"a", "123"}
    assert public_key_text(registered["a"]) == public_key_text(load_private_key(keys_dir / "a.key"))
    before = (keys_dir / "a.key").read_bytes()
    assert cli_main(["keygen", "a", "--dir", str(keys_dir)]) == 1  # never replaces a key
    assert cli_main(["keygen", "a", "--dir", str(tmp_path / "other"), "--keys-file", str(peers)]) == 1
    assert cli_main(["keygen", "../escape", "--dir", str(keys_dir)]) == 2
    assert (keys_dir / "a.key").read_bytes() == before and not (tmp_path / "other" / "a.key").exists()
    assert "refusing to replace" in capsys.readouterr().err
    as_json = tmp_path / "peers.json"
    assert cli_main(["keygen", "b", "--dir", str(keys_dir), "--keys-file", str(as_json)]) == 0
    assert set(load_public_keys(as_json)) == {"b"}
    # The files work end to end.
    registered_all = {**registered, **load_public_keys(as_json)}
    save_public_keys(tmp_path / "all.json", registered_all)
    options = {"public_keys": str(tmp_path / "all.json")}
    a = make_swarm(memory_url, "a", tokenizer, private_key=keys_dir / "a.key", **options)
    b = make_swarm(memory_url, "b", tokenizer, private_key=keys_dir / "b.key", **options)
    b.publish(rows("b"), 0)
    assert len(a.collect(0).rows) == 4


@pytest.mark.parametrize(
    "make_bad",
    [
        pytest.param(lambda d: d / "missing-dir" / "peers.yaml", id="in-a-missing-directory"),
        pytest.param(lambda d: (d / "peers.yaml").mkdir() or d / "peers.yaml", id="a-directory"),
        pytest.param(lambda d: (d / "peers.yaml").write_text("{x: 1\n") and d / "peers.yaml", id="malformed"),
        pytest.param(lambda d: (d / "peers.yaml").write_text('{"a": "k"}') and d / "peers.yaml", id="flow-mapping"),
    ],
)
def test_keygen_with_a_bad_keys_file_writes_nothing_and_a_retry_works(tmp_path, capsys, make_bad):
    """Check, then write: a keys file keygen cannot add to leaves no private key behind (which would refuse the
    retry) and the keys file as it was."""
    keys_dir = tmp_path / "keys"
    bad = make_bad(tmp_path)
    before = bad.read_bytes() if bad.is_file() else None
    assert cli_main(["keygen", "a", "--dir", str(keys_dir), "--keys-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--keys-file" in err and "Traceback" not in err
    assert not (keys_dir / "a.key").exists()
    assert (bad.read_bytes() if bad.is_file() else None) == before
    assert [p.name for p in tmp_path.rglob(".*keygen-*")] == []  # no staged file left
    good = tmp_path / "good.yaml"
    assert cli_main(["keygen", "a", "--dir", str(keys_dir), "--keys-file", str(good)]) == 0  # the retry
    assert set(load_public_keys(good)) == {"a"} and (keys_dir / "a.key").exists()


# --------------------------------------------------------------------------------------------------------------------
# 7. The config: new fields, key files, the temperature range
# --------------------------------------------------------------------------------------------------------------------
def test_the_config_holds_the_key_paths_and_swarm_credentials_checks_the_files(make_args, keyring, tmp_path, caplog):
    paths, public = keyring
    args = make_args(peer_id="a", private_key_file=str(paths["a"]), peer_keys_file=str(public))
    assert args.max_rounds_ahead == DEFAULT_MAX_ROUNDS_AHEAD == 4 and args.max_round_bytes == RoundBudget().max_bytes
    assert "private_key_file" not in args.redacted_fields()  # a path, not a secret
    credentials = args.swarm_credentials()
    assert public_key_text(credentials.private_key) == public_key_text(load_private_key(paths["a"]))
    assert set(credentials.public_keys) == set(load_public_keys(public))
    # Building the config reads no file: a wrong path fails when the credentials are read (the trainer, at start).
    missing = make_args(peer_id="a", private_key_file=str(tmp_path / "nowhere.key"))
    with pytest.raises(ValueError, match="nowhere.key"):
        missing.swarm_credentials()
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: not-base64!\n")
    with pytest.raises(ValueError, match="broken.yaml"):
        make_args(peer_id="a", peer_keys_file=str(broken)).swarm_credentials()
    # The config and the swarm refuse a mismatched pair with the one check (keys.check_key_pair).
    with pytest.raises(ValueError, match="another key for this peer .'a'. than its private key"):
        make_args(peer_id="a", private_key_file=str(paths["b"]), peer_keys_file=str(public)).swarm_credentials()
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        make_args(peer_id="d", private_key_file=str(paths["d"]), peer_keys_file=str(public)).swarm_credentials()
    assert "has no key for this peer ('d')" in caplog.text
    with pytest.raises(ValueError, match="max_rounds_ahead"):
        make_args(max_rounds_ahead=-1)


@pytest.mark.parametrize("temperature", [0.0, MIN_TEMPERATURE / 2, MAX_TEMPERATURE * 2, float("nan")])
def test_config_refuses_temperatures_the_wire_cannot_carry(make_args, temperature):
    with pytest.raises(ValueError, match="temperature must be in"):
        make_args(temperature=temperature)


def test_the_temperature_range_is_one_rule(make_args):
    assert (Limits().min_temperature, Limits().max_temperature) == (MIN_TEMPERATURE, MAX_TEMPERATURE)
    for temperature in (MIN_TEMPERATURE, MAX_TEMPERATURE):
        make_args(temperature=temperature)  # the edges are accepted by the config ...
        built = message_at(temperature)
        assert decode_message(encode_message(built)).temperature == temperature  # ... and by the wire


def message_at(temperature):
    from trl_ftis.exchange import Message, WireCompletion, WireGroup

    return Message(
        sender="t",
        round=0,
        tokenizer_fingerprint="0" * 64,
        tokenizer_name="tok",
        temperature=temperature,
        reward_names=[],
        groups=[WireGroup(prompt="p")],
        completions=[
            WireCompletion(
                group=0,
                completion_ids=np.array([1], dtype=np.int32),
                generator_logps=np.array([-0.5], dtype=np.float32),
                reward=0.0,
                rewards_per_func=np.zeros(0, dtype=np.float32),
            )
        ],
    )


def test_the_trainer_bounds_each_message_by_its_own_settings(tokenizer, make_args, memory_url):
    from trl_ftis import FTISTrainer
    from trl_ftis.demo.tiny import build_tiny_llama
    from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

    def trainer(**overrides):
        args = make_args(exchange_url=memory_url, peer_id="me", max_completion_length=6, **overrides)
        model = build_tiny_llama(tokenizer, seed=0)
        dataset = addition_dataset(32, seed=1)
        return FTISTrainer(model, digit_match_reward, args=args, train_dataset=dataset, processing_class=tokenizer)

    me = trainer(max_peer_message_rows=32)
    limits = me.swarm.limits
    assert (limits.max_completions, limits.max_completion_tokens) == (32, 24)
    assert limits.max_message_bytes < Limits().max_message_bytes
    assert me.swarm.transport.max_message_bytes == limits.max_message_bytes  # larger ones are refused unread
    sender = make_swarm(memory_url, "big", tokenizer)
    sender.publish(rows("big", count=33), 0)  # one row more than the receiver takes from one message
    long = rows("big", count=2, group="long")
    for row in long:
        row.completion_ids, row.generator_logps = [8] * 25, [-0.1] * 25  # over 4 x max_completion_length
    sender.publish(long, 0)
    ok = rows("big", count=4, group="ok")
    ok[0].completion_ids, ok[0].generator_logps = [8] * 24, [-0.1] * 24  # longer than 6 but within the wire's 24
    sender.publish(ok, 0)
    result = me.swarm.collect(0)
    assert result.refused["limits"] == 2 and len(result.rows) == 4
    assert trainer(max_peer_message_rows=4).swarm.limits.max_completions == 16  # never below its own 16 rows
    with pytest.raises(ValueError, match="max_peer_message_rows"):
        make_args(max_peer_message_rows=0)


def test_a_failed_prune_is_not_a_failed_publish(tokenizer, memory_url, monkeypatch, caplog):
    a, observer = make_swarm(memory_url, "a", tokenizer), make_swarm(memory_url, "observer", tokenizer)

    def refuse(**kwargs):
        raise PermissionError("NOPERM this user has no permissions to run the 'xdel' command")

    monkeypatch.setattr(a.transport, "prune", refuse)
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        assert a.publish(rows("a"), 0) > 0 and a.publish(rows("a"), 1) > 0
    assert not a.unpublished and len(observer.collect(0).rows) == 8
    assert caplog.text.count("Could not remove this peer's old messages") == 1
