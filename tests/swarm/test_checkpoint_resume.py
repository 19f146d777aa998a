"""Resume: the F-TIS state (counters, the swarm, queued peer rows) saved with each checkpoint and restored by
`train(resume_from_checkpoint=...)`."""

import json
import logging
import uuid

import pytest
from swarm_helpers import make_swarm, rows
from tiny_trainers import tiny_trainer  # tests/ is on sys.path
from transformers import TrainerCallback
from waits import returns_within

from trl_ftis import PeerRow
from trl_ftis.peer_value import PeerValue
from trl_ftis.step_clock import StepClock
from trl_ftis.swarm.checkpoint import (
    build_state,
    parse_state,
    read_state_file,
    resolve_resume,
    rows_from_json,
    rows_to_json,
    state_path,
)
from trl_ftis.swarm.ledger import PeerRowLedger


class Partner(TrainerCallback):
    """Another peer in the same process: publishes 8 rows for the trainer's round at the start of every step, and
    adds one row too long to train on through `add_peer_rows` (dropped and counted) at the first step."""

    def __init__(self, swarm):
        self.swarm, self.trainer, self.published = swarm, None, set()

    def on_step_begin(self, args, state, control, **kwargs):
        round = state.global_step
        if round not in self.published:  # a real peer publishes each of its rounds once, whoever restarts
            self.published.add(round)
            self.swarm.publish(rows("partner", count=8, group=f"g{round}", round=round), round)
        if round == 0:
            too_long = PeerRow("1+1=", [5] * 40, [-0.1] * 40, 1.0, "long", sender="adder")
            self.trainer.add_peer_rows([too_long])


class Crash(TrainerCallback):
    """Kills the run (an exception) when step `at` begins: the last checkpoint is what a restart has."""

    def __init__(self, at):
        self.at = at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt("killed")


def make_trainer(tokenizer, make_args, url, output_dir, callbacks=(), **overrides):
    settings = dict(exchange_url=url, peer_id="me", max_steps=4, save_strategy="steps", save_steps=2)
    settings.update(overrides)
    args = make_args(output_dir=str(output_dir), **settings)
    trainer = tiny_trainer(tokenizer, args)
    for callback in callbacks:
        if isinstance(callback, Partner):
            callback.trainer = trainer
        trainer.add_callback(callback)
    return trainer


def test_a_resumed_run_ends_with_the_counters_of_an_uninterrupted_one(tokenizer, make_args, tmp_path):
    summaries = {}
    for name in ("whole", "resumed"):
        url = f"memory://resume-{uuid.uuid4().hex}"
        partner = Partner(make_swarm(url, "partner", tokenizer))
        out = tmp_path / name
        if name == "whole":
            trainer = make_trainer(tokenizer, make_args, url, out, [partner])
            trainer.train()
        else:
            crashing = make_trainer(tokenizer, make_args, url, out, [partner, Crash(at=3)])
            with pytest.raises(KeyboardInterrupt):
                crashing.train()
            assert crashing.summary()["steps"] == 3
            # A new process: a fresh trainer on the same exchange, resumed from the last checkpoint (step 2).
            partner.trainer = None
            trainer = make_trainer(tokenizer, make_args, url, out, [partner])
            trainer.train(resume_from_checkpoint=True)
        summaries[name] = trainer.summary()
    whole, resumed = summaries["whole"], summaries["resumed"]
    assert whole["steps"] == resumed["steps"] == 4
    for key in ("rows_sent", "rows_accepted", "peers", "peer_models", "dropped"):
        assert resumed[key] == whole[key], key
    assert whole["rows_sent"] == 64 and whole["rows_accepted"] == 32 and whole["dropped"] == {"too_long": 1}
    # The messages accepted before the checkpoint (rounds 0 and 1) are read again after the restart and refused as
    # duplicates, not trained on twice; those accepted after it (round 2) are trained on again, as the steps are.
    assert resumed["refused"] == {"duplicate": 2} and whole["refused"] == {}
    card = (tmp_path / "resumed" / "checkpoint-4" / "ftis_state_0.json").read_text()
    assert json.loads(card)["accepted_by_peer"] == {"partner": 32}


def test_queued_peer_rows_survive_a_restart(tokenizer, make_args, tmp_path):
    url = f"memory://resume-{uuid.uuid4().hex}"
    queued = rows("friend", count=4, group=("friend", 7, 0)) + [
        PeerRow([{"role": "user", "content": "2+2="}], [8, 2], [-0.5, -0.25], 0.5, 11, sender="chat")
    ]

    class Queue(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                trainer.add_peer_rows(queued)

    trainer = make_trainer(tokenizer, make_args, url, tmp_path / "out", [Queue()], max_steps=2, save_steps=2)
    trainer.train()
    assert trainer.num_pending_peer_rows == 5
    checkpoint = tmp_path / "out" / "checkpoint-2"
    saved = json.loads(state_path(checkpoint, 0).read_text())
    assert len(saved["pending_peer_rows"]) == 5

    resumed = make_trainer(tokenizer, make_args, url, tmp_path / "out")
    assert resumed.load_ftis_state(checkpoint) is True  # what train(resume_from_checkpoint=...) does first
    assert resumed.num_pending_peer_rows == 5
    back = resumed._inbox.rows
    for before, after in zip(queued, back, strict=True):
        assert after.prompt == before.prompt and list(after.completion_ids) == list(before.completion_ids)
        assert list(after.generator_logps) == pytest.approx(list(before.generator_logps))
        assert (after.reward, after.group, after.sender, after.extra) == (
            before.reward,
            before.group,
            before.sender,
            before.extra,
        )
    assert back[0].group == back[3].group != back[4].group  # tuple keys come back as equal tuples

    onward = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=3)
    onward.train(resume_from_checkpoint=str(checkpoint))
    assert onward.num_pending_peer_rows == 0
    step3 = [entry for entry in onward.state.log_history if entry.get("step") == 3 and "ftis/peer_rows" in entry]
    assert step3 and step3[0]["ftis/peer_rows"] == 5


def test_a_checkpoint_without_ftis_state_resumes_with_a_warning(tokenizer, make_args, tmp_path, caplog):
    url = f"memory://resume-{uuid.uuid4().hex}"
    trainer = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=2, save_steps=2)
    trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    state_path(checkpoint, 0).unlink()  # as GRPOTrainer saves it
    resumed = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=3)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.checkpoint"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert "has no ftis_state_0.json" in caplog.text
    assert resumed.summary()["steps"] == 3 and resumed.summary()["rows_sent"] == 16  # only the step it ran


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda state: json.dumps({**state, "format": 99}), "format 99"),
        (lambda state: json.dumps({**state, "swarm": {**state["swarm"], "seen": {"zz": 1}}}), "not hexadecimal"),
    ],
    ids=["file", "swarm"],
)
def test_a_corrupt_state_file_is_refused_naming_it_before_training(tokenizer, make_args, tmp_path, corrupt, message):
    """The whole path: the file named, nothing restored (the swarm's part is checked last, after the file's), nothing
    trained. Each malformed part on its own: the unit tests below, without a trainer."""
    url = f"memory://resume-{uuid.uuid4().hex}"
    trainer = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=2, save_steps=2)
    trainer.train()
    path = state_path(tmp_path / "out" / "checkpoint-2", 0)
    path.write_text(corrupt(json.loads(path.read_text())))
    resumed = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=3)
    before = resumed._ledger.state_dict(), resumed.swarm.state_dict()
    with pytest.raises(ValueError, match=message) as error:
        resumed.train(resume_from_checkpoint=str(path.parent))
    assert str(path) in str(error.value)
    assert (resumed._ledger.state_dict(), resumed.swarm.state_dict()) == before  # nothing changed
    assert resumed.state.global_step == 0 and resumed.num_pending_peer_rows == 0  # nothing trained or queued


# -- the state dict, without a trainer ----------------------------------------------------------------------------
def saved_state(tokenizer, url=None):
    """A state as a trainer of peer "me" writes it after a round: counters, a queued row and its swarm's state."""
    ledger = PeerRowLedger()
    ledger.record_round(rows_sent=16, bytes_sent=900, rows_received=8, accepted=rows("a", 8), refused={"stale": 1})
    ledger.count("a", "too_long", 2)
    ledger.add_sources(["a"])
    swarm = make_swarm(url or f"memory://state-{uuid.uuid4().hex}", "me", tokenizer)
    state = build_state(
        peer_id="me",
        global_step=2,
        ledger=ledger.state_dict(),
        adaptive_threshold=3.5,
        pending_rows=rows("q", 2),
        swarm=swarm.state_dict(),
        mode_name="sync",
        mode_state={},
        time=StepClock().state_dict(),
        peer_value=PeerValue().state_dict(),
    )
    return json.loads(json.dumps(state))  # as read back from the file


def test_a_saved_state_parses_back_into_its_parts(tokenizer):
    parsed = parse_state(saved_state(tokenizer))
    assert parsed.global_step == 2 and parsed.adaptive_threshold == 3.5
    assert parsed.ledger.totals["rows_sent"] == 16 and parsed.ledger.totals["rows_accepted"] == 8
    assert parsed.ledger.counters["dropped"] == {"too_long": 2} and parsed.ledger.sources == ["a"]
    assert [row.sender for row in parsed.pending_rows] == ["q", "q"] and parsed.swarm is not None
    restored = PeerRowLedger()
    restored.load_state_dict(parsed.ledger)
    assert restored.totals["bytes_sent"] == 900 and restored.totals["rows_received"] == 8
    assert restored.accepted_by_peer == {"a": 8} and restored.refused == {"stale": 1}


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda state: [state], "not a JSON object"),
        (lambda state: {**state, "format": 99}, "format 99"),
        (lambda state: {**state, "totals": {"rows_sent": -1}}, "'totals'"),
        (lambda state: {**state, "totals": {**state["totals"], "rows_spent": 1}}, "'totals' must have exactly"),
        (lambda state: {**state, "dropped": {"too_long": True}}, "'dropped'"),
        (lambda state: {**state, "sources": [1]}, "'sources'"),
        (lambda state: {**state, "row_count_keys": "dropped/x"}, "'row_count_keys'"),
        (lambda state: {**state, "pending_peer_rows": [{"prompt": "x"}]}, "pending peer row 0"),
        (lambda state: {**state, "pending_peer_rows": {}}, "'pending_peer_rows' is not a list"),
        (lambda state: {**state, "adaptive_threshold": "inf"}, "'adaptive_threshold'"),
        (lambda state: {key: value for key, value in state.items() if key != "time"}, "\\['time'\\] missing"),
        (lambda state: {**state, "exchange_mode": {"name": "free"}}, "'exchange_mode' is not"),
        (lambda state: {**state, "peer_value": None}, "peer_value|not a dict|malformed"),
    ],
)
def test_a_corrupt_state_dict_is_refused_saying_what_is_wrong(tokenizer, corrupt, message):
    with pytest.raises(ValueError, match=message):
        parse_state(corrupt(saved_state(tokenizer)))


def test_a_ledger_state_is_checked_whole_before_anything_changes():
    ledger = PeerRowLedger()
    ledger.count("a", "too_long", 3)
    before = ledger.state_dict()
    broken = {**before, "sources": ["a", 7]}  # the last field checked: every earlier one was fine
    with pytest.raises(ValueError, match="'sources'"):
        ledger.load_state_dict(broken)
    assert ledger.state_dict() == before


@pytest.mark.parametrize("content, message", [("{not json", "not a readable trl-ftis state file"), (None, None)])
def test_reading_a_state_file_names_it_or_warns_when_there_is_none(tmp_path, caplog, content, message):
    if content is not None:
        state_path(tmp_path, 0).write_text(content)
        with pytest.raises(ValueError, match=message) as error:
            read_state_file(tmp_path, 0)
        assert str(state_path(tmp_path, 0)) in str(error.value)
    else:
        with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.checkpoint"):
            assert read_state_file(tmp_path, 0) is None
        assert "has no ftis_state_0.json" in caplog.text


def test_the_state_file_layout_holds_the_exchange_modes_state_under_its_name(tokenizer):
    state = saved_state(tokenizer)
    assert list(state) == [  # the layout written, key for key
        "format", "peer_id", "global_step", "totals", "refused", "dropped", "dropped_since_merge",
        "stripped_since_merge", "accepted_by_peer", "row_count_keys", "sources", "adaptive_threshold",
        "pending_peer_rows", "swarm", "exchange_mode", "time", "peer_value",
    ]  # fmt: skip
    parsed = parse_state(state)
    assert (parsed.mode_name, parsed.mode_state) == ("sync", {})


def test_resume_spellings_resolve_to_the_last_complete_checkpoint(tmp_path):
    out = tmp_path / "out"
    assert resolve_resume("last", out) is None  # nothing yet: start afresh
    with pytest.raises(ValueError, match="No valid checkpoint"):
        resolve_resume(True, out)
    for step, complete in ((2, True), (4, False)):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            (out / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert resolve_resume(True, out) == resolve_resume("latest", out) == str(out / "checkpoint-2")
    assert resolve_resume(False, out) is None and resolve_resume("some/path", out) == "some/path"


def test_swarm_state_round_trips_and_refuses_what_it_cannot_read(tokenizer):
    url = f"memory://resume-{uuid.uuid4().hex}"
    sender = make_swarm(url, "a", tokenizer, model_name="tiny-a")
    first = make_swarm(url, "me", tokenizer, expected_peers=["a", "gone"], peer_timeout=0.2)
    sender.publish(rows("a"), 0)
    first.collect(0)  # "gone" never sends: it is absent from now on
    state = json.loads(json.dumps(first.state_dict()))
    # waiting for either after the restore would cost the whole timeout, far past the hang guard
    second = make_swarm(url, "me", tokenizer, expected_peers=["a", "gone"], peer_timeout=600.0)
    second.load_state_dict(state)
    assert second.epoch > first.epoch  # a resumed start: a newer epoch, whatever the clock
    assert {**second.state_dict(), "epoch": first.epoch} == first.state_dict()
    assert second.known_peers == {"a"} and second.peer_models == {"a": "tiny-a"}
    result = returns_within(lambda: second.collect(0), what="a restored round")  # the same message again: used once
    assert result.rows == [] and result.refused["duplicate"] == 1
    # "gone" is not waited for; "a" delivered round 0 before the checkpoint, so it is not waited for either.
    assert result.missing == []
    for broken in (
        {key: value for key, value in state.items() if key != "delivered"},  # every field is in every state
        {**state, "seen": {"00": "x"}},
        {**state, "delivered": {"a": "x"}},
        {**state, "known_peers": None},
        "state",
        {**state, "window": {"name": "sync", "state": {**state["window"]["state"], "absent_count": -1}}},
        {**state, "window": state["window"]["state"]},  # the window's state, without its name
    ):
        fresh = make_swarm(url, "me", tokenizer)
        with pytest.raises(ValueError, match="Swarm state"):
            fresh.load_state_dict(broken)
        assert fresh.known_peers == set()


def test_rows_that_json_cannot_hold_are_left_out_and_counted():
    good = rows("a", count=2)
    odd = rows("b", count=1)[0]
    odd.extra = {"image": object()}
    records, unwritable = rows_to_json([*good, odd])
    assert unwritable == 1 and len(records) == 2
    back = rows_from_json(json.loads(json.dumps(records)))
    assert [row.sender for row in back] == ["a", "a"] and back[0].extra == {"answer": "46"}


def test_a_queued_re_tokenised_row_keeps_its_text_level_and_old_totals_still_load():
    text_row = rows("bpe", count=1)[0]
    text_row.text_level = True  # as the re-tokenisation of a cross-tokenizer row leaves it
    records, _ = rows_to_json([text_row, *rows("a", count=1)])
    back = rows_from_json(json.loads(json.dumps(records)))
    assert [row.text_level for row in back] == [True, False]
    assert "text_level" not in records[1]  # the file of a token-level row is as before


def test_a_swarm_state_of_another_window_restores_all_but_the_window(tokenizer, caplog):
    """A run that changed its exchange mode between restarts: the swarm's counters and digests are restored, the
    other window's state and the round offset are not (each window checks and restores only its own)."""
    from trl_ftis.swarm.exchange_modes.free_window import FreeWindow

    url = f"memory://state-{uuid.uuid4().hex}"
    sync = make_swarm(url, "me", tokenizer)
    make_swarm(url, "a", tokenizer).publish(rows("a"), 0)
    sync.collect(0)
    state = json.loads(json.dumps(sync.state_dict()))
    assert state["window"]["name"] == "sync"
    free = make_swarm(url, "me", tokenizer, window=FreeWindow)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.swarm_state"):
        free.load_state_dict(state)
    assert free.known_peers == {"a"} and free.round_offset == 0 and free.window.sender_rounds == {}
    assert free.collect(0).refused["duplicate"] == 1  # the digests were restored: read again, used once
    assert "from a state of the 'sync' one" in caplog.text
