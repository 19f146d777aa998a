"""The check of a saved swarm state ([`check_swarm_state`]) before a [`trl_ftis.swarm.client.Swarm`] restores it.

Checkpoints are shared, so nothing in a state is trusted: every map holds at most as many entries as a swarm ever
keeps, every count and round is a whole number in [0, 2**63), `seen` holds at most the digests a round window can
hold, `round_offset` is at most the newest round a sender showed (a swarm only moves forward to such a round), and a
sender whose saved start (epoch) is far ahead of this machine's clock is not followed (a member forged it, or the
clock went back: followed, it would outrank every message of that sender).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..rules import binding_problem
from .clocks import epoch_lead
from .round_windows import MAX_KNOWN_PEERS, MAX_SWARM_ROUND

__all__ = ["CheckedState", "check_swarm_state"]

logger = logging.getLogger(__name__)

MOST_ROUND = 2**63 - 1  # the wire format's MAX_ROUND: rounds fit int64


@dataclass(frozen=True)
class CheckedState:
    """A saved swarm state that passed [`check_swarm_state`], as the swarm restores it."""

    known_peers: list[str]
    peer_models: dict[str, str]
    seen: dict[bytes, int]
    unpublished: dict[str, int]
    round_offset: int
    delivered: dict[str, int]
    window: dict[str, Any]  # the keys a round window owns (`round_windows.WINDOW_STATE`)
    epoch: int
    departed: dict[str, int]


def check_swarm_state(
    state: Mapping[str, Any], *, most_seen: Callable[[int], int], run_id: str | None, peer_id: str
) -> CheckedState:
    """`state` (what `Swarm.state_dict` returned) checked, or `ValueError` naming the field. `most_seen(known)` is
    the most digests the swarm's window keeps with `known` peers; the other peers' rounds of a state of another run
    than `run_id` are not carried over."""

    def field(name: str, kind: type, check=lambda value: True, cap: int = MAX_KNOWN_PEERS):
        value = state.get(name) if isinstance(state, Mapping) else None
        if isinstance(value, (list, dict)) and len(value) > cap:  # before reading them all
            raise ValueError(f"Swarm state: {name!r} holds {len(value)} entries, more than the {cap} it keeps.")
        if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
            raise ValueError(f"Swarm state: {name!r} is missing or malformed ({type(value).__name__}).")
        return value

    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MOST_ROUND

    def counts(value) -> bool:
        return all(isinstance(k, str) and whole(v) for k, v in value.items())

    known = field("known_peers", list, lambda v: all(isinstance(p, str) for p in v))
    models = field("peer_models", dict, lambda v: all(isinstance(m, str) for m in v.values()), cap=1000)
    absent = field("absent", list, lambda v: all(isinstance(p, str) for p in v))
    absent_count = field("absent_count", int, whole)
    unpublished = field("unpublished", dict, counts, cap=1000)  # keyed by reason: a handful
    newest = field("newest", dict, counts)
    # A round window's digests: its rounds' messages (lock-step), or the newest a window per known sender.
    seen = field("seen", dict, counts, cap=most_seen(len(known)))
    offset = field("round_offset", int, lambda v: 0 <= v <= min(max(newest.values(), default=0), MAX_SWARM_ROUND))
    delivered = field("delivered", dict, counts)
    sender_rounds = field("sender_rounds", dict, counts)
    sender_epochs = field("sender_epochs", dict, counts)
    if set(sender_epochs) - set(sender_rounds):
        raise ValueError("Swarm state: 'sender_epochs' names senders that 'sender_rounds' does not.")
    saved_epoch = field("epoch", int, whole)
    newest_epochs = field("newest_epochs", dict, counts)
    if set(newest_epochs) - set(newest):
        raise ValueError("Swarm state: 'newest_epochs' names senders that 'newest' does not.")
    departed = field("departed", dict, counts)
    try:
        digests = {bytes.fromhex(digest): round for digest, round in seen.items()}
    except ValueError:
        raise ValueError("Swarm state: 'seen' holds a digest that is not hexadecimal.") from None
    if any(len(digest) != 16 for digest in digests):  # blake2b-128, as `Swarm` computes them
        raise ValueError("Swarm state: 'seen' holds a digest that is not 16 bytes.")
    saved_run = state.get("run")
    if saved_run is not None and binding_problem(saved_run) is not None:
        raise ValueError(f"Swarm state: 'run' is malformed: it {binding_problem(saved_run)}.")
    if saved_run != run_id:
        # What senders showed in another run says nothing of this one: a sender's newest round of a longer earlier
        # run would hide its live lead (`SyncWindow.note_round`). This peer's own alignment is kept: the swarm
        # resumes with it.
        logger.info(
            "Resuming peer %r in run %r from the state of run %r: the other peers' rounds are not carried over.",
            peer_id,
            run_id,
            saved_run,
        )
        newest, delivered, sender_rounds, sender_epochs, departed = {}, {}, {}, {}, {}
        newest_epochs = {}
    forged = {sender for sender, epoch in {**sender_epochs, **newest_epochs}.items() if epoch_lead(epoch)}
    newest, newest_epochs, sender_rounds, sender_epochs = (
        {sender: value for sender, value in table.items() if sender not in forged}
        for table in (newest, newest_epochs, sender_rounds, sender_epochs)
    )
    saved_id = state.get("peer_id")
    if saved_id != peer_id:
        logger.warning(
            "Resuming peer %r from the swarm state of peer %r: its counters and digests are used as they are.",
            peer_id,
            saved_id,
        )
    return CheckedState(
        known_peers=known,
        peer_models=models,
        seen=digests,
        unpublished=unpublished,
        round_offset=offset,
        delivered=delivered,
        window={
            "absent": absent,
            "absent_count": absent_count,
            "newest": newest,
            "newest_epochs": newest_epochs,
            "sender_rounds": sender_rounds,
            "sender_epochs": sender_epochs,
        },
        epoch=saved_epoch,
        departed=departed,
    )
