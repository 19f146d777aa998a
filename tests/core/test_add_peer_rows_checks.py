"""`FTISTrainer.add_peer_rows` refuses, before queueing anything, rows that a multi-process job could not share:
the rows added on every process are gathered with accelerate's `gather_object`, which pickles them, so a row whose
`extra` or `group` cannot be pickled used to be queued and then fail the next step on that process only (the whole
job exited 1)."""

from __future__ import annotations

import threading

import pytest
from swarm_helpers import a_row  # tests/ is on sys.path
from tiny_trainers import tiny_trainer


class Unpicklable:
    """Hashable (a valid `group`), but refuses to be pickled, as a handle or a connection does."""

    def __reduce__(self):
        raise TypeError("cannot pickle 'Unpicklable' object")


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"extra": {"answer": "46", "f": lambda x: x}}, r"PeerRow\.extra\['f'\]"),
        ({"extra": {"lock": threading.Lock()}}, r"PeerRow\.extra\['lock'\]"),
        ({"group": threading.Lock()}, r"PeerRow\.group"),
        ({"group": Unpicklable()}, r"PeerRow\.group"),
        ({"prompt": [{"role": "user", "content": "12+34=", "handle": threading.Lock()}]}, r"PeerRow\.prompt"),
        ({"rewards_per_func": {"digits": 1.0, "how": lambda: 0}}, r"PeerRow\.rewards_per_func"),
    ],
    ids=["extra-lambda", "extra-lock", "group-lock", "group-reduce", "prompt-lock", "rewards_per_func-lambda"],
)
def test_rows_that_cannot_be_pickled_are_refused_before_any_is_queued(tokenizer, make_args, overrides, field):
    trainer = tiny_trainer(tokenizer, make_args())
    assert trainer.add_peer_rows([a_row(group="queued before")]) == 1
    queued = list(trainer._inbox.rows)
    with pytest.raises(TypeError, match=rf"^{field} cannot be pickled \(row 1 of this call, from 'peer'\): "):
        trainer.add_peer_rows([a_row(), a_row(**overrides), a_row()])
    assert trainer._inbox.rows == queued  # the call's good rows, before and after the bad one, were not queued
    assert trainer.num_pending_peer_rows == 1


def test_the_refusal_says_why_and_how_rows_are_shared(tokenizer, make_args):
    trainer = tiny_trainer(tokenizer, make_args())
    with pytest.raises(TypeError) as refused:
        trainer.add_peer_rows([a_row(sender="alice", extra={"lock": threading.Lock()})])
    message = str(refused.value)
    assert "PeerRow.extra['lock'] cannot be pickled (row 0 of this call, from 'alice')" in message
    assert "TypeError: cannot pickle '_thread.lock' object" in message  # the pickling error itself
    assert "gather_object" in message
    assert trainer.num_pending_peer_rows == 0


def test_rows_of_plain_data_are_still_queued(tokenizer, make_args):
    trainer = tiny_trainer(tokenizer, make_args())
    rows = [
        a_row(extra={"answer": "46", "nested": {"a": [1, 2.5, None]}}, group=("prompt", 3)),
        a_row(group=7, rewards_per_func={"digits": 1.0}, prompt=[{"role": "user", "content": "12+34="}]),
    ]
    assert trainer.add_peer_rows(rows) == 2
