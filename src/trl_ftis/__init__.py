"""trl-ftis: collaborative GRPO across heterogeneous models with Filtered Truncated Importance Sampling (F-TIS).

The objective (`ftis_loss` and its parts) needs only torch; the trainer classes import TRL on first use, and the
optional back-ends (vLLM, DeepSpeed, wandb, Redis) only when a run asks for them.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
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

__version__ = "0.1.0.dev0"

if TYPE_CHECKING:  # editors and type checkers see the lazily exported classes
    from .config import FTISConfig
    from .peer_rows import PeerRow
    from .trainer import FTISTrainer

_LAZY = {
    "FTISConfig": "config",
    "FTISTrainer": "trainer",
    "PeerRow": "peer_rows",
}

__all__ = [
    "FTISConfig",
    "FTISTerms",
    "FTISTrainer",
    "KL_REDUCTIONS",
    "PeerRow",
    "VARIANTS",
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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
