"""Messages bound to their swarm and run (issue 23): a signed message names both, and a peer bound to them refuses any
other, so replays of an earlier, longer run, and its leftovers in a reused exchange, neither train nor move a peer's
round. Each attack as the review of issue 23 ran it, first against an unbound peer where it still applies."""

import json
import logging
import time

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path
from swarm_helpers import publish_raw as write
from swarm_helpers import wire_message as message

from trl_ftis import FTISConfig
from trl_ftis.credentials import SwarmCredentials
from trl_ftis.exchange import (
    ExchangeError,
    decode_message,
    encode_message,
    generate_keypair,
    peek_header,
)
from trl_ftis.message_trust import MAX_BINDING_CHARS
from trl_ftis.shared_names import SWARM_NAME_ENV, SWARM_RUN_ENV
from trl_ftis.swarm.exchange_modes.sync_window import EVIDENCE_CLOCK_SLACK

SECRET = "members-only"


# --------------------------------------------------------------------------------------------------------------------
# The wire: `swarm` and `run` are optional header keys inside what is signed
# --------------------------------------------------------------------------------------------------------------------
def test_a_bound_message_round_trips_and_a_receiver_bound_elsewhere_refuses_it(tokenizer):
    data = encode_message(message(tokenizer, "b", swarm="gsm8k", run="run-2"), secret=SECRET)
    decoded = decode_message(data, secret=SECRET, swarm="gsm8k", run="run-2")
    assert (decoded.swarm, decoded.run) == ("gsm8k", "run-2")
    assert decode_message(data, secret=SECRET).run == "run-2"  # an unbound receiver takes any
    header = peek_header(data, secret=SECRET, swarm="gsm8k", run="run-2")
    assert (header["swarm"], header["run"]) == ("gsm8k", "run-2")
    for kwargs, reason, text in (
        ({"swarm": "other"}, "swarm", "names swarm 'gsm8k', and this peer is bound to swarm 'other'"),
        ({"run": "run-1"}, "run", "names run 'run-2', and this peer is bound to run 'run-1'"),
    ):
        with pytest.raises(ExchangeError) as caught:
            decode_message(data, secret=SECRET, **kwargs)
        assert caught.value.reason == reason and text in str(caught.value)
    unbound = encode_message(message(tokenizer, "b"), secret=SECRET)
    for kwargs, reason in (({"swarm": "gsm8k"}, "swarm"), ({"run": "run-2"}, "run")):
        with pytest.raises(ExchangeError, match=f"names no {reason}") as caught:
            decode_message(unbound, secret=SECRET, **kwargs)
        assert caught.value.reason == reason


def test_the_binding_is_checked_before_the_body_is_read(tokenizer):
    data = bytearray(encode_message(message(tokenizer, "b", run="run-1"), compact=True))  # a compressed body
    data[-8:] = b"\xff" * 8  # corrupt it
    with pytest.raises(ExchangeError) as caught:
        decode_message(bytes(data), run="run-2")
    assert caught.value.reason == "run"
    with pytest.raises(ExchangeError) as caught:
        decode_message(bytes(data), run="run-1")
    assert caught.value.reason != "run"  # the same run: the body is read, and found corrupt


def test_a_signed_binding_cannot_be_changed_by_a_replayer(tokenizer):
    data = encode_message(message(tokenizer, "b", run="run-1"), secret=SECRET)
    forged = data.replace(b'"run":"run-1"', b'"run":"run-2"')
    assert forged != data
    with pytest.raises(ExchangeError) as caught:
        decode_message(forged, secret=SECRET, run="run-2")
    assert caught.value.reason == "signature"


@pytest.mark.parametrize("value", ["", "a\nb", 7, None, ["r"]])
def test_a_malformed_binding_is_a_header_refusal(tokenizer, value):
    data = encode_message(message(tokenizer, "b", run="PLACEHOLDER"))
    patched = json.dumps(value).encode().ljust(len(b'"PLACEHOLDER"'))  # JSON allows the padding spaces
    with pytest.raises(ExchangeError) as caught:
        decode_message(data.replace(b'"PLACEHOLDER"', patched))
    assert caught.value.reason == "header"


@pytest.mark.parametrize("value", ["x" * (MAX_BINDING_CHARS + 1), "a\nb", 7])
def test_the_encoder_refuses_a_binding_a_receiver_would_refuse(tokenizer, value):
    with pytest.raises(ExchangeError) as caught:
        encode_message(message(tokenizer, "b", swarm=value))
    assert caught.value.reason == "header"


# --------------------------------------------------------------------------------------------------------------------
# Replays of an earlier, longer run
# --------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def keyed(tmp_path):
    """Ed25519 keys of `me` and `b`, as objects."""
    pairs = {peer: generate_keypair()[0] for peer in ("me", "b")}
    return pairs, {peer: key.public_key() for peer, key in pairs.items()}


def replay_two_rounds(tokenizer, url, me, key, *, run, created):
    """A stranger replays b's signed messages of rounds 500, 501 and 502 of an earlier run, one a poll (as recorded:
    every signature valid); `me` collects its rounds 0, 1, 2 in between."""
    for step, round in enumerate((500, 501, 502)):
        old = message(tokenizer, "b", round, run=run, created=created, prompt="old")
        write(url, encode_message(old, secret=SECRET, private_key=key), sender="b", round=round)
        me.collect(step)


def test_replayed_rounds_of_an_earlier_run_move_an_unbound_peer_that_started_before_them(tokenizer, memory_url, keyed):
    """The attack of the review: even with a secret and per-peer keys, replayed consecutive rounds of an earlier run
    move a peer 500 rounds ahead, where it accepts no live rows, when nothing binds messages to a run and the replayed
    messages are recent enough to pass for this run's."""
    private, public = keyed
    me = make_swarm(memory_url, "me", tokenizer, secret=SECRET, private_key=private["me"], public_keys=public)
    replay_two_rounds(tokenizer, memory_url, me, private["b"], run="", created=time.time())
    assert me.round_offset > 400


def test_a_peer_bound_to_its_run_refuses_replays_of_an_earlier_one(tokenizer, memory_url, keyed):
    private, public = keyed
    me = make_swarm(
        memory_url, "me", tokenizer, secret=SECRET, private_key=private["me"], public_keys=public, run_id="run-2"
    )
    replay_two_rounds(tokenizer, memory_url, me, private["b"], run="run-1", created=time.time())
    assert me.round_offset == 0
    b = make_swarm(
        memory_url, "b", tokenizer, secret=SECRET, private_key=private["b"], public_keys=public, run_id="run-2"
    )
    b.publish(rows("b", prompt="live"), 3)
    result = me.collect(3)
    assert [row.prompt for row in result.rows] == ["live"] * 4 and not result.refused


def test_without_a_run_id_old_messages_are_no_catch_up_evidence(tokenizer, memory_url, keyed):
    """Unbound, replayed messages stamped before this peer started (an earlier run's) still move nothing."""
    private, public = keyed
    me = make_swarm(memory_url, "me", tokenizer, secret=SECRET, private_key=private["me"], public_keys=public)
    replay_two_rounds(tokenizer, memory_url, me, private["b"], run="", created=time.time() - 10 * EVIDENCE_CLOCK_SLACK)
    assert me.round_offset == 0


# --------------------------------------------------------------------------------------------------------------------
# Leftovers of a longer earlier run in a reused exchange
# --------------------------------------------------------------------------------------------------------------------
def leftovers_then_live(tokenizer, url, me, *, run, created, epoch=0):
    """b's leftovers of an earlier run (rounds 495-500, sent in start `epoch`: 0, a version before epochs) sit in the
    exchange; this run's b is at rounds 20, 21, 22... while `me` (expecting b) starts at round 0. Returns me's round
    after five collects."""
    for round in range(495, 501):
        old = message(tokenizer, "b", round, run=run, created=created, prompt="old", epoch=epoch)
        write(url, encode_message(old, secret=SECRET), sender="b", round=round)
    live = make_swarm(url, "b", tokenizer, secret=SECRET, run_id=me.run_id, keep_rounds=100)
    for step in range(5):
        live.publish(rows("b", prompt=f"r{20 + step}"), 20 + step)
        me.collect(step)
    return me.round_offset


@pytest.mark.parametrize("epoch", [0, 1_700_000_000_000_000], ids=["no-epoch", "earlier-start"])
def test_recent_leftovers_of_a_longer_run_no_longer_freeze_an_unbound_peer(tokenizer, url, epoch):
    """The freeze of the review: b's newest round (500, a recent leftover) hid its live lead, so `me` never caught up.
    Every message names its sender's start (epoch): the live b's start is newer than the leftovers', so its rounds
    replace theirs and its lead counts."""
    me = make_swarm(url, "me", tokenizer, secret=SECRET, expected_peers=["b"], peer_timeout=0.05)
    assert leftovers_then_live(tokenizer, url, me, run="", created=time.time(), epoch=epoch) > 15


def test_a_bound_peer_behind_the_swarm_catches_up_past_leftovers_of_a_longer_run(tokenizer, url):
    me = make_swarm(url, "me", tokenizer, secret=SECRET, expected_peers=["b"], peer_timeout=0.05, run_id="run-2")
    assert leftovers_then_live(tokenizer, url, me, run="run-1", created=time.time()) > 15


def test_an_unbound_peer_catches_up_past_old_leftovers(tokenizer, url):
    me = make_swarm(url, "me", tokenizer, secret=SECRET, expected_peers=["b"], peer_timeout=0.05)
    old = time.time() - 10 * EVIDENCE_CLOCK_SLACK
    assert leftovers_then_live(tokenizer, url, me, run="", created=old) > 15


# --------------------------------------------------------------------------------------------------------------------
# Swarm names, checkpoints, the config
# --------------------------------------------------------------------------------------------------------------------
def test_a_peer_bound_to_a_swarm_refuses_another_swarms_messages(tokenizer, memory_url):
    me = make_swarm(memory_url, "me", tokenizer, secret=SECRET, swarm_name="gsm8k")
    other = make_swarm(memory_url, "b", tokenizer, secret=SECRET, swarm_name="math500")
    same = make_swarm(memory_url, "c", tokenizer, secret=SECRET, swarm_name="gsm8k")
    other.publish(rows("b"), 0)
    same.publish(rows("c"), 0)
    result = me.collect(0)
    assert {row.sender for row in result.rows} == {"c"} and result.refused["swarm"] == 1
    assert me.leave()
    later = same.collect(1)  # me's leaving message is of its swarm; b's message is not
    assert "me" in same.departed and later.refused["swarm"] == 1


def test_resuming_in_another_run_forgets_what_senders_showed_in_the_earlier_one(tokenizer, memory_url, caplog):
    first = make_swarm(memory_url, "me", tokenizer, run_id="run-1")
    live = make_swarm(memory_url, "b", tokenizer, run_id="run-1")
    for step, round in enumerate((20, 21, 22)):
        live.publish(rows("b"), round)
        first.collect(step)
    state = first.state_dict()
    assert state["run"] == "run-1" and state["window"]["state"]["newest"] == {"b": 22} and first.round_offset == 20
    same_run = make_swarm(memory_url, "me", tokenizer, run_id="run-1")
    same_run.load_state_dict(state)
    assert {**same_run.state_dict(), "epoch": state["epoch"]} == state and same_run.epoch > state["epoch"]
    with caplog.at_level(logging.INFO, logger="trl_ftis.swarm.swarm_state"):
        next_run = make_swarm(memory_url, "me", tokenizer, run_id="run-2")
        next_run.load_state_dict(state)
    resumed = next_run.state_dict()
    assert resumed["window"]["state"]["newest"] == {} and resumed["delivered"] == {} and resumed["round_offset"] == 20
    assert "the other peers' rounds are not carried over" in caplog.text
    for bad in (5, "", "x" * 10_000_000, "run\n2"):  # checkpoints are shared: the run is checked like any binding
        with pytest.raises(ValueError, match="'run' is malformed"):
            same_run.load_state_dict({**state, "run": bad})


def test_the_config_reads_the_binding_from_its_fields_or_the_environment(monkeypatch):
    monkeypatch.delenv(SWARM_NAME_ENV, raising=False)
    monkeypatch.delenv(SWARM_RUN_ENV, raising=False)
    assert FTISConfig(output_dir="o", use_cpu=True, bf16=False, report_to=[]).swarm_credentials()[3:] == (None, None)
    monkeypatch.setenv(SWARM_NAME_ENV, "gsm8k")
    monkeypatch.setenv(SWARM_RUN_ENV, "20261203-abc")
    credentials = FTISConfig(output_dir="o", use_cpu=True, bf16=False, report_to=[]).swarm_credentials()
    assert (credentials.swarm_name, credentials.run_id) == ("gsm8k", "20261203-abc")
    assert "bound to swarm 'gsm8k' and run '20261203-abc'" in credentials.describe()
    given = FTISConfig(
        output_dir="o", use_cpu=True, bf16=False, report_to=[], swarm_name="mine", swarm_run="r1"
    ).swarm_credentials()
    assert (given.swarm_name, given.run_id) == ("mine", "r1")  # the fields win
    monkeypatch.setenv(SWARM_RUN_ENV, "bad\nrun")
    with pytest.raises(ValueError, match=r"swarm_run \(from \$FTIS_SWARM_RUN\) must be 1 to 128 printable"):
        FTISConfig(output_dir="o", use_cpu=True, bf16=False, report_to=[]).swarm_credentials()
    with pytest.raises(ValueError, match="swarm_name must be 1 to 128 printable"):
        FTISConfig(output_dir="o", use_cpu=True, bf16=False, report_to=[], swarm_name="x" * 200)
    assert SwarmCredentials(None, None, None).swarm_name is None


def test_a_peer_that_joins_a_swarm_without_a_run_id_refuses_to_start(monkeypatch):
    """Peers started by hand are bound by default: one with an exchange and no run id at all (neither `swarm_run` nor
    `FTIS_SWARM_RUN`) stops with one message naming both; an empty one is unbound on purpose."""
    monkeypatch.delenv(SWARM_RUN_ENV, raising=False)

    def credentials(**fields):
        return FTISConfig(output_dir="o", use_cpu=True, bf16=False, report_to=[], **fields).swarm_credentials()

    with pytest.raises(ValueError) as caught:
        credentials(exchange_url="dir:///tmp/x")
    assert "swarm_run" in str(caught.value) and "$FTIS_SWARM_RUN" in str(caught.value)
    assert credentials(exchange_url="dir:///tmp/x", swarm_run="run-1").run_id == "run-1"
    assert credentials(exchange_url="dir:///tmp/x", swarm_run="").run_id is None  # unbound, on purpose
    assert credentials().run_id is None  # alone: nothing to bind
    monkeypatch.setenv(SWARM_RUN_ENV, "")
    assert credentials(exchange_url="dir:///tmp/x").run_id is None
    monkeypatch.setenv(SWARM_RUN_ENV, "run-2")
    assert credentials(exchange_url="dir:///tmp/x").run_id == "run-2"
    assert credentials(exchange_url="dir:///tmp/x", swarm_run="").run_id is None  # the field wins, even empty


def test_an_empty_swarm_run_flag_is_unbound_on_purpose(tmp_path):
    """Through a script's flags (HfArgumentParser), `--swarm_run ''` stays empty: unbound on purpose."""
    from transformers import HfArgumentParser

    argv = ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none", "--exchange_url", "dir:///tmp/x"]
    (config,) = HfArgumentParser(FTISConfig).parse_args_into_dataclasses(argv + ["--swarm_run", ""])
    assert config.swarm_run == "" and config.swarm_credentials().run_id is None
