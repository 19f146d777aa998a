"""`exchange_mode="free"`: nothing waits. A background worker publishes and collects whatever has arrived, its rows
go into an [`FreeQueue`], and each step takes the fresh rows it holds (at most `max_staleness` of their sender's
own steps old) and admits them; a step that finds the worker still busy leaves it running and trains on the queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .base import ExchangeWorker, RoundOutcome, WorkerMode
from .free_queue import FreeQueue, Taken
from .free_window import FreeWindow

if TYPE_CHECKING:
    from ...peer_rows import PeerRow, ScoredRow

__all__ = ["FreeMode"]

logger = logging.getLogger(__name__)


class FreeMode(WorkerMode):
    """The free-running mode ([`ExchangeMode`](base.py)). It owns the queue of arrived rows (saved with a checkpoint),
    the own rows not handed to the worker yet (it was busy), the metrics of a round settled outside a step, and the
    snapshots of the swarm's view as of the worker's last finished round."""

    name = "free"
    window = FreeWindow
    horizontal = False

    def __init__(self, runner):
        super().__init__(runner)  # its closing is never set: a free round only publishes and collects
        # Bounded once the first round sets the cap.
        self.arrivals = FreeQueue(max_rows=0, max_staleness=runner.config.max_staleness)
        self._unsent: list[tuple[list[PeerRow], int]] = []
        self._settled_metrics: dict[str, float] = {}
        # Snapshots of the swarm's view as of the worker's last finished round (the worker changes the swarm's own).
        self._sender_rounds: dict[str, int] = {}
        self._regulars: frozenset[str] = frozenset()

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """Hand this step's rows to the worker when it is idle (with those of the steps it was busy for), queue what
        its last collect received, take the queue's fresh rows and admit them. Never waits for the worker or for a
        peer; the admission is the cost of the rows this step trains on (`ftis/exchange/admission_seconds`)."""
        runner = self.runner
        if self.worker is None:
            self.worker = ExchangeWorker(runner.swarm.interrupt)
        cap = runner.peer_row_cap(len(own_rows))
        self.arrivals.max_rows = runner.queue_bound(cap)
        metrics = dict(self._settled_metrics)
        self._settled_metrics = {}
        if own_rows:
            self._unsent.append((own_rows, round))
        # Older own rows would reach every peer stale: only the newest max_staleness + 1 steps are still sent.
        keep = runner.config.max_staleness + 1
        superseded = self._unsent[:-keep]
        if superseded:
            self._unsent = self._unsent[-keep:]
            metrics["ftis/exchange/rows_superseded"] = float(sum(len(rows) for rows, _ in superseded))
        if self.worker.idle():
            metrics.update(self.settle())
            unsent, self._unsent = self._unsent, []
            self.worker.submit(self.exchange, unsent, round)
        admitting = time.monotonic()
        taken = self.arrivals.take(cap, self._sender_rounds, regulars=self._regulars)
        for sender, count in taken.stale.items():
            runner.ledger.count(sender, "stale", count)
        with runner.lock:  # the tokenizer and reward functions (no worker uses them in this mode: never contended)
            rows = runner.admit_taken(taken)
            runner.ledger.record_accepted(rows)
        admission = time.monotonic() - admitting
        self.admission_seconds += admission
        metrics["ftis/exchange/admission_seconds"] = admission
        metrics.update(self.taken_metrics(rows, taken))
        return RoundOutcome(rows, None, metrics)

    def wait(self) -> None:
        """The worker's collect in flight, if any, is finished and queued at once (a checkpoint written next holds
        its rows); its metrics are logged with the next step. It never waits for peers, so this is short."""
        if self.worker is not None:
            self.worker.wait()
            self._settled_metrics.update(self.settle())

    def state_dict(self) -> dict[str, Any]:
        return {"arrived_rows": self.arrivals.rows(), "arrived_created": self.arrivals.created()}

    def load_state_dict(self, state: dict[str, Any], *, local_rows: int) -> int:
        """Queue again the arrived rows a checkpoint saved (oldest first, and when each was published), at most the
        newest the queue holds for steps of `local_rows` own rows. They are not admitted yet: like every arrived
        row, they are when a step takes them. Returns the rows queued."""
        runner = self.runner
        self.arrivals.max_rows = runner.queue_rows(local_rows)
        rows = list(state.get("arrived_rows") or [])[-self.arrivals.max_rows :]
        created = list(state.get("arrived_created") or [])
        created = created[-len(rows) :] if rows and len(created) >= len(rows) else [time.time()] * len(rows)
        published = {(row.sender, int(row.round or 0)): moment for row, moment in zip(rows, created, strict=True)}
        for sender, count in self.arrivals.add(rows, published).items():
            runner.ledger.count(sender, "queue_full", count)
        return len(self.arrivals)

    def settle(self) -> dict[str, float]:
        """Queue what the worker's finished collect received (if any) and count its totals; returns its metrics.
        Called by [`round`] and by [`wait`] (before a checkpoint), on the training loop's thread."""
        if self.worker is None or not self.worker.idle():
            return {}
        done = self.worker.take()
        if done is None:
            return {}
        error = done.exception()
        if error is not None:
            self.worker_errors += 1
            logger.error(
                "The exchange worker failed (%s: %s): the rows it collected are lost; the next round runs as usual. "
                "`ftis/exchange/worker_errors` counts the failures.",
                type(error).__name__,
                error,
                exc_info=error,
            )
            return {"ftis/exchange/worker_errors": float(self.worker_errors)}
        ledger = self.runner.ledger
        result, rows_sent, bytes_sent, self._sender_rounds = done.result()
        self._regulars = result.regulars
        ledger.record_round(
            rows_sent=rows_sent,
            bytes_sent=bytes_sent,
            rows_received=len(result.rows),
            accepted=[],
            refused=result.refused,
        )
        for sender, count in self.arrivals.add(result.rows, result.created).items():
            ledger.count(sender, "queue_full", count)
        metrics = self.runner.round_metrics(result, [], bytes_sent)
        for name in [n for n in metrics if n == "ftis/peer_rows_accepted" or n.endswith("/rows_accepted")]:
            del metrics[name]  # counted when a step takes them
        return metrics

    def exchange(self, unsent: list[tuple[list[PeerRow], int]], round: int):
        """The worker's round: publish the own rows handed to it (one message per step) and collect what arrived,
        never waiting. Only the swarm is used (no tokenizer, reward function or ledger: the training loop admits
        what it takes). Returns `(result, rows sent, bytes sent, each sender's newest round)`."""
        swarm = self.runner.swarm
        bytes_sent = sum(swarm.publish(rows, step) for rows, step in unsent)
        result = swarm.collect(
            round,
            max_rows=self.arrivals.max_rows or None,
            share=max((len(rows) for rows, _ in unsent), default=None),  # as in a lock-step round
        )
        return result, sum(len(rows) for rows, _ in unsent), bytes_sent, dict(swarm.sender_rounds)

    def taken_metrics(self, rows: Sequence[ScoredRow], taken: Taken) -> dict[str, float]:
        """The rows a step trains on: how many, from whom, and how old (in their sender's steps and in seconds), and
        what stays queued."""
        ledger = self.runner.ledger
        metrics = {
            "ftis/peer_rows_accepted": float(len(rows)),
            "ftis/exchange/queued_rows": float(len(self.arrivals)),
        }
        steps: dict[str, list[int]] = {}
        seconds: dict[str, list[float]] = {}
        for row in rows:
            age, age_seconds = taken.ages.get((row.sender, row.group), (0, 0.0))
            name = ledger.peer_name(row.sender)  # bounded: invented ids share one name
            steps.setdefault(name, []).append(age)
            seconds.setdefault(name, []).append(age_seconds)
        if rows:
            every = [age for values in steps.values() for age in values]
            every_seconds = [value for values in seconds.values() for value in values]
            metrics["ftis/exchange/age_steps"] = sum(every) / len(every)
            metrics["ftis/exchange/age_steps_max"] = float(max(every))
            metrics["ftis/exchange/age_seconds"] = sum(every_seconds) / len(every_seconds)
        for sender, values in steps.items():
            metrics[f"ftis/peers/{sender}/rows_accepted"] = float(len(values))
            metrics[f"ftis/peers/{sender}/age_steps"] = sum(values) / len(values)
            metrics[f"ftis/peers/{sender}/age_seconds"] = sum(seconds[sender]) / len(seconds[sender])
        for sender, count in taken.stale.items():
            key = f"ftis/peers/{ledger.peer_name(sender)}/rows_aged_out"
            metrics[key] = metrics.get(key, 0.0) + float(count)
        return metrics
