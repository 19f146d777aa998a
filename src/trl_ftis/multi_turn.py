"""Why F-TIS exchanges single-turn completions only: the refusal `FTISTrainer` words when an exchange meets
multi-turn tools."""

from __future__ import annotations

MULTI_TURN_REFUSAL = (
    "{} with tools or environment_factory: F-TIS peers exchange single-turn text completions, and a multi-turn one "
    "holds tool results that no model sampled. Train with tools alone, or exchange without them."
)
"""Why `FTISTrainer` refuses an exchange, `add_peer_rows` or `add_row_listener` (the `{}`) with multi-turn tools."""
