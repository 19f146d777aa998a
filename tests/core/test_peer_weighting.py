"""`peer_weighting="ess"`: each peer's rows' advantages times that peer's effective sample size fraction in the
micro-batch (`trl_ftis.objective.source_ess_scale`), checked against hand-computed values; `"none"` (the default)
leaves the loss exactly as F-TIS makes it."""

import math

import pytest
import torch
from tiny_trainers import tiny_trainer  # tests/ is on sys.path

from trl_ftis import FTISConfig
from trl_ftis.objective import FTISTerms, ess_weighted, ftis_terms, row_weights, source_ess_scale


# --------------------------------------------------------------------------------------------------------------------
# The pure functions
# --------------------------------------------------------------------------------------------------------------------
def test_source_ess_scale_by_hand():
    # Source 1: w = (1, 0.5, 0): (1.5)² / (3 · 1.25) = 0.6. Source 2: w = (2, 2): 16 / (2 · 8) = 1. Own rows: 1.
    scale = source_ess_scale(torch.tensor([1.0, 1.0, 0.5, 0.0, 2.0, 2.0]), torch.tensor([0, 1, 1, 1, 2, 2]))
    torch.testing.assert_close(scale, torch.tensor([1.0, 0.6, 0.6, 0.6, 1.0, 1.0]))
    assert scale.dtype == torch.float32


def test_source_ess_scale_edge_cases():
    # A source whose weights are all 0 (every row filtered) gets 0; the own rows' weights never matter.
    scale = source_ess_scale(torch.tensor([0.0, 0.0, 0.0, 0.3]), torch.tensor([0, 1, 1, 2]))
    assert scale.tolist() == [1.0, 0.0, 0.0, 1.0]  # one row with a weight: ESS = w² / w² = 1
    assert source_ess_scale(torch.tensor([0.2, 3.0, 0.0]), torch.tensor([0, 0, 0])).tolist() == [1.0, 1.0, 1.0]
    # A source index without rows (1) is harmless; one heavy row next to a light one: 1.9² / (2 · 3.25) = 0.555.
    scale = source_ess_scale(torch.tensor([1.0, 0.1, 1.8]), torch.tensor([0, 2, 2]))
    torch.testing.assert_close(scale, torch.tensor([1.0, 1.9**2 / 6.5, 1.9**2 / 6.5]))
    assert source_ess_scale(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


def test_row_weights_by_hand():
    weights = torch.tensor([[1.0, 2.0, 9.0], [0.5, 1.5, 0.0], [1.0, 1.0, 1.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0]])  # the padded 9.0 is left out
    keep = torch.tensor([True, True, False, True])
    # Means over tokens: 1.5, 2/3; the filtered row and the row without tokens: 0.
    torch.testing.assert_close(row_weights(weights, mask, keep), torch.tensor([1.5, 2.0 / 3.0, 0.0, 0.0]))


def test_ess_weighted_scales_peer_rows_and_leaves_own_rows_alone():
    token_advantages = torch.tensor([[1.0, 1.0], [2.0, 2.0], [-1.0, -1.0], [3.0, 0.0]])
    t = FTISTerms(
        token_advantages=token_advantages,
        ratio_reference_logps=torch.zeros(4, 2),
        weights=torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.5, 0.5], [2.0, 7.0]]),
        capped=torch.zeros(4, 2, dtype=torch.bool),
        filter_statistic=torch.zeros(4),
        keep=torch.ones(4, dtype=torch.bool),
    )
    mask = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    # Source 1: w = (1, 0.5): 2.25 / (2 · 1.25) = 0.9; source 2: one row, 1.
    scaled, peer_sums = ess_weighted(t, mask, torch.tensor([0, 1, 1, 2]))
    torch.testing.assert_close(scaled, token_advantages * torch.tensor([[1.0], [0.9], [0.9], [1.0]]))
    assert torch.equal(scaled[0], token_advantages[0])
    torch.testing.assert_close(peer_sums, torch.tensor([2.8, 3.0]))
    # Without peer rows nothing is computed: the very tensor comes back.
    same, none = ess_weighted(t, mask, torch.zeros(4, dtype=torch.long))
    assert same is token_advantages and none.tolist() == [0.0, 0.0]


# --------------------------------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------------------------------
def test_the_default_is_none_and_unknown_values_are_refused(make_args):
    assert FTISConfig.__dataclass_fields__["peer_weighting"].default == "none"
    assert make_args().peer_weighting == "none" and make_args(peer_weighting="ess").peer_weighting == "ess"
    with pytest.raises(ValueError, match=r"peer_weighting must be one of none, ess, got 'inverse'\."):
        make_args(peer_weighting="inverse")


# --------------------------------------------------------------------------------------------------------------------
# In the trainer: one micro-batch through its FTISLossHook.apply
# --------------------------------------------------------------------------------------------------------------------
# Five rows of two tokens: an own row, two rows of peer "a" (source 1), two of peer "b" (source 2). The learner's
# log-probs are all -1; the generator's set each weight w = min(exp(ℓθ - ℓgen), 2):
#   a: w = 1, 1 (row weight 1) and 0.5, 0.5 (0.5): ESS = 1.5² / (2 · 1.25) = 0.9
#   b: w = 2, 2 (row weight 2), and a negative row far away (ℓgen - ℓθ = 3 per token, D = e³ - 4 = 16.1 > g = 1):
#      filtered, row weight 0: ESS = 2² / (2 · 4) = 0.5
LEARNER = [[-1.0, -1.0]] * 5
GENERATOR = [[-1.0, -1.0], [-1.0, -1.0], [-1.0 + math.log(2.0)] * 2, [-1.0 - math.log(2.0)] * 2, [2.0, 2.0]]
ADVANTAGES = [1.0, 0.5, 1.5, 0.8, -1.2]
SOURCE = [0, 1, 1, 2, 2]
EXPECTED_SCALE = [1.0, 0.9, 0.9, 0.5, 0.5]


@pytest.fixture
def apply_ftis(tokenizer, make_args):
    """`apply(**config)`: the batch's `advantages` after `FTISLossHook.apply` on a tiny trainer built with `config`,
    and the trainer's metrics."""

    def apply(**overrides):
        trainer = tiny_trainer(tokenizer, make_args(kl_threshold=1.0, **overrides), train_size=16)
        trainer.model.train()
        trainer._ledger.add_sources(["a", "b"])
        inputs = batch()
        trainer._loss_hook.apply(inputs, torch.tensor(LEARNER))
        return inputs, trainer._metrics["train"]

    return apply


def batch():
    return {
        "completion_mask": torch.ones(5, 2, dtype=torch.long),
        "advantages": torch.tensor(ADVANTAGES),
        "ftis_gen_logps": torch.tensor(GENERATOR),
        "ftis_gen_valid": torch.tensor([False, True, True, True, True]),
        "ftis_group_max_len": torch.full((5,), 2),
        "ftis_source": torch.tensor(SOURCE),
    }


def test_none_is_the_default_and_the_unscaled_ftis_terms(apply_ftis):
    default, default_metrics = apply_ftis()
    none, none_metrics = apply_ftis(peer_weighting="none")
    for key in ("advantages", "old_per_token_logps"):
        assert torch.equal(default[key], none[key]), key
    assert dict(default_metrics) == dict(none_metrics) and "ftis/peer/ess_scale" not in none_metrics
    inputs = batch()
    gen = torch.where(inputs["ftis_gen_valid"].unsqueeze(-1), inputs["ftis_gen_logps"], torch.tensor(LEARNER))
    terms = ftis_terms(
        torch.tensor(LEARNER),
        None,
        gen,
        inputs["advantages"],
        inputs["completion_mask"],
        kl_threshold=1.0,
        group_max_lengths=inputs["ftis_group_max_len"],
    )
    assert torch.equal(none["advantages"], terms.token_advantages)
    assert terms.keep.tolist() == [True, True, True, True, False]  # the batch is what the comments above say


def test_ess_scales_each_peers_rows_and_leaves_own_rows_unchanged(apply_ftis):
    none, none_metrics = apply_ftis(peer_weighting="none")
    ess, ess_metrics = apply_ftis(peer_weighting="ess")
    expected = none["advantages"] * torch.tensor(EXPECTED_SCALE).unsqueeze(-1)
    torch.testing.assert_close(ess["advantages"], expected)
    assert torch.equal(ess["advantages"][0], none["advantages"][0])  # own row, bit for bit
    assert torch.equal(ess["old_per_token_logps"], none["old_per_token_logps"])  # only the advantages change
    assert ess_metrics["ftis/peer/ess_scale"] == [pytest.approx(0.7)]  # (0.9 + 0.9 + 0.5 + 0.5) / 4
    # The ledger's metrics measure the rows, not the option: the same with and without it.
    assert {k: v for k, v in ess_metrics.items() if k != "ftis/peer/ess_scale"} == dict(none_metrics)
    assert ess_metrics["ftis/peers/a/ess_frac"] == [pytest.approx(0.9)]
    assert ess_metrics["ftis/peers/b/ess_frac"] == [pytest.approx(0.5)]


def test_the_loss_scale_and_the_ledgers_effective_fraction_are_one_formula():
    """`peer_weighting="ess"` scales rows by `source_ess_scale` (tensors, per source); the summary reports the same
    quantity from sums (`peer_value.effective_fraction`). They must agree, also at the edges (all filtered)."""
    from trl_ftis.peer_value import effective_fraction

    generator = torch.Generator().manual_seed(0)
    weights = torch.rand(40, generator=generator) * 2
    weights[30:] = 0.0  # source 3: every row filtered
    source = torch.tensor([0] * 10 + [1] * 10 + [2] * 10 + [3] * 10)
    scale = source_ess_scale(weights, source)
    for s in (1, 2, 3):
        w = weights[source == s].double()
        expected = effective_fraction(float(w.sum()), float((w * w).sum()), len(w))
        assert scale[source == s] == pytest.approx(torch.full((10,), expected, dtype=scale.dtype))
