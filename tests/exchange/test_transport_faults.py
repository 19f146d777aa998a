"""Transports under hostile writers and operator faults: bounded polls, junk names, files written non-atomically,
a deleted or read-only exchange directory, a Redis server restarted mid-run, a stream flooded with huge entries.

The checks are structural (which files were opened or stat'ed, how many bytes were read, what each poll returned),
not timings. Redis tests start their own throwaway servers (tests/redis_server.py) and are skipped with the reason
when none can start.
"""

import ast
import inspect
import logging
import os
import struct
import sys
import time
import uuid

import pytest

from trl_ftis.exchange import layout
from trl_ftis.exchange.transports import DirTransport, TransportError, open_transport
from trl_ftis.exchange.transports import directory as directory_module

try:  # tests/ is on sys.path in pytest's default (prepend) import mode; be robust to the others too
    from redis_server import RedisServerUnavailable, start_redis_server
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from redis_server import RedisServerUnavailable, start_redis_server
from waits import returns_within  # tests/ is on sys.path


def _name(round, sender="alice"):
    return f"{round:010d}.{sender}.{uuid.uuid4().hex}.ftis"


def _message(header: bytes = b'{"x": 1}', body: bytes = b"b" * 200, trailer: bytes = b"") -> bytes:
    """Bytes that start like a trl-ftis message: the wire preamble declaring `header` and `body`."""
    return struct.pack("<4sHHIQ", b"FTIS", 1, 0, len(header), len(body)) + header + body + trailer


class _SpyEntry:
    """A DirEntry that records its stat() calls."""

    def __init__(self, entry, log):
        self._entry, self._log = entry, log
        self.name, self.path = entry.name, entry.path

    def stat(self, *, follow_symlinks=True):
        self._log.append(self.name)
        return self._entry.stat(follow_symlinks=follow_symlinks)


@pytest.fixture
def spy(monkeypatch):
    """spy(transport) -> (opened, stated, read): names passed to os.open, names stat'ed, bytes read from files."""

    def install(transport):
        opened, stated, read = [], [], []
        real_open, real_fdopen, real_list = os.open, os.fdopen, transport._list

        def counting_open(path, *args, **kwargs):
            opened.append(os.path.basename(os.fspath(path)))
            return real_open(path, *args, **kwargs)

        class CountingFile:
            def __init__(self, f):
                self._f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self._f.__exit__(*exc)

            def fileno(self):
                return self._f.fileno()

            def read(self, n=-1):
                data = self._f.read(n)
                read.append(len(data))
                return data

        def counting_fdopen(fd, mode="r", *args, **kwargs):
            f = real_fdopen(fd, mode, *args, **kwargs)
            return CountingFile(f) if "r" in mode else f

        monkeypatch.setattr(os, "open", counting_open)
        monkeypatch.setattr(os, "fdopen", counting_fdopen)
        monkeypatch.setattr(transport, "_list", lambda: [_SpyEntry(e, stated) for e in real_list()])
        return opened, stated, read

    return install


def test_the_preamble_the_transport_reads_is_the_wire_formats():
    # The directory transport reads the preamble only as a completeness hint, from the layout (not the codec).
    assert directory_module.MAGIC is layout.MAGIC
    assert directory_module.PREAMBLE is layout.PREAMBLE and layout.PREAMBLE.size == layout.PREAMBLE_SIZE == 20
    imports = [n for n in ast.walk(ast.parse(inspect.getsource(directory_module))) if isinstance(n, ast.ImportFrom)]
    assert not [n.module for n in imports if (n.module or "").endswith("wire")]


# ---------------------------------------------------------------------------------------------------------------
# dir://: what a hostile writer can make a reader spend


def test_dir_sparse_terabyte_file_is_refused_from_its_size_without_opening_it(tmp_path, spy):
    t = DirTransport(f"dir://{tmp_path / 'ex'}")  # default limit, 256 MiB
    huge = _name(1, "mallory")
    with open(tmp_path / "ex" / huge, "wb") as f:
        f.truncate(2**40)  # 1 TB apparent size, no blocks
    t.publish(_message(), sender="alice", round=2)
    opened, _, read = spy(t)
    big, honest = t.poll()
    assert (big.source, big.error, big.size, big.data) == (huge, "too_large", 2**40, b"")
    assert honest.error is None and honest.data == _message()
    assert huge not in opened
    assert sum(read) == len(_message())
    assert t.poll() == []


def test_dir_file_growing_after_listing_costs_at_most_its_listed_size(tmp_path, spy, monkeypatch):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}", max_message_bytes=10_000)
    name = _name(1, "mallory")
    (ex / name).write_bytes(_message(body=b"x" * 100))
    _, _, read = spy(t)
    real_fstat = os.fstat
    grown = []

    def fstat_then_grow(fd):
        st = real_fstat(fd)
        if not grown:  # the writer makes it sparse-huge right after we looked at it
            grown.append(True)
            os.truncate(ex / name, 2**40)
        return st

    monkeypatch.setattr(os, "fstat", fstat_then_grow)
    assert t.poll() == []  # changed while read: not delivered, looked at again later
    assert sum(read) <= len(_message(body=b"x" * 100))  # never more than fstat's size
    monkeypatch.setattr(os, "fstat", real_fstat)
    (envelope,) = t.poll()
    assert (envelope.error, envelope.size) == ("too_large", 2**40)
    assert sum(read) <= len(_message(body=b"x" * 100))
    assert t.poll() == []


def test_dir_file_declaring_more_than_the_limit_is_refused_after_its_preamble(tmp_path, spy):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}", max_message_bytes=1000)
    name = _name(1, "mallory")
    (ex / name).write_bytes(struct.pack("<4sHHIQ", b"FTIS", 1, 0, 2, 2**60) + b"{}" + b"z" * 500)
    _, _, read = spy(t)
    (envelope,) = t.poll()
    assert envelope.error == "too_large"
    assert sum(read) == 20  # the preamble only


def test_dir_poll_opens_at_most_max_batch_files_and_reads_at_most_max_poll_bytes(tmp_path, spy):
    ex = tmp_path / "ex"
    writer = DirTransport(f"dir://{ex}")
    for r in range(10):
        writer.publish(_message(body=bytes([r]) * 100), sender="alice", round=r)
    size = len(_message(body=b"x" * 100))
    t = DirTransport(f"dir://{ex}", max_batch=3, max_poll_bytes=2 * size)
    opened, stated, read = spy(t)
    first = t.poll()
    assert [e.round_hint for e in first] == [0, 1]  # the byte budget stops it before the batch does
    assert len(opened) <= 3 and len(stated) <= 3 and sum(read) <= 2 * size + 20
    rounds = [e.round_hint for e in first]
    while True:
        for log in (opened, stated, read):
            log.clear()
        envelopes = t.poll()
        assert len(opened) <= 3 and len(stated) <= 3 and sum(read) <= 2 * size + 20
        if not envelopes:
            break
        rounds += [e.round_hint for e in envelopes]
    assert rounds == list(range(10))  # each once, oldest first


def test_dir_junk_names_never_starve_an_honest_message_and_are_not_looked_at_twice(tmp_path, spy, caplog):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    # The old reader took the first 1,000 names of a sorted listing each poll, junk included: 100,000 junk names
    # held an honest message back for 100 polls.
    for i in range(100_000):
        os.close(os.open(ex / f"junk-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    for i in range(50):  # names sorting before every message name, and in-flight writes
        (ex / f"-{i}").write_bytes(b"")
        (ex / (_name(0, "mallory") + ".tmp")).write_bytes(b"")
    t.publish(_message(), sender="alice", round=7)
    opened, stated, _ = spy(t)
    caplog.set_level(logging.WARNING, logger="trl_ftis.exchange.transports")

    first = t.poll()
    messages = [e for e in first if e.error is None]
    junk = [e for e in first if e.error == "unrecognised"]
    assert [(e.sender_hint, e.round_hint, e.data) for e in messages] == [("alice", 7, _message())]
    assert len(junk) == directory_module._JUNK_REPORTS_PER_POLL  # reported in bounded numbers, never opened
    assert all(e.size == 0 and e.data == b"" for e in junk)
    assert len(opened) == 1 and len(stated) == 1  # only the honest message was looked at
    assert t.wait(0.05) is False  # junk does not wake the receiver

    reported = {e.source for e in junk}
    for _ in range(directory_module._JUNK_MEMORY // directory_module._JUNK_REPORTS_PER_POLL + 2):
        envelopes = t.poll()
        assert all(e.error == "unrecognised" for e in envelopes)
        assert not reported & {e.source for e in envelopes}  # each reported once
        reported |= {e.source for e in envelopes}
    assert len(reported) == len(t._junk) == directory_module._JUNK_MEMORY  # bounded memory
    assert opened == stated == [messages[0].source]  # in all these polls, only the honest message was looked at
    full = [r for r in caplog.records if "names that are not messages" in r.getMessage()]
    assert len(full) == 1  # logged once, when the memory filled up

    t.publish(_message(body=b"late"), sender="bob", round=8)  # still found among the junk, first poll
    (late,) = t.poll()
    assert late.sender_hint == "bob" and late.data == _message(body=b"late")


def test_dir_file_written_in_two_halves_is_delivered_once_when_complete(tmp_path, spy):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    data = _message()
    for cut in (len(data) // 2, 10, 0):  # in the body, inside the preamble, nothing written yet
        name = _name(3, f"slow{cut}")
        with open(ex / name, "wb") as f:  # not atomic: the final name, written in two steps
            f.write(data[:cut])
            f.flush()
            assert t.poll() == []  # incomplete: left unread
            assert t.poll() == []
            assert t.wait(0.05) is False  # and it does not keep waking the receiver
            f.write(data[cut:])
        assert t.wait(1.0) is True
        (envelope,) = t.poll()
        assert (envelope.source, envelope.data, envelope.error) == (name, data, None)
        assert t.poll() == []  # exactly once
    assert t._pending == {}


def test_dir_file_that_never_completes_is_reported_once_as_incomplete(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}", incomplete_timeout=30)
    clock = [1000.0]
    t._clock = lambda: clock[0]
    name = _name(1, "stuck")
    (ex / name).write_bytes(_message()[:50])
    assert t.poll() == []
    clock[0] += 29
    assert t.poll() == []
    clock[0] += 2
    (envelope,) = t.poll()
    assert (envelope.source, envelope.error, envelope.size, envelope.sender_hint) == (name, "incomplete", 50, "stuck")
    assert t.poll() == []
    with open(ex / name, "ab") as f:  # completed too late: given up on, not delivered
        f.write(_message()[50:])
    assert t.poll() == []


def test_dir_incomplete_files_are_tracked_in_bounded_numbers(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}", max_batch=2)
    for r in range(3):
        (ex / _name(r, "stuck")).write_bytes(b"FTIS")
    assert t.poll() == []
    assert len(t._pending) == 2
    (envelope,) = t.poll()  # the third: no room to wait for it, so it is given up on at once
    assert envelope.error == "incomplete" and envelope.round_hint == 2
    assert len(t._pending) == 2


def test_dir_files_that_are_not_messages_are_delivered_at_once_for_the_decoder_to_refuse(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    (ex / _name(1, "noise")).write_bytes(b"not a message at all")
    (ex / "hand-made.ftis").write_bytes(b"\x00garbage")
    assert sorted(e.data for e in t.poll()) == [b"\x00garbage", b"not a message at all"]


# ---------------------------------------------------------------------------------------------------------------
# dir://: operator faults


def test_dir_deleted_exchange_directory_is_recreated_and_the_peer_keeps_exchanging(tmp_path, caplog):
    ex = tmp_path / "ex"
    alice, bob = DirTransport(f"dir://{ex}"), DirTransport(f"dir://{ex}")
    alice.publish(b"before", sender="alice", round=0)
    assert [e.data for e in bob.poll()] == [b"before"]
    caplog.set_level(logging.WARNING, logger="trl_ftis.exchange.transports")

    for deleted in range(3):
        for path in ex.iterdir():
            path.unlink()
        ex.rmdir()
        assert bob.poll() == []  # poll recreates it
        assert ex.is_dir()
        assert bob.wait(0.01) is False
        ex.rmdir()
        alice.publish(b"after %d" % deleted, sender="alice", round=deleted + 1)  # and so does publish
        alice.prune(sender="alice", keep_rounds=5, current_round=deleted + 1)
        assert [e.data for e in bob.poll()] == [b"after %d" % deleted]
    warnings = [r for r in caplog.records if "had been deleted" in r.getMessage()]
    assert len(warnings) == 2  # once per transport, not once per deletion
    assert (alice.recreated, bob.recreated) == (3, 3)
    alice.prune(sender="alice", keep_rounds=0, current_round=10)
    ex.rmdir()
    alice.prune(sender="alice", keep_rounds=0, current_round=10)  # nothing to prune: no error either


def test_dir_exchange_path_replaced_by_a_file_raises_transport_errors_only(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    ex.rmdir()
    ex.write_bytes(b"")
    for call in (t.poll, lambda: t.publish(b"x", sender="alice", round=0)):
        with pytest.raises(TransportError, match="(?i)not a directory"):
            call()
    assert t.wait(0.01) is False


def _can_write_despite_mode(directory) -> bool:
    probe = directory / "probe"
    try:
        probe.write_bytes(b"")
    except PermissionError:
        return False
    probe.unlink()
    return True


def test_dir_read_only_directory_fails_publish_but_not_polls(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    t.publish(b"written earlier", sender="bob", round=0)
    os.chmod(ex, 0o555)
    try:
        if _can_write_despite_mode(ex):
            pytest.skip("running as root (or with CAP_DAC_OVERRIDE): mode 0555 does not stop writes here")
        with pytest.raises(TransportError, match="cannot write"):
            t.publish(b"x", sender="alice", round=1)
        assert [e.data for e in t.poll()] == [b"written earlier"]
        assert t.poll() == []
    finally:
        os.chmod(ex, 0o755)


def test_dir_unwritable_directory_fails_publish_but_not_polls(tmp_path, monkeypatch):
    # The same as a read-only directory, forced for every user (root included): creating a file there fails.
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    t.publish(b"written earlier", sender="bob", round=0)
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    with pytest.raises(TransportError, match="cannot write.*Permission denied"):
        t.publish(b"x", sender="alice", round=1)
    assert [e.data for e in t.poll()] == [b"written earlier"]
    assert not [p for p in ex.iterdir() if p.name.endswith(".tmp")]


def _writable_by_others_warnings(caplog):
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING
        and r.name == directory_module.logger.name
        and "writable by anyone" in r.getMessage()
    ]


def folder_of_mode(tmp_path, mode, caplog):
    """An exchange folder of `mode`, with the transports' warnings captured."""
    ex = tmp_path / "ex"
    ex.mkdir()
    os.chmod(ex, mode)
    caplog.set_level(logging.WARNING, logger="trl_ftis.exchange.transports")
    return ex


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o773], ids=oct)
def test_dir_world_writable_exchange_directory_is_warned_about_once(tmp_path, caplog, mode):
    ex = folder_of_mode(tmp_path, mode, caplog)
    first = DirTransport(f"dir://{ex}")
    second = open_transport(f"dir://{ex}")  # the same folder again in this process: not said again
    DirTransport(f"dir://{ex}/")  # nor under another spelling of its path
    for t in (first, second, first):
        t.publish(b"x", sender="alice", round=0)
        t.poll()
        t.wait(0.001)
    warnings = _writable_by_others_warnings(caplog)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    assert str(ex) in text
    assert f"{mode:#o}" in text  # e.g. 0o777, 0o1777 (sticky: others still add files)
    assert "chmod o-w" in text and "swarm_secret" in text


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o775, 0o770], ids=oct)
def test_dir_exchange_directory_not_writable_by_others_is_not_warned_about(tmp_path, caplog, mode):
    ex = folder_of_mode(tmp_path, mode, caplog)
    t = DirTransport(f"dir://{ex}")
    t.publish(b"x", sender="alice", round=0)
    t.poll()
    assert _writable_by_others_warnings(caplog) == []


# ---------------------------------------------------------------------------------------------------------------
# redis://


@pytest.fixture
def redis_server(tmp_path):
    """A redis-server of this test alone: (url, port, stop, restart)."""
    pytest.importorskip("redis")
    try:
        url, stop = start_redis_server(tmp_path / "redis")
    except RedisServerUnavailable as exc:
        pytest.skip(f"redis-server could not be started: {exc}")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    stops = [stop]

    def restart():
        try:
            new_url, new_stop = start_redis_server(tmp_path / "redis", port=port)
        except RedisServerUnavailable as exc:
            pytest.skip(f"redis-server could not be restarted on port {port}: {exc}")
        stops.append(new_stop)
        assert new_url == url

    yield url, port, lambda: stops[-1](kill=True), restart
    for fn in stops:
        fn()


def _until(fn, timeout=10.0):
    """fn() once it stops raising TransportError (a transport reconnecting), within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.redis
def test_redis_restart_mid_run_costs_the_outage_not_the_run(redis_server, caplog):
    import redis

    url, _, kill, restart = redis_server
    options = {"swarm": "restart", "connect_timeout": 1.0, "socket_timeout": 1.0}
    alice, bob = open_transport(url, **options), open_transport(url, **options)
    caplog.set_level(logging.DEBUG, logger="trl_ftis.exchange.transports")
    alice.publish(b"before", sender="alice", round=0)
    assert [e.data for e in bob.poll()] == [b"before"]

    kill()  # crashed: the data is gone
    for call in (lambda: alice.publish(b"lost", sender="alice", round=1), bob.poll):
        with pytest.raises(TransportError, match="cannot reach redis"):  # retried until connect_timeout, not for ever
            returns_within(call, what="a call to a Redis server that is down")
    # While it is down, every call fails quickly instead of retrying for connect_timeout again: one that did would
    # now retry for 600 s, far past the hang guard.
    alice.connect_timeout = bob.connect_timeout = 600.0

    def calls_while_down():
        for _ in range(3):
            with pytest.raises(TransportError):
                alice.publish(b"lost", sender="alice", round=1)
            with pytest.raises(TransportError):
                bob.poll()
            assert bob.wait(0.2) is False  # never raises for an outage, and returns in time

    returns_within(calls_while_down, what="calls while Redis is known to be down")
    down = [r for r in caplog.records if r.levelno == logging.WARNING and "unreachable" in r.getMessage()]
    assert len(down) == 2  # once per transport, not once per failed call
    assert (alice.outages, bob.outages) == (1, 1)

    restart()
    assert redis.Redis.from_url(url).xlen("ftis:restart") == 0  # the restarted server lost the stream
    _until(lambda: alice.publish(b"after", sender="alice", round=2))
    envelopes = _until(bob.poll)
    assert [e.data for e in envelopes] == [b"after"]  # delivered once; nothing from before the restart again
    assert bob.poll() == []
    bob.publish(b"reply", sender="bob", round=2)
    assert [e.data for e in alice.poll()] == [b"after", b"reply"]
    back = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(back) == 2
    for t in (alice, bob):
        t.close()


@pytest.mark.redis
def test_redis_stream_recreated_with_older_ids_is_read_again_from_its_start(redis_server, caplog):
    import redis

    url, _, kill, restart = redis_server
    options = {"swarm": "ids", "connect_timeout": 1.0, "socket_timeout": 1.0}
    alice, bob = open_transport(url, **options), open_transport(url, **options)
    # A writer pushed the ids far into the future; both peers have read past it.
    redis.Redis.from_url(url).xadd("ftis:ids", {"data": b"from the future"}, id="99999999999999-0")
    assert len(alice.poll()) == 1 and len(bob.poll()) == 1
    kill()
    restart()
    caplog.set_level(logging.WARNING, logger="trl_ftis.exchange.transports")
    _until(lambda: alice.publish(b"after", sender="alice", round=1))
    assert any("recreated" in r.getMessage() for r in caplog.records)
    assert [e.data for e in alice.poll()] == [b"after"]  # alice noticed from the id of her own publish
    assert bob.poll() == []  # bob cannot tell yet...
    bob.publish(b"reply", sender="bob", round=1)  # ...until his own publish shows it
    assert [e.data for e in bob.poll()] == [b"after", b"reply"]
    for t in (alice, bob):
        t.close()


@pytest.mark.redis
def test_redis_stream_flooded_with_huge_entries_is_read_in_bounded_polls(redis_server, monkeypatch):
    import redis

    url = redis_server[0]
    client = redis.Redis.from_url(url)
    for i in range(6):
        client.xadd("ftis:flood", {"sender": "mallory", "round": str(i), "data": b"\x00" * 1_000_000})
    reader = open_transport(url, swarm="flood", max_message_bytes=100_000, max_poll_bytes=300_000, page_size=100)
    counts = []
    real_xread = reader._client.xread
    monkeypatch.setattr(reader._client, "xread", lambda *a, **k: counts.append(k.get("count")) or real_xread(*a, **k))
    polls = [reader.poll() for _ in range(4)]
    # Each XREAD asks for at most as many entries as the byte budget holds messages (300 kB / 100 kB = 3), and a
    # poll stops asking once it received max_poll_bytes: 3 MB per poll here, not the whole 6 MB stream at once.
    assert max(counts) <= 3
    assert [len(p) for p in polls] == [3, 3, 0, 0]
    assert all(e.error == "too_large" and e.data == b"" for p in polls for e in p)
    client.xadd("ftis:flood", {"sender": "alice", "round": "7", "data": b"honest"})
    assert reader.wait(1.0) is True
    assert [e.data for e in reader.poll()] == [b"honest"]
    reader.close()


@pytest.mark.redis
def test_redis_fields_other_than_data_are_charged_and_bounded(redis_server):
    """Issue 23: three entries with a 150 MiB `sender` field cost +1 GB and were charged 12 bytes to the round. Every
    field read is charged now, and an entry larger than a message and its hints is refused as too large."""
    import redis

    url = redis_server[0]
    client = redis.Redis.from_url(url)
    client.xadd("ftis:fields", {"sender": b"m" * 5_000_000, "round": "1", "data": b"tiny"})
    client.xadd("ftis:fields", {"sender": "alice", "round": "2", "data": b"honest", "junk": b"j" * 3_000})
    reader = open_transport(url, swarm="fields", max_message_bytes=100_000)
    big, padded = reader.poll()
    read = len("sender") + 5_000_000 + len("round1") + len("datatiny")
    assert (big.error, big.data, big.size) == ("too_large", b"", read)
    assert padded.error is None and padded.data == b"honest" and padded.size > 3_000  # charged what was read
    reader.close()


def test_a_directory_wait_looks_again_quickly_then_backs_off_to_poll_interval(tmp_path, monkeypatch):
    """Sync-mode peers publish within milliseconds: the first looks come after 5, 10, 20, 40 ms, then every
    `poll_interval` (50 ms), so a long wait lists the directory no more often than a fixed 50 ms poll would."""
    t = DirTransport(f"dir://{tmp_path / 'ex'}")
    slept = []
    clock = [0.0]

    def fake_sleep(seconds):
        slept.append(round(seconds, 4))
        clock[0] += seconds

    monkeypatch.setattr(directory_module.time, "sleep", fake_sleep)
    monkeypatch.setattr(directory_module.time, "monotonic", lambda: clock[0])
    assert t.wait(0.3) is False
    assert slept[:6] == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05]
    assert abs(sum(slept) - 0.3) < 1e-9  # never past the timeout
    slept.clear()
    fast = DirTransport(f"dir://{tmp_path / 'ex'}", poll_interval=0.002)
    fast.wait(0.01)
    assert set(slept) <= {0.002}  # a shorter poll_interval caps the first looks too


def test_a_waiting_receiver_paces_its_listings_by_what_a_listing_costs(tmp_path, monkeypatch):
    """Issue 23: junk nobody deletes makes a listing slow (0.41 s at 300,000 names), and a waiting round that lists
    every 50 ms kept a core busy. The next look waits at least 9 times the last listing's duration."""
    t = DirTransport(f"dir://{tmp_path / 'ex'}")
    slept, clock = [], [0.0]
    real_list = t._list

    def slow_list():
        clock[0] += 0.4  # a listing that takes 0.4 s
        return real_list()

    def fake_sleep(seconds):
        slept.append(round(seconds, 4))
        clock[0] += seconds

    monkeypatch.setattr(t, "_list", slow_list)
    monkeypatch.setattr(directory_module.time, "sleep", fake_sleep)
    monkeypatch.setattr(directory_module.time, "monotonic", lambda: clock[0])
    assert t.wait(20.0) is False
    listings = len(slept) + 1
    assert all(s >= 3.6 - 1e-9 for s in slept[:-1]), slept  # 9 x 0.4 s between listings
    assert listings * 0.4 <= 0.11 * 20.0 + 0.4  # listing took about 10% of the wait (a 50 ms pace: ~89%)
