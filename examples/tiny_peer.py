"""One swarm peer training a tiny local model on 2-digit addition; start several with different sizes.

    export FTIS_SWARM_RUN=run-1  # one id for every peer of this run, a new one for the next run
    python examples/tiny_peer.py --peer_id big --hidden_size 64 --exchange_url dir:///tmp/swarm --output_dir runs/big \
        --expected_peers big small
    python examples/tiny_peer.py --peer_id small --hidden_size 32 --exchange_url dir:///tmp/swarm \
        --output_dir runs/small --expected_peers big small
    python examples/tiny_peer.py --peer_id lora --use_peft --lora_target_modules q_proj v_proj ...

or all at once: `trl-ftis swarm examples/swarms/tiny.yaml`. Every FTISConfig / GRPOConfig option is a flag
(`--kl_threshold 5`, `--variant f-nois`, `--expected_peers big small`, ...). Models and tokenizer are built locally,
so this runs offline in seconds; `--model_name_or_path` loads a saved model instead. On a machine without a GPU it
runs on the CPU in fp32 (`--use_cpu true --bf16 false` are its defaults there; flags still win), and it prints one
line per logged step (`FTIS_CONSOLE=dict` prints Trainer's dicts instead).
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from trl_ftis.dependency_warnings import quiet_dependency_warnings

quiet_dependency_warnings()  # before the imports that warn

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import ModelConfig, TrlParser, get_peft_config  # noqa: E402

from trl_ftis import FTISConfig, FTISTrainer  # noqa: E402
from trl_ftis.console import use_script_console
from trl_ftis.demo.tiny import (  # noqa: E402
    TINY_TOKENIZERS,
    build_tiny_causal_lm,
    build_tokenizer,
    supervised_warmup,
    warmup_dev_problems,
)
from trl_ftis.evaluation import add_held_out_evaluation  # noqa: E402
from trl_ftis.shared_names import SUMMARY_FILE  # noqa: E402
from trl_ftis.tasks.addition import (  # noqa: E402
    addition_dataset,
    addition_problems,
    digit_match_reward,
    exact_answer_reward,
    greedy_correct,
)

REWARDS = {"exact": exact_answer_reward, "digit_match": digit_match_reward}


@dataclass
class TinyPeerArguments:
    """The tiny model and task of this peer."""

    architecture: str = field(
        default="llama",
        metadata={"help": "Decoder family of the tiny model: llama, qwen2, mistral or gemma2."},
    )
    tokenizer: str = field(
        default="char",
        metadata={
            "help": f"Tokenizer: {' or '.join(TINY_TOKENIZERS)} (peers with different ones need --cross_tokenizer).",
            "choices": list(TINY_TOKENIZERS),
        },
    )
    hidden_size: int = field(default=64, metadata={"help": "Hidden size of the tiny model (64: ~134k parameters)."})
    num_layers: int = field(default=2, metadata={"help": "Decoder layers of the tiny Llama."})
    model_seed: int = field(default=0, metadata={"help": "Seed of the tiny model's initial weights."})
    sft_warmup_steps: int = field(default=0, metadata={"help": "Supervised warm-up steps before GRPO (0: none)."})
    sft_target_accuracy: float = field(
        default=0.25, metadata={"help": "Stop the warm-up once greedy dev accuracy reaches this."}
    )
    train_size: int = field(default=2048, metadata={"help": "Training problems."})
    dataset_seed: int | None = field(
        default=None,
        metadata={
            "help": "Seed of this peer's prompt stream (default: derived from peer_id and --seed, so that a peer and "
            "its controls draw the same prompts and each seed of a launcher run others)."
        },
    )
    eval_size: int = field(
        default=0, metadata={"help": "Held-out problems for greedy accuracy before/after (0: skip)."}
    )
    eval_every: int = field(
        default=0,
        metadata={
            "help": "Also evaluate the held-out problems every this many steps (0: only before and after): the "
            "launcher then measures each arm's gain at equal steps and its time to an accuracy (trl_ftis.joining)."
        },
    )
    reward: str = field(default="exact", metadata={"help": "Reward: 'exact' (1 if correct) or 'digit_match' (dense)."})
    step_delay: float = field(
        default=0.0,
        metadata={
            "help": "Seconds to sleep after each optimizer step: a slower peer (a bigger model, slower hardware) "
            "without the CPU it would take, for benchmarks of peers at different speeds (0: none)."
        },
    )

    start_at: float = field(
        default=0.0,
        metadata={
            "help": "Unix time at which to start training, once the model is built: peers of a benchmark start "
            "together, whatever their start-up times (0: at once)."
        },
    )
    start_file: str | None = field(
        default=None,
        metadata={
            "help": "Once the model is built, write `<start_file>.<peer_id>.ready` and wait until `start_file` exists "
            "before training: whoever starts the peers starts their training together, however long each one's "
            "start-up takes on a busy machine; it gives up after 15 minutes (unset: at once)."
        },
    )
    start_together: bool = field(
        default=False,
        metadata={
            "help": "Once the model is built, wait until every peer of --expected_peers has built its own (ready "
            "files in this run's folder, the parent of --output_dir): a sync-mode swarm's first round then does not "
            "count a partner's start-up (its warm-up) as this peer's training time, which a comparison of times to "
            "an accuracy against controls would otherwise charge to the swarm; gives up after 15 minutes. A peer "
            "without expected peers (a control) starts at once."
        },
    )


START_FILE_PATIENCE = 900  # seconds a peer waits for its `start_file` or its partners


def wait_for_partners(output_dir: str, peer_id: str, expected: list[str]) -> None:
    """`--start_together`: mark this peer ready in the run folder and wait until every expected peer is."""
    folder = Path(output_dir).resolve().parent / ".start-together"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{peer_id}.ready").touch()
    deadline = time.monotonic() + START_FILE_PATIENCE  # a partner that died never leaves this peer waiting forever
    while not all((folder / f"{other}.ready").exists() for other in expected):
        if time.monotonic() > deadline:
            sys.exit(f"the expected peers were not all ready within {START_FILE_PATIENCE} s: not training")
        time.sleep(0.05)


class StepDelay(TrainerCallback):
    """Sleeps `seconds` after each optimizer step (`--step_delay`)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main() -> None:
    parser = TrlParser((TinyPeerArguments, FTISConfig, ModelConfig))
    if not torch.cuda.is_available():  # TRL's bf16 default refuses to start on a CPU-only machine; flags still win
        parser.set_defaults(use_cpu=True, bf16=False)
    peer_args, training_args, model_args = parser.parse_args_and_config()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    tokenizer = build_tokenizer(peer_args.tokenizer)
    if model_args.model_name_or_path:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        model = build_tiny_causal_lm(
            tokenizer,
            peer_args.architecture,
            hidden_size=peer_args.hidden_size,
            num_layers=peer_args.num_layers,
            seed=peer_args.model_seed,
        )
    # Each peer draws its own prompts (vertical mode); horizontal mode needs the same seed everywhere.
    seed = peer_args.dataset_seed
    if seed is None:
        seed = zlib.crc32(f"{training_args.peer_id}/{training_args.seed}".encode()) % 10_000
    train = addition_problems(peer_args.train_size, seed=seed, split="train")
    held_out = addition_problems(peer_args.eval_size, seed=99_999, split="test")  # the same for every peer

    if peer_args.sft_warmup_steps:
        supervised_warmup(
            model,
            tokenizer,
            train,
            steps=peer_args.sft_warmup_steps,
            target_accuracy=peer_args.sft_target_accuracy,
            dev_problems=warmup_dev_problems(100, seed=seed + 1),  # never in the held-out split
            seed=peer_args.model_seed,
            eval_every=25,
        )

    trainer = FTISTrainer(
        model,
        REWARDS[peer_args.reward],
        args=training_args,
        train_dataset=addition_dataset(peer_args.train_size, seed=seed, split="train"),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[StepDelay(peer_args.step_delay)] if peer_args.step_delay > 0 else None,
    )
    use_script_console(trainer)  # one line per logged step; FTIS_CONSOLE=dict keeps Trainer's dicts
    if held_out:  # before training, at every checkpoint and at the end: eval_accuracy, and ftis_summary.json's
        held_out_eval = add_held_out_evaluation(
            trainer, lambda m: greedy_correct(m, tokenizer, held_out), every=peer_args.eval_every or None
        )
    if peer_args.start_at > time.time():
        time.sleep(peer_args.start_at - time.time())
    if peer_args.start_together and training_args.expected_peers:
        wait_for_partners(training_args.output_dir, training_args.peer_id, list(training_args.expected_peers))
    if peer_args.start_file:
        Path(f"{peer_args.start_file}.{training_args.peer_id}.ready").touch()
        deadline = time.monotonic() + START_FILE_PATIENCE  # a starter that died never leaves this peer waiting forever
        while not Path(peer_args.start_file).exists():
            if time.monotonic() > deadline:
                sys.exit(f"{peer_args.start_file} did not appear within {START_FILE_PATIENCE} s: not training")
            time.sleep(0.05)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)

    if trainer.accelerator.is_main_process:
        summary_path = Path(training_args.output_dir) / SUMMARY_FILE
        summary = json.loads(summary_path.read_text())  # held-out results included (accuracy_before, ...)
        results = held_out_eval.results() if held_out else {}
        accuracy = f", accuracy {results['accuracy_before']:.2f} -> {results['accuracy_after']:.2f}" if results else ""
        # Under the launcher (FTIS_PEER_ID set) every line is already prefixed with the peer's id.
        who = "" if os.environ.get("FTIS_PEER_ID") else f"[{training_args.peer_id}] "
        print(
            f"{who}done: {summary['steps']} steps, {summary['rows_accepted']} peer rows accepted"
            f"{accuracy}; summary in {summary_path}",
            flush=True,
        )


if __name__ == "__main__":
    main()
