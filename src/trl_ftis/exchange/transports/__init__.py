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

Each transport registers its URL scheme(s) in [`.registry`] (`register_transport(TransportKind(...))`), with what
the rest of trl-ftis needs to know of it (in-process or not, a folder or not, its probe, its URL redaction); importing
this package registers the three built-in ones, and `open_transport` opens whichever transport is registered for a
URL's scheme. A transport of one's own is a `Transport` subclass and its `register_transport` call
(`docs/wire-format.md`, "Adding a transport").

The built-in transports:

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

from .base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    INCOMPLETE,
    MALFORMED,
    TOO_LARGE,
    UNREADABLE,
    UNRECOGNISED,
    Envelope,
    Transport,
    TransportError,
    validate_sender,
)
from .directory import DirTransport  # the built-in transports: importing each registers its scheme(s)
from .memory import MemoryTransport
from .redis_streams import RedisTransport
from .registry import TransportKind, register_transport, transport_kind, transport_schemes

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "INCOMPLETE",
    "MALFORMED",
    "TOO_LARGE",
    "UNREADABLE",
    "UNRECOGNISED",
    "DirTransport",
    "Envelope",
    "MemoryTransport",
    "RedisTransport",
    "Transport",
    "TransportError",
    "TransportKind",
    "open_transport",
    "register_transport",
    "transport_schemes",
    "validate_sender",
]


def open_transport(url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, **options) -> Transport:
    """Open the transport registered for `url`'s scheme: `dir://PATH`, `memory://NAME`, `redis://...`,
    `rediss://...`, or one registered with `register_transport`.

    `options` go to the transport class (e.g. `max_batch` and `max_poll_bytes` for all of them; `swarm`,
    `max_stream_len`, `connect_timeout` for Redis; `poll_interval`, `incomplete_timeout` for a directory); unknown
    options raise TypeError.
    """
    if not isinstance(url, str):
        raise TypeError(f"transport URL must be a string, got {type(url).__name__}")
    kind = transport_kind(url)
    url = kind.scheme + url[len(kind.scheme) :]  # "DIR://x" -> "dir://x": schemes are case-insensitive
    return kind.opener(url, max_message_bytes=max_message_bytes, **options)
