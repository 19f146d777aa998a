"""`RoundRunner` without a trainer: a stand-in swarm, the real admission on the tiny tokenizer (`row_owners.py`)."""

import threading
import time

import pytest
from row_owners import admission  # tests/ is on sys.path
from swarm_helpers import rows
from waits import returns_within

from trl_ftis.peer_rows import ScoredRow
from trl_ftis.swarm.round_budget import RoundResult
from trl_ftis.swarm.rounds import RoundRunner


class StandInSwarm:
    """Publishes into a list; `collect` hands over the rows queued for that round (an optional delay first)."""

    def __init__(self, by_round=None, delay=0.0):
        self.by_round, self.delay, self.published = dict(by_round or {}), delay, []
        self.interrupted = threading.Event()

    def publish(self, rows, round):
        self.published.append((round, len(rows)))
        return 10 * len(rows)

    def collect(self, round, *, max_rows=None, share=None):
        self.interrupted.wait(self.delay)
        result = RoundResult()
        result.rows = self.by_round.pop(round, [])
        for row in result.rows:
            result.peers[row.sender].rows_received += 1
        result.refused.update({"stale": 1} if round == 0 else {})
        return result

    def interrupt(self):
        self.interrupted.set()


def runner(tokenizer, swarm, **settings):
    gate = admission(tokenizer, trust_peer_rewards=True, **settings)
    return RoundRunner(config=gate.config, swarm=swarm, admission=gate, ledger=gate.ledger, scale_rewards="group")


def test_a_sync_round_publishes_admits_caps_and_normalises(tokenizer):
    received = rows("a", 4, group="g1") + rows("a", 4, group="g2") + rows("b", 4, group="g3", prompt="")
    rounds = runner(tokenizer, StandInSwarm({0: received}), max_peer_rows=4)
    outcome = rounds.round(rows("me", 8), 0)
    assert rounds.swarm.published == [(0, 8)]
    assert [row.group for row in outcome.rows] == ["g1"] * 4  # b's empty prompts dropped, then capped to 4
    assert all(isinstance(row, ScoredRow) for row in outcome.rows) and outcome.own_statistics is None
    advantages = [row.advantage for row in outcome.rows]
    assert advantages == sorted(advantages) and advantages[0] < 0 < advantages[-1]  # rewards 1, 2, 3, 4
    ledger = rounds.ledger
    assert ledger.dropped == {"empty_prompt": 4} and ledger.refused == {"stale": 1}
    assert {k: ledger.totals[k] for k in ("rows_sent", "rows_received", "rows_accepted", "bytes_sent")} == {
        "rows_sent": 8, "rows_received": 12, "rows_accepted": 4, "bytes_sent": 80,
    }  # fmt: skip
    metrics = outcome.metrics
    assert metrics["ftis/peer_rows_received"] == 12 and metrics["ftis/peer_rows_accepted"] == 4
    assert metrics["ftis/peers/a/rows_accepted"] == 4 and metrics["ftis/peers/b/rows_accepted"] == 0
    assert metrics["ftis/exchange/refused/stale"] == 1 and metrics["ftis/exchange/blocking_seconds"] >= 0


def test_peer_rows_are_rescored_unless_trusted(tokenizer):
    gate = admission(tokenizer)  # trust_peer_rewards off: the receiver's digit_reward decides
    received = rows("a", 4, reward=100.0)
    for row in received:
        row.extra = {"answer": "45"}  # [8, 9, 2] reads "45": every row scores 1
    rounds = RoundRunner(config=gate.config, swarm=StandInSwarm({0: received}), admission=gate, ledger=gate.ledger)
    outcome = rounds.round(rows("me", 4), 0)
    assert [row.reward for row in outcome.rows] == [1.0] * 4 and [row.advantage for row in outcome.rows] == [0.0] * 4


def test_an_unexpected_error_drops_the_round_rows_and_never_raises(tokenizer, monkeypatch):
    rounds = runner(tokenizer, StandInSwarm({0: rows("a", 4)}))
    monkeypatch.setattr(rounds.admission, "admit", lambda *a, **k: 1 / 0)
    outcome = rounds.round(rows("me", 4), 0)
    assert outcome.rows == [] and rounds.ledger.dropped == {"internal_error": 4}
    assert rounds.ledger.totals["rows_received"] == 4 and rounds.ledger.totals["rows_accepted"] == 0


def test_horizontal_mode_normalises_a_prompt_over_every_models_rows(tokenizer):
    own = rows("me", 2, reward=0.0)  # rewards 0, 1 on "12+34="
    mixed = rows("a", 2, reward=2.0)  # rewards 2, 3 on the same prompt
    alone = rows("b", 2, reward=5.0, prompt="99+1=")  # a prompt no local group has: its own normalisation
    rounds = runner(tokenizer, StandInSwarm({0: mixed + alone}), collaboration_mode="horizontal")
    outcome = rounds.round(own, 0)
    own_advantages, own_max = outcome.own_statistics
    mixed_advantages = [row.advantage for row in outcome.rows if row.sender == "a"]
    union = own_advantages + mixed_advantages  # rewards 0..3: one group of four
    assert union == sorted(union) and sum(union) == pytest.approx(0.0) and own_max == [3, 3]
    assert [row.advantage for row in outcome.rows if row.sender == "b"] == pytest.approx([-0.7071, 0.7071], abs=1e-3)


def test_an_enormous_peer_reward_never_reaches_the_own_rows(tokenizer):
    own = rows("me", 2, reward=0.0)
    hostile = rows("a", 2)
    hostile[0].reward, hostile[1].reward = 1e300, -1e300
    rounds = runner(tokenizer, StandInSwarm({0: hostile}), collaboration_mode="horizontal")
    rounds.scale_rewards = "none"
    outcome = rounds.round(own, 0)
    assert outcome.rows == [] and rounds.ledger.dropped == {"advantage_too_large": 2}
    assert outcome.own_statistics[0] == [-0.5, 0.5]  # the own rows normalised among themselves


def test_async_rounds_lag_by_one_and_the_worker_stops_on_close(tokenizer):
    swarm = StandInSwarm({0: rows("a", 4, group="r0"), 1: rows("a", 4, group="r1")})
    rounds = runner(tokenizer, swarm, exchange_mode="async")
    assert rounds.round(rows("me", 4), 0).rows == []  # the first step: nothing collected yet
    second = rounds.round(rows("me", 4), 1)
    assert {row.group for row in second.rows} == {"r0"}  # round 0's rows, trained on at step 1
    rounds.wait()
    third = rounds.round(rows("me", 4), 2)
    assert {row.group for row in third.rows} == {"r1"}
    rounds.close()
    assert rounds.mode.worker is None and not [t for t in threading.enumerate() if t.name.startswith("ftis-exchange")]


def test_a_failing_async_round_is_counted_and_the_next_one_runs(tokenizer, monkeypatch):
    rounds = runner(tokenizer, StandInSwarm({1: rows("a", 4, group="r1")}), exchange_mode="async")
    finish = rounds.finish_round

    def fail_in_round_0(own_rows, round, result, bytes_sent):
        if round == 0:
            raise RuntimeError("boom")
        return finish(own_rows, round, result, bytes_sent)

    monkeypatch.setattr(rounds, "finish_round", fail_in_round_0)
    rounds.round(rows("me", 4), 0)
    failed = rounds.round(rows("me", 4), 1)
    assert failed.rows == [] and failed.metrics["ftis/exchange/worker_errors"] == 1 and rounds.worker_errors == 1
    assert {row.group for row in rounds.round(rows("me", 4), 2).rows} == {"r1"}
    rounds.close()


def test_closing_interrupts_a_round_waiting_for_peers(tokenizer):
    rounds = runner(tokenizer, StandInSwarm(delay=600.0), exchange_mode="async")
    rounds.round(rows("me", 4), 0)
    # a close that waited for the round's 600 s wait to run out would trip the hang guard
    returns_within(rounds.close, what="closing during a round that waits")
    assert rounds.swarm.interrupted.is_set()


def test_the_lock_counts_the_time_the_training_loop_waited(tokenizer):
    rounds = runner(tokenizer, StandInSwarm())
    held = threading.Event()

    def hold():
        with rounds.lock:
            held.set()
            time.sleep(0.2)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    with rounds.turn():
        pass
    thread.join()
    assert rounds.round(rows("me", 4), 0).metrics["ftis/exchange/blocking_seconds"] >= 0.15
    assert rounds.round(rows("me", 4), 1).metrics["ftis/exchange/blocking_seconds"] < 0.15  # counted once
