"""examples/gsm8k_ftis.py, its paper config and examples/eval_math500.py, run end to end on a tiny local model."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("math_verify")

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = ROOT / "examples" / "gsm8k_ftis.py"
EVAL_SCRIPT = ROOT / "examples" / "eval_math500.py"
PAPER_CONFIG = ROOT / "examples" / "configs" / "gsm8k_qwen2.5-1.5b.yaml"

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does Tom have?", "answer": "3+4=7\n#### 7"},
    {"question": "A shop sells 1200 pens and 34 pencils. How many items?", "answer": "1200+34\n#### 1,234"},
    {"question": "Mia earns $12 an hour for 5 hours. How much does she earn?", "answer": "12*5=60\n#### $60"},
    {"question": "Ben has 10 cards and gives away 4. How many are left?", "answer": "10-4=6\n#### 6"},
]
MATH500_ROWS = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{2}$?", "answer": "1"},
    {"problem": "Convert $(0,3)$ to polar coordinates.", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)"},
    {"problem": "Solve $x + 1 = 3$.", "answer": "2"},
    {"problem": "What is $2^{10}$?", "answer": "1024"},
]


def _load_example_module():
    spec = importlib.util.spec_from_file_location("gsm8k_ftis_example", TRAIN_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _subprocess_env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("FTIS_SWARM_SECRET", None)
    return env


def _run(args: list, timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama and a printable-ASCII character tokenizer with a system-aware chat template, saved like a Hub
    checkpoint."""
    from trl_ftis.demo.tiny import PRINTABLE_ALPHABET, SYSTEM_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama

    path = tmp_path_factory.mktemp("tiny-gsm8k-model")
    tokenizer = build_char_tokenizer(SYSTEM_CHAT_TEMPLATE, alphabet=PRINTABLE_ALPHABET)
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, max_position_embeddings=1024)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_paper_config_parses_into_the_papers_recipe():
    from trl import ModelConfig, TrlParser

    from trl_ftis import FTISConfig

    module = _load_example_module()
    parser = TrlParser((module.GSM8KScriptArguments, FTISConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(["--config", str(PAPER_CONFIG)])

    assert model_args.model_name_or_path == "Qwen/Qwen2.5-1.5B"
    assert model_args.dtype == "float32" and training_args.bf16 is False and not training_args.fp16
    assert (script_args.dataset_name, script_args.dataset_config, script_args.reward) == (
        "openai/gsm8k",
        "main",
        "strict",
    )
    assert training_args.learning_rate == 1e-6
    assert training_args.max_grad_norm == 1.0
    assert training_args.max_steps == 50
    assert training_args.num_generations == 12
    # 12 prompts x 12 completions per optimizer step, generated once per step on one process.
    assert training_args.generation_batch_size == 144
    assert training_args.steps_per_generation == training_args.gradient_accumulation_steps == 12
    assert training_args.generation_batch_size // training_args.num_generations == 12
    assert training_args.num_iterations == 1
    assert (training_args.temperature, training_args.top_k) == (1.0, 50)
    assert training_args.max_completion_length == 600
    assert training_args.beta == 0.0 and training_args.loss_type == "grpo"
    assert training_args.variant == "f-tis"
    assert (training_args.is_cap, training_args.kl_threshold) == (2.0, 50.0)
    assert training_args.logging_steps == 1
    assert training_args.report_to == [] and training_args.save_strategy == "no"
    # No fixed peer id in the config: the script names the peer after its model.
    assert training_args.peer_id == "peer"
    module.name_the_peer(training_args, model_args)
    assert training_args.peer_id == training_args.run_name == "qwen2.5-1.5b"
    model_args.model_name_or_path = "/models/SmolLM2-135M"
    training_args.peer_id, training_args.run_name = "peer", None
    module.name_the_peer(training_args, model_args)
    assert training_args.peer_id == "smollm2-135m"


def test_the_same_rows_baseline_differs_from_the_paper_config_only_in_its_rows_and_names():
    from trl import ModelConfig, TrlParser

    from trl_ftis import FTISConfig

    module = _load_example_module()

    def parse(path):
        parser = TrlParser((module.GSM8KScriptArguments, FTISConfig, ModelConfig))
        return parser.parse_args_and_config(["--config", str(path)])

    _, paper, _ = parse(PAPER_CONFIG)
    _, same_rows, _ = parse(PAPER_CONFIG.with_name("gsm8k_qwen2.5-1.5b_same_rows.yaml"))
    # As many completions a step as a swarm peer trains on: its own 144 and its partner's 144.
    assert same_rows.generation_batch_size == 2 * paper.generation_batch_size == 288
    differing = {
        name
        for name in vars(paper)
        if not name.startswith("_")
        and name != "distributed_state"
        and getattr(paper, name) != getattr(same_rows, name)
    }
    assert differing <= {
        "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "output_dir", "peer_id",
        "run_name", "logging_dir",
    }  # fmt: skip


def test_script_arguments_document_every_field():
    from dataclasses import fields

    module = _load_example_module()
    own = {f.name for f in fields(module.GSM8KScriptArguments)}
    assert {
        "dataset_path",
        "eval_dataset_path",
        "max_train_samples",
        "max_eval_samples",
        "system_prompt",
        "reward",
    } <= own
    assert all(f.metadata.get("help") for f in fields(module.GSM8KScriptArguments))


def test_training_script_runs_two_steps_end_to_end(tmp_path, tiny_model_dir):
    train_file = _write_jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K_ROWS)
    output_dir = tmp_path / "run"
    config = {
        "model_name_or_path": str(tiny_model_dir),
        "dataset_path": str(train_file),
        "output_dir": str(output_dir),
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,  # 2 micro-batches of 4 completions: 2 prompts x G=4 per step
        "num_generations": 4,
        "max_completion_length": 16,
        "learning_rate": 1e-3,
        "bf16": False,
        "use_cpu": True,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))

    held_out = _write_jsonl(tmp_path / "gsm8k_held_out.jsonl", GSM8K_ROWS)
    _run([TRAIN_SCRIPT, "--config", config_path, "--peer_id", "tiny-peer", "--max_train_samples", 3,
          "--held_out_path", held_out, "--held_out_samples", 3])  # fmt: skip

    assert (output_dir / "config.json").is_file()
    assert (output_dir / "model.safetensors").is_file()
    assert (output_dir / "tokenizer.json").is_file()
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    step_logs = [entry for entry in state["log_history"] if "rewards/strict_reward/mean" in entry]
    assert [entry["step"] for entry in step_logs] == [1, 2]
    assert all(0.0 <= entry["rewards/strict_reward/mean"] <= 1.0 for entry in step_logs)
    summary = json.loads((output_dir / "ftis_summary.json").read_text())
    assert (summary["peer_id"], summary["steps"], summary["exchange_url"]) == ("tiny-peer", 2, None)
    # The held-out evaluation ran before training and at the end, on the first 3 questions, and was logged.
    assert len(summary["accuracy_items_after"]) == 3 and set(summary["accuracy_items_after"]) <= {0, 1}
    assert summary["accuracy_after"] == sum(summary["accuracy_items_after"]) / 3
    assert [step for step, _ in summary["accuracy_history"]] == [0, 2]
    assert sum("eval_accuracy" in entry for entry in state["log_history"]) == 2
    assert json.loads((output_dir / "config.json").read_text())["model_type"] == "llama"


def test_eval_script_writes_records_and_summary(tmp_path, tiny_model_dir):
    data = _write_jsonl(tmp_path / "math500.jsonl", MATH500_ROWS)
    output = tmp_path / "results" / "eval.json"
    result = _run(
        [
            EVAL_SCRIPT,
            "--model_name_or_path", tiny_model_dir,
            "--benchmark", "math500",
            "--dataset_path", data,
            "--limit", 3,
            "--batch_size", 2,
            "--max_new_tokens", 8,
            "--output_json", output,
            "--progress_every", 2,
        ]
    )  # fmt: skip

    assert "| strict pass@1 | answer-only pass@1 |" in result.stdout
    # Progress on stderr while it runs: what it evaluates, then a line after each group of 2 problems.
    progress = [line for line in result.stderr.splitlines() if line.startswith("eval: ")]
    assert "3 math500 problems" in progress[1] and "a progress line every 2 problems" in progress[1]
    assert [line.split(",")[0] for line in progress[2:]] == ["eval: 2/3 problems", "eval: 3/3 problems"]
    written = json.loads(output.read_text())
    summary, records = written["summary"], written["records"]
    assert summary["benchmark"] == "math500" and summary["n"] == 3 == len(records)
    for key in ("strict_accuracy", "answer_accuracy", "format_rate", "truncated_rate", "mean_completion_tokens"):
        assert key in summary
    assert 0.0 <= summary["strict_accuracy"] <= summary["answer_accuracy"] <= 1.0
    assert [r["question"] for r in records] == [row["problem"] for row in MATH500_ROWS[:3]]
    assert [r["solution"] for r in records] == [row["answer"] for row in MATH500_ROWS[:3]]
    assert set(records[0]) >= {"completion", "strict_answer", "lenient_answer", "strict_correct", "answer_correct"}


def test_training_script_runs_under_accelerate_launch(tmp_path, tiny_model_dir):
    """`accelerate launch examples/gsm8k_ftis.py --config ...`, the documented entry point (on the CPU here)."""
    train_file = _write_jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K_ROWS)
    output_dir = tmp_path / "run"
    config = {
        "model_name_or_path": str(tiny_model_dir), "dataset_path": str(train_file), "output_dir": str(output_dir),
        "max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
        "bf16": False, "gradient_checkpointing": False, "report_to": "none", "save_strategy": "no",
        "disable_tqdm": True, "logging_steps": 1,
    }  # fmt: skip
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    _run(["-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", TRAIN_SCRIPT, "--config", config_path])  # fmt: skip
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 1


@pytest.mark.parametrize("script", ["train", "eval"])
def test_a_missing_local_model_folder_is_one_clear_line(tmp_path, script):
    """docs/getting-started.md's own `/models/Qwen2.5-1.5B`: transformers used to answer "Repo id must be in the form
    'repo_name' or 'namespace/repo_name'" for a local path that does not exist."""
    missing = tmp_path / "models" / "Qwen2.5-1.5B"
    if script == "train":
        data = _write_jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K_ROWS)
        argv = [TRAIN_SCRIPT, "--model_name_or_path", missing, "--dataset_path", data, "--output_dir", tmp_path / "o"]
        argv += ["--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    else:
        argv = [EVAL_SCRIPT, "--model_name_or_path", missing, "--benchmark", "math500"]
        argv += ["--dataset_path", _write_jsonl(tmp_path / "math500.jsonl", MATH500_ROWS)]
    result = subprocess.run(
        [sys.executable, *map(str, argv)], cwd=ROOT, env=_subprocess_env(), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"--model_name_or_path: no such local model folder {missing}" in result.stderr
    assert "Repo id must be in the form" not in result.stderr
