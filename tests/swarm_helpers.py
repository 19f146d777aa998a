"""Helpers shared by the swarm tests: a round client on the tiny character tokenizer, rows to publish, and a stand-in
partner that publishes as a trainer steps."""

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from transformers import TrainerCallback

from trl_ftis import PeerRow
from trl_ftis.exchange import tokenizer_fingerprint
from trl_ftis.exchange.transports import open_transport
from trl_ftis.exchange_mode_registry import EXCHANGE_MODE_NAMES, EXCHANGE_MODES, register_exchange_mode
from trl_ftis.swarm.client import Swarm


def make_swarm(url, peer_id, tokenizer, **overrides):
    """A `Swarm` for `peer_id` on `url`, with the tiny tokenizer's fingerprint and the digit-match reward."""
    settings = {
        "peer_id": peer_id,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "tokenizer_name": "char",
        "vocab_limit": len(tokenizer),
        "temperature": 1.0,
        "reward_names": ["digit_match_reward"],
        "peer_timeout": 5.0,
    }
    # A fixed key per peer: the order in which a test's receiver reads senders is reproducible (a real one is random).
    settings["order_key"] = hashlib.blake2b(peer_id.encode(), digest_size=16, person=b"ftis-tests").digest()
    settings.update(overrides)
    return Swarm(url, **settings)


def publish_raw(url, data, *, sender, round):
    """Publish raw bytes under any transport metadata, as a hostile writer of the exchange can."""
    with open_transport(url) as transport:
        transport.publish(data, sender=sender, round=round)


def wire_message(tokenizer, sender, round=0, *, count=4, prompt="12+34=", created=None, **fields):
    """`rows(sender, count, prompt=prompt)` as the wire `Message` of `round` (with `created` and any other `Message`
    fields set), for tests that encode, sign, tamper with or replay messages themselves."""
    from trl_ftis.swarm.peer_messages import rows_to_message

    built = rows_to_message(
        rows(sender, count=count, prompt=prompt),
        sender=sender,
        round=round,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        tokenizer_name="char",
        temperature=1.0,
        reward_names=["digit_match_reward"],
    )
    if created is not None:
        built.created = created
    for name, value in fields.items():
        setattr(built, name, value)
    return built


def a_row(**overrides):
    """One `PeerRow` of the tiny task (prompt `12+34=`, three tokens, reward 1, group `g`), with `overrides`."""
    row = {
        "prompt": "12+34=",
        "completion_ids": [8, 9, 2],
        "generator_logps": [-0.5, -1.0, -0.1],
        "reward": 1.0,
        "group": "g",
    }
    row.update(overrides)
    return PeerRow(**row)


def rows(sender, count=4, group="g", prompt="12+34=", reward=1.0, round=0):
    """`count` rows of one group from `sender`, with rewards `reward`, `reward + 1`, ..."""
    return [
        PeerRow(
            prompt=prompt,
            completion_ids=[8, 9, 2],
            generator_logps=[-0.5, -1.0, -0.25],
            reward=reward + k,
            group=group,
            sender=sender,
            rewards_per_func={"digit_match_reward": reward + k},
            extra={"answer": "46"},
            round=round,
        )
        for k in range(count)
    ]


class SyncModePartner(TrainerCallback):
    """Another peer: publishes 8 rows of 3 tokens (group `g<round>`) for the trainer's round when each step begins."""

    def __init__(self, swarm):
        self.swarm = swarm

    def on_step_begin(self, args, state, control, **kwargs):
        round = state.global_step
        self.swarm.publish(rows("partner", count=8, group=f"g{round}", round=round), round)


@contextmanager
def registered_mode(mode: type) -> Iterator[type]:
    """`mode` selectable as `exchange_mode=mode.name` inside the block, and not after it."""
    register_exchange_mode(mode)
    try:
        yield mode
    finally:
        del EXCHANGE_MODES[mode.name]
        EXCHANGE_MODE_NAMES.remove(mode.name)
