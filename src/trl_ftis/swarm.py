"""Swarm rounds: publish this peer's rows, collect the other peers' rows, refuse what must not be trained on.

One [`Swarm`] per training job, used by the main process only. Every round it publishes the job's freshly
sampled rows as one signed message, then collects what the other peers published: it waits for the expected peers
(up to `peer_timeout`), drops stale and foreign messages, and turns the rest into [`trl_ftis.PeerRow`] s.
Nothing a peer sends can stop the round: a bad message is counted, logged once per peer and reason, and skipped.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .exchange import ExchangeError, Message, WireCompletion, WireGroup, decode_message, encode_message, peek_header
from .exchange.transports import Transport, open_transport
from .peer_rows import PeerRow

logger = logging.getLogger(__name__)

# Messages created this long before the swarm started are leftovers of an earlier run in the same exchange.
LEFTOVER_SLACK_SECONDS = 300.0


@dataclass
class PeerRoundStats:
    """What one peer delivered in one round (its accepted rows are in [`RoundResult.rows`])."""

    rows_received: int = 0
    """Rows in the peer's messages that passed the checks (signature, tokenizer, temperature, duplicate)."""
    rows_stale: int = 0
    """Of those, rows in messages then dropped as stale."""
    bytes_received: int = 0
    staleness: list[int] = field(default_factory=list)
    """Rounds between this peer's own round and the message's, per message accepted (negative: the peer is ahead)."""


@dataclass
class RoundResult:
    """Everything one [`Swarm.collect`] produced."""

    rows: list[PeerRow] = field(default_factory=list)
    peers: dict[str, PeerRoundStats] = field(default_factory=lambda: defaultdict(PeerRoundStats))
    refused: Counter = field(default_factory=Counter)
    """Refused messages (or files) by reason: `signature`, `unsigned`, `tokenizer`, `temperature`, `stale`,
    `unrecognised`, `too_large`, `truncated`, `ids`, `logps` ..."""
    missing: list[str] = field(default_factory=list)
    """Expected peers that sent nothing new before the timeout."""
    waited: float = 0.0


def rows_to_message(
    rows: Sequence[PeerRow],
    *,
    sender: str,
    round: int,
    tokenizer_fingerprint: str,
    tokenizer_name: str,
    temperature: float,
    reward_names: Sequence[str],
    model: str = "",
) -> Message:
    """Pack rows into a wire message; rows sharing `group` share one prompt entry."""
    groups: list[WireGroup] = []
    group_index: dict[Any, int] = {}
    completions = []
    for row in rows:
        key = row.group
        if key not in group_index:
            group_index[key] = len(groups)
            groups.append(WireGroup(prompt=row.prompt, extra=dict(row.extra)))
        per_func = row.rewards_per_func or {}
        completions.append(
            WireCompletion(
                group=group_index[key],
                completion_ids=np.asarray(row.completion_ids, dtype=np.int32),
                generator_logps=np.asarray(row.generator_logps, dtype=np.float32),
                reward=float(row.reward),
                rewards_per_func=np.asarray([per_func.get(name, math.nan) for name in reward_names], np.float32),
            )
        )
    return Message(
        sender=sender,
        round=int(round),
        tokenizer_fingerprint=tokenizer_fingerprint,
        tokenizer_name=tokenizer_name,
        temperature=float(temperature),
        reward_names=list(reward_names),
        groups=groups,
        completions=completions,
        model=model,
    )


def message_to_rows(message: Message) -> list[PeerRow]:
    """Unpack a decoded message into peer rows; group keys are unique per (sender, round, prompt index)."""
    rows = []
    for completion in message.completions:
        group = message.groups[completion.group]
        rows.append(
            PeerRow(
                prompt=group.prompt,
                # Arrays stay arrays (no per-token Python objects); the merge turns them into tensors directly.
                completion_ids=completion.completion_ids,
                generator_logps=completion.generator_logps,
                reward=float(completion.reward),
                group=(message.sender, message.round, completion.group),
                sender=message.sender,
                rewards_per_func={
                    name: float(value)
                    for name, value in zip(message.reward_names, completion.rewards_per_func.tolist(), strict=True)
                },
                extra=dict(group.extra),
                round=message.round,
            )
        )
    return rows


class Swarm:
    """This peer's connection to the swarm: one transport, one identity, the refusal rules.

    Args:
        url: the exchange URL (`dir://`, `redis://`, `rediss://`, `memory://`).
        peer_id: this peer's id; its own messages are skipped when collecting.
        tokenizer_fingerprint / tokenizer_name: what this peer's tokenizer is; peers with another fingerprint
            are refused (their token ids mean other tokens here).
        vocab_limit: token ids must be below it.
        temperature: the sampling temperature; log-probs at another temperature are not comparable.
        reward_names: names of this peer's reward functions (sent with per-function rewards).
        secret: the swarm secret; when set, every message is signed and unsigned or wrongly signed ones are refused.
        expected_peers / num_expected_peers: whom a round waits for, up to `peer_timeout` seconds.
        max_staleness: messages from rounds older than `round - max_staleness` are dropped.
        compact: send 16-bit, compressed messages.
        keep_rounds: own messages older than this many rounds are removed from the exchange.
        model_name: this peer's model (name or path), sent along so that peers can name it in summaries and model
            cards; received names are in `peer_models`.
    """

    def __init__(
        self,
        url: str,
        *,
        peer_id: str,
        tokenizer_fingerprint: str,
        tokenizer_name: str,
        vocab_limit: int,
        temperature: float,
        reward_names: Sequence[str],
        secret: str | bytes | None = None,
        expected_peers: Sequence[str] | None = None,
        num_expected_peers: int | None = None,
        peer_timeout: float = 60.0,
        max_staleness: int = 2,
        compact: bool = False,
        keep_rounds: int | None = None,
        transport: Transport | None = None,
        model_name: str = "",
    ):
        self.url = url
        self.peer_id = peer_id
        self.fingerprint = tokenizer_fingerprint
        self.tokenizer_name = tokenizer_name
        self.vocab_limit = vocab_limit
        self.temperature = float(temperature)
        self.reward_names = list(reward_names)
        self.secret = secret or None
        self.expected_peers = sorted(set(expected_peers or []) - {peer_id})
        self.num_expected_peers = num_expected_peers
        self.peer_timeout = float(peer_timeout)
        self.max_staleness = int(max_staleness)
        self.compact = compact
        self.keep_rounds = keep_rounds if keep_rounds is not None else max_staleness + 2
        self.transport = transport if transport is not None else open_transport(url)
        self.started = time.time()
        self.known_peers: set[str] = set()
        self.model_name = model_name
        self.peer_models: dict[str, str] = {}  # sender -> the model it reported (accepted messages only)
        # Expected peers that missed a deadline are not waited for until they send again: a dead peer costs one
        # timeout, not one per round.
        self._absent: set[str] = set()
        self._absent_count = 0
        self._delivered: set[tuple[str, int]] = set()  # (sender, round): a sender publishes once per round
        self._warned: set[tuple[str, str]] = set()
        self._closed = False

    # -- publishing ----------------------------------------------------------------------------------------------
    def publish(self, rows: Sequence[PeerRow], round: int) -> int:
        """Publish this peer's rows of `round`; returns the bytes sent. Transport errors are logged, not raised."""
        if not rows:
            return 0
        message = rows_to_message(
            rows,
            sender=self.peer_id,
            round=round,
            tokenizer_fingerprint=self.fingerprint,
            tokenizer_name=self.tokenizer_name,
            temperature=self.temperature,
            reward_names=self.reward_names,
            model=self.model_name,
        )
        data = encode_message(message, secret=self.secret, compact=self.compact)
        try:
            self.transport.publish(data, sender=self.peer_id, round=round)
            self.transport.prune(sender=self.peer_id, keep_rounds=self.keep_rounds, current_round=round)
        except Exception as error:  # noqa: BLE001 - a lost message costs the others one round of our rows, not our run
            self._warn_once("publish", type(error).__name__, f"Could not publish round {round}: {error}")
            return 0
        return len(data)

    # -- collecting ----------------------------------------------------------------------------------------------
    def _satisfied(self, fresh: set[str]) -> bool:
        if self.expected_peers and not set(self.expected_peers) - self._absent <= fresh:
            return False
        return self.num_expected_peers is None or len(fresh) >= self.num_expected_peers - self._absent_count

    @property
    def waits(self) -> bool:
        return bool(self.expected_peers) or bool(self.num_expected_peers)

    def collect(self, round: int) -> RoundResult:
        """Collect what arrived for `round`. Waits for the expected peers (each must deliver something new) at most
        `peer_timeout` seconds; never raises because of what a peer sent."""
        result = RoundResult()
        fresh: set[str] = set()
        start = time.monotonic()
        deadline = start + self.peer_timeout
        while True:
            try:
                envelopes = self.transport.poll()
            except Exception as error:  # noqa: BLE001 - any transport failure: train on what arrived
                self._warn_once("transport", type(error).__name__, f"Polling the exchange failed: {error}")
                envelopes = []
            for envelope in envelopes:
                sender = self._accept(envelope, round, result)
                if sender is not None:
                    fresh.add(sender)
            if not self.waits or self._satisfied(fresh):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self.transport.wait(min(remaining, 1.0))
            except Exception as error:  # noqa: BLE001 - any transport failure: train on what arrived
                self._warn_once("transport", type(error).__name__, f"Waiting on the exchange failed: {error}")
                time.sleep(min(remaining, 0.5))
        result.waited = time.monotonic() - start
        self._absent -= fresh  # a peer that delivers again is waited for again
        if self.num_expected_peers is not None:
            self._absent_count = min(self._absent_count, max(self.num_expected_peers - len(fresh), 0))
        if self.waits and not self._satisfied(fresh):
            if self.expected_peers and not set(self.expected_peers) - self._absent <= fresh:
                result.missing = sorted(set(self.expected_peers) - self._absent - fresh)
                self._absent |= set(result.missing)
            else:
                shortfall = self.num_expected_peers - self._absent_count - len(fresh)
                result.missing = [f"{shortfall} of {self.num_expected_peers} peers"]
                self._absent_count += shortfall
            logger.warning(
                "Round %d: nothing new from %s after %.1f s; training on what arrived, and not waiting for them "
                "again until they send.",
                round,
                ", ".join(result.missing),
                result.waited,
            )
        return result

    def _accept(self, envelope, round: int, result: RoundResult) -> str | None:
        """Decode and check one envelope; add its rows to `result`. Returns the sender when accepted."""
        if envelope.error:
            result.refused[envelope.error] += 1
            self._warn_once(
                envelope.source, envelope.error, f"Skipped {envelope.source!r} from the exchange: {envelope.error}"
            )
            return None
        try:
            header = peek_header(envelope.data)
        except ExchangeError as error:
            result.refused[error.reason] += 1
            self._warn_once(str(envelope.sender_hint), error.reason, f"Refused a message ({envelope.source}): {error}")
            return None
        if header.get("sender") == self.peer_id:
            return None  # our own message
        try:
            message = decode_message(envelope.data, secret=self.secret, vocab_limit=self.vocab_limit)
        except ExchangeError as error:
            result.refused[error.reason] += 1
            who = header.get("sender", envelope.sender_hint)
            self._warn_once(str(who), error.reason, f"Refused a message claiming to come from {who!r}: {error}")
            return None
        sender = message.sender
        if message.tokenizer_fingerprint != self.fingerprint:
            result.refused["tokenizer"] += 1
            self._warn_once(
                sender,
                "tokenizer",
                f"Refusing peer {sender!r}: its tokenizer {message.tokenizer_name!r} "
                f"(fingerprint {message.tokenizer_fingerprint[:12]}) differs from ours {self.tokenizer_name!r} "
                f"(fingerprint {self.fingerprint[:12]}); token ids would mean different tokens. Peers must share a "
                "tokenizer.",
                level=logging.ERROR,
            )
            return None
        if not math.isclose(message.temperature, self.temperature, rel_tol=1e-6):
            result.refused["temperature"] += 1
            self._warn_once(
                sender,
                "temperature",
                f"Refusing peer {sender!r}: it samples at temperature {message.temperature}, we at {self.temperature}; "
                "all peers of a swarm must use one temperature.",
                level=logging.ERROR,
            )
            return None
        if (sender, message.round) in self._delivered:  # e.g. a Redis publish retried after a dropped connection
            result.refused["duplicate"] += 1
            return None
        self._delivered.add((sender, message.round))
        if len(self._delivered) > 10_000:
            self._delivered = {key for key in self._delivered if key[1] >= round - self.max_staleness - 1}
        stats = result.peers[sender]
        stats.bytes_received += envelope.size
        stats.rows_received += len(message.completions)
        staleness = round - message.round
        if staleness > self.max_staleness or message.created < self.started - LEFTOVER_SLACK_SECONDS:
            result.refused["stale"] += 1
            stats.rows_stale += len(message.completions)
            return None
        if message.model and len(self.peer_models) < 1000:  # bounded like the warnings
            self.peer_models[sender] = message.model
        if sender not in self.known_peers:
            self.known_peers.add(sender)
            logger.info("Peer %r joined the swarm (round %d).", sender, message.round)
        rows = message_to_rows(message)
        stats.staleness.append(staleness)
        result.rows.extend(rows)
        return sender

    def _warn_once(self, who: str, reason: str, text: str, level: int = logging.WARNING) -> None:
        # Bounded: a flood of messages with made-up sender names must not grow memory (they are still counted).
        if (who, reason) not in self._warned and len(self._warned) < 1000:
            self._warned.add((who, reason))
            logger.log(level, text)

    @property
    def closed(self) -> bool:
        """Whether [`close`] was called (and [`reopen`] not since)."""
        return self._closed

    def close(self) -> None:
        """Close the transport (a Redis connection, open files). Idempotent: only the first call closes it."""
        if not self._closed:
            self._closed = True
            self.transport.close()

    def reopen(self) -> None:
        """Open a fresh transport on `url` after [`close`] (a trainer's second `train()`). Messages already
        delivered are refused as duplicates, so nothing is trained on twice."""
        if self._closed:
            self.transport = open_transport(self.url)
            self._closed = False
