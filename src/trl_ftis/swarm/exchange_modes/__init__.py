"""Exchange modes: how a trainer's swarm rounds meet its training steps, one module each behind one protocol
([`ExchangeMode`]), chosen by `FTISConfig.exchange_mode` through [`EXCHANGE_MODES`].

* `sync` ([`SyncMode`]): the round runs inside the step, which waits for the expected peers.
* `async` ([`AsyncMode`]): the round runs in a background worker; a step trains on the previous round's rows.
* `free` ([`FreeMode`]): nothing waits; arrived rows are queued and each step takes the fresh ones.

A new mode is one module with a class that follows [`ExchangeMode`], and one [`register_exchange_mode`] call
(`docs/swarm.md`, "Writing an exchange mode").
"""

from __future__ import annotations

from .async_mode import AsyncMode
from .base import ExchangeMode, ExchangeWorker, RoundAbandoned, RoundOutcome
from .free_mode import FreeMode
from .sync_mode import SyncMode

__all__ = [
    "EXCHANGE_MODES",
    "EXCHANGE_MODE_NAMES",
    "AsyncMode",
    "ExchangeMode",
    "ExchangeWorker",
    "FreeMode",
    "SyncMode",
    "RoundAbandoned",
    "RoundOutcome",
    "register_exchange_mode",
]

EXCHANGE_MODES: dict[str, type] = {mode.name: mode for mode in (SyncMode, AsyncMode, FreeMode)}
"""`exchange_mode` value -> the class the round runner builds (with itself as its only argument)."""
EXCHANGE_MODE_NAMES: list[str] = list(EXCHANGE_MODES)
"""The names, in one list that registration extends: `FTISConfig.exchange_mode`'s choices on a command line (a mode
registered before the parser is built is a choice)."""


def register_exchange_mode(mode: type) -> type:
    """Make `mode` (a class following [`ExchangeMode`], with its `name`) selectable as `exchange_mode=mode.name`;
    returns it, so that it can decorate the class. A name already taken is refused (`ValueError`)."""
    if mode.name in EXCHANGE_MODES and EXCHANGE_MODES[mode.name] is not mode:
        raise ValueError(f"exchange_mode {mode.name!r} is already registered ({EXCHANGE_MODES[mode.name].__name__}).")
    if mode.name not in EXCHANGE_MODES:
        EXCHANGE_MODE_NAMES.append(mode.name)
    EXCHANGE_MODES[mode.name] = mode
    return mode
