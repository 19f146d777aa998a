"""Unit tests for :mod:`trl_ftis.objective` against hand-computed values (see docs/ftis-spec.md).

Conventions used throughout:

* ``L = -(1/B) Σ_i (1/|a_i|) Σ_t w_{i,t} · min(R Ã_i, clip(R, 1-ε, 1+ε) Ã_i)``; its gradient w.r.t. ``ℓθ_{i,t}`` is
  ``-(1/B)(1/|a_i|) w_{i,t} R_{i,t} Ã_i`` where the unclipped branch is the minimum and 0 where the clipped one is.
* Expected numbers are written out with plain :mod:`math`; the functions under test are only ever called, never
  re-implemented.
* Tensors are float64 and compared at 1e-12 (``F32``, kept for the comparisons through ``w`` or ``D``, is 1e-10).
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_ftis.objective import (
    KL_REDUCTIONS,
    VARIANTS,
    Variant,
    clipped_surrogate,
    filter_keep_mask,
    filter_statistic,
    ftis_loss,
    ftis_terms,
    group_max_len,
    grpo_aggregate,
    parse_variant,
    quantile_threshold,
    survivor_scale,
    truncated_importance_weights,
    update_threshold,
)

E = math.exp
INF = math.inf
TIGHT = {"rtol": 1e-12, "atol": 1e-12}
F32 = {"rtol": 1e-10, "atol": 1e-12}  # comparisons through w or D (computed in the inputs' precision, >= fp32)


def t64(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def bmask(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def k3(x: float) -> float:
    """Schulman's k3 for x = ℓgen - ℓθ, by hand: e^x - x - 1."""
    return math.exp(x) - x - 1.0


def loss_and_grad(logps, old, gen, advantages, mask, **kwargs):
    """Call ``ftis_loss`` on a fresh leaf copy of ``logps``; return (loss, d loss / d logps)."""
    theta = logps.clone().requires_grad_(True)
    loss = ftis_loss(theta, old, gen, advantages, mask, **kwargs)
    loss.backward()
    return loss.detach(), theta.grad


def assert_scalar(actual: torch.Tensor, expected: float, tol=TIGHT):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), **tol)


# ---------------------------------------------------------------------------------------------------------------
# The shared small batch: one group of G=2, B=2, T=3, row 1 padded at t=2 (|a_0| = 3, |a_1| = 2), A = [+1, -1].
# ℓθ - ℓgen per token: row 0 = [0.1, 1.0, -0.5], row 1 = [0.3, -0.5]; old = None (one update per batch, R = 1).
#   * vis  ratios ρ = e^d: row 0 -> e^0.1 inside [0.8, 1.2]; e^1 > 1.2 (A>0: clipped, no grad); e^-0.5 < 0.8 (A>0:
#     unclipped branch is the min) ; row 1 (A<0) -> e^0.3 > 1.2 (unclipped is the min); e^-0.5 < 0.8 (clipped).
#   * tis  weights w = min(e^d, 2): row 0 -> e^0.1, 2 (capped, e^1 > 2), e^-0.5; row 1 -> e^0.3, e^-0.5.
#   * filter: k3 at x = -d; row 0 Σ = k3(-0.1)+k3(-1)+k3(0.5) = 0.52144, row 1 Σ = k3(-0.3)+k3(0.5) = 0.18954.
#     group_max_len (L_max = 3): D = [0.17381, 0.06318]; mean: [0.17381, 0.09477]; sum: [0.52144, 0.18954].
# Padding positions hold junk (-inf / 7.0) that must never matter.
# ---------------------------------------------------------------------------------------------------------------
LOGPS = t64([[-1.0, -0.5, -2.0], [-0.3, -1.2, -INF]])
GEN = t64([[-1.1, -1.5, -1.5], [-0.6, -0.7, 7.0]])
MASK = bmask([[1, 1, 1], [1, 1, 0]])
ADV = t64([1.0, -1.0])
ROW0_K3 = k3(-0.1) + k3(-1.0) + k3(0.5)
ROW1_K3 = k3(-0.3) + k3(0.5)

# Expected (loss, gradient) for every variant on the shared batch at the default g = 50 (nothing is filtered:
# every D < 1), and with g = 0.05, which filters row 1 (A=-1, D=0.063 > g) but keeps row 0 (A=+1, D=0.174 > g).
UNFILTERED = {
    # R = 1 everywhere: L = -(1/2)(1 - 1) = 0; grad = -A_i / (B |a_i|) = -1/6 (row 0), +1/4 (row 1).
    "nois": (0.0, [[-1 / 6, -1 / 6, -1 / 6], [1 / 4, 1 / 4, 0.0]]),
    # L = -(1/2)[(1/3)(e^.1 + 1.2 + e^-.5) + (1/2)(-e^.3 - 0.8)]; grad = -(1/B)(1/|a_i|) ρ A on unclipped mins.
    "vis": (
        -(E(0.1) + 1.2 + E(-0.5)) / 6 + (E(0.3) + 0.8) / 4,
        [[-E(0.1) / 6, 0.0, -E(-0.5) / 6], [E(0.3) / 4, 0.0, 0.0]],
    ),
    # L = -(1/2)[(1/3)(e^.1 + 2 + e^-.5) - (1/2)(e^.3 + e^-.5)]; grad = -(1/B)(1/|a_i|) w A (R = 1).
    "tis": (
        -(E(0.1) + 2.0 + E(-0.5)) / 6 + (E(0.3) + E(-0.5)) / 4,
        [[-E(0.1) / 6, -2.0 / 6, -E(-0.5) / 6], [E(0.3) / 4, E(-0.5) / 4, 0.0]],
    ),
}
ROW1_FILTERED = {
    # Row 1 contributes 0 but B stays 2: L = -(1/2)(1/3)(3) = -0.5 (it would be -1 if the row were dropped).
    "nois": (-0.5, [[-1 / 6, -1 / 6, -1 / 6], [0.0, 0.0, 0.0]]),
    "vis": (-(E(0.1) + 1.2 + E(-0.5)) / 6, [[-E(0.1) / 6, 0.0, -E(-0.5) / 6], [0.0, 0.0, 0.0]]),
    "tis": (-(E(0.1) + 2.0 + E(-0.5)) / 6, [[-E(0.1) / 6, -2.0 / 6, -E(-0.5) / 6], [0.0, 0.0, 0.0]]),
}


# =============================================================================== parse_variant


@pytest.mark.parametrize(
    "name, truncated, against_gen, filtered",
    [
        ("nois", False, False, False),
        ("vis", False, True, False),
        ("tis", True, False, False),
        ("f-nois", False, False, True),
        ("f-vis", False, True, True),
        ("f-tis", True, False, True),
    ],
)
def test_parse_variant_flags(name, truncated, against_gen, filtered):
    # The spec's ablation table, row by row.
    assert parse_variant(name) == Variant(name, truncated, against_gen, filtered)


def test_parse_variant_normalises_case_underscore_and_whitespace():
    assert parse_variant(" F_TIS ").name == "f-tis"
    assert parse_variant("F-Vis").name == "f-vis"
    assert set(VARIANTS) == {"nois", "vis", "tis", "f-nois", "f-vis", "f-tis"}


@pytest.mark.parametrize("bad", ["", "ftis", "tis-f", "f-", "is", "f-f-tis", "grpo", "f tis"])
def test_parse_variant_rejects_unknown_names(bad):
    with pytest.raises(ValueError):
        parse_variant(bad)


def test_ftis_loss_rejects_unknown_variant():
    with pytest.raises(ValueError):
        ftis_loss(LOGPS, None, GEN, ADV, MASK, num_generations=2, variant="f-tiss")


# =============================================================================== group_max_len


def test_group_max_len_contiguous_groups():
    # Lengths [3, 1, 2, 0]: groups of 2 -> max(3,1)=3, max(2,0)=2; one group of 4 -> 3; groups of 1 -> lengths.
    lengths = torch.tensor([3, 1, 2, 0])
    rows = torch.arange(4)
    assert group_max_len(lengths, rows // 2).tolist() == [3, 3, 2, 2]
    assert group_max_len(lengths, rows // 4).tolist() == [3, 3, 3, 3]
    assert group_max_len(lengths, rows).tolist() == [3, 1, 2, 0]


def test_group_max_len_follows_group_membership_not_order():
    lengths = torch.tensor([3, 7, 2, 5, 4])
    groups = torch.tensor([11, -2, 11, -2, 40])  # any labels, any order
    result = group_max_len(lengths, groups)
    assert result.tolist() == [3, 7, 3, 7, 4] and result.dtype == lengths.dtype
    assert group_max_len(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)).tolist() == []


@pytest.mark.parametrize("num_generations", [3, 0, -2, 8])
def test_contiguous_groups_from_num_generations_reject_a_bad_batch_size(num_generations):
    mask = torch.ones(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="whole number of groups"):
        filter_statistic(FS_LOGPS[:, :2], FS_GEN[:, :2], mask, num_generations=num_generations)


# =============================================================================== filter_statistic

# B=4, G=2, T=3; lengths [3, 1, 2, 2], so L_max = 3 for rows 0-1 and 2 for rows 2-3. ℓθ = -1 on real tokens and
# ℓgen = ℓθ + x with x = ℓgen - ℓθ listed below; padding holds junk (ℓθ = -inf, ℓgen = 5) that must not count.
# The x = ±0.5 pair in row 0 has different k3 values, so swapping ℓθ and ℓgen would be caught.
FS_X = [[0.5, -0.5, 1.0], [2.0, 0.0, 0.0], [-1.0, 0.2, 0.0], [0.0, 0.3, 0.0]]
FS_MASK = bmask([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]])
FS_LOGPS = t64([[-1.0, -1.0, -1.0], [-1.0, -INF, -INF], [-1.0, -1.0, -INF], [-1.0, -1.0, -INF]])
FS_GEN = t64([[-0.5, -1.5, 0.0], [1.0, 5.0, 5.0], [-2.0, -0.8, 5.0], [-1.0, -0.7, 5.0]])
FS_SUMS = [
    k3(0.5) + k3(-0.5) + k3(1.0),  # (e^.5 - 1.5) + (e^-.5 - .5) + (e - 2)
    k3(2.0),  # e^2 - 3
    k3(-1.0) + k3(0.2),
    k3(0.0) + k3(0.3),
]
FS_EXPECTED = {
    "sum": FS_SUMS,
    "mean": [FS_SUMS[0] / 3, FS_SUMS[1] / 1, FS_SUMS[2] / 2, FS_SUMS[3] / 2],
    "group_max_len": [FS_SUMS[0] / 3, FS_SUMS[1] / 3, FS_SUMS[2] / 2, FS_SUMS[3] / 2],
}


@pytest.mark.parametrize("reduction", KL_REDUCTIONS)
def test_filter_statistic_reductions(reduction):
    stat = filter_statistic(FS_LOGPS, FS_GEN, FS_MASK, kl_reduction=reduction, num_generations=2)
    torch.testing.assert_close(stat.double(), t64(FS_EXPECTED[reduction]), **F32)


def test_filter_statistic_group_max_len_accepts_explicit_lengths_and_carries_no_gradient():
    # Explicit L_max = [4, 4, 4, 4] overrides the contiguous-group computation: D = Σ k3 / 4.
    theta = FS_LOGPS.clone().requires_grad_(True)
    stat = filter_statistic(theta, FS_GEN, FS_MASK, group_max_lengths=torch.tensor([4, 4, 4, 4]))
    assert not stat.requires_grad
    torch.testing.assert_close(stat.double(), t64([s / 4 for s in FS_SUMS]), **F32)


def test_filter_statistic_errors():
    with pytest.raises(ValueError):  # group_max_len needs L_max from somewhere
        filter_statistic(FS_LOGPS, FS_GEN, FS_MASK, kl_reduction="group_max_len")
    with pytest.raises(ValueError):
        filter_statistic(FS_LOGPS, FS_GEN, FS_MASK, kl_reduction="max", num_generations=2)


def test_filter_statistic_is_infinite_when_learner_is_far_below_generator():
    # ℓθ = -1e4, ℓgen = 0: x = 1e4, e^x overflows -> D = +inf (never NaN); the other direction is finite:
    # ℓθ = 0, ℓgen = -1e4: k3 = e^-1e4 + 1e4 - 1 = 9999.
    stat = filter_statistic(t64([[-1e4], [0.0]]), t64([[0.0], [-1e4]]), bmask([[1], [1]]), kl_reduction="sum")
    assert stat[0].item() == INF
    assert stat[1].item() == pytest.approx(9999.0, rel=1e-6)


# =============================================================================== truncated_importance_weights


def test_truncated_importance_weights_values_cap_and_padding():
    # ℓθ - ℓgen = [0.4, 1.5, -3.0 | 0.0, pad]: with C = 2 -> [e^.4, 2, e^-3 | 1, 0]; with C = 3 -> e^1.5 > 3 -> 3.
    logps = t64([[-1.0, -0.5, -4.0], [-2.0, -INF, -INF]])
    gen = t64([[-1.4, -2.0, -1.0], [-2.0, -INF, 3.0]])
    mask = bmask([[1, 1, 1], [1, 0, 0]])
    w2 = truncated_importance_weights(logps, gen, mask)  # default C = 2.0
    w3 = truncated_importance_weights(logps, gen, mask, is_cap=3.0)
    torch.testing.assert_close(w2.double(), t64([[E(0.4), 2.0, E(-3.0)], [1.0, 0.0, 0.0]]), **F32)
    torch.testing.assert_close(w3.double(), t64([[E(0.4), 3.0, E(-3.0)], [1.0, 0.0, 0.0]]), **F32)


def test_truncated_importance_weights_extremes_and_no_gradient():
    # ℓθ - ℓgen = +1e4 -> C (no overflow); -1e4 -> 0; an unscorable (NaN) generator log-prob -> 0.
    theta = t64([[0.0, -1e4, -1.0]]).requires_grad_(True)
    w = truncated_importance_weights(theta, t64([[-1e4, 0.0, math.nan]]), bmask([[1, 1, 1]]))
    assert not w.requires_grad
    torch.testing.assert_close(w.double(), t64([[2.0, 0.0, 0.0]]), **F32)


# =============================================================================== filter_keep_mask


def test_filter_keep_mask_truth_table():
    # Filtered only when A <= 0 AND D > g (g = 50); D = g is not "> g"; inf and NaN count as above any g.
    adv = t64([1.0, -1.0, 0.0, -0.5, 2.0, -2.0, -1.0, 3.0, -1.0])
    stat = t64([100.0, 100.0, 100.0, 10.0, INF, math.nan, 50.0, math.nan, INF])
    keep = filter_keep_mask(adv, stat, 50.0)
    assert keep.tolist() == [True, False, False, True, True, False, True, True, False]


# =============================================================================== clipped_surrogate / grpo_aggregate


def test_clipped_surrogate_clips_the_ratio_on_both_sides():
    # Per token -min(R A, clip(R, .8, 1.2) A) with R = e^{ℓθ - ℓref}, each of the four PPO cases once:
    #   A=+2, R=e^.3 (>1.2): -2.4, grad 0      | A=+2, R=e^-.3 (<.8): -2e^-.3, grad -2e^-.3
    #   A=-2, R=e^.3 (>1.2): +2e^.3, grad 2e^.3 | A=-2, R=e^-.3 (<.8): +1.6, grad 0     (+ one padded token)
    theta = t64([[-1.0, -1.0, -INF], [-0.5, -0.5, -INF]]).requires_grad_(True)
    ref = t64([[-1.3, -0.7, 0.0], [-0.8, -0.2, 0.0]])
    adv = t64([[2.0, 2.0, 0.0], [-2.0, -2.0, 0.0]])
    mask = bmask([[1, 1, 0], [1, 1, 0]])
    out = clipped_surrogate(theta, ref, adv, mask)
    torch.testing.assert_close(out.detach(), t64([[-2.4, -2 * E(-0.3), 0.0], [2 * E(0.3), 1.6, 0.0]]), **TIGHT)
    out.sum().backward()
    torch.testing.assert_close(theta.grad, t64([[0.0, -2 * E(-0.3), 0.0], [2 * E(0.3), 0.0, 0.0]]), **TIGHT)


def test_clipped_surrogate_epsilon_high():
    # R = e^0.2 = 1.2214, A = 1: symmetric ε = .2 clips it (value -1.2, grad 0); ε_high = .28 does not
    # (value and grad -e^0.2); ε_low = .1 moves the lower bound: R = e^-0.15 = 0.861 < 0.9, A=-1 -> +0.9, grad 0.
    mask = bmask([[1, 1]])
    ref = t64([[-1.2, -0.85]])
    adv = t64([[1.0, -1.0]])
    for kwargs, value, grad in [
        ({}, [-1.2, E(-0.15)], [0.0, E(-0.15)]),
        ({"epsilon_high": 0.28}, [-E(0.2), E(-0.15)], [-E(0.2), E(-0.15)]),
        ({"epsilon_low": 0.1, "epsilon_high": 0.28}, [-E(0.2), 0.9], [-E(0.2), 0.0]),
    ]:
        theta = t64([[-1.0, -1.0]]).requires_grad_(True)
        out = clipped_surrogate(theta, ref, adv, mask, **kwargs)
        torch.testing.assert_close(out.detach(), t64([value]), **TIGHT)
        out.sum().backward()
        torch.testing.assert_close(theta.grad, t64([grad]), **TIGHT)


def test_grpo_aggregate_mean_of_token_means():
    # Row means (1+2+3)/3 = 2 and (4+5)/2 = 4.5 -> (2 + 4.5)/2 = 3.25; junk (inf) on padding is ignored.
    per_token = t64([[1.0, 2.0, 3.0], [4.0, 5.0, INF]])
    torch.testing.assert_close(grpo_aggregate(per_token, bmask([[1, 1, 1], [1, 1, 0]])), t64(3.25), **TIGHT)
    # An empty row counts in B with 0: (1.5 + 0)/2 = 0.75 (not 1.5).
    per_token = t64([[1.0, 2.0], [7.0, 7.0]])
    torch.testing.assert_close(grpo_aggregate(per_token, bmask([[1, 1], [0, 0]])), t64(0.75), **TIGHT)


# =============================================================================== ftis_terms


def test_ftis_terms_f_tis_on_shared_batch():
    # g = 0.05 filters row 1 (A<0, D=0.063) and keeps row 0 (A>0, D=0.174 > g).
    # token_advantages = w·Ã: row 0 = [e^.1, 2, e^-.5]·1, row 1 = 0 (filtered); ratio reference = sg ℓθ (old=None),
    # 0 on padding; capped only where e^d >= 2 (row 0, t=1).
    theta = LOGPS.clone().requires_grad_(True)
    terms = ftis_terms(theta, None, GEN, ADV, MASK, variant="f-tis", kl_threshold=0.05, num_generations=2)
    torch.testing.assert_close(terms.token_advantages, t64([[E(0.1), 2.0, E(-0.5)], [0.0, 0.0, 0.0]]), **F32)
    torch.testing.assert_close(terms.ratio_reference_logps, t64([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]), **TIGHT)
    assert terms.keep.tolist() == [True, False]
    assert terms.capped.tolist() == [[False, True, False], [False, False, False]]
    torch.testing.assert_close(terms.weights.double(), t64([[E(0.1), 2.0, E(-0.5)], [E(0.3), E(-0.5), 0.0]]), **F32)
    torch.testing.assert_close(terms.filter_statistic.double(), t64([ROW0_K3 / 3, ROW1_K3 / 3]), **F32)
    for name in ("token_advantages", "ratio_reference_logps", "weights", "filter_statistic"):
        assert not getattr(terms, name).requires_grad, name


def test_ftis_terms_per_variant_references_and_advantages():
    # vis: reference ℓgen, advantages A·mask; nois (with ℓold given): reference ℓold; tis: w·A; padding always 0.
    old = t64([[-1.05, -0.45, -2.1], [-0.25, -1.3, -INF]])
    vis = ftis_terms(LOGPS, old, GEN, ADV, MASK, variant="vis", num_generations=2)
    torch.testing.assert_close(vis.ratio_reference_logps, t64([[-1.1, -1.5, -1.5], [-0.6, -0.7, 0.0]]), **TIGHT)
    torch.testing.assert_close(vis.token_advantages, t64([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]), **TIGHT)
    nois = ftis_terms(LOGPS, old, GEN, ADV, MASK, variant="nois", num_generations=2)
    torch.testing.assert_close(nois.ratio_reference_logps, t64([[-1.05, -0.45, -2.1], [-0.25, -1.3, 0.0]]), **TIGHT)
    torch.testing.assert_close(nois.token_advantages, t64([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]), **TIGHT)
    tis = ftis_terms(LOGPS, old, GEN, ADV, MASK, variant="tis", kl_threshold=0.05, num_generations=2)
    assert tis.keep.tolist() == [True, True]  # unfiltered variant: the threshold is ignored
    torch.testing.assert_close(tis.token_advantages, t64([[E(0.1), 2.0, E(-0.5)], [-E(0.3), -E(-0.5), 0.0]]), **F32)


def test_ftis_terms_ratio_reference_is_kept_within_max_log_ratio():
    # Documented guard: ℓref never sits more than 20 nats below ℓθ, so R <= e^20 stays finite (vis: ℓgen = -1e4).
    terms = ftis_terms(
        t64([[0.0, -1.0]]), None, t64([[-1e4, -1.5]]), t64([1.0]), bmask([[1, 1]]), variant="vis", num_generations=1
    )
    torch.testing.assert_close(terms.ratio_reference_logps, t64([[-20.0, -1.5]]), **TIGHT)


# =============================================================================== ftis_loss: every variant


@pytest.mark.parametrize("variant", ["nois", "vis", "tis", "f-nois", "f-vis", "f-tis"])
def test_ftis_loss_each_variant_default_threshold(variant):
    # g = 50: nothing filtered, so f-X equals X; values and gradients from UNFILTERED (see the batch comment).
    expected_loss, expected_grad = UNFILTERED[variant.removeprefix("f-")]
    loss, grad = loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, variant=variant)
    assert_scalar(loss, expected_loss, F32)
    torch.testing.assert_close(grad, t64(expected_grad), **F32)


@pytest.mark.parametrize("variant", ["nois", "vis", "tis", "f-nois", "f-vis", "f-tis"])
def test_ftis_loss_each_variant_with_row_filtered(variant):
    # g = 0.05: the f-variants zero row 1's advantage (A=-1, D=0.063 > g), keep row 0 (A=+1, D=0.174 > g) and still
    # divide by B = 2; the unfiltered variants ignore g.
    base = variant.removeprefix("f-")
    expected_loss, expected_grad = (ROW1_FILTERED if variant.startswith("f-") else UNFILTERED)[base]
    loss, grad = loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, variant=variant, kl_threshold=0.05)
    assert_scalar(loss, expected_loss, F32)
    torch.testing.assert_close(grad, t64(expected_grad), **F32)


def test_ftis_loss_default_variant_is_f_tis():
    loss, grad = loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, kl_threshold=0.05)
    assert_scalar(loss, ROW1_FILTERED["tis"][0], F32)
    torch.testing.assert_close(grad, t64(ROW1_FILTERED["tis"][1]), **F32)


def test_ftis_loss_filtered_row_keeps_its_place_in_denominators():
    # f-nois, B=4 (G=2), lengths [2, 1, 2, 2], A = [1, -1, 0.5, -2]; row 1 filtered (ℓθ=-1e4 vs ℓgen=0 -> D=inf).
    # Kept rows: R = 1, so L = -(1/4)(1 + 0 + 0.5 - 2) = 0.125 (dropping row 1 would give -(1/3)(-0.5) = 1/6).
    # grad = -A_i/(4|a_i|): row 0 -1/8, row 1 0, row 2 -1/16, row 3 +1/4.
    logps = t64([[-0.5, -0.7], [-1e4, -INF], [-0.2, -0.9], [-1.1, -0.4]])
    gen = t64([[-0.5, -0.7], [0.0, -INF], [-0.2, -0.9], [-1.1, -0.4]])
    mask = bmask([[1, 1], [1, 0], [1, 1], [1, 1]])
    adv = t64([1.0, -1.0, 0.5, -2.0])
    loss, grad = loss_and_grad(logps, None, gen, adv, mask, num_generations=2, variant="f-nois")
    assert_scalar(loss, 0.125)
    torch.testing.assert_close(grad, t64([[-1 / 8, -1 / 8], [0.0, 0.0], [-1 / 16, -1 / 16], [0.25, 0.25]]), **TIGHT)


def test_ftis_loss_remove_mode_averages_over_the_survivors():
    # The batch above with filter_mode="remove" (the authors' code): row 1 leaves the loss and its normaliser, so
    # L = -(1/3)(1 + 0.5 - 2) = 1/6 and grad = -A_i/(3|a_i|): row 0 -1/6, row 2 -1/12, row 3 +1/3.
    logps = t64([[-0.5, -0.7], [-1e4, -INF], [-0.2, -0.9], [-1.1, -0.4]])
    gen = t64([[-0.5, -0.7], [0.0, -INF], [-0.2, -0.9], [-1.1, -0.4]])
    mask = bmask([[1, 1], [1, 0], [1, 1], [1, 1]])
    adv = t64([1.0, -1.0, 0.5, -2.0])
    loss, grad = loss_and_grad(logps, None, gen, adv, mask, num_generations=2, variant="f-nois", filter_mode="remove")
    assert_scalar(loss, 1 / 6)
    torch.testing.assert_close(grad, t64([[-1 / 6, -1 / 6], [0.0, 0.0], [-1 / 12, -1 / 12], [1 / 3, 1 / 3]]), **TIGHT)
    # The shared batch, f-tis with g = 0.05: row 0 alone, B = 1: L = -(1/3)(e^.1 + 2 + e^-.5).
    loss, grad = loss_and_grad(
        LOGPS, None, GEN, ADV, MASK, num_generations=2, kl_threshold=0.05, filter_mode="remove"
    )
    assert_scalar(loss, -(E(0.1) + 2.0 + E(-0.5)) / 3, F32)
    torch.testing.assert_close(grad, t64([[-E(0.1) / 3, -2.0 / 3, -E(-0.5) / 3], [0.0, 0.0, 0.0]]), **F32)
    # Nothing filtered: both modes are the same loss.
    same = [
        loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, filter_mode=m)[0] for m in ("zero", "remove")
    ]
    assert same[0] == same[1]
    with pytest.raises(ValueError, match="filter_mode"):
        ftis_loss(LOGPS, None, GEN, ADV, MASK, num_generations=2, filter_mode="drop")


def test_survivor_scale_per_loss_normaliser():
    keep = bmask([True, False, True, True])
    mask = bmask([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])  # 2, 3, 1, 2 tokens
    assert survivor_scale(keep, mask, "grpo").item() == pytest.approx(4 / 3)  # rows
    assert survivor_scale(keep, mask, "dr_grpo").item() == pytest.approx(4 / 3)
    assert survivor_scale(keep, mask, "bnpo").item() == pytest.approx(8 / 5)  # tokens
    assert survivor_scale(keep, mask, "dapo").item() == pytest.approx(8 / 5)
    assert survivor_scale(bmask([False] * 4), mask, "grpo").item() == 0.0
    assert survivor_scale(bmask([True] * 4), mask, "bnpo").item() == 1.0


def test_quantile_threshold_and_its_running_average():
    stat = t64([1.0, 2.0, 3.0, 4.0, 5.0, 100.0, INF])
    adv = t64([-1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0])  # row 5 is positive: never a candidate for the filter
    peers = bmask([True] * 7)
    # Negative rows' D: 1 2 3 4 5 inf; filtering a third of them: the lower 2/3 quantile is 4 (D > 4: 5 and inf).
    assert quantile_threshold(stat, adv, peers, 1 / 3) == 4.0
    assert quantile_threshold(stat, adv, bmask([True] * 3 + [False] * 4), 0.5) == 2.0  # own rows do not count
    assert quantile_threshold(stat, adv, bmask([False] * 7), 0.1) is None
    # More than the target share is infinitely far: g becomes the largest finite D (only the infinite are filtered).
    assert quantile_threshold(t64([1.0, INF, INF]), t64([-1.0, -1.0, -1.0]), bmask([True] * 3), 0.1) == 1.0
    assert quantile_threshold(t64([INF]), t64([-1.0]), bmask([True]), 0.1) is None
    assert update_threshold(None, 7.0, 0.9) == 7.0
    assert update_threshold(10.0, None, 0.9) == 10.0
    assert update_threshold(10.0, 1000.0, 0.5) == pytest.approx(100.0)  # geometric mean at momentum 0.5


# =============================================================================== ftis_loss: the ratio clip


def test_ftis_loss_clips_ratio_not_product_for_large_advantage():
    # num_iterations > 1: ℓold = ℓθ - 0.1, so R = e^0.1 = 1.105 (inside [0.8, 1.2]) and A = 2 > 1+ε.
    # Clipping the ratio keeps the gradient: L = -R·A = -2e^0.1, grad = -2e^0.1 on both tokens of the row / |a|=2.
    # (Clipping the product R·A = 2.21 at 1.2 would give grad 0.)  B = 1, G = 1.
    logps = t64([[-1.0, -0.6]])
    old = t64([[-1.1, -0.7]])
    loss, grad = loss_and_grad(logps, old, None, t64([2.0]), bmask([[1, 1]]), num_generations=1, variant="nois")
    assert_scalar(loss, -2 * E(0.1))
    torch.testing.assert_close(grad, t64([[-E(0.1), -E(0.1)]]), **TIGHT)


@pytest.mark.parametrize("variant", ["nois", "f-nois"])
def test_ftis_loss_ratio_clip_both_sides_with_min(variant):
    # B=2 (G=2), T=2; R = e^{ℓθ-ℓold}; row 0 A=+2: R=e^.3 -> clipped 2.4 (grad 0), R=e^-.3 -> 2e^-.3 (grad);
    # row 1 A=-2: R=e^.3 -> -2e^.3 (grad), R=e^-.3 -> clipped -1.6 (grad 0).
    # L = -(1/2)[(2.4 + 2e^-.3)/2 + (-2e^.3 - 1.6)/2]; grad = -(1/2)(1/2)·R·A on the unclipped tokens.
    logps = t64([[-1.0, -1.0], [-0.5, -0.5]])
    old = t64([[-1.3, -0.7], [-0.8, -0.2]])
    loss, grad = loss_and_grad(
        logps, old, None, t64([2.0, -2.0]), bmask([[1, 1], [1, 1]]), num_generations=2, variant=variant
    )
    assert_scalar(loss, -(2.4 + 2 * E(-0.3) - 2 * E(0.3) - 1.6) / 4, F32)
    torch.testing.assert_close(grad, t64([[0.0, -E(-0.3) / 2], [E(0.3) / 2, 0.0]]), **F32)


def test_ftis_loss_epsilon_parameters():
    # ε = 0.5 puts R = e^.3 (1.35) and e^-.3 (0.74) inside [0.5, 1.5]: no clipping at all on the batch above:
    # L = -(1/4)(2e^.3 + 2e^-.3 - 2e^.3 - 2e^-.3) = 0, grad = -R·A/4 everywhere.
    logps = t64([[-1.0, -1.0], [-0.5, -0.5]])
    old = t64([[-1.3, -0.7], [-0.8, -0.2]])
    args = (logps, old, None, t64([2.0, -2.0]), bmask([[1, 1], [1, 1]]))
    loss, grad = loss_and_grad(*args, num_generations=2, variant="nois", epsilon=0.5)
    assert_scalar(loss, 0.0)
    torch.testing.assert_close(grad, t64([[-E(0.3) / 2, -E(-0.3) / 2], [E(0.3) / 2, E(-0.3) / 2]]), **TIGHT)
    # epsilon_high = 0.5 alone releases only the upper clip: row 0 token 0 now -R·A/4, row 1 token 1 stays clipped.
    loss, grad = loss_and_grad(*args, num_generations=2, variant="nois", epsilon_high=0.5)
    assert_scalar(loss, -(2 * E(0.3) + 2 * E(-0.3) - 2 * E(0.3) - 1.6) / 4)
    torch.testing.assert_close(grad, t64([[-E(0.3) / 2, -E(-0.3) / 2], [E(0.3) / 2, 0.0]]), **TIGHT)


# =============================================================================== ftis_loss: truncated weights


@pytest.mark.parametrize("variant", ["tis", "f-tis"])
def test_ftis_loss_weight_is_truncated_and_stop_gradient(variant):
    # ℓθ, ℓold, ℓgen all differ.  Row 0 (A=1.5): t0 R=e^.1, w=e^.4; t1 R=e^-.1, w=min(e^1.5, 2)=2.
    # Row 1 (A=-.5, |a|=1): R=e^-.3 < .8 -> clipped branch -.4 is the min (grad 0), w=e^-.1.
    # L = -(1/2)[(1/2)(1.5 e^.4 e^.1 + 1.5·2 e^-.1) + e^-.1·(-.4)]
    # grad = w · d(surrogate) only: row 0 -(1/4)(1.5)[e^.4 e^.1, 2 e^-.1]; through a live w it would be doubled.
    logps = t64([[-1.0, -0.5], [-2.0, -INF]])
    old = t64([[-1.1, -0.4], [-1.7, -INF]])
    gen = t64([[-1.4, -2.0], [-1.9, -INF]])
    mask = bmask([[1, 1], [1, 0]])
    loss, grad = loss_and_grad(logps, old, gen, t64([1.5, -0.5]), mask, num_generations=2, variant=variant)
    assert_scalar(loss, -0.5 * (0.75 * (E(0.5) + 2 * E(-0.1)) - 0.4 * E(-0.1)), F32)
    torch.testing.assert_close(grad, t64([[-0.375 * E(0.5), -0.75 * E(-0.1)], [0.0, 0.0]]), **F32)


def test_ftis_loss_is_cap_parameter():
    # C = 3: row 0 t1 has e^1 = 2.718 < 3, so it is no longer truncated (w = e instead of 2).
    # L = -(1/6)(e^.1 + e + e^-.5) + (1/4)(e^.3 + e^-.5).
    loss, grad = loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, variant="tis", is_cap=3.0)
    assert_scalar(loss, -(E(0.1) + E(1.0) + E(-0.5)) / 6 + (E(0.3) + E(-0.5)) / 4, F32)
    torch.testing.assert_close(
        grad, t64([[-E(0.1) / 6, -E(1.0) / 6, -E(-0.5) / 6], [E(0.3) / 4, E(-0.5) / 4, 0.0]]), **F32
    )


# =============================================================================== ftis_loss: the filter


@pytest.mark.parametrize(
    "reduction, threshold, row1_kept",
    [
        # Row 1 (A=-1): D = 0.0632 (group_max_len, /3), 0.0948 (mean, /2), 0.1895 (sum); row 0 has A>0: always kept.
        ("group_max_len", 0.08, True),
        ("mean", 0.08, False),
        ("sum", 0.08, False),
        ("group_max_len", 0.15, True),
        ("mean", 0.15, True),
        ("sum", 0.15, False),
        ("sum", 0.19, True),
    ],
)
def test_ftis_loss_kl_reduction(reduction, threshold, row1_kept):
    # f-nois: kept -> L = 0 (the nois value), filtered -> L = -0.5.
    expected_loss, expected_grad = (UNFILTERED if row1_kept else ROW1_FILTERED)["nois"]
    loss, grad = loss_and_grad(
        LOGPS,
        None,
        GEN,
        ADV,
        MASK,
        num_generations=2,
        variant="f-nois",
        kl_threshold=threshold,
        kl_reduction=reduction,
    )
    assert_scalar(loss, expected_loss)
    torch.testing.assert_close(grad, t64(expected_grad), **TIGHT)


def test_ftis_loss_group_max_len_uses_num_generations():
    # With G = 1 each row is its own group, so row 1's L_max is 2 and D = 0.0948 > 0.08: filtered (L = -0.5);
    # with G = 2 its L_max is 3 and D = 0.0632 <= 0.08: kept (L = 0).
    kwargs = {"variant": "f-nois", "kl_threshold": 0.08}
    assert_scalar(loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=1, **kwargs)[0], -0.5)
    assert_scalar(loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, **kwargs)[0], 0.0)
    with pytest.raises(ValueError):
        ftis_loss(LOGPS, None, GEN, ADV, MASK, num_generations=3, variant="f-nois")


@pytest.mark.parametrize("variant", ["f-nois", "f-tis", "f-vis"])
def test_ftis_loss_non_finite_statistic_filters_only_negative_advantage(variant):
    # Both rows: ℓθ = [-1e4, -1], ℓgen = [0, -1] -> k3 = e^1e4 - ... = inf -> D = inf for both rows.
    # Row 1 (A=-1) is filtered; row 0 (A=+1) is kept although it is far off-policy.
    #   f-nois: L = -(1/2)(1/2)(1 + 1) = -0.5, grad row 0 = -1/4 each.
    #   f-tis:  w = [e^-1e4 = 0, 1] -> L = -(1/2)(1/2)(0 + 1) = -0.25, grad row 0 = [0, -1/4].
    #   f-vis:  ρ = [e^-1e4 = 0, 1], A>0 -> min(0, .8) = 0 -> L = -0.25, grad row 0 = [-(1/4)·0 = 0, -1/4].
    logps = t64([[-1e4, -1.0], [-1e4, -1.0]])
    gen = t64([[0.0, -1.0], [0.0, -1.0]])
    mask = bmask([[1, 1], [1, 1]])
    adv = t64([1.0, -1.0])
    terms = ftis_terms(logps, None, gen, adv, mask, variant=variant, num_generations=2)
    assert terms.filter_statistic.tolist() == [INF, INF]
    assert terms.keep.tolist() == [True, False]
    expected = {"f-nois": (-0.5, [-0.25, -0.25]), "f-tis": (-0.25, [0.0, -0.25]), "f-vis": (-0.25, [0.0, -0.25])}
    loss, grad = loss_and_grad(logps, None, gen, adv, mask, num_generations=2, variant=variant)
    assert_scalar(loss, expected[variant][0])
    torch.testing.assert_close(grad, t64([expected[variant][1], [0.0, 0.0]]), **TIGHT)


# =============================================================================== ftis_loss: extremes and padding

# B=2 (G=2), T=3, -inf on every padded position of ℓθ, ℓold and ℓgen.
# Row 0 (A=-1): ℓθ = [-1e4, -1], ℓgen = [0, -1] -> D = inf (filtered by the f-variants); w = [0, 1]; ρ = [0, 1].
# Row 1 (A=+1): on-policy, ℓθ = ℓold = ℓgen = [-.5, -.5] -> R = w = ρ = 1.
# Hand values (grad row 0 / row 1 per real token, B=2, |a|=2):
#   nois:  L = -(1/2)[(1/2)(-2) + (1/2)(2)] = 0            grad [.25, .25] / [-.25, -.25]
#   tis:   L = -(1/2)[(1/2)(0 - 1) + 1] = -0.25             grad [0, .25]  / [-.25, -.25]
#   vis:   row 0 t0: min(0·-1, .8·-1) = -.8 (clipped, grad 0) -> L = -(1/2)[(-.8 - 1)/2 + 1] = -0.05
#                                                            grad [0, .25]  / [-.25, -.25]
#   f-*:   row 0 filtered -> L = -(1/2)(1) = -0.5           grad [0, 0]    / [-.25, -.25]
EXT_LOGPS = t64([[-1e4, -1.0, -INF], [-0.5, -0.5, -INF]])
EXT_OLD = t64([[-1e4, -1.0, -INF], [-0.5, -0.5, -INF]])
EXT_GEN = t64([[0.0, -1.0, -INF], [-0.5, -0.5, -INF]])
EXT_MASK = bmask([[1, 1, 0], [1, 1, 0]])
EXT_ADV = t64([-1.0, 1.0])
EXT_EXPECTED = {
    "nois": (0.0, [[0.25, 0.25, 0.0], [-0.25, -0.25, 0.0]]),
    "tis": (-0.25, [[0.0, 0.25, 0.0], [-0.25, -0.25, 0.0]]),
    "vis": (-0.05, [[0.0, 0.25, 0.0], [-0.25, -0.25, 0.0]]),
    "f-nois": (-0.5, [[0.0, 0.0, 0.0], [-0.25, -0.25, 0.0]]),
    "f-tis": (-0.5, [[0.0, 0.0, 0.0], [-0.25, -0.25, 0.0]]),
    "f-vis": (-0.5, [[0.0, 0.0, 0.0], [-0.25, -0.25, 0.0]]),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("old", [None, EXT_OLD], ids=["old=None", "old=given"])
def test_ftis_loss_extreme_logps_and_inf_padding(variant, old):
    loss, grad = loss_and_grad(EXT_LOGPS, old, EXT_GEN, EXT_ADV, EXT_MASK, num_generations=2, variant=variant)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert_scalar(loss, EXT_EXPECTED[variant][0], F32)
    torch.testing.assert_close(grad, t64(EXT_EXPECTED[variant][1]), **F32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_ftis_loss_finite_when_learner_far_above_reference(variant):
    # The opposite extreme: ℓθ = 0 with ℓold = ℓgen = -1e4 (R would be e^1e4 without the reference guard).
    # A<0 rows make the unclipped branch R·A the minimum: the loss may be huge but must stay finite.
    logps = t64([[0.0, -1.0], [0.0, -INF]])
    ref = t64([[-1e4, -1.0], [-1e4, -INF]])
    for old, gen in [(ref, None), (None, ref), (ref, ref)]:
        loss, grad = loss_and_grad(
            logps, old, gen, t64([-1.0, 1.0]), bmask([[1, 1], [1, 0]]), num_generations=2, variant=variant
        )
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), (old is None, gen is None)
        assert grad[1, 1].item() == 0.0


# =============================================================================== ftis_loss: zero advantages


@pytest.mark.parametrize("variant", VARIANTS)
def test_ftis_loss_zero_advantage_groups_give_exactly_zero_gradient(variant):
    # All-equal rewards -> Â = 0 for every row: loss 0 and gradient exactly 0, even off-policy and with extremes.
    logps = t64([[-1e4, -1.0, -INF], [-0.3, -2.0, -0.7], [0.0, -0.2, -INF], [-5.0, -0.1, -0.4]])
    old = t64([[-1e4, -1.3, -INF], [-0.1, -2.5, -0.4], [-1e4, -0.1, -INF], [-4.0, -0.2, -0.4]])
    gen = t64([[0.0, -0.9, -INF], [-0.6, -1.0, -0.7], [-1e4, -0.9, -INF], [-1.0, -3.0, -0.1]])
    mask = bmask([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    loss, grad = loss_and_grad(
        logps, old, gen, torch.zeros(4, dtype=torch.float64), mask, num_generations=2, variant=variant
    )
    assert loss.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))


# =============================================================================== ftis_loss: None defaults


@pytest.mark.parametrize("variant", VARIANTS)
def test_ftis_loss_old_none_means_detached_current(variant):
    # old = None must equal passing ℓold = sg ℓθ explicitly (value and gradient), and matches the hand values.
    expected_loss, expected_grad = UNFILTERED[variant.removeprefix("f-")]
    loss_none, grad_none = loss_and_grad(LOGPS, None, GEN, ADV, MASK, num_generations=2, variant=variant)
    loss_given, grad_given = loss_and_grad(LOGPS, LOGPS.clone(), GEN, ADV, MASK, num_generations=2, variant=variant)
    assert_scalar(loss_none, expected_loss, F32)
    torch.testing.assert_close(grad_none, t64(expected_grad), **F32)
    torch.testing.assert_close(loss_given, loss_none, **TIGHT)
    torch.testing.assert_close(grad_given, grad_none, **TIGHT)


def test_ftis_loss_gen_none_means_gen_equals_old():
    # ℓθ = [-1, -0.5], ℓold = [-1.1, -0.6]; A = 1, B = 1, |a| = 2.  With ℓgen = ℓold:
    #   tis: w = R = e^0.1 -> L = -e^0.2, grad = -(1/2) e^0.2 per token (w is stop-gradient).
    #   vis: ρ = e^{ℓθ-ℓgen} = e^0.1 -> L = -e^0.1, grad -(1/2) e^0.1.
    #   filter: x = ℓgen - ℓθ = -0.1 on both tokens, D = 2·k3(-0.1)/2 = 0.00484 > g = 0, so A = -1 is filtered.
    logps = t64([[-1.0, -0.5]])
    old = t64([[-1.1, -0.6]])
    args = (logps, old, None, t64([1.0]), bmask([[1, 1]]))
    loss, grad = loss_and_grad(*args, num_generations=1, variant="tis")
    assert_scalar(loss, -E(0.2), F32)
    torch.testing.assert_close(grad, t64([[-E(0.2) / 2, -E(0.2) / 2]]), **F32)
    loss, grad = loss_and_grad(*args, num_generations=1, variant="vis")
    assert_scalar(loss, -E(0.1))
    torch.testing.assert_close(grad, t64([[-E(0.1) / 2, -E(0.1) / 2]]), **TIGHT)
    terms = ftis_terms(
        logps, old, None, t64([-1.0]), bmask([[1, 1]]), variant="f-nois", kl_threshold=0.0, num_generations=1
    )
    torch.testing.assert_close(terms.filter_statistic.double(), t64([k3(-0.1)]), **F32)
    assert terms.keep.tolist() == [False]  # A = -1 and D > 0: filtered, proving D was computed against ℓold


def test_ftis_loss_both_none_is_on_policy_grpo():
    # ℓold = sg ℓθ, ℓgen = ℓold: R = w = 1, D = 0 -> every variant is -(1/B) Σ A_i with grad -A_i/(B|a_i|).
    for variant in VARIANTS:
        loss, grad = loss_and_grad(LOGPS, None, None, ADV, MASK, num_generations=2, variant=variant, kl_threshold=0.0)
        assert_scalar(loss, 0.0, F32)
        torch.testing.assert_close(grad, t64(UNFILTERED["nois"][1]), **F32)


# =============================================================================== ftis_loss: what a peer can send

PEER_EXTREMES = [-0.0, 1e-4, -1e-45, -1e30, -3.4028234663852886e38, -INF]  # -0.0, MAX_LOGP, ..., float32 -inf


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("advantage", [1.0, 1e7], ids=["unit", "max-peer-advantage"])
def test_ftis_loss_is_finite_for_every_generator_log_prob_a_peer_can_send(variant, dtype, advantage):
    """Generator log-probs are constants received from peers: every value a peer row can carry into the float32
    batch (up to `MAX_LOGP` above 0, down to float32 `-inf`) with advantages up to
    `peer_rows.MAX_ABS_ADVANTAGE` in magnitude gives a finite loss and finite gradients, for every variant, in fp32
    and for a bf16 learner."""
    n = len(PEER_EXTREMES)
    gen = torch.tensor([PEER_EXTREMES, PEER_EXTREMES[::-1]], dtype=torch.float32)
    logps = torch.tensor([[-0.5 - 0.1 * k for k in range(n)], [-3.0 + 0.2 * k for k in range(n)]], dtype=dtype)
    theta = logps.clone().requires_grad_(True)
    advantages = torch.tensor([advantage, -advantage], dtype=torch.float32)
    mask = torch.ones(2, n, dtype=torch.bool)
    for old in (None, logps.detach().float() - 0.3):
        theta.grad = None
        loss = ftis_loss(theta, old, gen, advantages, mask, num_generations=2, variant=variant)
        loss.backward()
        assert torch.isfinite(loss), (variant, loss)
        assert torch.isfinite(theta.grad).all(), (variant, theta.grad)
