"""`ExchangeStep`: the swarm's part of one training generation, run alike on every process of a job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelerate.utils import broadcast_object_list, gather_object

from .peer_merge import PeerMerge
from .peer_rows import PeerRow, ScoredRow
from .swarm import RoundRunner


class ExchangeStep:
    """This job's own rows out, the swarm's accepted rows in, at one training generation.

    Only the main process talks to the swarm (the [`RoundRunner`]); every process runs the same collectives (one
    gather, one broadcast) whatever arrived, then takes its equal share of the accepted rows ([`PeerMerge`]). In
    horizontal mode the own rows' advantages are renormalised over the mixed groups.

    Args:
        accelerator: the trainer's `Accelerator`.
        rounds: the round runner (its `swarm` is set on the main process only).
        merge: the peer-row merge, which shares rows out and renormalises own rows.
        log: `log(name, value)` appends one of the round's metrics to the trainer's.
        sampling: the sampling settings the own rows were drawn with (`own_rows.sampling_settings`), which the swarm
            announces with them.
    """

    def __init__(
        self,
        *,
        accelerator,
        rounds: RoundRunner,
        merge: PeerMerge,
        log: Callable[[str, float], None],
        sampling: Callable[[], dict[str, Any]],
    ):
        self.accelerator, self.rounds, self.merge, self.log, self.sampling = accelerator, rounds, merge, log, sampling

    def run(self, own_rows: list[PeerRow], output: dict[str, Any], step: int) -> list[ScoredRow]:
        """Publish this job's `own_rows` (this process's) for the round of `step` and return this process's share of
        the accepted peer rows; in horizontal mode `output`'s own advantages are rewritten."""
        accelerator = self.accelerator
        everyone = gather_object(own_rows) if accelerator.num_processes > 1 else own_rows
        payload = [None]
        if accelerator.is_main_process:
            self.rounds.swarm.sampling = self.sampling()
            payload = [tuple(self.rounds.round(everyone, step))]
        if accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        rows, own_statistics, metrics = payload[0]
        for name, value in metrics.items():
            self.log(name, value)
        if own_statistics is not None:  # horizontal mode
            self.merge.own_statistics(output, own_statistics, len(own_rows))
        return self.merge.equal_share(rows)
