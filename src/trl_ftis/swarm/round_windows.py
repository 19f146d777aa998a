"""The round window a [`trl_ftis.swarm.client.Swarm`] reads messages through: which messages are fresh, whom a collect
waits for, and how a peer that fell behind catches up. Each exchange mode declares its own
(`trl_ftis.swarm.exchange_modes`: the sync window of the sync and async modes, the free window of the free mode);
the swarm builds it with itself as the window's [`WindowHost`], and drives it through [`RoundWindow`].

A window owns its state: the swarm's checkpoint state holds it under the window's `name`, and the window checks a
saved one itself ([`RoundWindow.check_state`]) before it restores it ([`RoundWindow.load`]).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..exchange import Envelope, Message
    from .round_budget import RoundBudget, RoundResult, RoundSpending

__all__ = ["MAX_KNOWN_PEERS", "MAX_SWARM_ROUND", "RoundWindow", "WindowHost"]

MAX_KNOWN_PEERS = 10_000  # senders remembered (memory bound under a flood of invented ids): the swarm's bound too
MAX_SWARM_ROUND = 10**9  # round alignment moves a peer no further (transports file rounds below 10**10)


class WindowHost(Protocol):
    """What a round window may ask of the swarm client that reads through it (and nothing else): the settings that
    bound the window, who is expected and who left, the digests of accepted messages, and one-time warnings."""

    peer_id: str
    run_id: str | None
    expected_peers: list[str]
    num_expected_peers: int | None
    peer_timeout: float
    max_staleness: int
    max_rounds_ahead: int
    budget: RoundBudget
    departed: dict[str, int]
    known_peers: set[str]

    def listed_peers(self) -> frozenset[str]:
        """The peers this one was told of (`expected_peers`, else the peers of the public keys)."""

    def forget(self, round: int) -> dict[bytes, int]:
        """Drop the digests of messages that fell out of the window around `round`; returns them."""

    def remember(self, digests: Mapping[bytes, int]) -> None:
        """Take back digests [`forget`] dropped."""

    def warn_once(self, who: str, reason: str, text: str) -> None:
        """Log `text` once per (`who`, `reason`)."""


class RoundWindow(Protocol):
    """A round window, as the swarm client drives it during a collect and in its checkpoint state."""

    name: str
    """The window's kind, under which a checkpoint keeps its state (a state of another kind is not restored)."""
    waits: bool
    """Whether a collect waits for expected peers."""
    is_old: Callable | None
    """Orders a sender's replays and leftovers last (`reading_order`), or `None` for a shared round."""

    def satisfied(self, fresh: set[str]) -> bool:
        """Whether the senders that delivered something new (`fresh`) are all a collect waits for."""

    def begin(self) -> Any:
        """The window's own record of one collect (`RoundSpending.window`), fresh at its start."""

    def refuses_unread(self, envelope: Envelope, round: int, state: RoundSpending, result: RoundResult) -> bool:
        """Whether an envelope is refused before it is read (counted in `result`)."""

    def defer(
        self, envelope: Envelope, digest: bytes, sender: str, message: Message, round: int, state: RoundSpending
    ) -> bool:
        """Whether a verified message is set aside (the window keeps it) until the end of the poll, when
        [`after_poll`] hands it back to be taken, or not."""

    def after_poll(
        self, round: int, result: RoundResult, state: RoundSpending, dropped: Counter
    ) -> tuple[int, list[tuple[Envelope, bytes, Message]]]:
        """After a poll: the (possibly moved) round and the deferred messages to take now."""

    def refusal(self, sender: str, message: Message, round: int, state: RoundSpending) -> str | None:
        """Why a verified message is not taken (a refusal reason), or `None`."""

    def note(self, sender: str, message: Message, result: RoundResult, state: RoundSpending) -> None:
        """Record a taken message."""

    def staleness(self, round: int, message: Message) -> int | None:
        """A taken message's lag behind this peer's round, or `None` when the window has no shared round."""

    def restarted(self, sender: str, message: Message) -> bool:
        """Whether a taken message shows its sender restarted."""

    def finish(self, round: int, result: RoundResult, state: RoundSpending, fresh: set[str]) -> None:
        """At the end of a collect: name the expected peers missing (`result.missing`)."""

    def pruned(self, seen: dict[bytes, int], round: int) -> dict[bytes, int]:
        """The digests of accepted messages still worth keeping."""

    def most_seen(self, known_peers: int) -> int:
        """The digests a saved state may hold."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the window, as JSON-serialisable values."""

    def check_state(self, state: Any, same_run: bool) -> tuple[Any, int]:
        """A saved [`state_dict`] checked (nothing in it is trusted: `ValueError` naming the field), as [`load`]
        restores it, and the highest `round_offset` a swarm state with it may hold. `same_run`: the state is of this
        run of the swarm (else what other peers showed is not carried over). Changes nothing."""

    def load(self, checked: Any) -> None:
        """Restore what [`check_state`] returned."""
