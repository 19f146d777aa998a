"""The vLLM servers the launcher starts for the peers that have a `vllm_server:` block (`vllm_schema`).

`server_command(...)` builds one `ServerCommand` (argv, environment additions, address, log) for a peer; the
backends start it before the peer, wait until `http://HOST:PORT/health` answers (`health_answers`), and stop it
with the peer. Standard library only.

The pieces the backends share:

* `port_problem(host, port)`: a port something already listens on, or that cannot be bound (checked before
  anything starts);
* `start_server(command, open_log=...)`: the server as a process of its own session and process group (stopped as
  a whole, and a Ctrl-C in the terminal reaches only the launcher), its output straight to its log;
* `wait_until_ready(servers, signals, ...)`: polls every server's /health at once from the calling thread, until
  all answer, one exits, one's `ready_timeout` passes, or a launcher signal arrives; `ServerFailure` says which;
* `log_tail(path, chars)`: the last lines of a server's log, for the console when it fails.
"""

from __future__ import annotations

import errno
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .preflight import render_args
from .vllm_schema import VllmServerConfig

__all__ = [
    "SERVER_LOG_SUFFIX",
    "ServerCommand",
    "ServerFailure",
    "ServerRun",
    "health_answers",
    "log_tail",
    "port_problem",
    "server_command",
    "start_server",
    "wait_until_ready",
]

SERVER_LOG_SUFFIX = ".vllm"  # logs/<peer id>.vllm.log and .vllm.cmd


@dataclass
class ServerCommand:
    """What the launcher starts for one peer's vLLM server: `argv` in `cwd`, the caller's environment plus `env`."""

    peer_id: str
    argv: list[str]
    env: dict[str, str]  # additions to the caller's environment only
    host: str
    port: int
    group_port: int
    gpus: str  # CUDA_VISIBLE_DEVICES locally; positions among the job's GPUs on SLURM
    log_path: Path
    cmd_path: Path
    cwd: Path
    ready_timeout: float

    @property
    def url(self) -> str:
        """Where it serves: `http://HOST:PORT` (what its peer's `--vllm_server_host/port` say)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


def server_command(
    peer_id: str,
    model: str,
    server: VllmServerConfig,
    *,
    port: int,
    group_port: int,
    peer_env: Mapping[str, str],
    logs: Path,
    cwd: Path,
    visible_devices: bool = True,
) -> ServerCommand:
    """The command of peer `peer_id`'s server, serving `model` on `server.gpus` at `server.host:port`.

    `peer_env`: the peer's environment additions, which the server gets too (a cache folder, say), but not its
    CUDA_VISIBLE_DEVICES. `visible_devices`: set CUDA_VISIBLE_DEVICES to the server's GPUs (locally); on SLURM the
    job maps its positions to devices itself."""
    program = (
        list(server.command) if server.command is not None else [sys.executable, "-m", "trl.cli.main", "vllm-serve"]
    )
    argv = [*program, "--model", model, "--host", server.host, "--port", str(port), *render_args(server.args)]
    env = {key: value for key, value in peer_env.items() if key != "CUDA_VISIBLE_DEVICES"}
    env.setdefault("PYTHONUNBUFFERED", "1")
    if visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = server.gpus
    return ServerCommand(
        peer_id=peer_id,
        argv=argv,
        env=env,
        host=server.host,
        port=port,
        group_port=group_port,
        gpus=server.gpus,
        log_path=logs / f"{peer_id}{SERVER_LOG_SUFFIX}.log",
        cmd_path=logs / f"{peer_id}{SERVER_LOG_SUFFIX}.cmd",
        cwd=cwd,
        ready_timeout=server.ready_timeout,
    )


# --------------------------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------------------------


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on `host:port`, in one line (something already listens there, or it cannot be
    bound there at all); None when it is free. Binds as a server does (SO_REUSEADDR: a port whose last connection
    is still closing counts as free) and closes at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:
        return f"cannot resolve host {host!r}: {exc}"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use (another program listens there)"
            return f"cannot listen on port {port} of {host}: {exc.strerror or exc}"
    return None


# Straight to the server, whatever http_proxy says: the server is on this machine (or this job's node).
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def health_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether GET `url` answers 200 within `timeout` seconds (a server that is not listening yet, an error status,
    a timeout: False)."""
    try:
        with _DIRECT.open(url, timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError, http.client.HTTPException):  # urllib's errors are OSErrors
        return False


def log_tail(path: str | os.PathLike, chars: int = 2000) -> str:
    """The last whole lines within the last `chars` characters of the log at `path` ("" when there is none yet);
    of a line redrawn with carriage returns (a progress bar), its last state only."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(size - chars, 0))
            data = handle.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").split("\n")
    if size > chars and len(lines) > 1:
        lines = lines[1:]  # the first one is cut
    return "\n".join(line.rsplit("\r", 1)[-1] for line in lines).strip("\n")


# --------------------------------------------------------------------------------------------------------------------
# Running one
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ServerRun:
    """One started server: its process, when it started and when it answered."""

    command: ServerCommand
    proc: subprocess.Popen
    started: float  # time.monotonic()
    ready_s: float | None = None  # seconds from its start until /health answered
    returncode: int | None = None  # once the backend saw it exit
    stop_sent: float | None = None  # time.monotonic() of the SIGTERM `terminate` sent
    kill_at: float | None = None  # time.monotonic() from which what is left of its group gets SIGKILL

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> int | None:
        """Its exit code once it has exited (collected, kept in `returncode`), None while it runs."""
        if self.returncode is None:
            self.returncode = self.proc.poll()
        return self.returncode

    def signal_group(self, sig: int) -> None:
        """`sig` to its process group (it and what it started), quietly once the group is gone."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """Whether a process of its group is left (it, or a child of it that outlived it)."""
        self.exited()  # collected: an exited server no longer counts
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (PermissionError: the number is another user's now)
            return False
        return True

    def terminate(self, grace: float) -> None:
        """SIGTERM to its process group, once; `kill_if_due` sends SIGKILL to what is left `grace` seconds later."""
        if self.stop_sent is None:
            self.stop_sent = time.monotonic()
            self.kill_at = self.stop_sent + grace
            self.signal_group(signal.SIGTERM)

    def kill_if_due(self, now: float | None = None) -> bool:
        """Once `kill_at` has passed: SIGKILL to what is left of its group (once). True when it sent one."""
        now = time.monotonic() if now is None else now
        if self.kill_at is None or now < self.kill_at:
            return False
        self.kill_at = None
        if not self.group_alive():
            return False
        self.signal_group(signal.SIGKILL)
        return True


def start_server(
    command: ServerCommand,
    *,
    open_log: Callable[[Path], BinaryIO],
    preexec: Callable[[], None] | None = None,
) -> ServerRun:
    """Start `command` in its own session (its own process group), its output and errors straight to its log
    (`open_log(command.log_path)`, opened for writing: readable by its owner only, as every log of the launcher).
    `preexec`: the child's `preexec_fn` (only while the caller runs no other thread). Raises OSError when it cannot
    start."""
    with open_log(command.log_path) as log:
        proc = subprocess.Popen(
            command.argv,
            cwd=command.cwd,
            env=command.full_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - the caller forks before any thread of its own starts
        )
    return ServerRun(command, proc, time.monotonic())


@dataclass(frozen=True)
class ServerFailure:
    """A server that did not become ready: it exited with `exit_code`, or (`exit_code` None) its /health did not
    answer 200 within its `ready_timeout`."""

    server: ServerRun
    exit_code: int | None
    waited: float  # seconds since it started

    @property
    def what(self) -> str:
        """What happened, after "vLLM server of peer X ": `never healthy after N s (URL)` or `exited with code C
        before it was ready`."""
        if self.exit_code is None:
            return f"never healthy after {self.server.command.ready_timeout:g} s ({self.server.command.health_url})"
        return f"exited with code {self.exit_code} before it was ready"


class SignalWait(Protocol):
    """What `wait_until_ready` needs of the launcher's signals (`backend.Signals`): those received so far, and a
    sleep that a new one cuts short."""

    received: list[int]

    def wait(self, seconds: float) -> None: ...


def wait_until_ready(
    servers: Sequence[ServerRun],
    signals: SignalWait,
    *,
    on_ready: Callable[[ServerRun], None] = lambda server: None,
    interval: float = 0.2,
    request_timeout: float = 1.0,
) -> ServerFailure | None:
    """Poll every server's /health, all at once, from this thread, until each answered 200 (`ready_s` set,
    `on_ready(server)` called then). Returns the first `ServerFailure` (a server that exited, or whose
    `ready_timeout` passed) at once, or None when all are ready or a launcher signal arrived (the caller reads
    `signals`). Sleeps with `signals.wait`, so a signal cuts a wait short."""
    pending = list(servers)
    while pending and not signals.received:
        for server in list(pending):
            waited = time.monotonic() - server.started
            code = server.exited()
            if code is not None:
                return ServerFailure(server, code, waited)
            if health_answers(server.command.health_url, timeout=request_timeout):
                server.ready_s = time.monotonic() - server.started
                pending.remove(server)
                on_ready(server)
            elif waited >= server.command.ready_timeout:
                return ServerFailure(server, None, waited)
        if pending:
            signals.wait(interval)
    return None
