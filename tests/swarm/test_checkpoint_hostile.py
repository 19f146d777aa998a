"""A crafted `ftis_state_<n>.json` (checkpoints are shared and pushed to the Hub): refused whole, naming the file and
the field, before any step; rows that are well formed but fail this trainer's admission are dropped and counted, as
received rows are. A genuine checkpoint still resumes as before (`test_checkpoint.py`).

One genuine checkpoint is trained per module ([`genuine`]); each test that resumes from it gets its own copy of the
folder and of the exchange ([`checkpoint`]). Every crafted state is checked without a trainer, by the check a resume
runs ([`read_checked_state`] with the limits a resumed trainer passes it); a few are also resumed by a real trainer,
which must raise before any step and restore nothing."""

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from swarm_helpers import make_swarm, rows
from test_checkpoint_resume import make_trainer  # tests/ is on sys.path
from transformers.trainer import TRAINER_STATE_NAME

import trl_ftis.swarm.checkpoint as checkpoints
from trl_ftis import PeerRow
from trl_ftis.demo.tiny import tiny_grpo_config
from trl_ftis.exchange.transports import open_transport
from trl_ftis.peer_value import PeerValue
from trl_ftis.step_clock import StepClock
from trl_ftis.swarm.checkpoint import (
    RowLimits,
    StateLimits,
    parse_state,
    read_checked_state,
    read_state_file,
    rows_from_json,
    rows_to_json,
    state_path,
)
from trl_ftis.swarm.exchange_modes.free_window import FreeWindow
from trl_ftis.swarm.ledger import PeerRowLedger


def record(**fields):
    """One saved row as `rows_to_json` writes it, with `fields` changed."""
    row = {"prompt": "1+1=", "completion_ids": [5, 6], "generator_logps": [-0.1, -0.2], "reward": 1.0, "group": "g",
           "sender": "x", "rewards_per_func": None, "extra": {}, "round": 1}  # fmt: skip
    row.update(fields)
    return row


def pending(*records):
    return lambda state: {**state, "pending_peer_rows": list(records)}


def arrived(*records, created=None):
    """The free mode's queue of arrived rows (the genuine checkpoint's mode), holding `records`."""
    queue = {"arrived_rows": list(records), "arrived_created": [1.0] * len(records) if created is None else created}
    return lambda state: {**state, "exchange_mode": {"name": "free", "state": queue}}


def swarm(**fields):
    return lambda state: {**state, "swarm": {**state["swarm"], **fields}}


def free_window(**fields):
    """The swarm state's free window (the genuine checkpoint's swarm reads through one) with `fields` changed."""

    def craft(state):
        window = state["swarm"]["window"]
        return swarm(window={**window, "state": {**window["state"], **fields}})(state)

    return craft


LONG = 100_000  # tokens: tensors of a batch padded to it would take gigabytes
CRAFTED = {
    # Rows: what the wire format and the admission refuse, and what no trainer writes.
    "negative_id": (pending(record(completion_ids=[5, -1])), "pending peer row 0: 'completion_ids'"),
    "float_id": (arrived(record(completion_ids=[5, 6.0])), "arrived peer row 0: 'completion_ids'"),
    "bool_ids": (pending(record(completion_ids=[True, False])), "'completion_ids'"),
    "too_long": (pending(record(completion_ids=[5] * LONG, generator_logps=[-0.1] * LONG)), "1 to 6 token ids"),
    "too_long_arrived": (arrived(record(completion_ids=[5] * LONG, generator_logps=[-0.1] * LONG)), "1 to 24 token"),
    "preset_advantage": (pending(record(advantage=1e5, group_max_length=2)), "'advantage', 'group_max_length'"),
    "preset_advantage_arrived": (arrived(record(advantage=-1e5)), "\\['advantage'\\] are not row fields"),
    "missing_field": (pending({k: v for k, v in record().items() if k != "reward"}), "\\['reward'\\] are missing"),
    "string_reward": (pending(record(reward="1e30")), "'reward' is malformed"),
    "huge_integer_reward": (pending(record(reward=10**400)), "'reward' is malformed"),
    "sender_not_a_string": (pending(record(sender=5)), "'sender' is malformed"),
    "round_not_an_integer": (arrived(record(round="x")), "'round' is malformed"),
    "negative_round": (arrived(record(round=-3)), "'round' is malformed"),
    "bad_reward_columns": (pending(record(rewards_per_func={"f": "x"})), "'rewards_per_func'"),
    "positive_logps": (pending(record(generator_logps=[-0.1, 3.0])), "'generator_logps'"),
    "nan_logps": (pending(record(generator_logps=[-0.1, float("nan")])), "'generator_logps'"),
    "logps_of_another_length": (pending(record(generator_logps=[-0.1])), "'generator_logps'"),
    "foreign_pending_row": (pending(record(foreign_tokenizer=True)), "'foreign_tokenizer'"),
    "deep_group_key": (pending(record(group=json.loads('{"tuple": [' * 20 + "1" + "]}" * 20))), "deeper than 8"),
    "infinite_group_key": (pending(record(group=float("inf"))), "not a group key"),
    "too_many_rows": (pending(*[record(group=f"g{i}") for i in range(257)]), "holds 257 rows, more than the 256"),
    "too_many_arrived": (arrived(*[record(group=f"g{i}") for i in range(257)]), "holds 257 rows, more than the 256"),
    "arrived_created_negative": (arrived(record(), created=[-1.0]), "'arrived_created'"),
    "mode_state_of_another_shape": (
        lambda state: {**state, "exchange_mode": {"name": "free", "state": {"queue": []}}},
        "the free mode's state is not",
    ),
    # The state's own numbers.
    "global_step_string": (lambda state: {**state, "global_step": "2"}, "'global_step'"),
    "global_step_of_another_checkpoint": (lambda state: {**state, "global_step": 7}, "this checkpoint is of step 2"),
    "infinite_counter": (
        lambda state: {**state, "totals": {**state["totals"], "rows_sent": float("inf")}},
        "'totals'",
    ),
    "huge_integer_clock": (
        lambda state: {**state, "time": {**state["time"], "totals": {**state["time"]["totals"], "step": 10**400}}},
        "'time.totals.step'",
    ),
    "nan_threshold": (lambda state: {**state, "adaptive_threshold": float("nan")}, "'adaptive_threshold'"),
    # The swarm's.
    "round_offset_far_ahead": (swarm(round_offset=10**9), "'round_offset'"),
    "round_offset_float": (swarm(round_offset=1e9), "'round_offset'"),
    "too_many_digests": (swarm(seen={f"{i:032x}": 1 for i in range(10**5)}), "'seen' holds 100000 entries, more"),
    "short_digest": (swarm(seen={"00": 1}), "not 16 bytes"),
    "negative_digest_round": (swarm(seen={"00" * 16: -1}), "'seen'"),
    "too_many_peers": (swarm(known_peers=[f"p{i}" for i in range(10_001)]), "'known_peers' holds 10001"),
    "negative_sender_round": (free_window(sender_rounds={"a": -5}), "'sender_rounds'"),
    "window_of_no_kind": (swarm(window={"newest": {}}), "'window' is not"),
    "bool_unpublished": (swarm(unpublished={"too_large": True}), "'unpublished'"),
}


# -- one genuine checkpoint per module ------------------------------------------------------------------------------
def module_make_args(config_class=None, **overrides):
    """The config conftest's `make_args` builds (its test settings, then `overrides`; `output_dir` given), for the
    module-scoped [`genuine`], which cannot use that function-scoped fixture (the two are compared in
    `test_the_genuine_checkpoint_is_trained_with_the_tests_settings`)."""
    settings = {"max_steps": 2, "per_device_train_batch_size": 16, "learning_rate": 1e-3, **overrides}
    return tiny_grpo_config(settings.pop("output_dir"), config_class=config_class, **settings)


@dataclass(frozen=True)
class Genuine:
    """The module's genuine checkpoint, only ever read: tests write into copies ([`checkpoint`], [`state_folder`])."""

    folder: Path
    """`checkpoint-2` of a 2-step run that saved every 2 steps."""
    url: str
    """The exchange that run trained in."""
    state_text: str
    """Its state file."""
    limits: StateLimits
    """What a trainer resuming from it (as the tests here build it) passes to [`read_checked_state`]."""
    mode: Any
    """The exchange mode such a trainer passes to it (the free mode, whose queue the file holds)."""


def copy_exchange(url):
    """A new memory exchange holding the messages `url` holds (what a restarted peer reads again): a test may train in
    it without changing `url`."""
    copied = f"memory://hostile-{uuid.uuid4().hex}"
    with open_transport(url) as source, open_transport(copied) as target:
        while envelopes := source.poll():
            for envelope in envelopes:
                assert envelope.error is None
                target.publish(envelope.data, sender=envelope.sender_hint, round=envelope.round_hint)
    return copied


@pytest.fixture(scope="module")
def genuine(tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("genuine") / "out"
    url = f"memory://hostile-{uuid.uuid4().hex}"
    make_trainer(tokenizer, module_make_args, url, out, max_steps=2, save_steps=2, exchange_mode="free").train()
    folder = out / "checkpoint-2"
    # The limits `StateCheckpoints.restore` computes and passes to the check, for a trainer built as the resuming
    # tests build theirs (in an exchange of its own: the module's stays as the run left it).
    resumed = make_trainer(
        tokenizer, module_make_args, f"memory://hostile-{uuid.uuid4().hex}", out, max_steps=3, exchange_mode="free"
    )
    check, passed = checkpoints.read_checked_state, []

    def spy(checkpoint, process_index, limits, swarm=None, mode=None):
        passed.append(limits)
        return check(checkpoint, process_index, limits, swarm, mode)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoints, "read_checked_state", spy)
        assert resumed._checkpoints.restore(folder) is not None  # the genuine state passes
    (limits,) = passed
    return Genuine(folder, url, state_path(folder, 0).read_text(), limits, resumed._rounds.mode)


@pytest.fixture
def checkpoint(genuine, tmp_path):
    """A copy of the genuine checkpoint (as `tmp_path/out/checkpoint-2`) and of its exchange, for one test to write
    into and resume from: the exchange's URL, the state file's path and the state (as JSON)."""
    folder = shutil.copytree(genuine.folder, tmp_path / "out" / genuine.folder.name)
    path = state_path(folder, 0)
    return copy_exchange(genuine.url), path, json.loads(path.read_text())


def state_folder(genuine, folder, state):
    """A checkpoint folder holding `state` as its state file and the genuine `trainer_state.json` (so the file's
    `global_step` is checked against the checkpoint's): what the check reads. The state file's path."""
    folder.mkdir()
    shutil.copy(genuine.folder / TRAINER_STATE_NAME, folder)
    path = state_path(folder, 0)
    path.write_text(json.dumps(state))
    return path


def test_the_genuine_checkpoint_is_trained_with_the_tests_settings(make_args, tmp_path):
    settings = {"output_dir": str(tmp_path), "exchange_url": "memory://x", "peer_id": "me", "max_steps": 3}
    assert module_make_args(**settings).to_dict() == make_args(**settings).to_dict()


def test_the_check_passes_the_genuine_state(genuine, tokenizer, tmp_path):
    """The harness of the crafted states refuses them for what was crafted: the genuine state passes it."""
    state = json.loads(genuine.state_text)
    swarm = make_swarm(f"memory://{uuid.uuid4().hex}", "me", tokenizer, window=FreeWindow)  # the genuine's mode's
    path = state_folder(genuine, tmp_path / "checkpoint-2", state)
    parsed = read_checked_state(path.parent, 0, genuine.limits, swarm, genuine.mode)
    assert parsed.mode_name == "free" and parsed.mode_state == ([], [])  # checked by the mode: an empty queue
    assert parsed.global_step == 2 and parsed.swarm == state["swarm"] is not None  # `swarm` took it


# -- crafted states ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("craft, message", list(CRAFTED.values()), ids=list(CRAFTED))
def test_a_crafted_state_is_refused_naming_file_and_field(genuine, tokenizer, tmp_path, craft, message):
    """Without a trainer: the check a resume runs first ([`read_checked_state`], with the limits the trainer passes and
    a swarm client to load the swarm's part into) refuses the file whole, naming it and the field, and the swarm
    client is unchanged."""
    path = state_folder(genuine, tmp_path / "checkpoint-2", craft(json.loads(genuine.state_text)))
    swarm = make_swarm(f"memory://{uuid.uuid4().hex}", "me", tokenizer, window=FreeWindow)  # the genuine's mode's
    before = swarm.state_dict()
    with pytest.raises(ValueError, match=message) as error:
        read_checked_state(path.parent, 0, genuine.limits, swarm, genuine.mode)
    assert str(path) in str(error.value)
    assert swarm.state_dict() == before


END_TO_END = ("too_long_arrived", "global_step_of_another_checkpoint", "round_offset_far_ahead")
"""Crafted states a real trainer resumes from: a row, a number of the state's own, the swarm's part."""


@pytest.mark.parametrize("craft, message", [CRAFTED[name] for name in END_TO_END], ids=END_TO_END)
def test_a_crafted_state_is_refused_before_any_step_and_nothing_is_restored(
    tokenizer, make_args, tmp_path, checkpoint, craft, message
):
    url, path, state = checkpoint
    path.write_text(json.dumps(craft(state)))
    resumed = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=3, exchange_mode="free")
    before = resumed._ledger.state_dict(), resumed.swarm.state_dict(), resumed._clock.state_dict()
    with pytest.raises(ValueError, match=message) as error:
        resumed.train(resume_from_checkpoint=str(path.parent))
    assert str(path) in str(error.value)
    assert (resumed._ledger.state_dict(), resumed.swarm.state_dict(), resumed._clock.state_dict()) == before
    assert resumed.state.global_step == 0 and resumed.num_pending_peer_rows == 0
    assert resumed._rounds.mode.state_dict()["arrived_rows"] == []  # nothing restored, nothing trained


# -- well-formed rows ----------------------------------------------------------------------------------------------
def test_a_well_formed_row_this_trainer_cannot_use_is_dropped_and_counted(tokenizer, make_args, tmp_path, checkpoint):
    """What the admission decides (ids outside this model's vocabulary, a prompt this trainer cannot render: an empty
    one, a chat role its template does not know) drops the row and counts it, as for a received row: a resume with
    another model or template must not fail on a queued row it would not train on. The others resume, and train."""
    url, path, state = checkpoint
    out_of_vocabulary = record(completion_ids=[5, 10**6], group="oov")
    empty = record(prompt="", group="empty")
    robot = record(prompt=[{"role": "robot", "content": "1+1="}], group="robot")
    path.write_text(json.dumps(pending(out_of_vocabulary, empty, robot, record(group="kept"))(state)))
    resumed = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=3)
    resumed.train(resume_from_checkpoint=str(path.parent))
    assert resumed.summary()["dropped"] == {"bad_ids": 1, "empty_prompt": 1, "bad_chat_prompt": 1}
    step3 = next(entry for entry in resumed.state.log_history if entry.get("step") == 3 and "loss" in entry)
    assert step3["ftis/peer_rows"] == 1


def test_restored_rows_get_their_advantage_from_their_group_not_the_file(tokenizer, make_args, tmp_path, checkpoint):
    url, path, state = checkpoint
    group = [record(reward=reward, group="g") for reward in (0.0, 1.0)]
    path.write_text(json.dumps(pending(*group)(state)))
    resumed = make_trainer(tokenizer, make_args, url, tmp_path / "out", max_steps=3)
    resumed.train(resume_from_checkpoint=str(path.parent))
    step3 = next(entry for entry in resumed.state.log_history if entry.get("step") == 3 and "loss" in entry)
    assert step3["ftis/peer_rows"] == 2 and abs(step3["loss"]) < 10  # two rows of advantage about -+0.7


# -- without a trainer --------------------------------------------------------------------------------------------
def test_a_genuine_state_is_within_its_own_limits(tokenizer):
    """Every bound is one a genuine file always meets: a state as a trainer writes it, with a full queue, parses."""
    ledger = PeerRowLedger()
    state = json.loads(json.dumps({
        "format": 1, "peer_id": "me", "global_step": 2, **ledger.state_dict(), "adaptive_threshold": None,
        "pending_peer_rows": rows_to_json(rows("q", 8))[0], "swarm": make_swarm(f"memory://{uuid.uuid4().hex}", "me",
        tokenizer).state_dict(), "exchange_mode": {"name": "sync", "state": {}}, "time": StepClock().state_dict(),
        "peer_value": PeerValue().state_dict(),
    }))  # fmt: skip
    limits = RowLimits(max_rows=8, max_tokens=max(len(row["completion_ids"]) for row in state["pending_peer_rows"]))
    parsed = parse_state(state, StateLimits(pending=limits))
    assert len(parsed.pending_rows) == 8


def test_an_arrived_row_in_another_tokenizers_tokens_keeps_its_text():
    """The free mode with cross_tokenizer: a queued row in its sender's tokens is re-tokenised when a step takes it,
    so its text must survive the checkpoint (it was lost: the ids were then read as this tokenizer's)."""
    foreign = PeerRow("1+1=", [900, 901], [-0.1, -0.2], 1.0, "g", sender="bpe", completion_text="2",
                      ends_with_eos=True, foreign_tokenizer=True)  # fmt: skip
    records, _ = rows_to_json([foreign, *rows("a", count=1)])
    back = rows_from_json(json.loads(json.dumps(records)), "arrived_rows", "arrived peer", RowLimits(foreign=True))
    assert (back[0].foreign_tokenizer, back[0].completion_text, back[0].ends_with_eos) == (True, "2", True)
    assert "foreign_tokenizer" not in records[1]  # a row in this tokenizer's tokens is saved as before
    with pytest.raises(ValueError, match="'foreign_tokenizer'"):  # queued (admitted) rows are never foreign
        rows_from_json(json.loads(json.dumps(records)))


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"format": 1, "global_step": 1' + "0" * 5000 + "}"])
def test_json_too_deep_or_an_integer_too_long_is_refused_naming_the_file(tmp_path, text):
    state_path(tmp_path, 0).write_text(text)
    with pytest.raises(ValueError, match="not a readable trl-ftis state file") as error:
        read_state_file(tmp_path, 0)
    assert str(state_path(tmp_path, 0)) in str(error.value)


def test_a_swarm_state_may_follow_the_swarm_forward_but_no_further(tokenizer):
    url = f"memory://{uuid.uuid4().hex}"
    state = make_swarm(url, "me", tokenizer).state_dict()
    window = {"name": "sync", "state": {**state["window"]["state"], "newest": {"a": 5000}}}
    ahead = {**state, "window": window, "round_offset": 4990}  # a peer that caught up with a swarm at 5000
    resumed = make_swarm(url, "me", tokenizer)
    resumed.load_state_dict(ahead)
    assert resumed.round_offset == 4990
    with pytest.raises(ValueError, match="'round_offset'"):
        make_swarm(url, "me", tokenizer).load_state_dict({**ahead, "round_offset": 5001})
    counted = make_swarm(url, "me", tokenizer, num_expected_peers=2)
    counted.load_state_dict({**state, "window": {"name": "sync", "state": {**window["state"], "absent_count": 10**6}}})
    assert counted.state_dict()["window"]["state"]["absent_count"] == 2  # never more than are expected
