"""The sync window (`exchange_mode` `sync` and `async`): one shared round that a [`trl_ftis.swarm.client.Swarm`] reads
through. A message is fresh from `max_staleness` rounds behind this peer's round to `max_rounds_ahead` ahead; a collect
waits for the expected peers (each must deliver something new) and stops waiting for one that missed a deadline until
it sends again; a peer that finds the swarm far ahead moves its round forward ([`SyncWindow.align`]).

It owns its state (the expected peers not waited for, each sender's newest round and start as catch-up evidence),
which the swarm's checkpoint state holds under the window's name, and checks a saved one itself
([`SyncWindow.check_state`]).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..clocks import heard_at
from ..round_budget import RoundResult, RoundSpending
from ..round_windows import MAX_KNOWN_PEERS, MAX_SWARM_ROUND, WindowHost
from ..swarm_state import counts, not_forged, state_field, whole

if TYPE_CHECKING:
    from ...exchange import Message

__all__ = ["EVIDENCE_CLOCK_SLACK", "CatchUp", "SyncCollect", "SyncWindow"]

logger = logging.getLogger(__name__)

SYNC_WINDOW_STATE = ("absent", "absent_count", "newest", "newest_epochs")
"""The keys of the sync window's saved state."""
EVIDENCE_CLOCK_SLACK = 60.0
"""Without a run id, catch-up evidence counts only from messages stamped (`created`) at most this many seconds before
this peer started: leftovers of an earlier run cannot move it."""


@dataclass
class SyncCollect:
    """What the sync window records during one collect ([`SyncWindow.begin`]), for its catch-up at each poll's end."""

    newest: dict[str, tuple[int, int]] = field(default_factory=dict)  # newest verified (epoch, round) per sender
    newest_heard: dict[str, float] = field(default_factory=dict)  # when that message was made (`clocks.heard_at`)
    leads: dict[str, int] = field(default_factory=dict)  # senders that showed they are live and far ahead
    deferred: list = field(default_factory=list)  # their messages beyond the window, until the catch-up decides
    hinted: set[str] = field(default_factory=set)  # senders of envelopes refused unread as far ahead in this poll


@dataclass
class CatchUp:
    """One move forward of a peer in a shared round ([`SyncWindow.align`]), kept so that it can be undone."""

    size: int  # rounds moved
    leaders: frozenset[str]  # the senders whose leads were at the median or above
    needed: int  # how many of them the median needed
    forgotten: dict[bytes, int]  # digests of the window left behind (refused as duplicates again after an undo)
    disowned: set[str] = field(default_factory=set)  # leaders that sent later messages of earlier rounds since


class SyncWindow:
    """One shared round window, with waiting and catch-up (`exchange_mode` `sync` and `async`)."""

    name = "sync"
    is_old: Callable | None = None  # no sender order: `reading_order` sorts by the shared window only

    def __init__(self, host: WindowHost):
        self.host = host
        # Expected peers that missed a deadline are not waited for until they send again: a dead peer costs one
        # timeout, not one per round.
        self.absent: set[str] = set()
        self.absent_count = 0
        # Round alignment ([`align`]): `newest` is the newest verified round of each sender as of the previous poll (a
        # later, newer one shows it is live); `hinted`, the senders whose far-ahead messages were refused unread
        # (their next one is read). `newest_epoch` is the start of each sender that `newest` holds a round of: a newer
        # start's rounds replace an older one's, and an older start's messages are no evidence and are refused once
        # a newer start of the sender was seen.
        self.newest: dict[str, int] = {}
        self.newest_epoch: dict[str, int] = {}
        # When the message holding each sender's newest was made (`clocks.heard_at`): a later-made message of an
        # earlier (start, round) shows that newest was not the sender's ([`note_round`]).
        self.newest_heard: dict[str, float] = {}
        self.hinted: set[str] = set()
        self.started_at = time.time()  # wall clock, compared with messages' `created` (catch-up evidence only)
        self.catch_up: CatchUp | None = None  # the last move forward, until it is undone or replaced

    # -- waiting -------------------------------------------------------------------------------------------------
    @property
    def waits(self) -> bool:
        """Whether a collect waits for expected peers."""
        return bool(self.host.expected_peers) or bool(self.host.num_expected_peers)

    def waited_for(self) -> set[str]:
        """The expected peers a round still waits for: not absent, not departed."""
        swarm = self.host
        return set(swarm.expected_peers) - self.absent - set(swarm.departed)

    def satisfied(self, fresh: set[str]) -> bool:
        swarm = self.host
        if swarm.expected_peers and not self.waited_for() <= fresh:
            return False
        if swarm.num_expected_peers is None:
            return True
        departed = set(swarm.departed)
        return len(fresh - departed) >= swarm.num_expected_peers - self.absent_count - len(departed)

    def finish(self, round: int, result: RoundResult, state: RoundSpending, fresh: set[str]) -> None:
        """At the end of a collect: the expected peers that delivered nothing new are `missing`, and not waited for
        again until they send."""
        swarm = self.host
        self.absent -= fresh  # a peer that delivers again is waited for again
        if swarm.num_expected_peers is not None:
            self.absent_count = min(self.absent_count, max(swarm.num_expected_peers - len(fresh), 0))
        if not self.waits or self.satisfied(fresh):
            return
        if swarm.expected_peers and not self.waited_for() <= fresh:
            result.missing = sorted(self.waited_for() - fresh)
            self.absent |= set(result.missing)
        else:
            departed = set(swarm.departed)
            shortfall = swarm.num_expected_peers - self.absent_count - len(departed) - len(fresh - departed)
            result.missing = [f"{shortfall} of {swarm.num_expected_peers} peers"]
            self.absent_count += shortfall
        logger.warning(
            "Round %d: nothing new from %s after %.1f s; training on what arrived, and not waiting for them again "
            "until they send.",
            round,
            ", ".join(result.missing),
            result.waited,
        )

    # -- staleness -----------------------------------------------------------------------------------------------
    def outside(self, message_round: int, round: int) -> str | None:
        if round - message_round > self.host.max_staleness:
            return "stale"
        if message_round - round > self.host.max_rounds_ahead:
            return "ahead"
        return None

    def refusal(self, sender: str, message: Message, round: int, state: RoundSpending) -> str | None:
        """Why a verified message is not taken (`stale`, `ahead`), or None."""
        if message.epoch < self.newest_epoch.get(sender, 0):
            return "stale"  # an older start of a sender that has restarted since: superseded
        return self.outside(message.round, round)

    def refuses_unread(self, envelope, round: int, state: RoundSpending, result: RoundResult) -> bool:
        """Whether an envelope filed beyond the window is refused before it is read (`ahead`): a peer far ahead, a
        leftover of a longer run, or a lie that can only get its own message skipped (a genuine message's hint is
        its round). Stale hints are read (they come last, see `reading_order`), so that a slow peer shows in its
        `rows_stale`."""
        swarm, hint = self.host, envelope.sender_hint
        if not (
            isinstance(envelope.round_hint, int)
            and envelope.round_hint - round > swarm.max_rounds_ahead
            and not self.may_lead(hint, state.regulars)
        ):
            return False
        result.refused["ahead"] += 1
        if isinstance(hint, str):
            state.window.hinted.add(hint)  # from the next poll on, its messages are read: it may be a live swarm ahead
        swarm.warn_once(
            str(hint),
            "ahead",
            f"{hint!r} is ahead of this peer (a message filed under its round {envelope.round_hint}, ours is {round}; "
            f"max_rounds_ahead={swarm.max_rounds_ahead}): its rows are not used until one catches up.",
        )
        return True

    def staleness(self, round: int, message: Message) -> int | None:
        """A taken message's lag behind this peer's round (`ftis/peers/<peer>/staleness`)."""
        return round - message.round

    def note(self, sender: str, message: Message, result: RoundResult, state: RoundSpending) -> None:
        pass  # the shared window needs no per-sender bookkeeping of what it took

    def restarted(self, sender: str, message: Message) -> bool:
        return False  # a restart shows in the round alignment, not in a sender order

    def pruned(self, seen: dict[bytes, int], round: int) -> dict[bytes, int]:
        """The digests of accepted messages still in the window: older ones are refused as stale anyway (and, after
        an undone catch-up, those of the rounds left ahead: out of reach for as many rounds as it moved)."""
        oldest, newest = round - self.host.max_staleness, round + self.host.max_rounds_ahead
        if any(not oldest <= accepted <= newest for accepted in seen.values()):
            return {digest: accepted for digest, accepted in seen.items() if oldest <= accepted <= newest}
        return seen

    def most_seen(self, known_peers: int) -> int:
        """The digests a saved state may hold: a round window's messages."""
        swarm = self.host
        return swarm.budget.max_messages * (swarm.max_staleness + swarm.max_rounds_ahead + 2)

    # -- catching up ---------------------------------------------------------------------------------------------
    def may_lead(self, hint: str | None, regulars: frozenset[str]) -> bool:
        """Whether an envelope filed far ahead is read anyway, because its sender may be a live swarm that this peer
        lags behind ([`align`]): a regular's; with no regulars, one from a sender seen before (the first far-ahead
        envelope of a sender is refused unread, as leftovers of an earlier run are)."""
        if regulars:
            return hint in regulars
        return hint in self.newest or hint in self.hinted

    def begin(self) -> SyncCollect:
        return SyncCollect()

    def defer(self, envelope, digest: bytes, sender: str, message: Message, round: int, state: RoundSpending) -> bool:
        """Whether a verified message is set aside until the end of the poll, for [`align`] to decide: it is outside
        the window and shows a live peer far ahead ([`note_round`]), or the last catch-up may be undone."""
        shows_lead = self.note_round(sender, message, round, state)
        # While a catch-up may still be undone, every message outside the window waits too: the round may go back.
        if (shows_lead or self.catch_up is not None) and self.outside(message.round, round) is not None:
            state.window.deferred.append((envelope, digest, message))
            return True
        return False

    def note_round(self, sender: str, message: Message, round: int, state: RoundSpending) -> bool:
        """Record `sender`'s verified round; returns whether it shows a live peer far ahead of this one: newer than
        its newest of an earlier poll (leftovers of an earlier run all come in the first poll and never count) and
        more than `max_staleness` rounds ahead (this peer's messages are stale to it), from a sender whose lead
        counts (a regular; any sender when there are none). Only messages that can belong to the present run are
        evidence: with a run id every accepted one is (others are refused, `run`); without one, those stamped
        (`created`) at most `EVIDENCE_CLOCK_SLACK` seconds before this peer started, so that leftovers of a longer
        earlier run can neither move this peer nor, recorded as a sender's newest, hide that sender's live lead. A
        sender's newest round is kept per start (`epoch`): an older start's message is no evidence, and a newer
        start's rounds replace the older start's, however large those were."""
        message_round, epoch = message.round, message.epoch
        if self.host.run_id is None and message.created < self.started_at - EVIDENCE_CLOCK_SLACK:
            return False  # may belong to an earlier run (a leftover, a replay): no evidence either way
        heard = heard_at(message.created)
        if (
            sender in self.newest
            and heard > self.newest_heard.get(sender, self.started_at)
            and ((epoch, message_round) < (self.newest_epoch.get(sender, 0), self.newest[sender]))
        ):
            # Made later than the sender's newest, yet of an earlier start or round: an honest sender never does
            # that, so the newest was signed by another member (the shared secret cannot tell). Follow this one.
            self.newest[sender], self.newest_epoch[sender], self.newest_heard[sender] = message_round, epoch, heard
            state.window.newest.pop(sender, None)
            if self.catch_up is not None and sender in self.catch_up.leaders:
                self.catch_up.disowned.add(sender)
            return False
        if (epoch, message_round) > state.window.newest.get(sender, (-1, -1)):
            state.window.newest[sender] = (epoch, message_round)
            state.window.newest_heard[sender] = heard
        known = self.newest_epoch.get(sender, 0)
        if epoch < known:
            return False  # an older start of the sender: no evidence
        # A newer start than the one recorded shows its lead only from its second poll on, like a new sender.
        previous = self.newest.get(sender) if epoch == known else None
        if (
            previous is None
            or message_round <= previous
            or message_round - round <= self.host.max_staleness
            or (state.regulars and sender not in state.regulars)
        ):
            return False
        state.window.leads[sender] = max(state.window.leads.get(sender, message_round), message_round)
        return True

    def align(self, round: int, result: RoundResult, state: RoundSpending, dropped: Counter):
        """After a poll: catch up with a swarm that is ahead. Returns the (possibly new) swarm round, which the swarm
        client's `round_offset` follows, and the messages set aside ([`defers`]) for the client to take at that round.

        A peer that joins late, was stalled or resumed from an older checkpoint is behind the others: its messages
        are stale to them and theirs are ahead of it, so without this it would never exchange again. When the median
        lead of the regulars (a regular that shows none counts as level with this peer; with no regulars, of the
        senders that show one) is more than `max_staleness` rounds, this peer's round jumps forward to it (the
        swarm's `round_offset`); rounds only move forward. A lead counts only from a signed, newer message than the
        sender's previous one, so leftovers of an earlier run, forged hints and strangers move nothing; a member
        can only move this peer forward, which isolates it at worst (documented in `docs/security.md`)."""
        swarm = self.host
        for sender, (epoch, newest) in state.window.newest.items():
            if sender in self.newest or len(self.newest) < MAX_KNOWN_PEERS:
                known = self.newest_epoch.get(sender, 0)
                if epoch > known or sender not in self.newest or (epoch == known and newest > self.newest[sender]):
                    self.newest[sender], self.newest_epoch[sender] = newest, max(epoch, known)
                    self.newest_heard[sender] = state.window.newest_heard[sender]
        state.window.newest, state.window.newest_heard = {}, {}
        round = self.undo_catch_up(round)
        self.hinted |= set(list(state.window.hinted)[: max(MAX_KNOWN_PEERS - len(self.hinted), 0)])
        state.window.hinted = set()
        deferred, state.window.deferred = state.window.deferred, []
        if state.window.leads:
            leads = (
                [state.window.leads.get(peer, round) for peer in state.regulars]
                if state.regulars
                else list(state.window.leads.values())
            )
            target = min(sorted(leads)[len(leads) // 2], MAX_SWARM_ROUND)
            if target - round > swarm.max_staleness:
                self.catch_up = CatchUp(
                    size=target - round,
                    leaders=frozenset(sender for sender, lead in state.window.leads.items() if lead >= target),
                    needed=len(leads) - len(leads) // 2,  # leads at the median or above
                    forgotten=swarm.forget(target),
                )
                logger.warning(
                    "Round %d: the swarm is at round %d (%s), more than max_staleness=%d rounds ahead: this peer "
                    "moves to round %d so that its rows are fresh to the others again (%d rounds forward).",
                    round,
                    target,
                    ", ".join(f"{peer!r}: {lead}" for peer, lead in sorted(state.window.leads.items())[:8]),
                    swarm.max_staleness,
                    target,
                    target - round,
                )
                round = target
                state.window.leads.clear()
        return round, deferred

    def undo_catch_up(self, round: int) -> int:
        """Move back by the last catch-up when too few of the peers whose leads made it still stand by them: each
        sent a message made later than its lead but of an earlier round ([`note_round`]), so that lead was signed by
        another member under its name. Returns the (possibly earlier) swarm round."""
        catch_up, swarm = self.catch_up, self.host
        if catch_up is None or len(catch_up.leaders - catch_up.disowned) >= catch_up.needed:
            return round
        self.catch_up = None
        swarm.remember(catch_up.forgotten)
        logger.warning(
            "Round %d: %s, whose leads moved this peer %d rounds forward, sent later messages of earlier rounds: "
            "those leads were not theirs (another member signed them; peer_keys_file prevents it). This peer moves "
            "back to round %d.",
            round,
            ", ".join(map(repr, sorted(catch_up.disowned))),
            catch_up.size,
            round - catch_up.size,
        )
        return round - catch_up.size

    after_poll = align

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The expected peers not waited for, and each sender's newest round and start (catch-up evidence)."""
        return {
            "absent": sorted(self.absent),
            "absent_count": self.absent_count,
            "newest": dict(self.newest),
            "newest_epochs": dict(self.newest_epoch),
        }

    def check_state(self, state: Any, same_run: bool) -> tuple[dict[str, Any], int]:
        """A saved [`state_dict`] checked, and the highest round offset it allows: the newest round a sender showed
        (this peer only ever moves forward to such a round). Of another run, the senders' rounds are not kept; a
        sender whose saved start is far ahead of this machine's clock is not followed."""
        if not isinstance(state, Mapping) or set(state) != set(SYNC_WINDOW_STATE):
            raise ValueError(f"Swarm state: the sync window's state is not {{{', '.join(SYNC_WINDOW_STATE)}}}.")
        absent = state_field(state, "absent", list, lambda v: all(isinstance(p, str) for p in v))
        absent_count = state_field(state, "absent_count", int, whole)
        newest = state_field(state, "newest", dict, counts)
        newest_epochs = state_field(state, "newest_epochs", dict, counts)
        if set(newest_epochs) - set(newest):
            raise ValueError("Swarm state: 'newest_epochs' names senders that 'newest' does not.")
        most_offset = max(newest.values(), default=0)
        if not same_run:
            newest, newest_epochs = {}, {}
        newest, newest_epochs = not_forged(newest, newest_epochs, epochs=newest_epochs)
        checked = {"absent": absent, "absent_count": absent_count, "newest": newest, "newest_epochs": newest_epochs}
        return checked, most_offset

    def load(self, checked: Mapping[str, Any]) -> None:
        """Restore what [`check_state`] returned."""
        swarm = self.host
        self.absent = set(checked["absent"]) & set(swarm.expected_peers)
        self.absent_count = min(checked["absent_count"], swarm.num_expected_peers or 0)  # never more than expected
        self.newest = dict(checked["newest"])
        self.newest_epoch = {sender: checked["newest_epochs"].get(sender, 0) for sender in checked["newest"]}
        self.newest_heard = dict.fromkeys(self.newest, time.time())  # a message made after the load can disown them
        self.catch_up = None
