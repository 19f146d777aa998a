"""What every exchange mode shares: the [`ExchangeMode`] protocol the round runner drives, the [`RoundOutcome`] a
step gets, and the [`ExchangeWorker`] thread of the modes that run rounds in the background."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

if TYPE_CHECKING:
    from ...peer_rows import PeerRow, ScoredRow

__all__ = ["ExchangeMode", "ExchangeWorker", "RoundAbandoned", "RoundOutcome", "WorkerMode"]

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


class ExchangeMode(Protocol):
    """How a trainer's rounds meet its training steps: one class per mode, registered by name in
    `trl_ftis.swarm.exchange_modes.EXCHANGE_MODES` and built once by the round runner (`trl_ftis.swarm.rounds.RoundRunner`),
    which it drives. A mode uses the runner's round (`run_round`: publish, collect, admit, score) and bounds; it owns
    its own state (a worker thread, a queue of arrived rows)."""

    name: ClassVar[str]
    """The `exchange_mode` value that selects it."""
    window: ClassVar[type]
    """The round window the swarm client reads through (`trl_ftis.swarm.round_windows`): a shared round with waiting and
    catch-up, or each sender in its own order when rounds are each sender's own steps."""
    horizontal: ClassVar[bool]
    """Whether `collaboration_mode="horizontal"` works with it: the step's own rows are normalised with the same
    round's peer rows, which only a mode that collects at the step has."""
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
        """Block until background work in flight is done (before a checkpoint), keeping its result for the next step."""

    def close(self) -> None:
        """Stop background work when `train()` ends (a later round starts it again)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the mode: `arrived_rows` and `arrived_created` (empty when it queues nothing)."""

    def load_state_dict(self, state: dict[str, Any], *, local_rows: int) -> int:
        """Restore [`state_dict`] (checked by `trl_ftis.swarm.checkpoint` first); returns the rows queued again."""


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

    def __init__(self, runner):
        self.runner = runner
        self.worker: ExchangeWorker | None = None
        self.worker_errors = 0
        self.admission_seconds = 0.0
        self.closing = threading.Event()

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
        self.closing = threading.Event()  # the worker is joined: nothing is abandoned any more


def no_arrivals() -> dict[str, Any]:
    """The [`ExchangeMode.state_dict`] of a mode that queues nothing."""
    return {"arrived_rows": [], "arrived_created": []}
