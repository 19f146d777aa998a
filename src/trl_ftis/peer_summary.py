"""`FTISTrainer.summary()`: what a peer has done so far, from the objects that own each part (the ledger's counts,
the round runner's exchange times, the swarm's peers, the step clock's and the peer value's collaboration report,
the held-out evaluation, the log history's curve)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .evaluation import held_out_results, run_curve
from .redaction import redact_url

__all__ = ["peer_summary"]


def peer_summary(
    *, args, state, ledger, rounds, swarm, collaboration: dict[str, Any], callbacks: Sequence[Any]
) -> dict[str, Any]:
    """The summary of a trainer with config `args` and Trainer `state`, its `ledger`
    (`trl_ftis.swarm.ledger.PeerRowLedger`), `rounds` (`trl_ftis.swarm.rounds.RoundRunner`), `swarm` (`None` outside a
    swarm), `collaboration` report and `callbacks` (where a held-out evaluation may be); the keys are those
    `FTISTrainer.summary` documents."""
    rewards = [entry["reward"] for entry in state.log_history if "reward" in entry]
    runtimes = [entry["train_runtime"] for entry in state.log_history if "train_runtime" in entry]
    return {
        "peer_id": args.peer_id,
        "steps": state.global_step,
        **{key: int(value) for key, value in ledger.totals.items()},
        "reward": rewards[-1] if rewards else None,
        "refused": dict(ledger.refused),
        "dropped": dict(ledger.dropped_totals),
        "exchange_worker_errors": rounds.worker_errors,
        "exchange_blocking_seconds": rounds.blocking_seconds,
        "exchange_admission_seconds": rounds.admission_seconds,
        "train_seconds": runtimes[-1] if runtimes else None,
        "peer_row_ages": {str(age): count for age, count in sorted(rounds.ages.items())},
        "peers": sorted(set(ledger.sources) | (swarm.known_peers if swarm is not None else set())),
        "peer_models": dict(sorted(swarm.peer_models.items())) if swarm is not None else {},
        "exchange_url": redact_url(args.exchange_url) if args.exchange_url else None,
        **collaboration,
        **held_out_results(callbacks),
        "curve": run_curve(state.log_history),
    }
