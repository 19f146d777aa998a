"""trl-ftis: collaborative GRPO across heterogeneous models with Filtered Truncated Importance Sampling (F-TIS).

Every export loads on first use: the objective (`ftis_loss` and its parts) imports torch, the trainer classes TRL,
and the optional back-ends (vLLM, DeepSpeed, wandb, Redis) load only when a run asks for them.
"""

from typing import TYPE_CHECKING

from . import swarm  # registers the swarm's exchange modes (sync, async, free); loads none of them
from ._lazy import lazy_exports

__version__ = "0.1.0.dev0"

if TYPE_CHECKING:  # editors and type checkers see the lazily exported names
    from .config import FTISConfig
    from .objective import (
        KL_REDUCTIONS,
        VARIANTS,
        FTISTerms,
        clipped_surrogate,
        filter_keep_mask,
        filter_statistic,
        ftis_loss,
        ftis_terms,
        grpo_aggregate,
        k3_per_token,
        parse_variant,
        truncated_importance_weights,
    )
    from .peer_rows import PeerRow
    from .trainer import FTISTrainer

_LAZY = {
    "FTISConfig": "config",
    "FTISTrainer": "trainer",
    "PeerRow": "peer_rows",
}

__all__ = [
    "KL_REDUCTIONS",
    "VARIANTS",
    "FTISConfig",
    "FTISTerms",
    "FTISTrainer",
    "PeerRow",
    "clipped_surrogate",
    "filter_keep_mask",
    "filter_statistic",
    "ftis_loss",
    "ftis_terms",
    "grpo_aggregate",
    "k3_per_token",
    "parse_variant",
    "truncated_importance_weights",
]

# Everything loads on first use, torch included, so that `trl-ftis --help`, `--version` and `keygen` start fast:
# the names not listed above come from the objective.
_LAZY.update((name, "objective") for name in __all__ if name not in _LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
