"""The local backend: every peer of a swarm is a process on this machine (`scheduler == "local"`).

`LocalBackend` follows `backend.Backend`; the driver runs it. Each peer starts in its own session and process group
(a Ctrl-C in the terminal reaches only the launcher), with a reader thread (its output to its log, raw, and to the
console, prefixed) and a waiter thread (its exit code, reported as soon as its main process exits, even if children
keep the pipe open). `processes.ProcessTracker` finds every process the peers started (process groups, sessions,
descendants, even orphaned ones) so that `stop` reaches them all: SIGTERM, `grace` seconds, then SIGKILL.

A peer with a `vllm_server:` block gets its server first (`vllm_servers`): every server starts (its own process
group, tracked like a peer), then the launcher waits until each answers /health (all at once, from the main thread),
and only then starts the peers; a server that exits or never answers fails the swarm before any peer starts, its
log's last lines on the console. A server that exits while its peer runs fails that peer (`on_failure: stop`: the
swarm; `continue`: that peer only, which gets SIGTERM). A peer that ends, however it ends, has its server stopped
(SIGTERM, SIGKILL `server_grace` seconds later), so that its GPUs are free for what comes next.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, TextIO

from ..exchange.transports.registry import exchange_folder
from ..redaction import redact_text
from .backend import Console, Outcome, PeerState, Signals, finished_outcome
from .backends import DEFAULT_BACKEND, BackendKind, register_backend
from .commands import (
    build_commands,
    check_files,
    describe_commands,
    keep_earlier,
    open_private,
    write_cmd_file,
)
from .processes import ProcessTracker, die_with_parent
from .restart import restart_command
from .summary import describe_code
from .swarm_config import SwarmConfig
from .vllm_servers import ServerRun, log_tail, port_problem, start_server, wait_until_ready

__all__ = ["LocalBackend", "LocalKind"]


@dataclass
class _PeerRun(PeerState):
    proc: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    waiter: threading.Thread | None = None
    server: ServerRun | None = None  # its vLLM server, once started


class LocalBackend:
    """Runs one swarm on this machine. (Not `trl_ftis.swarm.Swarm`, the round client each peer's trainer uses.)"""

    verb = "start"
    poll_interval = 0.1  # seconds between checks while waiting (a peer's exit wakes the driver at once)
    SCAN_EVERY = 0.5  # seconds between process scans while running (to remember re-parented descendants)
    server_grace = 10.0  # seconds between the SIGTERM and the SIGKILL of a server whose peer ended
    SERVER_LOG_CHARS = 3000  # of a server that failed to become ready, the console shows its log's last lines

    def __init__(self, config: SwarmConfig):
        self.config = config
        self.exchange_url = config.exchange_url
        self.commands = build_commands(config)
        self.runs = [_PeerRun(command) for command in self.commands]
        self.exits: queue.SimpleQueue = queue.SimpleQueue()  # (index, exit code, time.monotonic()) from the waiters
        self.tracker = ProcessTracker()
        self.stop_started: float | None = None
        self.next_scan = 0.0
        self.console: Console | None = None
        self.signals: Signals | None = None

    # ---- before starting -----------------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        return check_files(self.config) + self.port_problems()

    def port_problems(self) -> list[str]:
        """Every server port (`port`, `group_port`) that something on this machine already listens on, one line
        each naming the peer, the key and the port."""
        given = {peer.id: peer.vllm_server for peer in self.config.peers if peer.vllm_server is not None}
        found = []
        for command in self.commands:
            server = command.server
            if server is None:
                continue
            for key, port in (("port", server.port), ("group_port", server.group_port)):
                problem = port_problem(server.host, port)
                if problem is not None:
                    drawn = getattr(given.get(command.id), key, port) is None
                    found.append(
                        f"peer {command.id!r}: its vLLM server's `vllm_server.{key}` {port}"
                        f"{' (drawn free a moment ago)' if drawn else ''} cannot be used: {problem}; "
                        f"{'start again' if drawn else f'pick another port, or leave `{key}` out for a free one'}"
                    )
        return found

    def dry_run(self, stream: TextIO) -> None:
        stream.write(
            f"# swarm: {len(self.commands)} peer(s), run_dir {self.config.run_dir}, "
            f"exchange {redact_text(self.config.exchange_url)}\n"
        )
        if any(command.main_process_port for command in self.commands):
            stream.write("# accelerate ports are picked again at launch\n")
        servers = [peer.vllm_server for peer in self.config.peers if peer.vllm_server is not None]
        if any(server.port is None or server.group_port is None for server in servers):
            stream.write("# vLLM server ports not set in the config are picked again at launch\n")
        stream.write(describe_commands(self.commands))
        for problem in self.problems():
            stream.write(f"# warning: {problem}\n")

    # ---- starting --------------------------------------------------------------------------------------------

    def start(self, console: Console, signals: Signals) -> Outcome | None:
        self.console, self.signals = console, signals
        try:
            return self._start()
        except OSError as exc:  # a run directory that cannot be written, say
            return Outcome(1, redact_text(f"could not start the swarm: {exc}"))

    def _start(self) -> Outcome | None:
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        (self.config.run_dir / "logs").mkdir(exist_ok=True)
        directory = exchange_folder(self.config.exchange_url)
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        self.console.say(f"run_dir {self.config.run_dir}; exchange {redact_text(self.config.exchange_url)}")
        preexec = die_with_parent()
        failure = self._start_servers(preexec)
        if failure is not None or self.signals.received:
            return failure  # the servers already started are stopped with the rest; no peer started
        started: list[tuple[int, _PeerRun, BinaryIO]] = []
        for index, run in enumerate(self.runs):
            if self.signals.received:
                break
            command = run.command
            command.output_dir.mkdir(parents=True, exist_ok=True)
            # A restarted peer's earlier log tells why it stopped.
            keep_earlier([command.log_path, command.cmd_path], private=True)
            write_cmd_file(command)
            # Owner only: a peer may print a secret (the log is the peer's output, raw).
            log = open_private(command.log_path, "wb", buffering=0)  # closed by the reader thread
            try:
                run.proc = subprocess.Popen(
                    command.argv,
                    cwd=command.cwd,
                    env=command.full_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stopped as a whole, and Ctrl-C reaches only us
                    preexec_fn=preexec,  # noqa: PLW1509 - no thread of ours runs yet (see below); it only calls prctl
                )
            except OSError as exc:
                log.close()
                run.status = "failed to start"
                self.console.say(f"peer {command.id}: could not start: {exc}")
                failure = Outcome(1, redact_text(f"could not start the swarm: {exc}"))
                break
            run.started, run.started_at, run.status, run.pid = time.monotonic(), time.time(), "running", run.proc.pid
            self.tracker.add_peer(run.proc.pid, command.id)
            started.append((index, run, log))
            self.console.say(f"started {command.id} (pid {run.proc.pid}); log {command.log_path}")
        # Threads only after every fork: preexec_fn is only safe while this process has no other threads of ours.
        for index, run, log in started:
            run.reader = threading.Thread(
                target=self._pump, args=(run, log), name=f"swarm-read-{run.command.id}", daemon=True
            )
            run.waiter = threading.Thread(
                target=self._wait, args=(index, run), name=f"swarm-wait-{run.command.id}", daemon=True
            )
            run.reader.start()
            run.waiter.start()
        return failure  # the peers already started are stopped and reported like the others

    def _start_servers(self, preexec) -> Outcome | None:
        """Start every peer's vLLM server, then wait until all answer /health (main thread, no thread of ours yet:
        the peers are forked after). None when all are ready (or a signal arrived meanwhile: the driver sees it)."""
        servers = []
        for run in self.runs:
            server = run.command.server
            if server is None:
                continue
            if self.signals.received:
                return None
            server.log_path.parent.mkdir(parents=True, exist_ok=True)
            keep_earlier([server.log_path, server.cmd_path], private=True)  # an earlier run's log tells why it ended
            write_cmd_file(
                server,
                f"vLLM server of peer {server.peer_id} on GPUs {server.gpus}, ready when {server.health_url} answers "
                f"(weight sync on port {server.group_port})",
            )
            try:
                run.server = start_server(
                    server, open_log=lambda path: open_private(path, "wb", buffering=0), preexec=preexec
                )
            except OSError as exc:
                run.status, run.note = "failed to start", f"its vLLM server could not start: {exc}"
                self.console.say(f"vLLM server of {run.command.id}: could not start: {exc}")
                return Outcome(1, redact_text(f"could not start the vLLM server of peer {run.command.id}: {exc}"))
            self.tracker.add_peer(run.server.pid, run.command.id)
            servers.append(run.server)
            self.console.say(
                f"started the vLLM server of {run.command.id} (pid {run.server.pid}, GPUs {server.gpus}); "
                f"log {server.log_path}"
            )
        if not servers:
            return None
        longest = max(server.command.ready_timeout for server in servers)
        self.console.say(f"waiting for {len(servers)} vLLM server(s) to answer /health (up to {longest:g} s)")

        def ready(server: ServerRun) -> None:
            command = server.command
            self.console.say(f"vLLM server of {command.peer_id} ready at {command.url} ({server.ready_s:.1f} s)")

        failed = wait_until_ready(servers, self.signals, on_ready=ready)
        if failed is None:
            return None
        peer_id, log_path = failed.server.command.peer_id, failed.server.command.log_path
        reason = f"vLLM server of peer {peer_id} {failed.what}"
        run = next(run for run in self.runs if run.command.id == peer_id)
        run.status, run.note = "failed to start", f"its vLLM server {failed.what}"
        tail = log_tail(log_path, self.SERVER_LOG_CHARS)
        said = f"the last lines of its log {log_path}:" if tail else f"its log {log_path} is empty"
        self.console.say(f"{reason}; no peer started; {said}")
        for line in tail.splitlines():
            self.console.say(f"  | {line}")
        return Outcome(1, redact_text(reason))

    def _pump(self, run: _PeerRun, log: BinaryIO):
        """Reader thread: each line to the log file (raw, unbuffered) and to the console (prefixed)."""
        try:
            for raw in iter(lambda: run.proc.stdout.readline(65536), b""):
                try:
                    log.write(raw)
                except OSError:
                    pass
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                # Progress bars redraw with '\r': show only the last state on the console.
                self.console.peer(run.command.id, text.rsplit("\r", 1)[-1] if "\r" in text else text)
        finally:
            log.close()
            run.proc.stdout.close()

    def _wait(self, index: int, run: _PeerRun):
        """Waiter thread: a peer's exit is reported when its main process exits, even if children keep the pipe."""
        code = run.proc.wait()
        self.exits.put((index, code, time.monotonic()))
        self.signals.wake()

    # ---- watching --------------------------------------------------------------------------------------------

    def _record_exit(self, index: int, code: int, when: float) -> _PeerRun | None:
        run = self.runs[index]
        if run.returncode is not None:
            return None
        run.returncode, run.ended = code, when
        if self.stop_started is not None and when >= self.stop_started:
            run.status = "stopped"
        else:
            run.status = "ok" if code == 0 else "failed"
        return run

    def poll(self) -> Outcome | None:
        while True:
            try:
                index, code, when = self.exits.get_nowait()
            except queue.Empty:
                break
            run = self._record_exit(index, code, when)
            if run is None:
                continue
            outcome = self._peer_ended(run, code)
            self._stop_server(run)  # its GPUs are free for what comes next, however the peer ended
            if outcome is not None:
                return outcome
        failure = self._watch_servers()
        if failure is not None:
            return failure
        if all(run.returncode is not None for run in self.runs if run.proc is not None):
            return finished_outcome([run.command.id for run in self.runs if run.returncode])
        if time.monotonic() >= self.next_scan:
            self.tracker.scan()  # remember descendants while their parents still lead back to a peer
            self.next_scan = time.monotonic() + self.SCAN_EVERY
        return None

    def _peer_ended(self, run: _PeerRun, code: int) -> Outcome | None:
        """Say how a peer ended; the `Outcome` that ends the swarm when it failed (`on_failure: stop`)."""
        server = run.server
        why = ""
        if code != 0 and server is not None and server.stop_sent is None and server.exited() is not None:
            # Its server went first (its exit seen in the same poll): most likely why the peer failed.
            why = f" (its vLLM server had exited with code {describe_code(server.returncode)})"
            run.note = f"its vLLM server exited with code {describe_code(server.returncode)}"
        if code != 0 and self.config.on_failure == "continue":
            self.console.say(
                f"peer {run.command.id} exited with code {describe_code(code)}{why}; the others go on (on_failure: "
                f"continue): restart it with `{restart_command(self.config, [run.command.id])}`"
            )
        elif code != 0:
            self.console.say(
                f"peer {run.command.id} exited with code {describe_code(code)}{why}; stopping the other peers (resume "
                f"the swarm from its checkpoints with `{restart_command(self.config)}`)"
            )
            return Outcome(1, f"peer {run.command.id} exited with code {code}{why}")
        else:
            self.console.say(f"peer {run.command.id} finished (exit code 0){why}")
        return None

    def _watch_servers(self) -> Outcome | None:
        """A server that exited while its peer runs fails that peer; a server stopped `server_grace` seconds ago
        that still runs gets SIGKILL."""
        now = time.monotonic()
        for run in self.runs:
            server = run.server
            if server is None:
                continue
            if server.stop_sent is not None:
                if server.kill_if_due(now):
                    self.console.say(
                        f"vLLM server of {run.command.id}: processes left {self.server_grace:g} s after SIGTERM; "
                        "sending SIGKILL"
                    )
                continue
            code = server.exited()
            if code is None or run.proc is None or run.returncode is not None:
                continue
            server.terminate(self.server_grace)  # what is left of its group, as for a server whose peer ended
            run.note = f"its vLLM server exited with code {describe_code(code)} while it ran"
            if self.config.on_failure == "continue":
                self.console.say(
                    f"vLLM server of {run.command.id} exited with code {describe_code(code)} while its peer ran; "
                    f"stopping {run.command.id} (SIGTERM); the others go on (on_failure: continue)"
                )
                try:
                    os.killpg(run.proc.pid, signal.SIGTERM)  # it exits failed; `stop` reaches what is left at the end
                except (ProcessLookupError, PermissionError):
                    pass
                continue
            self.console.say(
                f"vLLM server of {run.command.id} exited with code {describe_code(code)} while its peer ran; stopping "
                f"the peers (resume the swarm from its checkpoints with `{restart_command(self.config)}`)"
            )
            return Outcome(1, f"vLLM server of peer {run.command.id} exited with code {code} while its peer ran")
        return None

    def _stop_server(self, run: _PeerRun) -> None:
        """SIGTERM to the server of a peer that ended (SIGKILL follows in `_watch_servers`)."""
        if run.server is not None and run.server.stop_sent is None and run.server.exited() is None:
            self.console.say(f"stopping the vLLM server of {run.command.id}: its peer ended")
            run.server.terminate(self.server_grace)

    # ---- stopping --------------------------------------------------------------------------------------------

    def stop(self, grace: float) -> None:
        """SIGTERM everything the swarm started, wait up to `grace` seconds, then SIGKILL what is left."""
        self.stop_started = time.monotonic()
        alive = self.tracker.alive()
        if not alive:
            return
        unfinished = [
            r.command.id for r in self.runs if r.proc is not None and r.returncode is None and r.proc.poll() is None
        ]
        servers = [r.command.id for r in self.runs if r.server is not None and r.server.exited() is None]
        parts = [f"peers {', '.join(unfinished)}"] if unfinished else []
        parts += [f"the vLLM servers of {', '.join(servers)}"] if servers else []
        what = " and ".join(parts) or f"processes left behind by the peers (pids {alive})"
        self.console.say(f"stopping {what}: SIGTERM, then SIGKILL after {grace:g}s")
        signals_before = self.signals.count
        self.tracker.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.signals.count == signals_before:
            self.signals.wait(min(0.05, max(deadline - time.monotonic(), 0)))
            alive = self.tracker.alive()
            if not alive:
                return
        if self.signals.count != signals_before:
            self.console.say("second signal: killing the peers now")
        # SIGKILL can't be ignored; repeat in case something forked between scan and kill.
        deadline = time.monotonic() + 10.0
        while alive and time.monotonic() < deadline:
            self.console.say(f"still running: pids {alive}; sending SIGKILL")
            self.tracker.signal_all(signal.SIGKILL)
            time.sleep(0.05)
            for _ in range(20):
                alive = self.tracker.alive()
                if not alive:
                    break
                time.sleep(0.05)
        if alive:
            self.console.say(f"WARNING: could not stop pids {alive} (uninterruptible?); they may still be running")

    def finish(self, timeout: float = 10.0) -> None:
        """Collect exit codes and the last output lines of every peer."""
        deadline = time.monotonic() + timeout
        for run in self.runs:
            if run.waiter is not None:
                run.waiter.join(max(deadline - time.monotonic(), 0.1))
        while True:
            try:
                self._record_exit(*self.exits.get_nowait())
            except queue.Empty:
                break
        for run in self.runs:
            if run.reader is not None:
                run.reader.join(max(deadline - time.monotonic(), 0.1))
            if run.server is not None and run.server.exited() is None:
                try:  # collect its exit code (`stop` has stopped it)
                    run.server.returncode = run.server.proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    pass

    # ---- results ---------------------------------------------------------------------------------------------

    def states(self) -> list[PeerState]:
        return list(self.runs)

    def summary_row(self, state: PeerState, row: dict) -> dict:
        assert isinstance(state, _PeerRun)
        server = state.command.server
        if server is not None:
            ran = state.server
            row["vllm_server"] = {
                "url": server.url,
                "group_port": server.group_port,
                "gpus": server.gpus,
                "log": str(server.log_path),
                "pid": None if ran is None else ran.pid,
                "ready_s": None if ran is None or ran.ready_s is None else round(ran.ready_s, 3),
                "exit_code": None if ran is None else ran.returncode,
            }
        return row

    def summary_fields(self) -> dict:
        return {}


class LocalKind(BackendKind):
    """The default backend: every peer a process on this machine (`LocalBackend`); no keys of its own."""

    name: ClassVar[str] = DEFAULT_BACKEND
    where: ClassVar[str] = "on this machine"
    runs_here: ClassVar[bool] = True

    def create(self, config: Any) -> LocalBackend:
        return LocalBackend(config)


register_backend(LocalKind())
