"""A held-out evaluation in the run (`trl_ftis.evaluation`): before training, at every checkpoint and at the end,
logged as `eval_accuracy` and kept in `ftis_summary.json` for the launcher to compare a peer with its control."""

import json
from pathlib import Path

import pytest
from tiny_trainers import tiny_trainer  # tests/ is on sys.path

from trl_ftis.evaluation import add_held_out_evaluation
from trl_ftis.shared_names import SUMMARY_FILE


def test_the_held_out_evaluation_runs_before_at_checkpoints_and_at_the_end(tokenizer, make_args, tmp_path):
    # Before training and at the checkpoints at steps 1 and 2; the end is step 2 again: its result is reused.
    answers = iter([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])
    modes = []

    def evaluate(model):
        modes.append(model.training)
        return next(answers)

    args = make_args(max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=1, logging_steps=1)
    trainer = tiny_trainer(tokenizer, args, hidden_size=32)
    held_out = add_held_out_evaluation(trainer, evaluate)
    trainer.train()
    assert modes == [False] * 3  # evaluated in eval mode (training mode restored after: it trained on)
    logged = [entry["eval_accuracy"] for entry in trainer.state.log_history if "eval_accuracy" in entry]
    assert logged == [0.25, 0.5, 0.75]
    summary = json.loads((Path(args.output_dir) / SUMMARY_FILE).read_text())  # written after the last evaluation
    assert (summary["accuracy_before"], summary["accuracy_after"]) == (0.25, 0.75)
    assert summary["accuracy_items_after"] == [1, 1, 1, 0]
    assert summary["accuracy_history"][0] == [0, 0.25] and held_out.results() == {
        key: summary[key] for key in held_out.results()
    }
    # The curve's token axis: the completion tokens this trainer generated so far, growing each step to the total
    # its summary reports (TRL's num_tokens counts prompts too).
    own = [entry["ftis/own_tokens_total"] for entry in trainer.state.log_history if "ftis/own_tokens_total" in entry]
    assert len(own) == 2 and 0 < own[0] < own[1]
    assert own[1] == summary["own_generation"]["tokens"] < trainer.state.num_input_tokens_seen
    assert [point["tokens"] for point in summary["curve"] if "reward" in point] == own


def test_every_few_steps_each_evaluation_keeps_its_problems_and_the_training_clock(tokenizer, make_args):
    seen = []

    def evaluate(model):
        seen.append(len(seen))
        return [len(seen) % 2 == 0, True, False]

    args = make_args(max_steps=4, logging_steps=1)
    trainer = tiny_trainer(tokenizer, args, hidden_size=32)
    held_out = add_held_out_evaluation(trainer, evaluate, every=2)
    trainer.train()
    evaluations = held_out.results()["accuracy_evaluations"]
    assert [e["step"] for e in evaluations] == [0, 2, 4]  # before, every 2 steps; the end (step 4) not twice
    assert [e["items"] for e in evaluations] == ["010", "110", "010"]
    assert held_out.results()["accuracy_items_after"] == [0, 1, 0]
    # Each evaluation's seconds are the training clock at that step: the sum of the steps' own times up to it, so
    # the evaluation ran after the step clock closed its step and is not counted in it.
    step_times = {
        entry["step"]: entry["ftis/time/step"] for entry in trainer.state.log_history if "ftis/time/step" in entry
    }
    assert evaluations[0]["seconds"] == 0.0
    for evaluation in evaluations[1:]:
        expected = sum(seconds for step, seconds in step_times.items() if step <= evaluation["step"])
        assert evaluation["seconds"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert evaluations[-1]["seconds"] == pytest.approx(trainer.collaboration()["time_seconds"]["step"], abs=1e-5)
    with pytest.raises(ValueError, match="every"):
        add_held_out_evaluation(trainer, evaluate, every=0)


def test_a_runs_curve_puts_reward_and_accuracy_on_time_and_token_axes():
    from trl_ftis.evaluation import run_curve

    history = [
        {"eval_accuracy": 0.25, "step": 0},
        {"reward": 0.1, "ftis/time/step": 2.0, "num_tokens": 100, "step": 5},  # 5 steps of 2 s
        {"reward": 0.3, "ftis/time/step": 1.0, "num_tokens": 220, "step": 10},  # 5 more of 1 s
        {"eval_accuracy": 0.5, "step": 10},
        {"train_runtime": 20.0, "step": 10},  # neither reward nor accuracy: no point
    ]
    assert run_curve(history) == [
        {"step": 0, "seconds": 0.0, "tokens": 0.0, "accuracy": 0.25},
        {"step": 5, "seconds": 10.0, "tokens": 100.0, "reward": 0.1},
        {"step": 10, "seconds": 15.0, "tokens": 220.0, "reward": 0.3},
        {"step": 10, "seconds": 15.0, "tokens": 220.0, "accuracy": 0.5},
    ]
    # A trainer's own generated tokens, where logged, are the token axis; TRL's num_tokens only for older logs.
    own = [{"reward": 0.2, "num_tokens": 500, "ftis/own_tokens_total": 40.0, "step": 1}]
    assert run_curve(own)[0]["tokens"] == 40.0
    long = [{"reward": 0.0, "step": k} for k in range(1, 2001)]
    thinned = run_curve(long)
    assert len(thinned) == 500 and thinned[0]["step"] == 1 and thinned[-1]["step"] == 2000


def test_the_launcher_draws_the_curves_or_says_why_not(tmp_path):
    from trl_ftis.launcher.curves import plot_curves

    curve = [
        {"step": 0, "seconds": 0.0, "tokens": 0.0, "accuracy": 0.2},
        {"step": 5, "seconds": 1.0, "tokens": 9.0, "reward": 0.1, "accuracy": 0.3},
    ]
    rows = [{"id": "a", "curve": curve}, {"id": "a-alone", "control_of": "a", "curve": curve}, {"id": "b"}]
    assert plot_curves(tmp_path / "curves.png", rows) is None
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_curves(tmp_path / "none.png", [{"id": "b"}]) == "no peer logged a curve"
    assert not (tmp_path / "none.png").exists()
