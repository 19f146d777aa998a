"""The ledger of what collaboration bought (`trl_ftis.step_clock`, `trl_ftis.peer_value`,
`trl_ftis.collaboration_report`): the pure formulas and owners against
hand-computed values, then in a trainer: `ftis/time/...`, `ess_frac`, `summary()`, the checkpoint and the card."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from swarm_helpers import SyncModePartner, make_swarm
from tiny_trainers import exchange_trainer, tiny_trainer, without_control_tokens

from trl_ftis.collaboration_report import collaboration_report, stand_in_seconds
from trl_ftis.loss_metrics import metric_groups, source_sums, value_sums
from trl_ftis.objective import FTISTerms
from trl_ftis.peer_value import OWN, PeerValue, effective_fraction
from trl_ftis.step_clock import StepClock, generation_share


# -- pure formulas -------------------------------------------------------------------------------------------------
def test_effective_fraction_by_hand():
    # Row weights 1, 0.5, 0: (Σw)² / Σw² = 1.5² / 1.25 = 1.8 of 3 rows.
    assert effective_fraction(1.5, 1.25, 3) == pytest.approx(0.6)
    assert effective_fraction(4.0, 4.0, 4) == pytest.approx(1.0)  # equal weights: every row counts
    assert effective_fraction(0.0, 0.0, 5) == 0.0  # every row filtered
    assert effective_fraction(0.0, 0.0, 0) is None


def test_generation_share_and_stand_in_seconds_by_hand():
    assert generation_share(3.0, 12.0) == pytest.approx(0.25)
    assert generation_share(1.0, 0.0) is None
    # 200 own tokens took 8 s: 50 peer tokens stand in for 2 s of it.
    assert stand_in_seconds(50, 200, 8.0) == pytest.approx(2.0)
    assert stand_in_seconds(50, 0, 8.0) is None


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_gpu_step_clock_waits_for_queued_work_before_each_reading():
    # Kernels are queued, not run: a phase's own work lands in the clock only once the device is synchronized.
    now, queued = FakeClock(), []

    def synchronize():
        now.now += sum(queued)
        queued.clear()

    clock = StepClock(clock=now, synchronize=synchronize)
    clock.begin()
    with clock.measure("training"):
        queued.append(3.0)  # a backward pass, still running on the device when the phase ends
    with clock.measure("exchange"):
        now.now += 1.0
    assert clock.end()["training"] == 3.0
    unsynchronized = StepClock(clock=now)
    unsynchronized.begin()
    with unsynchronized.measure("training"):
        queued.append(3.0)
    with unsynchronized.measure("exchange"):
        synchronize()  # the next phase waits for it: counted there
    split = unsynchronized.end()
    assert (split["training"], split["exchange"]) == (0.0, 3.0)


def test_step_clock_splits_a_step_by_hand():
    now = FakeClock()
    clock = StepClock(clock=now)
    clock.begin()
    with clock.measure("generation"):
        now.now = 2.0
    with clock.measure("scoring"):
        now.now = 3.0
    clock.add("training", 4.0)
    now.now = 10.0
    split = clock.end()
    assert split == {
        "step": 10.0,
        "generation": 2.0,
        "scoring": 1.0,
        "exchange": 0.0,
        "training": 4.0,
        "other": 3.0,
        "generation_share": 0.2,
    }
    # A second step; a phase measured outside a step (evaluation between steps) belongs to none.
    with clock.measure("generation"):
        now.now = 15.0
    clock.begin()
    with clock.measure("exchange"):
        now.now = 16.0
    assert clock.end()["step"] == 1.0
    assert clock.totals == {
        "step": 11.0,
        "generation": 2.0,
        "scoring": 1.0,
        "exchange": 1.0,
        "training": 4.0,
        "other": 3.0,
    }
    assert clock.steps == 2 and clock.end() is None
    with pytest.raises(KeyError, match="not a phase"):
        clock.add("sleeping", 1.0)


def test_collaboration_report_by_hand():
    clock = StepClock(clock=FakeClock())
    clock.totals.update(step=20.0, generation=8.0, exchange=1.5)
    value = PeerValue()
    value.record_merge({OWN: (100, 400), "a": (50, 200), "b": (0, 0)})
    value.record_loss(OWN, rows=100, weight_sum=100.0, weight_square_sum=100.0, filtered=0)
    # Peer a: 50 rows, Σw = 30, Σw² = 25, 10 filtered: ESS = 900 / 25 = 36 rows, 0.72 of 50.
    value.record_loss("a", rows=50, weight_sum=30.0, weight_square_sum=25.0, filtered=10)
    report = collaboration_report(clock, value, {"a": 60}, ["a", "b"])
    a = report["peer_value"]["peers"]["a"]
    assert a["rows_in_loss"] == 50 and a["tokens"] == 200 and a["rows_accepted"] == 60
    assert a["ess_frac"] == pytest.approx(0.72) and a["filtered_frac"] == pytest.approx(0.2)
    assert a["rows_worth"] == pytest.approx(36.0)
    assert a["generation_seconds_stood_in"] == pytest.approx(4.0)  # 200 tokens at 8 s / 400 tokens
    assert report["peer_value"]["peers"]["b"]["rows_in_loss"] == 0
    assert report["peer_value"]["rows_worth"] == pytest.approx(36.0)
    assert report["generation_share"] == pytest.approx(0.4)
    assert report["own_generation"] == {"rows": 100, "tokens": 400, "seconds": 8.0}
    assert report["collaboration"] == (
        "peers supplied 50 rows (200 tokens), as close to my own sampling as about 36 rows of mine (effective sample "
        "size: not what they taught, which only a control trained alone measures); they stood in for about 4 s of my "
        "generation; the exchange took 1.5 s; 100 own rows; generation share f = 0.40"
    )


def test_a_peer_named_own_is_not_this_trainer():
    value = PeerValue()
    value.record_merge({OWN: (8, 16), "own": (4, 4)})
    assert value.report(OWN)["rows_in_loss"] == 8 and value.report("own")["rows_in_loss"] == 4


def test_states_round_trip_and_malformed_ones_change_nothing():
    clock, value = StepClock(), PeerValue()
    clock.totals["generation"] = 3.5
    clock.steps = 4
    value.record_merge({OWN: (8, 16), "a": (4, 9)})
    value.record_loss("a", rows=4, weight_sum=3.0, weight_square_sum=2.5, filtered=1)
    state = json.loads(json.dumps({"time": clock.state_dict(), "value": value.state_dict()}))
    again_clock, again_value = StepClock(), PeerValue()
    again_clock.load_state_dict(state["time"])
    again_value.load_state_dict(state["value"])
    assert again_clock.totals == clock.totals and again_clock.steps == 4
    assert again_value.state_dict() == value.state_dict()
    bad_clocks = [
        {"totals": {**clock.totals, "generation": -1.0}, "steps": 1},
        {"totals": {**clock.totals, "generation": float("inf")}, "steps": 1},
        {"totals": {"step": 1.0}, "steps": 1},
        {"totals": clock.totals, "steps": True},
        [],
    ]
    for bad in bad_clocks:
        with pytest.raises(ValueError, match="time"):
            again_clock.load_state_dict(bad)
    assert again_clock.totals == clock.totals
    bad_values = [
        {"own": state["value"]["own"]},
        {"own": state["value"]["own"], "peers": {"a": {"rows": 1}}},
        {"own": state["value"]["own"], "peers": {"a": {**state["value"]["peers"]["a"], "rows": "1"}}},
        {"own": state["value"]["own"], "peers": {str(i): state["value"]["own"] for i in range(10_001)}},
    ]
    for bad in bad_values:
        with pytest.raises(ValueError, match="peer_value"):
            again_value.load_state_dict(bad)
    assert again_value.state_dict() == value.state_dict()


# -- the loss's row weights ------------------------------------------------------------------------------------------
def test_source_sums_row_weights_by_hand():
    # Row 0 (own): weights 1, 1. Row 1 (peer 1): weights 0.5, 1.5 -> row weight 1.0. Row 2 (peer 1): one token,
    # weight 2, but filtered -> row weight 0. Row 3 (peer 1): weights 0.5 and a padded 9 -> row weight 0.5.
    weights = torch.tensor([[1.0, 1.0], [0.5, 1.5], [2.0, 0.0], [0.5, 9.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False], [True, False]])
    terms = FTISTerms(
        token_advantages=torch.zeros(4, 2),
        ratio_reference_logps=torch.zeros(4, 2),
        weights=weights,
        capped=torch.zeros(4, 2, dtype=torch.bool),
        filter_statistic=torch.zeros(4),
        keep=torch.tensor([True, True, False, True]),
    )
    sums, maxes = source_sums(terms, mask, torch.tensor([0, 1, 1, 1]), 2)
    assert sums[0, 7:].tolist() == [1.0, 1.0]
    assert sums[1, 7:].tolist() == pytest.approx([1.5, 1.25])
    totals = dict(value_sums(sums, ["p"]))
    assert totals[None] == {"rows": 1.0, "weight_sum": 1.0, "weight_square_sum": 1.0, "filtered": 0.0}
    assert totals["p"] == pytest.approx({"rows": 3.0, "weight_sum": 1.5, "weight_square_sum": 1.25, "filtered": 1.0})
    groups = {name: values for name, values, _ in metric_groups(sums, maxes, ["p"])}
    assert groups["own"]["ess_frac"] == pytest.approx(1.0)
    assert groups["peers/p"]["ess_frac"] == pytest.approx(0.6)  # 1.5² / 1.25 / 3


# -- in a trainer ----------------------------------------------------------------------------------------------------
def own_rows_of(tokenizer, make_args, steps=2):
    """The rows a hidden-32 trainer generated in `steps` steps, as PeerRows of sender "other"."""
    rows = []
    trainer = tiny_trainer(tokenizer, make_args(max_steps=steps), hidden_size=32, seed=3)
    trainer.add_row_listener(rows.extend)
    trainer.train()
    return without_control_tokens([dataclasses.replace(row, sender="other") for row in rows], tokenizer)


def test_a_run_without_peers_logs_its_time_split_and_says_it_had_no_peers(tokenizer, make_args):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=2))
    own = []
    trainer.add_row_listener(own.extend)
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "ftis/time/step" in entry]
    assert len(steps) == 2
    for entry in steps:
        parts = [entry[f"ftis/time/{name}"] for name in ("generation", "scoring", "exchange", "training", "other")]
        assert all(part >= 0 for part in parts) and entry["ftis/time/exchange"] == 0.0
        assert sum(parts) == pytest.approx(entry["ftis/time/step"], rel=1e-6)
        assert entry["ftis/time/generation"] > 0 and entry["ftis/time/training"] > 0
        assert entry["ftis/time/generation_share"] == pytest.approx(
            entry["ftis/time/generation"] / entry["ftis/time/step"]
        )
        assert entry["ftis/own/ess_frac"] == pytest.approx(1.0)  # own rows are on-policy: every weight is 1
    summary = trainer.summary()
    times = summary["time_seconds"]
    assert times["step"] == pytest.approx(sum(e["ftis/time/step"] for e in steps), rel=1e-4)
    assert times["step"] <= summary["train_seconds"]
    assert summary["own_generation"]["rows"] == 32  # 2 steps x 16 rows
    assert summary["own_generation"]["tokens"] == sum(len(row.completion_ids) for row in own)
    assert summary["own_generation"]["seconds"] == pytest.approx(times["generation"])
    assert summary["peer_value"]["rows_in_loss"] == 0 and summary["peer_value"]["peers"] == {}
    assert summary["collaboration"].startswith("peers supplied no rows; 32 own rows trained on")
    written = json.loads((Path(trainer.args.output_dir) / "ftis_summary.json").read_text())
    assert written["generation_share"] == pytest.approx(summary["generation_share"])


def test_peer_rows_are_valued_in_the_summary_the_checkpoint_and_the_card(tokenizer, make_args, tmp_path):
    rows = own_rows_of(tokenizer, make_args)
    tokens = sum(len(row.completion_ids) for row in rows)
    args = make_args(max_steps=2, save_strategy="steps", save_steps=2, output_dir=str(tmp_path / "helped"))
    trainer = tiny_trainer(tokenizer, args)
    trainer.add_peer_rows(rows[:16])
    trainer.add_row_listener(lambda _: trainer.add_peer_rows(rows[16:]) if trainer.state.global_step == 1 else None)
    trainer.train()
    summary = trainer.summary()
    value = summary["peer_value"]
    other = value["peers"]["other"]
    assert other["rows_in_loss"] == 32 and other["tokens"] == tokens and value["tokens"] == tokens
    assert 0 < other["ess_frac"] <= 1 and other["rows_worth"] == pytest.approx(other["ess_frac"] * 32)
    assert other["filtered_frac"] == 0.0  # a similar small model: nothing filtered
    own = summary["own_generation"]
    assert other["generation_seconds_stood_in"] == pytest.approx(tokens * own["seconds"] / own["tokens"], rel=1e-4)
    assert (
        f"peers supplied 32 rows ({tokens} tokens), as close to my own sampling as about "
        f"{other['rows_worth']:.0f} rows" in summary["collaboration"]
    )
    logged = [entry["ftis/peers/other/ess_frac"] for entry in trainer.state.log_history if "ftis/peer_rows" in entry]
    assert len(logged) == 2 and all(0 < fraction <= 1 for fraction in logged)

    trainer.create_model_card()
    card = (tmp_path / "helped" / "README.md").read_text()
    assert "### What collaboration bought" in card and "| generation share f |" in card
    assert f"| `other` | 32 | {other['ess_frac']:.2f} |" in card

    # The checkpoint holds both owners' states; a resumed trainer's summary covers the run before it.
    state = json.loads((tmp_path / "helped" / "checkpoint-2" / "ftis_state_0.json").read_text())
    assert state["peer_value"]["peers"]["other"]["rows"] == 32
    assert state["time"]["totals"]["step"] == pytest.approx(summary["time_seconds"]["step"], abs=1e-5)
    resumed = tiny_trainer(tokenizer, make_args(max_steps=2, output_dir=str(tmp_path / "resumed")))
    resumed.load_ftis_state(tmp_path / "helped" / "checkpoint-2")
    assert resumed.summary()["peer_value"]["peers"]["other"]["rows_in_loss"] == 32
    assert resumed.summary()["time_seconds"]["generation"] == pytest.approx(
        summary["time_seconds"]["generation"], abs=1e-5
    )


def test_a_checkpoint_with_a_malformed_ledger_is_refused_naming_the_field(tokenizer, make_args, tmp_path):
    args = make_args(max_steps=1, save_strategy="steps", save_steps=1, output_dir=str(tmp_path / "run"))
    trainer = tiny_trainer(tokenizer, args)
    trainer.train()
    path = tmp_path / "run" / "checkpoint-1" / "ftis_state_0.json"
    state = json.loads(path.read_text())
    state["peer_value"]["own"]["tokens"] = -5
    path.write_text(json.dumps(state))
    fresh = tiny_trainer(tokenizer, make_args(max_steps=1, output_dir=str(tmp_path / "again")))
    with pytest.raises(ValueError, match=r"ftis_state_0.json: 'peer_value.own.tokens' is not a finite number"):
        fresh.load_ftis_state(tmp_path / "run" / "checkpoint-1")
    assert fresh.summary()["own_generation"]["rows"] == 0


def test_a_swarm_peer_sees_what_its_partner_supplied_and_what_the_exchange_took(tokenizer, make_args, memory_url):
    partner = make_swarm(memory_url, "partner", tokenizer)
    trainer = exchange_trainer(
        tokenizer, make_args, memory_url, "sync", callbacks=[SyncModePartner(partner)], expected_peers=["partner"]
    )
    trainer.train()
    summary = trainer.summary()
    supplied = summary["peer_value"]["peers"]["partner"]
    assert supplied["rows_accepted"] == supplied["rows_in_loss"] == 24  # 3 steps x 8 rows, all trained on
    assert supplied["tokens"] == 72 and summary["peer_value"]["tokens"] == 72
    assert summary["rows_accepted"] == 24
    steps = [entry for entry in trainer.state.log_history if "ftis/time/exchange" in entry]
    assert len(steps) == 3 and all(entry["ftis/time/exchange"] > 0 for entry in steps)
    assert summary["time_seconds"]["exchange"] == pytest.approx(sum(e["ftis/time/exchange"] for e in steps), rel=1e-4)
    # The wait is part of the exchange's time, which the step's split accounts for.
    assert summary["time_seconds"]["exchange"] >= summary["exchange_blocking_seconds"]
    assert summary["collaboration"].startswith("peers supplied 24 rows (72 tokens), as close to my own sampling as")
