"""Peers that leave say so: a signed, final message, after which the others stop waiting for them at once (and wait
again once they send a later round)."""

import dataclasses
import time
import uuid

import pytest
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path
from waits import returns_within

from trl_ftis.exchange import Message, decode_message, encode_message


@pytest.fixture
def url():
    return f"memory://leaving-{uuid.uuid4().hex}"


def _final(sender, round, **fields):
    return Message(
        sender=sender,
        round=round,
        tokenizer_fingerprint="0" * 64,
        tokenizer_name="t",
        temperature=1.0,
        reward_names=[],
        groups=[],
        completions=[],
        final=True,
        **fields,
    )


def test_the_final_flag_travels_signed_and_only_as_true():
    data = encode_message(_final("a", 3), secret="s")
    back = decode_message(data, secret="s")
    assert back.final is True and back.completions == [] and back.round == 3
    assert decode_message(encode_message(dataclasses.replace(_final("a", 3), final=False))).final is False
    with pytest.raises(ValueError, match="signature"):
        decode_message(data, secret="another")


def test_a_final_flag_other_than_true_is_refused():
    import json

    from trl_ftis.exchange.checks import check_header
    from trl_ftis.exchange.errors import ExchangeError
    from trl_ftis.exchange.limits import Limits

    header = {
        "sender": "a", "round": 1, "created": 1.0, "tokenizer_fingerprint": "0" * 64, "tokenizer_name": "t",
        "temperature": 1.0, "reward_names": [], "groups": [], "counts": {"completions": 0, "tokens": 0},
        "dtypes": {"ids": "<i4", "logps": "<f4"},
    }  # fmt: skip
    assert check_header(json.loads(json.dumps(header)), False, Limits()).final is False
    assert check_header({**header, "final": True}, False, Limits()).final is True
    for bad in (False, 1, "yes", None):
        with pytest.raises(ExchangeError, match="final must be true") as caught:
            check_header({**header, "final": bad}, False, Limits())
        assert caught.value.reason == "header"


def test_a_peer_that_left_is_not_waited_for(tokenizer, url):
    # waiting for c would cost the whole timeout, far past the hang guard
    a = make_swarm(url, "a", tokenizer, expected_peers=["b", "c"], peer_timeout=600.0, secret="s")
    b = make_swarm(url, "b", tokenizer, secret="s")
    c = make_swarm(url, "c", tokenizer, secret="s")
    for peer in (b, c):
        peer.publish(rows(peer.peer_id), 0)
    assert a.collect(0).missing == []
    b.publish(rows("b"), 1)
    assert c.leave() is True  # c ends after round 0: its final message is of round 1
    result = returns_within(lambda: a.collect(1), what="a round after c announced leaving (not waited for)")
    assert result.missing == [] and {r.sender for r in result.rows} == {"b"}
    assert a.departed == {"c": 1}
    b.publish(rows("b"), 2)
    assert returns_within(lambda: a.collect(2), what="the round after").missing == []


def test_when_everyone_else_left_a_round_does_not_wait_at_all(tokenizer, url):
    a = make_swarm(url, "a", tokenizer, num_expected_peers=2, peer_timeout=600.0)  # far past the hang guard
    for name in ("b", "c"):
        peer = make_swarm(url, name, tokenizer)
        peer.publish(rows(name), 0)
        peer.leave()
    assert len(a.collect(0).rows) == 8
    result = returns_within(lambda: a.collect(1), what="a round with everyone else gone")
    assert result.missing == [] and sorted(a.departed) == ["b", "c"]


def test_a_peer_that_comes_back_with_a_later_round_is_waited_for_again(tokenizer, url):
    a = make_swarm(url, "a", tokenizer, expected_peers=["b"], peer_timeout=1.0)
    b = make_swarm(url, "b", tokenizer)
    b.publish(rows("b"), 0)
    b.leave()  # round 1
    a.collect(0)
    assert "b" in a.departed
    b.publish(rows("b"), 1)  # not a later round than its final message: still departed
    a.collect(1)
    assert "b" in a.departed
    b.publish(rows("b"), 2)  # restarted and further on: back
    a.collect(2)
    assert a.departed == {}
    started = time.monotonic()
    assert a.collect(3).missing == ["b"] and time.monotonic() - started >= 0.9  # waited for again


def test_only_a_verified_final_message_counts(tokenizer, url):
    """A stranger without the secret cannot make a peer stop waiting for an expected one, and a final message
    from a peer no one expects is not recorded."""
    a = make_swarm(url, "a", tokenizer, expected_peers=["b"], peer_timeout=1.0, secret="s")
    make_swarm(url, "b", tokenizer, secret="wrong").leave()
    make_swarm(url, "x", tokenizer, secret="s").leave()
    started = time.monotonic()
    result = a.collect(0)
    assert time.monotonic() - started >= 0.9 and result.missing == ["b"]
    assert result.refused["signature"] == 1 and a.departed == {}


def test_departures_survive_a_checkpoint(tokenizer, url):
    a = make_swarm(url, "a", tokenizer, expected_peers=["b"], peer_timeout=1.0)
    make_swarm(url, "b", tokenizer).leave()
    a.collect(0)
    # waiting for b after the restore would cost the whole timeout, far past the hang guard
    restored = make_swarm(url, "a", tokenizer, expected_peers=["b"], peer_timeout=600.0)
    restored.load_state_dict(a.state_dict())
    assert restored.departed == {"b": 0}
    assert returns_within(lambda: restored.collect(1), what="a restored round (b departed)").missing == []
    with pytest.raises(ValueError, match="departed"):
        restored.load_state_dict({**a.state_dict(), "departed": {"b": "soon"}})


def test_leave_never_raises(tokenizer, url):
    b = make_swarm(url, "b", tokenizer)
    b.close()
    assert b.leave() is False

    class Broken:
        def publish(self, *args, **kwargs):
            raise OSError("disk full")

        def close(self):
            pass

    c = make_swarm(url, "c", tokenizer, transport=Broken())
    assert c.leave() is False


@pytest.mark.redis
def test_leaving_while_the_redis_server_is_down_takes_about_a_second(tmp_path, tokenizer):
    """`train()` announces leaving in its `finally` block, so with a Redis server that is down Ctrl-C used to wait for
    the transport's whole `connect_timeout` (10 s, measured) before the run ended; the announcement now retries for
    `LEAVE_PATIENCE` (1 s) at most, and ordinary publishes keep their retries."""
    from redis_server import RedisServerUnavailable, start_redis_server

    from trl_ftis.swarm.client import LEAVE_PATIENCE

    try:
        server_url, stop = start_redis_server(tmp_path)
    except RedisServerUnavailable as error:
        pytest.skip(f"redis-server could not be started: {error}")
    swarm = make_swarm(server_url, "a", tokenizer)
    try:
        assert swarm.publish(rows("a"), 0) > 0
        stop()
        # the announcement retries for LEAVE_PATIENCE at most: one that retried for the transport's connect_timeout
        # would now take 600 s, far past the hang guard
        connect_timeout, swarm.transport.connect_timeout = swarm.transport.connect_timeout, 600.0
        assert LEAVE_PATIENCE < 600.0
        assert returns_within(swarm.leave, what="leaving while Redis is down") is False
        swarm.transport.connect_timeout = connect_timeout
        assert swarm.publish(rows("a"), 1) == 0  # an ordinary publish: the outage is known, two quick attempts
        assert swarm.unpublished["TransportError"] == 4
    finally:
        stop()
        swarm.close()
