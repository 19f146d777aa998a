"""The free mode (`exchange_mode="free"`): each sender's messages taken in order, its window, its liveness.

[`SenderOrder`] owns what a [`trl_ftis.swarm.client.Swarm`] of the free mode knows of each sender: its newest start
(epoch) and the round of the newest message accepted from it in that start, and when it was last heard from. A message
is taken only when it is newer than both (a newer epoch: the sender restarted, perhaps from an older checkpoint), or
was made later than every message taken from the sender (`created`, [`trl_ftis.swarm.clocks.heard_at`]): an honest
sender never makes a later message of an earlier round or start, so such a message shows that the newest one was signed
by someone else (a member, with the shared secret) and the sender is followed from it. Replays of a run's own genuine
messages are refused however old or many they are (neither newer nor made later than what was taken), and never
count as signs of life. What one collect took is kept in its [`trl_ftis.swarm.round_budget.RoundSpending`]
(`free_taken`, `free_newest`, `free_heard`).

At most `max_senders` senders are followed. When as many are, a new sender takes the place of the one heard from
least recently, if that one has been silent for `peer_timeout` (and is not a regular); checkpoints keep only the
senders that delivered more than one message, so one-message senders cannot fill a resumed table either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ...exchange import Message
from ..clocks import heard_at
from ..round_budget import RoundResult, RoundSpending

__all__ = ["FreeCollect", "SenderOrder"]

logger = logging.getLogger(__name__)


@dataclass
class FreeCollect:
    """What one collect of the free window took ([`FreeWindow.begin`]): the (epoch, round) of the messages taken from
    each sender, the newest of them, and the latest `created` (bounded: `heard_at`) taken from each sender."""

    taken: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    newest: dict[str, tuple[int, int]] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)


class SenderOrder:
    """Each sender's newest accepted `(epoch, round)`, the newest (epoch, round) and `created` ever taken from it, and
    when it was last heard from; at most `max_senders` of them (a flood of invented ids cannot grow it, and cannot
    keep a late joiner out once it falls silent: [`make_room`])."""

    def __init__(self, max_staleness: int, peer_timeout: float, max_senders: int):
        self.max_staleness, self.peer_timeout, self.max_senders = max_staleness, peer_timeout, max_senders
        self.epochs: dict[str, int] = {}  # the start followed (a later-made message of an older start replaces it)
        self.rounds: dict[str, int] = {}  # the newest round taken in that start
        self.top: dict[str, tuple[int, int]] = {}  # the newest (epoch, round) ever taken: replays stay refused
        self.heard: dict[str, float] = {}  # the latest `created` (bounded: `heard_at`) ever taken
        self.messages: dict[str, int] = {}  # messages taken, counted up to 2 (one-message senders stay out of state)
        self.last_heard: dict[str, float] = {}
        self.started = time.monotonic()
        self.loaded_at = time.time()  # `created` a resumed sender must beat to be taken out of order

    def is_old(self, sender_hint, round_hint: int) -> bool:
        """Whether an envelope's (unverified) hints say it is no newer than its sender's newest accepted round: a
        replay, a leftover, or a restarted sender's message (read last, not skipped: its epoch may be newer)."""
        return round_hint <= self.rounds.get(sender_hint, -1)

    def refusal(
        self, sender: str, message: Message, state: RoundSpending, listed: Collection[str] = frozenset()
    ) -> str | None:
        """Why `message` must not be taken (`stale`; `senders`, when as many senders as kept are followed, none of
        them silent long enough to give way, and `sender` is not a regular), or None. Only `listed` peers (expected
        or keyed) never give their place away. It must be of a newer (epoch, round) than every one taken from
        `sender`, or made later than every one ([`later`]), and not already taken in this collect. No bounded memory
        decides this."""
        epoch, round = message.epoch, message.round
        known = self.top.get(sender)
        new = known is None and sender not in state.window.newest
        if new and sender not in state.regulars and not self.make_room(listed, state):
            return "senders"
        if known is not None and (epoch, round) <= known and not self.later(sender, message):
            return "stale"
        current = state.window.newest.get(sender)
        if current is not None and epoch < current[0] and heard_at(message.created) <= state.window.heard[sender]:
            return "stale"  # an older start than one already taken in this collect, and not made later
        if (epoch, round) in state.window.taken.get(sender, ()):
            return "stale"
        return None

    def later(self, sender: str, message: Message) -> bool:
        """Whether `message` was made later than every message taken from `sender` (after this state was loaded, for
        a sender of a resumed state): then it is taken whatever its (epoch, round)."""
        return heard_at(message.created) > self.heard.get(sender, self.loaded_at)

    def make_room(self, listed: Collection[str], state: RoundSpending) -> bool:
        """Whether a new sender can be followed: fewer than `max_senders` are, or the one heard from least recently
        has been silent for `peer_timeout` and is not `listed` (it is forgotten: its leftovers could then be taken
        once, as by a peer that never saw it)."""
        joining = sum(sender not in self.top for sender in state.window.newest)  # followed from this collect's end
        if len(self.top) + joining < self.max_senders:
            return True
        now = time.monotonic()
        for sender, heard in self.last_heard.items():  # least recently heard first (kept in that order)
            if now - heard <= self.peer_timeout:
                return False
            if sender not in listed:
                self.forget(sender)
                return True
        return False

    def forget(self, sender: str) -> None:
        for table in (self.epochs, self.rounds, self.top, self.heard, self.messages, self.last_heard):
            table.pop(sender, None)

    def restarted(self, sender: str, message: Message) -> bool:
        """Whether `message` is of a newer start of `sender` than the one followed."""
        return message.epoch > self.epochs.get(sender, message.epoch)

    @staticmethod
    def note(sender: str, message: Message, result: RoundResult, state: RoundSpending) -> None:
        """Record a message [`refusal`] let through and the round budget took. One of a newer epoch than what this
        collect took from `sender` (it restarted), or of an earlier (epoch, round) but made later (the newer one was
        not the sender's), replaces that: those rows go."""
        epoch, round, heard = message.epoch, message.round, heard_at(message.created)
        taken = state.window.taken.setdefault(sender, set())
        current = state.window.newest.get(sender)
        if current is not None and (
            epoch > current[0] or ((epoch, round) < current and heard > state.window.heard[sender])
        ):
            dropped = sum(row.sender == sender for row in result.rows)
            result.rows = [row for row in result.rows if row.sender != sender]
            result.peers[sender].rows_stale += dropped
            result.refused["stale"] += len(taken)
            taken.clear()
            current = None
        taken.add((epoch, round))
        if current is None or (epoch, round) > current:
            state.window.newest[sender] = (epoch, round)
        state.window.heard[sender] = max(state.window.heard.get(sender, heard), heard)

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
        for sender, (epoch, round) in state.window.newest.items():
            if epoch > self.epochs.get(sender, epoch):
                logger.warning(
                    "Peer %r restarted (its messages now come from a new start, at its step %d, after step %d): "
                    "taking its rows from there.",
                    sender,
                    round,
                    self.rounds[sender],
                )
            elif sender in self.top and (epoch, round) <= self.top[sender]:
                logger.warning(
                    "Peer %r: a message made later than its newest is of an earlier step (%d, after %d): following "
                    "it from there. The newer one was not this peer's: a member signed it under its name (the "
                    "shared secret cannot tell them apart; peer_keys_file can).",
                    sender,
                    round,
                    self.top[sender][1],
                )
            self.epochs[sender], self.rounds[sender] = epoch, round
            self.top[sender] = max(self.top.get(sender, (epoch, round)), (epoch, round))
            self.heard[sender] = max(self.heard.get(sender, state.window.heard[sender]), state.window.heard[sender])
            self.messages[sender] = min(self.messages.get(sender, 0) + len(state.window.taken[sender]), 2)
            self.last_heard.pop(sender, None)  # kept in the order heard: `make_room` gives the oldest's place away
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
        existed is at epoch 0, so any start of it is newer. A message made after the load is taken from a saved
        sender out of order ([`later`]): the state may hold a far round that a member signed under its name."""
        self.rounds = dict(rounds)
        self.epochs = {sender: epochs.get(sender, 0) for sender in rounds}
        self.top = {sender: (self.epochs[sender], round) for sender, round in self.rounds.items()}
        self.heard, self.messages = {}, dict.fromkeys(self.rounds, 2)
        now = time.monotonic()
        self.last_heard = dict.fromkeys(self.rounds, now)  # silent from now on, they give their place away in time
        self.loaded_at = time.time()

    def state_dict(self) -> dict[str, dict[str, int]]:
        """The senders to follow after a resume: those that delivered more than one message (a flood of one-message
        ids cannot fill a resumed table)."""
        kept = [sender for sender in self.rounds if self.messages.get(sender, 0) > 1]
        return {
            "sender_rounds": {sender: self.rounds[sender] for sender in kept},
            "sender_epochs": {sender: self.epochs[sender] for sender in kept},
        }
