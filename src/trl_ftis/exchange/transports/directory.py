"""`dir://PATH`: a shared directory, one file per message.

Anyone who can write to the directory is untrusted, so a poll's cost is bounded whatever they put there:

* names are filtered before anything is opened: `*.ftis` files are message candidates; in-flight writes
  (`*.ftis.tmp`) and NFS `.nfs*` files are ignored; everything else is junk, recognised from the name alone (never
  opened or stat'ed), reported once as "unrecognised" (at most `_JUNK_MEMORY` names remembered, at most
  `_JUNK_REPORTS_PER_POLL` reports a poll) and then skipped by a set lookup;
* at most `max_batch` files are opened a poll, and message bytes up to `max_poll_bytes` are read (always at least
  one message); a file is never read beyond its `st_size` and never at all when that is over `max_message_bytes`,
  so a sparse or growing file costs at most the limit, never its apparent size;
* a file shorter than its own 20-byte preamble declares (a writer that does not publish atomically) is left unread
  and looked at again only when its size or mtime changes, for up to `incomplete_timeout` seconds; then it is
  reported once as "incomplete". The declared lengths are only a completeness hint: the wire decoder checks them
  again, with the signature, before it trusts anything.

Faults: a directory deleted while in use is recreated by the next publish or poll (logged once); a directory the
process cannot write makes `publish` raise TransportError while polls go on reading.

A directory that anyone on the machine can write (the "others" write bit, sticky bit or not) is warned about once per
folder and process when a transport opens it: anyone can then put messages in it, which a swarm secret or peer keys
make harmless apart from junk and the poll allowance they use up. Group write is not warned about: a folder shared by
a team is usually group-writable on purpose.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import re
import stat
import threading
import time
import uuid

from ..layout import MAGIC, PREAMBLE
from .base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    INCOMPLETE,
    TOO_LARGE,
    UNREADABLE,
    UNRECOGNISED,
    Envelope,
    Transport,
    TransportError,
    positive_number,
)
from .registry import TransportKind, register_transport

logger = logging.getLogger(__name__)

DIR_PREFIX = "dir://"
"""The shared-directory exchange's URL prefix (lower-case: `registry.normalise_exchange_url` makes it so)."""


def dir_exchange_url(path: str | os.PathLike) -> str:
    """The `dir://` exchange URL of the directory `path` (`dir:///abs/path` for an absolute one)."""
    return f"{DIR_PREFIX}{os.fspath(path)}"


def exchange_directory(url: str) -> str | None:
    """The directory of a `dir://` exchange URL (already normalised: lower-case scheme), as written, `""` when it
    names none; `None` for any other scheme."""
    return url[len(DIR_PREFIX) :] if url.startswith(DIR_PREFIX) else None


def absolute_dir_url(url: str) -> str:
    """A `dir://` URL with its directory made absolute, so that every peer (and the logs) name the same directory
    whatever their working directory; `ValueError` when it names none."""
    directory = exchange_directory(url)
    if not directory:
        raise ValueError("dir:// needs a directory, e.g. dir:///shared/ftis")
    return dir_exchange_url(os.path.abspath(os.path.expanduser(directory)))


_SUFFIX = ".ftis"
_TMP_SUFFIX = ".ftis.tmp"
# round, sender (may contain single dots), uuid4 hex, optional .tmp. Only used to parse hints and for prune.
_NAME_RE = re.compile(r"^(\d{10})\.(.+)\.([0-9a-f]{32})\.ftis(\.tmp)?$", re.DOTALL)
_NO_ROUND = 10**10  # names without a round sort after every round: hand-made names cannot jump the queue

# The wire format's preamble (trl_ftis.exchange.layout) is read only as a completeness hint: magic, version (u16),
# flags (u16), header length (u32), body length (u64), little-endian. Anything after header + body (a signature
# trailer) is not counted: its size depends on flags this module does not interpret.

_JUNK_MEMORY = 256  # names of non-messages remembered (each reported once); beyond that, ignored unreported
_FIRST_POLL_DELAY = 0.005  # seconds before `wait` lists the directory again the first time (then doubling)
# A waiting receiver sleeps at least this many times as long as its last listing took: a folder that keeps growing
# (junk nobody deletes: 300,000 names take 0.4 s to list) costs a waiting round at most ~1/(1+this) of a core.
_LIST_COST_FACTOR = 9
_JUNK_REPORTS_PER_POLL = 32  # so one poll's "unrecognised" reports (and the receiver's log lines) stay few

_OPEN_FLAGS_COMMON = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
# O_NONBLOCK: if a FIFO is swapped in between lstat and open, open must not block waiting for a writer.
_READ_FLAGS = os.O_RDONLY | _OPEN_FLAGS_COMMON | getattr(os, "O_NONBLOCK", 0)
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS_COMMON

# Exchange folders already warned about as writable by anyone (real paths): once per folder and process.
_WRITABLE_WARNED: set[str] = set()
_WRITABLE_WARNED_LOCK = threading.Lock()

_VANISHED = object()  # the file is gone: skip it without remembering the name
_DEFER = object()  # over this poll's budget: look at it again next poll
_CHANGING = -1  # recorded size of a file that changed while it was read: re-read it next poll whatever its stat


class _Pending:
    """A file not yet complete: when it was first seen, and its size and mtime when last looked at."""

    __slots__ = ("first_seen", "mtime_ns", "size")

    def __init__(self, first_seen: float, size: int, mtime_ns: int):
        self.first_seen, self.size, self.mtime_ns = first_seen, size, mtime_ns

    def unchanged(self, st: os.stat_result) -> bool:
        return (st.st_size, st.st_mtime_ns) == (self.size, self.mtime_ns)


class _Incomplete:
    """`_receive`'s answer for a file that is not complete yet (size/mtime: what to compare later polls with)."""

    __slots__ = ("mtime_ns", "size")

    def __init__(self, size: int, mtime_ns: int):
        self.size, self.mtime_ns = size, mtime_ns


class _Budget:
    """What one poll may still spend: files to open, bytes to read (once one message was delivered)."""

    __slots__ = ("bytes_read", "delivered", "files", "max_bytes")

    def __init__(self, files: int, max_bytes: int):
        self.files, self.max_bytes = files, max_bytes
        self.bytes_read = 0
        self.delivered = False


def _warn_if_writable_by_others(path: str) -> None:
    """Log a warning, once per folder and process, when anyone on the machine can write to the folder `path`.

    Only the "others" write bit counts: a sticky bit (mode 1777, like /tmp) stops others deleting files, not adding
    them; group write is left alone (a team's shared folder). A folder that cannot be looked at is not warned about.
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if not mode & stat.S_IWOTH:
        return
    key = os.path.realpath(path)
    with _WRITABLE_WARNED_LOCK:
        if key in _WRITABLE_WARNED:
            return
        _WRITABLE_WARNED.add(key)
    logger.warning(
        "The exchange directory %s is writable by anyone on this machine (mode %s%s): anyone can then write messages "
        "into it. With swarm_secret (or private_key_file and peer_keys_file) set, such messages are refused and only "
        "cost junk files and poll allowance; without them they are accepted as a peer's. Run `chmod o-w %s` (group "
        "write for a team is fine), or set swarm_secret / peer keys.",
        path,
        oct(mode),
        ", the sticky bit does not stop others adding files" if mode & stat.S_ISVTX else "",
        path,
    )


def _ignored_name(name: str) -> bool:
    # In-flight writes (renamed when complete) and NFS "silly rename" files of deleted-but-open files are
    # neither messages nor garbage.
    return name.endswith(_TMP_SUFFIX) or name.startswith(".nfs")


def _hints(name: str) -> tuple[str | None, int | None]:
    match = _NAME_RE.match(name)
    return (match.group(2), int(match.group(1))) if match else (None, None)


def _name_order(name: str) -> tuple[int, str]:
    match = _NAME_RE.match(name)
    return (int(match.group(1)) if match else _NO_ROUND, name)


class DirTransport(Transport):
    """A shared directory: one file per message, written atomically (temporary name, then `os.replace`).

    Readers list the directory, skip anything that is not a regular file (symbolic links are never followed),
    report files over `max_message_bytes` without reading them, report names that are not messages once as
    "unrecognised" without opening them, and wait for files written non-atomically until they are complete (see
    the module docstring for the bounds). `wait` re-lists the directory after 5 ms, then at doubling intervals up to
    every `poll_interval` seconds (no server to notify us).

    Options: `max_batch` (1000): messages returned and files opened per poll, and incomplete files tracked;
    `max_poll_bytes` (4 x `max_message_bytes`): message bytes read per poll, at least one message;
    `incomplete_timeout` (60 s): how long a file shorter than its preamble declares is waited for.
    """

    def __init__(
        self,
        url: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        poll_interval: float = 0.05,
        max_batch: int = 1000,
        max_poll_bytes: int | None = None,
        incomplete_timeout: float = 60.0,
        fsync: bool = False,
    ):
        raw = exchange_directory(url)
        if raw is None:
            raise ValueError(f"not a {DIR_PREFIX} URL: {url!r}")
        if not raw or "\x00" in raw:
            raise ValueError(f"dir:// URL needs a directory path, e.g. dir:///shared/ftis; got {url!r}")
        self.url = url
        # Absolute now, so a later chdir of the process does not move the exchange.
        self.path = os.path.abspath(os.path.expanduser(raw))
        self._set_bounds(max_message_bytes=max_message_bytes, max_batch=max_batch, max_poll_bytes=max_poll_bytes)
        self.poll_interval = positive_number("poll_interval", poll_interval)
        self._list_seconds = 0.0  # how long the last listing in `wait` took (it paces the next one)
        self.incomplete_timeout = positive_number("incomplete_timeout", incomplete_timeout)
        self.fsync = bool(fsync)
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise TransportError(f"the exchange path of {url} exists but is not a directory")
        self.created = not os.path.lexists(self.path)
        """Whether this transport created the exchange directory (it did not exist): said once, since peers that name
        different folders never meet."""
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise TransportError(f"cannot create the exchange directory of {url}: {exc}") from exc
        if self.created:
            logger.info(
                "Created the exchange directory %s (it did not exist): every peer of the swarm must name this same "
                "folder.",
                self.path,
            )
        _warn_if_writable_by_others(self.path)
        # Message names already returned (or deliberately skipped). Forgotten once gone from the directory, so the
        # set never outgrows the directory's message files.
        self._seen: set[str] = set()
        # Names that are not messages, already reported: at most _JUNK_MEMORY of them.
        self._junk: set[str] = set()
        self._junk_full_logged = False
        self._pending: dict[str, _Pending] = {}  # incomplete files, at most max_batch of them
        self.recreated = 0  # how often the directory had vanished and was created again
        self._clock = time.monotonic

    # -- the directory itself

    def _recreate(self, during: str) -> None:
        """Create the exchange directory again after someone deleted it (TransportError if that fails)."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise TransportError(f"the exchange path of {self.url} exists but is no longer a directory")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise TransportError(
                f"the exchange directory of {self.url} is gone and cannot be recreated: {exc}"
            ) from exc
        self.recreated += 1
        log = logger.warning if self.recreated == 1 else logger.debug  # once: someone may keep deleting it
        log(
            "The exchange directory of %s had been deleted (noticed during %s); created it again. Messages that were "
            "in it are lost; later recreations are logged at debug level.",
            self.url,
            during,
        )

    def _list(self) -> list[os.DirEntry]:
        with os.scandir(self.path) as it:
            return list(it)

    def _scan(self, during: str) -> list[os.DirEntry]:
        try:
            return self._list()
        except FileNotFoundError:
            self._recreate(during)
            return []
        except OSError as exc:
            raise TransportError(f"cannot list the exchange directory of {self.url}: {exc}") from exc

    # -- sending

    def _publish(self, data: bytes, *, sender: str, round: int) -> None:
        name = f"{round:010d}.{sender}.{uuid.uuid4().hex}{_SUFFIX}"
        final_path = os.path.join(self.path, name)
        tmp_path = final_path + ".tmp"
        try:
            try:
                fd = os.open(tmp_path, _WRITE_FLAGS, 0o644)
            except FileNotFoundError:  # the directory was deleted under us
                self._recreate("publish")
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

    def _poll(self) -> list[Envelope]:
        entries = self._scan("poll")
        now = self._clock()
        present: set[str] = set()
        fresh: list[os.DirEntry] = []  # message names not seen before
        pending: list[os.DirEntry] = []  # incomplete files seen before
        junk: list[str] = []  # names that are not messages, not reported yet
        for entry in entries:
            name = entry.name
            present.add(name)
            if name in self._seen or _ignored_name(name):
                continue
            if not name.endswith(_SUFFIX):
                if name not in self._junk:
                    junk.append(name)
            elif name in self._pending:
                pending.append(entry)
            else:
                fresh.append(entry)
        self._seen &= present
        self._junk &= present
        for name in self._pending.keys() - present:
            del self._pending[name]

        out: list[Envelope] = []
        work = []  # (order, name, lstat) of the files to open this poll
        # Only the oldest `max_batch` new names are even stat'ed: a flood of names cannot cost more than that.
        window = heapq.nsmallest(self.max_batch, fresh, key=lambda entry: _name_order(entry.name))
        for entry in pending + window:
            name = entry.name
            try:
                st = entry.stat(follow_symlinks=False)  # lstat: a symlink is judged as a link, not its target
            except FileNotFoundError:
                self._pending.pop(name, None)
                continue  # removed since the listing (the sender pruned it)
            except OSError:
                st = None
            known = self._pending.get(name)
            if known is not None and st is not None and known.unchanged(st):
                if now - known.first_seen >= self.incomplete_timeout:
                    out.append(self._give_up(name, st.st_size))
                continue  # nothing new to read in it
            round_key, _ = _name_order(name)
            work.append(((round_key, st.st_mtime_ns if st else 0, name), name, st))
        work.sort(key=lambda item: item[0])

        budget = _Budget(self.max_batch, self.max_poll_bytes)
        for _, name, st in work:
            if len(out) >= self.max_batch:
                break
            result = self._receive(name, st, budget)
            if result is _DEFER:
                break  # the budget is spent; keep the order: everything after it waits for the next poll
            if isinstance(result, _Incomplete):
                envelope = self._incomplete(name, result, now)
                if envelope is not None:
                    out.append(envelope)
                continue
            self._pending.pop(name, None)
            if result is not _VANISHED:
                self._seen.add(name)
            if isinstance(result, Envelope):
                out.append(result)
        out.extend(self._report_junk(junk))
        return out

    def _incomplete(self, name: str, result: _Incomplete, now: float) -> Envelope | None:
        """Track a file that is not complete yet; an "incomplete" envelope once it is given up."""
        known = self._pending.get(name)
        if known is None:
            if len(self._pending) >= self.max_batch:
                return self._give_up(name, max(result.size, 0))  # no room to wait for it: counted, not tracked
            self._pending[name] = _Pending(now, result.size, result.mtime_ns)
            return None
        if now - known.first_seen >= self.incomplete_timeout:
            return self._give_up(name, max(result.size, 0))
        known.size, known.mtime_ns = result.size, result.mtime_ns
        return None

    def _give_up(self, name: str, size: int) -> Envelope:
        self._pending.pop(name, None)
        self._seen.add(name)
        sender_hint, round_hint = _hints(name)
        return Envelope(b"", name, sender_hint, round_hint, size, INCOMPLETE)

    def _report_junk(self, junk: list[str]) -> list[Envelope]:
        if not junk:
            return []
        room = min(_JUNK_MEMORY - len(self._junk), _JUNK_REPORTS_PER_POLL)
        if room <= 0:
            if not self._junk_full_logged:
                self._junk_full_logged = True
                logger.warning(
                    "The exchange directory of %s holds more than %d names that are not messages; the ones beyond "
                    "that are ignored without being reported one by one.",
                    self.url,
                    _JUNK_MEMORY,
                )
            return []
        names = heapq.nsmallest(room, junk)
        self._junk.update(names)
        # Never opened or stat'ed: the name alone says it is not a message (size 0: not looked at).
        return [Envelope(b"", name, None, None, 0, UNRECOGNISED) for name in names]

    def _receive(self, name: str, st: os.stat_result | None, budget: _Budget | None = None):
        """An Envelope, None (skip, remember the name), _VANISHED (skip, the file is gone), an `_Incomplete`
        (not complete yet: look again later) or _DEFER (over `budget`: look again next poll)."""
        if budget is None:
            budget = _Budget(1, self.max_poll_bytes)
        sender_hint, round_hint = _hints(name)
        if st is None:
            return Envelope(b"", name, sender_hint, round_hint, 0, UNREADABLE)
        if not stat.S_ISREG(st.st_mode):
            return None  # symlinks, directories, FIFOs...: never followed or read
        if st.st_size > self.max_message_bytes:
            return Envelope(b"", name, sender_hint, round_hint, st.st_size, TOO_LARGE)
        if budget.files <= 0:
            return _DEFER
        budget.files -= 1
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
                size = fst.st_size
                if size > self.max_message_bytes:
                    return Envelope(b"", name, sender_hint, round_hint, size, TOO_LARGE)
                head = f.read(min(size, PREAMBLE.size))
                budget.bytes_read += len(head)
                declared = self._declared_size(head)
                if declared is not None and declared > self.max_message_bytes:  # it says so itself: not read
                    return Envelope(b"", name, sender_hint, round_hint, size, TOO_LARGE)
                if declared is None or size < declared:
                    return _Incomplete(size, fst.st_mtime_ns)
                if budget.delivered and budget.bytes_read + size - len(head) > budget.max_bytes:
                    return _DEFER
                # Never more than fstat's size (<= max_message_bytes), whatever the file does meanwhile.
                data = head + f.read(size - len(head))
                budget.bytes_read += len(data) - len(head)
                after = os.fstat(f.fileno())
                if (after.st_size, after.st_mtime_ns) != (size, fst.st_mtime_ns):
                    return _Incomplete(_CHANGING, 0)  # written to while we read it: read it again next time
        except OSError:
            return Envelope(b"", name, sender_hint, round_hint, st.st_size, UNREADABLE)
        budget.delivered = True
        return Envelope(data, name, sender_hint, round_hint, len(data))

    @staticmethod
    def _declared_size(head: bytes) -> int | None:
        """The size the file's preamble promises at least (0: unknown, read it as it is), or None: not written yet.

        Only a hint for "is it complete?": a file that does not start like a message is delivered as it is (the
        decoder refuses it); an empty file, or one that is still a prefix of the magic or of the preamble, is a
        file still being written.
        """
        if not head:
            return None  # created, nothing written yet
        if head[: len(MAGIC)] != MAGIC[: len(head)]:
            return 0  # not a trl-ftis message: complete as far as the transport can tell
        if len(head) < PREAMBLE.size:
            return None
        _, _, _, header_length, body_length = PREAMBLE.unpack(head)
        return PREAMBLE.size + header_length + body_length  # Python ints: a 2**64 claim cannot wrap

    def _has_new(self) -> bool:
        started = time.monotonic()
        try:
            entries = self._list()
            self._list_seconds = time.monotonic() - started
        except OSError:
            return False  # poll() reports (and repairs) the problem; wait() only promises to return in time
        now = self._clock()
        for entry in entries:
            name = entry.name
            if name in self._seen or not name.endswith(_SUFFIX) or _ignored_name(name):
                continue  # junk never wakes the receiver: it is reported by the next poll that runs anyway
            known = self._pending.get(name)
            if known is None:
                return True
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                return True  # gone or unreadable: poll() sorts it out
            if not known.unchanged(st) or now - known.first_seen >= self.incomplete_timeout:
                return True
        return False

    def _wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        # The first looks come quickly (a peer in the sync mode publishes within milliseconds), later ones every
        # `poll_interval`: 5, 10, 20, 40 ms, then 50 ms (the default), so a long wait lists no more often than before.
        delay = min(_FIRST_POLL_DELAY, self.poll_interval)
        while True:
            if self._has_new():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(max(delay, _LIST_COST_FACTOR * self._list_seconds), remaining))
            delay = min(2 * delay, self.poll_interval)

    def _prune(self, *, sender: str, cutoff: int) -> None:
        try:
            entries = self._list()
        except FileNotFoundError:
            return  # nothing left to prune; the next publish or poll creates the directory again
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


register_transport(
    TransportKind(
        scheme="dir",
        opener=DirTransport,
        example="dir:///shared/ftis",
        folder=exchange_directory,
        absolute=absolute_dir_url,
    )
)
