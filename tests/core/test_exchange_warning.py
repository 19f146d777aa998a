"""A swarm that exchanged nothing does not end silently: the end of a peer's run warns when it accepted no peer rows,
or dropped more than it accepted, with the counts by reason (`trl_ftis.exchange_report.exchange_warning`)."""

from __future__ import annotations

import logging
import uuid

from swarm_helpers import make_swarm
from tiny_trainers import tiny_trainer

from trl_ftis.exchange_report import exchange_warning
from trl_ftis.peer_rows import PeerRow


def summary(**fields):
    return {"peer_id": "me", "rows_received": 0, "rows_accepted": 0, "refused": {}, "dropped": {}, **fields}


def test_no_rows_accepted_is_said_with_the_reasons():
    text = exchange_warning(summary(rows_received=0, refused={"signature": 12, "unsigned": 3}))
    assert text == (
        "me: accepted no peer rows: received 0 rows; refused 15 messages (signature: 12, unsigned: 3); the peers do "
        "not share one swarm secret or key set (docs/security.md)."
    )
    quiet = exchange_warning(summary())
    assert quiet == "me: accepted no peer rows: received 0 rows; refused no messages."


def test_more_rows_dropped_than_accepted_is_said_and_a_healthy_run_is_not():
    text = exchange_warning(summary(rows_received=40, rows_accepted=8, dropped={"too_long": 30, "bad_logps": 2}))
    assert text == (
        "me: dropped more peer rows (32) than it accepted (8): received 40 rows; refused no messages; dropped 32 rows "
        "(too_long: 30, bad_logps: 2)."
    )
    assert exchange_warning(summary(rows_received=40, rows_accepted=30, dropped={"too_long": 10})) is None


def test_a_peer_whose_secret_no_one_else_has_warns_at_the_end(tokenizer, make_args, caplog):
    """Only this peer has a secret: every message of the other is refused (unsigned), and the run says so."""
    url = f"memory://exchange-warning-{uuid.uuid4().hex}"
    stranger = make_swarm(url, "other", tokenizer)
    for round_ in range(4):
        stranger.publish([PeerRow("12+34=", [5, 6], [-0.5, -0.5], 1.0, "g0", sender="other")], round_)
    args = make_args(max_steps=2, exchange_url=url, peer_id="me", swarm_secret="only-mine", peer_timeout=0.5)
    trainer = tiny_trainer(tokenizer, args)
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        trainer.train()
    warned = [r.getMessage() for r in caplog.records if "accepted no peer rows" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert "unsigned:" in warned[0] and "swarm secret" in warned[0]
    assert trainer.summary()["rows_accepted"] == 0
