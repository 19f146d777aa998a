"""Peer rows to wire messages and back: the one place that maps [`trl_ftis.PeerRow`] fields onto
[`trl_ftis.exchange.Message`] fields (the swarm publishes and collects with these; checkpoints never use them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..exchange import Limits, Message, WireCompletion, WireGroup
from ..peer_rows import PeerRow
from ..sampling_bounds import MAX_LOGP


def rows_to_message(
    rows: Sequence[PeerRow],
    *,
    sender: str,
    round: int,
    tokenizer_fingerprint: str,
    tokenizer_name: str,
    temperature: float,
    reward_names: Sequence[str],
    model: str = "",
) -> Message:
    """Pack rows into a wire message; rows sharing `group` share one prompt entry."""
    groups: list[WireGroup] = []
    group_index: dict[Any, int] = {}
    completions = []
    for row in rows:
        key = row.group
        if key not in group_index:
            group_index[key] = len(groups)
            groups.append(WireGroup(prompt=row.prompt, extra=dict(row.extra)))
        per_func = row.rewards_per_func or {}
        completions.append(
            WireCompletion(
                group=group_index[key],
                completion_ids=np.asarray(row.completion_ids, dtype=np.int32),
                generator_logps=np.asarray(row.generator_logps, dtype=np.float32),
                reward=float(row.reward),
                rewards_per_func=np.asarray([per_func.get(name, math.nan) for name in reward_names], np.float32),
                text=row.completion_text,
                ends_with_eos=bool(row.ends_with_eos),
            )
        )
    return Message(
        sender=sender,
        round=int(round),
        tokenizer_fingerprint=tokenizer_fingerprint,
        tokenizer_name=tokenizer_name,
        temperature=float(temperature),
        reward_names=list(reward_names),
        groups=groups,
        completions=completions,
        model=model,
    )


def fits_the_wire(row: PeerRow, reward_names: Sequence[str], limits: Limits) -> bool:
    """Whether `row`'s values are ones the wire format carries (`limits`: its reward within `max_abs_reward`, each
    reward function's too, its log-probs finite, at least `min_logp` and at most `MAX_LOGP`): a sender leaves out
    a group holding one that is not, since receivers would refuse the whole message."""
    try:
        reward = float(row.reward)
        logps = np.asarray(row.generator_logps, dtype=np.float64)
        per_func = row.rewards_per_func or {}
        values = np.asarray([per_func.get(name, math.nan) for name in reward_names], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return False
    if not (math.isfinite(reward) and abs(reward) <= limits.max_abs_reward):
        return False
    if logps.size and not (np.isfinite(logps).all() and limits.min_logp <= logps.min() and logps.max() <= MAX_LOGP):
        return False
    values = values[~np.isnan(values)]  # NaN: the reward function returned None, which the wire carries
    return bool((np.abs(values) <= limits.max_abs_reward).all())


def biased_logps(sampling: Mapping[str, Any]) -> str | None:
    """What is wrong with a message's generator log-probs, from its `sampling` (`Message.sampling`): `None` unless
    they are the trainer's full-softmax log-probs of tokens sampled with top-k, top-p or min-p, so that every
    receiver's importance weight is taken against a distribution that did not sample them."""
    if not sampling or sampling.get("logps") != "trainer":
        return None
    settings = [f"{name}={sampling[name]}" for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0))
                if sampling.get(name, off) != off]  # fmt: skip
    if not settings:
        return None
    return (
        f"its generator log-probs are the trainer's full softmax, but it samples with {', '.join(settings)}, so "
        "their truncated weights are biased low (the sender records the sampled distribution with transformers' "
        "generate or vLLM's own log-probs; docs/objective.md, 'Which log-probs a row carries')"
    )


def message_to_rows(message: Message, *, foreign_tokenizer: bool = False) -> list[PeerRow]:
    """Unpack a decoded message into peer rows; group keys are unique per (sender, round, prompt index).
    `foreign_tokenizer`: the sender's tokenizer differs from the receiver's (the rows are marked so, to be
    re-tokenised from their text)."""
    rows = []
    for completion in message.completions:
        group = message.groups[completion.group]
        rows.append(
            PeerRow(
                prompt=group.prompt,
                # Arrays stay arrays (no per-token Python objects); the merge turns them into tensors directly.
                completion_ids=completion.completion_ids,
                generator_logps=completion.generator_logps,
                reward=float(completion.reward),
                group=(message.sender, message.round, completion.group),
                sender=message.sender,
                rewards_per_func={
                    name: float(value)
                    for name, value in zip(message.reward_names, completion.rewards_per_func.tolist(), strict=True)
                },
                extra=dict(group.extra),
                round=message.round,
                completion_text=completion.text,
                ends_with_eos=completion.ends_with_eos,
                foreign_tokenizer=foreign_tokenizer,
            )
        )
    return rows
