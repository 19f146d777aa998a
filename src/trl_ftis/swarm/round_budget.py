"""What one swarm round may cost and what it produced: [`RoundBudget`] (the bounds), [`RoundSpending`] (one collect's
spending against them), [`RoundResult`] and [`PeerRoundStats`] (its outcome), and [`sender_rank`] (the order in which a
receiver reads senders it cannot all read). Used by [`trl_ftis.swarm.client.Swarm`], which re-exports the public
types."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..exchange import Message
from ..peer_rows import PeerRow

ROW_MISSES = (
    4  # senders whose decoded message did not fit: then no newcomer (or, first come first served, no one) is read
)


@dataclass(frozen=True)
class RoundBudget:
    """What one [`Swarm.collect`] may cost, whatever the other writers of the exchange do.

    An envelope is examined (hashed, verified, decoded) only while the budget lasts; beyond it, envelopes are
    dropped unread and counted as `round_budget`. The rows are part of it, in shares ([`RoundSpending`]): each
    regular, and the newcomers together, have `max_rows // (regulars + 1)` rows reserved; a regular whose share
    (and the unreserved rows) is spent has its further envelopes dropped unread, newcomers likewise (or after 4
    newcomers' misses), and once `max_rows` are taken everything else is, so what a receiver reads is set by the rows
    it can use, not by the number of senders in the swarm. The transport's
    `sender_hint` decides whose allowance an envelope draws from and in which order envelopes are examined: it is
    never trusted, and a message whose signed sender differs from its hint is refused (`sender_hint`).

    The order ([`trl_ftis.swarm.reading_order.reading_order`]): regulars first, then everyone else; within each, one
    envelope per sender hint at a time (each sender's round hint nearest this peer's round first, the newest on a
    tie; the newest in the free mode), the senders in an order drawn afresh every round from a key only this peer
    knows, the round and the hint;
    envelopes whose round hint is outside the round window, or missing, come last. (Except when half the regulars
    or more file envelopes ahead of the window: each one's newest such envelope then comes first, since a peer that
    lags behind the swarm must see it to catch up, whatever fills its rows.) A receiver that cannot read every
    sender thus reads another subset each round, and over rounds every sender, while its regulars, when their rows
    fit, are read every round. A hint buys its writer nothing but a place in this order: one filed under another
    sender's name takes one of that sender's turns and its allowance, as before, and is then refused.

    *Regulars* are the peers this swarm knows: `expected_peers` when given, else the peers of the public-key file,
    else the peers accepted in earlier rounds. Every regular has its own allowance and row share; everyone else
    (newcomers, and ids made up by a hostile member) shares one, so a thousand invented ids cost what one newcomer
    slot does.
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
    rows_cut: int = 0
    """Of those, rows left out because the message went beyond its sender's share of the round's rows (cut to whole
    groups within it)."""
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
    `tokenizer`, `temperature`, `epoch`, `stale`, `ahead`, `duplicate`, `round_budget`, `unrecognised`, `too_large`,
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
    """One collect's spending against the [`RoundBudget`].

    Rows: every regular, and all newcomers together, have a share of the round's rows reserved for them (`row_share` =
    `max_rows // (regulars + 1)`, at least `share`, which raises `max_rows` to hold every share). A regular's message
    is taken whole when it fits in what is left of its share plus the rows nobody has a claim on (unreserved); beyond
    that it is cut to whole groups, so what one sender sends never takes another's reserved rows, whatever the order of
    reading. Newcomers never get more than their share. When the budget is too small to reserve a row for each (more
    regulars than `max_rows`), rows go first come, first served, and reading ends after `ROW_MISSES` regulars' messages
    did not fit."""

    def __init__(
        self,
        budget: RoundBudget,
        regulars: frozenset[str],
        per_sender: int,
        max_rows: int,
        until: float,
        share: int | None = None,
    ):
        self.budget, self.regulars, self.per_sender = budget, regulars, per_sender
        self.until = until  # monotonic time after which nothing more is examined
        shares = len(regulars) + 1
        self.newcomer_bytes_cap = budget.max_bytes // shares
        self.row_share = max(max_rows // shares, 0 if share is None else int(share))
        self.max_rows = max(max_rows, self.row_share * shares)
        self.bytes = self.messages = self.rows = 0
        self.newcomer_bytes = self.newcomer_messages = self.newcomer_rows = 0
        self.by_hint: Counter = Counter()  # regulars' envelopes examined, by sender hint
        self.accepted: Counter = Counter()  # messages accepted, by signed sender
        self.regular_rows: Counter = Counter()  # rows taken, by regular (signed sender)
        self.reserved = self.row_share * shares  # rows of shares not yet taken (regulars' and the newcomers')
        self.misses: set[str] = set()  # regulars whose decoded message did not fit (first come, first served only)
        self.newcomer_misses: set[str] = set()  # newcomers whose decoded message did not fit in their share's rest
        self.window: Any = None  # the round window's own record of this collect (`RoundWindow.begin`)

    def rows_spent(self) -> bool:
        """Whether the round can take no more rows: `max_rows` are taken, or (first come, first served only) the
        messages of `ROW_MISSES` regulars were decoded and did not fit in what is left."""
        return self.rows >= self.max_rows or (self.row_share == 0 and len(self.misses) >= ROW_MISSES)

    def newcomer_rows_spent(self) -> bool:
        """Whether newcomers can get no more rows: their share is taken, or the messages of `ROW_MISSES` newcomers
        did not fit in what is left of it (which ends the newcomers' reading only)."""
        return self.newcomer_rows >= self.row_share or len(self.newcomer_misses) >= ROW_MISSES

    def _unreserved(self) -> int:
        return max(self.max_rows - self.rows - self.reserved, 0)

    def _share_left(self, sender: str) -> int:
        used = self.regular_rows[sender] if sender in self.regulars else self.newcomer_rows
        return max(self.row_share - used, 0)

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
        if regular and self.row_share and self._share_left(hint) + self._unreserved() == 0:
            return "share"  # that regular's rows are taken: its other envelopes could only be cut to nothing
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

    def room(self, sender: str) -> tuple[str | None, int]:
        """`(None, rows)`: how many rows of a decoded message its signed sender may still have taken this round: what
        is left of its share, plus (a regular) the unreserved rows; a longer message is cut to whole groups within it
        and [`take`] charges what is kept. `(budget, 0)` when the sender may have no further message taken."""
        if self.accepted[sender] >= self.per_sender:
            return "sender", 0
        left = max(self.max_rows - self.rows, 0)
        if sender in self.regulars:
            return None, min(self._share_left(sender) + self._unreserved(), left)
        return None, min(self._share_left(sender), left)

    def take(self, sender: str, rows: int, cut: bool) -> str | None:
        """Charge a decoded message's `rows` (after any cut) to its signed sender, its share first; returns which
        budget is spent instead when none of them fit (then nothing is charged)."""
        newcomer = sender not in self.regulars
        if cut and rows == 0:
            # Sets of signed senders: one sender's misses end nobody's reading, and newcomers' (invented ids among
            # them) end only the newcomers'.
            (self.newcomer_misses if newcomer else self.misses).add(sender)
            return "newcomers" if newcomer else ("share" if self.row_share else "rows")
        self.reserved -= min(self._share_left(sender), rows)
        self.accepted[sender] += 1
        self.rows += rows
        if newcomer:
            self.newcomer_rows += rows
        else:
            self.regular_rows[sender] += rows
        return None


def whole_groups(message: Message, most: int) -> Message:
    """`message` with only its first groups (in the order of their first completion) whose completions number at
    most `most` together: a group is kept whole or not at all, since receivers normalise advantages within it."""
    sizes = Counter(completion.group for completion in message.completions)
    keep, total = set(), 0
    for group in dict.fromkeys(completion.group for completion in message.completions):
        if total + sizes[group] > most:
            break
        keep.add(group)
        total += sizes[group]
    return dataclasses.replace(message, completions=[c for c in message.completions if c.group in keep])


def sender_rank(order_key: bytes, round: int, hint: str | None) -> bytes:
    """A sender hint's place in a receiver's order of `round`: a hash keyed with the receiver's `order_key` (random,
    drawn when its swarm client starts, never sent or saved), so the order is drawn afresh every round, differs
    between receivers, and no writer can predict it: an id or hint ground to rank early ranks where any other does.
    Its place buys a newcomer nothing but a place among the newcomers, whose allowance it shares, and a hint naming
    another sender gets its message refused."""
    text = f"{round}|{hint!r}".encode("utf-8", "backslashreplace")
    return hashlib.blake2b(text, digest_size=8, key=order_key, person=b"ftis-order").digest()


BUDGET_TEXT = {
    "time": "the round's time (peer_timeout + RoundBudget.max_seconds) is spent",
    "messages": "RoundBudget.max_messages messages were examined this round",
    "bytes": "RoundBudget.max_bytes bytes were examined this round",
    "sender": "this sender's messages this round reached RoundBudget.messages_per_sender",
    "newcomers": "the newcomers' shared allowance (senders not expected, registered or known) is spent",
    "rows": "the round's rows (RoundBudget.max_rows) did not hold this message",
    "senders": "this peer already follows as many senders as it keeps (10,000), and this one is not a regular",
    "rows_spent": (
        "the round's rows (RoundBudget.max_rows, or collect(max_rows=...)) are spent: later messages are dropped "
        "unread"
    ),
    "share": (
        "this regular's share of the round's rows (max_rows // (regulars + 1)) and the unreserved rows are taken: "
        "its messages are cut to what is left, or dropped when no whole group fits"
    ),
}
