"""Free-running exchange (`exchange_mode="free"`): each sender's messages taken in order, its window, its liveness.

[`SenderOrder`] owns what a free-running [`trl_ftis.swarm.client.Swarm`] knows of each sender: its newest start (epoch) and
the round of the newest message accepted from it in that start, and when it was last heard from. A message is taken
only when it is newer than both (a newer epoch: the sender restarted, perhaps from an older checkpoint), so replays of
a run's own genuine messages are refused however old or many they are, and never count as signs of life. What one
collect took is kept in its [`trl_ftis.swarm.round_budget.RoundSpending`] (`free_taken`, `free_newest`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping

from ..exchange import Message
from .round_budget import RoundResult, RoundSpending

__all__ = ["SenderOrder"]

logger = logging.getLogger(__name__)


class SenderOrder:
    """Each sender's newest accepted `(epoch, round)` and when it was last heard from; at most `max_senders` of them
    (a flood of invented ids cannot grow it: beyond it, only regulars are followed)."""

    def __init__(self, max_staleness: int, peer_timeout: float, max_senders: int):
        self.max_staleness, self.peer_timeout, self.max_senders = max_staleness, peer_timeout, max_senders
        self.epochs: dict[str, int] = {}
        self.rounds: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}
        self.started = time.monotonic()

    def is_old(self, sender_hint, round_hint: int) -> bool:
        """Whether an envelope's (unverified) hints say it is no newer than its sender's newest accepted round: a
        replay, a leftover, or a restarted sender's message (read last, not skipped: its epoch may be newer)."""
        return round_hint <= self.rounds.get(sender_hint, -1)

    def refusal(self, sender: str, message: Message, state: RoundSpending) -> str | None:
        """Why `message` must not be taken (`stale`; `senders`, when as many senders as kept are followed and `sender`
        is not a regular), or None: it must be of a newer epoch than every one accepted from `sender`, or of its
        newest epoch and a newer round than every one accepted from it in earlier collects, and not already taken in
        this one. No bounded memory decides this."""
        epoch, round = message.epoch, message.round
        known = self.epochs.get(sender)
        new = known is None and sender not in state.free_newest
        if new and len(self.epochs) >= self.max_senders and sender not in state.regulars:
            return "senders"
        if known is not None and (epoch, round) <= (known, self.rounds[sender]):
            return "stale"
        current = state.free_newest.get(sender)
        if current is not None and epoch < current[0]:
            return "stale"  # an older start than one already taken in this collect
        if (epoch, round) in state.free_taken.get(sender, ()):
            return "stale"
        return None

    def restarted(self, sender: str, message: Message) -> bool:
        """Whether `message` is of a newer start of `sender` than the one followed."""
        return message.epoch > self.epochs.get(sender, message.epoch)

    @staticmethod
    def note(sender: str, message: Message, result: RoundResult, state: RoundSpending) -> None:
        """Record a message [`refusal`] let through and the round budget took. One of a newer epoch than what this
        collect took from `sender` (it restarted) replaces that: the older start's rows go."""
        epoch, round = message.epoch, message.round
        taken = state.free_taken.setdefault(sender, set())
        current = state.free_newest.get(sender)
        if current is not None and epoch > current[0]:
            dropped = sum(row.sender == sender for row in result.rows)
            result.rows = [row for row in result.rows if row.sender != sender]
            result.peers[sender].rows_stale += dropped
            result.refused["stale"] += len(taken)
            taken.clear()
            current = None
        taken.add((epoch, round))
        if current is None or round > current[1]:
            state.free_newest[sender] = (epoch, round)

    def window(self, result: RoundResult, state: RoundSpending) -> None:
        """At the end of a collect: keep each sender's rows of at most `max_staleness` of its own steps before its
        newest message in this collect (older ones are dropped as `stale`), and follow each sender's newest accepted
        message from now on (only such messages count as signs of life)."""
        newest: dict[str, int] = {}
        for row in result.rows:
            newest[row.sender] = max(newest.get(row.sender, row.round), row.round)
        stale_messages: set[tuple[str, int]] = set()
        kept = []
        for row in result.rows:
            if newest[row.sender] - row.round > self.max_staleness:
                result.peers[row.sender].rows_stale += 1
                stale_messages.add((row.sender, row.round))
            else:
                kept.append(row)
        result.rows = kept
        result.refused["stale"] += len(stale_messages)
        if not result.refused["stale"]:
            del result.refused["stale"]
        now = time.monotonic()
        for sender, (epoch, round) in state.free_newest.items():
            if epoch > self.epochs.get(sender, epoch):
                logger.warning(
                    "Peer %r restarted (its messages now come from a new start, at its step %d, after step %d): "
                    "taking its rows from there.",
                    sender,
                    round,
                    self.rounds[sender],
                )
            self.epochs[sender], self.rounds[sender] = epoch, round
            if sender in self.last_heard or len(self.last_heard) < self.max_senders:
                self.last_heard[sender] = now
        for sender in {row.sender for row in kept}:
            rounds = {row.round for row in kept if row.sender == sender}
            result.peers[sender].staleness.extend(newest[sender] - r for r in sorted(rounds))

    def silent(
        self, expected_peers: Collection[str], num_expected_peers: int | None, departed: Mapping[str, int]
    ) -> list[str]:
        """The expected peers not heard from for `peer_timeout` seconds (never waited for), or `["k of n peers"]`
        with `num_expected_peers`; departed peers are not missing."""
        now = time.monotonic()

        def silent(peer: str) -> bool:
            return now - self.last_heard.get(peer, self.started) > self.peer_timeout

        if expected_peers:
            return [peer for peer in expected_peers if peer not in departed and silent(peer)]
        if num_expected_peers:
            heard = sum(not silent(peer) for peer in self.last_heard if peer not in departed)
            expected = num_expected_peers - len(departed)
            if heard < expected and now - self.started > self.peer_timeout:
                return [f"{expected - heard} of {num_expected_peers} peers"]
        return []

    def load(self, rounds: Mapping[str, int], epochs: Mapping[str, int]) -> None:
        """Follow the senders of a saved state (checked by the caller); a sender of a state written before epochs
        existed is at epoch 0, so any start of it is newer."""
        self.rounds = dict(rounds)
        self.epochs = {sender: epochs.get(sender, 0) for sender in rounds}
