"""The swarm round, trainer side: publish this job's rows, collect the other peers', admit, select, score and
normalise them, in the training loop or in a background worker.

[`RoundRunner`] is an object with explicit dependencies (the config, the [`Swarm`] client, the [`Admission`], the
[`PeerRowLedger`] and the `scale_rewards` setting), composed by `FTISTrainer` and testable without a trainer. It runs
on the main process of a job; sharing rows out between the job's processes (the collectives) stays with the trainer.
It also owns the lock that keeps a background worker's admission (tokenizer, reward functions, ledger) apart from the
training loop's use of them, and the trainer's exchange mode (`trl_ftis.swarm.exchange_modes`), built once from
`exchange_mode`, which decides how rounds meet steps. [`connect_swarm`] builds the trainer's [`Swarm`] from its config
and credentials.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..exchange import Limits, tokenizer_fingerprint
from ..exchange.transports.registry import transport_kind
from ..exchange_mode_registry import exchange_mode
from ..objective import group_max_len
from ..peer_rows import (
    MAX_ABS_ADVANTAGE,
    AdmittedRow,
    PeerRow,
    ScoredRow,
    group_advantages,
    prompt_key,
    select_rows,
    with_group_statistics,
)
from .client import Swarm
from .exchange_modes.base import RoundAbandoned, RoundOutcome
from .round_budget import RoundBudget, RoundResult

if TYPE_CHECKING:
    from ..config import FTISConfig
    from ..credentials import SwarmCredentials
    from .admission import Admission
    from .ledger import PeerRowLedger

logger = logging.getLogger(__name__)


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
    if described.startswith("none") and transport_kind(config.exchange_url).shares_files:
        # A folder on this machine or a shared filesystem: its permissions decide who can write, as for any file.
        described += " (a folder exchange: fine where only you can write the folder; set swarm_secret otherwise)"
    logger.warning("Peer %r: message authentication: %s.", config.peer_id, described)
    waiting = no_waiting_warning(config)
    if waiting is not None:
        logger.warning("%s", waiting)
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
        window=exchange_mode(config.exchange_mode).window,
        swarm_name=credentials.swarm_name,
        run_id=credentials.run_id,
        limits=Limits.for_receiver(
            # Another tokenizer may need several of its tokens for one of ours (a character-level one: ~4).
            max_completion_length=(16 if config.cross_tokenizer else 4) * config.max_completion_length,
            max_rows=max(config.max_peer_message_rows, config.generation_batch_size),
        ),
    )


def no_waiting_warning(config: FTISConfig) -> str | None:
    """What a peer says when it starts, once, when its rounds wait for no one: the sync or async mode
    without `expected_peers` (other than itself) or `num_expected_peers`. Its rounds then take whatever has arrived,
    so a slower peer's rows can miss their round, silently. `None` otherwise, and for a mode that never waits by
    design (`free`: its window's `waits` is the constant `False`; the sync window's depends on the settings)."""
    if exchange_mode(config.exchange_mode).window.waits is False:
        return None
    others = set(config.expected_peers or []) - {config.peer_id}
    if others or config.num_expected_peers:
        return None
    return (
        f"Peer {config.peer_id!r}: exchange_mode={config.exchange_mode!r} with neither expected_peers nor "
        "num_expected_peers: each round waits for no one and takes whatever has arrived, so a slower peer's rows can "
        "miss their round. Set expected_peers to the swarm's peer ids (--expected_peers a b) or num_expected_peers "
        "to the number of other peers, so that each round waits for them (up to peer_timeout)."
    )


class RoundRunner:
    """
    The exchange of rows with the swarm, once per generation batch, on the main process.

    How a round meets the training step is the exchange mode's (`trl_ftis.swarm.exchange_modes`, built once from
    `exchange_mode`): `sync` runs the round inside the step, `async` in a background worker one round ahead, `free`
    never waits and trains on a queue of arrived rows. The runner gives every mode the same round ([`run_round`]:
    publish, collect, admit, select, score, normalise) and bounds, and measures the training loop's waits: [`lock`]
    keeps a worker's admission (tokenizer, reward functions, ledger) apart from the training loop's use of them
    (generation, scoring, the merge: [`turn`]); `ftis/exchange/blocking_seconds` is the time the training loop waited
    on the exchange (the round, a worker's result, the lock), not the admission work a mode reports
    (`ftis/exchange/admission_seconds`).

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
        self.blocking_seconds = 0.0  # the training loop's waits on the exchange, all steps together
        self.ages: Counter = Counter()  # rows trained on, by age in their sender's steps
        self._blocked_seconds = 0.0  # waited for the lock since the last round's metrics
        mode = exchange_mode(config.exchange_mode)
        ledger.learn_reasons(mode.drop_reasons)  # the reasons only this mode counts
        self.mode = mode(self)  # the mode asks of the runner what `ExchangeMode`'s `RoundHost` declares

    @property
    def worker_errors(self) -> int:
        """Rounds that failed in a background worker."""
        return self.mode.worker_errors

    @property
    def admission_seconds(self) -> float:
        """The free mode: admitting the rows the steps took (work, not a wait), all steps together."""
        return self.mode.admission_seconds

    @contextmanager
    def turn(self):
        """Hold [`lock`] (the training loop's side); the time waited for it counts as blocking."""
        started = time.monotonic()
        with self.lock:
            self._blocked_seconds += time.monotonic() - started
            yield

    def close(self) -> None:
        """Stop the mode's background work, if any (a later round starts it again), abandoning a round in flight (its
        result would never be used): `train()` ends within about a second of its last step or of a signal."""
        self.mode.close()

    def wait(self) -> None:
        """Block until the mode's background work in flight (if any) is done, leaving its result for the next step
        (before a checkpoint: a collect of the free mode has its rows queued, and so saved)."""
        self.mode.wait()

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """This step's round, as the mode runs it: the rows to train on, the own rows' horizontal statistics and the
        metrics, with `ftis/exchange/blocking_seconds`."""
        started = time.monotonic()
        rows, own_statistics, metrics = self.mode.round(own_rows, round)
        blocked = self._blocked_seconds + time.monotonic() - started
        blocked -= metrics.get("ftis/exchange/admission_seconds", 0.0)  # admission work is not a wait
        metrics["ftis/exchange/blocking_seconds"] = blocked
        self.blocking_seconds += blocked
        self._blocked_seconds = 0.0
        self.ages.update(int(row.age) for row in rows if row.age is not None)
        return RoundOutcome(rows, own_statistics, metrics)

    def queue_rows(self, local_rows: int) -> int:
        """The rows a queue of peer rows holds for steps of `local_rows` own rows: 4 x their peer-row cap (at least
        64), or the round budget's rows without a cap. The inbox of `add_peer_rows`, a mode's queue of arrived rows,
        and each queue a checkpoint may restore."""
        cap = self.peer_row_cap(local_rows)
        if cap is not None:
            return max(4 * cap, 64)
        return self.swarm.budget.max_rows if self.swarm is not None else RoundBudget().max_rows

    def score(self, rows: Sequence[PeerRow]) -> list[ScoredRow]:
        """Received rows (a mode's queue) admitted, rescored and normalised as a round's, without selection; never
        raises because of the rows (an unexpected error drops them all, `internal_error`). Called holding [`lock`]."""
        try:
            admitted = self.rescored(self.admitted(rows))
            return self.admission.guard_statistics(with_group_statistics(admitted, self.scale_rewards))
        except Exception as error:  # the last line of defence: a step never raises because of what peers sent
            if not self.ledger.warned("*", "internal_error"):
                logger.exception("Processing the queued peer rows failed; this step trains on own rows only.")
            self.ledger.count("*", "internal_error", len(rows), detail=f"{type(error).__name__}: {error}"[:300])
            return []

    def run_round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        """Publish, collect, admit, select, score, normalise (in the training loop, or in the worker). Never raises
        because of what peers sent: a row is trained on or dropped and counted by reason."""
        swarm = self.swarm
        bytes_sent = swarm.publish(own_rows, round)
        cap = self.peer_row_cap(len(own_rows))
        # Decode at most a few times what this round can use: rows beyond that cost nothing.
        # Each regular's share of the round's rows holds at least a message like ours: a member's volume cannot crowd
        # an honest peer out, and an honest peer's message is never cut to nothing by its share.
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
        if self.mode.closing.is_set():
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
