"""What every transport shares: the `Transport` interface, `Envelope`, the error codes and the argument checks."""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ...rules import EXCHANGE_SCHEMES, check_peer_id

DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
# One poll reads at most this many times `max_message_bytes` unless `max_poll_bytes` says otherwise.
DEFAULT_POLL_BYTES_FACTOR = 4
SUPPORTED_SCHEMES = EXCHANGE_SCHEMES

# Error codes of `Envelope.error`; the receiver counts every one of them as a refused message.
TOO_LARGE = "too_large"  # bigger than max_message_bytes (or declares it): not read (dir) or dropped (redis, memory)
UNREADABLE = "unreadable"  # the file exists but could not be opened or read (permissions, I/O error)
UNRECOGNISED = "unrecognised"  # a name in the shared directory that no sender of ours writes
MALFORMED = "malformed"  # a stream entry without a data field
INCOMPLETE = "incomplete"  # a file still shorter than its preamble declares when `incomplete_timeout` ran out

_MAX_ROUND = 10**10 - 1  # rounds are written as 10 zero-padded digits
_MAX_HINT_CHARS = 200  # sender hints are for logs only; a peer must not be able to flood them


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
    size: int  # bytes on the wire (the file size, or the length of the stream's data field); 0 when not looked at
    error: str | None = None  # e.g. "too_large", "unreadable", "unrecognised": the receiver counts it as refused


def validate_sender(sender: str) -> str:
    """Return `sender` if it is a valid peer id ([`trl_ftis.rules.check_peer_id`]), else raise ValueError.

    Sender names end up in file names of a directory other peers read and in Redis keys, so the rule keeps out path
    separators, "..", control characters and over-long names.
    """
    return check_peer_id(sender, "sender")


def _validate_round(round: int) -> int:
    try:
        value = operator.index(round)  # ints and integer-like (numpy) values, not floats or strings
    except TypeError:
        raise ValueError(f"round must be an integer, got {round!r}") from None
    if isinstance(round, bool) or not 0 <= value <= _MAX_ROUND:
        raise ValueError(f"round must be an integer in [0, {_MAX_ROUND}], got {round!r}")
    return value


def _validate_data(data, max_message_bytes: int) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"message data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_message_bytes:
        # Refuse at the sender: every receiver would refuse it anyway.
        raise ValueError(f"message of {len(data)} bytes exceeds max_message_bytes={max_message_bytes}")
    return data


def _positive_number(name: str, value, *, integer: bool = False):
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not value > 0:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return value


def _poll_bytes(max_poll_bytes, max_message_bytes: int) -> int:
    """`max_poll_bytes` checked, or its default: `DEFAULT_POLL_BYTES_FACTOR` messages of the largest size."""
    if max_poll_bytes is None:
        return DEFAULT_POLL_BYTES_FACTOR * max_message_bytes
    return _positive_number("max_poll_bytes", max_poll_bytes, integer=True)


def _prune_cutoff(sender: str, keep_rounds: int, current_round: int) -> int:
    validate_sender(sender)
    keep = operator.index(keep_rounds)
    if keep < 0:
        raise ValueError(f"keep_rounds must be >= 0, got {keep_rounds!r}")
    return operator.index(current_round) - keep


class Transport(ABC):
    """Carries opaque message bytes between peers. Also a context manager (closes on exit).

    An instance keeps its own read cursor: `poll` returns each message once per instance. `publish` may be called
    from any thread; `poll`, `wait` and `prune` belong to one thread at a time (the trainer's).
    """

    url: str  # as given, with any password redacted
    max_message_bytes: int
    max_poll_bytes: int

    @abstractmethod
    def publish(self, data: bytes, *, sender: str, round: int) -> None:
        """Send one message. Raises ValueError for a bad sender/round/size, TransportError if it cannot be sent."""

    @abstractmethod
    def poll(self) -> list[Envelope]:
        """Everything new since the last poll of this instance, oldest first, without blocking.

        At most `max_batch` messages per call, and message bytes up to `max_poll_bytes` (always at least one
        message): the rest come with the next call, so one poll's memory and work stay bounded whatever the other
        writers of the exchange did.
        """

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds (never longer) until something new may be available.

        True: call `poll` (it may still return nothing, e.g. a file that was pruned meanwhile); False: the timeout
        passed. Does not consume messages.
        """

    @abstractmethod
    def prune(self, *, sender: str, keep_rounds: int, current_round: int) -> None:
        """Drop `sender`'s own messages of rounds older than `current_round - keep_rounds` (retention)."""

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
