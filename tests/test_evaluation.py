"""A held-out evaluation in the run (`trl_ftis.evaluation`): before training, at every checkpoint and at the end,
logged as `eval_accuracy` and kept in `ftis_summary.json` for the launcher to compare a peer with its control."""

import json
from pathlib import Path

from tiny_trainers import tiny_trainer  # tests/ is on sys.path

from trl_ftis.evaluation import add_held_out_evaluation
from trl_ftis.rules import SUMMARY_FILE


def test_the_held_out_evaluation_runs_before_at_checkpoints_and_at_the_end(tokenizer, make_args, tmp_path):
    # Before training, the checkpoints at steps 1 and 2, the end.
    answers = iter([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])
    modes = []

    def evaluate(model):
        modes.append(model.training)
        return next(answers)

    args = make_args(max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=1, logging_steps=1)
    trainer = tiny_trainer(tokenizer, args, hidden_size=32)
    held_out = add_held_out_evaluation(trainer, evaluate)
    trainer.train()
    assert modes == [False] * 4  # evaluated in eval mode (training mode restored after: it trained on)
    logged = [entry["eval_accuracy"] for entry in trainer.state.log_history if "eval_accuracy" in entry]
    assert logged == [0.25, 0.5, 0.5, 0.75]
    summary = json.loads((Path(args.output_dir) / SUMMARY_FILE).read_text())  # written after the last evaluation
    assert (summary["accuracy_before"], summary["accuracy_after"]) == (0.25, 0.75)
    assert summary["accuracy_items_after"] == [1, 1, 1, 0]
    assert summary["accuracy_history"][0] == [0, 0.25] and held_out.results() == {
        key: summary[key] for key in held_out.results()
    }
