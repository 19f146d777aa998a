"""What `FTISConfig` keeps secret: the swarm secret and the password an exchange URL may hold, read when the trainer
starts ([`SecretFields.swarm_credentials`]) and redacted wherever the config is shown or saved.

Only what is shown or saved is redacted: `to_dict()` / `to_json_string()` (logs, trackers, the model card), `str()` /
`repr()`, and the trainer's `training_args.bin` (written from `redacted_copy()`). Copies and pickles (`copy.copy`,
`copy.deepcopy`, `pickle`, multiprocessing, accelerate) keep the real values on purpose: a copy that trained with
`<redacted>` as its secret would silently never exchange.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from .credentials import SwarmCredentials, read_swarm_credentials
from .redaction import REDACTED, redact_url


class SecretFields:
    """The secrets' half of `FTISConfig` (a mixin before `GRPOConfig` in its bases, so that its `to_dict` and
    `__str__` wrap TRL's): reads the credentials, and hides `swarm_secret` and the exchange URL's password."""

    swarm_secret: str | None
    exchange_url: str | None

    def swarm_credentials(self) -> SwarmCredentials:
        """
        What this peer signs and verifies with, read now: the swarm secret (`swarm_secret`, else the environment
        variable `FTIS_SWARM_SECRET`), this peer's private key (`private_key_file`) and the swarm's public keys
        (`peer_keys_file`), loaded and checked against each other, and the swarm and run its messages are bound to
        (`swarm_name`, else `FTIS_SWARM_NAME`; `swarm_run`, else `FTIS_SWARM_RUN`; an empty value: none).

        [`FTISTrainer`] calls it once, before it loads the model, so that a wrong path or a malformed key file fails
        at once, naming the file; the config itself never reads the environment or a file. Raises `ValueError` (a
        missing, unreadable or malformed file, a key file that registers another key for this peer, a peer with an
        `exchange_url` and no run id, neither given nor empty on purpose); warns when only
        one of the two key files is set, or when the public keys have no entry for this peer.
        """
        return read_swarm_credentials(self)

    def redacted_fields(self) -> dict[str, str]:
        """Field -> value shown instead: the secret, and the exchange URL without its password (a key file's path is
        not a secret)."""
        hidden = {}
        if self.swarm_secret:
            hidden["swarm_secret"] = REDACTED
        if self.exchange_url and redact_url(self.exchange_url) != self.exchange_url:
            hidden["exchange_url"] = redact_url(self.exchange_url)
        return hidden

    def redacted_copy(self) -> Any:
        """A shallow copy of this config with the swarm secret and the exchange URL password replaced by
        `<redacted>`, for what is written to disk or uploaded (`FTISTrainer` saves `training_args.bin` from it).

        `self` is unchanged, and the copy is never validated again (`__post_init__` does not run): it is for
        saving, not for training (it could not verify a single message)."""
        clone = copy.copy(self)
        clone.__dict__.update(self.redacted_fields())
        return clone

    @staticmethod
    def saving_redacted(method):
        """`method` (a Trainer method that saves `self.args`, such as `Trainer._save`, which writes
        `training_args.bin` with `torch.save(self.args, ...)`) run with `self.args` swapped for its `redacted_copy()`.

        The swap lasts only while `method` runs: the trainer has its real config back afterwards, also when `method`
        raises. Only the two secret fields differ in the copy, so everything else `method` reads is the same."""

        @functools.wraps(method)
        def wrapper(trainer, *args, **kwargs):
            real = trainer.args
            trainer.args = real.redacted_copy()
            try:
                return method(trainer, *args, **kwargs)
            finally:
                trainer.args = real

        return wrapper

    def to_dict(self):
        # Secrets must never reach logs, trackers or the model card (`to_json_string` and `to_sanitized_dict` use
        # this too).
        data = super().to_dict()
        data.update(self.redacted_fields())
        return data

    def __str__(self):
        text = super().__str__()
        for name, shown in self.redacted_fields().items():
            text = text.replace(f"{name}={getattr(self, name)},", f"{name}={shown},")
        return text

    __repr__ = __str__
