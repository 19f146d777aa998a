"""What one swarm round may cost and what it produced: [`RoundBudget`] (the bounds), [`RoundSpending`] (one collect's
spending against them), [`RoundResult`] and [`PeerRoundStats`] (its outcome), and [`sender_rank`] (the order in which a
receiver reads senders it cannot all read). Used by [`trl_ftis.swarm.Swarm`], which re-exports the public types."""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .peer_rows import PeerRow

ROW_MISSES = 4  # regulars (or newcomers) whose decoded message did not fit in the rows left: then none is read


@dataclass(frozen=True)
class RoundBudget:
    """What one [`Swarm.collect`] may cost, whatever the other writers of the exchange do.

    An envelope is examined (hashed, verified, decoded) only while the budget lasts; beyond it, envelopes are
    dropped unread and counted as `round_budget`. The rows are part of it: once the round's row allowance is spent
    (`max_rows` rows accepted, or the messages of `ROW_MISSES` = 4 regulars decoded without fitting in what is
    left; for newcomers, also their share of the rows, or 4 newcomers' misses), the rest is dropped unread, so what a
    receiver reads is set by the rows it can use, not by the number of senders in the swarm. The transport's
    `sender_hint` decides whose allowance an envelope draws from and in which order envelopes are examined: it is
    never trusted, and a message whose signed sender differs from its hint is refused (`sender_hint`).

    The order ([`Swarm._ordered`]): regulars first, then everyone else; within each, one envelope per sender hint
    at a time (each sender's round hint nearest this peer's round first, the newest on a tie; the newest when
    free-running), the senders in an order drawn afresh every round from this peer's id, the round and the hint;
    envelopes whose round hint is outside the round window, or missing, come last. (Except when half the regulars
    or more file envelopes ahead of the window: each one's newest such envelope then comes first, since a peer that
    lags behind the swarm must see it to catch up, whatever fills its rows.) A receiver that cannot read every
    sender thus reads another subset each round, and over rounds every sender, while its regulars, when their rows
    fit, are read every round. A hint buys its writer nothing but a place in this order: one filed under another
    sender's name takes one of that sender's turns and its allowance, as before, and is then refused.

    *Regulars* are the peers this swarm knows: `expected_peers` when given, else the peers of the public-key file,
    else the peers accepted in earlier rounds. Every regular has its own allowance; everyone else (newcomers, and
    ids made up by a hostile member) shares one, so a thousand invented ids cost what one newcomer slot does.
    """

    max_bytes: int = 2**30
    """Message bytes examined per round, all senders together (1 GiB). Newcomers together get at most
    `max_bytes // (regulars + 1)` of it."""
    max_messages: int = 512
    """Messages examined per round, all senders together."""
    max_rows: int = 16_384
    """Rows accepted per round, all senders together (`Swarm.collect(max_rows=...)` overrides it for one round).
    Newcomers together get at most `max_rows // (regulars + 1)`."""
    max_seconds: float = 10.0
    """Seconds a round may spend reading and decoding after its wait (`peer_timeout`, for a round that waits) is
    over: a round lasts at most `peer_timeout + max_seconds` (`max_seconds` when it does not wait), however much a
    flood puts into the exchange."""
    messages_per_sender: int | None = None
    """Messages one regular (by hint), or one claimed sender, may have examined and accepted per round. Default:
    the round window, `max_staleness + max_rounds_ahead + 1` (an honest peer has one message per round, and only
    rounds in the window are taken)."""
    newcomer_messages: int = 64
    """Messages all newcomers together may have examined per round (a swarm of up to 64 peers that lists no
    `expected_peers` and no keys meets every peer in its first round)."""

    def __post_init__(self):
        for name in ("max_bytes", "max_messages", "max_rows", "newcomer_messages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RoundBudget.{name} must be an integer >= 0, got {value!r}")
        if self.messages_per_sender is not None and (
            isinstance(self.messages_per_sender, bool)
            or not isinstance(self.messages_per_sender, int)
            or self.messages_per_sender < 1
        ):
            raise ValueError(
                f"RoundBudget.messages_per_sender must be an integer >= 1, got {self.messages_per_sender!r}"
            )
        if not (isinstance(self.max_seconds, (int, float)) and 0 <= self.max_seconds < math.inf):
            raise ValueError(f"RoundBudget.max_seconds must be a finite number >= 0, got {self.max_seconds!r}")


@dataclass
class PeerRoundStats:
    """What one peer delivered in one round (its accepted rows are in [`RoundResult.rows`])."""

    rows_received: int = 0
    """Rows in the peer's messages that passed the checks (signature, tokenizer, temperature, duplicate)."""
    rows_stale: int = 0
    """Of those, rows in messages then dropped as outside the round window (`stale` or `ahead`)."""
    bytes_received: int = 0
    staleness: list[int] = field(default_factory=list)
    """Rounds between this peer's own round and the message's, per message accepted (negative: the peer is ahead)."""


@dataclass
class RoundResult:
    """Everything one [`Swarm.collect`] produced."""

    rows: list[PeerRow] = field(default_factory=list)
    peers: dict[str, PeerRoundStats] = field(default_factory=lambda: defaultdict(PeerRoundStats))
    refused: Counter = field(default_factory=Counter)
    """Refused messages (or files) by reason: `signature`, `unsigned`, `unknown_peer`, `identity`, `sender_hint`,
    `tokenizer`, `temperature`, `stale`, `ahead`, `duplicate`, `round_budget`, `unrecognised`, `too_large`,
    `truncated`, `ids`, `logps` ..."""
    missing: list[str] = field(default_factory=list)
    """Expected peers that sent nothing new before the timeout."""
    waited: float = 0.0
    regulars: frozenset[str] = frozenset()
    """The senders served first this round, each with its own allowance ([`RoundBudget`]); pass them to
    [`trl_ftis.peer_rows.select_rows`] so that every other sender shares one turn of the round-robin there too."""
    bytes_read: int = 0
    """Message bytes examined (hashed, verified, decoded) this round: at most `RoundBudget.max_bytes`."""
    messages_read: int = 0
    """Messages examined this round: at most `RoundBudget.max_messages`."""
    round: int = 0
    """The swarm round collected (this peer's step plus its `round_offset`, after any catch-up)."""
    created: dict[tuple[str, int], float] = field(default_factory=dict)
    """`(sender, round)` -> when the sender says it published the accepted message (its clock: for the age in seconds
    of its rows, never for a decision)."""


class RoundSpending:
    """One collect's spending against the [`RoundBudget`]."""

    def __init__(self, budget: RoundBudget, regulars: frozenset[str], per_sender: int, max_rows: int, until: float):
        self.budget, self.regulars, self.per_sender, self.max_rows = budget, regulars, per_sender, max_rows
        self.until = until  # monotonic time after which nothing more is examined
        shares = len(regulars) + 1
        self.newcomer_bytes_cap = budget.max_bytes // shares
        self.newcomer_rows_cap = max_rows // shares
        self.bytes = self.messages = self.rows = 0
        self.newcomer_bytes = self.newcomer_messages = self.newcomer_rows = 0
        self.by_hint: Counter = Counter()  # regulars' envelopes examined, by sender hint
        self.accepted: Counter = Counter()  # messages accepted, by signed sender
        self.newest: dict[str, int] = {}  # newest verified round per sender in this poll
        self.leads: dict[str, int] = {}  # senders that showed they are live and far ahead, with their round
        self.deferred: list = []  # their messages beyond the window, until `Swarm._align` decides
        self.hinted: set[str] = set()  # senders of envelopes refused unread as far ahead in this poll
        self.misses: set[str] = set()  # regulars whose decoded message did not fit in the rows left
        self.newcomer_misses: set[str] = set()  # the same for newcomers (the rows left, or their share of them)

    def rows_spent(self) -> bool:
        """Whether the round can take no more rows: `max_rows` are taken, or the messages of `ROW_MISSES`
        regulars were decoded and did not fit in what is left (an honest swarm's messages are of similar sizes)."""
        return self.rows >= self.max_rows or len(self.misses) >= ROW_MISSES

    def newcomer_rows_spent(self) -> bool:
        """Whether newcomers can get no more rows: their share is taken, or the messages of `ROW_MISSES` newcomers
        did not fit (which ends the newcomers' reading only)."""
        return self.newcomer_rows >= self.newcomer_rows_cap or len(self.newcomer_misses) >= ROW_MISSES

    def examine(self, hint: str | None, size: int) -> str | None:
        """Charge one envelope about to be examined; returns which budget is spent instead (then it is not)."""
        budget = self.budget
        if time.monotonic() > self.until:
            return "time"
        if self.rows_spent():
            return "rows_spent"  # nothing more could be taken: reading on would only cost
        if self.messages >= budget.max_messages:
            return "messages"
        if self.bytes + size > budget.max_bytes:
            return "bytes"
        regular = hint in self.regulars
        if regular and self.by_hint[hint] >= self.per_sender:
            return "sender"
        if not regular and (
            self.newcomer_messages >= budget.newcomer_messages
            or self.newcomer_bytes + size > self.newcomer_bytes_cap
            or self.newcomer_rows_spent()
        ):
            return "newcomers"
        self.messages += 1
        self.bytes += size
        if regular:
            self.by_hint[hint] += 1
        else:
            self.newcomer_messages += 1
            self.newcomer_bytes += size
        return None

    def take(self, sender: str, rows: int) -> str | None:
        """Charge one decoded message's rows to its signed sender; returns which budget is spent instead."""
        if self.accepted[sender] >= self.per_sender:
            return "sender"
        newcomer = sender not in self.regulars
        if self.rows + rows > self.max_rows:
            # Sets of signed senders: one sender's misses end nobody's reading, and newcomers' (invented ids among
            # them) end only the newcomers'.
            (self.newcomer_misses if newcomer else self.misses).add(sender)
            return "rows"
        if newcomer and self.newcomer_rows + rows > self.newcomer_rows_cap:
            self.newcomer_misses.add(sender)
            return "newcomers"
        self.accepted[sender] += 1
        self.rows += rows
        if newcomer:
            self.newcomer_rows += rows
        return None


def sender_rank(receiver: str, round: int, hint: str | None) -> bytes:
    """A sender hint's place in `receiver`'s order of `round`: a hash, so the order is drawn afresh every round and
    differs between receivers, reproducibly. Choosing a hint that ranks early buys a newcomer nothing but a place
    among the newcomers, whose allowance it shares, and a hint naming another sender gets its message refused."""
    text = f"{receiver!r}|{round}|{hint!r}".encode("utf-8", "backslashreplace")
    return hashlib.blake2b(text, digest_size=8, person=b"ftis-order").digest()


BUDGET_TEXT = {
    "time": "the round's time (peer_timeout + RoundBudget.max_seconds) is spent",
    "messages": "RoundBudget.max_messages messages were examined this round",
    "bytes": "RoundBudget.max_bytes bytes were examined this round",
    "sender": "this sender's messages this round reached RoundBudget.messages_per_sender",
    "newcomers": "the newcomers' shared allowance (senders not expected, registered or known) is spent",
    "rows": "RoundBudget.max_rows rows were accepted this round",
    "rows_spent": (
        "the round's rows (RoundBudget.max_rows, or collect(max_rows=...)) are spent, or the messages of 4 regulars "
        "did not fit in what is left: later messages are dropped unread"
    ),
}
