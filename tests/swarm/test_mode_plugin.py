"""An exchange mode from outside the package (tests/fixtures/tally_mode.py: its own round window, its own drop reason
and its own state, the mode's and the window's) is one module and one registration: a trainer trains with it,
checkpoints both states under their names, and a resumed trainer goes on from them; a hostile edit of either is
refused by its owner's own check, naming the file. No file under src/ names the mode."""

import json
import uuid
from pathlib import Path

import pytest
from fixtures.tally_mode import TallyMode, TallyWindow  # tests/ is on sys.path
from swarm_helpers import make_swarm, registered_mode, rows
from tiny_trainers import tiny_trainer
from transformers import TrainerCallback

import trl_ftis
from trl_ftis.swarm.checkpoint import state_path

PARTNER_ROWS = 8


class Partner(TrainerCallback):
    """Another peer in the same process: publishes `PARTNER_ROWS` rows for the trainer's round as each step begins."""

    def __init__(self, swarm):
        self.swarm = swarm

    def on_step_begin(self, args, state, control, **kwargs):
        round = state.global_step
        self.swarm.publish(rows("partner", count=PARTNER_ROWS, group=f"g{round}", round=round), round)


@pytest.fixture
def tally():
    with registered_mode(TallyMode) as mode:
        yield mode


def tally_trainer(tokenizer, make_args, url, out, max_steps):
    trainer = tiny_trainer(
        tokenizer,
        make_args(
            exchange_url=url,
            peer_id="me",
            exchange_mode="tally",
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=2,
            output_dir=str(out),
        ),
    )
    trainer.add_callback(Partner(make_swarm(url, "partner", tokenizer)))
    return trainer


def test_a_mode_from_outside_the_package_trains_checkpoints_and_resumes_with_its_state(
    tokenizer, make_args, tmp_path, tally
):
    url, out = f"memory://plugin-{uuid.uuid4().hex}", tmp_path / "out"
    first = tally_trainer(tokenizer, make_args, url, out, max_steps=2)
    first.train()
    mode, window = first._rounds.mode, first.swarm.window
    assert isinstance(mode, TallyMode) and isinstance(window, TallyWindow)  # built from the registry
    assert (mode.rounds, mode.rows, dict(window.taken)) == (2, 2 * TallyMode.cap, {"partner": 2})
    # Its own drop reason, learned by the ledger: counted, and warned about with the mode's text.
    assert first._ledger.dropped_totals["over_tally_cap"] == 2 * (PARTNER_ROWS - TallyMode.cap)
    saved = json.loads(state_path(out / "checkpoint-2", 0).read_text())
    assert saved["exchange_mode"] == {"name": "tally", "state": {"rounds": 2, "rows": 8}}  # the mode's state
    assert saved["swarm"]["window"]["name"] == "tally"  # the window's, in the swarm's
    assert saved["swarm"]["window"]["state"]["taken"] == {"partner": 2}

    resumed = tally_trainer(tokenizer, make_args, url, out, max_steps=4)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    mode, window = resumed._rounds.mode, resumed.swarm.window
    # The tally went on from the saved one: two rounds before the checkpoint, two after (the partner's messages of
    # rounds 0 and 1, still in the exchange, are refused as duplicates by the restored swarm state).
    assert (mode.rounds, mode.rows, dict(window.taken)) == (4, 4 * TallyMode.cap, {"partner": 4})
    logged = [entry["tally/rounds"] for entry in resumed.state.log_history if "tally/rounds" in entry]
    assert logged == [1.0, 2.0, 3.0, 4.0]  # the restored log history, then the resumed steps counting on


def edit_mode(state):
    state["exchange_mode"]["state"]["rounds"] = -1


def edit_window(state):
    state["swarm"]["window"]["state"]["taken"] = {"partner": "many"}


@pytest.mark.parametrize(
    "edit, message",
    [(edit_mode, "the tally's 'rounds' is not a whole number"), (edit_window, "the tally window's 'taken' is not")],
    ids=["mode", "window"],
)
def test_a_hostile_tally_is_refused_by_its_owners_check_naming_the_file(
    tokenizer, make_args, tmp_path, tally, edit, message
):
    url, out = f"memory://plugin-{uuid.uuid4().hex}", tmp_path / "out"
    tally_trainer(tokenizer, make_args, url, out, max_steps=2).train()
    path = state_path(out / "checkpoint-2", 0)
    state = json.loads(path.read_text())
    edit(state)
    path.write_text(json.dumps(state))
    resumed = tally_trainer(tokenizer, make_args, url, out, max_steps=4)
    with pytest.raises(ValueError, match=message) as error:
        resumed.train(resume_from_checkpoint=str(path.parent))
    assert str(path) in str(error.value)
    assert resumed._rounds.mode.rounds == 0 and resumed.swarm.window.taken == {}  # nothing restored
    assert resumed.state.global_step == 0  # nothing trained


def test_no_package_file_names_the_plugin_mode():
    package = Path(trl_ftis.__file__).parent
    named = [p for p in package.rglob("*.py") if "tally" in p.read_text(encoding="utf-8").lower()]
    assert named == []
