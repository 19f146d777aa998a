"""One peer of the demo swarm: GRPO/F-TIS on word problems with a local chat model (the script `trl-ftis demo` runs).

    python -m trl_ftis.demo.peer --model_name_or_path CKPT --data_dir DATA --peer_id full \\
        --exchange_url dir:///tmp/swarm --output_dir runs/demo/full [--use_peft] [any FTISConfig flag]

It evaluates held-out greedy accuracy before and after training, prints one compact progress line per logged step,
saves the trained model (a LoRA peer saves its adapter), its log history (`log_history.json`) and adds the
accuracies to `ftis_summary.json`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_ftis.dependency_warnings import quiet_dependency_warnings  # noqa: E402

quiet_dependency_warnings()  # before the imports that warn

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import ModelConfig, TrlParser, get_peft_config  # noqa: E402

from trl_ftis.config import FTISConfig  # noqa: E402
from trl_ftis.console import use_step_lines  # noqa: E402
from trl_ftis.shared_names import SUMMARY_FILE  # noqa: E402
from trl_ftis.tasks.word_problems import DEFAULT_REWARD_FUNCS, evaluate_problems, word_problem_dataset  # noqa: E402
from trl_ftis.trainer import FTISTrainer  # noqa: E402


@dataclass
class DemoPeerArguments:
    """Data and evaluation of a demo peer."""

    data_dir: str = field(metadata={"help": "Folder with train.jsonl and test.jsonl (one problem per line)."})
    eval_size: int = field(default=100, metadata={"help": "Held-out problems for greedy accuracy (0: skip)."})
    eval_max_new_tokens: int = field(default=64, metadata={"help": "Token budget of an evaluation answer."})
    eval_every: int = field(default=0, metadata={"help": "Also evaluate every N steps (0: only before and after)."})
    train_alone: bool = field(
        default=False, metadata={"help": "Baseline: ignore the exchange; train on this peer's own rows only."}
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ProgressCallback(TrainerCallback):
    """Held-out accuracy every `eval_every` steps (the step lines are `trl_ftis.console.use_step_lines`)."""

    def __init__(self, peer_id: str, evaluate, eval_every: int):
        self.peer_id, self.evaluate, self.eval_every = peer_id, evaluate, eval_every
        self.started = time.time()
        self.accuracy: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.eval_every and state.global_step % self.eval_every == 0 and state.global_step < state.max_steps:
            accuracy = self.evaluate(model)
            self.accuracy.append((state.global_step, accuracy))
            print(f"step {state.global_step}: held-out accuracy {accuracy:.3f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = TrlParser((DemoPeerArguments, FTISConfig, ModelConfig))
    demo_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if demo_args.train_alone:
        training_args.exchange_url = None

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, dtype=torch.float32)
    data_dir = Path(demo_args.data_dir)
    train = read_jsonl(data_dir / "train.jsonl")
    held_out = read_jsonl(data_dir / "test.jsonl")[: demo_args.eval_size]

    def evaluate(current_model) -> float:
        if not held_out:
            return float("nan")
        result = evaluate_problems(
            current_model, tokenizer, held_out, max_new_tokens=demo_args.eval_max_new_tokens, batch_size=25
        )
        return result["accuracy"]

    before = evaluate(model)
    print(f"held-out accuracy before training: {before:.3f} ({len(held_out)} problems)", flush=True)

    trainer = FTISTrainer(
        model,
        list(DEFAULT_REWARD_FUNCS),
        args=training_args,
        train_dataset=word_problem_dataset(train),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    use_step_lines(trainer)
    progress = ProgressCallback(training_args.peer_id, evaluate, demo_args.eval_every)
    trainer.add_callback(progress)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    after = evaluate(trainer.model)
    print(f"held-out accuracy after training: {after:.3f}", flush=True)

    if trainer.accelerator.is_main_process:
        output = Path(training_args.output_dir)
        (output / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        summary = json.loads((output / SUMMARY_FILE).read_text())
        summary.update(
            accuracy_before=before,
            accuracy_after=after,
            accuracy_curve=[(0, before), *progress.accuracy, (trainer.state.global_step, after)],
            train_alone=demo_args.train_alone,
            lora=bool(model_args.use_peft),
            model=str(model_args.model_name_or_path),
        )
        (output / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
