"""Process supervision: `run_swarm` starts every peer of a `SwarmConfig`, streams their output, stops all of them when
one fails or on a signal, and writes the summary.

`Supervisor` runs one swarm: each peer in its own session and process group, a reader thread per peer (console and
log) and a waiter thread per peer (its exit code). `_ProcessTracker` finds every process the peers started, through
their process groups and, on Linux, `/proc` (descendants that left the group, even once orphaned), so that none
outlives the launcher; `_die_with_parent` makes the peers' main processes follow a launcher killed with SIGKILL.

(`Supervisor` is not `trl_ftis.swarm.Swarm`, the round client each peer's trainer uses to exchange samples.)
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..rules import redact_text
from .commands import PeerCommand, _write_cmd_file, build_commands, check_files
from .schema import SwarmConfig, SwarmConfigError, exchange_dir
from .summary import _describe_code, _summary_rows, report_summary

__all__ = ["INTERRUPTED_EXIT_CODE", "Supervisor", "run_swarm"]

INTERRUPTED_EXIT_CODE = 130


# --------------------------------------------------------------------------------------------------------------------
# Finding every process a peer started
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    sid: int
    state: str
    start: int  # clock ticks after boot: with the pid, identifies a process even if its pid is reused later


def _read_proc_table() -> dict[int, _Proc] | None:
    """Every live process from /proc (Linux), zombies left out; None where /proc is not available."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    if "self" not in names:
        return None
    table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces and parentheses: fields restart after the last ')'.
        fields = data[data.rfind(b")") + 2 :].split()
        try:
            proc = _Proc(
                int(name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), int(fields[19])
            )
        except (IndexError, ValueError):
            continue
        if proc.state not in ("Z", "X"):  # a zombie has already exited; its parent just has not collected it
            table[proc.pid] = proc
    return table


class _ProcessTracker:
    """Finds every live process started by the peers, so that none outlives the launcher.

    Each peer starts in its own session and process group (id = its pid), and most of what it starts stays in
    that group. Some programs move their children into new sessions, e.g. torchrun (accelerate launch with
    several processes) puts every worker in its own: those are found as descendants of a peer and remembered by
    (pid, start time), so they are still found once orphaned. Without /proc (not Linux), only process groups are
    used.
    """

    def __init__(self):
        self.groups: dict[int, str] = {}  # pgid (= peer pid) -> peer id
        self.leaders: dict[int, int | None] = {}  # peer pid -> start time (None: exited before we looked)
        self.known: dict[int, int] = {}  # pid -> start time
        self.procfs = _read_proc_table() is not None
        self.me = os.getpid()

    def add_peer(self, pid: int, peer_id: str):
        self.groups[pid] = peer_id
        if self.procfs:
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    data = handle.read()
                self.leaders[pid] = int(data[data.rfind(b")") + 2 :].split()[19])
            except (OSError, IndexError, ValueError):
                self.leaders[pid] = None

    def scan(self) -> dict[int, _Proc]:
        """Live processes belonging to the swarm (Linux); also refreshes what is remembered."""
        table = _read_proc_table()
        if table is None:
            return {}
        found = {}
        for proc in table.values():
            if proc.pid == self.me:
                continue
            if proc.pgrp in self.groups or proc.sid in self.groups or self.known.get(proc.pid) == proc.start:
                found[proc.pid] = proc
        children: dict[int, list[_Proc]] = {}
        for proc in table.values():
            children.setdefault(proc.ppid, []).append(proc)
        # A peer's own pid counts only while it is the same process (its pid may be reused once it has exited).
        leaders = [pid for pid, start in self.leaders.items() if pid in table and table[pid].start == start]
        stack = list(found) + leaders
        while stack:
            for child in children.get(stack.pop(), ()):
                if child.pid not in found and child.pid != self.me:
                    found[child.pid] = child
                    stack.append(child.pid)
        self.known = {pid: proc.start for pid, proc in found.items()}
        return found

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def alive(self) -> list[int]:
        """Pids still running (Linux), or pgids of groups that still have members (elsewhere)."""
        if self.procfs:
            return sorted(self.scan())
        return [pgid for pgid in self.groups if self._group_alive(pgid)]

    def signal_all(self, sig: int):
        """`sig` to every peer process group with live members and to every other swarm process found."""
        if not self.procfs:
            for pgid in self.groups:
                _quiet_killpg(pgid, sig)
            return
        found = self.scan()
        live_groups = {proc.pgrp for proc in found.values() if proc.pgrp in self.groups}
        for pgid in live_groups:
            _quiet_killpg(pgid, sig)  # atomic for the whole group, even for a process forked a moment ago
        for proc in found.values():
            if proc.pgrp not in live_groups:
                try:
                    os.kill(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass


def _quiet_killpg(pgid: int, sig: int):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent():
    """preexec_fn: on Linux, SIGTERM the peer if the launcher dies without stopping it (e.g. kill -9)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


# --------------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _PeerRun:
    command: PeerCommand
    proc: subprocess.Popen | None = None
    started: float = 0.0  # time.monotonic()
    started_at: float = 0.0  # time.time(), for the summary file's staleness check
    ended: float | None = None
    returncode: int | None = None
    status: str = "not started"
    reader: threading.Thread | None = None
    waiter: threading.Thread | None = None


class Supervisor:
    """Runs one swarm on this machine: starts its peers (`start`), waits until they all finished, one failed or a
    signal came (`supervise`), stops every process they started (`stop`) and collects their exit codes and last output
    (`finish`). `run_swarm` drives it; `runs` then holds one `_PeerRun` per peer, in config order."""

    POLL = 0.1  # seconds between checks for signals while waiting
    SCAN_EVERY = 0.5  # seconds between /proc scans while running (to remember re-parented descendants)

    def __init__(self, config: SwarmConfig, grace: float, stream: TextIO):
        self.config = config
        self.grace = grace
        self.stream = stream
        self.commands = build_commands(config)
        self.runs = [_PeerRun(c) for c in self.commands]
        width = max(len(c.id) for c in self.commands)
        self.prefixes = {c.id: f"[{c.id}]".ljust(width + 2) + " " for c in self.commands}
        self.own_prefix = "[swarm]".ljust(max(width + 2, 7)) + " "
        self.lock = threading.Lock()
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # SimpleQueue.put is safe in a signal handler
        self.signals: list[int] = []
        self.stop_started: float | None = None
        self.tracker = _ProcessTracker()

    # ---- output ----------------------------------------------------------------------------------------------

    def emit(self, line: str):
        with self.lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed console (e.g. `| head`) must not stop the supervision; the logs still get everything

    def say(self, message: str):
        """A launcher status line (`[swarm] ...`); URL passwords in it (an exception's text, say) are redacted."""
        self.emit(self.own_prefix + redact_text(message))

    def _pump(self, run: _PeerRun, log):
        """Reader thread: each line to the log file (raw, unbuffered) and to the console (prefixed)."""
        prefix = self.prefixes[run.command.id]
        try:
            for raw in iter(lambda: run.proc.stdout.readline(65536), b""):
                try:
                    log.write(raw)
                except OSError:
                    pass
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                # Progress bars redraw with '\r': show only the last state on the console.
                text = text.rsplit("\r", 1)[-1] if "\r" in text else text
                self.emit(prefix + text)
        finally:
            log.close()
            run.proc.stdout.close()

    def _wait(self, index: int, run: _PeerRun):
        """Waiter thread: a peer's exit is reported when its main process exits, even if children keep the pipe."""
        code = run.proc.wait()
        self.events.put(("exit", index, code, time.monotonic()))

    def _on_signal(self, signum, frame):
        self.signals.append(signum)
        self.events.put(("signal", signum, None, None))

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def start(self):
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        (self.config.run_dir / "logs").mkdir(exist_ok=True)
        directory = exchange_dir(self.config.exchange_url)
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        self.say(f"run_dir {self.config.run_dir}; exchange {redact_text(self.config.exchange_url)}")
        preexec = _die_with_parent()
        logs = []
        error = None
        for index, run in enumerate(self.runs):
            if self.signals:
                break
            command = run.command
            command.output_dir.mkdir(parents=True, exist_ok=True)
            _write_cmd_file(command)
            log = open(command.log_path, "wb", buffering=0)  # noqa: SIM115 - closed by the reader thread
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
                self.say(f"peer {command.id}: could not start: {exc}")
                error = exc
                break
            run.started, run.started_at, run.status = time.monotonic(), time.time(), "running"
            self.tracker.add_peer(run.proc.pid, command.id)
            logs.append((index, run, log))
            self.say(f"started {command.id} (pid {run.proc.pid}); log {command.log_path}")
        # Threads only after every fork: preexec_fn is only safe while this process has no other threads of ours.
        for index, run, log in logs:
            run.reader = threading.Thread(
                target=self._pump, args=(run, log), name=f"swarm-read-{run.command.id}", daemon=True
            )
            run.waiter = threading.Thread(
                target=self._wait, args=(index, run), name=f"swarm-wait-{run.command.id}", daemon=True
            )
            run.reader.start()
            run.waiter.start()
        if error is not None:
            raise error  # after the threads: the peers already started are stopped and reported like the others

    def _record_exit(self, index: int, code: int, when: float):
        run = self.runs[index]
        if run.returncode is not None:
            return
        run.returncode, run.ended = code, when
        if self.stop_started is not None and when >= self.stop_started:
            run.status = "stopped"
        else:
            run.status = "ok" if code == 0 else "failed"

    def supervise(self) -> tuple[int, str]:
        """Waits until every peer exited 0, one failed, or a signal came. Returns (exit code, reason)."""
        started = [r for r in self.runs if r.proc is not None]
        remaining = len(started)
        next_scan = 0.0
        while True:
            if self.signals:
                name = signal.Signals(self.signals[0]).name
                return INTERRUPTED_EXIT_CODE, f"interrupted by {name}"
            if remaining == 0:
                return 0, "all peers finished"
            try:
                kind, a, b, c = self.events.get(timeout=self.POLL)
            except queue.Empty:
                kind = None
            if kind == "exit":
                self._record_exit(a, b, c)
                remaining -= 1
                run = self.runs[a]
                if b != 0:
                    self.say(f"peer {run.command.id} exited with code {_describe_code(b)}; stopping the other peers")
                    return 1, f"peer {run.command.id} exited with code {b}"
                self.say(f"peer {run.command.id} finished (exit code 0)")
            if self.tracker.procfs and time.monotonic() >= next_scan:
                self.tracker.scan()  # remember descendants while their parents still lead back to a peer
                next_scan = time.monotonic() + self.SCAN_EVERY

    def stop(self):
        """SIGTERM everything the swarm started, wait up to `grace` seconds, then SIGKILL what is left."""
        self.stop_started = time.monotonic()
        alive = self.tracker.alive()
        if not alive:
            return
        unfinished = [
            r.command.id for r in self.runs if r.proc is not None and r.returncode is None and r.proc.poll() is None
        ]
        what = f"peers {', '.join(unfinished)}" if unfinished else f"processes left behind by the peers (pids {alive})"
        self.say(f"stopping {what}: SIGTERM, then SIGKILL after {self.grace:g}s")
        signals_before = len(self.signals)
        self.tracker.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and len(self.signals) == signals_before:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
            alive = self.tracker.alive()
            if not alive:
                return
        if len(self.signals) != signals_before:
            self.say("second signal: killing the peers now")
        # SIGKILL can't be ignored; repeat in case something forked between scan and kill.
        deadline = time.monotonic() + 10.0
        while alive and time.monotonic() < deadline:
            self.say(f"still running: pids {alive}; sending SIGKILL")
            self.tracker.signal_all(signal.SIGKILL)
            time.sleep(0.05)
            for _ in range(20):
                alive = self.tracker.alive()
                if not alive:
                    break
                time.sleep(0.05)
        if alive:
            self.say(f"WARNING: could not stop pids {alive} (uninterruptible?); they may still be running")

    def finish(self, timeout: float = 10.0):
        """Collect exit codes and the last output lines of every peer."""
        deadline = time.monotonic() + timeout
        for run in self.runs:
            if run.waiter is not None:
                run.waiter.join(max(deadline - time.monotonic(), 0.1))
        while True:
            try:
                kind, a, b, c = self.events.get_nowait()
            except queue.Empty:
                break
            if kind == "exit":
                self._record_exit(a, b, c)
        for run in self.runs:
            if run.reader is not None:
                run.reader.join(max(deadline - time.monotonic(), 0.1))


def _refuse_to_start(grace: float, problems: list[str], verb: str) -> None:
    """`ValueError` for a negative `grace`, `SwarmConfigError` listing `problems` ("cannot <verb> the swarm"), before
    anything is started or submitted."""
    if not (grace >= 0):
        raise ValueError(f"grace must be >= 0 seconds, got {grace}")
    if problems:
        raise SwarmConfigError(f"cannot {verb} the swarm:\n" + "\n".join(f"  - {p}" for p in problems), problems)


def _install_handlers(handler) -> dict:
    """Route SIGINT/SIGTERM/SIGHUP to `handler` (main thread only; elsewhere Python cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            previous[sig] = signal.signal(sig, handler)
    return previous


def run_swarm(config: SwarmConfig, *, grace: float = 10.0, stream: TextIO | None = None) -> int:
    """Start every peer, supervise them, print a summary table; returns the exit code for the command line.

    * 0: every peer exited 0.
    * 1: a peer exited non-zero (or could not start); every other peer was stopped.
    * 130: SIGINT (Ctrl-C), SIGTERM or SIGHUP reached the launcher; every peer was stopped.

    Stopping means SIGTERM to each peer's process group (and to any process a peer moved out of it), `grace`
    seconds to exit, then SIGKILL. A second Ctrl-C skips the rest of the grace period. The same clean-up runs when
    all peers succeeded, for anything they left running, so no process started by the swarm outlives this call.

    Console lines are written to `stream` (default: sys.stdout) prefixed with `[<id>]`; each peer's raw output
    goes to `<run_dir>/logs/<id>.log`, its command and environment (secrets redacted) to `<id>.cmd`, and the
    summary table to `<run_dir>/summary.json`. Signal handlers are installed only when called from the main thread.

    Raises `SwarmConfigError` before anything starts when a script or accelerate config file is missing.

    A config with `launcher: slurm` (`config.scheduler == "slurm"`) runs through `launcher.slurm.run_slurm_swarm`
    instead: one SLURM job per peer, the same exit codes, console lines and summary (docs/swarm-launcher.md).
    """
    if config.scheduler == "slurm":  # one SLURM job per peer: launcher/slurm.py
        from .slurm import run_slurm_swarm

        return run_slurm_swarm(config, grace=grace, stream=stream)
    stream = sys.stdout if stream is None else stream
    _refuse_to_start(grace, check_files(config), "start")

    supervisor = Supervisor(config, grace, stream)
    previous = _install_handlers(supervisor._on_signal)
    code, reason = 1, "launcher error"
    try:
        try:
            supervisor.start()
            code, reason = supervisor.supervise()
        except OSError as exc:
            code, reason = 1, redact_text(f"could not start the swarm: {exc}")
        finally:
            # Runs on success, failure, signal and on any bug above: nothing may outlive the launcher.
            supervisor.stop()
            supervisor.finish()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    rows = _summary_rows(supervisor.runs)
    summary = {
        "exit_code": code,
        "reason": reason,
        "run_dir": str(config.run_dir),
        "exchange_url": redact_text(config.exchange_url),
        "config": os.path.abspath(config.source) if config.source else None,
        "peers": rows,
    }
    report_summary(config.run_dir, summary, say=supervisor.say, emit=supervisor.emit)
    return code
