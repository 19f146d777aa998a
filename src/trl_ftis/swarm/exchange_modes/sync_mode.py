"""`exchange_mode="sync"`: the round runs inside the step, which waits for the expected peers (up to `peer_timeout`)
and trains on what they sent for this round."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .base import RoundOutcome, no_arrivals
from .sync_window import SyncWindow

if TYPE_CHECKING:
    from ...peer_rows import PeerRow

__all__ = ["SyncMode"]


class SyncMode:
    """The lock-step mode ([`ExchangeMode`](base.py)): `round` is the runner's whole round, at the step."""

    name = "sync"
    window = SyncWindow
    horizontal = True

    def __init__(self, runner):
        self.runner = runner
        self.worker_errors = 0
        self.admission_seconds = 0.0
        self.closing = threading.Event()  # never set: nothing runs in the background

    def round(self, own_rows: list[PeerRow], round: int) -> RoundOutcome:
        return self.runner.run_round(own_rows, round)

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return no_arrivals()

    def load_state_dict(self, state: dict[str, Any], *, local_rows: int) -> int:
        return 0  # rows a free-running run had queued are not this mode's: a lock-step round collects its own
