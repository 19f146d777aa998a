"""The free window (`exchange_mode="free"`): no shared clock. Each sender's messages are taken in order of its own
(start, step) only ([`trl_ftis.swarm.exchange_modes.free_order.SenderOrder`]) and judged against that sender's newest;
nothing is waited for, and an expected peer is missing once silent for `peer_timeout` seconds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..round_budget import RoundResult, RoundSpending
from ..round_windows import MAX_KNOWN_PEERS, WindowHost
from ..swarm_state import counts, not_forged, state_field
from .free_order import FreeCollect, SenderOrder

if TYPE_CHECKING:
    from ...exchange import Message

__all__ = ["FreeWindow"]


class FreeWindow:
    """Each sender in its own order, nothing waited for (`exchange_mode="free"`)."""

    name = "free"
    waits = False

    def __init__(self, host: WindowHost):
        self.host = host
        self.order = SenderOrder(host.max_staleness, host.peer_timeout, MAX_KNOWN_PEERS)
        self.is_old = self.order.is_old  # replays and leftovers are read last, not skipped (their epoch may be newer)

    def finish(self, round: int, result: RoundResult, state: RoundSpending, fresh: set[str]) -> None:
        """At the end of a collect: keep each sender's rows within `max_staleness` of its own newest, follow each
        sender's newest accepted message, and name the expected peers silent for `peer_timeout` as missing."""
        swarm = self.host
        self.order.window(result, state)
        result.missing = self.order.silent(swarm.expected_peers, swarm.num_expected_peers, swarm.departed)

    def refusal(self, sender: str, message: Message, round: int, state: RoundSpending) -> str | None:
        """Taken in order only (`stale`; `senders` when as many senders as kept are followed), then judged against the
        sender's own newest round once the collect is over ([`finish`])."""
        return self.order.refusal(sender, message, state, self.host.listed_peers())

    def refuses_unread(self, envelope, round: int, state: RoundSpending, result: RoundResult) -> bool:
        return False  # no shared round to be ahead of

    def begin(self) -> FreeCollect:
        return FreeCollect()

    def defer(self, envelope, digest: bytes, sender: str, message: Message, round: int, state: RoundSpending) -> bool:
        return False  # no shared clock to catch up with

    def after_poll(self, round: int, result: RoundResult, state: RoundSpending, dropped: Counter):
        return round, []  # no shared round to move, nothing set aside

    def staleness(self, round: int, message: Message) -> int | None:
        return None  # measured against the sender's own newest, once the collect is over

    def note(self, sender: str, message: Message, result: RoundResult, state: RoundSpending) -> None:
        self.order.note(sender, message, result, state)

    def restarted(self, sender: str, message: Message) -> bool:
        return self.order.restarted(sender, message)  # a restart shows as a newer epoch, whatever its round

    def pruned(self, seen: dict[bytes, int], round: int) -> dict[bytes, int]:
        """No shared round: keep the newest digests, a window's worth per known sender."""
        keep = max(64, 2 * (self.host.max_staleness + 1) * (len(self.host.known_peers) + 1))
        return dict(list(seen.items())[-keep:]) if len(seen) > keep else seen

    def most_seen(self, known_peers: int) -> int:
        swarm = self.host
        return max(64, 2 * (swarm.max_staleness + 1) * (known_peers + 1)) + swarm.budget.max_messages

    @property
    def sender_rounds(self) -> dict[str, int]:
        return self.order.rounds

    @property
    def sender_epochs(self) -> dict[str, int]:
        return self.order.epochs

    def state_dict(self) -> dict[str, Any]:
        """Each followed sender's newest accepted round and start (`sender_rounds`, `sender_epochs`)."""
        return self.order.state_dict()

    def check_state(self, state: Any, same_run: bool) -> tuple[dict[str, Any], int]:
        """A saved [`state_dict`] checked; the round offset it allows is 0 (this window never moves the round). Of
        another run, the senders are not followed; a sender whose saved start is far ahead of this machine's clock
        is not either."""
        if not isinstance(state, Mapping) or set(state) != {"sender_rounds", "sender_epochs"}:
            raise ValueError("Swarm state: the free window's state is not {sender_rounds, sender_epochs}.")
        rounds = state_field(state, "sender_rounds", dict, counts)
        epochs = state_field(state, "sender_epochs", dict, counts)
        if set(epochs) - set(rounds):
            raise ValueError("Swarm state: 'sender_epochs' names senders that 'sender_rounds' does not.")
        if not same_run:
            rounds, epochs = {}, {}
        rounds, epochs = not_forged(rounds, epochs, epochs=epochs)
        return {"sender_rounds": rounds, "sender_epochs": epochs}, 0

    def load(self, checked: Mapping[str, Any]) -> None:
        self.order.load(checked["sender_rounds"], checked["sender_epochs"])
