"""The free mode (`exchange_mode="free"`): nothing waits. A background worker publishes and collects whatever has
arrived, its rows go into a [`FreeQueue`], and each step takes the fresh rows it holds (at most `max_staleness` of
their sender's own steps old) and admits them; a step that finds the worker still busy leaves it running and trains on
the queue."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..checkpoint import RowLimits, rows_from_json, rows_to_json
from .base import ExchangeWorker, RoundHost, RoundOutcome, WorkerMode
from .free_queue import FreeQueue, Taken
from .free_window import FreeWindow

if TYPE_CHECKING:
    from ...peer_rows import PeerRow, ScoredRow

__all__ = ["FreeMode"]

logger = logging.getLogger(__name__)


class FreeMode(WorkerMode):
    """The free mode ([`ExchangeMode`](base.py)). It owns its window ([`FreeWindow`]), the queue of arrived rows
    ([`FreeQueue`], saved with a checkpoint), the own rows not handed to the worker yet (it was busy), the metrics of
    a round settled outside a step, and the snapshots of the swarm's view as of the worker's last finished round."""

    name = "free"
    window = FreeWindow
    horizontal = False
    drop_reasons = {
        "stale": "exchange_mode='free': queued rows more than max_staleness of their sender's steps old before a step "
        "took them (or from after the sender's newest round: it restarted from an older checkpoint)",
    }

    def __init__(self, host: RoundHost):
        super().__init__(host)  # its closing is never set: a free round only publishes and collects
        # Bounded once the first round sets the cap.
        self.arrivals = FreeQueue(max_rows=0, max_staleness=host.config.max_staleness)
        self._unsent: list[tuple[list[PeerRow], int]] = []
        self._settled_metrics: dict[str, float] = {}
        # Snapshots of the swarm's view as of the worker's last finished round (the worker changes the swarm's own).
        self._sender_rounds: dict[str, int] = {}
        self._regulars: frozenset[str] = frozenset()

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """Hand this step's rows to the worker when it is idle (with those of the steps it was busy for), queue what
        its last collect received, take the queue's fresh rows and admit them. Never waits for the worker or for a
        peer; the admission is the cost of the rows this step trains on (`ftis/exchange/admission_seconds`)."""
        host = self.host
        if self.worker is None:
            self.worker = ExchangeWorker(host.swarm.interrupt)
        cap = host.peer_row_cap(len(own_rows))
        self.arrivals.max_rows = host.queue_rows(len(own_rows))
        metrics = dict(self._settled_metrics)
        self._settled_metrics = {}
        if own_rows:
            self._unsent.append((own_rows, round))
        # Older own rows would reach every peer stale: only the newest max_staleness + 1 steps are still sent.
        keep = host.config.max_staleness + 1
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
            host.ledger.count(sender, "stale", count)
        with host.lock:  # the tokenizer and reward functions (no worker uses them in this mode: never contended)
            rows = self.admit(taken)
            host.ledger.record_accepted(rows)
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

    def admit(self, taken: Taken) -> list[ScoredRow]:
        """The rows a step took from the queue, admitted, rescored and normalised as a sync round's, each with its
        age (in its sender's steps)."""
        rows = self.host.score(taken.rows)
        return [replace(row, age=taken.ages.get((row.sender, row.group), (0, 0.0))[0]) for row in rows]

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The queue of arrived rows, oldest first (`arrived_rows`, as JSON rows), and when each was published
        (`arrived_created`, its sender's clock). Rows that JSON cannot hold are left out."""
        arrived, created = [], []
        for row, moment in zip(self.arrivals.rows(), self.arrivals.created(), strict=True):
            written, _ = rows_to_json([row])
            if written:
                arrived.extend(written)
                created.append(float(moment))
        return {"arrived_rows": arrived, "arrived_created": created}

    def check_state(self, state: Any) -> tuple[list[PeerRow], list[float]]:
        """The saved queue as rows and publication times. Only received, never admitted: each row holds at most the
        swarm's wire limit of tokens (in another tokenizer's under `cross_tokenizer`), the queue at most what it
        holds for steps of `generation_batch_size` own rows."""
        if not isinstance(state, dict) or set(state) != {"arrived_rows", "arrived_created"}:
            raise ValueError("the free mode's state is not {'arrived_rows': [...], 'arrived_created': [...]}")
        config, swarm = self.host.config, self.host.swarm
        wire = swarm.limits.max_completion_tokens if swarm is not None else config.max_completion_length
        limits = RowLimits(self.host.queue_rows(config.generation_batch_size), wire, foreign=config.cross_tokenizer)
        rows = rows_from_json(state["arrived_rows"], "arrived_rows", "arrived peer", limits)
        created = state["arrived_created"]
        if not (
            isinstance(created, list)
            and len(created) == len(rows)
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < math.inf for t in created)
        ):
            raise ValueError("'arrived_created' is not a list of finite numbers >= 0, one per arrived peer row")
        return rows, [float(t) for t in created]

    def load_state_dict(self, checked: tuple[list[PeerRow], list[float]]) -> int:
        """Queue again the arrived rows a checkpoint saved, at most the newest the queue holds for steps of
        `generation_batch_size` own rows. They are not admitted yet: like every arrived row, they are when a step
        takes them. Returns the rows queued."""
        rows, created = checked
        self.arrivals.max_rows = self.host.queue_rows(self.host.config.generation_batch_size)
        rows, created = rows[-self.arrivals.max_rows :], created[-self.arrivals.max_rows :]
        published = {(row.sender, int(row.round or 0)): moment for row, moment in zip(rows, created, strict=True)}
        for sender, count in self.arrivals.add(rows, published).items():
            self.host.ledger.count(sender, "queue_full", count)
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
        ledger = self.host.ledger
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
        metrics = self.host.round_metrics(result, [], bytes_sent)
        for name in [n for n in metrics if n == "ftis/peer_rows_accepted" or n.endswith("/rows_accepted")]:
            del metrics[name]  # counted when a step takes them
        return metrics

    def exchange(self, unsent: list[tuple[list[PeerRow], int]], round: int):
        """The worker's round: publish the own rows handed to it (one message per step) and collect what arrived,
        never waiting. Only the swarm is used (no tokenizer, reward function or ledger: the training loop admits
        what it takes). Returns `(result, rows sent, bytes sent, each sender's newest round)`."""
        swarm = self.host.swarm
        bytes_sent = sum(swarm.publish(rows, step) for rows, step in unsent)
        result = swarm.collect(
            round,
            max_rows=self.arrivals.max_rows or None,
            share=max((len(rows) for rows, _ in unsent), default=None),  # as in a round of the sync mode
        )
        return result, sum(len(rows) for rows, _ in unsent), bytes_sent, dict(swarm.window.sender_rounds)

    def taken_metrics(self, rows: Sequence[ScoredRow], taken: Taken) -> dict[str, float]:
        """The rows a step trains on: how many, from whom, and how old (in their sender's steps and in seconds), and
        what stays queued."""
        ledger = self.host.ledger
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
