"""The swarm round, trainer side: publish this job's rows, collect the other peers', admit, select, score and
normalise them, in the training loop or in a background worker.

[`RoundRunner`] is an object with explicit dependencies (the config, the [`Swarm`] client, the [`Admission`], the
[`PeerRowLedger`] and the `scale_rewards` setting), composed by `FTISTrainer` and testable without a trainer. It runs
on the main process of a job; sharing rows out between the job's processes (the collectives) stays with the trainer.
It also owns the lock that keeps an async worker's admission (tokenizer, reward functions, ledger) apart from the
training loop's use of them, and the [`ExchangeWorker`] thread of `exchange_mode="async"`. [`connect_swarm`] builds
the trainer's [`Swarm`] from its config and credentials.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import torch

from .arrivals import ArrivalQueue, Taken
from .exchange import Limits, tokenizer_fingerprint
from .objective import group_max_len
from .peer_rows import (
    MAX_ABS_ADVANTAGE,
    AdmittedRow,
    PeerRow,
    ScoredRow,
    group_advantages,
    prompt_key,
    select_rows,
    with_group_statistics,
)
from .rules import exchange_scheme
from .swarm import RoundBudget, RoundResult, Swarm

if TYPE_CHECKING:
    from .admission import Admission
    from .config import FTISConfig, SwarmCredentials
    from .ledger import PeerRowLedger

logger = logging.getLogger(__name__)


_WORKER_THREAD = "ftis-exchange"


class RoundAbandoned(Exception):
    """Raised inside a worker's round once [`ExchangeWorker.close`] was called: nobody will use its result."""


class ExchangeWorker:
    """The background thread of `exchange_mode="async"`: runs one swarm round at a time, off the training loop.

    At most one round is in flight and its result is the only one held (the round's own bounds cap its rows and
    bytes). The thread belongs to its trainer: [`close`] (called when `train()` ends, also when it raises) interrupts
    a round waiting for peers, sets [`closing`] (nobody will use the round's result: it skips its admission, checked
    after the collect, and its rescoring, checked after the admission), lets its publish finish and joins the
    thread. A round that raises is reported when its result is taken, never lost silently.
    """

    def __init__(self, interrupt):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_WORKER_THREAD)
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


class RoundOutcome(NamedTuple):
    """What one round gives the training step."""

    rows: list[ScoredRow]
    """The received rows to train on, with their group statistics (before they are shared out between processes)."""
    own_statistics: tuple[list[float], list[int]] | None
    """Horizontal mode: the own rows' advantages and group max lengths over the mixed groups; else `None`."""
    metrics: dict[str, float]
    """The round's metrics (`ftis/peer_rows_received`, `ftis/exchange/...`, `ftis/peers/<peer>/...`)."""


def connect_swarm(
    config: FTISConfig,
    credentials: SwarmCredentials,
    *,
    tokenizer,
    vocab_limit: int,
    temperature: float,
    reward_names: Sequence[str],
    model_name: str,
) -> Swarm:
    """The [`Swarm`] client of a trainer with `config` (its `exchange_url`, peer id, bounds) signing and verifying
    with `credentials` ([`FTISConfig.swarm_credentials`]: the secret and key objects, read once by the trainer)."""
    described = credentials.describe()
    if described.startswith("none") and exchange_scheme(config.exchange_url) == "dir":
        # A folder on this machine or a shared filesystem: its permissions decide who can write, as for any file.
        described += " (a folder exchange: fine where only you can write the folder; set swarm_secret otherwise)"
    logger.warning("Peer %r: message authentication: %s.", config.peer_id, described)
    return Swarm(
        config.exchange_url,
        peer_id=config.peer_id,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        tokenizer_name=str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        vocab_limit=vocab_limit,
        temperature=temperature,
        reward_names=reward_names,
        secret=credentials.secret,
        expected_peers=config.expected_peers,
        num_expected_peers=config.num_expected_peers,
        peer_timeout=config.peer_timeout,
        max_staleness=config.max_staleness,
        compact=config.exchange_compact,
        model_name=model_name,
        max_rounds_ahead=config.max_rounds_ahead,
        private_key=credentials.private_key,
        public_keys=credentials.public_keys,
        budget=RoundBudget(max_bytes=config.max_round_bytes),
        cross_tokenizer=config.cross_tokenizer,
        free_running=config.exchange_mode == "free",
        swarm_name=credentials.swarm_name,
        run_id=credentials.run_id,
        limits=Limits.for_receiver(
            # Another tokenizer may need several of its tokens for one of ours (a character-level one: ~4).
            max_completion_length=(16 if config.cross_tokenizer else 4) * config.max_completion_length,
            max_rows=max(config.max_peer_message_rows, config.generation_batch_size),
        ),
    )


class RoundRunner:
    """
    The exchange of rows with the swarm, once per generation batch, on the main process.

    `exchange_mode="sync"` runs the round inside the step. `"async"` hands this step's rows to an [`ExchangeWorker`]
    and trains on what the previous step's round collected (one round of lag): the worker publishes, collects,
    decodes, admits and scores while the step computes. `"free"` never waits: the worker publishes and collects
    whatever has arrived without waiting for anyone, its admitted rows go into an [`ArrivalQueue`], and each step
    takes the fresh rows it holds (at most `max_staleness` of their sender's own steps old); a step that finds the
    worker still busy leaves it running and trains on the queue. [`lock`] keeps the worker's admission (tokenizer, reward
    functions, ledger) apart from the training loop's use of them (generation, scoring, the merge: [`turn`]);
    `ftis/exchange/blocking_seconds` is the time the training loop waited on the exchange: the whole round in sync
    mode; in async mode, waiting for the worker's result and for the lock.

    Args:
        config ([`FTISConfig`]): reads `exchange_mode`, `collaboration_mode`, `trust_peer_rewards`,
            `require_known_prompts`, `max_peer_rows` and `max_peer_ratio`.
        swarm ([`Swarm`], *optional*): the client; `None` on processes that do not talk to the swarm (then only
            [`lock`] and [`turn`] are used).
        admission ([`Admission`]): admits and rescores the received rows.
        ledger ([`PeerRowLedger`]): the round's totals and drops are counted there.
        scale_rewards (`str`): as `GRPOConfig.scale_rewards`, for the group statistics.
    """

    def __init__(
        self,
        *,
        config: FTISConfig,
        swarm: Swarm | None,
        admission: Admission,
        ledger: PeerRowLedger,
        scale_rewards: str = "group",
    ):
        self.config = config
        self.swarm = swarm
        self.admission = admission
        self.ledger = ledger
        self.scale_rewards = scale_rewards
        self.lock = threading.RLock()
        self.worker: ExchangeWorker | None = None
        self.worker_errors = 0  # rounds the async worker failed
        self.blocking_seconds = 0.0  # the training loop's waits on the exchange, all steps together
        self.admission_seconds = 0.0  # free-running: admitting the rows taken (work, not a wait), all steps together
        self.ages: Counter = Counter()  # rows trained on, by age in their sender's steps
        self._blocked_seconds = 0.0  # waited for the lock since the last round's metrics
        # exchange_mode="free": the admitted rows waiting for a step (bounded once the first round sets the cap), the
        # own rows not handed to the worker yet (it was busy), and metrics of a round settled outside a step.
        self.arrivals = ArrivalQueue(max_rows=0, max_staleness=config.max_staleness)
        self._unsent: list[tuple[list[PeerRow], int]] = []
        self._settled_metrics: dict[str, float] = {}
        # Snapshots of the swarm's view as of the worker's last finished round (the worker changes the swarm's own).
        self._sender_rounds: dict[str, int] = {}
        self._regulars: frozenset[str] = frozenset()
        # The running worker's `closing` (a round checks it between its stages); never set without a worker.
        self._closing = threading.Event()

    @contextmanager
    def turn(self):
        """Hold [`lock`] (the training loop's side); the time waited for it counts as blocking."""
        started = time.monotonic()
        with self.lock:
            self._blocked_seconds += time.monotonic() - started
            yield

    def close(self) -> None:
        """Stop the async worker, if any (a later round starts a new one), abandoning the work of its round in flight
        (its result would never be used): `train()` ends within about a second of its last step or of a signal."""
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
        self._closing = threading.Event()  # the worker is joined: nothing is abandoned any more

    def wait(self) -> None:
        """Block until the worker's round in flight (if any) is done, leaving its result for the next step; in
        free-running mode its rows are queued at once (a checkpoint written next holds them) and its metrics logged
        with the next step. A free-running round never waits for peers, so this is short."""
        if self.worker is not None:
            self.worker.wait()
            if self.config.exchange_mode == "free":
                self._settled_metrics.update(self.settle())

    def restore_arrivals(self, rows: Sequence[PeerRow], created: Sequence[float], local_rows: int) -> int:
        """Free-running: queue again the arrived rows a checkpoint saved ([`ArrivalQueue.rows`], oldest first, and
        when each was published), at most the newest the queue holds for steps of `local_rows` own rows. They are
        not admitted yet: like every arrived row, they are when a step takes them. Returns the rows queued."""
        self.arrivals.max_rows = self.queue_bound(self.peer_row_cap(local_rows))
        rows = list(rows)[-self.arrivals.max_rows :]
        created = list(created)[-len(rows) :] if rows and len(created) >= len(rows) else [time.time()] * len(rows)
        published = {(row.sender, int(row.round or 0)): moment for row, moment in zip(rows, created, strict=True)}
        for sender, count in self.arrivals.add(rows, published).items():
            self.ledger.count(sender, "queue_full", count)
        return len(self.arrivals)

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """This step's round: the rows to train on (sync: this round's; async: the previous round's), the own rows'
        horizontal statistics and the metrics, with `ftis/exchange/blocking_seconds`."""
        started = time.monotonic()
        if self.config.exchange_mode == "free":
            rows, own_statistics, metrics = self.free_round(own_rows, round)
        elif self.config.exchange_mode == "async":
            rows, own_statistics, metrics = self.async_round(own_rows, round)
        else:
            rows, own_statistics, metrics = self.run_round(own_rows, round)
        blocked = self._blocked_seconds + time.monotonic() - started
        if self.config.exchange_mode == "free":  # admitting the rows taken is work, not a wait
            blocked -= metrics.get("ftis/exchange/admission_seconds", 0.0)
        metrics["ftis/exchange/blocking_seconds"] = blocked
        self.blocking_seconds += blocked
        self._blocked_seconds = 0.0
        self.ages.update(int(row.age) for row in rows if row.age is not None)
        return RoundOutcome(rows, own_statistics, metrics)

    def async_round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """`exchange_mode="async"`: the rows the previous step's round collected (waiting for it only if it is not
        done yet), and this step's round handed to the worker. The rows are one round older than in sync mode: the
        staleness metrics count it."""
        if self.worker is None:
            self.worker = ExchangeWorker(self.swarm.interrupt)
            self._closing = self.worker.closing
        previous = self.worker.take()
        self.worker.submit(self.run_round, own_rows, round)
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

    # -- exchange_mode="free" ---------------------------------------------------------------------------------------
    def free_round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """`exchange_mode="free"`: hand this step's rows to the worker when it is idle (with those of the steps it was
        busy for), queue what its last collect received, take the queue's fresh rows and admit them. Never waits for
        the worker or for a peer; the admission is the cost of the rows this step trains on
        (`ftis/exchange/admission_seconds`), not a wait."""
        if self.worker is None:
            self.worker = ExchangeWorker(self.swarm.interrupt)
        cap = self.peer_row_cap(len(own_rows))
        self.arrivals.max_rows = self.queue_bound(cap)
        metrics = dict(self._settled_metrics)
        self._settled_metrics = {}
        if own_rows:
            self._unsent.append((own_rows, round))
        # Older own rows would reach every peer stale: only the newest max_staleness + 1 steps are still sent.
        superseded = self._unsent[: -(self.config.max_staleness + 1)]
        if superseded:
            self._unsent = self._unsent[-(self.config.max_staleness + 1) :]
            metrics["ftis/exchange/rows_superseded"] = float(sum(len(rows) for rows, _ in superseded))
        if self.worker.idle():
            metrics.update(self.settle())
            unsent, self._unsent = self._unsent, []
            self.worker.submit(self.free_exchange, unsent, round)
        admitting = time.monotonic()
        taken = self.arrivals.take(cap, self._sender_rounds, regulars=self._regulars)
        for sender, count in taken.stale.items():
            self.ledger.count(sender, "stale", count)
        with self.lock:  # the tokenizer and reward functions (no worker uses them in this mode: never contended)
            rows = self.admit_taken(taken)
            self.ledger.record_accepted(rows)
        admission = time.monotonic() - admitting
        self.admission_seconds += admission
        metrics["ftis/exchange/admission_seconds"] = admission
        metrics.update(self.taken_metrics(rows, taken))
        return RoundOutcome(rows, None, metrics)

    def queue_bound(self, cap: int | None) -> int:
        """The rows the arrival queue holds: 4 x the step's peer-row cap (at least 64), or the round budget's rows."""
        if cap is not None:
            return max(4 * cap, 64)
        return self.swarm.budget.max_rows if self.swarm is not None else RoundBudget().max_rows

    def admit_taken(self, taken: Taken) -> list[ScoredRow]:
        """The rows a step took from the queue, admitted, rescored and normalised as a lock-step round's, each with
        its age; never raises because of the rows (an unexpected error drops them all, `internal_error`)."""
        try:
            rows = self.rescored(self.admitted(taken.rows))
            scored = self.admission.guard_statistics(with_group_statistics(rows, self.scale_rewards))
        except Exception as error:  # the last line of defence: a step never raises because of what peers sent
            if not self.ledger.warned("*", "internal_error"):
                logger.exception("Processing the arrived peer rows failed; this step trains on own rows only.")
            self.ledger.count("*", "internal_error", len(taken.rows), detail=f"{type(error).__name__}: {error}"[:300])
            return []
        return [replace(row, age=taken.ages.get((row.sender, row.group), (0, 0.0))[0]) for row in scored]

    def settle(self) -> dict[str, float]:
        """Free-running: queue what the worker's finished collect received (if any) and count its totals; returns
        its metrics. Called by [`free_round`] and by [`wait`] (before a checkpoint), on the training loop's thread."""
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
        result, rows_sent, bytes_sent, self._sender_rounds = done.result()
        self._regulars = result.regulars
        self.ledger.record_round(
            rows_sent=rows_sent,
            bytes_sent=bytes_sent,
            rows_received=len(result.rows),
            accepted=[],
            refused=result.refused,
        )
        for sender, count in self.arrivals.add(result.rows, result.created).items():
            self.ledger.count(sender, "queue_full", count)
        metrics = self.round_metrics(result, [], bytes_sent)
        for name in [n for n in metrics if n == "ftis/peer_rows_accepted" or n.endswith("/rows_accepted")]:
            del metrics[name]  # counted when a step takes them
        return metrics

    def free_exchange(self, unsent: list[tuple[list[PeerRow], int]], round: int):
        """The worker's free-running round: publish the own rows handed to it (one message per step) and collect what
        arrived, never waiting. Only the swarm is used (no tokenizer, reward function or ledger: the training loop
        admits what it takes). Returns `(result, rows sent, bytes sent, each sender's newest round)`."""
        swarm = self.swarm
        bytes_sent = sum(swarm.publish(rows, step) for rows, step in unsent)
        result = swarm.collect(
            round,
            max_rows=self.arrivals.max_rows or None,
            share=max((len(rows) for rows, _ in unsent), default=None),  # as in run_round
        )
        return result, sum(len(rows) for rows, _ in unsent), bytes_sent, dict(swarm.sender_rounds)

    def taken_metrics(self, rows: Sequence[ScoredRow], taken: Taken) -> dict[str, float]:
        """The rows a free-running step trains on: how many, from whom, and how old (in their sender's steps and in
        seconds), and what stays queued."""
        metrics = {
            "ftis/peer_rows_accepted": float(len(rows)),
            "ftis/exchange/queued_rows": float(len(self.arrivals)),
        }
        steps: dict[str, list[int]] = {}
        seconds: dict[str, list[float]] = {}
        for row in rows:
            age, age_seconds = taken.ages.get((row.sender, row.group), (0, 0.0))
            name = self.ledger.peer_name(row.sender)  # bounded: invented ids share one name
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
            key = f"ftis/peers/{self.ledger.peer_name(sender)}/rows_aged_out"
            metrics[key] = metrics.get(key, 0.0) + float(count)
        return metrics

    def run_round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """Publish, collect, admit, select, score, normalise (in the training loop, or in the worker). Never raises
        because of what peers sent: a row is trained on or dropped and counted by reason."""
        swarm = self.swarm
        bytes_sent = swarm.publish(own_rows, round)
        cap = self.peer_row_cap(len(own_rows))
        # Decode at most a few times what this round can use: rows beyond that cost nothing.
        # Each regular's share of the round's rows holds at least a message like ours: a member's volume cannot crowd an
        # honest peer out, and an honest peer's message is never cut to nothing by its share.
        result = swarm.collect(
            round, max_rows=None if cap is None else max(4 * cap, 64), share=len(own_rows) if cap is not None else None
        )
        with self.lock:  # the rest uses the tokenizer, the reward functions and the ledger
            try:
                self.check_closing()
                return self.finish_round(own_rows, round, result, bytes_sent)
            except RoundAbandoned:  # training ended: counted as received, not admitted
                self.ledger.record_round(
                    rows_sent=len(own_rows),
                    bytes_sent=bytes_sent,
                    rows_received=len(result.rows),
                    accepted=[],
                    refused=result.refused,
                )
                return RoundOutcome([], None, {})

    def check_closing(self) -> None:
        """Raise [`RoundAbandoned`] in a worker's round once the worker is closing (its result will not be used)."""
        if self._closing.is_set():
            raise RoundAbandoned

    def finish_round(self, own_rows: list[PeerRow], round: int, result: RoundResult, bytes_sent: int) -> RoundOutcome:
        """The collected round's rows to train on, its totals counted and its metrics; never raises because of the
        rows (an unexpected error drops them all, `internal_error`)."""
        received = result.rows
        try:
            rows, own_statistics = self.round_rows(own_rows, result)
        except RoundAbandoned:
            raise
        except Exception as error:  # the last line of defence: a round never raises because of what peers sent
            if not self.ledger.warned("*", "internal_error"):
                logger.exception("Processing the peer rows of round %d failed; training on own rows only.", round)
            self.ledger.count("*", "internal_error", len(received), detail=f"{type(error).__name__}: {error}"[:300])
            rows, own_statistics = [], None
        # A row's age: the rounds between its own and the one it is trained at (async adds its one round of lag).
        rows = [replace(row, age=min(max(result.round - int(row.round or 0), 0), 2**31)) for row in rows]
        self.ledger.record_round(
            rows_sent=len(own_rows),
            bytes_sent=bytes_sent,
            rows_received=len(received),
            accepted=rows,
            refused=result.refused,
        )
        return RoundOutcome(rows, own_statistics, self.round_metrics(result, rows, bytes_sent))

    def round_rows(self, own_rows: list[PeerRow], result: RoundResult):
        """The received rows (`result.rows`) this round trains on, as [`ScoredRow`]s, and the own rows' statistics in
        horizontal mode (else `None`)."""
        rows = select_rows(self.admitted(result.rows), self.peer_row_cap(len(own_rows)), regulars=result.regulars)
        self.check_closing()
        rows = self.rescored(rows)
        own_statistics = None
        if self.config.collaboration_mode == "horizontal":
            own_statistics, scored = self.horizontal_statistics(own_rows, rows)
        else:
            scored = with_group_statistics(rows, self.scale_rewards)
        return self.admission.guard_statistics(scored), own_statistics

    def admitted(self, rows: Sequence[PeerRow]) -> list[AdmittedRow]:
        """Received rows through the admission, with this trainer's own columns for a known prompt when the rewards
        are recomputed (or known prompts are required)."""
        config = self.config
        return self.admission.admit(rows, local_columns=config.require_known_prompts or not config.trust_peer_rewards)

    def rescored(self, rows: list[AdmittedRow]) -> list[AdmittedRow]:
        """Admitted rows with this trainer's own rewards, unless `trust_peer_rewards`."""
        return rows if self.config.trust_peer_rewards else self.admission.rescore(rows)

    def peer_row_cap(self, local_rows: int) -> int | None:
        """The most peer rows a step with `local_rows` own rows trains on (`max_peer_rows`, `max_peer_ratio`)."""
        caps = [self.config.max_peer_rows]
        if self.config.max_peer_ratio is not None:
            caps.append(int(self.config.max_peer_ratio * local_rows))
        caps = [cap for cap in caps if cap is not None]
        return min(caps) if caps else None

    def round_metrics(self, result: RoundResult, rows: Sequence[ScoredRow], bytes_sent: int) -> dict[str, float]:
        accepted: dict[str, list[ScoredRow]] = {}
        for row in rows:
            accepted.setdefault(row.sender, []).append(row)
        metrics = {
            "ftis/peer_rows_received": float(sum(p.rows_received for p in result.peers.values())),
            "ftis/peer_rows_accepted": float(len(rows)),
            "ftis/exchange/bytes_sent": float(bytes_sent),
            "ftis/exchange/wait_seconds": result.waited,
            "ftis/exchange/peers_missing": float(len(result.missing)),
            "ftis/exchange/messages_refused": float(sum(result.refused.values())),
        }
        for reason, count in result.refused.items():
            metrics[f"ftis/exchange/refused/{reason}"] = float(count)
        named: dict[str, list] = {}  # metric name -> the senders counted under it (invented ids share one)
        for sender in result.peers:
            named.setdefault(self.ledger.peer_name(sender), []).append(sender)
        for name, senders in named.items():
            stats = [result.peers[sender] for sender in senders]
            mine = [row for sender in senders for row in accepted.get(sender, [])]
            staleness = [value for stat in stats for value in stat.staleness]
            peer = {
                "rows_received": float(sum(stat.rows_received for stat in stats)),
                "rows_accepted": float(len(mine)),
                "rows_stale": float(sum(stat.rows_stale for stat in stats)),
                "rows_cut": float(sum(stat.rows_cut for stat in stats)),
                "bytes_received": float(sum(stat.bytes_received for stat in stats)),
            }
            if staleness:
                peer["staleness"] = sum(staleness) / len(staleness)
            if mine:  # divided first: rewards near the float maximum must not overflow the sum
                peer["reward"] = math.fsum(float(row.reward) / len(mine) for row in mine)
            metrics.update({f"ftis/peers/{name}/{metric}": value for metric, value in peer.items()})
        return metrics

    def horizontal_statistics(self, own_rows: Sequence[PeerRow], rows: Sequence[AdmittedRow]):
        """Horizontal mode: groups of the same prompt are normalised together over every model's completions.

        Returns the own rows' `(advantages, group max lengths)` and the peer rows kept, as [`ScoredRow`]s in their
        order. Peer rows whose prompt no local group has keep their own (vertical) normalisation. All in float64;
        when a mixed group's advantages would not be finite or exceed [`MAX_ABS_ADVANTAGE`] (a peer's enormous
        reward), its peer rows are dropped (`nonfinite`, `advantage_too_large`) and the own rows of that prompt are
        normalised among themselves: no peer value reaches the own rows' advantages as a non-finite or enormous
        number.
        """
        own_keys = {prompt_key(row.prompt) for row in own_rows}
        mixed = [row for row in rows if prompt_key(row.prompt) in own_keys]
        alone = [row for row in rows if prompt_key(row.prompt) not in own_keys]
        alone_scored = with_group_statistics(alone, self.scale_rewards)
        scored = {id(row): new for row, new in zip(alone, alone_scored, strict=True)}
        while True:
            union = list(own_rows) + mixed
            keys: dict[str, int] = {}
            index = torch.tensor(
                [keys.setdefault(prompt_key(row.prompt), len(keys)) for row in union], dtype=torch.long
            )
            rewards = torch.tensor([float(row.reward) for row in union], dtype=torch.float64)
            advantages = group_advantages(rewards, index, self.scale_rewards)
            nonfinite = set(index[~torch.isfinite(advantages)].tolist())
            too_large = set(index[advantages.abs() > MAX_ABS_ADVANTAGE].tolist()) - nonfinite
            peer_index = index[len(own_rows) :].tolist()
            problems = [
                "nonfinite" if g in nonfinite else "advantage_too_large" if g in too_large else None
                for g in peer_index
            ]
            if not any(problems):
                break
            mixed = self.ledger.sift(mixed, problems)  # then again, with those prompts' own rows alone
        lengths = torch.tensor([len(row.completion_ids) for row in union])
        advantages, group_max = advantages.tolist(), group_max_len(lengths, index).tolist()
        for row, advantage, max_length in zip(
            mixed, advantages[len(own_rows) :], group_max[len(own_rows) :], strict=True
        ):
            scored[id(row)] = row.with_statistics(advantage, max_length)
        own_statistics = (advantages[: len(own_rows)], group_max[: len(own_rows)])
        return own_statistics, [scored[id(row)] for row in rows if id(row) in scored]
