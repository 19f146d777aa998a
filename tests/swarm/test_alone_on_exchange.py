"""Peers that never meet because they name different exchanges: the exchange folder a peer creates is said, and a
peer that has accepted nothing from anyone after a few rounds says so, naming its exchange (password redacted)."""

import logging

from swarm_helpers import make_swarm, rows  # tests/ is on sys.path

from trl_ftis.exchange.transports import open_transport
from trl_ftis.swarm.client import LONELY_COLLECTS


def test_a_peer_alone_on_its_exchange_says_so_once_naming_it(tokenizer, tmp_path, caplog):
    url = f"dir://{tmp_path / 'mine'}"
    alone = make_swarm(url, "a", tokenizer, peer_timeout=0.0)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        for round in range(LONELY_COLLECTS + 3):
            alone.collect(round)
    said = [
        record.getMessage()
        for record in caplog.records
        if "accepted no message from any other peer" in record.getMessage()
    ]
    assert len(said) == 1 and str(tmp_path / "mine") in said[0] and "same exchange_url" in said[0]


def test_a_peer_that_met_another_says_nothing(tokenizer, tmp_path, caplog):
    url = f"dir://{tmp_path / 'shared'}"
    a, b = make_swarm(url, "a", tokenizer, peer_timeout=0.0), make_swarm(url, "b", tokenizer, peer_timeout=0.0)
    b.publish(rows("b"), 0)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        for round in range(LONELY_COLLECTS + 1):
            a.collect(round)
    assert "accepted no message from any other peer" not in caplog.text


def test_an_exchange_folder_that_did_not_exist_is_said_to_be_created(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trl_ftis.exchange.transports.directory"):
        with open_transport(f"dir://{tmp_path / 'new'}") as created:
            assert created.created
        with open_transport(f"dir://{tmp_path / 'new'}") as existing:
            assert not existing.created
    said = [
        record.getMessage() for record in caplog.records if "Created the exchange directory" in record.getMessage()
    ]
    assert len(said) == 1 and str(tmp_path / "new") in said[0]


def test_a_peer_without_credentials_says_it_receives_signed_messages_it_cannot_check(tokenizer, tmp_path, caplog):
    from swarm_helpers import wire_message

    from trl_ftis.exchange import encode_message, is_signed

    url = f"dir://{tmp_path / 'x'}"
    signed = make_swarm(url, "locked", tokenizer, secret="only-mine")
    receiver = make_swarm(url, "open", tokenizer, peer_timeout=0.0)
    signed.publish(rows("locked"), 0)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        for round in range(3):
            receiver.collect(round)
    said = [
        r.getMessage()
        for r in caplog.records
        if "signed messages from 'locked' that this peer cannot check" in r.getMessage()
    ]
    assert len(said) == 1 and "same credentials" in said[0]
    assert is_signed(encode_message(wire_message(tokenizer, "a"), secret="s"))
    assert not is_signed(encode_message(wire_message(tokenizer, "a"))) and not is_signed(b"FTIS")


def test_a_peer_that_refuses_another_for_its_credentials_says_what_to_change(tokenizer, tmp_path, caplog):
    url = f"dir://{tmp_path / 'x'}"
    make_swarm(url, "open", tokenizer).publish(rows("open"), 0)
    locked = make_swarm(url, "locked", tokenizer, secret="only-mine", peer_timeout=0.0)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        result = locked.collect(0)
    assert result.refused["unsigned"] == 1
    said = [r.getMessage() for r in caplog.records if "Refused a message sent as 'open'" in r.getMessage()]
    assert len(said) == 1 and "give every peer the same swarm_secret" in said[0]


def test_a_refusal_for_credentials_is_said_while_the_round_still_waits_for_that_peer(tokenizer, tmp_path, caplog):
    # The expected peer's messages are refused, so the round waits its full peer_timeout for it: the reason is said
    # when the first message is refused, not when the wait ends.
    import threading
    import time

    url = f"dir://{tmp_path / 'x'}"
    make_swarm(url, "open", tokenizer).publish(rows("open"), 0)
    locked = make_swarm(url, "locked", tokenizer, secret="only-mine", peer_timeout=600.0, expected_peers=["open"])
    results = []
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        waiting = threading.Thread(target=lambda: results.append(locked.collect(0)), daemon=True)
        waiting.start()
        deadline = time.monotonic() + 120
        while "Refused a message sent as 'open'" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        said_while_waiting = waiting.is_alive() and "give every peer the same swarm_secret" in caplog.text
        locked.interrupt()  # stop the wait (as a stopping trainer does)
        waiting.join(timeout=60)
    assert said_while_waiting
    assert not waiting.is_alive() and results[0].refused["unsigned"] == 1


def test_a_peer_far_ahead_is_said_in_plain_words(tokenizer, tmp_path, caplog):
    url = f"dir://{tmp_path / 'x'}"
    make_swarm(url, "b", tokenizer, keep_rounds=100).publish(rows("b"), 40)
    me = make_swarm(url, "me", tokenizer, peer_timeout=0.0, expected_peers=["b"])
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        result = me.collect(0)
    assert result.refused["ahead"] == 1
    assert (
        "'b' is ahead of this peer (its round 40, ours 0; max_rounds_ahead=4): its rows are not used until one "
        in (caplog.text)
    )
