"""Controls: each swarm peer's configuration run once more without peers, next to the swarm, so that a run answers
"did joining help?" against the same model, data, seed and hardware share.

`controls: [alone, alone-rows]` at the top level of a swarm config (a peer's own `controls:` overrides it; `[]` runs
none for that peer) adds, for each swarm peer `P` and each kind `K`, a peer `P-K` with `P`'s script, model, args and
environment, which the launcher starts with no exchange (`control_of` set: `commands.build_commands` gives it no
`--exchange_url`, and drops the arguments that only mean something in a swarm). It runs as `P` (`--peer_id P`, so a
script that derives its data or seeds from the id draws the same), in its own output directory and log:

* `alone`: `P`'s own generation, alone: the rows `P` generates itself a step, nothing received;
* `alone-rows`: alone, generating as many rows a step as a swarm peer can train on: `P`'s own rows times the number of
  swarm peers (its `generation_batch_size` when set, else its `gradient_accumulation_steps`, scaled: the
  micro-batch, hence the memory, stays `P`'s).

Standard library only, like the rest of the launcher.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["CONTROL_KINDS", "SWARM_ONLY_ARGS", "control_peers", "control_problem"]

CONTROL_KINDS = ("alone", "alone-rows")
"""What a control can be: `P`'s configuration alone, or alone with as many rows a step as the swarm peer trains on."""

SWARM_ONLY_ARGS = (
    "expected_peers",
    "num_expected_peers",
    "peer_timeout",
    "swarm_run",
    "swarm_name",
    "exchange_mode",
)
"""Arguments that only mean something in a swarm: a control runs without them (it has no exchange)."""


def control_problem(value: Any) -> str | None:
    """Why `value` is no `controls` list (a list of distinct `CONTROL_KINDS`), or None."""
    if not isinstance(value, list) or not all(isinstance(kind, str) for kind in value):
        return f"must be a list of {', '.join(CONTROL_KINDS)}, got {value!r:.80}"
    unknown = [kind for kind in value if kind not in CONTROL_KINDS]
    if unknown:
        return f"unknown control {unknown[0]!r}: the controls are {', '.join(CONTROL_KINDS)}"
    if len(set(value)) != len(value):
        return f"lists a control twice: {value!r:.80}"
    return None


def _scaled(args: dict[str, Any], factor: int) -> dict[str, Any]:
    """`args` generating `factor` times the rows a step: `generation_batch_size` when set, else the gradient
    accumulation steps (the micro-batch stays the same)."""
    scaled = dict(args)
    if scaled.get("generation_batch_size") is not None:
        scaled["generation_batch_size"] = int(scaled["generation_batch_size"]) * factor
    else:
        scaled["gradient_accumulation_steps"] = int(scaled.get("gradient_accumulation_steps", 1)) * factor
    return scaled


def control_peers(peers: Sequence[Any], kinds_of: dict[str, Sequence[str]]) -> list[Any]:
    """The control peers of `peers` (`swarm_config.PeerConfig`s of the swarm): for each peer, one per kind in
    `kinds_of[peer.id]`, named `<peer id>-<kind>`, with `control_of` set to the peer's id."""
    swarm_size = len(peers)
    controls = []
    for peer in peers:
        for kind in kinds_of.get(peer.id, ()):
            args = {key: value for key, value in peer.args.items() if key not in SWARM_ONLY_ARGS}
            if kind == "alone-rows":
                args = _scaled(args, swarm_size)
            controls.append(dataclasses.replace(peer, id=f"{peer.id}-{kind}", args=args, control_of=peer.id))
    return controls
