"""The swarm side: what a peer needs to trade rows with other peers, apart from the trainer.

`client` ([`Swarm`]: publish this peer's rows, read the others'), `rounds` ([`RoundRunner`]: one exchange round per
generation batch, run by an exchange mode), `exchange_modes` (the sync, async and free modes, each with its window and
state, registered below into the core's registry, `trl_ftis.exchange_mode_registry`), the round window protocol and the
budget that bound what a round takes (`round_windows`, `round_budget`, `reading_order`), the checks a received row
passes (`peer_messages`, `admission`, `scoring`), the counts of what happened to every row (`ledger`) and the F-TIS
state in a checkpoint (`checkpoint`).

The core (`trl_ftis.trainer`) imports the swarm through the names below only; each loads its module on first use,
so importing `trl_ftis.swarm` costs nothing until a run asks for a swarm (the package imports it once, so that the
three modes are registered before any config is checked).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..exchange_mode_registry import ExchangeModeEntry, register_exchange_mode

if TYPE_CHECKING:  # editors and type checkers see the lazily exported names
    from .admission import DROP_REASONS, STRIP_REASONS, Admission
    from .checkpoint import StateCheckpoints, resolve_resume
    from .client import Swarm
    from .exchange_modes import ExchangeMode
    from .ledger import PeerRowLedger
    from .rounds import RoundRunner, connect_swarm
    from .scoring import RewardScorer

_LAZY = {
    "Admission": "admission",
    "DROP_REASONS": "admission",
    "STRIP_REASONS": "admission",
    "StateCheckpoints": "checkpoint",
    "resolve_resume": "checkpoint",
    "Swarm": "client",
    "ExchangeMode": "exchange_modes",
    "PeerRowLedger": "ledger",
    "RoundRunner": "rounds",
    "connect_swarm": "rounds",
    "RewardScorer": "scoring",
}
__all__ = [
    "Admission",
    "DROP_REASONS",
    "ExchangeMode",
    "PeerRowLedger",
    "RewardScorer",
    "RoundRunner",
    "STRIP_REASONS",
    "StateCheckpoints",
    "Swarm",
    "connect_swarm",
    "resolve_resume",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _mode(module: str, name: str):
    """Loads the mode class `name` of `exchange_modes.<module>` when a run first asks for it."""
    from importlib import import_module

    return lambda: getattr(import_module(f"{__name__}.exchange_modes.{module}"), name)


for _entry in (
    ExchangeModeEntry("sync", horizontal=True, load=_mode("sync_mode", "SyncMode")),
    ExchangeModeEntry("async", horizontal=False, load=_mode("async_mode", "AsyncMode")),
    ExchangeModeEntry("free", horizontal=False, load=_mode("free_mode", "FreeMode")),
):
    register_exchange_mode(_entry)
