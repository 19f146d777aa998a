"""Greedy pass@1 of a model on MATH-500 (out of distribution) or the GSM8K test set (in distribution), as in the paper.

    python examples/eval_math500.py --model_name_or_path runs/gsm8k-qwen2.5-1.5b --benchmark math500
    python examples/eval_math500.py --model_name_or_path Qwen/Qwen2.5-1.5B --benchmark gsm8k --limit 512
    python examples/eval_math500.py --model_name_or_path Qwen/Qwen2.5-1.5B --adapter runs/lora-peer \\
        --benchmark math500 --output_json results/lora_math500.json
    python examples/eval_math500.py --model_name_or_path /models/Qwen2.5-1.5B --benchmark gsm8k \\
        --dataset_path data/gsm8k_test.jsonl          # offline: GSM8K rows `question`, `answer` ("... #### 72")

The prompt is the training prompt (R1-Zero system message and the question, through the tokenizer's chat
template). Two scores per question: strict (exactly one think block then one answer block, answer verified with
math-verify: the training reward) and answer-only (the answer block, else the last \\boxed{}, else the last number,
verified whatever the format). Writes every completion and the summary to `--output_json` and prints a table.
While it runs it prints progress to stderr: a line after each group of `--progress_every` problems (default four
batches) with the problems done, both scores so far and the time left at that pace.
"""

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trl_ftis.dependency_warnings import quiet_dependency_warnings

quiet_dependency_warnings()  # before the imports that warn

from transformers import HfArgumentParser

from trl_ftis.model_paths import local_model_problem
from trl_ftis.tasks.math_problems import R1_ZERO_SYSTEM_PROMPT, evaluate_math, load_math_dataset

#: The paper evaluates on the first 512 GSM8K test questions and on all of MATH-500.
DEFAULT_LIMITS = {"gsm8k": 512, "math500": None}


@dataclass
class EvalArguments:
    model_name_or_path: str = field(
        metadata={"help": "Hub id or local directory of the model (or of the base model)."}
    )
    adapter: str | None = field(default=None, metadata={"help": "Local directory or Hub id of a PEFT adapter."})
    benchmark: str = field(
        default="math500",
        metadata={
            "help": "'math500' (MATH-500, out of distribution) or 'gsm8k' (GSM8K test).",
            "choices": ["gsm8k", "math500"],
        },
    )
    dataset_path: str | None = field(
        default=None,
        metadata={"help": "Local JSONL file instead of the Hub (GSM8K: question, answer; MATH-500: problem, answer)."},
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset (default: openai/gsm8k 'main' or HuggingFaceH4/MATH-500)."}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration of the Hub dataset."})
    split: str = field(default="test", metadata={"help": "Split of the Hub dataset."})
    limit: int | None = field(
        default=None,
        metadata={"help": "Evaluate the first N questions (default: 512 for GSM8K, all 500 for MATH-500)."},
    )
    batch_size: int = field(default=32, metadata={"help": "Prompts generated together."})
    progress_every: int | None = field(
        default=None,
        metadata={
            "help": "Print a progress line to stderr after every N problems (default: 4 batches; at least one batch; "
            "prompts are sorted by length within each group of N). 0: no line until the end."
        },
    )
    max_new_tokens: int = field(default=1024, metadata={"help": "Longest completion, in tokens."})
    system_prompt: str = field(
        default=R1_ZERO_SYSTEM_PROMPT,
        metadata={"help": "System message (default: R1-Zero's, as in training); '' for none."},
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "Weights dtype (the paper trains in fp32).",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )
    device: str | None = field(default=None, metadata={"help": "Device (default: cuda if available, else cpu)."})
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "Tokenizer (default: the model's)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow models that ship their own code."})
    output_json: str | None = field(
        default=None,
        metadata={"help": "Where to write the summary and every completion (default: eval_<benchmark>_<model>.json)."},
    )


def load_model_and_tokenizer(args: EvalArguments):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_name_or_path, dtype=dtype, trust_remote_code=args.trust_remote_code
    )
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload()  # merged: plain generation speed
    tokenizer = AutoTokenizer.from_pretrained(
        args.tokenizer_name_or_path or args.model_name_or_path, trust_remote_code=args.trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def default_output_path(args: EvalArguments) -> Path:
    name = Path(args.adapter or args.model_name_or_path).name or "model"
    return Path(f"eval_{args.benchmark}_{name}.json")


#: The scores of [`evaluate_math`]: rates (and a mean) over its `n` questions, combined across groups by their `n`.
SCORES = ("strict_accuracy", "answer_accuracy", "format_rate", "truncated_rate", "mean_completion_tokens")


def progress_line(done: int, total: int, strict: float, answer: float, elapsed: float) -> str:
    """`done`/`total` problems, both scores so far, elapsed time and, at that pace, the time left."""
    left = elapsed / done * (total - done) if done else float("nan")
    return (
        f"eval: {done}/{total} problems, strict pass@1 so far {strict:.3f}, answer-only {answer:.3f}, "
        f"{elapsed:.0f} s elapsed, about {left:.0f} s left"
    )


def evaluate_with_progress(
    rows: list[dict],
    evaluate: Callable[[list[dict]], dict],
    group_size: int,
    stream=None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """`evaluate` (an [`evaluate_math`] on some rows) over `rows` in groups of `group_size` (all at once when 0),
    a [`progress_line`] on `stream` (default stderr) after each group; returns what one `evaluate` over every row
    would: the [`SCORES`] combined over the groups (weighted by their `n`), the records in order."""
    stream = sys.stderr if stream is None else stream
    group_size = group_size if group_size > 0 else max(len(rows), 1)
    started, parts, records = clock(), [], []
    for start in range(0, len(rows), group_size):
        part = evaluate(rows[start : start + group_size])
        parts.append(part)
        records += part["records"]
        done = sum(p["n"] for p in parts)
        so_far = combine_scores(parts)
        line = progress_line(done, len(rows), so_far["strict_accuracy"], so_far["answer_accuracy"], clock() - started)
        print(line, file=stream, flush=True)
    return {**combine_scores(parts), "records": records}


def combine_scores(parts: list[dict]) -> dict:
    """`n` and the [`SCORES`] of several [`evaluate_math`] results, as over all their questions at once."""
    n = sum(part["n"] for part in parts)
    return {"n": n, **{key: sum(p[key] * p["n"] for p in parts) / n if n else 0.0 for key in SCORES}}


def markdown_table(summary: dict) -> str:
    model = summary["model"] + (f" + {summary['adapter']}" if summary["adapter"] else "")
    header = "| model | benchmark | n | strict pass@1 | answer-only pass@1 | format | truncated | mean tokens |"
    row = (
        f"| {model} | {summary['benchmark']} | {summary['n']} | {summary['strict_accuracy']:.3f} | "
        f"{summary['answer_accuracy']:.3f} | {summary['format_rate']:.3f} | {summary['truncated_rate']:.3f} | "
        f"{summary['mean_completion_tokens']:.1f} |"
    )
    return f"{header}\n|---|---|---|---|---|---|---|---|\n{row}"


def main(args: EvalArguments) -> dict:
    limit = args.limit if args.limit is not None else DEFAULT_LIMITS[args.benchmark]
    dataset = load_math_dataset(
        args.benchmark,
        name=args.dataset_name,
        config=args.dataset_config,
        split=args.split,
        path=args.dataset_path,
        system_prompt=args.system_prompt,
        limit=limit,
    )
    for flag, value in (("--model_name_or_path", args.model_name_or_path), ("--adapter", args.adapter)):
        problem = local_model_problem(value)  # else transformers answers "Repo id must be in the form ..."
        if problem is not None:
            raise SystemExit(f"eval: {flag}: {problem}")
    print(f"eval: loading {args.model_name_or_path}" + (f" + {args.adapter}" if args.adapter else ""), file=sys.stderr)
    model, tokenizer = load_model_and_tokenizer(args)
    rows = [dict(row) for row in dataset]
    group = args.progress_every if args.progress_every is not None else 4 * args.batch_size
    group = max(group, args.batch_size) if group > 0 else 0
    print(
        f"eval: {len(rows)} {args.benchmark} problems on {model.device}, batches of {args.batch_size}, at most "
        f"{args.max_new_tokens} new tokens" + (f", a progress line every {group} problems" if group else ""),
        file=sys.stderr,
        flush=True,
    )

    def evaluate(part: list[dict]) -> dict:
        return evaluate_math(model, tokenizer, part, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)

    start = time.perf_counter()
    result = evaluate_with_progress(rows, evaluate, group)
    records = result.pop("records")
    summary = {
        "model": args.model_name_or_path,
        "adapter": args.adapter,
        "benchmark": args.benchmark,
        "dataset": args.dataset_path or args.dataset_name or "default",
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        **result,
        "seconds": round(time.perf_counter() - start, 1),
        "arguments": asdict(args),
    }

    output = Path(args.output_json) if args.output_json else default_output_path(args)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"summary": summary, "records": records}, indent=2, ensure_ascii=False))
    print(markdown_table(summary))
    print(f"\nWrote {len(records)} records to {output}")
    return summary


if __name__ == "__main__":
    (eval_args,) = HfArgumentParser(EvalArguments).parse_args_into_dataclasses()
    main(eval_args)
