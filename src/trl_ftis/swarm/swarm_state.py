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

from ..message_trust import binding_problem
from .clocks import epoch_lead
from .round_windows import MAX_KNOWN_PEERS, MAX_SWARM_ROUND

__all__ = ["CheckedState", "check_swarm_state", "counts", "not_forged", "state_field", "whole"]

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
    window: Any  # what the round window's own check returned (`RoundWindow.check_state`), or None: not restored
    epoch: int
    departed: dict[str, int]


def whole(value: Any) -> bool:
    """Whether `value` is a whole number in [0, 2**63) (never a bool or a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MOST_ROUND


def counts(value: Mapping) -> bool:
    """Whether `value` maps strings to whole numbers ([`whole`])."""
    return all(isinstance(k, str) and whole(v) for k, v in value.items())


def state_field(
    state: Any, name: str, kind: type, check: Callable[[Any], bool] = lambda value: True, cap: int = MAX_KNOWN_PEERS
) -> Any:
    """`state[name]` when it is a `kind` that passes `check` and holds at most `cap` entries (a list or dict), else
    `ValueError` naming the field (a swarm state's, or its window's: `window.<name>`)."""
    value = state.get(name) if isinstance(state, Mapping) else None
    if isinstance(value, (list, dict)) and len(value) > cap:  # before reading them all
        raise ValueError(f"Swarm state: {name!r} holds {len(value)} entries, more than the {cap} it keeps.")
    if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
        raise ValueError(f"Swarm state: {name!r} is missing or malformed ({type(value).__name__}).")
    return value


def not_forged(*tables: dict[str, int], epochs: Mapping[str, int]) -> list[dict[str, int]]:
    """`tables` without the senders whose saved start (`epochs`) is far ahead of this machine's clock: a member forged
    it, or the clock went back; followed, it would outrank every message of that sender."""
    forged = {sender for sender, epoch in epochs.items() if epoch_lead(epoch)}
    return [{sender: value for sender, value in table.items() if sender not in forged} for table in tables]


def check_swarm_state(
    state: Mapping[str, Any],
    *,
    most_seen: Callable[[int], int],
    window_name: str,
    check_window: Callable[[Any, bool], tuple[Any, int]],
    run_id: str | None,
    peer_id: str,
) -> CheckedState:
    """`state` (what `Swarm.state_dict` returned) checked, or `ValueError` naming the field. `most_seen(known)` is
    the most digests the swarm's window keeps with `known` peers; the window's part (`window`: its `name` and its
    state) is checked by `check_window(window_state, same_run)`, the window's own check (`RoundWindow.check_state`),
    which returns what it restores and the highest `round_offset` it allows. A window of another kind (`window_name`
    differs: the run changed its exchange mode) is not restored, nor is the round offset. The other peers' rounds of
    a state of another run than `run_id` are not carried over."""
    known = state_field(state, "known_peers", list, lambda v: all(isinstance(p, str) for p in v))
    models = state_field(state, "peer_models", dict, lambda v: all(isinstance(m, str) for m in v.values()), cap=1000)
    unpublished = state_field(state, "unpublished", dict, counts, cap=1000)  # keyed by reason: a handful
    # A round window's digests: its rounds' messages (sync), or the newest a window per known sender (free).
    seen = state_field(state, "seen", dict, counts, cap=most_seen(len(known)))
    offset = state_field(state, "round_offset", int, whole)
    delivered = state_field(state, "delivered", dict, counts)
    saved_epoch = state_field(state, "epoch", int, whole)
    departed = state_field(state, "departed", dict, counts)
    try:
        digests = {bytes.fromhex(digest): round for digest, round in seen.items()}
    except ValueError:
        raise ValueError("Swarm state: 'seen' holds a digest that is not hexadecimal.") from None
    if any(len(digest) != 16 for digest in digests):  # blake2b-128, as `Swarm` computes them
        raise ValueError("Swarm state: 'seen' holds a digest that is not 16 bytes.")
    saved_run = state.get("run")
    if saved_run is not None and binding_problem(saved_run) is not None:
        raise ValueError(f"Swarm state: 'run' is malformed: it {binding_problem(saved_run)}.")
    saved_window = state.get("window")
    if not (isinstance(saved_window, Mapping) and set(saved_window) == {"name", "state"}):
        raise ValueError("Swarm state: 'window' is not {'name': <the window's kind>, 'state': <its state>}.")
    if saved_window["name"] == window_name:
        window, most_offset = check_window(saved_window["state"], saved_run == run_id)
    else:
        logger.warning(
            "Resuming peer %r with the %r round window from a state of the %r one: the window's state and the round "
            "offset are not carried over.",
            peer_id,
            window_name,
            str(saved_window["name"])[:100],
        )
        window, most_offset, offset = None, 0, 0
    if offset > min(most_offset, MAX_SWARM_ROUND):  # the swarm only moves forward to a round a sender showed
        raise ValueError(f"Swarm state: 'round_offset' {offset} is beyond the newest round a sender showed.")
    if saved_run != run_id:
        # What senders showed in another run says nothing of this one: a sender's newest round of a longer earlier
        # run would hide its live lead (`SyncWindow.note_round`). This peer's own alignment is kept: the swarm
        # resumes with it (the window dropped the other peers' rounds).
        logger.info(
            "Resuming peer %r in run %r from the state of run %r: the other peers' rounds are not carried over.",
            peer_id,
            run_id,
            saved_run,
        )
        delivered, departed = {}, {}
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
        window=window,
        epoch=saved_epoch,
        departed=departed,
    )
