"""What a swarm peer signs and verifies its messages with ([`SwarmCredentials`]), read from its config, the
environment and its key files ([`read_swarm_credentials`], which `FTISConfig.swarm_credentials` calls)."""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

from .message_trust import binding_problem
from .shared_names import SWARM_NAME_ENV, SWARM_RUN_ENV, SWARM_SECRET_ENV

__all__ = ["SwarmCredentials", "read_swarm_credentials"]

logger = logging.getLogger(__name__)


class SwarmCredentials(NamedTuple):
    """What a peer signs and verifies messages with ([`read_swarm_credentials`])."""

    secret: str | None
    """The swarm secret (HMAC: membership), or `None`."""
    private_key: Any
    """This peer's Ed25519 private key, or `None`."""
    public_keys: dict[str, Any] | None
    """Peer id -> Ed25519 public key, or `None`."""
    swarm_name: str | None = None
    """The swarm every message is bound to (sent and required), or `None`."""
    run_id: str | None = None
    """The run of that swarm every message is bound to (sent and required), or `None`."""

    def describe(self) -> str:
        """How this peer's messages are authenticated, in one line (logged when a trainer joins its swarm)."""
        parts = []
        if self.public_keys is not None:
            parts.append(
                f"per-peer keys (Ed25519; {len(self.public_keys)} registered, only their signatures accepted)"
            )
        elif self.private_key is not None:
            parts.append("this peer's key (Ed25519) signs its messages; no peer keys registered, so none are required")
        if self.secret is not None:
            parts.append("a shared swarm secret (HMAC)")
        bound = [f"{what} {value!r}" for what, value in (("swarm", self.swarm_name), ("run", self.run_id)) if value]
        binding = f"; messages bound to {' and '.join(bound)}" if bound else ""
        if not parts:
            return (
                "none: messages are neither signed nor checked; anyone who can write to the exchange can send rows"
                + binding
            )
        return " and ".join(parts) + binding


def read_swarm_credentials(config: Any) -> SwarmCredentials:
    """`config`'s credentials (an `FTISConfig`; see `FTISConfig.swarm_credentials`), read now."""
    secret = config.swarm_secret or os.environ.get(SWARM_SECRET_ENV) or None
    binding = {}
    for name, env, key in (("swarm_name", SWARM_NAME_ENV, "swarm_name"), ("swarm_run", SWARM_RUN_ENV, "run_id")):
        value = getattr(config, name)
        if value is None:
            value = os.environ.get(env)
        problem = None if not value else binding_problem(value)
        if problem is not None:
            raise ValueError(f"{name} (from ${env}) {problem}.")
        if name == "swarm_run" and value is None and config.exchange_url is not None:
            raise ValueError(
                f"This peer joins a swarm (exchange_url) but names no run: set swarm_run (--swarm_run) or "
                f"${env} to one id that every peer of this run is given and that is new for each run (for "
                "example --swarm_run pair-1 on every command, pair-2 the next time; `trl-ftis swarm` draws one for "
                "the peers it starts), so that messages of earlier runs (leftovers in a reused exchange, "
                "replays) are refused. To take messages of any run instead, set it to an empty string "
                f"(--swarm_run '' or {env}=''): docs/security.md says what that leaves open."
            )
        binding[key] = value or None
    if config.private_key_file is None and config.peer_keys_file is None:
        return SwarmCredentials(secret, None, None, **binding)
    for name in ("private_key_file", "peer_keys_file"):
        path = getattr(config, name)
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{name}: {path!r} does not exist or is not a file (`trl-ftis keygen` writes one).")
    from .exchange.keys import KeyFileError, check_key_pair, load_private_key, load_public_keys

    try:
        private = load_private_key(config.private_key_file) if config.private_key_file else None
        public = load_public_keys(config.peer_keys_file) if config.peer_keys_file else None
    except KeyFileError as error:
        raise ValueError(str(error)) from None
    check_key_pair(
        private,
        public,
        config.peer_id,
        where=f"of peer_keys_file {config.peer_keys_file!r} (private_key_file {config.private_key_file!r})",
    )
    if public is not None and private is None:
        logger.warning(
            "peer_keys_file is set but private_key_file is not: this peer verifies the others' signatures, but "
            "its own messages carry none, and peers that require keys refuse them (unsigned)."
        )
    elif public is not None and config.peer_id not in public:
        logger.warning(
            "peer_keys_file %r has no key for this peer (%r): peers using the same file refuse its messages "
            "(unknown_peer). Add the line `trl-ftis keygen` printed for it.",
            config.peer_keys_file,
            config.peer_id,
        )
    return SwarmCredentials(secret, private, public, **binding)
