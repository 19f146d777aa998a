"""Exchange modes: how a trainer's swarm rounds meet its training steps, one object each behind one protocol
([`ExchangeMode`]), chosen by `FTISConfig.exchange_mode` through the core's registry
(`trl_ftis.exchange_mode_registry`, where `trl_ftis.swarm` registers these three).

* the sync mode (`sync`, [`SyncMode`]): the round runs inside the step, which waits for the expected peers.
* the async mode (`async`, [`AsyncMode`]): the round runs in a background worker; a step trains on the previous
  round's rows.
* the free mode (`free`, [`FreeMode`]): nothing waits; arrived rows are queued and each step takes the fresh ones.

A mode owns its round window (`sync_window.SyncWindow`, `free_window.FreeWindow`), its queue (`free_queue.FreeQueue`)
and its checkpoint state, and talks to the round runner and the swarm client only through the interfaces handed to
it ([`RoundHost`], `trl_ftis.swarm.round_windows.WindowHost`). A new mode is one module with a class that follows
[`ExchangeMode`], and one `register_exchange_mode` call (`docs/swarm.md`, "Writing an exchange mode").
"""

from __future__ import annotations

from .async_mode import AsyncMode
from .base import ExchangeMode, ExchangeWorker, RoundAbandoned, RoundHost, RoundOutcome, Stateless, WorkerMode
from .free_mode import FreeMode
from .sync_mode import SyncMode

__all__ = [
    "AsyncMode",
    "ExchangeMode",
    "ExchangeWorker",
    "FreeMode",
    "RoundAbandoned",
    "RoundHost",
    "RoundOutcome",
    "Stateless",
    "SyncMode",
    "WorkerMode",
]
