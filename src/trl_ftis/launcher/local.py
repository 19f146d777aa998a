"""The local backend: every peer of a swarm is a process on this machine (`scheduler == "local"`).

`LocalBackend` follows `backend.Backend`; the driver runs it. Each peer starts in its own session and process group
(a Ctrl-C in the terminal reaches only the launcher), with a reader thread (its output to its log, raw, and to the
console, prefixed) and a waiter thread (its exit code, reported as soon as its main process exits, even if children
keep the pipe open). `processes.ProcessTracker` finds every process the peers started (process groups, sessions,
descendants, even orphaned ones) so that `stop` reaches them all: SIGTERM, `grace` seconds, then SIGKILL.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from .. import rules
from ..rules import redact_text
from .backend import Console, Outcome, PeerState, Signals, finished_outcome
from .commands import build_commands, check_files, describe_commands, keep_earlier, open_private, write_cmd_file
from .processes import ProcessTracker, die_with_parent
from .restart import restart_command
from .schema import SwarmConfig
from .summary import describe_code

__all__ = ["LocalBackend"]


@dataclass
class _PeerRun(PeerState):
    proc: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    waiter: threading.Thread | None = None


class LocalBackend:
    """Runs one swarm on this machine. (Not `trl_ftis.swarm.Swarm`, the round client each peer's trainer uses.)"""

    verb = "start"
    poll_interval = 0.1  # seconds between checks while waiting (a peer's exit wakes the driver at once)
    SCAN_EVERY = 0.5  # seconds between process scans while running (to remember re-parented descendants)

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
        return check_files(self.config)

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
        for problem in check_files(self.config):
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
        directory = rules.exchange_directory(self.config.exchange_url)
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        self.console.say(f"run_dir {self.config.run_dir}; exchange {redact_text(self.config.exchange_url)}")
        preexec = die_with_parent()
        started: list[tuple[int, _PeerRun, BinaryIO]] = []
        failure = None
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
            if code != 0 and self.config.on_failure == "continue":
                self.console.say(
                    f"peer {run.command.id} exited with code {describe_code(code)}; the others go on (on_failure: "
                    f"continue): restart it with `{restart_command(self.config, [run.command.id])}`"
                )
                continue
            if code != 0:
                self.console.say(
                    f"peer {run.command.id} exited with code {describe_code(code)}; stopping the other peers (resume "
                    f"the swarm from its checkpoints with `{restart_command(self.config)}`)"
                )
                return Outcome(1, f"peer {run.command.id} exited with code {code}")
            self.console.say(f"peer {run.command.id} finished (exit code 0)")
        if all(run.returncode is not None for run in self.runs if run.proc is not None):
            return finished_outcome([run.command.id for run in self.runs if run.returncode])
        if time.monotonic() >= self.next_scan:
            self.tracker.scan()  # remember descendants while their parents still lead back to a peer
            self.next_scan = time.monotonic() + self.SCAN_EVERY
        return None

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
        what = f"peers {', '.join(unfinished)}" if unfinished else f"processes left behind by the peers (pids {alive})"
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

    # ---- results ---------------------------------------------------------------------------------------------

    def states(self) -> list[PeerState]:
        return list(self.runs)

    def summary_row(self, state: PeerState, row: dict) -> dict:
        return row

    def summary_fields(self) -> dict:
        return {}
