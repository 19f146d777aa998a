"""The swarm round, a mixin of [`FTISTrainer`]: connect to the swarm, publish this job's rows, collect the others',
admit, select, score and normalise them, and share them out between the job's processes.

Kept apart from `trainer.py` (one concern: the exchange with other peers); the methods run on the trainer (`self` is
the [`FTISTrainer`]).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from .objective import group_max_len
from .peer_rows import MAX_ABS_ADVANTAGE, PeerRow, assign_group_statistics, group_advantages, prompt_key, select_rows
from .swarm import RoundBudget, RoundResult, Swarm

if TYPE_CHECKING:
    from .config import FTISConfig

logger = logging.getLogger("trl_ftis.trainer")  # the trainer's logger: one place to configure


_WORKER_THREAD = "ftis-exchange"


class ExchangeWorker:
    """The background thread of `exchange_mode="async"`: runs one swarm round at a time, off the training loop.

    At most one round is in flight and its result is the only one held (the round's own bounds cap its rows and
    bytes). The thread belongs to its trainer: [`close`] (called when `train()` ends, also when it raises) interrupts
    a round waiting for peers, lets its publish finish and joins the thread. A round that raises is reported when its
    result is taken, never lost silently.
    """

    def __init__(self, interrupt):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_WORKER_THREAD)
        self._interrupt = interrupt  # stops a round's wait for peers (Swarm.interrupt)
        self._future: Future | None = None

    def submit(self, function, *args) -> None:
        if self._future is not None:
            raise RuntimeError("The exchange worker already has a round in flight: take its result first.")
        self._future = self._executor.submit(function, *args)

    def take(self) -> Future | None:
        """The round in flight, once it is done (blocks until then); `None` when none was submitted."""
        future, self._future = self._future, None
        if future is not None:
            future.exception()  # waits; the caller reads the result or the error
        return future

    def wait(self) -> None:
        """Block until the round in flight (if any) is done, leaving its result to [`take`]."""
        if self._future is not None:
            self._future.exception()

    def close(self) -> None:
        """Interrupt a round waiting for peers, wait for it (its publish completes) and stop the thread."""
        if self._future is not None:
            self._interrupt()
        self._executor.shutdown(wait=True)
        self._future = None


class SwarmRounds:
    """The exchange of rows with the swarm, once per generation batch (mixed into [`FTISTrainer`]).

    `exchange_mode="sync"` runs the round inside the step. `"async"` hands this step's rows to an [`ExchangeWorker`]
    and trains on what the previous step's round collected (one round of lag): the worker publishes, collects,
    decodes, admits and scores while the step computes. The lock `_exchange_lock` keeps the worker's admission
    (tokenizer, reward functions, counters) apart from the training loop's use of them (generation, scoring, the
    merge); `ftis/exchange/blocking_seconds` is the time the training loop waited on the exchange: the whole round
    in sync mode; in async mode, waiting for the worker's result and for the lock.
    """

    @contextmanager
    def _exchange_turn(self):
        """Hold `_exchange_lock` (the training loop's side); the time waited for it counts as blocking."""
        started = time.monotonic()
        with self._exchange_lock:
            self._blocked_seconds += time.monotonic() - started
            yield

    def _close_exchange_worker(self) -> None:
        worker, self._exchange_worker = self._exchange_worker, None
        if worker is not None:
            worker.close()

    def _connect_swarm(self, args: FTISConfig) -> Swarm:
        from .exchange import Limits, tokenizer_fingerprint

        return Swarm(
            args.exchange_url,
            peer_id=args.peer_id,
            tokenizer_fingerprint=tokenizer_fingerprint(self._tokenizer),
            tokenizer_name=str(getattr(self._tokenizer, "name_or_path", "") or type(self._tokenizer).__name__),
            vocab_limit=self.vocab_limit,
            temperature=self.temperature,
            reward_names=self.reward_func_names,
            secret=args.swarm_secret,
            expected_peers=args.expected_peers,
            num_expected_peers=args.num_expected_peers,
            peer_timeout=args.peer_timeout,
            max_staleness=args.max_staleness,
            compact=args.exchange_compact,
            model_name=self._model_name(),
            max_rounds_ahead=args.max_rounds_ahead,
            private_key=args.private_key_file,
            public_keys=args.peer_keys_file,
            budget=RoundBudget(max_bytes=args.max_round_bytes),
            cross_tokenizer=args.cross_tokenizer,
            limits=Limits.for_receiver(
                # Another tokenizer may need several of its tokens for one of ours (a character-level one: ~4).
                max_completion_length=(16 if args.cross_tokenizer else 4) * args.max_completion_length,
                max_rows=max(args.max_peer_message_rows, args.generation_batch_size),
            ),
        )

    def _exchange_round(self, own_rows: list[PeerRow], output: dict[str, Any]) -> list[PeerRow]:
        """Publish this job's rows and return this process's equal share of the accepted peer rows.

        Only the main process talks to the swarm; all processes run the same collectives (one gather, one
        broadcast) whatever arrived. In horizontal mode the local rows' advantages are renormalised over the mixed
        groups (written into `output`).
        """
        accelerator = self.accelerator
        everyone = gather_object(own_rows) if accelerator.num_processes > 1 else own_rows
        payload = [None]
        if accelerator.is_main_process:
            started = time.monotonic()
            if self.args.exchange_mode == "async":
                rows, own_statistics, metrics = self._async_round(everyone, self.state.global_step)
            else:
                rows, own_statistics, metrics = self._run_round(everyone, self.state.global_step)
            metrics["ftis/exchange/blocking_seconds"] = self._blocked_seconds + time.monotonic() - started
            self._blocked_seconds = 0.0
            payload = [(rows, own_statistics, metrics)]
        if accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        rows, own_statistics, metrics = payload[0]
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
        if own_statistics is not None:  # horizontal mode
            start = accelerator.process_index * len(own_rows)
            advantages, group_max = own_statistics
            device = output["advantages"].device
            output["advantages"] = torch.tensor(advantages[start : start + len(own_rows)], device=device)
            output["ftis_group_max_len"] = torch.tensor(group_max[start : start + len(own_rows)], device=device)
        # Equal shares: every process merges the same number of rows (unequal micro-batches deadlock DDP/ZeRO).
        share = len(rows) // accelerator.num_processes
        if accelerator.is_main_process:
            with self._exchange_lock:  # the counters the worker's admission also writes
                for sender, count in Counter(
                    str(row.sender) for row in rows[share * accelerator.num_processes :]
                ).items():
                    self._count_rows(sender, "batch_split", count)
        return rows[accelerator.process_index * share : (accelerator.process_index + 1) * share]

    def _async_round(self, own_rows: list[PeerRow], round: int):
        """Main process, `exchange_mode="async"`: the rows the previous step's round collected (waiting for it only if
        it is not done yet), and this step's round handed to the worker. The rows are one round older than in sync
        mode: the staleness metrics count it."""
        if self._exchange_worker is None:
            self._exchange_worker = ExchangeWorker(self.swarm.interrupt)
        previous = self._exchange_worker.take()
        self._exchange_worker.submit(self._run_round, own_rows, round)
        if previous is None:  # the first step of a run: nothing collected yet
            return [], None, {}
        error = previous.exception()
        if error is not None:  # reported, and this step trains on its own rows: the next round is already running
            self._worker_errors += 1
            logger.error(
                "The exchange worker failed in round %d (%s: %s): this step trains without peer rows. The next "
                "round runs as usual; `ftis/exchange/worker_errors` counts the failures.",
                round - 1,
                type(error).__name__,
                error,
                exc_info=error,
            )
            return [], None, {"ftis/exchange/worker_errors": float(self._worker_errors)}
        rows, own_statistics, metrics = previous.result()
        for name in metrics:
            if name.endswith("/staleness"):
                metrics[name] += 1.0  # collected for the previous step, trained on at this one
        return rows, own_statistics, metrics

    def _run_round(self, own_rows: list[PeerRow], round: int):
        """Main process (or its exchange worker): publish, collect, admit, select, score, normalise. Returns (rows, own
        statistics, metrics). Never raises because of what peers sent: a row is trained on or dropped and counted by
        reason."""
        swarm = self.swarm
        bytes_sent = swarm.publish(own_rows, round)
        cap = self._peer_row_cap(len(own_rows))
        # Decode at most a few times what this round can use: rows beyond that cost nothing.
        result = swarm.collect(round, max_rows=None if cap is None else max(4 * cap, 64))
        with self._exchange_lock:  # the rest uses the tokenizer, the reward functions and the counters
            return self._finish_round(own_rows, round, result, bytes_sent)

    def _finish_round(self, own_rows: list[PeerRow], round: int, result: RoundResult, bytes_sent: int):
        received = result.rows
        try:
            rows, own_statistics = self._round_rows(own_rows, result)
        except Exception as error:  # the last line of defence: a round never raises because of what peers sent
            if ("*", "dropped/internal_error") not in self._drop_warned:
                logger.exception("Processing the peer rows of round %d failed; training on own rows only.", round)
            self._count_rows("*", "internal_error", len(received), detail=f"{type(error).__name__}: {error}"[:300])
            rows, own_statistics = [], None
        self._totals["rows_sent"] += len(own_rows)
        self._totals["bytes_sent"] += bytes_sent
        self._totals["rows_received"] += len(received)
        self._totals["rows_accepted"] += len(rows)
        self._accepted_by_peer.update(row.sender for row in rows)
        self._refused_totals.update(result.refused)
        return rows, own_statistics, self._round_metrics(result, rows, bytes_sent)

    def _round_rows(self, own_rows: list[PeerRow], result: RoundResult):
        """The received rows (`result.rows`) this round trains on, with their group statistics, and the own rows'
        statistics in horizontal mode (else `None`)."""
        args = self.args
        rows = self._admit(result.rows, local_columns=args.require_known_prompts or not args.trust_peer_rewards)
        rows = select_rows(rows, self._peer_row_cap(len(own_rows)), regulars=result.regulars)
        if not args.trust_peer_rewards:
            rows = self._rescore(rows)
        own_statistics = None
        if args.collaboration_mode == "horizontal":
            own_statistics, rows = self._horizontal_statistics(own_rows, rows)
        else:
            assign_group_statistics(rows, self.scale_rewards)
        return self._guard_statistics(rows), own_statistics

    def _peer_row_cap(self, local_rows: int) -> int | None:
        caps = [self.args.max_peer_rows]
        if self.args.max_peer_ratio is not None:
            caps.append(int(self.args.max_peer_ratio * local_rows))
        caps = [cap for cap in caps if cap is not None]
        return min(caps) if caps else None

    def _round_metrics(self, result: RoundResult, rows: list[PeerRow], bytes_sent: int) -> dict[str, float]:
        accepted: dict[str, list[PeerRow]] = {}
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
        for sender, stats in result.peers.items():
            mine = accepted.get(sender, [])
            peer = {
                "rows_received": float(stats.rows_received),
                "rows_accepted": float(len(mine)),
                "rows_stale": float(stats.rows_stale),
                "bytes_received": float(stats.bytes_received),
            }
            if stats.staleness:
                peer["staleness"] = sum(stats.staleness) / len(stats.staleness)
            if mine:  # divided first: rewards near the float maximum must not overflow the sum
                peer["reward"] = math.fsum(float(row.reward) / len(mine) for row in mine)
            metrics.update({f"ftis/peers/{sender}/{name}": value for name, value in peer.items()})
        return metrics

    def _horizontal_statistics(self, own_rows: list[PeerRow], rows: list[PeerRow]):
        """Horizontal mode: groups of the same prompt are normalised together over every model's completions.

        Sets the peer rows' statistics in place and returns the own rows' `(advantages, group max lengths)` and the
        peer rows kept. Peer rows whose prompt no local group has keep their own (vertical) normalisation. All in
        float64; when a mixed group's advantages would not be finite or exceed [`MAX_ABS_ADVANTAGE`] (a peer's
        enormous reward), its peer rows are dropped (`nonfinite`, `advantage_too_large`) and the own rows of that
        prompt are normalised among themselves: no peer value reaches the own rows' advantages as a non-finite or
        enormous number.
        """
        own_keys = {prompt_key(row.prompt) for row in own_rows}
        mixed = [row for row in rows if prompt_key(row.prompt) in own_keys]
        alone = [row for row in rows if prompt_key(row.prompt) not in own_keys]
        assign_group_statistics(alone, self.scale_rewards)
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
            mixed = self._sift(mixed, problems)  # then again, with those prompts' own rows alone
        lengths = torch.tensor([len(row.completion_ids) for row in union])
        advantages, group_max = advantages.tolist(), group_max_len(lengths, index).tolist()
        for row, advantage, max_length in zip(
            mixed, advantages[len(own_rows) :], group_max[len(own_rows) :], strict=True
        ):
            row.advantage, row.group_max_length = advantage, max_length
        kept = {id(row) for row in alone + mixed}
        own_statistics = (advantages[: len(own_rows)], group_max[: len(own_rows)])
        return own_statistics, [row for row in rows if id(row) in kept]
