"""What ties a message to a swarm and who may be trusted with it, as the config, the wire format and the round client
agree: the swarm name and run id a message may be bound to ([`binding_problem`]), and the refusal reasons that mean
two peers are set up with different credentials ([`CREDENTIAL_REASONS`], [`CREDENTIAL_HINT`])."""

from __future__ import annotations

CREDENTIAL_REASONS = ("unsigned", "signature", "unknown_peer", "identity")
"""Refusal reasons that mean the sender and the receiver are set up with different credentials."""
CREDENTIAL_HINT = (
    " (this peer and that one are set up with different credentials: give every peer the same swarm_secret and the "
    "same peer_keys_file, each its own private_key_file)"
)
"""What a receiver adds when it refuses a message for one of `CREDENTIAL_REASONS`."""
MAX_BINDING_CHARS = 128
"""The longest swarm name or run id a message may be bound to (the wire format's bound too)."""


def binding_problem(value: object) -> str | None:
    """Why `value` cannot be a swarm name or run id (`FTISConfig.swarm_name`, `swarm_run`), or None: 1 to
    [`MAX_BINDING_CHARS`] printable characters."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value or len(value) > MAX_BINDING_CHARS or not value.isprintable():
        return f"must be 1 to {MAX_BINDING_CHARS} printable characters, got {value!r:.60}"
    return None
