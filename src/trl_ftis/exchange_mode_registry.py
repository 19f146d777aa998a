"""The exchange modes a config may name (`FTISConfig.exchange_mode`): what the core needs to know of each, and nothing
more. The swarm registers its modes here (`trl_ftis.swarm`: `sync`, `async`, `free`), a plug-in registers its own
([`register_exchange_mode`]); the config reads the names (its choices) and each mode's `horizontal` capability, and
the round runner builds the mode registered under the configured name ([`exchange_mode`]).

The core never imports a mode: an entry may name where its class is ([`ExchangeModeEntry.load`]), loaded the first
time a run asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCHANGE_MODES", "EXCHANGE_MODE_NAMES", "ExchangeModeEntry", "exchange_mode", "register_exchange_mode"]


@dataclass(frozen=True)
class ExchangeModeEntry:
    """One registered exchange mode, as the core sees it."""

    name: str
    """The `exchange_mode` value that selects it."""
    horizontal: bool
    """Whether `collaboration_mode="horizontal"` works with it (the step's own rows are normalised with the same
    round's peer rows, which only a mode that collects at the step has)."""
    load: Callable[[], type]
    """Returns the mode's class (`trl_ftis.swarm.exchange_modes.ExchangeMode`), importing it on first use."""


EXCHANGE_MODES: dict[str, ExchangeModeEntry] = {}
"""`exchange_mode` value -> its entry, in registration order."""
EXCHANGE_MODE_NAMES: list[str] = []
"""The names, in one list that registration extends: `FTISConfig.exchange_mode`'s choices on a command line (a mode
registered before the parser is built is a choice)."""


def register_exchange_mode(mode: Any) -> Any:
    """Make a mode selectable as `exchange_mode=<its name>` and return it (so that it can decorate a class).

    `mode` is a class following `trl_ftis.swarm.exchange_modes.ExchangeMode` (its `name` and `horizontal` class
    attributes are read), or an [`ExchangeModeEntry`] that loads one on first use. A name already taken by another
    mode is refused (`ValueError`); registering the same mode again changes nothing."""
    if isinstance(mode, ExchangeModeEntry):
        entry = mode
    else:
        name, horizontal = getattr(mode, "name", None), getattr(mode, "horizontal", None)
        if not isinstance(name, str) or not name or not isinstance(horizontal, bool):
            raise TypeError(
                f"An exchange mode needs a `name` (a non-empty str) and `horizontal` (a bool) class attribute; "
                f"{mode!r} has name={name!r}, horizontal={horizontal!r}."
            )
        entry = ExchangeModeEntry(name, horizontal, lambda: mode)
    known = EXCHANGE_MODES.get(entry.name)
    if known is not None:
        if known == entry or (not isinstance(mode, ExchangeModeEntry) and known.load() is mode):
            return mode
        raise ValueError(f"exchange_mode {entry.name!r} is already registered ({known.load().__name__}).")
    EXCHANGE_MODES[entry.name] = entry
    EXCHANGE_MODE_NAMES.append(entry.name)
    return mode


def exchange_mode(name: str) -> type:
    """The class of the mode registered as `name` (`KeyError` naming the registered ones when none is)."""
    entry = EXCHANGE_MODES.get(name)
    if entry is None:
        raise KeyError(f"No exchange mode {name!r} is registered (registered: {', '.join(EXCHANGE_MODE_NAMES)}).")
    return entry.load()
