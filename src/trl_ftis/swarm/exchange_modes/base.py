"""What every exchange mode shares: the [`ExchangeMode`] protocol the round runner drives, the narrow [`RoundHost`]
interface a mode is handed (what it may ask of the runner), the [`RoundOutcome`] a step gets, and the
[`ExchangeWorker`] thread of the modes that run rounds in the background."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

if TYPE_CHECKING:
    from ...peer_rows import PeerRow, ScoredRow
    from ..round_budget import RoundResult
    from ..round_windows import RoundWindow, WindowHost

__all__ = [
    "ExchangeMode",
    "ExchangeWorker",
    "LedgerPort",
    "RoundAbandoned",
    "RoundHost",
    "RoundOutcome",
    "Stateless",
    "SwarmPort",
    "WorkerMode",
]

WORKER_THREAD = "ftis-exchange"


class RoundOutcome(NamedTuple):
    """What one round gives the training step."""

    rows: list[ScoredRow]
    """The received rows to train on, with their group statistics (before they are shared out between processes)."""
    own_statistics: tuple[list[float], list[int]] | None
    """Horizontal mode: the own rows' advantages and group max lengths over the mixed groups; else `None`."""
    metrics: dict[str, float]
    """The round's metrics (`ftis/peer_rows_received`, `ftis/exchange/...`, `ftis/peers/<peer>/...`)."""


class RoundAbandoned(Exception):
    """Raised inside a worker's round once [`ExchangeWorker.close`] was called: nobody will use its result."""


class SwarmPort(Protocol):
    """What a mode may ask of the swarm client (`trl_ftis.swarm.client.Swarm`): publish, collect, stop a wait, and
    the window it reads through (the mode's own, [`ExchangeMode.window`])."""

    window: RoundWindow
    limits: Any
    """What one message may hold (`trl_ftis.exchange.Limits`): a saved queue's rows are checked against it."""

    def publish(self, rows: Sequence[PeerRow], round: int) -> int:
        """Publish this peer's rows of `round`; returns the bytes sent."""

    def collect(self, round: int, *, max_rows: int | None = None, share: int | None = None) -> RoundResult:
        """What arrived for `round` (waiting as the window says)."""

    def interrupt(self) -> None:
        """Make a round waiting for peers (in a worker) stop waiting."""


class LedgerPort(Protocol):
    """What a mode may ask of the ledger (`trl_ftis.swarm.ledger.PeerRowLedger`): count rows and rounds."""

    def count(self, sender: Any, reason: str, count: int = 1) -> None:
        """Count `count` rows of `sender` dropped for `reason` (one of the mode's [`ExchangeMode.drop_reasons`] or
        the ledger's own)."""

    def record_round(self, *, rows_sent: int, bytes_sent: int, rows_received: int, accepted, refused) -> None:
        """Count a round's totals."""

    def record_accepted(self, rows: Sequence[ScoredRow]) -> None:
        """Count rows trained on."""

    def peer_name(self, sender: str) -> str:
        """The bounded name a sender's metrics use."""


class RoundHost(Protocol):
    """What an exchange mode may ask of the round runner (`trl_ftis.swarm.rounds.RoundRunner`), which hands itself
    to the mode it builds: its settings, the swarm client and the ledger, the lock of the tokenizer and reward
    functions, the whole round, and the pieces of it a mode that collects apart from its steps needs."""

    config: Any
    """The trainer's `FTISConfig` (read only)."""
    swarm: SwarmPort
    ledger: LedgerPort
    lock: threading.RLock
    """Held while the tokenizer, the reward functions or the ledger are used."""

    def run_round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """The whole round (publish, collect, admit, select, score, normalise); never raises because of the rows."""

    def peer_row_cap(self, local_rows: int) -> int | None:
        """The most peer rows a step with `local_rows` own rows trains on."""

    def queue_rows(self, local_rows: int) -> int:
        """The rows a queue of peer rows holds for steps of `local_rows` own rows."""

    def score(self, rows: Sequence[PeerRow]) -> list[ScoredRow]:
        """Received rows admitted, rescored and normalised as a round's (no selection); never raises because of
        the rows (an unexpected error drops them all, `internal_error`). Hold [`lock`]."""

    def round_metrics(self, result: RoundResult, rows: Sequence[ScoredRow], bytes_sent: int) -> dict[str, float]:
        """A collect's metrics (`ftis/peer_rows_received`, `ftis/exchange/...`, `ftis/peers/<peer>/...`)."""


class ExchangeMode(Protocol):
    """How a trainer's rounds meet its training steps: one class per mode, registered by name
    (`trl_ftis.exchange_mode_registry.register_exchange_mode`), built once by the round runner with a [`RoundHost`]
    (`mode = Mode(host)`), which then drives it. The mode owns everything of its own: the round window the swarm
    client reads through ([`window`]), a worker thread, a queue, the drop reasons it counts, and what of it a
    checkpoint keeps ([`state_dict`], checked by [`check_state`] before [`load_state_dict`] restores it)."""

    name: ClassVar[str]
    """The `exchange_mode` value that selects it."""
    horizontal: ClassVar[bool]
    """Whether `collaboration_mode="horizontal"` works with it: the step's own rows are normalised with the same
    round's peer rows, which only a mode that collects at the step has."""
    window: ClassVar[Callable[[WindowHost], RoundWindow]]
    """Builds the round window the swarm client reads through, with the client as its host
    (`trl_ftis.swarm.round_windows`): the sync window, the free window, or the mode's own."""
    drop_reasons: ClassVar[Mapping[str, str]]
    """The reasons for dropping rows that only this mode counts, with the text their warning shows (the ledger
    learns them when the mode is built)."""
    worker_errors: int
    """Rounds that failed in a background worker (0 for a mode without one)."""
    admission_seconds: float
    """Time the steps spent admitting rows the mode queued (work, not a wait), all steps together."""
    closing: threading.Event
    """Set once the round in flight is abandoned (`close`): a background round checks it between its stages."""

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """This step's rows to train on and the round's metrics (with `ftis/exchange/admission_seconds` when part of
        the time was admission work rather than waiting)."""

    def wait(self) -> None:
        """Block until background work in flight is done (before a checkpoint), keeping its result for the next
        step."""

    def close(self) -> None:
        """Stop background work when `train()` ends (a later round starts it again)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the mode, as JSON-serialisable values (`{}` when it keeps nothing)."""

    def check_state(self, state: Any) -> Any:
        """Check a saved [`state_dict`] (read from a file: nothing in it is trusted) and return it ready to load;
        `ValueError` naming the field otherwise. Changes nothing."""

    def load_state_dict(self, checked: Any) -> int:
        """Restore what [`check_state`] returned; returns the rows (or items) it queued again, for the log."""


class ExchangeWorker:
    """The background thread of the modes that run rounds off the training loop: one round at a time.

    At most one round is in flight and its result is the only one held (the round's own bounds cap its rows and
    bytes). The thread belongs to its trainer: [`close`] (called when `train()` ends, also when it raises) interrupts
    a round waiting for peers, sets [`closing`] (nobody will use the round's result: it skips its admission, checked
    after the collect, and its rescoring, checked after the admission), lets its publish finish and joins the
    thread. A round that raises is reported when its result is taken, never lost silently.
    """

    def __init__(self, interrupt):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WORKER_THREAD)
        self._interrupt = interrupt  # stops a round's wait for peers (Swarm.interrupt)
        self._future: Future | None = None
        self.closing = threading.Event()  # set by close: the round in flight is abandoned at its next stage

    def submit(self, function, *args) -> None:
        if self._future is not None:
            raise RuntimeError("The exchange worker already has a round in flight: take its result first.")
        self._future = self._executor.submit(function, *args)

    def take(self) -> Future | None:
        """The round in flight, once it is done (blocks until then); `None` when none was submitted."""
        future = self._future
        if future is not None:
            future.exception()  # waits; the caller reads the result or the error
            # Only now: a KeyboardInterrupt during the wait leaves the round in flight, for close() to interrupt.
            self._future = None
        return future

    def wait(self) -> None:
        """Block until the round in flight (if any) is done, leaving its result to [`take`]."""
        if self._future is not None:
            self._future.exception()

    def idle(self) -> bool:
        """Whether no round is in flight or the one in flight is done ([`take`] then returns at once)."""
        return self._future is None or self._future.done()

    def close(self) -> None:
        """Interrupt a round waiting for peers, have it skip the rest of its work, wait for it (its publish completes)
        and stop the thread: within about a second, unless an admission already under way has to finish."""
        self.closing.set()
        if self._future is not None and not self._future.done():
            self._interrupt()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._future = None


class WorkerMode:
    """What the modes with a background [`ExchangeWorker`] share: the worker (started by their first round), its
    failure count, and closing it when `train()` ends."""

    def __init__(self, host: RoundHost):
        self.host = host
        self.worker: ExchangeWorker | None = None
        self.worker_errors = 0
        self.admission_seconds = 0.0
        self.closing = threading.Event()

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
        self.closing = threading.Event()  # the worker is joined: nothing is abandoned any more


class Stateless:
    """The checkpoint side of a mode that keeps nothing across a restart ([`ExchangeMode.state_dict`] is `{}`)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def check_state(self, state: Any) -> dict[str, Any]:
        if state != {}:
            raise ValueError(f"{self.name!r} keeps no state, but the file holds {type(state).__name__} {state!r:.80}")
        return {}

    def load_state_dict(self, checked: Any) -> int:
        return 0
