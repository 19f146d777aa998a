"""One F-TIS peer trained on GSM8K with the paper's recipe: R1-Zero prompt, strict think/answer reward.

The paper's single-peer run (Qwen2.5-1.5B, fp32, G=12, 12 prompts a step, 50 steps) on one GPU:

    accelerate launch examples/gsm8k_ftis.py --config examples/configs/gsm8k_qwen2.5-1.5b.yaml

Plain `python examples/gsm8k_ftis.py ...` works as well. Offline, from a local model and a local GSM8K-format JSONL
file (one `{"question": ..., "answer": "... #### 72"}` per line):

    python examples/gsm8k_ftis.py --config examples/configs/gsm8k_qwen2.5-1.5b.yaml \\
        --model_name_or_path /models/Qwen2.5-1.5B --dataset_path data/gsm8k_train.jsonl

Join a swarm by adding `--exchange_url dir:///shared/swarm --peer_id qwen1.5b --expected_peers qwen3b --swarm_run
run-1` (and start the other peer with its own config and the same `--swarm_run`, a new one for each run). Every
FTISConfig / GRPOConfig / ModelConfig option is a flag or a YAML key: `--variant f-nois`, `--kl_threshold 10`,
`--use_peft --lora_r 128 --lora_alpha 256 --lora_dropout 0.1`, ... Evaluate the result with `examples/eval_math500.py`.
"""

from dataclasses import dataclass, field

from trl_ftis.dependency_warnings import quiet_dependency_warnings

quiet_dependency_warnings()  # before the imports that warn

from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from trl_ftis import FTISConfig, FTISTrainer
from trl_ftis.console import use_script_console
from trl_ftis.evaluation import add_held_out_evaluation
from trl_ftis.model_paths import local_model_problem
from trl_ftis.peer_ids import peer_id_from
from trl_ftis.tasks.generation import stop_token_ids
from trl_ftis.tasks.math_problems import (
    R1_ZERO_SYSTEM_PROMPT,
    answer_reward,
    load_math_dataset,
    math_correct,
    strict_reward,
)

REWARDS = {"strict": strict_reward, "answer": answer_reward}


@dataclass
class GSM8KScriptArguments(ScriptArguments):
    """
    Script arguments for GSM8K with F-TIS.

    Args:
        dataset_name (`str`, *optional*, defaults to `"openai/gsm8k"`):
            Hub dataset with GSM8K columns `question` and `answer` (a solution ending in `#### <number>`).
        dataset_config (`str`, *optional*, defaults to `"main"`):
            Its configuration.
        dataset_path (`str`, *optional*):
            Local JSONL training file in GSM8K format; replaces `dataset_name` (no download).
        eval_dataset_path (`str`, *optional*):
            Local JSONL evaluation file in GSM8K format, used when `eval_strategy` is not `"no"`; without it the
            `dataset_test_split` of `dataset_name` is used.
        held_out_split (`str`, *optional*):
            A split of `dataset_name` (e.g. `"test"`) for the greedy held-out evaluation before training, at each
            checkpoint and at the end (logged as `eval_accuracy`, kept in `ftis_summary.json`).
        held_out_path (`str`, *optional*):
            Local JSONL file in GSM8K format for that evaluation; replaces `held_out_split` (no download).
        held_out_samples (`int`, *optional*, defaults to `100`):
            Evaluate on the first questions of the held-out set only.
        held_out_max_new_tokens (`int`, *optional*):
            Greedy completion length of the held-out evaluation (default: `max_completion_length`).
        max_train_samples (`int`, *optional*):
            Keep only the first questions of the training set.
        max_eval_samples (`int`, *optional*):
            Keep only the first questions of the evaluation set.
        system_prompt (`str`, *optional*, defaults to the R1-Zero prompt):
            System message before each question; an empty string sends none.
        reward (`str`, *optional*, defaults to `"strict"`):
            `"strict"`: 1 only for the exact think/answer format with a verified answer (the paper);
            `"answer"`: 1 for a verified answer in any format.
    """

    dataset_name: str | None = field(
        default="openai/gsm8k",
        metadata={"help": "Hub dataset with GSM8K columns 'question' and 'answer' ('... #### <number>')."},
    )
    dataset_config: str | None = field(default="main", metadata={"help": "Configuration of the Hub dataset."})
    dataset_path: str | None = field(
        default=None,
        metadata={"help": "Local JSONL training file in GSM8K format (question, answer); replaces dataset_name."},
    )
    eval_dataset_path: str | None = field(
        default=None,
        metadata={
            "help": "Local JSONL evaluation file in GSM8K format, used when eval_strategy is not 'no' (default: the "
            "dataset_test_split of dataset_name)."
        },
    )
    held_out_split: str | None = field(
        default=None,
        metadata={
            "help": "A split of dataset_name (e.g. 'test') for the greedy held-out evaluation before training, at "
            "each checkpoint and at the end (eval_accuracy; kept in ftis_summary.json). Default: none."
        },
    )
    held_out_path: str | None = field(
        default=None,
        metadata={"help": "Local JSONL file in GSM8K format for the held-out evaluation; replaces held_out_split."},
    )
    held_out_samples: int = field(
        default=100, metadata={"help": "Evaluate on the first questions of the held-out set only."}
    )
    held_out_max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Greedy completion length of the held-out evaluation (default: max_completion_length)."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first questions of the training set."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first questions of the evaluation set."}
    )
    system_prompt: str = field(
        default=R1_ZERO_SYSTEM_PROMPT,
        metadata={"help": "System message before each question (default: DeepSeek R1-Zero's); '' sends none."},
    )
    reward: str = field(
        default="strict",
        metadata={
            "help": "'strict': 1 only for exactly one <think> block then one <answer> block with a verified answer "
            "(the paper); 'answer': 1 for a verified answer in any format.",
            "choices": list(REWARDS),
        },
    )


def load_model(model_args: ModelConfig, training_args: FTISConfig):
    """The policy, loaded as TRL's GRPOTrainer would load `model_name_or_path` (dtype, attention, remote code,
    quantization, `model_init_kwargs`)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = model_args.dtype
    model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype if dtype in ("auto", None) else getattr(torch, dtype),
    }
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        from accelerate import PartialState

        model_init_kwargs["quantization_config"] = quantization_config
        model_init_kwargs["device_map"] = {"": PartialState().local_process_index}
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = None  # consumed here; the trainer would only warn about it
    return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **model_init_kwargs)


def load_tokenizer(model_args: ModelConfig, training_args: FTISConfig):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    if tokenizer.pad_token is None:  # e.g. Llama: pad with EOS, padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def name_the_peer(training_args: FTISConfig, model_args: ModelConfig) -> None:
    """Without --peer_id and --run_name the peer announces itself by its model's name (`Qwen/Qwen2.5-1.5B` ->
    `qwen2.5-1.5b`), not by FTISConfig's fallback "peer"; the tracker run is named after the peer."""
    if training_args.peer_id == "peer" and not training_args.run_name:
        training_args.peer_id = peer_id_from(model_args.model_name_or_path)
    if not training_args.run_name:
        training_args.run_name = training_args.peer_id


def main(script_args: GSM8KScriptArguments, training_args: FTISConfig, model_args: ModelConfig):
    if not model_args.model_name_or_path:
        raise ValueError("Set --model_name_or_path (a Hub id such as Qwen/Qwen2.5-1.5B or a local directory).")
    problem = local_model_problem(model_args.model_name_or_path)  # else transformers: "Repo id must be in the form"
    if problem is not None:
        raise ValueError(f"--model_name_or_path: {problem}")
    name_the_peer(training_args, model_args)

    tokenizer = load_tokenizer(model_args, training_args)
    model = load_model(model_args, training_args)
    # Base models often declare only <|endoftext|> as EOS while the chat template ends a turn with another token
    # (Qwen: <|im_end|>); without it a completion runs on into a new turn and never has the strict format.
    stop_ids = stop_token_ids(tokenizer, model)
    model.generation_config.eos_token_id = stop_ids
    if training_args.use_vllm:  # vLLM reads the checkpoint's generation config, not this one: pass the stops along
        training_args.generation_kwargs = {"stop_token_ids": stop_ids, **(training_args.generation_kwargs or {})}

    dataset_kwargs = {
        "name": script_args.dataset_name,
        "config": script_args.dataset_config,
        "system_prompt": script_args.system_prompt,
    }
    train_dataset = load_math_dataset(
        "gsm8k",
        split=script_args.dataset_train_split,
        path=script_args.dataset_path,
        limit=script_args.max_train_samples,
        **dataset_kwargs,
    )
    eval_dataset = None
    if training_args.eval_strategy != "no":
        eval_dataset = load_math_dataset(
            "gsm8k",
            split=script_args.dataset_test_split,
            path=script_args.eval_dataset_path,
            limit=script_args.max_eval_samples,
            **dataset_kwargs,
        )

    trainer = FTISTrainer(
        model,
        REWARDS[script_args.reward],
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    use_script_console(trainer)  # one line per logged step; FTIS_CONSOLE=dict keeps Trainer's dicts
    if script_args.held_out_path or script_args.held_out_split:
        held_out = load_math_dataset(
            "gsm8k",
            split=script_args.held_out_split or "test",
            path=script_args.held_out_path,
            limit=script_args.held_out_samples,
            **dataset_kwargs,
        )
        max_new_tokens = script_args.held_out_max_new_tokens or training_args.max_completion_length
        strict = script_args.reward == "strict"  # the accuracy the reward asks for

        def held_out_correct(model):
            return math_correct(model, tokenizer, held_out, strict=strict, max_new_tokens=max_new_tokens)

        add_held_out_evaluation(trainer, held_out_correct)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print(f"✅ Training of peer {training_args.peer_id!r} completed.")

    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: the per-step log history (rewards, F-TIS statistics)
    trainer.accelerator.print(f"💾 Model saved to {training_args.output_dir}.")

    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"🤗 Model pushed to the Hub in https://huggingface.co/{trainer.hub_model_id}.")

    if hasattr(trainer, "end"):  # transformers >= 5.20: finish the trackers and the process group
        trainer.end()


if __name__ == "__main__":
    parser = TrlParser((GSM8KScriptArguments, FTISConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    main(script_args, training_args, model_args)
