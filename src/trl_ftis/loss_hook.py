"""`FTISLossHook`: the F-TIS objective, substituted into TRL's own loss.

`FTISTrainer` does not copy TRL's loss. Its `_compute_loss` arms this hook with a shallow copy of the micro-batch;
its `_get_per_token_logps_and_entropies`, on TRL's first call inside `_compute_loss`, hands the hook the fresh
learner log-probs `ℓθ`; the hook then replaces the copy's `advantages` by the per-token `w·Ã` and its
`old_per_token_logps` by the ratio reference (`ℓold`, or `ℓgen` for the `vis` variants), computed by
`trl_ftis.objective.ftis_terms`. TRL's clipped surrogate then computes exactly the F-TIS loss.

This relies on a contract with TRL's `GRPOTrainer._compute_loss` (TRL 1.16):

1. its first call of `self._get_per_token_logps_and_entropies` computes `ℓθ`, the learner's log-probs of the batch's
   completions, with gradient;
2. it reads `inputs["advantages"]` (accepting shape `(B, T)` as well as `(B,)`) and `inputs["old_per_token_logps"]`
   only after that call, from the `inputs` dict it was given.

`tests/core/test_trainer.py::test_trl_loss_contract_*` fail, naming this contract, if a TRL upgrade breaks it, and
`trl_ftis.trl_seams` names the TRL methods whose source changed.

The hook also owns what the objective keeps between micro-batches: the running threshold of
`kl_threshold_mode="quantile"` (saved with each checkpoint), the terms of a micro-batch computed in chunks (logged
once, as the micro-batch's), and the counts of filtered rows of the optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .config import FTISConfig
from .loss_metrics import record_term_statistics
from .micro_batches import batch_terms, joined
from .objective import ess_weighted, parse_variant, quantile_threshold, update_threshold
from .peer_value import PeerValue
from .swarm import PeerRowLedger


class FTISLossHook:
    """The F-TIS terms of each micro-batch, written into the batch TRL's loss reads, and their statistics logged.

    Args:
        config: the trainer's [`FTISConfig`].
        accelerator: the trainer's `Accelerator` (the statistics are reduced over every process).
        ledger: the peer-row ledger, whose `sources` index the batch's `ftis_source`.
        value: what reached the loss, per source ([`PeerValue`]).
        metrics: the trainer's metrics (`mode -> name -> list of values`), appended to.
        training: whether the model is training now (else the statistics go to the `eval` metrics).
        loss_type, importance_sampling_level: TRL's settings the terms depend on.
    """

    def __init__(
        self,
        config: FTISConfig,
        *,
        accelerator,
        ledger: PeerRowLedger,
        value: PeerValue,
        metrics: dict[str, dict[str, list[float]]],
        training: Callable[[], bool],
        loss_type: str,
        importance_sampling_level: str,
    ):
        self.config = config
        self.variant = parse_variant(config.variant)
        self.accelerator, self.ledger, self.value, self.metrics = accelerator, ledger, value, metrics
        self.training, self.loss_type, self.importance_sampling_level = training, loss_type, importance_sampling_level
        self.adaptive_threshold: float | None = None  # kl_threshold_mode="quantile": the running g
        self._armed: dict[str, Any] | None = None  # the batch copy the next log-prob call rewrites
        self._chunks: list[tuple] | None = None  # while a micro-batch is computed in chunks
        self._filtered: dict[str, float] = {}  # this optimizer step's filtered rows, in all and per peer

    def arm(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """A shallow copy of `inputs` for TRL's loss, which the next [`take_armed`] hands back to be rewritten (the
        buffered batch is reused across `num_iterations`, so it must stay untouched)."""
        self._armed = dict(inputs)
        return self._armed

    def disarm(self) -> None:
        """Forget an armed batch that no log-prob call took (TRL's loss raised before computing `ℓθ`)."""
        self._armed = None

    def take_armed(self) -> dict[str, Any] | None:
        """The armed batch, once: the first log-prob call of TRL's loss rewrites it, later ones (the reference model,
        entropy) leave it alone."""
        inputs, self._armed = self._armed, None
        return inputs

    def apply(self, inputs: dict[str, Any], per_token_logps: torch.Tensor) -> None:
        """Replace `inputs["advantages"]` and `inputs["old_per_token_logps"]` by the F-TIS terms computed from the
        learner's `per_token_logps`, update the quantile threshold and log the terms' statistics."""
        args, advantages = self.config, inputs["advantages"]
        adaptive = args.kl_threshold_mode == "quantile"
        threshold = self.adaptive_threshold if adaptive and self.adaptive_threshold is not None else args.kl_threshold
        terms, mask = batch_terms(
            inputs,
            per_token_logps,
            variant=self.variant,
            is_cap=args.is_cap,
            kl_threshold=threshold,
            kl_reduction=args.kl_reduction,
            filter_mode=args.filter_mode,
            loss_type=self.loss_type,
            importance_sampling_level=self.importance_sampling_level,
        )
        source = inputs.get("ftis_source")
        if source is None:
            source = torch.zeros_like(advantages, dtype=torch.long)
        inputs["advantages"] = terms.token_advantages
        if args.peer_weighting == "ess":  # the metrics below keep the unscaled terms: they measure rows, not options
            inputs["advantages"], peer_scale = ess_weighted(terms, mask.bool(), source)
            peer_scale = self.accelerator.reduce(peer_scale, reduction="sum").cpu()  # every process, whatever its rows
            if peer_scale[1] > 0:  # the peer rows' mean scale over every process
                mode = "train" if self.training() else "eval"
                self.metrics[mode]["ftis/peer/ess_scale"].append((peer_scale[0] / peer_scale[1]).item())
        inputs["old_per_token_logps"] = terms.ratio_reference_logps
        if adaptive:  # the next micro-batch's g: this one's quantile over peer rows, averaged
            self.metrics["train"]["ftis/kl_threshold"].append(threshold)
            observed = quantile_threshold(terms.filter_statistic, advantages, source > 0, args.filter_target_fraction)
            self.adaptive_threshold = update_threshold(self.adaptive_threshold, observed, args.threshold_momentum)
        self.log_terms(terms, mask.bool(), source, inputs.get("ftis_age"))

    @contextmanager
    def chunks(self) -> Iterator[None]:
        """Inside: a micro-batch computed in row chunks; each chunk's terms are kept and logged once at the end, as
        the micro-batch's (nothing is logged when a chunk raises)."""
        self._chunks = []
        try:
            yield
            terms = joined(self._chunks)
        finally:
            self._chunks = None
        self.log_terms(*terms)

    def log_terms(self, terms, mask: torch.Tensor, source: torch.Tensor, age: torch.Tensor | None) -> None:
        """The statistics of one micro-batch's terms (`trl_ftis.loss_metrics`); a chunk's are kept for later."""
        if self._chunks is not None:
            return self._chunks.append((terms, mask, source, age))
        training = self.training()
        record_term_statistics(
            self.accelerator,
            terms,
            mask,
            source,
            age if self.config.exchange_url is not None else None,  # ages: swarm rows only
            sources=self.ledger.sources,
            max_staleness=self.config.max_staleness,
            metrics=self.metrics["train" if training else "eval"],
            value=self.value if training else None,
            filtered=self._filtered if training else None,
        )

    def step_counts(self) -> dict[str, float]:
        """The optimizer step's counts of filtered rows (`rows_filtered`, `peers/<id>/rows_filtered`), reset."""
        counts, self._filtered = self._filtered, {}
        return counts
