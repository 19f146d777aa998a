"""What a swarm believes of the clock values a message carries (`Message.epoch`, `Message.created`).

Both are signed, but with a shared secret any member can sign them under any peer's name, so neither may decide
anything for longer than a stated bound:

* A start (`epoch`, microseconds since 1970) further ahead of the receiver's clock than [`EPOCH_LEAD_LIMIT`] is
  refused (`epoch`) before anything records it. An honest start is the sender's clock when it started, so a clock
  that runs fast is refused only until the receiver's clock is within the limit of that start.
* A message's `created` counts as at most [`CREATED_SLACK`] seconds ahead of the receiver's clock ([`heard_at`]).
  A sender's messages are taken in the order of their (start, round), or when they were created later than every
  message taken from that sender ([`trl_ftis.swarm.exchange_modes.free_order.SenderOrder`]): an honest sender never
  makes a later message of an earlier round or start, so a far-future round or start signed under its name stops its
  messages for at most `CREATED_SLACK` seconds after the last such message.
* A start's epoch is never older than the one it resumed from ([`start_epoch`]).
"""

from __future__ import annotations

import logging
import time

__all__ = ["CREATED_SLACK", "EPOCH_LEAD_LIMIT", "MAX_EPOCH", "epoch_lead", "heard_at", "now_epoch", "start_epoch"]

logger = logging.getLogger(__name__)

EPOCH_LEAD_LIMIT = 3600.0
"""Seconds a message's start (`epoch`) may be ahead of the receiver's clock; further is refused (`epoch`)."""
CREATED_SLACK = 60.0
"""Seconds a message's `created` may be ahead of the receiver's clock when it orders a sender's messages."""
MAX_EPOCH = 2**63 - 1  # the wire format's bound: epochs fit int64


def now_epoch() -> int:
    """This machine's clock as an epoch: microseconds since 1970."""
    return time.time_ns() // 1000


def epoch_lead(epoch: int, now: int | None = None) -> float | None:
    """Seconds `epoch` is ahead of the clock (`now`, an epoch) when that is more than [`EPOCH_LEAD_LIMIT`], else
    None."""
    lead = (epoch - (now_epoch() if now is None else now)) / 1e6
    return lead if lead > EPOCH_LEAD_LIMIT else None


def heard_at(created: float, now: float | None = None) -> float:
    """When a message counts as made, for ordering its sender's messages: its `created`, at most [`CREATED_SLACK`]
    seconds ahead of the receiver's clock (`now`, seconds since 1970)."""
    now = time.time() if now is None else now
    return min(float(created), now + CREATED_SLACK)


def start_epoch(saved: int, now: int | None = None) -> int:
    """The epoch of a start that resumes from a state whose start was `saved`: newer than it and not older than the
    clock. A saved start further ahead of the clock than [`EPOCH_LEAD_LIMIT`] was refused by receivers whose clocks
    agree with this one; this start then takes the clock (said once), so every start stays newer than any start a
    receiver took, and none is stuck at the largest epoch."""
    now = now_epoch() if now is None else now
    if epoch_lead(saved + 1, now) is not None:
        logger.warning(
            "The resumed state's start (epoch %d) is %.0f s ahead of this machine's clock, more than the %.0f s "
            "peers accept: this start takes the clock's epoch instead.",
            saved,
            (saved - now) / 1e6,
            EPOCH_LEAD_LIMIT,
        )
        return now
    return min(max(now, saved + 1), MAX_EPOCH)
