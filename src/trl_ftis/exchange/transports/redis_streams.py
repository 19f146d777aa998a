"""`redis://` and `rediss://`: Redis Streams, one stream per swarm.

Also what the rest of trl-ftis needs of such a URL, registered with the two schemes: `reach_problem` (whether the
server answers, asked by the launcher before its peers start), `redis_client_url` (the URL redis-py is given)."""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections import deque
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...redaction import REDACTED, redact_text, redact_url
from ...shared_names import REDIS_PASSWORD_ENV
from .base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MALFORMED,
    MAX_HINT_CHARS,
    TOO_LARGE,
    Envelope,
    Transport,
    TransportError,
    positive_number,
)
from .registry import TransportKind, register_transport

logger = logging.getLogger(__name__)

REDIS_URL_OPTIONS = ("swarm", "connect_timeout")
"""Query parameters of a `redis://` exchange URL that trl-ftis reads itself (the swarm's key namespace, the connect
timeout); every other one is redis-py's."""


def redis_client_url(url: str) -> str:
    """`url` without [`REDIS_URL_OPTIONS`]: what redis-py's `Redis.from_url` is given."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in REDIS_URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(query)))


DEFAULT_PORT = 6379
REACH_TIMEOUT = 3.0  # seconds: a Redis that is up answers in milliseconds, one that is not fails in seconds


def reach_problem(url: str, timeout: float = REACH_TIMEOUT) -> str | None:
    """`"cannot reach Redis at redis://host:6379/0: connection refused"`, or None when it answers (a TCP connect, then
    a PING through redis-py when it is installed: a wrong password is caught too). The URL's password is never shown.
    """
    shown = redact_url(url)

    def reason(exc: BaseException) -> str:
        return redact_text(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError as exc:
        return f"cannot reach Redis at {shown}: {reason(exc)}"
    if not host:
        return f"cannot reach Redis at {shown}: the URL names no host"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:  # refused, unreachable, unknown host, timed out
        return f"cannot reach Redis at {shown}: {reason(exc)}"
    try:
        import redis
    except ImportError:
        return None  # the port answers; the peers' transport says the rest
    options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if parts.password is None and os.environ.get(REDIS_PASSWORD_ENV):
        options["password"] = os.environ[REDIS_PASSWORD_ENV]  # as the peers' transport does
    try:
        client = redis.Redis.from_url(redis_client_url(url), **options)  # ?swarm= is ours, not redis-py's
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - authentication, TLS, a server that is not Redis: all stop the peers
        return f"cannot reach Redis at {shown}: {reason(exc)}"
    return None

_SWARM_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_FIRST_DELAY = 0.05  # seconds before the first retry; doubled after each failure...
_MAX_DELAY = 1.0  # ...up to this
# The `sender` and `round` fields and the field names of an entry: a message is at most max_message_bytes plus this.
_MAX_HINT_BYTES = 4 * MAX_HINT_CHARS + 64
_OUTAGE_ATTEMPTS = 2  # attempts per call while the server is known to be down (the second after a fresh connect)
# A publish asks for an id of the server's clock (`XADD key <ms>-*`, Redis 7), so that it never gets one far in the
# future. When the stream's last id is ahead of the clock (someone added an entry with an explicit id), it follows
# that id if it is at most _FUTURE_ID_MS ahead; beyond that (up to the largest possible id, with which no XADD * works
# again), it first deletes the entries beyond the horizon, at most _REPAIR_PAGES pages of _REPAIR_PAGE a time, and
# moves the stream's last id back (XSETID). No honest publish ever got such an id, so none of theirs is deleted.
# Without `<ms>-*` (a user without +time, or Redis before 7.0) publishes use XADD *, which follows a far-future id;
# the publish whose XADD * fails (the last id is the largest possible) makes the same repair, then sends
# (`_add_unguarded`).
_FUTURE_ID_MS = 86_400_000
_REPAIR_PAGE = 16
_REPAIR_PAGES = 16
_ADD_ATTEMPTS = 4  # ids asked for per publish (a racing writer may move the last id on between two of them)
_EXHAUSTED = ("exhausted the last possible id", "equal or smaller than the target stream top item")
_NO_PARTIAL_IDS = "invalid stream id"  # Redis before 7.0 has no `<ms>-*`: then XADD *, unguarded


def _text_hint(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value[: MAX_HINT_CHARS * 4].decode("utf-8", errors="replace")
    return str(value)[:MAX_HINT_CHARS]


def _int_hint(value) -> int | None:
    if isinstance(value, bytes) and 0 < len(value) <= 20 and value.isdigit():
        return int(value)
    return None


def _entry_id(value) -> tuple[int, int] | None:
    """A stream id `ms-seq` as a comparable pair, or None when it is not one."""
    try:
        text = value.decode("ascii") if isinstance(value, bytes) else str(value)
        ms, seq = text.split("-")
        return int(ms), int(seq)
    except (UnicodeDecodeError, ValueError):
        return None


def _entry_bytes(fields) -> int:
    """What one stream entry cost to receive: the lengths of all its field names and values."""
    if not isinstance(fields, dict):
        return 0
    return sum(len(k) + len(v) for k, v in fields.items() if isinstance(k, bytes) and isinstance(v, bytes))


class RedisTransport(Transport):
    """Redis Streams: one stream `ftis:<swarm>`, XADD to publish, XREAD from the last seen id to poll.

    A new instance starts reading at the beginning of the retained stream, so a peer that joins late sees the
    recent messages. The stream is trimmed at each XADD to about `max_stream_len` entries (approximate trimming
    removes whole internal nodes, so it can exceed the bound by up to the server's `stream-node-max-entries`,
    100 by default).

    One poll reads at most `max_batch` entries and, once it holds one, no further XREAD after `max_poll_bytes`
    bytes: each XREAD asks for at most as many entries as the remaining byte budget holds messages of
    `max_message_bytes` (at least one). Redis sends entries whole, so a hostile entry larger than
    `max_message_bytes` is downloaded before it is dropped: the server's `proto-max-bulk-len` (512 MB by default)
    bounds one field.

    Faults: every call has a socket timeout. A healthy transport retries connection failures with exponential
    backoff (50 ms doubling to 1 s) until `connect_timeout` seconds (10; `?connect_timeout=SECONDS` in the URL sets
    it) have passed, then raises TransportError and
    logs, once, that the server is unreachable; while it stays unreachable each call makes at most two quick
    attempts, so a run is not slowed by `connect_timeout` per call, and the first call that gets through logs the
    recovery. A server restarted without its data is picked up again: new entries get larger ids, and a publish
    whose id is smaller than the last one read (the stream was recreated with older ids) makes the next poll
    re-read the stream from its start. A publish that times out after it was sent is not retried (it may have
    arrived); one retried after a dropped connection may, rarely, arrive twice. If the server stops answering in
    the middle of a call, that call can take up to `socket_timeout` longer than its own deadline (the socket
    timeout is what bounds it): keep `socket_timeout` short.
    """

    retries = True  # `publish(..., patience=)` bounds a publish's retries below `connect_timeout`

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
        max_poll_bytes: int | None = None,
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
        self._set_bounds(max_message_bytes=max_message_bytes, max_batch=max_batch, max_poll_bytes=max_poll_bytes)
        self.max_stream_len = positive_number("max_stream_len", max_stream_len, integer=True)
        self.connect_timeout = positive_number("connect_timeout", connect_timeout)
        self.socket_timeout = positive_number("socket_timeout", socket_timeout)
        self.page_size = positive_number("page_size", page_size, integer=True)

        # ?swarm=NAME and ?connect_timeout=SECONDS are ours; every other query parameter is for redis-py (e.g.
        # ssl_cert_reqs).
        query = parse_qsl(parts.query, keep_blank_values=True)
        url_timeouts = [v for k, v in query if k == "connect_timeout"]
        if url_timeouts:
            try:
                self.connect_timeout = positive_number("connect_timeout", float(url_timeouts[-1]))
            except ValueError:
                raise ValueError(
                    f"connect_timeout in {self.url} must be a number of seconds > 0, got {url_timeouts[-1]!r}"
                ) from None
        url_swarms = [v for k, v in query if k == "swarm"]
        if len(set(url_swarms)) > 1 or (url_swarms and swarm is not None and url_swarms[0] != swarm):
            raise ValueError(f"conflicting swarm names in {self.url} and the swarm option")
        self.swarm = swarm if swarm is not None else (url_swarms[0] if url_swarms else "default")
        if not isinstance(self.swarm, str) or not _SWARM_RE.match(self.swarm):
            raise ValueError(f"swarm name must match {_SWARM_RE.pattern}, got {self.swarm!r}")
        self.key = f"ftis:{self.swarm}"
        client_url = redis_client_url(url)

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
        options = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": min(self.socket_timeout, self.connect_timeout),
            "retry": Retry(NoBackoff(), 0),  # redis-py's own retries would overrun our deadline
            "decode_responses": False,
        }
        if parts.password is None and os.environ.get(REDIS_PASSWORD_ENV):
            # The password from the environment: it never appears on a command line (`ps`) or in a URL.
            self._password = options["password"] = os.environ[REDIS_PASSWORD_ENV]
        options.update(client_options or {})
        try:
            self._client = redis.Redis.from_url(client_url, **options)
        except (ValueError, TypeError) as exc:
            raise TransportError(f"invalid redis URL or options for {self.url}: {self._scrub(exc)}") from None
        self._last_id = b"0-0"  # from the start of the retained stream: late joiners see recent messages
        self._buffer: deque[Envelope] = deque()  # entries that wait() fetched, returned by the next poll()
        self._own: deque[tuple[str, int, bytes]] = deque(maxlen=self.max_stream_len)  # for prune
        self._down_since: float | None = None  # monotonic time the current outage was noticed, None when up
        self.outages = 0  # how many times the server became unreachable after it had answered
        self.repairs = 0  # how many times a publish found ids beyond the horizon and repaired them (`_repair_ids`)
        self._partial_ids = True  # `XADD key <ms>-*` works (Redis 7); set False when the server says it does not
        self._server_clock = True  # this user may run TIME; set False when the server refuses it
        self._ever_up = False
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

    # -- outages

    def _down(self, what: str, exc: BaseException) -> None:
        """Note a failure that outlived its retries: logged once per outage, at debug level after that."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            if not self._ever_up:  # the constructor's PING: the TransportError it raises says it all
                return
            self.outages += 1
            logger.warning(
                "Redis at %s (%s) is unreachable (%s during %s). Publishing and polling fail until it is back; "
                "every call tries again. Its recovery will be logged.",
                self._where,
                self.url,
                self._scrub(exc),
                what,
            )
        else:
            logger.debug("redis %s on %s still failing: %s", what, self.url, self._scrub(exc))

    def _up(self) -> None:
        self._ever_up = True
        if self._down_since is not None:
            logger.warning(
                "Redis at %s (%s) is reachable again after %.1f s. Messages sent during the outage (and, if the "
                "server restarted without persistence, everything it held) may be lost.",
                self._where,
                self.url,
                time.monotonic() - self._down_since,
            )
            self._down_since = None

    def _call(self, what: str, fn, *, retry_timeouts: bool = True, patience: float | None = None):
        """Run one redis call, retrying transient failures with backoff until `connect_timeout` (or `patience`, when
        shorter) has passed.

        While the server is known to be down (an earlier call ran out of retries), only `_OUTAGE_ATTEMPTS` quick
        attempts: every call still reconnects, none waits `connect_timeout` again.
        """
        start = time.monotonic()
        deadline = start + (self.connect_timeout if patience is None else min(self.connect_timeout, patience))
        delay = _FIRST_DELAY
        attempts = 0
        while True:
            attempts += 1
            try:
                result = fn()
            except self._fatal as exc:
                raise TransportError(f"redis {what} on {self.url} failed: {self._scrub(exc)}") from None
            except self._transient as exc:
                remaining = deadline - time.monotonic()
                give_up = remaining <= 0 or (not retry_timeouts and isinstance(exc, self._redis.TimeoutError))
                if self._down_since is not None and attempts >= _OUTAGE_ATTEMPTS:
                    give_up = True
                if give_up:
                    self._down(what, exc)
                    # `from None`: the chained exception would repeat details we already summarise (and scrub).
                    raise TransportError(
                        f"cannot reach redis at {self._where} ({self.url}) for {what}: {attempts} attempt(s) in "
                        f"{time.monotonic() - start:.1f}s, last error {self._scrub(exc)}"
                    ) from None
                time.sleep(max(0.0, min(delay, remaining)))
                delay = min(delay * 2, _MAX_DELAY)
            else:
                self._up()
                return result

    # -- reading

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
        # Every field was read, not only `data`: the round budget is charged all of it (a 150 MiB `sender` field
        # used to cost 12 bytes), and an entry larger than a message and its hints is refused as too large.
        size = _entry_bytes(fields)
        if size > self.max_message_bytes + _MAX_HINT_BYTES:
            return Envelope(b"", source, sender_hint, round_hint, size, TOO_LARGE)
        if not isinstance(data, bytes):
            return Envelope(b"", source, sender_hint, round_hint, size, MALFORMED)
        # Redis has already sent it (a stream field cannot be sized before reading): one too large is dropped now.
        envelope = self._received(data, source, sender_hint, round_hint)
        envelope.size = max(envelope.size, size)
        return envelope

    def _take(self, response) -> tuple[list[Envelope], int]:
        """The envelopes of an XREAD reply and the bytes it carried; advances the read cursor."""
        out, received = [], 0
        for entry_id, fields in self._entries(response):
            self._last_id = entry_id
            received += _entry_bytes(fields)
            out.append(self._envelope(entry_id, fields))
        return out, received

    def _publish(self, data: bytes, *, sender: str, round: int, patience: float | None = None) -> None:
        fields = {"sender": sender, "round": str(round), "data": data}
        entry_id = self._call("XADD", lambda: self._add(fields), retry_timeouts=False, patience=patience)
        self._own.append((sender, round, entry_id))
        new, last = _entry_id(entry_id), _entry_id(self._last_id)
        if new is not None and last is not None and new < last:
            # XADD always gives an id above every entry of the stream, so ours being below the last id we read means
            # the stream we read is gone (a restarted server, a deleted key), or an entry we read was beyond the
            # horizon and repaired away: read the stream again from its start.
            logger.warning(
                "The redis stream %s on %s was recreated or repaired (new ids are older than the last one read); "
                "reading it again from its start.",
                self.key,
                self.url,
            )
            self._last_id = b"0-0"

    def _add(self, fields):
        """XADD `fields` with an id no more than `_FUTURE_ID_MS` ahead of the server's clock: the clock's own
        millisecond when the stream's last id is behind it, else the last id's (or the next) millisecond when that is
        within the horizon; beyond it, the far-future entries are deleted first ([`_repair_ids`])."""
        if not self._partial_ids:
            return self._add_unguarded(fields)
        for _ in range(_ADD_ATTEMPTS):
            try:
                now = self._server_ms()
            except self._redis.exceptions.NoPermissionError:
                self._server_clock = False
                return self._unguarded(fields, "may not run TIME")
            try:
                return self._xadd(fields, f"{now}-*")
            except self._redis.ResponseError as exc:
                text = str(exc).lower()
                if _NO_PARTIAL_IDS in text:
                    return self._unguarded(fields, "has no `XADD <ms>-*` (Redis before 7.0)")
                if not any(part in text for part in _EXHAUSTED):
                    raise
            try:
                top = self._last_ms()
            except self._redis.exceptions.NoPermissionError:
                return self._unguarded(fields, "may not run XINFO STREAM")
            if top > now + _FUTURE_ID_MS:
                self._repair_ids(now, "the server's clock")
                continue
            for ms in (top, top + 1):  # the last id's millisecond, or the next when its sequence numbers ran out
                if ms > now + _FUTURE_ID_MS:
                    break
                try:
                    return self._xadd(fields, f"{ms}-*")
                except self._redis.ResponseError as exc:
                    if not any(part in str(exc).lower() for part in _EXHAUSTED):
                        raise
        raise TransportError(
            f"the redis stream {self.key} on {self.url}: no id within a day of the server's clock after "
            f"{_ADD_ATTEMPTS} tries (another writer keeps moving the stream's last id); this message was not sent"
        )

    def _unguarded(self, fields, why: str):
        """Publish with XADD * from now on, saying once why: this server or user cannot keep ids near its clock."""
        self._partial_ids = False
        logger.warning(
            "The redis server at %s %s: publishing with XADD *, whose ids anyone who may XADD can push into the "
            "future (give the user +time and +xinfo|stream on Redis 7: docs/security.md). A publish that finds the "
            "stream's ids exhausted deletes the entries more than a day ahead of %s and goes on.",
            self.url,
            why,
            "the server's clock" if self._server_clock else "this host's clock",
        )
        return self._add_unguarded(fields)

    def _add_unguarded(self, fields):
        """XADD `fields` with id `*`. The server gives its clock's millisecond, or follows the stream's last id when
        that is ahead, however far; XADD * fails only once that id is the largest possible. Then the entries beyond
        the horizon are deleted and the last id moved back ([`_repair_ids`]), and it tries again."""
        for _ in range(_ADD_ATTEMPTS):
            try:
                return self._xadd(fields, "*")
            except self._redis.ResponseError as exc:
                if not any(part in str(exc).lower() for part in _EXHAUSTED):
                    raise
            self._repair_ids(*self._horizon_clock())
        raise TransportError(
            f"the redis stream {self.key} on {self.url}: its last id was the largest possible after {_ADD_ATTEMPTS} "
            "repairs (another writer keeps adding entries with it); this message was not sent"
        )

    def _horizon_clock(self) -> tuple[int, str]:
        """(now in ms, whose clock) for the repair of the XADD * path: the server's (TIME) when this user may run it
        (Redis before 7.0), else this host's. Not the stream's own ids: any member may choose those, so they cannot
        tell which entries are far ahead. Honest XADD * ids come from the server's clock, so with the hosts' clocks
        within a day of the server's (NTP), the repair deletes only entries a member put beyond the horizon and any
        that XADD * put after them (they got ids as far ahead). It runs only once XADD * failed, never because a
        host's clock is off."""
        if self._server_clock:
            try:
                return self._server_ms(), "the server's clock"
            except self._redis.exceptions.NoPermissionError:
                self._server_clock = False
        return time.time_ns() // 1_000_000, "this host's clock"

    def _xadd(self, fields, entry_id: str):
        return self._client.xadd(self.key, fields, id=entry_id, maxlen=self.max_stream_len, approximate=True)

    def _server_ms(self) -> int:
        seconds, microseconds = self._client.time()
        return int(seconds) * 1000 + int(microseconds) // 1000

    def _last_ms(self) -> int:
        """The millisecond part of the stream's last generated id (what XADD compares with)."""
        info = self._client.xinfo_stream(self.key)
        parsed = _entry_id(info.get("last-generated-id", info.get(b"last-generated-id", b"0-0")))
        return parsed[0] if parsed is not None else 0

    def _repair_ids(self, now: int, clock: str) -> None:
        """Make publishing work again on a stream whose last id was pushed more than `_FUTURE_ID_MS` past `clock`
        (`now`, in ms; the server's, or this host's on the XADD * path: [`_horizon_clock`]), up to the largest possible
        one: delete the entries beyond that horizon (no honest publish gets such an id: [`_add`]), then move the
        stream's last id back to its newest remaining entry (XSETID). Bounded: at most `_REPAIR_PAGES * _REPAIR_PAGE`
        entries are read; when more remain, the last id stays where it is and this publish fails (TransportError),
        the next one going on. Readers whose cursor passed such an entry read the stream again from its start after
        their next publish (see `_publish`). A user that may not run XREVRANGE, XDEL or XSETID cannot repair: the
        publish fails with a TransportError that names them."""
        try:
            self._repair_ids_as_allowed(now, clock)
        except self._redis.exceptions.NoPermissionError as exc:
            raise TransportError(
                f"the redis stream {self.key} on {self.url} has ids more than a day ahead of {clock} (a member added "
                f"an entry with such an id) and this user may not repair it ({self._scrub(exc)}): give it +xrevrange, "
                "+xdel and +xsetid (docs/security.md); this message was not sent"
            ) from None

    def _repair_ids_as_allowed(self, now: int, clock: str) -> None:
        horizon = now + _FUTURE_ID_MS

        def far_ahead(entry_id) -> bool:
            return (_entry_id(entry_id) or (0, 0))[0] > horizon

        deleted = 0
        for _ in range(_REPAIR_PAGES):
            page = self._client.xrevrange(self.key, "+", "-", count=_REPAIR_PAGE)
            future = [entry_id for entry_id, _ in page if far_ahead(entry_id)]
            if future:
                deleted += self._client.xdel(self.key, *future)
            if len(future) < len(page) or not page:
                break
        self.repairs += 1
        newest = self._client.xrevrange(self.key, "+", "-", count=1)
        if newest and far_ahead(newest[0][0]):
            # More than one repair's worth: moving the last id back to such an entry would leave it beyond the
            # horizon. This publish fails; the next one goes on.
            raise TransportError(
                f"the redis stream {self.key} on {self.url} has entries with ids more than a day in the future (ahead "
                f"of {clock}); this publish deleted {deleted} of them, and the next one deletes more"
            )
        last = newest[0][0] if newest else b"0-1"
        self._client.execute_command("XSETID", self.key, last)
        logger.warning(
            "The redis stream %s on %s had ids more than a day ahead of %s: %d such entries were deleted and its "
            "last id moved back to %s.",
            self.key,
            self.url,
            clock,
            deleted,
            last.decode("ascii", "replace") if isinstance(last, bytes) else last,
        )

    def _page_count(self, room_bytes: int, room_entries: int) -> int:
        """Entries to ask one XREAD for: no more than the remaining byte budget holds messages (at least one)."""
        return max(1, min(self.page_size, room_entries, room_bytes // self.max_message_bytes))

    def _poll(self) -> list[Envelope]:
        out: list[Envelope] = []
        received = 0
        while self._buffer and len(out) < self.max_batch:
            envelope = self._buffer.popleft()
            received += envelope.size
            out.append(envelope)
        while len(out) < self.max_batch and not (out and received >= self.max_poll_bytes):
            count = self._page_count(self.max_poll_bytes - received, self.max_batch - len(out))
            try:
                # No BLOCK argument: returns at once.
                response = self._call(
                    "XREAD", lambda count=count: self._client.xread({self.key: self._last_id}, count=count)
                )
            except TransportError:
                if out:  # already taken off the stream (or wait()'s buffer): hand them over, fail next time
                    return out
                raise
            page, size = self._take(response)
            out.extend(page)
            received += size
            if len(page) < count:
                break
        return out

    def _wait(self, timeout: float) -> bool:
        if self._buffer:
            return True
        deadline = time.monotonic() + timeout
        # Block in chunks well below the socket timeout, so the socket never times out under a healthy BLOCK.
        chunk = max(0.001, self.socket_timeout / 2)
        delay = _FIRST_DELAY
        while True:
            remaining = deadline - time.monotonic()
            block_ms = int(min(remaining, chunk) * 1000)
            if block_ms < 1:
                return False  # never send BLOCK 0: it means "forever"
            try:
                # COUNT 1: wait() only needs to know that something is there; poll() reads it within its budget.
                response = self._client.xread({self.key: self._last_id}, count=1, block=block_ms)
            except self._fatal as exc:
                raise TransportError(f"redis XREAD on {self.url} failed: {self._scrub(exc)}") from None
            except self._transient as exc:
                # poll() and publish() raise on outages; wait() only promises to return in time (with backoff).
                self._down("XREAD", exc)
                time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 2, _MAX_DELAY)
                continue
            self._up()
            page, _ = self._take(response)
            if page:
                self._buffer.extend(page)
                return True

    def _prune(self, *, sender: str, cutoff: int) -> None:
        """Delete `sender`'s old entries that this instance published (others' entries are never touched).

        Trimming already bounds the stream; pruning just frees memory sooner. Entries from before this instance
        existed are left to trimming.
        """
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
            except Exception as exc:  # noqa: BLE001 - closing must not raise over a broken connection
                logger.debug("closing %s: %s", self.url, self._scrub(exc))


for _scheme, _example in (("redis", "redis://host:6379/0"), ("rediss", "rediss://host:6380/0")):
    register_transport(
        TransportKind(
            scheme=_scheme,
            opener=RedisTransport,
            example=_example,
            packages=(("redis", "trl-ftis[redis]"),),
            probe=reach_problem,
        )
    )
