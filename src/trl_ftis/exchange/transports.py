"""Transports: move opaque message bytes between trainer processes ("peers"), one round at a time.

A transport only carries bytes. Encoding, signatures and validation live in the wire module; everything a transport
reads comes from untrusted peers, so it bounds sizes, never follows symbolic links, never builds paths from names
it read, and reports what it could not read as an `Envelope` with an `error` code instead of raising, so the
receiver can count it as refused and carry on. Every blocking call has a timeout: a transport must never hang a
training run.

Three transports, chosen by URL (`open_transport`):

* `dir:///abs/path` or `dir://relative/path`: a shared directory, the default. No server; works for peers on
  one machine or on a shared file system, and the directory doubles as a recording of the run. Each message is
  one file `<round:010d>.<sender>.<uuid4 hex>.ftis`, written under a `.tmp` name then renamed (atomic).
* `redis://[[user]:password@]host:port/db` and `rediss://` (TLS): Redis Streams, for peers on several
  machines. One stream per swarm (key `ftis:<swarm>`, option `swarm` or `?swarm=NAME`), trimmed to about
  `max_stream_len` entries so the server's memory stays bounded. Needs the `redis` package
  (`pip install 'trl-ftis[redis]'`), imported only when such a URL is opened.
* `memory://NAME`: in-process and thread-safe, for unit tests.

Every `poll` returns each message once per transport instance, oldest first, including the instance's own
messages: the receiver filters its own by sender after decoding (the transport's sender is only a claim).
"""

from __future__ import annotations

import errno
import logging
import operator
import os
import re
import stat
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..rules import (
    EXCHANGE_SCHEMES,
    REDACTED,
    check_peer_id,
    exchange_scheme,
    normalise_exchange_url,
    redact_url,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
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

DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
SUPPORTED_SCHEMES = EXCHANGE_SCHEMES

# Error codes of `Envelope.error`; the receiver counts every one of them as a refused message.
TOO_LARGE = "too_large"  # bigger than max_message_bytes: not read (dir) or dropped (redis, memory)
UNREADABLE = "unreadable"  # the file exists but could not be opened or read (permissions, I/O error)
UNRECOGNISED = "unrecognised"  # a name in the shared directory that no sender of ours writes
MALFORMED = "malformed"  # a stream entry without a data field

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
    size: int  # bytes on the wire (the file size, or the length of the stream's data field)
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


class Transport(ABC):
    """Carries opaque message bytes between peers. Also a context manager (closes on exit).

    An instance keeps its own read cursor: `poll` returns each message once per instance. `publish` may be called
    from any thread; `poll`, `wait` and `prune` belong to one thread at a time (the trainer's).
    """

    url: str  # as given, with any password redacted
    max_message_bytes: int

    @abstractmethod
    def publish(self, data: bytes, *, sender: str, round: int) -> None:
        """Send one message. Raises ValueError for a bad sender/round/size, TransportError if it cannot be sent."""

    @abstractmethod
    def poll(self) -> list[Envelope]:
        """Everything new since the last poll of this instance, oldest first, without blocking.

        At most `max_batch` envelopes per call (the rest come with the next call), so one poll's memory is
        bounded by `max_batch * max_message_bytes`.
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


def _prune_cutoff(sender: str, keep_rounds: int, current_round: int) -> int:
    validate_sender(sender)
    keep = operator.index(keep_rounds)
    if keep < 0:
        raise ValueError(f"keep_rounds must be >= 0, got {keep_rounds!r}")
    return operator.index(current_round) - keep


# --------------------------------------------------------------------------------------------------------------
# memory://


class _MemoryChannel:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        # (sender, round, data), or None where the sender pruned it: indices stay stable for every cursor.
        self.messages: list[tuple[str, int, bytes] | None] = []


class MemoryTransport(Transport):
    """In-process transport for unit tests: a class-level registry of named channels, one cursor per instance."""

    _registry: dict[str, _MemoryChannel] = {}
    _registry_lock = threading.Lock()

    def __init__(self, url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_batch: int = 1000):
        if not url.startswith("memory://"):
            raise ValueError(f"not a memory:// URL: {url!r}")
        self.url = url
        self.name = url[len("memory://") :] or "default"
        self.max_message_bytes = _positive_number("max_message_bytes", max_message_bytes, integer=True)
        self.max_batch = _positive_number("max_batch", max_batch, integer=True)
        with self._registry_lock:
            self._channel = self._registry.setdefault(self.name, _MemoryChannel())
        self._cursor = 0

    @classmethod
    def reset(cls, name: str | None = None) -> None:
        """Forget one channel (or all of them); open instances keep the old channel object."""
        with cls._registry_lock:
            if name is None:
                cls._registry.clear()
            else:
                cls._registry.pop(name, None)

    def publish(self, data: bytes, *, sender: str, round: int) -> None:
        self._check_open()
        validate_sender(sender)
        round = _validate_round(round)
        data = _validate_data(data, self.max_message_bytes)
        with self._channel.cond:
            self._channel.messages.append((sender, round, data))
            self._channel.cond.notify_all()

    def poll(self) -> list[Envelope]:
        self._check_open()
        with self._channel.cond:
            end = min(len(self._channel.messages), self._cursor + self.max_batch)
            items = list(enumerate(self._channel.messages[self._cursor : end], start=self._cursor))
            self._cursor = end
        out = []
        for index, item in items:
            if item is None:
                continue  # pruned by its sender
            sender, round, data = item
            if len(data) > self.max_message_bytes:  # another instance may allow bigger messages
                out.append(Envelope(b"", str(index), sender, round, len(data), TOO_LARGE))
            else:
                out.append(Envelope(data, str(index), sender, round, len(data)))
        return out

    def wait(self, timeout: float) -> bool:
        self._check_open()
        with self._channel.cond:
            return self._channel.cond.wait_for(
                lambda: len(self._channel.messages) > self._cursor, timeout=max(0.0, float(timeout))
            )

    def prune(self, *, sender: str, keep_rounds: int, current_round: int) -> None:
        self._check_open()
        cutoff = _prune_cutoff(sender, keep_rounds, current_round)
        with self._channel.cond:
            messages = self._channel.messages
            for i, item in enumerate(messages):
                if item is not None and item[0] == sender and item[1] < cutoff:
                    messages[i] = None


# --------------------------------------------------------------------------------------------------------------
# dir://

_SUFFIX = ".ftis"
_TMP_SUFFIX = ".ftis.tmp"
# round, sender (may contain single dots), uuid4 hex, optional .tmp. Only used to parse hints and for prune.
_NAME_RE = re.compile(r"^(\d{10})\.(.+)\.([0-9a-f]{32})\.ftis(\.tmp)?$", re.DOTALL)

_OPEN_FLAGS_COMMON = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
# O_NONBLOCK: if a FIFO is swapped in between lstat and open, open must not block waiting for a writer.
_READ_FLAGS = os.O_RDONLY | _OPEN_FLAGS_COMMON | getattr(os, "O_NONBLOCK", 0)
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS_COMMON


def _ignored_name(name: str) -> bool:
    # In-flight writes (renamed when complete) and NFS "silly rename" files of deleted-but-open files are
    # neither messages nor garbage.
    return name.endswith(_TMP_SUFFIX) or name.startswith(".nfs")


class DirTransport(Transport):
    """A shared directory: one file per message, written atomically (temporary name, then `os.replace`).

    Readers list the directory, skip anything that is not a regular file (symbolic links are never followed),
    report files over `max_message_bytes` without reading them, and report unexpected names once as
    "unrecognised". `wait` re-lists the directory every `poll_interval` seconds (no server to notify us).
    """

    def __init__(
        self,
        url: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        poll_interval: float = 0.05,
        max_batch: int = 1000,
        fsync: bool = False,
    ):
        if not url.startswith("dir://"):
            raise ValueError(f"not a dir:// URL: {url!r}")
        raw = url[len("dir://") :]
        if not raw or "\x00" in raw:
            raise ValueError(f"dir:// URL needs a directory path, e.g. dir:///shared/ftis; got {url!r}")
        self.url = url
        # Absolute now, so a later chdir of the process does not move the exchange.
        self.path = os.path.abspath(os.path.expanduser(raw))
        self.max_message_bytes = _positive_number("max_message_bytes", max_message_bytes, integer=True)
        self.poll_interval = _positive_number("poll_interval", poll_interval)
        self.max_batch = _positive_number("max_batch", max_batch, integer=True)
        self.fsync = bool(fsync)
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise TransportError(f"the exchange path of {url} exists but is not a directory")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise TransportError(f"cannot create the exchange directory of {url}: {exc}") from exc
        # Names already returned (or deliberately skipped). Forgotten once gone from the directory, so the set
        # never outgrows the directory listing.
        self._seen: set[str] = set()

    # -- sending

    def publish(self, data: bytes, *, sender: str, round: int) -> None:
        self._check_open()
        validate_sender(sender)
        round = _validate_round(round)
        data = _validate_data(data, self.max_message_bytes)
        name = f"{round:010d}.{sender}.{uuid.uuid4().hex}{_SUFFIX}"
        final_path = os.path.join(self.path, name)
        tmp_path = final_path + ".tmp"
        try:
            fd = os.open(tmp_path, _WRITE_FLAGS, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    if self.fsync:  # for file systems where a crash could otherwise leave an empty file
                        f.flush()
                        os.fsync(f.fileno())
                # Atomic: readers see either no file or the complete one, never a partial write.
                os.replace(tmp_path, final_path)
            except BaseException:
                try:
                    os.unlink(tmp_path)
                except OSError:
                    pass
                raise
        except OSError as exc:
            raise TransportError(f"cannot write a message to {self.url}: {exc}") from exc

    # -- receiving

    def _list(self) -> list[os.DirEntry]:
        with os.scandir(self.path) as it:
            return list(it)

    def poll(self) -> list[Envelope]:
        self._check_open()
        try:
            entries = self._list()
        except OSError as exc:
            raise TransportError(f"cannot list the exchange directory of {self.url}: {exc}") from exc
        present = set()
        candidates = []
        for entry in entries:
            name = entry.name
            present.add(name)
            if name in self._seen or _ignored_name(name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)  # lstat: a symlink is judged as a link, not its target
            except FileNotFoundError:
                continue  # removed since the listing (the sender pruned it)
            except OSError:
                st = None
            candidates.append((name, st))
        self._seen &= present

        def order(item):
            name, st = item
            match = _NAME_RE.match(name)
            return (int(match.group(1)) if match else -1, st.st_mtime_ns if st else 0, name)

        candidates.sort(key=order)
        out = []
        for name, st in candidates[: self.max_batch]:
            envelope = self._receive(name, st)
            if envelope is not _VANISHED:
                self._seen.add(name)
            if isinstance(envelope, Envelope):
                out.append(envelope)
        return out

    def _receive(self, name: str, st: os.stat_result | None):
        """An Envelope, None (skip, remember the name) or _VANISHED (skip, the file is gone)."""
        if not name.endswith(_SUFFIX):
            return Envelope(b"", name, None, None, st.st_size if st else 0, UNRECOGNISED)
        match = _NAME_RE.match(name)
        sender_hint = match.group(2) if match else None
        round_hint = int(match.group(1)) if match else None
        if st is None:
            return Envelope(b"", name, sender_hint, round_hint, 0, UNREADABLE)
        if not stat.S_ISREG(st.st_mode):
            return None  # symlinks, directories, FIFOs...: never followed or read
        if st.st_size > self.max_message_bytes:
            return Envelope(b"", name, sender_hint, round_hint, st.st_size, TOO_LARGE)
        try:
            fd = os.open(os.path.join(self.path, name), _READ_FLAGS)
        except FileNotFoundError:
            return _VANISHED
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):  # became a symlink since lstat: still not followed
                return None
            return Envelope(b"", name, sender_hint, round_hint, st.st_size, UNREADABLE)
        try:
            with os.fdopen(fd, "rb") as f:
                fst = os.fstat(f.fileno())  # the file actually opened, which may differ from the one listed
                if not stat.S_ISREG(fst.st_mode):
                    return None
                if fst.st_size > self.max_message_bytes:
                    return Envelope(b"", name, sender_hint, round_hint, fst.st_size, TOO_LARGE)
                # Read one byte more than allowed: a file that grew since fstat is caught without reading it all.
                data = f.read(self.max_message_bytes + 1)
        except OSError:
            return Envelope(b"", name, sender_hint, round_hint, st.st_size, UNREADABLE)
        if len(data) > self.max_message_bytes:
            return Envelope(b"", name, sender_hint, round_hint, len(data), TOO_LARGE)
        return Envelope(data, name, sender_hint, round_hint, len(data))

    def _has_new(self) -> bool:
        try:
            entries = self._list()
        except OSError:
            return False  # poll() reports the problem; wait() only promises to return in time
        return any(e.name not in self._seen and not _ignored_name(e.name) for e in entries)

    def wait(self, timeout: float) -> bool:
        self._check_open()
        deadline = time.monotonic() + max(0.0, float(timeout))
        while True:
            if self._has_new():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(self.poll_interval, remaining))

    def prune(self, *, sender: str, keep_rounds: int, current_round: int) -> None:
        self._check_open()
        cutoff = _prune_cutoff(sender, keep_rounds, current_round)
        try:
            entries = self._list()
        except OSError as exc:
            raise TransportError(f"cannot list the exchange directory of {self.url}: {exc}") from exc
        for entry in entries:
            match = _NAME_RE.match(entry.name)
            # Only names this sender writes (stale .tmp files of a crashed write included), never anyone else's.
            if match is None or match.group(2) != sender or int(match.group(1)) >= cutoff:
                continue
            try:
                os.unlink(os.path.join(self.path, entry.name))  # unlink never follows a symlink
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("could not prune %s in %s: %s", entry.name, self.url, exc)


_VANISHED = object()


# --------------------------------------------------------------------------------------------------------------
# redis:// and rediss://

_SWARM_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def _text_hint(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value[: _MAX_HINT_CHARS * 4].decode("utf-8", errors="replace")
    return str(value)[:_MAX_HINT_CHARS]


def _int_hint(value) -> int | None:
    if isinstance(value, bytes) and 0 < len(value) <= 20 and value.isdigit():
        return int(value)
    return None


class RedisTransport(Transport):
    """Redis Streams: one stream `ftis:<swarm>`, XADD to publish, XREAD from the last seen id to poll.

    A new instance starts reading at the beginning of the retained stream, so a peer that joins late sees the
    recent messages. The stream is trimmed at each XADD to about `max_stream_len` entries (approximate trimming
    removes whole internal nodes, so it can exceed the bound by up to the server's `stream-node-max-entries`,
    100 by default). Every call has a socket timeout; connection failures are retried with exponential backoff
    until `connect_timeout` seconds have passed, then raise TransportError. A publish that times out after it was
    sent is not retried (it may have arrived); one retried after a dropped connection may, rarely, arrive twice.
    If the server stops answering in the middle of a call, that call can take up to `socket_timeout` longer
    than its own deadline (the socket timeout is what bounds it): keep `socket_timeout` short.
    """

    def __init__(
        self,
        url: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        swarm: str | None = None,
        max_stream_len: int = 10_000,
        connect_timeout: float = 10.0,
        socket_timeout: float = 5.0,
        max_batch: int = 1000,
        page_size: int = 100,
        client_options: dict | None = None,
    ):
        self.url = redact_url(url)
        self._password = None
        try:
            parts = urlsplit(url)
            self._password = parts.password
            host, port = parts.hostname, parts.port
        except ValueError as exc:
            raise TransportError(f"invalid redis URL {self.url}: {exc}") from None
        if parts.scheme.lower() not in ("redis", "rediss"):
            raise ValueError(f"not a redis:// or rediss:// URL: {self.url}")
        self._where = f"{host or 'localhost'}:{port or 6379}"
        self.max_message_bytes = _positive_number("max_message_bytes", max_message_bytes, integer=True)
        self.max_stream_len = _positive_number("max_stream_len", max_stream_len, integer=True)
        self.connect_timeout = _positive_number("connect_timeout", connect_timeout)
        self.socket_timeout = _positive_number("socket_timeout", socket_timeout)
        self.max_batch = _positive_number("max_batch", max_batch, integer=True)
        self.page_size = _positive_number("page_size", page_size, integer=True)

        # ?swarm=NAME is ours; every other query parameter is for redis-py (e.g. ssl_cert_reqs).
        query = parse_qsl(parts.query, keep_blank_values=True)
        url_swarms = [v for k, v in query if k == "swarm"]
        if len(set(url_swarms)) > 1 or (url_swarms and swarm is not None and url_swarms[0] != swarm):
            raise ValueError(f"conflicting swarm names in {self.url} and the swarm option")
        self.swarm = swarm if swarm is not None else (url_swarms[0] if url_swarms else "default")
        if not isinstance(self.swarm, str) or not _SWARM_RE.match(self.swarm):
            raise ValueError(f"swarm name must match {_SWARM_RE.pattern}, got {self.swarm!r}")
        self.key = f"ftis:{self.swarm}"
        client_url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "swarm"])))

        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise TransportError(
                f"{self.url} needs the redis package: pip install 'trl-ftis[redis]' (or pip install redis)"
            ) from None
        self._redis = redis
        # Transient errors: retried by us, against our deadline. Configuration errors: raised at once.
        self._transient = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._fatal = (redis.AuthenticationError, redis.ResponseError)
        options = dict(
            socket_timeout=self.socket_timeout,
            socket_connect_timeout=min(self.socket_timeout, self.connect_timeout),
            retry=Retry(NoBackoff(), 0),  # redis-py's own retries would overrun our deadline
            decode_responses=False,
        )
        options.update(client_options or {})
        try:
            self._client = redis.Redis.from_url(client_url, **options)
        except (ValueError, TypeError) as exc:
            raise TransportError(f"invalid redis URL or options for {self.url}: {self._scrub(exc)}") from None
        self._last_id = b"0-0"  # from the start of the retained stream: late joiners see recent messages
        self._buffer: deque[Envelope] = deque()  # entries that wait() fetched, returned by the next poll()
        self._own: deque[tuple[str, int, bytes]] = deque(maxlen=self.max_stream_len)  # for prune
        try:
            self._call("PING", self._client.ping)  # fail fast on a wrong host or password
        except BaseException:
            self._client.close()
            raise

    def _scrub(self, exc: BaseException) -> str:
        text = f"{type(exc).__name__}: {exc}"
        if self._password:
            text = text.replace(self._password, REDACTED)
        return text

    def _call(self, what: str, fn, *, retry_timeouts: bool = True):
        """Run one redis call, retrying transient failures with backoff until `connect_timeout` has passed."""
        start = time.monotonic()
        deadline = start + self.connect_timeout
        delay = 0.05
        attempts = 0
        while True:
            attempts += 1
            try:
                return fn()
            except self._fatal as exc:
                raise TransportError(f"redis {what} on {self.url} failed: {self._scrub(exc)}") from None
            except self._transient as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (not retry_timeouts and isinstance(exc, self._redis.TimeoutError)):
                    # `from None`: the chained exception would repeat details we already summarise (and scrub).
                    raise TransportError(
                        f"cannot reach redis at {self._where} ({self.url}) for {what}: {attempts} attempt(s) in "
                        f"{time.monotonic() - start:.1f}s, last error {self._scrub(exc)}"
                    ) from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 1.0)

    @staticmethod
    def _entries(response) -> list:
        """[(id, fields)] from an XREAD reply in either RESP2 (list) or RESP3 (dict) shape."""
        if not response:
            return []
        if isinstance(response, dict):
            # RESP3: {key: [[(id, fields), ...]]}, the entry list wrapped once more.
            streams = [value[0] if value and isinstance(value[0], list) else value for value in response.values()]
        else:
            streams = [item[1] for item in response]  # RESP2: [[key, [(id, fields), ...]]]
        return [entry for entries in streams for entry in entries]

    def _envelope(self, entry_id, fields) -> Envelope:
        source = entry_id.decode("ascii", "replace") if isinstance(entry_id, bytes) else str(entry_id)
        fields = fields if isinstance(fields, dict) else {}
        sender_hint = _text_hint(fields.get(b"sender"))
        round_hint = _int_hint(fields.get(b"round"))
        data = fields.get(b"data")
        if not isinstance(data, bytes):
            return Envelope(b"", source, sender_hint, round_hint, 0, MALFORMED)
        if len(data) > self.max_message_bytes:
            # Redis has already sent it (a stream field cannot be sized before reading); drop it now.
            return Envelope(b"", source, sender_hint, round_hint, len(data), TOO_LARGE)
        return Envelope(data, source, sender_hint, round_hint, len(data))

    def _take(self, response) -> list[Envelope]:
        out = []
        for entry_id, fields in self._entries(response):
            self._last_id = entry_id
            out.append(self._envelope(entry_id, fields))
        return out

    def publish(self, data: bytes, *, sender: str, round: int) -> None:
        self._check_open()
        validate_sender(sender)
        round = _validate_round(round)
        data = _validate_data(data, self.max_message_bytes)
        fields = {"sender": sender, "round": str(round), "data": data}
        entry_id = self._call(
            "XADD",
            lambda: self._client.xadd(self.key, fields, maxlen=self.max_stream_len, approximate=True),
            retry_timeouts=False,
        )
        self._own.append((sender, round, entry_id))

    def poll(self) -> list[Envelope]:
        self._check_open()
        out: list[Envelope] = []
        while self._buffer and len(out) < self.max_batch:
            out.append(self._buffer.popleft())
        while len(out) < self.max_batch:
            count = min(self.page_size, self.max_batch - len(out))
            # No BLOCK argument: returns at once.
            response = self._call("XREAD", lambda: self._client.xread({self.key: self._last_id}, count=count))
            page = self._take(response)
            out.extend(page)
            if len(page) < count:
                break
        return out

    def wait(self, timeout: float) -> bool:
        self._check_open()
        if self._buffer:
            return True
        deadline = time.monotonic() + max(0.0, float(timeout))
        # Block in chunks well below the socket timeout, so the socket never times out under a healthy BLOCK.
        chunk = max(0.001, self.socket_timeout / 2)
        while True:
            remaining = deadline - time.monotonic()
            block_ms = int(min(remaining, chunk) * 1000)
            if block_ms < 1:
                return False  # never send BLOCK 0: it means "forever"
            try:
                response = self._client.xread({self.key: self._last_id}, count=self.page_size, block=block_ms)
            except self._fatal as exc:
                raise TransportError(f"redis XREAD on {self.url} failed: {self._scrub(exc)}") from None
            except self._transient as exc:
                # poll() and publish() report outages; wait() only promises to return in time.
                logger.debug("redis wait on %s: %s", self.url, self._scrub(exc))
                time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))
                continue
            page = self._take(response)
            if page:
                self._buffer.extend(page)
                return True

    def prune(self, *, sender: str, keep_rounds: int, current_round: int) -> None:
        """Delete `sender`'s old entries that this instance published (others' entries are never touched).

        Trimming already bounds the stream; pruning just frees memory sooner. Entries from before this instance
        existed are left to trimming.
        """
        self._check_open()
        cutoff = _prune_cutoff(sender, keep_rounds, current_round)
        old = [item for item in self._own if item[0] == sender and item[1] < cutoff]
        if not old:
            return
        keep = [item for item in self._own if not (item[0] == sender and item[1] < cutoff)]
        ids = [item[2] for item in old]
        for i in range(0, len(ids), 1000):
            batch = ids[i : i + 1000]
            self._call("XDEL", lambda batch=batch: self._client.xdel(self.key, *batch))
        self._own.clear()
        self._own.extend(keep)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._client.close()
            except Exception:  # closing must not raise over a broken connection
                pass


# --------------------------------------------------------------------------------------------------------------


def open_transport(url: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, **options) -> Transport:
    """Open the transport named by `url`: `dir://PATH`, `memory://NAME`, `redis://...` or `rediss://...`.

    `options` go to the transport class (e.g. `swarm`, `max_stream_len`, `connect_timeout` for Redis,
    `poll_interval` for a directory); unknown options raise TypeError.
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
