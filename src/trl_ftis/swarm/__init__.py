"""The swarm side: what a peer needs to trade rows with other peers, apart from the trainer.

`client` ([`Swarm`]: publish this peer's rows, read the others'), `rounds` ([`RoundRunner`]: one exchange round per
generation batch, run by an exchange mode), `exchange_modes` (lock-step, background, free-running, and the registry a
fourth one joins), the round window and budget that bound what a round takes (`round_windows`, `round_budget`,
`reading_order`, `sender_order`, `arrivals`), the checks a received row passes (`peer_messages`, `admission`,
`scoring`), the counts of what happened to every row (`ledger`) and the F-TIS state in a checkpoint (`checkpoint`).

The core (`trl_ftis.config`, `trl_ftis.trainer`) imports the swarm through the names below only; each loads its
module on first use, so importing `trl_ftis.swarm` costs nothing until a run asks for a swarm.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:  # editors and type checkers see the lazily exported names
    from .admission import DROP_REASONS, STRIP_REASONS, Admission
    from .checkpoint import StateCheckpoints, resolve_resume
    from .client import Swarm
    from .exchange_modes import EXCHANGE_MODE_NAMES, EXCHANGE_MODES, ExchangeMode, register_exchange_mode
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
    "EXCHANGE_MODES": "exchange_modes",
    "EXCHANGE_MODE_NAMES": "exchange_modes",
    "ExchangeMode": "exchange_modes",
    "register_exchange_mode": "exchange_modes",
    "PeerRowLedger": "ledger",
    "RoundRunner": "rounds",
    "connect_swarm": "rounds",
    "RewardScorer": "scoring",
}
__all__ = [
    "Admission",
    "DROP_REASONS",
    "EXCHANGE_MODES",
    "EXCHANGE_MODE_NAMES",
    "ExchangeMode",
    "PeerRowLedger",
    "RewardScorer",
    "RoundRunner",
    "STRIP_REASONS",
    "StateCheckpoints",
    "Swarm",
    "connect_swarm",
    "register_exchange_mode",
    "resolve_resume",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
