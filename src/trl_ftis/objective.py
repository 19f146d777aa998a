"""The F-TIS objective as small pure tensor functions.

Notation (see `docs/objective.md`): for completion `i` and token `t`,
`ℓθ` is the learner's log-prob (with gradient), `ℓold` the learner's log-prob when the batch was formed,
`ℓgen` the generating model's log-prob (a constant received with the sample), `Â_i` the group advantage.

    L = -(1/B) Σ_i (1/|a_i|) Σ_t  w_{i,t} · min( R_{i,t} Ã_i , clip(R_{i,t}, 1-ε, 1+ε) Ã_i )

* `R = exp(ℓθ - ℓref)` with `ℓref = ℓold` (or `ℓgen` for the `vis` variants); the *ratio* is clipped.
* `w = min(exp(ℓθ - ℓgen), C)`, stop-gradient, for the `tis` variants; 1 otherwise.
* `Ã_i = 0` when `Â_i <= 0` and the filter statistic `D_i > g` (`f-*` variants); `Â_i` otherwise.

The trainer builds its loss from exactly these functions: [`ftis_terms`] turns the raw quantities into
per-token advantages `w·Ã` and a ratio reference, which TRL's clipped surrogate then consumes unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

VARIANTS = ("nois", "vis", "tis", "f-nois", "f-vis", "f-tis")
"""The objective variants of the paper's ablation, `f-tis` being the method itself."""

KL_REDUCTIONS = ("group_max_len", "mean", "sum")
"""How the per-token k3 values of a completion are reduced to its filter statistic `D_i`."""

FILTER_MODES = ("zero", "remove")
"""What the filter does to a filtered completion: `zero` its advantage (the paper's text; the row still counts in the
loss's normaliser), or `remove` it (the authors' code: the loss averages over the surviving rows)."""

THRESHOLD_MODES = ("fixed", "quantile")
"""How the filter threshold `g` is set: `fixed` (`kl_threshold`), or `quantile`: a running quantile of the peer rows'
statistic, so that about `filter_target_fraction` of their negative-advantage rows are filtered."""

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
"""TRL's loss types (TRL 1.16). Each is linear in the advantage, so F-TIS acts on all of them through it: the
per-token advantage `w·Ã` replaces `Â` (see `docs/objective.md` for each loss's resulting gradient)."""

TOKEN_NORMALISED_LOSSES = ("bnpo", "dapo", "cispo", "vespo")
"""Loss types whose normaliser counts tokens; the others (`grpo`, `dr_grpo`, `sapo`, `luspo`) count completions."""

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""TRL's `importance_sampling_level`: per-token ratios, or GSPO's one length-normalised ratio per completion. F-TIS
follows it: a per-token truncated weight and statistic, or a per-completion one."""

MAX_LOG_RATIO = 20.0
"""Largest log importance ratio ever exponentiated: keeps `exp` finite for arbitrarily off-policy samples."""


@dataclass(frozen=True)
class Variant:
    """What an objective variant does, parsed from its name (see [`VARIANTS`])."""

    name: str
    truncated_weight: bool
    """Multiply each token by `w = min(sg exp(ℓθ - ℓgen), C)` (the `tis` variants)."""
    ratio_against_generator: bool
    """Clip `exp(ℓθ - ℓgen)` instead of `exp(ℓθ - ℓold)` (the `vis` variants)."""
    filtered: bool
    """Zero the advantage of negative-advantage completions whose filter statistic exceeds the threshold."""


def parse_variant(name: str) -> Variant:
    """Parse a variant name such as `"f-tis"` (case and `_`/`-` insensitive)."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in VARIANTS:
        raise ValueError(f"Unknown F-TIS variant {name!r}; expected one of {', '.join(VARIANTS)}.")
    base = key.removeprefix("f-")
    return Variant(
        name=key,
        truncated_weight=base == "tis",
        ratio_against_generator=base == "vis",
        filtered=key.startswith("f-"),
    )


def group_max_len(lengths: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Per row, the longest completion length among the rows of its group. Shape `(B,)`, dtype of `lengths`.

    `group_index` holds a group label per row, in any order (any integers: they only need to be equal within a
    group). TRL's contiguous groups of `G` rows are `group_index = torch.arange(B) // G`.
    """
    if lengths.numel() == 0:
        return lengths.clone()
    _, index = torch.unique(group_index.to(lengths.device), return_inverse=True)
    maxes = torch.zeros(int(index.max()) + 1, dtype=lengths.dtype, device=lengths.device)
    maxes = maxes.scatter_reduce(0, index, lengths, reduce="amax", include_self=False)
    return maxes[index]


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    # bf16/fp16 log-probs are too coarse for ratios; fp64 inputs keep their precision.
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _masked(x: torch.Tensor, mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    # `torch.where` (not multiplication) so that -inf or NaN on padded positions never leaks into a result.
    return torch.where(mask, x, torch.full_like(x, fill))


@torch.no_grad()
def k3_per_token(
    per_token_logps: torch.Tensor, gen_per_token_logps: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """Schulman's k3 estimator per token, `r - log r - 1` with `r = πgen / πθ`; 0 on padding. No gradient."""
    mask = completion_mask.bool()
    log_r = _masked(_at_least_fp32(gen_per_token_logps) - _at_least_fp32(per_token_logps.detach()), mask)
    return _masked(_k3(log_r), mask)


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    """`r - log r - 1` from `log r`: expm1(x) - x, without the cancellation error near 0, and +inf (not inf - inf)
    when πθ is infinitely below πgen."""
    return torch.where(torch.isposinf(log_r), log_r, torch.expm1(log_r) - log_r)


@torch.no_grad()
def filter_statistic(
    per_token_logps: torch.Tensor,
    gen_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    kl_reduction: str = "group_max_len",
    group_max_lengths: torch.Tensor | None = None,
    num_generations: int | None = None,
) -> torch.Tensor:
    """The per-completion filter statistic `D_i` (shape `(B,)`), computed without gradient.

    `group_max_len` (default, the authors' code): `Σ_t k3 / L_max` with `L_max` the longest completion of the
    row's group, taken from `group_max_lengths` or, for contiguous groups, from `num_generations`.
    `mean`: `Σ_t k3 / |a_i|`. `sum`: `Σ_t k3`.
    """
    total = k3_per_token(per_token_logps, gen_per_token_logps, completion_mask).sum(-1)
    if kl_reduction == "sum":
        return total
    if kl_reduction == "mean":
        return total / completion_mask.sum(-1).clamp(min=1).to(total.dtype)
    if kl_reduction == "group_max_len":
        if group_max_lengths is None:
            if num_generations is None:
                raise ValueError("kl_reduction='group_max_len' needs group_max_lengths or num_generations.")
            lengths = completion_mask.sum(-1)
            if num_generations < 1 or lengths.shape[0] % num_generations != 0:
                raise ValueError(
                    f"The batch has {lengths.shape[0]} rows, which is not a whole number of groups of "
                    f"num_generations={num_generations}."
                )
            group_max_lengths = group_max_len(lengths, torch.arange(lengths.shape[0]) // num_generations)
        return total / group_max_lengths.clamp(min=1).to(total.dtype)
    raise ValueError(f"Unknown kl_reduction {kl_reduction!r}; expected one of {', '.join(KL_REDUCTIONS)}.")


@torch.no_grad()
def truncated_importance_weights(
    per_token_logps: torch.Tensor,
    gen_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    is_cap: float = 2.0,
) -> torch.Tensor:
    """`w = min(exp(ℓθ - ℓgen), C)` per token, stop-gradient; 0 on padding and on unscorable (NaN) tokens."""
    mask = completion_mask.bool()
    log_ratio = _masked(_at_least_fp32(per_token_logps.detach()) - _at_least_fp32(gen_per_token_logps), mask)
    # Clamping the log-ratio at log C before exp is exactly min(exp(.), C) and can never overflow.
    weights = torch.exp(torch.clamp(log_ratio, max=math.log(is_cap)))
    return _masked(torch.nan_to_num(weights, nan=0.0), mask)


@torch.no_grad()
def sequence_log_ratio(
    per_token_logps: torch.Tensor, gen_per_token_logps: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """`s_i = (1/|a_i|) Σ_t (ℓθ - ℓgen)`, shape `(B,)`: the log of GSPO's length-normalised sequence ratio against
    the generator (TRL's `importance_sampling_level="sequence"` takes the same mean against `ℓold`). No gradient;
    NaN when a token is unscorable."""
    mask = completion_mask.bool()
    diff = _masked(_at_least_fp32(per_token_logps.detach()) - _at_least_fp32(gen_per_token_logps), mask)
    return diff.sum(-1) / mask.sum(-1).clamp(min=1).to(diff.dtype)


@torch.no_grad()
def sequence_truncated_weights(
    per_token_logps: torch.Tensor,
    gen_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    is_cap: float = 2.0,
) -> torch.Tensor:
    """GSPO's truncated weight `w_i = min(exp(s_i), C)` ([`sequence_log_ratio`]) on every token of completion `i`,
    shape `(B, T)`, stop-gradient; 0 on padding and for a completion with an unscorable token."""
    log_ratio = sequence_log_ratio(per_token_logps, gen_per_token_logps, completion_mask)
    return _sequence_weights(log_ratio, completion_mask.bool(), is_cap)


def _sequence_weights(log_ratio: torch.Tensor, mask: torch.Tensor, is_cap: float) -> torch.Tensor:
    """`min(exp(s_i), C)` from `s_i` (`(B,)`) on every unmasked token, 0 for a NaN `s_i`."""
    weights = torch.nan_to_num(torch.exp(torch.clamp(log_ratio, max=math.log(is_cap))), nan=0.0)
    return _masked(weights.unsqueeze(-1).expand(mask.shape), mask)


@torch.no_grad()
def sequence_filter_statistic(
    per_token_logps: torch.Tensor, gen_per_token_logps: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """The filter statistic of sequence-level importance sampling, shape `(B,)`: k3 of the length-normalised
    sequence ratio, `r - log r - 1` with `log r = -s_i` (`r = πgen / πθ` per token, geometric mean over the
    completion), the per-token statistic's form applied to GSPO's ratio. `+inf` when the learner finds the
    completion infinitely unlikely; NaN (filtered as too far) when a token is unscorable."""
    return _k3(-sequence_log_ratio(per_token_logps, gen_per_token_logps, completion_mask))


@torch.no_grad()
def text_log_ratio(
    per_token_logps: torch.Tensor, gen_per_token_logps: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """`Σ_t (ℓθ - ℓgen)` over each completion, shape `(B,)`: for a row re-tokenised from another tokenizer's text,
    whose generator log-probs are the sender's total spread evenly over this tokenizer's tokens, the log of the ratio
    of the two models' probabilities of the same text (`Σ ℓθ - Σ ℓgen`). No gradient; NaN when a token is
    unscorable."""
    mask = completion_mask.bool()
    return _masked(_at_least_fp32(per_token_logps.detach()) - _at_least_fp32(gen_per_token_logps), mask).sum(-1)


@torch.no_grad()
def text_truncated_weights(
    per_token_logps: torch.Tensor,
    gen_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    is_cap: float = 2.0,
) -> torch.Tensor:
    """The cross-tokenizer weight `w_i = min(exp(Σ ℓθ - Σ ℓgen), C)` ([`text_log_ratio`]) on every token of
    completion `i`, shape `(B, T)`, stop-gradient; 0 on padding and for a completion with an unscorable token. Its
    filter statistic is [`sequence_filter_statistic`] (per token of this tokenizer, so one `g` serves every row)."""
    return _sequence_weights(
        text_log_ratio(per_token_logps, gen_per_token_logps, completion_mask), completion_mask.bool(), is_cap
    )


def filter_keep_mask(advantages: torch.Tensor, filter_stat: torch.Tensor, kl_threshold: float) -> torch.Tensor:
    """`True` for completions kept; `False` where `Â <= 0` and `D > g` (a non-finite `D` exceeds any `g`)."""
    too_far = ~(filter_stat <= kl_threshold)  # NaN <= g and inf <= g are both False
    return ~((advantages <= 0) & too_far)


def survivor_scale(keep: torch.Tensor, completion_mask: torch.Tensor, loss_type: str = "grpo") -> torch.Tensor:
    """The factor that turns a zeroed filtered row into a removed one, for TRL's loss normalisers (`filter_mode=
    "remove"`). Scalar tensor.

    TRL's clipped surrogate is positively homogeneous in the advantage, so multiplying every kept row's advantage by
    `s` multiplies its loss and gradient by `s` (every TRL loss is: the clipped ones, `cispo`'s and `vespo`'s
    `-c·A·ℓθ` with `c` independent of `A`'s scale, `sapo`'s soft gate `-g(R)·A`). Removing `k` of `B` rows changes
    the normaliser: `grpo`, `dr_grpo`, `sapo` and `luspo` divide by the number of rows (`s = B / (B - k)`), `bnpo`,
    `dapo`, `cispo` and `vespo` by the number of tokens (`s = tokens / kept tokens`). Computed per micro-batch (the
    last three normalise over the whole generation batch: there it is the micro-batch's share). 1 when nothing is
    filtered, 0 when everything is.
    """
    mask = completion_mask.bool()
    if loss_type in TOKEN_NORMALISED_LOSSES:
        total, kept = mask.sum(), mask[keep].sum()
    else:
        total, kept = torch.tensor(keep.numel()), keep.sum()
    if kept == 0:
        return torch.zeros((), dtype=torch.float64, device=keep.device)
    return (total.to(torch.float64) / kept.to(torch.float64)).to(keep.device)


def quantile_threshold(
    filter_stat: torch.Tensor, advantages: torch.Tensor, candidates: torch.Tensor, target_fraction: float
) -> float | None:
    """The value of `g` that would filter `target_fraction` of the candidate rows with `Â <= 0` (their
    `1 - target_fraction` quantile of `D`; non-finite `D` counts as above any `g`), or `None` when there are none."""
    pool = filter_stat[candidates & (advantages <= 0)].to(torch.float64)
    if pool.numel() == 0:
        return None
    pool = torch.where(torch.isfinite(pool), pool, torch.full_like(pool, float("inf")))
    # "lower": a value the pool holds (interpolating towards an infinite D would give infinity).
    value = torch.quantile(pool, 1.0 - float(target_fraction), interpolation="lower").item()
    if math.isfinite(value):
        return value
    finite = pool[torch.isfinite(pool)]  # more than the target share is infinitely far: filter exactly those
    return finite.max().item() if finite.numel() else None


def update_threshold(previous: float | None, observed: float | None, momentum: float) -> float | None:
    """One step of the running threshold: an exponential moving average of the observed quantiles in log space
    (statistics span orders of magnitude), `previous` when nothing was observed."""
    if observed is None:
        return previous
    observed = max(observed, 1e-12)
    if previous is None:
        return observed
    return math.exp(momentum * math.log(previous) + (1.0 - momentum) * math.log(observed))


@dataclass
class FTISTerms:
    """Everything the clipped surrogate needs, plus the statistics worth logging. All tensors carry no gradient."""

    token_advantages: torch.Tensor
    """`w_{i,t} · Ã_i`, shape `(B, T)`; 0 on padding."""
    ratio_reference_logps: torch.Tensor
    """`ℓref` of the ratio `exp(ℓθ - ℓref)`: `ℓold` or `ℓgen`, shape `(B, T)`."""
    weights: torch.Tensor
    """The truncated importance weights `min(exp(ℓθ - ℓgen), C)`, shape `(B, T)`, computed for every variant."""
    capped: torch.Tensor
    """Where the weight hit the cap `C`, shape `(B, T)`, bool."""
    filter_statistic: torch.Tensor
    """`D_i`, shape `(B,)`."""
    keep: torch.Tensor
    """`False` for completions whose advantage the filter zeroed, shape `(B,)`, bool (all `True` unfiltered)."""


@torch.no_grad()
def ftis_terms(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    gen_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    variant: str | Variant = "f-tis",
    is_cap: float = 2.0,
    kl_threshold: float = 50.0,
    kl_reduction: str = "group_max_len",
    group_max_lengths: torch.Tensor | None = None,
    num_generations: int | None = None,
    filter_mode: str = "zero",
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    text_level: torch.Tensor | None = None,
) -> FTISTerms:
    """Turn learner, batch-time and generator log-probs into per-token advantages and a ratio reference.

    `old_per_token_logps=None` means one update per batch (`ℓold = sg ℓθ`); `gen_per_token_logps=None` means
    on-policy rows (`ℓgen = ℓold`). `advantages` has shape `(B,)`. `filter_mode="remove"` scales the kept rows by
    [`survivor_scale`] for `loss_type`, so that filtered rows leave the loss's normaliser too.
    `importance_sampling_level="sequence"` (GSPO) uses the sequence-level weight [`sequence_truncated_weights`] and
    statistic [`sequence_filter_statistic`] (`kl_reduction` does not apply there). `text_level` (bool, `(B,)`)
    marks rows re-tokenised from a peer with another tokenizer: whatever the level, they get the text-level weight
    [`text_truncated_weights`] and the sequence statistic [`sequence_filter_statistic`].
    """
    if filter_mode not in FILTER_MODES:
        raise ValueError(f"Unknown filter_mode {filter_mode!r}; expected one of {', '.join(FILTER_MODES)}.")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"Unknown importance_sampling_level {importance_sampling_level!r}; expected one of "
            f"{', '.join(IMPORTANCE_SAMPLING_LEVELS)}."
        )
    spec = variant if isinstance(variant, Variant) else parse_variant(variant)
    mask = completion_mask.bool()
    current = per_token_logps.detach()
    if old_per_token_logps is None and gen_per_token_logps is None:
        # Fully on-policy rows (ℓθ = ℓold = ℓgen exactly): w = 1, D = 0, nothing filtered. A shortcut, not an
        # approximation: it skips a dozen tensor operations per micro-batch of a trainer without peers.
        zeros = torch.zeros(advantages.shape, dtype=_at_least_fp32(current).dtype, device=current.device)
        return FTISTerms(
            token_advantages=_masked(advantages.to(current.dtype).unsqueeze(-1).expand_as(current), mask),
            ratio_reference_logps=_masked(current, mask),
            weights=mask.to(_at_least_fp32(current).dtype),
            capped=torch.zeros_like(mask),
            filter_statistic=zeros,
            keep=torch.ones_like(advantages, dtype=torch.bool),
        )
    old = current if old_per_token_logps is None else old_per_token_logps.to(current.dtype)
    gen = old if gen_per_token_logps is None else gen_per_token_logps.to(current.dtype)

    if importance_sampling_level == "sequence":
        # One log-ratio per completion gives its weight, its cap flag and its statistic (the functions above).
        log_ratio = sequence_log_ratio(current, gen, mask)
        weights = _sequence_weights(log_ratio, mask, is_cap)
        capped = mask & (log_ratio >= math.log(is_cap)).unsqueeze(-1)
        stat = _k3(-log_ratio)
    else:
        weights = truncated_importance_weights(current, gen, mask, is_cap)
        capped = mask & (current - gen >= math.log(is_cap))
        stat = filter_statistic(
            current,
            gen,
            mask,
            kl_reduction=kl_reduction,
            group_max_lengths=group_max_lengths,
            num_generations=num_generations,
        )
    if text_level is not None and bool(text_level.any()):
        text = text_level.to(mask.device).bool()
        total = text_log_ratio(current, gen, mask)
        mean = total / mask.sum(-1).clamp(min=1).to(total.dtype)
        weights = torch.where(text.unsqueeze(-1), _sequence_weights(total, mask, is_cap), weights)
        capped = torch.where(text.unsqueeze(-1), mask & (total >= math.log(is_cap)).unsqueeze(-1), capped)
        stat = torch.where(text, _k3(-mean).to(stat.dtype), stat)
    if spec.filtered:
        keep = filter_keep_mask(advantages, stat, kl_threshold)
    else:
        keep = torch.ones_like(advantages, dtype=torch.bool)

    row_advantages = torch.where(keep, advantages, torch.zeros_like(advantages)).unsqueeze(-1)
    if filter_mode == "remove" and spec.filtered and not bool(keep.all()):
        row_advantages = row_advantages * survivor_scale(keep, mask, loss_type).to(row_advantages.dtype)
    token_weights = weights if spec.truncated_weight else mask.to(weights.dtype)
    token_advantages = _masked(token_weights.to(current.dtype) * row_advantages.to(current.dtype), mask)

    reference = gen if spec.ratio_against_generator else old
    reference = torch.where(torch.isnan(reference), current, reference)  # an unscorable token gets ratio 1
    # Keep exp(ℓθ - ℓref) finite: the reference never sits more than MAX_LOG_RATIO below the current log-prob.
    reference = _masked(torch.maximum(reference, current - MAX_LOG_RATIO), mask)
    return FTISTerms(
        token_advantages=token_advantages,
        ratio_reference_logps=reference,
        weights=weights,
        capped=capped,
        filter_statistic=stat,
        keep=keep,
    )


@torch.no_grad()
def row_weights(weights: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Each completion's weight, shape `(B,)`, float32: the mean of its truncated weights (`weights`, `(B, T)`) over
    its tokens (`mask`), 0 when the filter zeroed its advantage (`keep` False) or it has no tokens. The one definition
    behind the effective sample size of the loss metrics and of [`source_ess_scale`]."""
    mask = mask.bool()
    tokens = mask.sum(-1).float()
    return torch.where(keep, _masked(weights, mask).sum(-1).float() / tokens.clamp(min=1), torch.zeros_like(tokens))


@torch.no_grad()
def source_ess_scale(row_weights: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """The per-row scale of `peer_weighting="ess"`, shape `(B,)`, dtype of `row_weights`: 1 for own rows (`source`
    0); for the rows of a peer source `s > 0`, its effective sample size fraction `ESS_s = (Σ_i w_i)² / (n_s Σ_i w_i²)`
    over its `n_s` rows' weights `w_i` ([`row_weights`]), in `[0, 1]`, and 0 when they are all 0.

    The inverse-variance heuristic: when a peer's truncated weights concentrate on few of its rows, those rows carry
    about `ESS_s` of the information of as many on-policy rows, so each is down-weighted by it against own rows."""
    if row_weights.numel() == 0:
        return row_weights.clone()
    source = source.long().to(row_weights.device)
    w = row_weights.to(torch.float64)  # squares of float32 weights neither underflow nor lose digits here
    per_row = torch.stack([torch.ones_like(w), w, w * w], dim=1)
    sums = torch.zeros(int(source.max()) + 1, 3, dtype=w.dtype, device=w.device).index_add_(0, source, per_row)
    rows, total, squares = sums.unbind(-1)
    some = squares > 0
    ess = torch.where(some, total * total / torch.where(some, rows * squares, torch.ones_like(rows)), 0.0)
    scale = torch.where(source == 0, torch.ones_like(w), ess.clamp(0.0, 1.0)[source])
    return scale.to(row_weights.dtype)


@torch.no_grad()
def ess_weighted(terms: FTISTerms, mask: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`peer_weighting="ess"`: `terms.token_advantages` with each row multiplied by its [`source_ess_scale`] (own rows
    unchanged), and `(Σ scale, rows)` over the peer rows (shape `(2,)`, float32: the trainer logs their mean). Without
    peer rows the advantages are returned as they are."""
    advantages = terms.token_advantages
    peer = source.to(advantages.device) > 0
    if not bool(peer.any()):
        return advantages, torch.zeros(2, device=advantages.device)
    scale = source_ess_scale(row_weights(terms.weights, mask, terms.keep), source)
    peer_sums = torch.stack([scale[peer].sum(), peer.sum().to(scale.dtype)]).float()
    return advantages * scale.to(advantages.dtype).unsqueeze(-1), peer_sums


def clipped_surrogate(
    per_token_logps: torch.Tensor,
    ratio_reference_logps: torch.Tensor,
    token_advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
) -> torch.Tensor:
    """`-min(R A, clip(R, 1-ε_low, 1+ε_high) A)` per token (the ratio is clipped, never the product); 0 on padding."""
    mask = completion_mask.bool()
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    current = _masked(per_token_logps, mask)
    ratio = torch.exp(current - ratio_reference_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return _masked(-torch.minimum(ratio * token_advantages, clipped * token_advantages), mask)


def grpo_aggregate(per_token_loss: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """The paper's aggregation (TRL's `loss_type="grpo"`): mean over completions of each completion's token mean."""
    mask = completion_mask.bool()
    per_row = _masked(per_token_loss, mask).sum(-1) / mask.sum(-1).clamp(min=1).to(per_token_loss.dtype)
    return per_row.mean()


def ftis_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    gen_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    num_generations: int,
    variant: str = "f-tis",
    is_cap: float = 2.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    kl_threshold: float = 50.0,
    kl_reduction: str = "group_max_len",
    group_max_lengths: torch.Tensor | None = None,
    filter_mode: str = "zero",
) -> torch.Tensor:
    """The F-TIS loss to minimise, a scalar (the `grpo` aggregation).

    Args:
        per_token_logps: `ℓθ`, shape `(B, T)`, with gradient.
        old_per_token_logps: `ℓold`, shape `(B, T)`, or `None` for one update per batch.
        gen_per_token_logps: `ℓgen`, shape `(B, T)`, or `None` for on-policy rows.
        advantages: `Â`, shape `(B,)`.
        completion_mask: 1 for completion tokens, 0 for padding, shape `(B, T)`.
        num_generations: `G`; rows are ordered in contiguous groups of `G`.
        variant: one of [`VARIANTS`].
        is_cap: `C`, the upper bound of the truncated importance weight.
        epsilon: `ε`, the ratio clipping range (`epsilon_high` overrides the upper side).
        kl_threshold: `g`, the filter threshold on `D_i`.
        kl_reduction: one of [`KL_REDUCTIONS`].
        group_max_lengths: per-row longest completion length of its group, shape `(B,)`, for rows that are not
            in contiguous groups (`num_generations` is then only used when this is `None`).
        filter_mode: one of [`FILTER_MODES`].
    """
    terms = ftis_terms(
        per_token_logps,
        old_per_token_logps,
        gen_per_token_logps,
        advantages,
        completion_mask,
        variant=variant,
        is_cap=is_cap,
        kl_threshold=kl_threshold,
        kl_reduction=kl_reduction,
        group_max_lengths=group_max_lengths,
        num_generations=num_generations,
        filter_mode=filter_mode,
    )
    per_token = clipped_surrogate(
        per_token_logps,
        terms.ratio_reference_logps,
        terms.token_advantages,
        completion_mask,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high,
    )
    return grpo_aggregate(per_token, completion_mask)
