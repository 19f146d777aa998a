"""`FTISConfig`: `GRPOConfig` plus the F-TIS options, with the paper's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from .objective import KL_REDUCTIONS, VARIANTS, parse_variant

SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
"""TRL aggregations whose per-token term is ``-min(R A, clip(R) A)``, so that ``A = w·Ã`` is exactly F-TIS."""


@dataclass
class FTISConfig(GRPOConfig):
    r"""
    Configuration class for [`FTISTrainer`].

    [`FTISConfig`] inherits every parameter of TRL's [`~trl.GRPOConfig`] and adds the options of the F-TIS objective
    (Filtered Truncated Importance Sampling, "F-TIS: Harnessing Diverse Models in Collaborative GRPO", Blagoev et al.,
    2026). It also changes four inherited defaults to the paper's recipe: `loss_type="grpo"` (mean over completions of
    each completion's token mean), `beta=0.0` (no KL-to-reference term), `disable_dropout=True` (with dropout on, even
    a peer's own samples are off-policy) and `cast_lm_head_to_fp32=True` (log-probs in fp32, so that the summed filter
    statistic does not cross its threshold from bf16 noise).

    Parameters:
        variant (`str`, *optional*, defaults to `"f-tis"`):
            Objective variant: `"f-tis"` (the method), or one of the paper's ablations `"nois"`, `"vis"`, `"tis"`,
            `"f-nois"`, `"f-vis"`. `tis` multiplies each token by the truncated weight `min(exp(ℓθ - ℓgen), C)`;
            `vis` clips the ratio against the generator's log-probs instead of the batch-time ones; `nois` uses
            neither. The `f-` prefix adds the filter that zeroes the advantage of far off-policy negative samples.
        is_cap (`float`, *optional*, defaults to `2.0`):
            `C`, the upper bound of the truncated importance weight (paper: 2.0). Must be at least 1 so that on-policy
            tokens (weight 1) are never down-weighted.
        kl_threshold (`float`, *optional*, defaults to `50.0`):
            `g`, the filter threshold: a completion with advantage `<= 0` whose filter statistic exceeds `g` gets
            advantage 0 (it still counts in every denominator). Paper: 50.0. Small models with short completions
            are much closer than this: see `docs/objective.md`.
        kl_reduction (`str`, *optional*, defaults to `"group_max_len"`):
            How the per-token k3 estimates `exp(ℓgen - ℓθ) - (ℓgen - ℓθ) - 1` of a completion become its filter
            statistic: `"group_max_len"` (sum divided by the longest completion of its group, the authors' code),
            `"mean"` (divided by its own length) or `"sum"`.
    """

    variant: str = field(
        default="f-tis",
        metadata={
            "help": "Objective variant: 'f-tis' (the method) or an ablation: 'nois', 'vis', 'tis', 'f-nois', 'f-vis'.",
            "choices": list(VARIANTS),
        },
    )
    is_cap: float = field(
        default=2.0,
        metadata={"help": "C, upper bound of the truncated importance weight min(exp(logp - logp_gen), C). >= 1."},
    )
    kl_threshold: float = field(
        default=50.0,
        metadata={
            "help": "g, filter threshold: completions with advantage <= 0 and filter statistic above g get advantage "
            "0."
        },
    )
    kl_reduction: str = field(
        default="group_max_len",
        metadata={
            "help": "Reduction of per-token k3 to the filter statistic: 'group_max_len' (sum / longest completion of "
            "the group), 'mean' or 'sum'.",
            "choices": list(KL_REDUCTIONS),
        },
    )

    # Inherited options whose defaults follow the paper.
    loss_type: str = field(
        default="grpo",
        metadata={
            "help": "Loss aggregation. F-TIS uses 'grpo' (mean over completions of each completion's token mean); "
            "'bnpo', 'dr_grpo' and 'dapo' are also supported.",
        },
    )
    beta: float = field(
        default=0.0,
        metadata={"help": "KL coefficient towards a reference model. The paper uses none (0.0)."},
    )
    disable_dropout: bool = field(
        default=True,
        metadata={"help": "Disable dropout: with dropout, generation and scoring differ and own rows are off-policy."},
    )
    cast_lm_head_to_fp32: bool = field(
        default=True,
        metadata={"help": "Compute the LM head and log-probs in fp32 (F-TIS compares log-probs across models)."},
    )

    def __post_init__(self):
        super().__post_init__()
        self.variant = parse_variant(self.variant).name  # raises ValueError on an unknown name
        if not self.is_cap >= 1.0:  # also rejects NaN
            raise ValueError(f"is_cap must be a number >= 1.0 (the weight of an on-policy token is 1), got {self.is_cap}.")
        if not self.kl_threshold >= 0.0:
            raise ValueError(f"kl_threshold must be a number >= 0, got {self.kl_threshold}.")
        if self.kl_reduction not in KL_REDUCTIONS:
            raise ValueError(
                f"Unknown kl_reduction {self.kl_reduction!r}; expected one of {', '.join(KL_REDUCTIONS)}."
            )
        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported by F-TIS; use one of {', '.join(SUPPORTED_LOSS_TYPES)} "
                "(the clipped-ratio objectives the truncated weight and the filter are defined for)."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                "F-TIS weights and clips per token: importance_sampling_level must be 'token', "
                f"got {self.importance_sampling_level!r}."
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (log-probs are compared at it), got {self.temperature}.")
