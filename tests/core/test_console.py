"""What a person reads: one short line per logged step instead of Trainer's dict of every metric, and the
dependencies' deprecation notices hidden; the launcher turns both on for its peers (`FTIS_CONSOLE=lines`)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

from transformers import PrinterCallback, ProgressCallback
from transformers.trainer_callback import DefaultFlowCallback

from trl_ftis.console import (
    StepLineCallback,
    apply_console_env,
    step_line,
    use_step_lines,
)
from trl_ftis.shared_names import CONSOLE_DICTS, CONSOLE_ENV, CONSOLE_LINES


def test_the_step_line_for_a_step_with_peer_rows_and_without():
    logs = {"reward": 0.41234, "ftis/peer_rows_accepted": 128.0, "ftis/peer_rows_filtered": 4.0}
    logs["ftis/peer/is_weight_mean"] = 0.9712
    line = step_line(3, 30, logs, 12.4)
    assert line == "step 3/30  reward 0.412  peer rows 128  filtered 4  w 0.97  12s  eta 1m52s"
    assert step_line(1, 2, {"reward": 0.5}, 0.2) == "step 1/2  reward 0.500  0s  eta 0s"
    assert step_line(2, 2, {"train_runtime": 3.0}, 1.0) is None  # the end-of-training totals: no line


def test_the_eta_comes_from_the_mean_step_time_so_far_and_only_with_a_known_end():
    assert step_line(10, 100, {"reward": 0.5}, 20.0).endswith("  20s  eta 3m00s")  # 2 s a step, 90 steps left
    assert step_line(10, 4000, {"reward": 0.5}, 20.0).endswith("  eta 2h13m")
    # Resumed at step 150: the mean is over the steps of this run (10 in 20 s), not over the checkpoint's 150.
    assert step_line(160, 200, {"reward": 0.5}, 20.0, first_step=150).endswith("  eta 1m20s")
    assert step_line(5, 5, {"reward": 0.5}, 9.0).endswith("  9s")  # the last step: nothing left to wait for
    assert "eta" not in step_line(5, 0, {"reward": 0.5}, 9.0)  # no max_steps known: no estimate
    assert "eta" not in step_line(150, 200, {"reward": 0.5}, 1.0, first_step=150)  # no step of this run yet


class FakeTrainer:
    def __init__(self, callbacks):
        self.callback_handler = SimpleNamespace(callbacks=list(callbacks))

    def remove_callback(self, kind):
        self.callback_handler.callbacks = [c for c in self.callback_handler.callbacks if not isinstance(c, kind)]

    def add_callback(self, callback):
        self.callback_handler.callbacks.append(callback)


def test_use_step_lines_replaces_the_dict_printing_once():
    trainer = FakeTrainer([DefaultFlowCallback(), PrinterCallback()])
    line = use_step_lines(trainer)
    assert use_step_lines(trainer) is line  # idempotent: the launcher's switch and a script may both ask
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert PrinterCallback not in kinds and kinds.count(StepLineCallback) == 1
    bar = ProgressCallback()
    with_bar = FakeTrainer([bar])
    use_step_lines(with_bar)
    assert bar.on_log(None, None, None, logs={"loss": 1.0}) is None  # the dict lines are gone, the bar stays


def test_the_callback_writes_one_line_per_logged_training_step():
    lines = []
    callback = StepLineCallback(prefix="[a] ", write=lines.append)
    state = SimpleNamespace(is_world_process_zero=True, global_step=2, max_steps=5)
    callback.on_log(None, state, None, logs={"reward": 0.25})
    callback.on_log(None, state, None, logs={"eval_loss": 1.0})
    assert len(lines) == 1 and lines[0].startswith("[a] step 2/5  reward 0.250  ")
    assert " eta " in lines[0]


def test_the_callbacks_eta_counts_the_steps_of_this_run_only(monkeypatch):
    import trl_ftis.console as console

    lines = []
    callback = StepLineCallback(write=lines.append)
    clock = iter([100.0, 130.0])  # train begins at 100 s; 10 steps later it is 130 s: 3 s a step
    monkeypatch.setattr(console.time, "time", lambda: next(clock))
    callback.on_train_begin(None, SimpleNamespace(global_step=150, max_steps=200), None)
    state = SimpleNamespace(is_world_process_zero=True, global_step=160, max_steps=200)
    callback.on_log(None, state, None, logs={"reward": 0.25})
    assert lines == ["step 160/200  reward 0.250  30s  eta 2m00s"]


def test_the_environment_switch(monkeypatch):
    monkeypatch.delenv(CONSOLE_ENV, raising=False)
    trainer = FakeTrainer([PrinterCallback()])
    assert apply_console_env(trainer) is False and isinstance(trainer.callback_handler.callbacks[0], PrinterCallback)
    monkeypatch.setenv(CONSOLE_ENV, CONSOLE_LINES)
    from transformers.utils import logging as transformers_logging

    assert transformers_logging.is_progress_bar_enabled()
    try:
        with warnings.catch_warnings():
            assert apply_console_env(trainer) is True
        assert [type(c) for c in trainer.callback_handler.callbacks] == [StepLineCallback]
        assert not transformers_logging.is_progress_bar_enabled()  # no "Writing model shards" bars in peer logs
    finally:
        transformers_logging.enable_progress_bar()


def test_the_example_scripts_print_step_lines_unless_asked_for_dicts(monkeypatch, tmp_path):
    from trl_ftis.console import StepLineCallback, use_script_console

    class Trainer:
        def __init__(self):
            self.callback_handler = type("Handler", (), {"callbacks": []})()

        def remove_callback(self, kind):
            pass

        def add_callback(self, callback):
            self.callback_handler.callbacks.append(callback)

    monkeypatch.setenv(CONSOLE_ENV, CONSOLE_DICTS)
    dicts = Trainer()
    assert use_script_console(dicts) is False and dicts.callback_handler.callbacks == []
    monkeypatch.delenv(CONSOLE_ENV)
    lines = Trainer()
    assert use_script_console(lines) is True
    assert [type(c) for c in lines.callback_handler.callbacks] == [StepLineCallback]
