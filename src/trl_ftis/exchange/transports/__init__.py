"""Transports: move opaque message bytes between trainer processes ("peers"), one round at a time.

A transport only carries bytes. Encoding, signatures and validation live in the wire module; everything a transport
reads comes from untrusted peers, so it bounds sizes and the work of each poll, never follows symbolic links, never
builds paths from names it read, and reports what it could not read as an `Envelope` with an `error` code instead
of raising, so the receiver can count it as refused and carry on. Every blocking call has a timeout: a transport
must never hang a training run, and a fault of the exchange itself (a deleted directory, a restarted Redis server)
costs the messages it lost, not the run.

Every transport subclasses `Transport` ([`.base`]), whose public methods run the checks all transports share (a
closed transport, the sender, the round, the data's type and size) before calling the transport's hook (`_publish`,
`_poll`, `_wait`, `_prune`): a transport implements the hooks only, so it cannot skip a check.

Three transports, chosen by URL (`open_transport`):

* `dir:///abs/path` or `dir://relative/path` ([`.directory`]): a shared directory, the default. No server; works
  for peers on one machine or on a shared file system, and the directory doubles as a recording of the run. Each
  message is one file `<round:010d>.<sender>.<uuid4 hex>.ftis`, written under a `.tmp` name then renamed (atomic).
* `redis://[[user]:password@]host:port/db` and `rediss://` (TLS) ([`.redis_streams`]): Redis Streams, for peers on
  several machines. One stream per swarm (key `ftis:<swarm>`, option `swarm` or `?swarm=NAME`), trimmed to about
  `max_stream_len` entries so the server's memory stays bounded. Needs the `redis` package
  (`pip install 'trl-ftis[redis]'`), imported only when such a URL is opened.
* `memory://NAME` ([`.memory`]): in-process and thread-safe, for unit tests.

Every `poll` returns each message once per transport instance, oldest first, including the instance's own
messages: the receiver filters its own by sender after decoding (the transport's sender is only a claim). One poll
returns at most `max_batch` messages (1000) and reads message bytes up to `max_poll_bytes` (by default 4 times
`max_message_bytes`, 256 MiB; always at least one message); the rest come with the next poll.
"""

from __future__ import annotations

from ...rules import exchange_scheme, normalise_exchange_url, redact_url
from .base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    INCOMPLETE,
    MALFORMED,
    SUPPORTED_SCHEMES,
    TOO_LARGE,
    UNREADABLE,
    UNRECOGNISED,
    Envelope,
    Transport,
    TransportError,
    validate_sender,
)
from .directory import DirTransport
from .memory import MemoryTransport
from .redis_streams import RedisTransport

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "INCOMPLETE",
    "MALFORMED",
    "SUPPORTED_SCHEMES",
    "TOO_LARGE",
    "UNREADABLE",
    "UNRECOGNISED",
    "DirTransport",
    "Envelope",
    "MemoryTransport",
    "RedisTransport",
    "Transport",
    "TransportError",
    "open_transport",
    "redact_url",
    "validate_sender",
]


def open_transport(url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, **options) -> Transport:
    """Open the transport named by `url`: `dir://PATH`, `memory://NAME`, `redis://...` or `rediss://...`.

    `options` go to the transport class (e.g. `max_batch` and `max_poll_bytes` for all of them; `swarm`,
    `max_stream_len`, `connect_timeout` for Redis; `poll_interval`, `incomplete_timeout` for a directory); unknown
    options raise TypeError.
    """
    if not isinstance(url, str):
        raise TypeError(f"transport URL must be a string, got {type(url).__name__}")
    url = normalise_exchange_url(url)  # "DIR://x" -> "dir://x": schemes are case-insensitive
    scheme = exchange_scheme(url)
    if scheme == "dir":
        return DirTransport(url, max_message_bytes=max_message_bytes, **options)
    if scheme == "memory":
        return MemoryTransport(url, max_message_bytes=max_message_bytes, **options)
    return RedisTransport(url, max_message_bytes=max_message_bytes, **options)
