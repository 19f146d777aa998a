"""examples/quick_demo.py's noise report and examples/eval_math500.py's progress, by hand (no model runs here; the
eval script's end-to-end run, progress lines included, is in test_gsm8k_example.py)."""

import importlib.util
import io
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_quick_demo_prints_its_noise_band_and_judges_each_difference_against_it():
    quick_demo = _load("quick_demo")
    lines = quick_demo.noise_report(0.2, {"alone": 0.3, "with peer": 0.26}, 500)
    # Band: 2 sqrt((.25 + .25) / 500) = 0.0632. alone - start: +0.100 against 2 sqrt((.16 + .21) / 500) = 0.0544;
    # with peer - start: +0.060 against 2 sqrt((.16 + .1924) / 500) = 0.0531; with peer - alone: -0.040 against
    # 2 sqrt((.21 + .1924) / 500) = 0.0567.
    assert "500 problems" in lines[0] and "at most 0.063" in lines[0]
    words = [" ".join(line.split()) for line in lines]  # the columns' padding aside
    assert words[1] == "alone - start +0.100, 2 SE 0.054: outside two standard errors"
    assert words[2] == "with peer - start +0.060, 2 SE 0.053: outside two standard errors"
    assert words[3] == "with peer - alone -0.040, 2 SE 0.057: inside the noise"
    assert len(quick_demo.noise_report(0.2, {"alone": 0.3}, 500)) == 2  # no difference without both runs


def test_eval_progress_lines_and_the_combined_scores_equal_one_evaluation():
    pytest.importorskip("math_verify")
    eval_math500 = _load("eval_math500")
    rows = [{"id": i, "correct": i in (0, 1, 4)} for i in range(7)]

    def evaluate(part):  # stands in for evaluate_math: strict = answer-only = correct, 10 tokens a completion
        n = len(part)
        right = sum(r["correct"] for r in part)
        return {
            "n": n, "strict_accuracy": right / n, "answer_accuracy": right / n, "format_rate": 1.0,
            "truncated_rate": 0.0, "mean_completion_tokens": 10.0 + 0 * n, "records": [r["id"] for r in part],
        }  # fmt: skip

    ticks = iter([0.0, 2.0, 4.0, 6.0, 7.0])
    stream = io.StringIO()
    result = eval_math500.evaluate_with_progress(rows, evaluate, 3, stream=stream, clock=lambda: next(ticks))
    whole = evaluate(rows)
    assert result["records"] == whole["records"] == list(range(7))
    assert result["n"] == 7 and all(
        math.isclose(result[key], whole[key]) for key in eval_math500.SCORES
    )  # 3 of 7 correct
    assert stream.getvalue().splitlines() == [
        "eval: 3/7 problems, strict pass@1 so far 0.667, answer-only 0.667, 2 s elapsed, about 3 s left",
        "eval: 6/7 problems, strict pass@1 so far 0.500, answer-only 0.500, 4 s elapsed, about 1 s left",
        "eval: 7/7 problems, strict pass@1 so far 0.429, answer-only 0.429, 6 s elapsed, about 0 s left",
    ]
    # Group size 0: one evaluation, one line at the end.
    stream = io.StringIO()
    assert eval_math500.evaluate_with_progress(rows, evaluate, 0, stream=stream)["n"] == 7
    assert stream.getvalue().count("\n") == 1 and stream.getvalue().startswith("eval: 7/7 problems")
    assert eval_math500.combine_scores([])["n"] == 0


@pytest.mark.parametrize("name", ["quick_demo", "eval_math500", "tiny_peer", "gsm8k_ftis"])
def test_the_scripts_hide_dependency_deprecation_notices_before_importing_the_dependencies(name):
    lines = (ROOT / "examples" / f"{name}.py").read_text().splitlines()
    call = lines.index("quiet_dependency_warnings()  # before the imports that warn")
    dependencies = ("import torch", "from torch", "from transformers", "import transformers", "from trl ", "from peft")
    first = min(i for i, line in enumerate(lines) if line.startswith(dependencies))
    assert lines.index("from trl_ftis.dependency_warnings import quiet_dependency_warnings") < call < first


def test_tiny_peer_runs_on_a_cpu_only_machine_without_device_flags_and_prints_step_lines(tmp_path):
    """docs/swarm.md's commands give no --use_cpu/--bf16: on a machine without a GPU, TRL's bf16 default used to
    refuse to start."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("FTIS_CONSOLE", "FTIS_SWARM_SECRET")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, str(ROOT / "examples" / "tiny_peer.py"), "--peer_id", "solo", "--hidden_size", "32"]
    command += ["--output_dir", str(tmp_path / "solo"), "--max_steps", "2", "--logging_steps", "1"]
    command += ["--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "step 1/2  reward" in output and "step 2/2  reward" in output
    assert "{'loss'" not in output and "FutureWarning" not in output


def test_tiny_peers_start_training_together_once_every_expected_peer_is_built(tmp_path, monkeypatch):
    """`tiny_peer --start_together`: a swarm peer waits for its partners' ready files in the run folder (the parent of
    its output dir), so that a sync-mode first round does not charge a partner's start-up to its training clock."""
    import importlib.util
    import sys
    import threading

    spec = importlib.util.spec_from_file_location("example_tiny_peer", ROOT / "examples" / "tiny_peer.py")
    tiny_peer = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, tiny_peer)  # its dataclasses look their module up there
    spec.loader.exec_module(tiny_peer)
    run = tmp_path / "run"
    started = threading.Event()

    def peer_a():
        tiny_peer.wait_for_partners(str(run / "a"), "a", ["a", "b"])
        started.set()

    waiting = threading.Thread(target=peer_a)
    waiting.start()
    assert not started.wait(0.3)  # b is not built yet: a waits
    tiny_peer.wait_for_partners(str(run / "b"), "b", ["a", "b"])  # b is the last one: it goes at once
    waiting.join(timeout=30)
    assert started.is_set()
    assert sorted(p.name for p in (run / ".start-together").iterdir()) == ["a.ready", "b.ready"]
    monkeypatch.setattr(tiny_peer, "START_FILE_PATIENCE", 0.1)  # a partner that never comes: give up, do not hang
    with pytest.raises(SystemExit, match="not all ready"):
        tiny_peer.wait_for_partners(str(tmp_path / "other" / "a"), "a", ["a", "ghost"])
