"""What travels: a [`Message`] is what one peer publishes for one training step, its prompts ([`WireGroup`]) and its
completions ([`WireCompletion`]).

Plain dataclasses, no checks: [`trl_ftis.exchange.wire`] validates a message when it encodes one and builds a
validated one when it decodes bytes from an untrusted peer. Standard library and numpy only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Message", "WireCompletion", "WireGroup"]


@dataclass
class WireGroup:
    """One prompt; several completions may point at it (`WireCompletion.group`)."""

    prompt: Any
    """A string, or a list of chat messages: dicts with string keys and string (or null) values."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The dataset row's other JSON-able columns, e.g. `{"answer": "47"}` (reward functions may read them)."""


@dataclass(eq=False)  # eq=False: comparing numpy arrays with == is elementwise, a generated __eq__ would raise
class WireCompletion:
    """One sampled completion."""

    group: int
    """Index into [`Message.groups`]."""
    completion_ids: np.ndarray
    """Token ids, int32 or int64, shape `(L,)` with `L >= 1`; decoded messages hold int32."""
    generator_logps: np.ndarray
    """The generator's full-softmax log-prob of each token at the shared temperature: float32, `(L,)`, finite,
    `<= 0` (up to [`MAX_LOGP`] of rounding slack)."""
    reward: float
    """Total reward, finite; it travels as float32."""
    rewards_per_func: np.ndarray
    """float32, shape `(K,)` with `K = len(Message.reward_names)`; NaN where a reward function returned None."""
    text: str | None = None
    """The completion as text, decoded with the sender's tokenizer, without the end-of-sequence token; None: not
    sent. Lets peers with another tokenizer re-tokenise it (`docs/wire-format.md`, "The text section")."""
    ends_with_eos: bool = False
    """The completion ended with the sender's end-of-sequence token (not part of `text`); receivers with another
    tokenizer append their own. Sent only with `text` (ignored when `text` is None)."""


@dataclass(eq=False)
class Message:
    """Everything one peer shares for one training step."""

    sender: str
    """Peer id, by the rule of [`trl_ftis.peer_ids.peer_id_problem`] (transports use it in file names and keys)."""
    round: int
    """The sender's training step, `>= 0`."""
    tokenizer_fingerprint: str
    """Hex SHA-256 from [`tokenizer_fingerprint`]; receivers compare it with their own."""
    tokenizer_name: str
    """Human-readable name of the tokenizer (e.g. its `name_or_path`), only for error messages."""
    temperature: float
    """Sampling temperature of the generator log-probs, `> 0`."""
    reward_names: list[str]
    groups: list[WireGroup]
    completions: list[WireCompletion]
    created: float = field(default_factory=time.time)
    """Unix seconds, set by the sender (for staleness checks)."""
    model: str = ""
    """The sender's model (name or path), for logs, summaries and model cards; optional (empty: not sent)."""
    final: bool = False
    """The sender's last message of its run: it is leaving the swarm, and receivers stop waiting for it (until it
    sends a message of a later round). Usually it holds no completions (`Swarm.leave`)."""
    swarm: str = ""
    """The swarm the message belongs to (`FTISConfig.swarm_name`); a receiver bound to a swarm refuses messages that
    name another one, or none (`swarm`). Empty: not sent."""
    run: str = ""
    """The run of the swarm the message belongs to (`FTISConfig.swarm_run`, which `trl-ftis swarm` draws for each
    run); a receiver bound to a run refuses messages of another run, or of none (`run`): replays of an earlier run,
    leftovers in a reused exchange. Empty: not sent."""
    epoch: int = 0
    """The sender's start it was sent in: a number in [1, 2**63 - 1] that grows with every start of the sender
    (`Swarm` uses the microseconds since 1970 at its start, above any epoch of the state it resumed from), inside
    what is signed. A receiver takes a sender's messages only in order: a round not newer than one it already
    accepted from that sender is refused, unless its epoch is newer (the sender restarted, perhaps from an older
    checkpoint). 0: not sent (messages of earlier versions)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """How the sender sampled and what its generator log-probs are: `logps` (`"sampler"`: the inference engine's own
    log-probs of the sampled distribution, vLLM's; `"generation"`: recorded while `generate` sampled, after top-k /
    top-p / min-p; `"trainer"`: the trainer's forward, the full softmax at the temperature), `top_k` (0: off),
    `top_p` (1: off) and `min_p` (0: off). Empty: not sent (messages of earlier versions)."""
    compact: bool = False
    """How the message was (or is to be) encoded; [`decode_message`] sets it."""

    def num_tokens(self) -> int:
        """Total number of completion tokens."""
        return sum(len(c.completion_ids) for c in self.completions)
