"""The sync mode (`exchange_mode="sync"`): the round runs inside the step, which waits for the expected peers (up to
`peer_timeout`) and trains on what they sent for this round."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .base import RoundHost, RoundOutcome, Stateless
from .sync_window import SyncWindow

if TYPE_CHECKING:
    from ...peer_rows import PeerRow

__all__ = ["SyncMode"]


class SyncMode(Stateless):
    """The sync mode ([`ExchangeMode`](base.py)): `round` is the runner's whole round, at the step. It keeps nothing
    across a restart: a round collects its own rows."""

    name = "sync"
    window = SyncWindow
    horizontal = True
    drop_reasons = {}

    def __init__(self, host: RoundHost):
        self.host = host
        self.worker_errors = 0
        self.admission_seconds = 0.0
        self.closing = threading.Event()  # never set: nothing runs in the background

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        return self.host.run_round(own_rows, round)

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass
