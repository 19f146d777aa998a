"""What every transport shares: the `Transport` interface, `Envelope`, the error codes and the argument checks.

`Transport` is a template: its public methods (`publish`, `poll`, `wait`, `prune`) run every check once, here, and
then call the hook a transport implements (`_publish`, `_poll`, `_wait`, `_prune`), so no transport can forget one.
`publish` refuses a closed transport, an invalid sender, a round outside `[0, 10**10)`, data that is not bytes and
data over `max_message_bytes`, before a transport sees any of it; `_publish` gets checked `bytes`, a valid sender and
an `int` round. The helpers below are public for the transports' constructors (`positive_number`, `poll_bytes`) and
their metadata hints (`MAX_HINT_CHARS`).
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ...peer_ids import check_peer_id

DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
# One poll reads at most this many times `max_message_bytes` unless `max_poll_bytes` says otherwise.
DEFAULT_POLL_BYTES_FACTOR = 4

# Error codes of `Envelope.error`; the receiver counts every one of them as a refused message.
TOO_LARGE = "too_large"  # bigger than max_message_bytes (or declares it): not read (dir) or dropped (redis, memory)
UNREADABLE = "unreadable"  # the file exists but could not be opened or read (permissions, I/O error)
UNRECOGNISED = "unrecognised"  # a name in the shared directory that no sender of ours writes
MALFORMED = "malformed"  # a stream entry without a data field
INCOMPLETE = "incomplete"  # a file still shorter than its preamble declares when `incomplete_timeout` ran out

MAX_ROUND = 10**10 - 1
"""The largest round a transport files: rounds are written as 10 zero-padded digits."""
MAX_HINT_CHARS = 200
"""Characters of a sender hint kept from transport metadata: hints are for logs only, a peer must not flood them."""


class TransportError(RuntimeError):
    """A transport could not be configured or reached. The message names the URL with any password redacted."""


@dataclass
class Envelope:
    """One message as a transport received it.

    Everything except `data`'s bytes comes from transport metadata that any peer can forge: `sender_hint` and
    `round_hint` are for logs and cheap pre-filtering only; the decoded, signed message is the authority.
    """

    data: bytes = field(repr=False)  # the raw message; b"" when it could not be read (see `error`)
    source: str  # file name / stream entry id / memory index: unique per message within one transport
    sender_hint: str | None  # sender as claimed by the transport metadata (untrusted)
    round_hint: int | None  # round as claimed by the transport metadata (untrusted)
    size: int  # bytes read (the file size; for a stream entry, all its fields): charged to the round; 0 when not read
    error: str | None = None  # e.g. "too_large", "unreadable", "unrecognised": the receiver counts it as refused


def validate_sender(sender: str) -> str:
    """Return `sender` if it is a valid peer id ([`trl_ftis.peer_ids.check_peer_id`]), else raise ValueError.

    Sender names end up in file names of a directory other peers read and in Redis keys, so the rule keeps out path
    separators, "..", control characters and over-long names.
    """
    return check_peer_id(sender, "sender")


def validate_round(round: int) -> int:
    """`round` as an int when it is an integer (numpy ones included, not a bool, float or string) in
    `[0, MAX_ROUND]`; else `ValueError`."""
    try:
        value = operator.index(round)  # ints and integer-like (numpy) values, not floats or strings
    except TypeError:
        raise ValueError(f"round must be an integer, got {round!r}") from None
    if isinstance(round, bool) or not 0 <= value <= MAX_ROUND:
        raise ValueError(f"round must be an integer in [0, {MAX_ROUND}], got {round!r}")
    return value


def validate_data(data, max_message_bytes: int) -> bytes:
    """`data` as `bytes` when it is bytes-like and at most `max_message_bytes` long; else `TypeError` (not bytes) or
    `ValueError` (too large: every receiver would refuse it anyway, so the sender refuses it first)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"message data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_message_bytes:
        raise ValueError(f"message of {len(data)} bytes exceeds max_message_bytes={max_message_bytes}")
    return data


def positive_number(name: str, value, *, integer: bool = False):
    """`value` when it is a number (an `int` with `integer`) above 0, not a bool; else `ValueError` naming `name`."""
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not value > 0:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return value


def poll_bytes(max_poll_bytes, max_message_bytes: int) -> int:
    """`max_poll_bytes` checked, or its default: `DEFAULT_POLL_BYTES_FACTOR` messages of the largest size."""
    if max_poll_bytes is None:
        return DEFAULT_POLL_BYTES_FACTOR * max_message_bytes
    return positive_number("max_poll_bytes", max_poll_bytes, integer=True)


def prune_cutoff(sender: str, keep_rounds: int, current_round: int) -> int:
    """The first round `prune` keeps, `current_round - keep_rounds`, after checking the sender and that
    `keep_rounds >= 0`."""
    validate_sender(sender)
    keep = operator.index(keep_rounds)
    if keep < 0:
        raise ValueError(f"keep_rounds must be >= 0, got {keep_rounds!r}")
    return operator.index(current_round) - keep


# The public methods that run the shared checks: a transport implements their hooks, never the methods themselves.
_TEMPLATE_METHODS = ("publish", "poll", "wait", "prune")


class Transport(ABC):
    """Carries opaque message bytes between peers. Also a context manager (closes on exit).

    An instance keeps its own read cursor: `poll` returns each message once per instance. `publish` may be called
    from any thread; `poll`, `wait` and `prune` belong to one thread at a time (the trainer's).

    A transport sets `url`, `max_message_bytes`, `max_batch` and `max_poll_bytes` (`_set_bounds` checks the last
    three) and implements the hooks `_publish`, `_poll`, `_wait` and `_prune`; the public methods run the checks
    every transport shares and then call the hook. A subclass that overrides a public method is refused when it is
    defined (`TypeError`): the checks cannot be skipped by accident.
    """

    url: str  # as given, with any password redacted
    retries: bool = False  # whether `_publish` retries a failing send (it then takes `patience`, seconds at most)
    max_message_bytes: int
    max_batch: int
    max_poll_bytes: int

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        overridden = [name for name in _TEMPLATE_METHODS if name in vars(cls)]
        if overridden:
            raise TypeError(
                f"{cls.__name__} overrides Transport.{', '.join(overridden)}: implement the hooks "
                f"({', '.join('_' + name for name in overridden)}) instead, so that the shared checks always run."
            )

    def _set_bounds(self, *, max_message_bytes: int, max_batch: int, max_poll_bytes: int | None) -> None:
        """Check and set the bounds every transport has: the largest message, the messages a poll returns and the
        message bytes a poll reads (default `DEFAULT_POLL_BYTES_FACTOR` x `max_message_bytes`)."""
        self.max_message_bytes = positive_number("max_message_bytes", max_message_bytes, integer=True)
        self.max_batch = positive_number("max_batch", max_batch, integer=True)
        self.max_poll_bytes = poll_bytes(max_poll_bytes, self.max_message_bytes)

    # -- the interface: the shared checks, then the transport's hook

    def publish(self, data: bytes, *, sender: str, round: int, patience: float | None = None) -> None:
        """Send one message. Raises TransportError when the transport is closed or the message cannot be sent,
        ValueError for an invalid sender, a round outside `[0, MAX_ROUND]` or data over `max_message_bytes`, and
        TypeError for data that is not bytes; nothing is sent then. `patience`: retry a failing send for at most this
        many seconds (for a transport that retries, such as Redis; default: its own limit), e.g. a last message sent
        while the run ends."""
        self._check_open()
        validate_sender(sender)
        round = validate_round(round)
        data = validate_data(data, self.max_message_bytes)
        if self.retries and patience is not None:
            self._publish(data, sender=sender, round=round, patience=max(float(patience), 0.0))
        else:
            self._publish(data, sender=sender, round=round)

    def poll(self) -> list[Envelope]:
        """Everything new since the last poll of this instance, oldest first, without blocking.

        At most `max_batch` messages per call, and message bytes up to `max_poll_bytes` (always at least one
        message): the rest come with the next call, so one poll's memory and work stay bounded whatever the other
        writers of the exchange did.
        """
        self._check_open()
        return self._poll()

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds (never longer; a negative or NaN timeout is 0) until something new may be
        available.

        True: call `poll` (it may still return nothing, e.g. a file that was pruned meanwhile); False: the timeout
        passed. Does not consume messages.
        """
        self._check_open()
        return self._wait(max(0.0, float(timeout)))

    def prune(self, *, sender: str, keep_rounds: int, current_round: int) -> None:
        """Drop `sender`'s own messages of rounds older than `current_round - keep_rounds` (retention)."""
        self._check_open()
        self._prune(sender=sender, cutoff=prune_cutoff(sender, keep_rounds, current_round))

    def _received(self, data: bytes, source: str, sender_hint: str | None, round_hint: int | None) -> Envelope:
        """The envelope of a message a transport has already received whole (a stream entry, a memory slot): refused
        as `too_large`, without its bytes, when it is over this instance's `max_message_bytes`."""
        if len(data) > self.max_message_bytes:
            return Envelope(b"", source, sender_hint, round_hint, len(data), TOO_LARGE)
        return Envelope(data, source, sender_hint, round_hint, len(data))

    # -- the hooks

    @abstractmethod
    def _publish(self, data: bytes, *, sender: str, round: int) -> None:
        """Send `data` (checked bytes, at most `max_message_bytes`) as `sender`'s message of `round` (both checked);
        TransportError when it cannot be sent. A transport with `retries` also takes `patience` (seconds)."""

    @abstractmethod
    def _poll(self) -> list[Envelope]:
        """`poll` on an open transport, within `max_batch` and `max_poll_bytes`."""

    @abstractmethod
    def _wait(self, timeout: float) -> bool:
        """`wait` on an open transport; `timeout` is a float >= 0."""

    @abstractmethod
    def _prune(self, *, sender: str, cutoff: int) -> None:
        """Drop `sender`'s (a valid peer id) own messages of rounds below `cutoff`."""

    def close(self) -> None:
        """Release resources. Idempotent; the transport cannot be used afterwards."""
        self._closed = True

    _closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"transport {self.url} is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
