"""The async mode (`exchange_mode="async"`): the round runs in a background worker while the step computes, and each
step trains on what the previous step's round collected (one round of lag)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from .base import ExchangeWorker, RoundOutcome, Stateless, WorkerMode
from .sync_window import SyncWindow

if TYPE_CHECKING:
    from ...peer_rows import PeerRow

__all__ = ["AsyncMode"]

logger = logging.getLogger(__name__)


class AsyncMode(Stateless, WorkerMode):
    """The async mode ([`ExchangeMode`](base.py)): this step's round is handed to an [`ExchangeWorker`], and the step
    trains on the previous round's rows (waiting for it only if it is not done yet). The rows are one round older
    than in the sync mode: their age and the staleness metrics count it. The round in flight is trained on at the
    next step of this run, not saved: the mode keeps nothing across a restart."""

    name = "async"
    window = SyncWindow
    horizontal = False
    drop_reasons = {}

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        if self.worker is None:
            self.worker = ExchangeWorker(self.host.swarm.interrupt)
            self.closing = self.worker.closing
        previous = self.worker.take()
        self.worker.submit(self.host.run_round, own_rows, round)
        if previous is None:  # the first step of a run: nothing collected yet
            return RoundOutcome([], None, {})
        error = previous.exception()
        if error is not None:  # reported, and this step trains on its own rows: the next round is already running
            self.worker_errors += 1
            logger.error(
                "The exchange worker failed in round %d (%s: %s): this step trains without peer rows. The next "
                "round runs as usual; `ftis/exchange/worker_errors` counts the failures.",
                round - 1,
                type(error).__name__,
                error,
                exc_info=error,
            )
            return RoundOutcome([], None, {"ftis/exchange/worker_errors": float(self.worker_errors)})
        rows, own_statistics, metrics = previous.result()
        for name in metrics:
            if name.endswith("/staleness"):
                metrics[name] += 1.0  # collected for the previous step, trained on at this one
        rows = [replace(row, age=row.age + 1) for row in rows]
        return RoundOutcome(rows, own_statistics, metrics)

    def wait(self) -> None:
        if self.worker is not None:
            self.worker.wait()
