"""The end-of-run summary file: [`SummaryCallback`] writes `FTISTrainer.summary()` to
`output_dir/ftis_summary.json`, the file the launcher reads (`trl_ftis.shared_names.SUMMARY_FILE`), and says what
collaboration bought, with the exchange's warnings (`trl_ftis.exchange_report`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .exchange_report import exchange_warning
from .shared_names import SUMMARY_FILE

logger = logging.getLogger(__name__)


class SummaryCallback(TrainerCallback):
    """When training ends, writes `summary()` to `output_dir/ftis_summary.json` (on the main process) and says what
    collaboration bought: a warning (shown by default) for a peer of a swarm or a run with peer rows, else at info
    level."""

    def __init__(self, summary: Callable[[], dict[str, Any]], is_main_process: bool):
        self.summary, self.is_main_process = summary, is_main_process

    def on_train_end(self, args, state, control, **kwargs):
        if not self.is_main_process:
            return
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        (Path(args.output_dir) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
        in_swarm = getattr(args, "exchange_url", None) is not None
        with_peers = in_swarm or summary["peer_value"]["rows_in_loss"] > 0
        (logger.warning if with_peers else logger.info)("%s: %s.", summary["peer_id"], summary["collaboration"])
        problem = exchange_warning(summary) if in_swarm else None
        if problem is not None:
            logger.warning("%s", problem)
