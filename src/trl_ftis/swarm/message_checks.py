"""Who a swarm client is and whom it can read: the keys it signs and verifies with ([`load_keys`]), and whether a
verified message of another peer can be used here ([`tokenizer_problem`]: its token ids or texts in this peer's
tokenizer). Used by [`trl_ftis.swarm.client.Swarm`] when it starts and for every message it decodes."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from ..exchange import Message

__all__ = ["load_keys", "tokenizer_problem"]

logger = logging.getLogger(__name__)


def load_keys(private_key: Any, public_keys: Any, peer_id: str, expected_peers: Sequence[str]) -> tuple[Any, Any]:
    """The key arguments of a swarm client loaded (from files when they are paths) and checked against each other
    (the same check as `FTISConfig.swarm_credentials`); warns when an expected peer has no registered public key."""
    from ..exchange import keys

    if isinstance(private_key, (str, os.PathLike)):
        private_key = keys.load_private_key(private_key)
    elif private_key is not None:
        keys.check_private_key(private_key)
    if isinstance(public_keys, (str, os.PathLike)):
        public_keys = keys.load_public_keys(public_keys)
    elif public_keys is not None:  # TypeError for anything but an Ed25519 key; a private key gives its public half
        public_keys = {peer: keys.public_key_of(key, f"public_keys[{peer!r}]") for peer, key in public_keys.items()}
    keys.check_key_pair(private_key, public_keys, peer_id)
    if public_keys is not None:
        unregistered = [peer for peer in expected_peers if peer not in public_keys]
        if unregistered:
            logger.warning(
                "Expected peers %s have no registered public key: their messages will be refused (unknown_peer).",
                ", ".join(map(repr, unregistered)),
            )
    return private_key, public_keys


def tokenizer_problem(
    message: Message, *, fingerprint: str, tokenizer_name: str, vocab_limit: int, cross_tokenizer: bool
) -> tuple[str, str] | None:
    """`(reason, explanation)` when a peer with this tokenizer (`fingerprint`, `tokenizer_name`, `vocab_limit`) cannot
    use `message`'s token ids or text, else `None`."""
    if message.tokenizer_fingerprint == fingerprint:
        if cross_tokenizer and message.completions:  # decoded without the vocabulary check
            highest = max(int(c.completion_ids.max()) for c in message.completions)
            if highest >= vocab_limit:
                return "ids", f"token id {highest} is outside this peer's vocabulary of {vocab_limit}."
        return None
    theirs = f"its tokenizer {message.tokenizer_name!r} (fingerprint {message.tokenizer_fingerprint[:12]})"
    ours = f"ours {tokenizer_name!r} (fingerprint {fingerprint[:12]})"
    if not cross_tokenizer:
        return "tokenizer", (
            f"{theirs} differs from {ours}; token ids would mean different tokens. Peers must share a tokenizer, "
            "or set cross_tokenizer=True on every peer (completions then travel as text too)."
        )
    if not any(c.text is not None for c in message.completions):
        return "tokenizer", (
            f"{theirs} differs from {ours} and its messages carry no completion text to re-tokenise: set "
            "cross_tokenizer=True on that peer too."
        )
    return None
