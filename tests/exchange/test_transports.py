"""Transports (memory://, dir://, redis://): delivery, ordering, timeouts, retention and hostile input.

Redis tests use the `redis_url` fixture of tests/redis_server.py (a throwaway local redis-server, or
$FTIS_TEST_REDIS_URL) and are skipped with the reason when no server can be started.
"""

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from trl_ftis.exchange.transports import (
    DirTransport,
    Envelope,
    MemoryTransport,
    TransportError,
    open_transport,
    validate_sender,
)
from trl_ftis.redaction import redact_url

try:  # tests/ is on sys.path in pytest's default (prepend) import mode; be robust to the others too
    from redis_server import redis_url  # registers the session fixture for this module
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from redis_server import redis_url  # noqa: F401
from waits import returns_within  # tests/ is on sys.path

KINDS = ["memory", "dir", pytest.param("redis", marks=pytest.mark.redis)]


def _redis_client(url):
    redis = pytest.importorskip("redis")
    return redis.Redis.from_url(url, socket_timeout=5)


@pytest.fixture(params=KINDS)
def make_transport(request, tmp_path):
    """make(**options) -> a new Transport instance (a new "peer") on one shared channel for this test."""
    kind = request.param
    opened = []
    cleanup = []
    if kind == "memory":
        url = f"memory://{uuid.uuid4().hex}"
        cleanup.append(lambda: MemoryTransport.reset(url[len("memory://") :]))
        defaults = {}
    elif kind == "dir":
        url = f"dir://{tmp_path / 'exchange'}"
        defaults = {"poll_interval": 0.01}
    else:
        url = request.getfixturevalue("redis_url")
        swarm = f"test-{uuid.uuid4().hex}"  # own stream per test: the server may be shared
        defaults = {"swarm": swarm, "connect_timeout": 2.0}
        cleanup.append(lambda: _redis_client(url).delete(f"ftis:{swarm}"))

    def make(**options):
        transport = open_transport(url, **{**defaults, **options})
        opened.append(transport)
        return transport

    make.kind = kind
    yield make
    for transport in opened:
        transport.close()
    for fn in cleanup:
        fn()


def _payloads(envelopes):
    return [e.data for e in envelopes]


# ---------------------------------------------------------------------------------------------------------------
# All transports


def wire_size(transport, data: bytes, sender: str, round: int) -> int:
    """What a message costs to read: its bytes, and for a Redis stream entry its hint fields too (every field is
    read and charged to the round)."""
    if type(transport).__name__ == "RedisTransport":
        return len(b"sender") + len(sender) + len(b"round") + len(str(round)) + len(b"data") + len(data)
    return len(data)


def test_publish_poll_round_trip(make_transport):
    t = make_transport()
    t.publish(b"hello \x00 world", sender="alice", round=3)
    (envelope,) = t.poll()
    assert isinstance(envelope, Envelope)
    assert envelope.data == b"hello \x00 world"
    assert envelope.sender_hint == "alice"
    assert envelope.round_hint == 3
    assert envelope.size == wire_size(t, b"hello \x00 world", "alice", 3)
    assert envelope.error is None
    assert envelope.source


def test_each_message_returned_once_per_instance(make_transport):
    t = make_transport()
    t.publish(b"one", sender="alice", round=0)
    t.publish(b"two", sender="alice", round=1)
    assert _payloads(t.poll()) == [b"one", b"two"]
    assert t.poll() == []
    t.publish(b"three", sender="alice", round=2)
    assert _payloads(t.poll()) == [b"three"]
    assert t.poll() == []


def test_two_peers_both_see_all_messages_including_their_own(make_transport):
    alice, bob = make_transport(), make_transport()
    alice.publish(b"from alice", sender="alice", round=0)
    bob.publish(b"from bob", sender="bob", round=0)
    for peer in (alice, bob):
        envelopes = peer.poll()
        assert sorted(_payloads(envelopes)) == [b"from alice", b"from bob"]
        assert {e.sender_hint for e in envelopes} == {"alice", "bob"}
        assert len({e.source for e in envelopes}) == 2  # sources are unique per message


def test_oldest_first(make_transport):
    alice, bob = make_transport(), make_transport()
    expected = []
    for r in range(5):
        alice.publish(f"a{r}".encode(), sender="alice", round=r)
        bob.publish(f"b{r}".encode(), sender="bob", round=r)
        expected += [f"a{r}".encode(), f"b{r}".encode()]
    reader = make_transport()
    assert _payloads(reader.poll()) == expected


def test_poll_is_bounded_by_max_batch(make_transport):
    writer = make_transport()
    for r in range(7):
        writer.publish(bytes([r]), sender="alice", round=r)
    reader = make_transport(max_batch=3)
    assert _payloads(reader.poll()) == [b"\x00", b"\x01", b"\x02"]
    assert _payloads(reader.poll()) == [b"\x03", b"\x04", b"\x05"]
    assert _payloads(reader.poll()) == [b"\x06"]
    assert reader.poll() == []


def test_wait_returns_false_within_timeout_when_nothing_arrives(make_transport):
    t = make_transport()
    t.publish(b"old", sender="alice", round=0)
    t.poll()  # nothing new after this
    start = time.monotonic()
    # A wait that ignored its timeout would block until a message came: none comes before the hang guard.
    assert returns_within(lambda: t.wait(0.3), what="wait(0.3)") is False
    assert time.monotonic() - start >= 0.25  # it did wait (a lower bound: the test is about waiting that long)
    assert returns_within(lambda: t.wait(0), what="wait(0)") is False


def test_wait_returns_true_soon_after_a_publish_from_another_thread(make_transport):
    reader, writer = make_transport(), make_transport()
    publishing = threading.Event()

    def publish_later():
        time.sleep(0.2)
        publishing.set()  # before the publish: a reader may wake before publish() itself has returned
        writer.publish(b"wake up", sender="bob", round=1)

    def wait_then_look():
        woke = reader.wait(600.0)  # a wait that missed the publish would run into this, far past the hang guard
        return woke, publishing.is_set()

    thread = threading.Thread(target=publish_later)
    thread.start()
    try:
        # it woke up for the publish (after it, not before: nothing was there earlier), not at its timeout
        assert returns_within(wait_then_look, what="wait(600) after a publish") == (True, True)
    finally:
        thread.join()
    # wait() does not consume: the message comes from the next poll, once.
    assert _payloads(reader.poll()) == [b"wake up"]
    assert reader.poll() == []


def test_wait_returns_at_once_when_something_is_pending(make_transport):
    t = make_transport()
    t.publish(b"pending", sender="alice", round=0)
    for _ in range(2):  # wait() does not consume: asking again before polling still says True at once
        assert returns_within(lambda: t.wait(600.0), what="wait(600) with a message pending") is True
    assert _payloads(t.poll()) == [b"pending"]
    assert t.poll() == []


def test_prune_removes_only_own_old_rounds(make_transport):
    alice, bob = make_transport(), make_transport()
    for r in range(6):
        alice.publish(f"a{r}".encode(), sender="alice", round=r)
        bob.publish(f"b{r}".encode(), sender="bob", round=r)
    alice.prune(sender="alice", keep_rounds=2, current_round=5)  # drops alice's rounds < 3
    late = make_transport()
    seen = {(e.sender_hint, e.round_hint) for e in late.poll()}
    assert seen == {("alice", 3), ("alice", 4), ("alice", 5)} | {("bob", r) for r in range(6)}
    with pytest.raises(ValueError):
        alice.prune(sender="alice", keep_rounds=-1, current_round=5)


@pytest.mark.parametrize("sender", ["", "a/b", "a\\b", "..", "x..y", "tab\there", "nul\x00", "new\nline", "é" * 65])
def test_publish_rejects_unsafe_sender_names(make_transport, sender):
    t = make_transport()
    with pytest.raises(ValueError):
        t.publish(b"x", sender=sender, round=0)
    assert t.poll() == []


def test_publish_rejects_bad_rounds_and_oversized_messages(make_transport):
    t = make_transport(max_message_bytes=10)
    for bad_round in (-1, 10**10, 1.5, "3", True):
        with pytest.raises(ValueError):
            t.publish(b"x", sender="alice", round=bad_round)
    with pytest.raises(ValueError, match="max_message_bytes"):
        t.publish(b"x" * 11, sender="alice", round=0)
    t.publish(b"x" * 10, sender="alice", round=0)  # exactly at the limit is fine
    assert [e.size for e in t.poll()] == [wire_size(t, b"x" * 10, "alice", 0)]


def test_oversized_message_is_reported_not_returned(make_transport):
    writer = make_transport()
    writer.publish(b"y" * 100, sender="mallory", round=4)
    writer.publish(b"small", sender="alice", round=5)
    reader = make_transport(max_message_bytes=50)
    big, small = reader.poll()
    size = wire_size(reader, b"y" * 100, "mallory", 4)
    assert (big.data, big.error, big.size, big.sender_hint, big.round_hint) == (b"", "too_large", size, "mallory", 4)
    assert (small.data, small.error) == (b"small", None)
    assert reader.poll() == []  # reported once


def test_poll_bytes_default_to_four_messages_of_the_largest_size(make_transport):
    t = make_transport(max_message_bytes=1000)
    assert t.max_poll_bytes == 4000
    assert make_transport(max_message_bytes=1000, max_poll_bytes=123).max_poll_bytes == 123
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="max_poll_bytes"):
            make_transport(max_poll_bytes=bad)


def test_poll_is_bounded_in_bytes_but_always_returns_one_message(make_transport):
    writer = make_transport()
    for r in range(4):
        writer.publish(bytes([r]) * 100, sender="alice", round=r)
    reader = make_transport(max_message_bytes=100, max_poll_bytes=1)  # a budget smaller than any message
    for r in range(4):
        assert _payloads(reader.poll()) == [bytes([r]) * 100]
    assert reader.poll() == []


def test_poll_stops_reading_once_its_byte_budget_is_spent(make_transport):
    writer = make_transport()
    for r in range(6):
        writer.publish(bytes([r]) * 100, sender="alice", round=r)
    reader = make_transport(max_message_bytes=100, max_poll_bytes=250)
    polls = []
    while len(polls) < 10 and (not polls or polls[-1]):
        polls.append(_payloads(reader.poll()))
    # dir:// and memory:// stop before the budget would be exceeded (2 x 100 bytes); redis:// counts each entry's
    # fields too and can only stop after a reply, so it may take one more message (never a full page).
    assert all(len(p) in ((2, 3) if make_transport.kind == "redis" else (2,)) for p in polls[:-2])
    assert [m for p in polls for m in p] == [bytes([r]) * 100 for r in range(6)]  # each once, in order
    assert polls[-1] == [] and len(polls) >= 3


def test_closed_transport_refuses_use_and_close_is_idempotent(make_transport):
    with make_transport() as t:
        pass
    t.close()
    with pytest.raises(TransportError):
        t.poll()
    with pytest.raises(TransportError):
        t.publish(b"x", sender="alice", round=0)


# ---------------------------------------------------------------------------------------------------------------
# open_transport, names, URLs


def test_unknown_scheme_raises_value_error_naming_supported_schemes():
    for url in ("ftp://host/x", "/tmp/no-scheme", "zmq://:secret@host:1"):
        with pytest.raises(ValueError) as info:
            open_transport(url)
        message = str(info.value)
        for scheme in ("dir://", "memory://", "redis://", "rediss://"):
            assert scheme in message
        assert "secret" not in message


def test_validate_sender_accepts_ordinary_names():
    for name in ("alice", "peer-3", "Qwen2.5-0.5B", "node_7.gpu0", "_x", "a" * 64):
        assert validate_sender(name) == name
    for name in ("ünï", "peer 7", "a" * 65, "-x", ".hidden", "x..y", "a/b"):
        with pytest.raises(ValueError, match="peer id"):
            validate_sender(name)


def test_redact_url_hides_passwords():
    assert redact_url("redis://:hunter2@host:6379/0") == "redis://:<redacted>@host:6379/0"
    assert redact_url("rediss://user:hunter2@host:6380/1?swarm=a") == "rediss://user:<redacted>@host:6380/1?swarm=a"
    assert "hunter2" not in redact_url("redis://host:6379/0?password=hunter2")
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert redact_url("dir:///tmp/swarm") == "dir:///tmp/swarm"  # not mangled to dir:/tmp/swarm


def test_module_imports_and_works_without_redis_installed(tmp_path):
    # sys.modules["redis"] = None makes `import redis` fail, as if the package were not installed.
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from trl_ftis.exchange.transports import open_transport, TransportError\n"
        "t = open_transport('memory://x'); t.publish(b'a', sender='s', round=0); assert t.poll()[0].data == b'a'\n"
        "try:\n"
        "    open_transport('redis://:pw@127.0.0.1:1/0')\n"
        "except TransportError as exc:\n"
        "    assert 'pip install' in str(exc) and 'pw' not in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('no TransportError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------------------------
# dir://


def _ftis_name(round, sender):
    return f"{round:010d}.{sender}.{uuid.uuid4().hex}.ftis"


def test_dir_creates_missing_directory_and_accepts_relative_paths(tmp_path, monkeypatch):
    nested = tmp_path / "a" / "b" / "c"
    with open_transport(f"dir://{nested}") as t:
        t.publish(b"x", sender="alice", round=0)
    assert nested.is_dir()
    monkeypatch.chdir(tmp_path)
    with open_transport("dir://rel/ex") as t:
        assert t.path == str(tmp_path / "rel" / "ex")
        t.publish(b"y", sender="alice", round=0)
        assert _payloads(t.poll()) == [b"y"]


def test_dir_publish_is_atomic_readers_never_see_partial_files(tmp_path):
    url = f"dir://{tmp_path / 'ex'}"
    writer, reader = open_transport(url), open_transport(url)
    payload = lambda i: bytes([i % 251]) * (64 * 1024 + i)
    n = 60
    received = []
    done = threading.Event()

    def read():
        while not done.is_set():
            received.extend(reader.poll())
        received.extend(reader.poll())

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for i in range(n):
            writer.publish(payload(i), sender="alice", round=i)
    finally:
        done.set()
        thread.join()
    assert [e.error for e in received] == [None] * n
    assert not any(e.source.endswith(".tmp") for e in received)
    assert [e.data for e in received] == [payload(i) for i in range(n)]
    # A write in progress (a .tmp file) is neither a message nor garbage.
    (tmp_path / "ex" / (_ftis_name(99, "bob") + ".tmp")).write_bytes(b"part")
    assert reader.poll() == []


def test_dir_publish_renames_only_complete_files(tmp_path, monkeypatch):
    url = f"dir://{tmp_path / 'ex'}"
    writer, reader = open_transport(url), open_transport(url)
    seen_before_rename = []
    real_replace = os.replace

    def replace_after_looking(src, dst):
        # The data is fully written here, but under the temporary name: a reader must not see it yet.
        seen_before_rename.extend(reader.poll())
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_after_looking)
    writer.publish(b"z" * 4096, sender="alice", round=0)
    assert seen_before_rename == []
    assert _payloads(reader.poll()) == [b"z" * 4096]


def test_dir_garbage_and_oversized_files_are_reported_once_without_reading(tmp_path, monkeypatch):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}", max_message_bytes=1000)
    (ex / "notes.txt").write_bytes(b"not a message")
    big_name = _ftis_name(1, "mallory")
    with open(ex / big_name, "wb") as f:
        f.truncate(2**30)  # sparse: cheap to create, expensive to read
    (ex / "hand-made.ftis").write_bytes(b"still a message")

    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(os.fspath(path)) or real_open(path, *a, **k))
    envelopes = {e.source: e for e in t.poll()}
    assert set(envelopes) == {"notes.txt", big_name, "hand-made.ftis"}
    garbage, big, odd = envelopes["notes.txt"], envelopes[big_name], envelopes["hand-made.ftis"]
    # Recognised from its name alone: never opened nor stat'ed, so its size is not known (0).
    assert (garbage.error, garbage.data, garbage.size) == ("unrecognised", b"", 0)
    assert (big.error, big.data, big.size, big.sender_hint, big.round_hint) == ("too_large", b"", 2**30, "mallory", 1)
    assert (odd.error, odd.data, odd.sender_hint, odd.round_hint) == (None, b"still a message", None, None)
    assert not any(p.endswith((big_name, "notes.txt")) for p in opened)  # never opened
    assert t.poll() == []  # each reported once


def test_dir_symlinks_are_ignored_not_followed(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"private data outside the exchange")
    os.symlink(secret, ex / _ftis_name(1, "mallory"))
    os.symlink(tmp_path, ex / _ftis_name(2, "mallory"))
    os.mkdir(ex / _ftis_name(3, "mallory"))
    t.publish(b"real", sender="alice", round=4)
    envelopes = t.poll()
    assert _payloads(envelopes) == [b"real"]
    assert all(b"private" not in e.data for e in envelopes)
    assert t.poll() == []
    assert t.wait(0.05) is False  # skipped entries do not keep waking the receiver


def test_dir_file_swapped_for_a_symlink_after_listing_is_not_followed(tmp_path):
    ex = tmp_path / "ex"
    t = DirTransport(f"dir://{ex}")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"private")
    name = _ftis_name(1, "mallory")
    (ex / name).write_bytes(b"innocent")
    listed = os.lstat(ex / name)  # what poll() saw when it listed the directory
    os.unlink(ex / name)
    os.symlink(secret, ex / name)  # swapped before poll() opens it
    envelope = t._receive(name, listed)
    assert envelope is None or envelope.data == b""


def test_dir_file_disappearing_between_listing_and_reading_is_skipped(tmp_path, monkeypatch):
    t = DirTransport(f"dir://{tmp_path / 'ex'}")
    t.publish(b"gone", sender="alice", round=0)
    t.publish(b"kept", sender="alice", round=1)
    real_list = t._list

    def list_then_prune():
        entries = real_list()
        for entry in entries:
            if entry.name.startswith("0000000000."):
                entry.stat(follow_symlinks=False)  # cached: poll() sees a file that was there...
                os.unlink(entry.path)  # ...and the sender prunes it before poll() opens it
        return entries

    monkeypatch.setattr(t, "_list", list_then_prune)
    assert _payloads(t.poll()) == [b"kept"]


def test_dir_seen_set_forgets_names_no_longer_present(tmp_path):
    t = DirTransport(f"dir://{tmp_path / 'ex'}")
    for r in range(5):
        t.publish(b"x", sender="alice", round=r)
    assert len(t.poll()) == 5
    assert len(t._seen) == 5
    t.prune(sender="alice", keep_rounds=0, current_round=5)
    assert t.poll() == []
    assert t._seen == set()


def test_dir_prune_touches_only_own_files(tmp_path):
    ex = tmp_path / "ex"
    alice = DirTransport(f"dir://{ex}")
    for r in range(4):
        alice.publish(b"a", sender="alice", round=r)
        alice.publish(b"b", sender="alice-2", round=r)  # a prefix-sharing name is someone else
    stale_tmp = ex / (_ftis_name(0, "alice") + ".tmp")  # from a crashed write
    stale_tmp.write_bytes(b"")
    (ex / "notes.txt").write_bytes(b"")
    alice.prune(sender="alice", keep_rounds=1, current_round=3)  # drops alice's rounds < 2
    names = sorted(os.listdir(ex))
    assert not stale_tmp.exists()
    assert "notes.txt" in names
    assert sorted(int(n[:10]) for n in names if ".alice." in n) == [2, 3]
    assert sorted(int(n[:10]) for n in names if ".alice-2." in n) == [0, 1, 2, 3]


def test_bad_urls_and_options():
    with pytest.raises(ValueError):
        open_transport("dir://")
    with pytest.raises(TypeError):
        open_transport("memory://x", no_such_option=1)


def test_dir_path_that_is_a_file_raises_transport_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(TransportError, match="not a directory"):
        open_transport(f"dir://{tmp_path / 'file'}")


# ---------------------------------------------------------------------------------------------------------------
# redis://


@pytest.mark.redis
def test_redis_trimming_bounds_the_stream(redis_url):
    swarm = f"trim-{uuid.uuid4().hex}"
    client = _redis_client(redis_url)
    try:
        with open_transport(redis_url, swarm=swarm, max_stream_len=100) as t:
            lengths = []
            for i in range(300):
                t.publish(b"m%d" % i, sender="alice", round=i)
                lengths.append(client.xlen(f"ftis:{swarm}"))
        # Approximate trimming drops whole stream nodes (100 entries by default): near the bound, never 300.
        assert max(lengths) <= 100 + 100
        assert 100 <= lengths[-1] <= 200
    finally:
        client.delete(f"ftis:{swarm}")


@pytest.mark.redis
def test_redis_late_joiner_sees_retained_messages_and_swarms_are_separate(redis_url):
    swarm = f"late-{uuid.uuid4().hex}"
    sep = "&" if "?" in redis_url else "?"
    try:
        with open_transport(redis_url, swarm=swarm) as early:
            for r in range(3):
                early.publish(b"r%d" % r, sender="alice", round=r)
        with (
            open_transport(f"{redis_url}{sep}swarm={swarm}") as late,
            open_transport(redis_url, swarm=f"other-{swarm}") as stranger,
        ):
            assert late.key == f"ftis:{swarm}"
            assert _payloads(late.poll()) == [b"r0", b"r1", b"r2"]
            assert stranger.poll() == []
        with pytest.raises(ValueError, match="conflicting"):
            open_transport(f"{redis_url}{sep}swarm={swarm}", swarm="another")
    finally:
        _redis_client(redis_url).delete(f"ftis:{swarm}")


@pytest.mark.redis
def test_a_publish_recovers_a_stream_whose_ids_a_member_exhausted(redis_url):
    """Issue 23: one XADD with the largest possible id made every later publish fail for everyone (`XADD *`: "the
    stream has exhausted the last possible ID") until someone deleted the key. The next publish deletes entries with
    ids far in the future, moves the stream's last id back, and goes through; a reader whose cursor passed the hostile
    entry reads the stream again after its own next publish, and no honest message is lost."""
    swarm = f"exhausted-{uuid.uuid4().hex}"
    key = f"ftis:{swarm}"
    client = _redis_client(redis_url)
    largest = "18446744073709551615-18446744073709551615"
    try:
        with open_transport(redis_url, swarm=swarm) as a, open_transport(redis_url, swarm=swarm) as b:
            a.publish(b"a0", sender="a", round=0)
            assert _payloads(b.poll()) == [b"a0"]
            client.xadd(key, {"sender": "mallory", "round": "1", "data": b"junk"}, id=f"{2**64 - 2}-0")
            client.xadd(key, {"sender": "mallory", "round": "1", "data": b"junk"}, id=largest)
            with pytest.raises(Exception, match="exhausted"):
                client.xadd(key, {"data": b"x"})  # what every publish met before
            assert _payloads(b.poll()) == [b"junk", b"junk"]  # b's cursor is now at the largest id
            a.publish(b"a1", sender="a", round=1)  # repairs
            assert a.repairs == 1 and client.xlen(key) == 2  # a0 and a1; both junk entries deleted
            b.publish(b"b1", sender="b", round=1)  # works without a repair, and moves b's cursor back
            assert b.repairs == 0
            assert [p for p in _payloads(b.poll()) if p != b"b1"] == [b"a0", b"a1"]  # read again from the start
            assert _payloads(a.poll()) == [b"a0", b"a1", b"b1"]  # a never read the junk (nor anything before)
            client.xadd(key, {"sender": "mallory", "data": b"junk"}, id=largest)  # again: recovered again
            a.publish(b"a2", sender="a", round=2)
            assert a.repairs == 2 and _payloads(b.poll()) == [b"a2"]
    finally:
        client.delete(key)


@pytest.mark.redis
def test_a_flood_of_far_future_entries_is_repaired_a_bounded_page_at_a_time(redis_url):
    """300 entries with ids near the largest: one publish deletes at most 256 (and fails, counted by the caller), the
    next deletes the rest and goes through."""
    swarm = f"flood-{uuid.uuid4().hex}"
    key = f"ftis:{swarm}"
    client = _redis_client(redis_url)
    try:
        with open_transport(redis_url, swarm=swarm) as a:
            for k in range(300):
                client.xadd(key, {"sender": "mallory", "data": b"j"}, id=f"{2**64 - 1}-{2**64 - 300 + k}")
            with pytest.raises(TransportError, match="more than a day in the future"):
                a.publish(b"a0", sender="a", round=0)
            assert a.repairs == 1 and client.xlen(key) == 300 - 256
            a.publish(b"a1", sender="a", round=1)
            assert a.repairs == 2 and _payloads(a.poll()) == [b"a1"]
    finally:
        client.delete(key)


def _server_ms(client) -> int:
    seconds, microseconds = client.time()
    return seconds * 1000 + microseconds // 1000


def _ms(entry_id) -> int:
    return int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])


@pytest.mark.redis
def test_an_entry_beyond_the_horizon_never_gives_honest_publishes_far_future_ids(redis_url):
    """A client that may XADD puts an entry two days ahead of the server's clock (not the largest id: no XADD *
    fails). Honest publishes still get ids of the server's clock (the far entry is repaired away first), and a second,
    largest-id entry later makes the repair delete only the hostile entries: a late joiner reads every honest
    round."""
    swarm = f"horizon-{uuid.uuid4().hex}"
    key = f"ftis:{swarm}"
    client = _redis_client(redis_url)
    day = 86_400_000
    try:
        with open_transport(redis_url, swarm=swarm) as a:
            a.publish(b"r4", sender="a", round=4)
            client.xadd(
                key, {"sender": "mallory", "round": "5", "data": b"junk"}, id=f"{_server_ms(client) + 2 * day}-0"
            )
            for round in (5, 6):
                a.publish(b"r%d" % round, sender="a", round=round)
            honest = [(entry_id, fields) for entry_id, fields in client.xrange(key) if fields[b"sender"] == b"a"]
            assert len(honest) == 3 and all(_ms(entry_id) <= _server_ms(client) for entry_id, _ in honest)
            assert a.repairs == 1 and client.xlen(key) == 3  # the far entry is gone, no honest one with it
            client.xadd(key, {"sender": "mallory", "data": b"junk"}, id="18446744073709551615-18446744073709551615")
            a.publish(b"r7", sender="a", round=7)
            assert a.repairs == 2
        with open_transport(redis_url, swarm=swarm) as late:
            assert _payloads(late.poll()) == [b"r4", b"r5", b"r6", b"r7"]
    finally:
        client.delete(key)


@pytest.mark.redis
def test_an_entry_within_the_horizon_is_followed_and_kept(redis_url):
    """An id an hour ahead (a client's clock, or a hostile one within the horizon): publishes follow it, ids stay
    within the horizon, and nothing is deleted."""
    swarm = f"near-{uuid.uuid4().hex}"
    key = f"ftis:{swarm}"
    client = _redis_client(redis_url)
    try:
        with open_transport(redis_url, swarm=swarm) as a:
            ahead = _server_ms(client) + 3_600_000
            client.xadd(key, {"sender": "b", "round": "0", "data": b"b0"}, id=f"{ahead}-0")
            a.publish(b"a0", sender="a", round=0)
            last = client.xrevrange(key, "+", "-", count=1)[0][0]
            assert _ms(last) == ahead and a.repairs == 0 and client.xlen(key) == 2
    finally:
        client.delete(key)


@pytest.fixture
def acl_redis(tmp_path):
    """acl(without=(...)) -> the URL base of a user with the launcher's peer commands (`REDIS_PEER_COMMANDS`) minus
    `without`, on the keys `ftis:<swarm>*` of the swarm `acl.swarm`, on a throwaway server of this test (an ACL user
    is not made on a shared one); `acl.admin`: a client of the default user."""
    from redis_server import RedisServerUnavailable, start_redis_server

    from trl_ftis.launcher.slurm.jobs import REDIS_PEER_COMMANDS

    redis = pytest.importorskip("redis")
    try:
        url, stop = start_redis_server(tmp_path)
    except RedisServerUnavailable as exc:
        pytest.skip(f"redis-server could not be started: {exc}")
    admin = redis.Redis.from_url(url, socket_timeout=5)
    swarm = f"acl-{uuid.uuid4().hex}"
    users = []

    def acl(without=()):
        name = f"peer{len(users)}"
        commands = [f"+{c}" for c in REDIS_PEER_COMMANDS if c not in without]
        admin.execute_command(
            "ACL", "SETUSER", name, "reset", "on", ">pw", "resetkeys", f"~ftis:{swarm}*", "resetchannels", "-@all",
            *commands,
        )  # fmt: skip
        users.append(name)
        return url.replace("redis://", f"redis://{name}:pw@") + f"?swarm={swarm}&connect_timeout=2"

    acl.swarm, acl.admin = swarm, admin
    try:
        yield acl
    finally:
        admin.close()
        stop()


def _hostile(redis, url):
    """A client of the same ACL user: a member that may XADD."""
    return redis.Redis.from_url(url.split("?")[0], socket_timeout=5)


@pytest.mark.redis
def test_without_time_a_publish_repairs_a_stream_whose_ids_a_member_exhausted(acl_redis):
    """Security review: a user without +time publishes with XADD * (no server clock for `<ms>-*`); one XADD with the
    largest possible id used to make every later publish fail for good ("the stream has exhausted the last possible
    ID"). Now the publish that meets it repairs the stream (deletes the entries more than a day ahead of the host's
    clock, XSETID back) and goes through; honest entries are kept, and readers get the new message."""
    redis = pytest.importorskip("redis")
    url = acl_redis(without=("time",))
    key = f"ftis:{acl_redis.swarm}"
    hostile = _hostile(redis, url)
    largest = "18446744073709551615-18446744073709551615"
    with open_transport(url) as a, open_transport(url) as b:
        with pytest.raises(redis.exceptions.NoPermissionError):
            hostile.time()  # the user really has no TIME
        a.publish(b"a0", sender="a", round=0)
        assert _payloads(b.poll()) == [b"a0"]
        hostile.xadd(key, {"sender": "mallory", "round": "1", "data": b"junk"}, id=f"{2**64 - 1}-0")
        hostile.xadd(key, {"sender": "mallory", "round": "1", "data": b"junk"}, id=largest)
        with pytest.raises(redis.ResponseError, match="exhausted the last possible ID"):
            hostile.xadd(key, {"data": b"x"})  # what every publish met before
        a.publish(b"a1", sender="a", round=1)  # XADD * fails, repairs, goes through
        assert a.repairs == 1
        assert [fields[b"data"] for _, fields in acl_redis.admin.xrange(key)] == [b"a0", b"a1"]  # junk gone, a0 kept
        assert _payloads(b.poll()) == [b"a1"]
        a.publish(b"a2", sender="a", round=2)  # and every publish after it
        hostile.xadd(key, {"sender": "mallory", "data": b"junk"}, id=largest)  # again: repaired again
        b.publish(b"b3", sender="b", round=3)
        assert (a.repairs, b.repairs) == (1, 1)
    with open_transport(url) as late:
        assert _payloads(late.poll()) == [b"a0", b"a1", b"a2", b"b3"]


@pytest.mark.redis
def test_before_redis_7_a_publish_repairs_a_stream_whose_ids_a_member_exhausted(acl_redis, monkeypatch):
    """Redis before 7.0 has no `XADD <ms>-*` (emulated: the server refuses it as before 7.0): publishes use XADD *,
    and the one that finds the stream exhausted repairs it with the server's clock (TIME) as the horizon."""
    redis = pytest.importorskip("redis")
    from trl_ftis.exchange.transports.redis_streams import RedisTransport

    real = RedisTransport._xadd

    def before_7(self, fields, entry_id):
        if entry_id != "*" and entry_id.endswith("-*"):
            raise redis.ResponseError("Invalid stream ID specified as stream command argument")
        return real(self, fields, entry_id)

    monkeypatch.setattr(RedisTransport, "_xadd", before_7)
    url = acl_redis()
    key = f"ftis:{acl_redis.swarm}"
    hostile = _hostile(redis, url)
    with open_transport(url) as a:
        a.publish(b"a0", sender="a", round=0)
        assert a._partial_ids is False  # on the XADD * path
        hostile.xadd(key, {"sender": "mallory", "data": b"junk"}, id="18446744073709551615-18446744073709551615")
        a.publish(b"a1", sender="a", round=1)
        assert a.repairs == 1
        assert [fields[b"data"] for _, fields in acl_redis.admin.xrange(key)] == [b"a0", b"a1"]


@pytest.mark.redis
def test_without_the_repair_commands_an_exhausted_stream_fails_naming_them(acl_redis):
    """A user without +time, +xrevrange and +xsetid cannot repair: the publish fails (nothing sent) with an error
    that names what the user lacks."""
    redis = pytest.importorskip("redis")
    url = acl_redis(without=("time", "xrevrange", "xsetid"))
    key = f"ftis:{acl_redis.swarm}"
    with open_transport(url) as a:
        a.publish(b"a0", sender="a", round=0)
        _hostile(redis, url).xadd(key, {"data": b"junk"}, id="18446744073709551615-18446744073709551615")
        with pytest.raises(TransportError, match=r"\+xrevrange.*\+xsetid"):
            a.publish(b"a1", sender="a", round=1)
        assert acl_redis.admin.xlen(key) == 2 and a.repairs == 0


@pytest.mark.redis
def test_redis_poll_reads_page_after_page(redis_url):
    swarm = f"pages-{uuid.uuid4().hex}"
    try:
        with open_transport(redis_url, swarm=swarm, page_size=2) as t:
            for r in range(7):
                t.publish(b"p%d" % r, sender="alice", round=r)
            assert _payloads(t.poll()) == [b"p%d" % r for r in range(7)]
            assert t.poll() == []
    finally:
        _redis_client(redis_url).delete(f"ftis:{swarm}")


@pytest.mark.redis
def test_redis_hostile_entries_are_reported_not_trusted(redis_url):
    swarm = f"hostile-{uuid.uuid4().hex}"
    key = f"ftis:{swarm}"
    client = _redis_client(redis_url)
    try:
        client.xadd(key, {"sender": "x" * 10_000, "round": "-5"})  # no data field
        client.xadd(key, {"sender": b"\xff\xfe", "round": "9" * 40, "data": b"payload"})
        with open_transport(redis_url, swarm=swarm) as t:
            missing, odd = t.poll()
        assert (missing.error, missing.data, missing.round_hint) == ("malformed", b"", None)
        assert len(missing.sender_hint) <= 200
        assert (odd.error, odd.data, odd.round_hint) == (None, b"payload", None)
        assert isinstance(odd.sender_hint, str)
    finally:
        client.delete(key)


def test_redis_unreachable_server_raises_transport_error_within_deadline_without_password():
    pytest.importorskip("redis")
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(TransportError) as info:  # retried until the deadline, not forever (the hang guard)
        returns_within(
            lambda: open_transport(f"redis://:s3cret-pw@127.0.0.1:{port}/0", connect_timeout=0.5, socket_timeout=0.5),
            what="opening an unreachable Redis",
        )
    assert time.monotonic() - start >= 0.4  # retried until the deadline (a lower bound), not given up at once
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    exc = info.value
    while exc is not None:  # neither the error nor anything chained to it shows the password
        assert "s3cret-pw" not in str(exc) and "s3cret-pw" not in repr(exc)
        exc = exc.__cause__ or exc.__context__


@pytest.mark.redis
def test_redis_password_from_the_environment_never_in_a_url(tmp_path, monkeypatch):
    from redis_server import RedisServerUnavailable, start_redis_server

    from trl_ftis.shared_names import REDIS_PASSWORD_ENV

    try:
        url, stop = start_redis_server(tmp_path, extra=("--requirepass", "s3cret-pw"))
    except RedisServerUnavailable as exc:
        pytest.skip(f"redis-server could not be started: {exc}")
    swarm_url = f"{url}?swarm=pw&connect_timeout=1"
    try:
        monkeypatch.delenv(REDIS_PASSWORD_ENV, raising=False)
        with pytest.raises(TransportError):
            open_transport(swarm_url)  # the server wants a password
        monkeypatch.setenv(REDIS_PASSWORD_ENV, "wrong-pw")
        with pytest.raises(TransportError) as error:
            open_transport(swarm_url)
        assert "wrong-pw" not in str(error.value)
        monkeypatch.setenv(REDIS_PASSWORD_ENV, "s3cret-pw")
        with open_transport(swarm_url) as writer, open_transport(swarm_url) as reader:
            writer.publish(b"hello", sender="a", round=0)
            assert [envelope.data for envelope in reader.poll()] == [b"hello"]
            assert "s3cret-pw" not in writer.url
    finally:
        stop()
