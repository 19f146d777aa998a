"""The loss metrics by source and by age (`trl_ftis.loss_metrics`), checked against hand-computed values."""

import math

import pytest
import torch

from trl_ftis.loss_metrics import age_buckets, age_groups, metric_groups, source_sums
from trl_ftis.objective import FTISTerms


def terms(weights, keep, statistic):
    weights = torch.tensor(weights)
    return FTISTerms(
        token_advantages=torch.zeros_like(weights),
        ratio_reference_logps=torch.zeros_like(weights),
        weights=weights,
        capped=weights >= 2.0,
        filter_statistic=torch.tensor(statistic),
        keep=torch.tensor(keep),
    )


def test_age_buckets_put_own_rows_apart_and_older_rows_in_the_last():
    ages = torch.tensor([-1, 0, 1, 2, 7])
    assert age_buckets(ages, max_age=2).tolist() == [0, 1, 2, 3, 3]


def test_metrics_by_age_are_the_weights_and_filter_of_the_rows_of_each_age():
    # Row 0 own (age -1), rows 1-2 of age 0, row 3 of age 2; two tokens each, the second of row 2 padding.
    t = terms(
        weights=[[1.0, 1.0], [0.5, 1.5], [2.0, 9.0], [0.25, 0.75]],
        keep=[True, True, False, True],
        statistic=[0.0, 1.0, 3.0, math.inf],
    )
    mask = torch.tensor([[True, True], [True, True], [True, False], [True, True]])
    sums, maxes = source_sums(t, mask, age_buckets(torch.tensor([-1, 0, 0, 2]), max_age=2), 4)
    groups = dict(age_groups(sums, maxes))
    assert set(groups) == {"peer_age/0", "peer_age/2"}  # no rows of age 1, own rows not reported
    age0 = groups["peer_age/0"]
    assert age0["is_weight_mean"] == pytest.approx((0.5 + 1.5 + 2.0) / 3)  # the padded 9.0 is left out
    assert age0["is_weight_max"] == pytest.approx(2.0)
    assert age0["is_weight_capped_frac"] == pytest.approx(1 / 3)
    assert age0["filtered_frac"] == pytest.approx(0.5)
    assert age0["kl_mean"] == pytest.approx(2.0) and age0["kl_max"] == pytest.approx(3.0)
    age2 = groups["peer_age/2"]
    assert age2["is_weight_mean"] == pytest.approx(0.5) and age2["kl_nonfinite_frac"] == 1.0
    assert "kl_mean" not in age2  # no finite statistic


def test_metric_groups_by_source_are_unchanged_by_the_refactor():
    t = terms(weights=[[1.0], [0.5], [1.5]], keep=[True, False, True], statistic=[0.0, 2.0, 4.0])
    mask = torch.ones(3, 1, dtype=torch.bool)
    sums, maxes = source_sums(t, mask, torch.tensor([0, 1, 2]), 3)
    groups = {name: (values, filtered) for name, values, filtered in metric_groups(sums, maxes, ["a", "b"])}
    assert set(groups) == {"own", "peer", "peers/a", "peers/b"}
    assert groups["peer"][0]["is_weight_mean"] == pytest.approx(1.0) and groups["peer"][1] == 1.0
    assert groups["peers/a"][0]["filtered_frac"] == 1.0 and groups["peers/b"][0]["kl_mean"] == 4.0
