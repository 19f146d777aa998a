"""The rows that arrived and wait for a step to train on them (`exchange_mode="free"`).

In the free mode no step waits for a peer: the exchange worker collects whatever arrived (checked and decoded by the
swarm, not admitted yet), and [`FreeQueue`] keeps it until a step takes it. Each step takes the fresh rows, newest
first and shared fairly between senders ([`trl_ftis.peer_rows.select_rows`]), up to its peer-row cap, and admits only
those: a step's cost is set by the rows it trains on. Rows left over join a later step while they are fresh. A row's
age is counted in its sender's own steps: the sender's newest delivered round
([`trl_ftis.swarm.exchange_modes.free_window.FreeWindow.sender_rounds`]) minus the row's round. Rows older than
`max_staleness` of them, or from rounds after the sender's newest (it restarted from an older checkpoint since), are
dropped as `stale`; when more rows arrive than the queue holds, the oldest go first (`queue_full`).

The queue is owned by the free mode ([`trl_ftis.swarm.exchange_modes.free_mode.FreeMode`]) and used by the training
loop only (the worker's results are added by the loop when it takes them), so it needs no lock.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ...peer_rows import PeerRow, select_rows


@dataclass(frozen=True)
class Arrival:
    """One group of received rows of one sender and round, with when it was sampled and received."""

    rows: tuple[PeerRow, ...]
    sender: str
    round: int
    created: float
    """The sender's clock (unix seconds) when it published the message: only for the age in seconds, never trusted."""
    arrived: float
    """This receiver's clock (unix seconds) when the exchange worker collected it."""


@dataclass
class Taken:
    """What one step takes from the queue."""

    rows: list[PeerRow]
    """The rows to train on (to be admitted), whole groups."""
    ages: dict[tuple[str, object], tuple[int, float]]
    """`(sender, group)` -> the group's age in its sender's steps, and in seconds since the sender published it (0
    when the sender's clock is ahead of this one)."""
    stale: Counter
    """Rows dropped as too old, per sender."""


class FreeQueue:
    """
    Received peer rows waiting to be trained on, bounded in rows.

    Args:
        max_rows (`int`): the most rows held; beyond it the oldest groups are dropped (`queue_full`).
        max_staleness (`int`): the oldest a row may be when taken, in its sender's steps.
    """

    def __init__(self, max_rows: int, max_staleness: int):
        if max_rows < 0 or max_staleness < 0:
            raise ValueError(f"FreeQueue needs max_rows >= 0 and max_staleness >= 0, got {max_rows}, {max_staleness}")
        self.max_rows = int(max_rows)
        self.max_staleness = int(max_staleness)
        self._arrivals: list[Arrival] = []

    def __len__(self) -> int:
        """Rows held."""
        return sum(len(arrival.rows) for arrival in self._arrivals)

    def rows(self) -> list[PeerRow]:
        """Every row held, oldest arrival first (what a checkpoint saves)."""
        return [row for arrival in self._arrivals for row in arrival.rows]

    def created(self) -> list[float]:
        """Per row of [`rows`], when its sender published it."""
        return [arrival.created for arrival in self._arrivals for _ in arrival.rows]

    def add(
        self, rows: Sequence[PeerRow], created: Mapping[tuple[str, int], float] | None = None, now: float | None = None
    ) -> Counter:
        """Queue `rows` (whole groups; `created[(sender, round)]`: when the sender published them). Returns the rows
        dropped to stay within `max_rows`, per sender (the oldest arrivals first, then the oldest rounds)."""
        now = time.time() if now is None else now
        created = created or {}
        groups: dict[tuple, list[PeerRow]] = {}
        for row in rows:
            groups.setdefault((row.sender, row.group), []).append(row)
        for (sender, _), members in groups.items():
            round = int(members[0].round or 0)
            self._arrivals.append(
                Arrival(tuple(members), sender, round, float(created.get((sender, round), now)), now)
            )
        return self._trim()

    def _trim(self) -> Counter:
        dropped: Counter = Counter()
        excess = len(self) - self.max_rows
        if excess <= 0:
            return dropped
        # Oldest first: the arrival order, older rounds of a sender before its newer ones.
        order = sorted(range(len(self._arrivals)), key=lambda i: (self._arrivals[i].arrived, self._arrivals[i].round))
        gone = set()
        for index in order:
            if excess <= 0:
                break
            arrival = self._arrivals[index]
            gone.add(index)
            excess -= len(arrival.rows)
            dropped[arrival.sender] += len(arrival.rows)
        self._arrivals = [arrival for i, arrival in enumerate(self._arrivals) if i not in gone]
        return dropped

    def take(
        self,
        max_rows: int | None,
        sender_rounds: Mapping[str, int],
        *,
        regulars: Collection[str] | None = None,
        now: float | None = None,
    ) -> Taken:
        """The fresh rows to train on now (at most `max_rows`, whole groups, newest first, fairly between senders);
        stale ones are dropped, the rest stay queued. `sender_rounds`: each sender's newest delivered round."""
        now = time.time() if now is None else now
        stale: Counter = Counter()
        fresh: list[Arrival] = []
        ages: dict[int, int] = {}
        for arrival in self._arrivals:
            age = sender_rounds.get(arrival.sender, arrival.round) - arrival.round
            if 0 <= age <= self.max_staleness:
                fresh.append(arrival)
                ages[id(arrival)] = age
            else:
                stale[arrival.sender] += len(arrival.rows)
        by_row = {id(row): arrival for arrival in fresh for row in arrival.rows}
        chosen = select_rows([row for arrival in fresh for row in arrival.rows], max_rows, regulars=regulars)
        taken_arrivals = {id(by_row[id(row)]) for row in chosen}
        self._arrivals = [arrival for arrival in fresh if id(arrival) not in taken_arrivals]
        group_ages = {}
        for row in chosen:
            arrival = by_row[id(row)]
            group_ages[(row.sender, row.group)] = (ages[id(arrival)], max(now - arrival.created, 0.0))
        return Taken(chosen, group_ages, stale)
