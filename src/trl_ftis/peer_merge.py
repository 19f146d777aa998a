"""The merge of admitted peer rows into one process's generation batch, as TRL's `_generate_and_score_completions`
left it: [`PeerMerge`], composed by `FTISTrainer`, with its dependencies explicit (the accelerator, the admission's
last guard, the ledger and the peer-value counts, the trainer's log-prob forwards).

Every process of a job merges as many rows and runs the same collectives and forwards, whatever rows it holds:
rows added on one process are gathered and shared out evenly ([`PeerMerge.equal_share`]), and the counts are
equalised after every per-process guard; unequal micro-batches or forwards would deadlock DDP, ZeRO-3 and FSDP.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object

from .objective import group_max_len
from .own_rows import is_truncated
from .peer_rows import UNMERGEABLE_FIELDS, AdmittedRow, ScoredRow, build_peer_batch, concat_rows, with_group_statistics
from .peer_value import merge_counts

__all__ = ["PeerMerge"]


class PeerMerge:
    """Peer rows into a process's generation batch: group statistics for rows added with `add_peer_rows`, the last
    guard, TRL's `mask_truncated_completions` applied to them, the equal counts, the per-source counts and metrics,
    then the batch tensors with their log-probs.

    Args:
        accelerator: the trainer's `Accelerator` (collectives, device).
        admission (`trl_ftis.swarm.admission.Admission`): its `guard_statistics`, the last guard.
        ledger (`trl_ftis.swarm.ledger.PeerRowLedger`): drops, sources and row counts are counted there.
        value (`trl_ftis.peer_value.PeerValue`): rows and tokens merged, per source.
        lock: the round runner's lock (an async worker's admission writes the ledger too).
        log (`Callable[[str, float], None]`): appends a training metric.
        completion_logps (`Callable[[dict, slice], Tensor]`): the current model's log-probs of a batch's rows.
        reference_logps (`Callable[[dict, slice], Tensor]`): the reference model's (`beta != 0`).
        scale_rewards, steps_per_generation, pad_token_id, vllm_importance_sampling_mode: as the trainer's.
        truncation_ends (`Collection[int]`, *optional*): the end-of-sequence and padding ids, when
            `mask_truncated_completions` is on (peer rows without one at the end are dropped, `truncated`).
    """

    def __init__(
        self,
        *,
        accelerator,
        admission,
        ledger,
        value,
        lock,
        log: Callable[[str, float], None],
        completion_logps: Callable[[dict, slice], torch.Tensor],
        reference_logps: Callable[[dict, slice], torch.Tensor],
        scale_rewards: str,
        steps_per_generation: int,
        pad_token_id: int | None,
        vllm_importance_sampling_mode: str | None,
        truncation_ends: Collection[int] | None = None,
    ):
        self.accelerator, self.admission, self.ledger, self.value, self.lock = (
            accelerator,
            admission,
            ledger,
            value,
            lock,
        )
        self.log, self.completion_logps, self.reference_logps = log, completion_logps, reference_logps
        self.scale_rewards, self.steps_per_generation = scale_rewards, steps_per_generation
        self.pad_token_id, self.vllm_importance_sampling_mode = pad_token_id, vllm_importance_sampling_mode
        self.truncation_ends = set(truncation_ends) if truncation_ends is not None else None

    def equal_share(self, rows: list) -> list:
        """This process's equal, disjoint share of `rows` (the same list on every process); the rest is trimmed."""
        processes, index = self.accelerator.num_processes, self.accelerator.process_index
        share = len(rows) // processes
        if self.accelerator.is_main_process:
            with self.lock:
                self.ledger.count_trimmed(row.sender for row in rows[share * processes :])
        return rows[index * share : (index + 1) * share]

    def merge(self, output: dict[str, Any], rows: Sequence[AdmittedRow]) -> dict[str, Any]:
        """`output` (this process's own rows) with `rows` merged: rows from `add_peer_rows` (admitted, not normalised,
        queued per process) are gathered, given their group statistics and shared out like a swarm round's (which
        the main process normalised before sharing out); then the last guard. Prompts were rendered once, by the
        admission."""
        accelerator, ledger = self.accelerator, self.ledger
        processes = accelerator.num_processes
        queued = [row for row in rows if not isinstance(row, ScoredRow)]
        queued = with_group_statistics(gather_object(queued) if processes > 1 else queued, self.scale_rewards)
        queued = self.equal_share(queued) if processes > 1 else queued
        rows = self.admission.guard_statistics(queued + [row for row in rows if isinstance(row, ScoredRow)])
        if self.truncation_ends is not None:  # as TRL masks the trainer's own: in the groups' statistics, not the loss
            truncated = [is_truncated(row.completion_ids, self.truncation_ends) for row in rows]
            ledger.count_trimmed((row.sender for row, cut in zip(rows, truncated, strict=True) if cut), "truncated")
            rows = [row for row, cut in zip(rows, truncated, strict=True) if not cut]
        # Every generation batch must split into `steps_per_generation` equal micro-batches, and every process must
        # merge as many rows as the others (the same forwards and collectives), whatever its guards dropped.
        counts = [len(rows)]
        if processes > 1:
            counts = accelerator.gather(torch.tensor([len(rows)], device=accelerator.device)).tolist()
        keep = min(counts) - min(counts) % self.steps_per_generation
        ledger.count_trimmed(row.sender for row in rows[keep:])
        rows = rows[:keep]
        # Per-peer loss metrics are reductions over a source list that must be the same on every process.
        senders = sorted({row.sender for row in rows})
        ledger.add_sources(sorted(set(gather_object(senders))) if processes > 1 else senders)
        # Rows and completion tokens per source (0: own) merged into this batch, over every process: one collective.
        own = (output["completion_mask"].shape[0], int(output["completion_mask"].sum()))
        counts = torch.tensor(merge_counts(own, rows, ledger.source_index, len(ledger.sources) + 1))
        counts = accelerator.reduce(counts.to(accelerator.device), reduction="sum").cpu()
        names = [None, *ledger.sources]  # None: own rows (PeerValue's OWN)
        self.value.record_merge({name: tuple(counts[k].tolist()) for k, name in enumerate(names)})
        self.log("ftis/own_tokens_total", self.value.own["tokens"])  # the curves' x axis
        total_rows = counts[1:, 0].sum().item()
        self.log("ftis/peer_rows", total_rows)
        for name, number in ledger.step_row_counts().items():
            self.log(name, number)
        if rows:
            unsupported = [key for key in UNMERGEABLE_FIELDS if output.get(key) is not None]
            if unsupported:
                raise ValueError(
                    f"Peer rows cannot be merged into batches with {unsupported}: F-TIS peers exchange text-only, "
                    "single-turn completions."
                )
            output = self.batch(output, rows)
        if total_rows > 0:  # the same decision on every process: they all run this collective, or none does
            # `num_items_in_batch` counts loss tokens over all processes, as TRL does.
            loss_mask = output["completion_mask"]
            if output.get("tool_mask") is not None:
                loss_mask = loss_mask * output["tool_mask"]
            output["num_items_in_batch"] = accelerator.gather(loss_mask.sum()).sum()
        return output

    def own_fields(self, output: dict[str, Any], num_generations: int) -> dict[str, Any]:
        """`output` (TRL's batch of this process's own rows) with the F-TIS fields that [`batch`] fills for peer
        rows: each group's longest completion, no generator log-probs (`ℓgen = ℓold`), source 0, no age."""
        completion_mask = output["completion_mask"]
        batch, device = completion_mask.shape[0], completion_mask.device
        # Groups may span processes, so the longest completion of a group is found on the gathered lengths.
        lengths = self.accelerator.gather(completion_mask.sum(-1))
        group_max = group_max_len(lengths, torch.arange(len(lengths), device=lengths.device) // num_generations)
        start = self.accelerator.process_index * batch
        output["ftis_group_max_len"] = group_max[start : start + batch].to(device)
        output["ftis_gen_logps"] = torch.zeros(completion_mask.shape, dtype=torch.float32, device=device)
        output["ftis_gen_valid"] = torch.zeros(batch, dtype=torch.bool, device=device)
        output["ftis_source"] = torch.zeros(batch, dtype=torch.long, device=device)
        output["ftis_age"] = torch.full((batch,), -1, dtype=torch.long, device=device)  # own rows: no age
        output["ftis_text_level"] = torch.zeros(batch, dtype=torch.bool, device=device)
        return output

    def own_statistics(self, output: dict[str, Any], statistics: tuple[list, list], rows: int) -> None:
        """Horizontal mode: this process's share (`rows` own rows) of the advantages and longest completions the
        round computed over the groups mixed with peer rows, written into `output`."""
        start, (advantages, group_max) = self.accelerator.process_index * rows, statistics
        device = output["advantages"].device
        output["advantages"] = torch.tensor(advantages[start : start + rows], device=device)
        output["ftis_group_max_len"] = torch.tensor(group_max[start : start + rows], device=device)

    def batch(self, output: dict[str, Any], rows: Sequence[ScoredRow]) -> dict[str, Any]:
        """`output`'s tensors with `rows` appended (re-padded), the F-TIS fields, TRL's vLLM ratio of 1 for them, and
        their batch-time and reference log-probs where TRL keeps those."""
        device = self.accelerator.device
        peer = build_peer_batch(
            rows,
            [row.prompt_ids for row in rows],
            pad_token_id=self.pad_token_id,
            scale_rewards=self.scale_rewards,
            device=device,
        )
        fields = {
            "prompt_ids": peer.prompt_ids,
            "prompt_mask": peer.prompt_mask,
            "completion_ids": peer.completion_ids,
            "completion_mask": peer.completion_mask,
            "advantages": peer.advantages,
            "ftis_gen_logps": peer.generator_logps,
            "ftis_gen_valid": torch.ones(len(peer), dtype=torch.bool, device=device),
            "ftis_source": torch.tensor([self.ledger.source_index(s) for s in peer.senders], device=device),
            "ftis_age": torch.tensor(
                [-1 if getattr(row, "age", None) is None else min(max(int(row.age), -1), 2**31) for row in rows],
                dtype=torch.long,
                device=device,
            ),
            "ftis_group_max_len": peer.group_max_lengths,
            "ftis_text_level": peer.text_level,
        }
        if "sampling_per_token_logps" in output:
            fields["sampling_per_token_logps"] = peer.generator_logps
        if "importance_sampling_ratio" in output:  # vLLM's own correction does not apply to other models' rows
            # TRL keeps one ratio per sequence (B, 1) in the sequence_* modes, one per token (B, T) otherwise.
            per_sequence = self.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate")
            shape = (len(peer), 1) if per_sequence else tuple(peer.generator_logps.shape)
            fields["importance_sampling_ratio"] = torch.ones(shape, device=device)
        # Placeholders, filled below on the merged (re-padded) tensors.
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            if key in output and output[key] is not None:
                fields[key] = torch.zeros_like(peer.generator_logps)
        local_rows = output["completion_ids"].shape[0]
        merged = concat_rows(output, fields, pad_token_id=self.pad_token_id)
        peer_rows = slice(local_rows, None)
        if merged.get("old_per_token_logps") is not None:
            merged["old_per_token_logps"][peer_rows] = self.completion_logps(merged, peer_rows)
        if merged.get("ref_per_token_logps") is not None:
            merged["ref_per_token_logps"][peer_rows] = self.reference_logps(merged, peer_rows)
        return merged
