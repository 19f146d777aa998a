"""The backend protocol: what a place that runs a swarm's peers (this machine, a SLURM cluster, ...) provides to the
one driver every backend shares (`driver.drive`), and the pieces the driver hands to it.

A backend starts the peers, watches them, stops them and gathers their logs and results; the driver does everything
else the same way for all of them: the pre-start check, the signal handlers, the prefixed console, the loop that
watches, the stop that always runs, the summary table and `summary.json`, and the exit code. A new backend (Ray,
Kubernetes, ...) is a class that follows `Backend` and its `backends.BackendKind` (its name, its own config sections,
its flag), registered with `backends.register_backend`.

* `Backend`: the protocol (see its methods for the contract).
* `Outcome`: how a swarm ended, `(exit code, reason)`; `interrupted(signal)` for Ctrl-C, SIGTERM and SIGHUP.
* `Console`: the swarm's output, `[<id>] ` before each peer line and `[swarm] ` before the launcher's own, padded so
  the columns line up; safe from several threads; URL passwords in the launcher's own lines are redacted.
* `Signals`: the signals the launcher received (the driver's handlers record them) and the one place a backend
  sleeps, waking up at once on a signal or when `wake()` is called (by a thread that saw a peer exit).
* `PeerState`: what the summary needs of one peer (status, exit code, times, pid, note); each backend's own record of
  a peer extends it.
* `short_error`: an exception's text for one console line.
"""

from __future__ import annotations

import queue
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TextIO

from ..exit_codes import INTERRUPTED_EXIT_CODE
from ..redaction import redact_text

if TYPE_CHECKING:
    from .commands import PeerCommand

__all__ = ["Backend", "Console", "Outcome", "PeerState", "Signals", "finished_outcome", "short_error"]


def short_error(exc: BaseException) -> str:
    """An exception's text on one line, at most 400 characters (for a console line and `summary.json`)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."


@dataclass(frozen=True)
class Outcome:
    """How a swarm ended: the launcher's exit code and the reason it says (and writes to `summary.json`)."""

    code: int
    reason: str

    @classmethod
    def interrupted(cls, signum: int) -> Outcome:
        return cls(INTERRUPTED_EXIT_CODE, f"interrupted by {signal.Signals(signum).name}")


def finished_outcome(failed: list[str]) -> Outcome:
    """Every peer has exited: 0 when none failed, else 1 naming those that did (`on_failure: continue` lets the others
    finish after one fails)."""
    if not failed:
        return Outcome(0, "all peers finished")
    return Outcome(1, f"all peers ended; failed: {', '.join(failed)}")


@dataclass
class PeerState:
    """One peer as the summary shows it. `started` and `ended` are `time.monotonic()` (wall time); `started_at` is
    the clock of the peer's files (a peer summary file older than it is left from an earlier run)."""

    command: PeerCommand
    status: str = "not started"  # ok, failed, stopped, failed to start, not started (SLURM: not submitted, ...)
    returncode: int | None = None
    started: float = 0.0
    started_at: float = 0.0
    ended: float | None = None
    pid: int | None = None
    note: str | None = None


class Console:
    """The swarm's console: one prefix per peer id, `[swarm]` for the launcher's own lines."""

    def __init__(self, stream: TextIO, peer_ids: list[str]):
        self.stream = stream
        width = max((len(peer_id) for peer_id in peer_ids), default=0)
        self.prefixes = {peer_id: f"[{peer_id}]".ljust(width + 2) + " " for peer_id in peer_ids}
        self.own_prefix = "[swarm]".ljust(max(width + 2, 7)) + " "
        self.lock = threading.Lock()

    def emit(self, line: str) -> None:
        with self.lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed console (e.g. `| head`) must not stop the supervision; the logs still get everything

    def say(self, message: str) -> None:
        """A launcher status line (`[swarm] ...`); URL passwords in it (an exception's text, say) are redacted."""
        self.emit(self.own_prefix + redact_text(message))

    def peer(self, peer_id: str, line: str) -> None:
        """A line a peer printed, under its prefix."""
        self.emit(self.prefixes[peer_id] + line)


class Signals:
    """Signals received (the driver's handler appends them) and a sleep that any of them, or `wake()`, cuts short."""

    def __init__(self):
        self.received: list[int] = []
        self._wake: queue.SimpleQueue = queue.SimpleQueue()  # SimpleQueue.put is safe in a signal handler

    def handler(self, signum, frame) -> None:
        self.received.append(signum)
        self._wake.put(signum)

    def wake(self) -> None:
        self._wake.put(None)

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, less when a signal arrives or `wake()` is called meanwhile."""
        try:
            self._wake.get(timeout=max(seconds, 0.0))
        except queue.Empty:
            pass

    @property
    def count(self) -> int:
        return len(self.received)

    def outcome(self) -> Outcome | None:
        """`Outcome.interrupted` for the first signal received, None while there was none."""
        return Outcome.interrupted(self.received[0]) if self.received else None


class Backend(Protocol):
    """What runs a swarm's peers somewhere. The driver calls, in this order:

    1. `problems()` before anything: what this machine lacks (missing scripts, a scheduler's commands); a non-empty
       list stops the launch with exit code 2, nothing started or written.
    2. `start(console, signals)`: start (or submit) every peer; `None` when they all started, else the `Outcome`
       that ends the swarm (a peer that could not start, a signal meanwhile).
    3. `poll()` repeatedly, `poll_interval` seconds apart at most (`signals.wait` sleeps, cut short by signals and
       `signals.wake()`): `None` while the swarm runs, the `Outcome` when every peer finished or one failed.
    4. Always, whatever happened, even after an exception: `stop(grace)` (stop everything still running: a polite
       stop, `grace` seconds, then a forced one, at once when a new signal arrives meanwhile) and `finish()` (the
       last output, every peer's final status).
    5. `states()` for the summary rows, `summary_row(state, row)` to add the backend's own columns to each row, and
       `summary_fields()` for the backend's own top-level keys of `summary.json`; `exchange_url` is the URL the
       peers used.

    `dry_run(stream)` prints what `start` would do and starts nothing. `verb` says what `start` does ("start",
    "submit") in "cannot <verb> the swarm".
    """

    verb: str
    poll_interval: float
    exchange_url: str

    def problems(self) -> list[str]: ...

    def dry_run(self, stream: TextIO) -> None: ...

    def start(self, console: Console, signals: Signals) -> Outcome | None: ...

    def poll(self) -> Outcome | None: ...

    def stop(self, grace: float) -> None: ...

    def finish(self) -> None: ...

    def states(self) -> list[PeerState]: ...

    def summary_row(self, state: PeerState, row: dict) -> dict: ...

    def summary_fields(self) -> dict: ...
