"""The paper's task: GSM8K (train, in-distribution test) and MATH-500 (out-of-distribution test) with an R1-Zero
prompt.

The prompt ([`r1_prompt`]) is DeepSeek R1-Zero's system message, which asks for the reasoning inside
`<think> </think>` and the answer inside `<answer> </answer>`, followed by the question. Two scores:

* **strict** (the paper's training reward, [`strict_reward`]): 1 only if the completion is exactly one think block
  followed by exactly one answer block and nothing else ([`strict_answer`]), and the answer verifies against the
  gold answer with `math-verify` ([`answers_match`]);
* **answer-only** ([`answer_reward`]): the answer is taken leniently ([`lenient_answer`]: the answer block,
  else the last `\\boxed{}`, else the last number) and must verify; the format does not matter.

Datasets ([`load_math_dataset`]) get the columns `prompt` (the conversation), `solution` (the gold answer, the
column TRL passes to the reward functions) and `question`. [`evaluate_math`] measures greedy pass@1 with both
scores. `math-verify` is optional: `pip install 'trl-ftis[math]'`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from .generation import generate_completions, stop_token_ids

__all__ = [
    "DEFAULT_DATASETS",
    "MAX_ANSWER_CHARS",
    "R1_ZERO_SYSTEM_PROMPT",
    "answer_reward",
    "answers_match",
    "evaluate_math",
    "gsm8k_gold_answer",
    "lenient_answer",
    "load_math_dataset",
    "r1_prompt",
    "strict_answer",
    "strict_reward",
]

#: DeepSeek R1-Zero's system prompt (as in open-r1 and TRL's GRPO examples), the paper's prompt.
R1_ZERO_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)

#: Hub dataset, config, default split and the fields holding the question and the gold answer, for each kind.
DEFAULT_DATASETS = {
    "gsm8k": {"name": "openai/gsm8k", "config": "main", "split": "train", "question": "question", "answer": "answer"},
    "math500": {
        "name": "HuggingFaceH4/MATH-500",
        "config": None,
        "split": "test",
        "question": "problem",
        "answer": "answer",
    },
}

#: Answers longer than this never match: sympy can spend seconds on a long expression, and a real final answer
#: (a number, a fraction, an interval, a short expression) is far shorter.
MAX_ANSWER_CHARS = 1000

#: Seconds math-verify may spend parsing one expression and comparing two (main thread only, see `answers_match`).
MATH_VERIFY_TIMEOUT_SECONDS = 5

# ---------------------------------------------------------------------------------------------------------------------
# Prompts and data


def r1_prompt(question: str, system_prompt: str | None = R1_ZERO_SYSTEM_PROMPT) -> list[dict]:
    """The conversational prompt: the system message (omitted when `system_prompt` is empty or None) and the
    user's `question`."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    return messages


_GSM8K_NUMBER = re.compile(r"-?\d*\.?\d+")


def gsm8k_gold_answer(answer_text: str) -> str:
    """The gold answer of a GSM8K solution: the number after `####`, without commas and `$`.

    `"... so 72 in all.\\n#### 1,234"` -> `"1234"`. Raises ValueError naming the text if there is no `####` or
    no number after it.
    """
    if not isinstance(answer_text, str) or "####" not in answer_text:
        raise ValueError(f"GSM8K answer has no '#### <number>' final line: {_shorten(answer_text)!r}")
    tail = answer_text.rsplit("####", 1)[1].replace(",", "").replace("$", "").strip()
    match = _GSM8K_NUMBER.match(tail)
    if match is None:
        raise ValueError(f"GSM8K answer has no number after '####': {_shorten(answer_text)!r}")
    return match.group(0)


def load_math_dataset(
    kind: Literal["gsm8k", "math500"],
    *,
    name: str | None = None,
    config: str | None = None,
    split: str | None = None,
    path: str | Path | None = None,
    system_prompt: str | None = R1_ZERO_SYSTEM_PROMPT,
    limit: int | None = None,
):
    """GSM8K or MATH-500 as a `datasets.Dataset` with the columns `prompt` (an R1-style conversation),
    `solution` (the gold answer) and `question`.

    `path` reads a local JSONL file instead of the Hub: GSM8K rows need `question` and `answer` (a solution
    ending in `#### <number>`), MATH-500 rows `problem` and `answer` (the final answer, LaTeX). Otherwise
    `datasets.load_dataset(name, config, split=split)` with the defaults of [`DEFAULT_DATASETS`] (GSM8K:
    `openai/gsm8k`, config `main`, split `train`; MATH-500: `HuggingFaceH4/MATH-500`, split `test`; a
    `config` given with the default `name` replaces the default config). `limit` keeps the first rows.
    """
    if kind not in DEFAULT_DATASETS:
        raise ValueError(f"kind must be one of {', '.join(DEFAULT_DATASETS)}, got {kind!r}.")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}.")
    defaults = DEFAULT_DATASETS[kind]
    question_field, answer_field = defaults["question"], defaults["answer"]
    gold = gsm8k_gold_answer if kind == "gsm8k" else _math_gold_answer

    if path is not None:
        rows = []
        for where, row in _read_jsonl(path, limit):
            missing = [key for key in (question_field, answer_field) if key not in row]
            if missing:
                raise ValueError(
                    f"{where}: {kind} row has no field {missing[0]!r} (it needs {question_field!r} and "
                    f"{answer_field!r})."
                )
            try:
                rows.append(_example(row[question_field], gold(row[answer_field]), system_prompt))
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from error
        from datasets import Dataset

        return Dataset.from_list(rows, features=_features())

    from datasets import load_dataset

    if name is None:
        name, config = defaults["name"], config if config is not None else defaults["config"]
    dataset = load_dataset(name, config, split=split or defaults["split"])
    missing = [key for key in (question_field, answer_field) if key not in dataset.column_names]
    if missing:
        raise ValueError(
            f"Dataset {name!r} (config {config!r}, split {split or defaults['split']!r}) has no column "
            f"{missing[0]!r}; a {kind} dataset needs {question_field!r} and {answer_field!r}, it has "
            f"{dataset.column_names}."
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset.map(
        lambda row: _example(row[question_field], gold(row[answer_field]), system_prompt),
        remove_columns=dataset.column_names,
    )


def _example(question: Any, solution: str, system_prompt: str | None) -> dict:
    question = str(question)
    return {"prompt": r1_prompt(question, system_prompt), "solution": solution, "question": question}


def _math_gold_answer(answer: Any) -> str:
    answer = str(answer).strip()
    if not answer:
        raise ValueError("MATH answer is empty.")
    return answer


def _features():
    from datasets import Features, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features({"prompt": [message], "solution": Value("string"), "question": Value("string")})


def _read_jsonl(path: str | Path, limit: int | None):
    """Yields `("file:line", row)` for the first `limit` non-blank lines of a JSONL file of objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Dataset file not found: {path}")
    count = 0
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg}).") from error
            if not isinstance(row, dict):
                raise TypeError(f"{where}: expected a JSON object, got {type(row).__name__}.")
            count += 1
            yield where, row


def _shorten(text: Any, width: int = 200) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."


# ---------------------------------------------------------------------------------------------------------------------
# Answer extraction


def _completion_text(completion: Any) -> str:
    """A completion's text: a string, or the content of the last assistant message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence) and completion:
        messages = [m for m in completion if isinstance(m, dict)]
        replies = [m for m in messages if m.get("role", "assistant") == "assistant"]
        if replies:
            return _content_text(replies[-1].get("content"))
        return _content_text(messages[-1].get("content")) if messages else str(completion[-1])
    return ""


def _content_text(content: Any) -> str:
    # Multimodal messages hold a list of parts such as {"type": "text", "text": ...}.
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def strict_answer(text: Any) -> str | None:
    """The stripped content of the answer block if the completion has the exact R1 format, else None.

    Exact format: optional whitespace, one `<think>...</think>`, only whitespace, one `<answer>...</answer>`,
    then only whitespace. A second block of either kind, text before `<think>`, between the blocks or after
    `</answer>`, or the blocks in the other order all give None. Accepts a string or a conversational completion.
    """
    text = _completion_text(text)
    if any(text.count(tag) != 1 for tag in _TAGS):
        return None
    think_open, think_close, answer_open, answer_close = (text.index(tag) for tag in _TAGS)
    if not think_open < think_close < answer_open < answer_close:
        return None
    between = text[think_close + len("</think>") : answer_open]
    after = text[answer_close + len("</answer>") :]
    if text[:think_open].strip() or between.strip() or after.strip():
        return None
    return text[answer_open + len("<answer>") : answer_close].strip()


_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# A number, with thousands separators; not the tail of another number ("3-4" gives "3" and "4", not "-4").
_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def lenient_answer(text: Any) -> str | None:
    """The answer for answer-only scoring: the content of the last non-empty `<answer>` block, else of the last
    `\\boxed{}`, else the last number in the text; None if there is none of these."""
    text = _completion_text(text)
    for block in reversed(_ANSWER_BLOCK.findall(text)):
        if block.strip():
            return block.strip()
    boxed = _last_boxed_content(text)
    if boxed:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _last_boxed_content(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed), None if there is none or it is unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    begin = start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:index].strip() or None
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Verification


def _math_verify():
    try:
        import math_verify
    except ImportError as error:
        raise ImportError(
            "Scoring math answers needs the math-verify package: pip install 'trl-ftis[math]'"
        ) from error
    return math_verify


_LATEX_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def _for_parsing(text: str) -> str:
    """The text math-verify should parse: LaTeX (backslashes) or bare math (no letters) is put between `$`, so
    that it is read as one expression ("2\\sqrt{2}" is not just "2", "3, 5" is a set); words ("72 dollars") are left
    for its plain-text extraction; already delimited LaTeX is left alone. An escaped `\\$` is currency: dropped."""
    text = text.replace("\\$", "").strip()
    if any(delimiter in text for delimiter in _LATEX_DELIMITERS):
        return text
    if "\\" in text or not re.search(r"[A-Za-z]", text):
        return f"${text}$"
    return text


def _verify_timeout() -> int | None:
    # math-verify times out with signal.alarm, which only works in the main thread; elsewhere run without a timeout
    # (answers are capped at MAX_ANSWER_CHARS) rather than fail.
    if threading.current_thread() is threading.main_thread():
        return MATH_VERIFY_TIMEOUT_SECONDS
    for name in ("math_verify.parser", "math_verify.grader"):  # its "timeout is disabled" warnings
        logging.getLogger(name).setLevel(logging.ERROR)
    return None


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None):
    # A group of completions shares its gold answer: parse it once.
    return _math_verify().parse(_for_parsing(gold), parsing_timeout=timeout)


def answers_match(predicted: str | None, gold: str) -> bool:
    """Whether `predicted` verifies against `gold` with math-verify (numbers, fractions, LaTeX, sets, ...).

    `"1,234"`, `"\\boxed{1234}"`, `"$1234$"` and `"1234.0"` all match the gold `"1234"`; `"0.5"` matches
    `"\\frac{1}{2}"`. Never raises on a bad prediction (unparsable, too long, timed out: False). Raises ImportError
    if math-verify is not installed.
    """
    math_verify = _math_verify()
    if not isinstance(predicted, str) or not predicted.strip() or len(predicted) > MAX_ANSWER_CHARS:
        return False
    gold = str(gold).strip()
    if not gold or len(gold) > MAX_ANSWER_CHARS:
        return False
    from math_verify.errors import TimeoutException

    timeout = _verify_timeout()
    try:
        gold_parsed = _parse_gold(gold, timeout)
        if not gold_parsed:
            return False
        predicted_parsed = math_verify.parse(_for_parsing(predicted), parsing_timeout=timeout)
        if not predicted_parsed:
            return False
        return bool(math_verify.verify(gold_parsed, predicted_parsed, timeout_seconds=timeout))
    except (Exception, TimeoutException):  # noqa: BLE001 - sympy can raise anything; TimeoutException is a BaseException
        return False


# ---------------------------------------------------------------------------------------------------------------------
# Rewards (TRL signature: the dataset's `solution` column arrives as a keyword argument)


def strict_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """The paper's reward: 1.0 if the completion has the exact think/answer format ([`strict_answer`]) and its
    answer verifies against `solution` ([`answers_match`]), else 0.0."""
    return [
        1.0 if answers_match(strict_answer(completion), gold) else 0.0
        for completion, gold in zip(completions, solution, strict=True)
    ]


def answer_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """Answer-only reward: 1.0 if the leniently extracted answer ([`lenient_answer`]) verifies against
    `solution`, whatever the format, else 0.0."""
    return [
        1.0 if answers_match(lenient_answer(completion), gold) else 0.0
        for completion, gold in zip(completions, solution, strict=True)
    ]


# TRL logs each reward as rewards/<__name__>/mean; keep the names stable even if these are wrapped or aliased.
strict_reward.__name__ = "strict_reward"
answer_reward.__name__ = "answer_reward"

# ---------------------------------------------------------------------------------------------------------------------
# Evaluation


def evaluate_math(
    model,
    tokenizer,
    dataset,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 1024,
) -> dict:
    """Greedy pass@1 on `dataset` (rows with `prompt` and `solution`, e.g. from [`load_math_dataset`]).

    Prompts go through the tokenizer's chat template, in left-padded batches of `batch_size` (sorted by length,
    results in dataset order). A completion ends at a stop token ([`stop_token_ids`]) or after
    `max_new_tokens`. Returns ``{"n", "strict_accuracy", "answer_accuracy", "format_rate", "truncated_rate",
    "mean_completion_tokens", "records"}`, where `records` holds one dict a question (`question``,
    `solution`, `completion`, `strict_answer`, `lenient_answer`, `strict_correct`, `answer_correct`,
    `completion_tokens`, `truncated`).
    """
    rows = [dict(row) for row in dataset]
    completions = generate_completions(
        model,
        tokenizer,
        [row["prompt"] for row in rows],
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        stop_ids=stop_token_ids(tokenizer, model),
        sort_by_length=True,  # less padding per batch
    )

    records = []
    for i, row in enumerate(rows):
        text, num_tokens, truncated = completions[i]
        strict, lenient = strict_answer(text), lenient_answer(text)
        records.append(
            {
                "question": row.get("question", ""),
                "solution": row["solution"],
                "completion": text,
                "strict_answer": strict,
                "lenient_answer": lenient,
                "strict_correct": answers_match(strict, row["solution"]),
                "answer_correct": answers_match(lenient, row["solution"]),
                "completion_tokens": num_tokens,
                "truncated": truncated,
            }
        )
    n = len(records)

    def rate(values) -> float:
        return sum(values) / n if n else 0.0

    return {
        "n": n,
        "strict_accuracy": rate(r["strict_correct"] for r in records),
        "answer_accuracy": rate(r["answer_correct"] for r in records),
        "format_rate": rate(r["strict_answer"] is not None for r in records),
        "truncated_rate": rate(r["truncated"] for r in records),
        "mean_completion_tokens": rate(r["completion_tokens"] for r in records),
        "records": records,
    }


def math_correct(model, tokenizer, dataset, *, strict: bool = False, max_new_tokens: int = 1024,
                 batch_size: int = 16) -> list[bool]:  # fmt: skip
    """Per question of `dataset`, whether the greedy completion of [`evaluate_math`] is right: in the strict
    think/answer format (`strict=True`, as [`strict_reward`] scores) or in any format (as [`answer_reward`]). The
    per-question form that `trl_ftis.evaluation.add_held_out_evaluation` pairs between a peer and its control."""
    records = evaluate_math(model, tokenizer, dataset, batch_size=batch_size, max_new_tokens=max_new_tokens)["records"]
    return [bool(record["strict_correct" if strict else "answer_correct"]) for record in records]
