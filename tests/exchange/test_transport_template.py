"""`Transport` is a template method: its public methods run every shared check once, then call the transport's hook.

A new transport that implements only the hooks gets every check (a fake one below, which checks nothing itself), each
real transport (memory://, dir://, redis://) refuses invalid and oversize messages in the base class before its hook
runs, and a transport can neither skip a hook nor override a checked method.
"""

from __future__ import annotations

import math
import os
import sys

import pytest

from trl_ftis.exchange.transports import Envelope, Transport, TransportError
from trl_ftis.exchange.transports import base as base_module

try:  # tests/exchange is on sys.path in pytest's default (prepend) import mode
    from test_transports import make_transport  # noqa: F401 - the fixture: memory, dir and redis transports
    from test_transports import redis_url  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_transports import make_transport  # noqa: F401
    from test_transports import redis_url  # noqa: F401


class Recording(Transport):
    """A fourth transport that implements the hooks and nothing else: it checks nothing itself."""

    def __init__(self, max_message_bytes: int = 64, max_batch: int = 10, max_poll_bytes: int | None = None):
        self.url = "recording://test"
        self._set_bounds(max_message_bytes=max_message_bytes, max_batch=max_batch, max_poll_bytes=max_poll_bytes)
        self.calls: list[tuple] = []

    def _publish(self, data, *, sender, round):
        self.calls.append(("publish", data, sender, round))

    def _poll(self):
        sent = [call for call in self.calls if call[0] == "publish"]
        self.calls.append(("poll",))
        return [self._received(data, str(i), sender, round) for i, (_, data, sender, round) in enumerate(sent)]

    def _wait(self, timeout):
        self.calls.append(("wait", timeout))
        return False

    def _prune(self, *, sender, cutoff):
        self.calls.append(("prune", sender, cutoff))


INVALID_PUBLISHES = [
    # (data, sender, round, the exception the base raises, a phrase of its message)
    (b"x" * 65, "peer-a", 0, ValueError, "exceeds max_message_bytes=64"),
    ("text", "peer-a", 0, TypeError, "must be bytes"),
    (None, "peer-a", 0, TypeError, "must be bytes"),
    (b"ok", "../escape", 0, ValueError, "sender"),
    (b"ok", "", 0, ValueError, "sender"),
    (b"ok", 7, 0, ValueError, "sender"),
    (b"ok", "peer-a", -1, ValueError, "round must be an integer in"),
    (b"ok", "peer-a", 10**10, ValueError, "round must be an integer in"),
    (b"ok", "peer-a", 1.5, ValueError, "round must be an integer"),
    (b"ok", "peer-a", "3", ValueError, "round must be an integer"),
    (b"ok", "peer-a", True, ValueError, "round must be an integer in"),
]


@pytest.mark.parametrize("data, sender, round, error, phrase", INVALID_PUBLISHES)
def test_the_base_refuses_what_a_new_transport_does_not_check(data, sender, round, error, phrase):
    transport = Recording()
    with pytest.raises(error, match=phrase):
        transport.publish(data, sender=sender, round=round)
    assert transport.calls == []  # the hook never saw it


def test_the_hooks_get_checked_values():
    import numpy as np

    transport = Recording()
    transport.publish(bytearray(b"x" * 64), sender="peer-a", round=np.int64(3))  # at the limit: accepted
    transport.publish(memoryview(b"abc"), sender="b", round=base_module.MAX_ROUND)
    (_, data, sender, round_), (_, data2, _, round2) = transport.calls
    assert (data, sender, round_) == (b"x" * 64, "peer-a", 3)
    assert type(data) is bytes and type(round_) is int and type(data2) is bytes and round2 == 10**10 - 1
    assert transport.wait(-5) is False and transport.wait(math.nan) is False and transport.wait(0.25) is False
    assert [call[1] for call in transport.calls[2:]] == [0.0, 0.0, 0.25]
    transport.prune(sender="peer-a", keep_rounds=2, current_round=10)
    assert transport.calls[-1] == ("prune", "peer-a", 8)
    with pytest.raises(ValueError, match="keep_rounds"):
        transport.prune(sender="peer-a", keep_rounds=-1, current_round=10)
    with pytest.raises(ValueError, match="sender"):
        transport.prune(sender="../x", keep_rounds=1, current_round=10)
    assert transport.calls[-1] == ("prune", "peer-a", 8)  # neither reached the hook


def test_a_closed_transport_refuses_every_call_before_its_hook():
    transport = Recording()
    with transport:
        pass
    for call in (
        lambda: transport.publish(b"ok", sender="a", round=0),
        transport.poll,
        lambda: transport.wait(1.0),
        lambda: transport.prune(sender="a", keep_rounds=1, current_round=3),
    ):
        with pytest.raises(TransportError, match="is closed"):
            call()
    assert transport.calls == []


def test_the_base_checks_the_bounds_every_transport_has():
    for options, name in (
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"max_message_bytes": True}, "max_message_bytes"),
        ({"max_batch": 0}, "max_batch"),
        ({"max_batch": 2.0}, "max_batch"),
        ({"max_poll_bytes": -1}, "max_poll_bytes"),
    ):
        with pytest.raises(ValueError, match=name):
            Recording(**options)
    assert Recording(max_message_bytes=10).max_poll_bytes == base_module.DEFAULT_POLL_BYTES_FACTOR * 10


def test_received_messages_over_the_limit_are_refused_as_too_large():
    transport = Recording(max_message_bytes=4)
    assert transport._received(b"abcd", "s", "a", 1) == Envelope(b"abcd", "s", "a", 1, 4)
    assert transport._received(b"abcde", "s", "a", 1) == Envelope(b"", "s", "a", 1, 5, "too_large")


def test_a_transport_must_implement_every_hook():
    class Forgetful(Transport):  # no _prune
        url = "forgetful://"

        def _publish(self, data, *, sender, round):
            pass

        def _poll(self):
            return []

        def _wait(self, timeout):
            return False

    with pytest.raises(TypeError, match="_prune"):
        Forgetful()


@pytest.mark.parametrize("method", ["publish", "poll", "wait", "prune"])
def test_a_transport_cannot_override_a_checked_method(method):
    with pytest.raises(TypeError, match=f"overrides Transport.{method}: implement the hooks \\(_{method}\\)"):
        type("Sneaky", (Recording,), {method: lambda self, *args, **kwargs: None})


# ---------------------------------------------------------------------------------------------------------------
# The real transports get the same checks from the base, before their hook runs


@pytest.mark.parametrize("data, sender, round, error, phrase", INVALID_PUBLISHES)
def test_every_transport_refuses_invalid_and_oversize_messages_in_the_base(
    make_transport, monkeypatch, data, sender, round, error, phrase
):
    writer, reader = make_transport(max_message_bytes=64), make_transport()
    monkeypatch.setattr(writer, "_publish", lambda *args, **kwargs: pytest.fail("the hook ran"))
    with pytest.raises(error, match=phrase):
        writer.publish(data, sender=sender, round=round)
    assert reader.poll() == []  # nothing reached the exchange


def test_every_transport_publishes_through_its_hook(make_transport):
    writer, reader = make_transport(max_message_bytes=64), make_transport()
    assert type(writer).publish is Transport.publish and type(writer).poll is Transport.poll
    writer.publish(b"x" * 64, sender="peer-a", round=3)
    (envelope,) = reader.poll()
    assert (envelope.data, envelope.sender_hint, envelope.round_hint, envelope.error) == (b"x" * 64, "peer-a", 3, None)
    writer.close()
    with pytest.raises(TransportError, match="is closed"):
        writer.publish(b"ok", sender="peer-a", round=4)
