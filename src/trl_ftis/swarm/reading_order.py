"""The order in which a receiver examines one poll's envelopes ([`reading_order`]): what a round reads first when it
cannot read everything, decided from the transport's untrusted hints only
([`trl_ftis.swarm.round_budget.RoundBudget`])."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from ..exchange.transports import Envelope
from .round_budget import sender_rank

__all__ = ["reading_order"]

_NO_ROUND = 2**64  # sorts an envelope without a round hint after every hinted one


def reading_order(
    envelopes: Sequence[Envelope],
    round: int,
    regulars: frozenset[str],
    order_key: bytes,
    window: tuple[int, int],
    is_old: Callable[[str | None, int], bool] | None = None,
) -> list[Envelope]:
    """The order in which a receiver (whose secret `order_key` draws the senders' order: [`sender_rank`]) examines a
    poll's envelopes ([`RoundBudget`]): regulars' first, then everyone
    else's; within each, one envelope per sender hint at a time (its round hint nearest `round` first, the newest
    on a tie; the newest in the free mode), the senders in an order drawn for this round ([`sender_rank`]);
    envelopes whose round hint is outside the window, or missing, last (by distance, then arrival).

    `window` is `(max_staleness, max_rounds_ahead)` around `round`. Except when enough regulars to move this peer
    (`SyncWindow.align`: half of them, the median) file envelopes beyond
    the window: then each one's newest such envelope comes first, so that a peer lagging behind the swarm sees it
    even when peers level with it fill its rows (read last, those envelopes would be dropped unread). Fewer
    regulars filing so, liars among them, get no early place.

    When the round's rows run out before the poll does, the senders read are another subset every round, so every
    sender is read over rounds. Hints only order the work: a lying hint costs its writer, never another sender,
    anything but a place. In the free mode (`is_old` given:
    [`trl_ftis.swarm.exchange_modes.free_order.SenderOrder.is_old`]), there is no window around `round`, and envelopes
    whose round hint is not above their sender's newest accepted round count as outside it: read last, they are refused
    unless their sender restarted (a newer epoch)."""
    free = is_old is not None  # no shared round: the receiver's round says nothing
    max_staleness, max_rounds_ahead = window

    def late(envelope) -> bool:
        hint = envelope.round_hint
        if not isinstance(hint, int):
            return True
        if free:  # not newer than the sender's newest accepted round: a replay, a leftover, or a restart's
            return is_old(envelope.sender_hint, hint)
        return round - hint > max_staleness or hint - round > max_rounds_ahead

    probes: dict = {}  # regular's sender hint -> (round hint, index) of its newest envelope beyond the window
    for index, envelope in enumerate(envelopes):
        hint, sender = envelope.round_hint, envelope.sender_hint
        ahead = not free and isinstance(hint, int) and hint - round > max_rounds_ahead and sender in regulars
        if ahead and (sender not in probes or hint > probes[sender][0]):
            probes[sender] = (hint, index)
    # As many leaders as move the median of `SyncWindow.align` (a regular showing no lead counts as level with this
    # peer).
    leaders = len(regulars) - len(regulars) // 2
    probe_index = {index for _, index in probes.values()} if len(probes) >= leaders else set()
    timely = [(index, envelope) for index, envelope in enumerate(envelopes) if not late(envelope)]
    if free:
        timely.sort(key=lambda item: (-item[1].round_hint, item[0]))
    else:
        timely.sort(key=lambda item: (abs(item[1].round_hint - round), -item[1].round_hint, item[0]))
    turn: dict[int, int] = {}  # envelope index -> its place among its sender hint's envelopes
    turns: Counter = Counter()
    ranks: dict = {}
    for index, envelope in timely:
        hint = envelope.sender_hint
        turn[index] = turns[hint]
        turns[hint] += 1
        if hint not in ranks:
            ranks[hint] = sender_rank(order_key, round, hint)

    def key(item):
        index, envelope = item
        tier = envelope.sender_hint not in regulars
        if index in probe_index:
            return (tier, -1, 0, sender_rank(order_key, round, envelope.sender_hint), index)
        if index in turn:
            return (tier, 0, turn[index], ranks[envelope.sender_hint], index)
        hint = envelope.round_hint
        distance = abs(hint - round) if isinstance(hint, int) else _NO_ROUND
        return (tier, 1, distance, b"", index)

    return [envelope for _, envelope in sorted(enumerate(envelopes), key=key)]
