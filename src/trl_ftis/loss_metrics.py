"""The F-TIS loss metrics (`ftis/own/...`, `ftis/peer/...`, `ftis/peers/<peer>/...`, `ftis/peer_age/<k>/...`) from the
terms of one micro-batch.

Two pure steps around the trainer's two collectives: [`source_sums`] adds up, per source (0: this trainer's own rows;
k >= 1: the k-th peer of the ledger's `sources`), what the metrics need; the trainer sums and maxes them over its
processes; [`metric_groups`] turns the totals into the metric values of each group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .objective import FTISTerms, row_weights
from .peer_value import effective_fraction


def source_sums(
    terms: FTISTerms, mask: torch.Tensor, source: torch.Tensor, num_sources: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per source, `(rows, filtered, tokens, Σ weight, capped tokens, Σ finite statistic, finite statistics, Σ row
    weight, Σ row weight²)` (shape `(num_sources, 9)`) and `(max weight, max finite statistic)` (shape
    `(num_sources, 2)`, `-inf` when none). A row's weight ([`trl_ftis.objective.row_weights`]) is the mean truncated
    weight over its tokens, 0 when the filter zeroed its advantage or it has no tokens: the weight its advantage
    carries into the loss, from which the effective sample size `(Σw)² / Σw²` follows."""
    source = source.long()
    finite = torch.isfinite(terms.filter_statistic)
    weights = torch.where(mask, terms.weights, torch.zeros_like(terms.weights))
    rows = row_weights(terms.weights, mask, terms.keep)
    per_row = torch.stack(
        [
            torch.ones_like(finite, dtype=torch.float32),
            (~terms.keep).float(),
            mask.sum(-1).float(),
            weights.sum(-1).float(),
            (terms.capped & mask).sum(-1).float(),
            torch.where(finite, terms.filter_statistic, torch.zeros_like(terms.filter_statistic)).float(),
            finite.float(),
            rows,
            rows * rows,
        ],
        dim=1,
    )
    sums = torch.zeros(num_sources, per_row.shape[1], device=mask.device).index_add_(0, source, per_row)
    row_peaks = torch.stack(
        [
            torch.where(mask, terms.weights, torch.full_like(terms.weights, -math.inf)).amax(-1).float(),
            torch.where(finite, terms.filter_statistic, torch.full_like(terms.filter_statistic, -math.inf)).float(),
        ],
        dim=1,
    )
    maxes = torch.full((num_sources, 2), -math.inf, device=mask.device).scatter_reduce_(
        0, source.unsqueeze(-1).expand(-1, 2), row_peaks, reduce="amax"
    )
    return sums, maxes


def metric_groups(
    sums: torch.Tensor, maxes: torch.Tensor, sources: Sequence[str]
) -> list[tuple[str, dict[str, float], float]]:
    """`(group, metrics, rows filtered)` for `own`, then (with peer rows) `peer` and each `peers/<name>`, from the
    totals over every process; a group without rows is left out, a metric without tokens or finite statistics too."""
    groups = [("own", sums[0], maxes[0])]
    if len(sources) > 0:
        groups.append(("peer", sums[1:].sum(dim=0), maxes[1:].amax(dim=0)))
        groups += [(f"peers/{name}", sums[k + 1], maxes[k + 1]) for k, name in enumerate(sources)]
    out = []
    for name, totals, peaks in groups:
        values = group_values(totals, peaks)
        if values is not None:
            out.append((name, values, totals[1].item()))
    return out


def value_sums(sums: torch.Tensor, sources: Sequence[str]) -> list[tuple[str | None, dict[str, float]]]:
    """`(source, totals)` for own rows (source `None`) and each peer with rows, from [`source_sums`] over every
    process: the keyword arguments of `trl_ftis.peer_value.PeerValue.record_loss` (rows, Σ row weight, Σ row weight²,
    rows filtered)."""
    out = []
    for index, name in enumerate([None, *sources]):
        n_rows, n_filtered, *_, row_w, row_w2 = sums[index].tolist()
        if n_rows > 0:
            out.append(
                (name, {"rows": n_rows, "weight_sum": row_w, "weight_square_sum": row_w2, "filtered": n_filtered})
            )
    return out


def age_buckets(age: torch.Tensor, max_age: int) -> torch.Tensor:
    """Each row's bucket for [`age_groups`]: 0 for own rows and rows of unknown age (age < 0), `1 + age` for a peer
    row `age` of its sender's steps old, the last one (`1 + max_age`) for older ones."""
    return torch.clamp(age.long() + 1, min=0, max=max_age + 1)


def age_groups(sums: torch.Tensor, maxes: torch.Tensor) -> list[tuple[str, dict[str, float]]]:
    """`(peer_age/<k>, metrics)` for each age `k` (in the sender's steps) with peer rows, from [`source_sums`] over
    [`age_buckets`]: what the truncated weight and the filter do to rows of each age."""
    out = []
    for bucket in range(1, sums.shape[0]):
        values = group_values(sums[bucket], maxes[bucket])
        if values is not None:
            out.append((f"peer_age/{bucket - 1}", values))
    return out


def group_values(totals: torch.Tensor, peaks: torch.Tensor) -> dict[str, float] | None:
    """The metrics of one group from its [`source_sums`] row; `None` when it has no rows."""
    n_rows, n_filtered, n_tokens, w_sum, n_capped, d_sum, n_finite, row_w, row_w2 = totals.tolist()
    if n_rows == 0:
        return None
    values = {
        "filtered_frac": n_filtered / n_rows,
        "kl_nonfinite_frac": 1.0 - n_finite / n_rows,
        "ess_frac": effective_fraction(row_w, row_w2, n_rows),
    }
    if n_tokens > 0:
        values["is_weight_mean"] = w_sum / n_tokens
        values["is_weight_max"] = peaks[0].item()
        values["is_weight_capped_frac"] = n_capped / n_tokens
    if n_finite > 0:
        values.update(kl_mean=d_sum / n_finite, kl_max=peaks[1].item())
    return values


def reduced_sums(accelerator, terms, mask: torch.Tensor, index: torch.Tensor, groups: int):
    """[`source_sums`] over `groups` groups, summed and maxed over every process of `accelerator` (two
    collectives)."""
    sums, maxes = source_sums(terms, mask, index, groups)
    return accelerator.reduce(sums, reduction="sum").cpu(), accelerator.gather(maxes.unsqueeze(0)).amax(dim=0).cpu()


def record_term_statistics(
    accelerator,
    terms: FTISTerms,
    mask: torch.Tensor,
    source: torch.Tensor,
    age: torch.Tensor | None,
    *,
    sources: Sequence[str],
    max_staleness: int,
    metrics,
    value=None,
    filtered: dict[str, float] | None = None,
) -> None:
    """Append the statistics of the F-TIS terms to `metrics` (name -> list of values: the Trainer's metrics of one
    mode) for own rows, all peer rows, each of `sources` and, with `age` (swarm rows), peer rows by age in their
    sender's steps (`ftis/peer_age/<k>/...`). In training, `value` (`trl_ftis.peer_value.PeerValue`) records what
    reached the loss and `filtered` counts the rows the filter zeroed. Every process runs the same collectives
    whatever its rows (`sources` is the same everywhere)."""
    if age is not None:
        buckets = max_staleness + 2  # own or unknown, then ages 0 .. max_staleness (older: the last)
        sums, maxes = reduced_sums(accelerator, terms, mask, age_buckets(age, max_staleness), buckets)
        for name, values in age_groups(sums, maxes):
            for metric, number in values.items():
                metrics[f"ftis/{name}/{metric}"].append(number)
    sums, maxes = reduced_sums(accelerator, terms, mask, source, len(sources) + 1)
    if value is not None:
        for name, totals in value_sums(sums, sources):
            value.record_loss(name, **totals)
    for name, values, n_filtered in metric_groups(sums, maxes, sources):
        if filtered is not None and name != "own":
            key = "rows_filtered" if name == "peer" else f"{name}/rows_filtered"
            filtered[key] = filtered.get(key, 0.0) + n_filtered
        for metric, number in values.items():
            metrics[f"ftis/{name}/{metric}"].append(number)
