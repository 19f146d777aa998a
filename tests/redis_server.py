"""A throwaway `redis-server` for tests, and the session-scoped `redis_url` fixture that provides one.

`start_redis_server(tmp_dir)` starts ``redis-server`` (from ``$REDIS_SERVER`` or PATH) on a free port bound to
127.0.0.1 (or on ``port=``, e.g. to restart a server where its clients expect it), without persistence, waits until
it answers PING and returns ``(url, stop)``; ``stop()`` terminates it, ``stop(kill=True)`` kills it (SIGKILL, as a
crash would). Its data is lost either way. It raises `RedisServerUnavailable` with the reason when the binary is
missing or the server does not come up.

The `redis_url` fixture uses ``$FTIS_TEST_REDIS_URL`` when set (an external server: tests must then use their own
keys and must not flush the database), else starts a local server for the test session; when neither works the
tests that use it are skipped with "redis-server could not be started: <reason>".
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 5.0


class RedisServerUnavailable(RuntimeError):
    """No redis-server binary, or it did not start and answer PING in time."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_ping(port: int) -> bool:
    # A raw RESP PING, so the helper does not depend on redis-py.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # up, with or without a password
    except OSError:
        return False


def _stopper(proc: subprocess.Popen, log):
    def stop(kill: bool = False) -> None:
        if proc.poll() is None:
            if kill:
                proc.kill()
            else:
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        log.close()

    return stop


def start_redis_server(
    tmp_dir, *, timeout: float = START_TIMEOUT_S, attempts: int = 3, port: int | None = None, extra: tuple = ()
):
    """Start a local redis-server in `tmp_dir` (on `port`, else a free one; `extra`: more server options, e.g.
    ``("--requirepass", "pw")``); return ``(url, stop)``.

    Raises RedisServerUnavailable."""
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        raise RedisServerUnavailable("redis-server not found on PATH (install it or set REDIS_SERVER)")
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    reason = "unknown"
    # Another process can take the free port between our check and the server's bind: try a few ports (or, with a
    # fixed port, try it again: a server killed a moment ago may still hold it).
    fixed = port
    for attempt in range(attempts):
        port = fixed if fixed is not None else _free_port()
        log_path = tmp_dir / f"redis-{port}-{attempt}-{time.monotonic_ns()}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
        command = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(tmp_dir),
            "--daemonize", "no",
            *extra,
        ]  # fmt: skip
        try:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            log.close()
            raise RedisServerUnavailable(f"cannot run {binary}: {exc}") from exc
        stop = _stopper(proc, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers_ping(port):
                return f"redis://127.0.0.1:{port}/0", stop
            time.sleep(0.05)
        exited = proc.poll()  # before stop(): did it die by itself (e.g. the port was taken)?
        stop()
        tail = log_path.read_bytes()[-400:].decode("utf-8", "replace").strip()
        if exited is not None:
            reason = f"{binary} exited with code {exited}: {tail or 'no output'}"
            if fixed is not None:
                time.sleep(0.2)  # give the port's previous owner a moment to let go of it
        else:
            reason = f"{binary} did not answer PING on port {port} within {timeout:.0f}s: {tail or 'no output'}"
    raise RedisServerUnavailable(reason)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """URL of a redis server for the test session (external via FTIS_TEST_REDIS_URL, else a local one)."""
    external = os.environ.get("FTIS_TEST_REDIS_URL")
    if external:
        yield external
        return
    try:
        url, stop = start_redis_server(tmp_path_factory.mktemp("redis"))
    except RedisServerUnavailable as exc:
        pytest.skip(f"redis-server could not be started: {exc}")
    try:
        yield url
    finally:
        stop()
