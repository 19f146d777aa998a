"""Procedurally generated, verifiable word problems in GSM8K answer format, for GRPO on small chat models.

Each problem is a short story about buying, selling, sharing or comparing a few small quantities, e.g.

    question: "Mia has 14 marbles. She buys 9 more. How many marbles does Mia have now?"
    solution: "Mia has 14 + 9 = 23 marbles.\\n#### 23"
    answer:   "23"

`difficulty=1` problems take one operation (+, -, x or exact division), `difficulty=2` problems two. The chat
prompt ([`chat_prompt`]) asks the model to think briefly and end with `#### <number>` on its own line, as
GSM8K solutions do, so [`extract_answer`] and the reward functions also apply to GSM8K itself.

Held-out sets: [`train_test_split_problems`] draws the test set first and the training set from another seed
stream with every test question excluded, so the two never share a question (and the same `seed` always gives the
same split). To build splits by hand, draw the held-out set and pass its questions as `exclude` to the training
draw.

Difficulty 1 is the default because SmolLM2-135M-Instruct ([`trl_ftis.demo.smollm`]) starts inside GRPO's useful
band on it, and difficulty 2 is too hard to start from (an observation of earlier runs; no raw record was kept).

Rewards (TRL signature `f(prompts, completions, answer, **kwargs) -> list[float]`): [`correctness_reward`]
(1 iff the number after the last `####` equals the answer) and [`format_reward`] (1 iff the completion ends
with exactly one `#### <number>` line). The demo default is [`DEFAULT_REWARD_FUNCS`] with
[`DEFAULT_REWARD_WEIGHTS`] (`[1.0, 0.2]`, pass them as `reward_funcs` and `FTISConfig(reward_weights=...)`),
or equivalently the single function [`combined_reward`].
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from .generation import generate_completions

__all__ = [
    "DEFAULT_DIFFICULTY",
    "DEFAULT_REWARD_FUNCS",
    "DEFAULT_REWARD_WEIGHTS",
    "DIFFICULTIES",
    "FEW_SHOT",
    "SYSTEM_PROMPT",
    "chat_prompt",
    "combined_reward",
    "completion_text",
    "correctness_reward",
    "evaluate_problems",
    "exact_accuracy",
    "extract_answer",
    "format_reward",
    "has_final_answer_format",
    "train_test_split_problems",
    "word_problem_dataset",
    "word_problems",
]

#: Asks for brief reasoning and a GSM8K-style last line. Kept short: every prompt token costs CPU time (the prompt
#: goes through every training forward/backward pass too).
SYSTEM_PROMPT = "Solve the problem. End with the final answer on its own line as #### <number>."

#: One worked example, as a previous user/assistant turn. Without it SmolLM2-135M-Instruct rambles and almost never
#: writes `####`; with it, it answers briefly in the right format (observed in earlier runs, not recorded).
FEW_SHOT = (("Kim has 3 pens and buys 4 more. How many pens does Kim have now?", "Kim has 3 + 4 = 7 pens.\n#### 7"),)

DIFFICULTIES = (1, 2)
#: One-step problems: the 135M SmolLM2 starts inside GRPO's useful band on them (observed, not recorded).
DEFAULT_DIFFICULTY = 1

NAMES = (
    ("Tom", "he"), ("Anna", "she"), ("Omar", "he"), ("Mia", "she"), ("Ravi", "he"), ("Sofia", "she"),
    ("Ben", "he"), ("Yuki", "she"), ("Lucas", "he"), ("Emma", "she"), ("Noah", "he"), ("Zara", "she"),
    ("Leo", "he"), ("Ivy", "she"), ("Sam", "he"), ("Lena", "she"),
)  # fmt: skip
OBJECTS = (
    "apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "balloons", "shells", "stamps",
    "oranges", "toy cars", "eggs", "candies", "flowers", "coins",
)  # fmt: skip

# ---------------------------------------------------------------------------------------------------------------------
# Templates: each takes (rng, a, b, obj) -> (question, solution steps, answer) with small non-negative integers.


def _pick_people(rng: random.Random) -> tuple[tuple[str, str], tuple[str, str]]:
    first, second = rng.sample(NAMES, 2)
    return first, second


def _buy_more(rng, obj):
    (a_name, pron), _ = _pick_people(rng)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    q = f"{a_name} has {a} {obj}. {pron.capitalize()} buys {b} more. How many {obj} does {a_name} have now?"
    return q, [f"{a_name} has {a} + {b} = {a + b} {obj}."], a + b


def _sell(rng, obj):
    (a_name, _), _ = _pick_people(rng)
    a = rng.randint(5, 30)
    b = rng.randint(2, a - 2)
    q = f"{a_name} has {a} {obj} and sells {b} of them. How many {obj} does {a_name} have left?"
    return q, [f"{a_name} has {a} - {b} = {a - b} {obj} left."], a - b


def _give(rng, obj):
    (a_name, _), (b_name, _) = _pick_people(rng)
    a = rng.randint(5, 30)
    b = rng.randint(2, a - 2)
    q = f"{a_name} had {a} {obj} and gave {b} of them to {b_name}. How many {obj} does {a_name} have now?"
    return q, [f"{a_name} has {a} - {b} = {a - b} {obj} now."], a - b


def _compare_more(rng, obj):
    (a_name, _), (b_name, _) = _pick_people(rng)
    a, b = rng.randint(2, 20), rng.randint(2, 15)
    q = f"{a_name} has {a} {obj}. {b_name} has {b} more {obj} than {a_name}. How many {obj} does {b_name} have?"
    return q, [f"{b_name} has {a} + {b} = {a + b} {obj}."], a + b


def _compare_diff(rng, obj):
    (a_name, _), (b_name, _) = _pick_people(rng)
    b = rng.randint(2, 20)
    a = b + rng.randint(2, 15)
    q = f"{a_name} has {a} {obj} and {b_name} has {b} {obj}. How many more {obj} does {a_name} have than {b_name}?"
    return q, [f"{a_name} has {a} - {b} = {a - b} more {obj}."], a - b


def _cost(rng, obj):
    (a_name, _), _ = _pick_people(rng)
    a, p = rng.randint(2, 9), rng.randint(2, 9)
    q = f"{a_name} buys {a} {obj} for {p} dollars each. How many dollars does {a_name} pay?"
    return q, [f"{a_name} pays {a} * {p} = {a * p} dollars."], a * p


def _bags(rng, obj):
    (a_name, _), _ = _pick_people(rng)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    q = f"{a_name} buys {a} bags with {b} {obj} in each bag. How many {obj} does {a_name} buy?"
    return q, [f"{a_name} buys {a} * {b} = {a * b} {obj}."], a * b


def _share(rng, obj):
    (a_name, _), _ = _pick_people(rng)
    each, friends = rng.randint(2, 9), rng.randint(2, 6)
    total = each * friends
    q = f"{a_name} shares {total} {obj} equally among {friends} friends. How many {obj} does each friend get?"
    return q, [f"Each friend gets {total} / {friends} = {each} {obj}."], each


def _buy_then_give(rng, obj):
    (a_name, pron), (b_name, _) = _pick_people(rng)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    c = rng.randint(2, a + b - 2)
    q = (
        f"{a_name} has {a} {obj}. {pron.capitalize()} buys {b} more and then gives {c} to {b_name}. "
        f"How many {obj} does {a_name} have now?"
    )
    steps = [f"After buying, {a_name} has {a} + {b} = {a + b} {obj}.", f"Then {a + b} - {c} = {a + b - c}."]
    return q, steps, a + b - c


def _bags_then_sell(rng, obj):
    (a_name, pron), _ = _pick_people(rng)
    a, b = rng.randint(2, 6), rng.randint(2, 9)
    c = rng.randint(2, a * b - 1)
    q = (
        f"{a_name} buys {a} bags with {b} {obj} in each bag. {pron.capitalize()} sells {c} {obj}. "
        f"How many {obj} does {a_name} have left?"
    )
    steps = [f"{a_name} buys {a} * {b} = {a * b} {obj}.", f"Then {a * b} - {c} = {a * b - c}."]
    return q, steps, a * b - c


def _change(rng, obj):
    (a_name, _), _ = _pick_people(rng)
    a, p = rng.randint(2, 6), rng.randint(2, 9)
    money = a * p + rng.randint(1, 20)
    q = f"{a_name} has {money} dollars and buys {a} {obj} for {p} dollars each. How many dollars are left?"
    steps = [f"The {obj} cost {a} * {p} = {a * p} dollars.", f"Then {money} - {a * p} = {money - a * p}."]
    return q, steps, money - a * p


def _together(rng, obj):
    (a_name, _), (b_name, _) = _pick_people(rng)
    a, b = rng.randint(2, 20), rng.randint(2, 15)
    q = f"{a_name} has {a} {obj}. {b_name} has {b} more {obj} than {a_name}. How many {obj} do they have together?"
    steps = [f"{b_name} has {a} + {b} = {a + b} {obj}.", f"Together {a} + {a + b} = {2 * a + b}."]
    return q, steps, 2 * a + b


def _buy_then_share(rng, obj):
    (a_name, pron), _ = _pick_people(rng)
    friends, each = rng.randint(2, 5), rng.randint(2, 8)
    total = friends * each
    a = rng.randint(1, total - 1)
    b = total - a
    q = (
        f"{a_name} has {a} {obj} and buys {b} more. {pron.capitalize()} shares them equally among {friends} "
        f"friends. How many {obj} does each friend get?"
    )
    steps = [f"{a_name} has {a} + {b} = {total} {obj}.", f"Each friend gets {total} / {friends} = {each}."]
    return q, steps, each


TEMPLATES: dict[int, tuple[Callable, ...]] = {
    1: (_buy_more, _sell, _give, _compare_more, _compare_diff, _cost, _bags, _share),
    2: (_buy_then_give, _bags_then_sell, _change, _together, _buy_then_share),
}


def chat_prompt(
    question: str,
    system_prompt: str | None = SYSTEM_PROMPT,
    examples: Sequence[tuple[str, str]] = FEW_SHOT,
) -> list[dict]:
    """The conversational prompt for `question`: the system message (unless `system_prompt` is None), one
    user/assistant turn per worked example in `examples` (question, answer), then the user's `question`."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    for example_question, example_answer in examples:
        messages.append({"role": "user", "content": example_question})
        messages.append({"role": "assistant", "content": example_answer})
    messages.append({"role": "user", "content": question})
    return messages


def _difficulty_levels(difficulty: int | str) -> tuple[int, ...]:
    if difficulty == "mixed":
        return DIFFICULTIES
    if difficulty in DIFFICULTIES:
        return (int(difficulty),)
    raise ValueError(f"difficulty must be one of {DIFFICULTIES} or 'mixed', got {difficulty!r}")


def word_problems(
    n: int,
    *,
    seed: int | str,
    difficulty: int | str = DEFAULT_DIFFICULTY,
    exclude: set[str] | None = None,
    system_prompt: str | None = SYSTEM_PROMPT,
    examples: Sequence[tuple[str, str]] = FEW_SHOT,
) -> list[dict]:
    """`n` distinct word problems drawn with `seed` (deterministic across runs and platforms).

    Each is ``{"prompt": [chat messages], "question": str, "answer": "23", "solution": "... #### 23",
    "difficulty": 1}`. `difficulty` is 1 (one operation), 2 (two operations) or `"mixed"`` (either, half and
    half on average). Questions in `exclude` are skipped (use it to keep training problems off a held-out set).
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    levels = _difficulty_levels(difficulty)
    rng = random.Random(f"trl-ftis word problems:{seed}")
    exclude = exclude or set()
    seen: set[str] = set()
    problems: list[dict] = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct problems (difficulty {difficulty!r}); ask for fewer")
        level = rng.choice(levels)
        template = rng.choice(TEMPLATES[level])
        obj = rng.choice(OBJECTS)
        question, steps, answer = template(rng, obj)
        if question in seen or question in exclude:
            continue
        seen.add(question)
        answer = str(answer)
        problems.append(
            {
                "prompt": chat_prompt(question, system_prompt, examples),
                "question": question,
                "answer": answer,
                "solution": "\n".join([*steps, f"#### {answer}"]),
                "difficulty": level,
            }
        )
    return problems


def train_test_split_problems(
    n_train: int, n_test: int, seed: int | str = 0, *, difficulty: int | str = DEFAULT_DIFFICULTY, **kwargs
) -> tuple[list[dict], list[dict]]:
    """`(train, test)`: `n_test` held-out problems from the seed stream `"<seed>/test"`, and `n_train`
    training problems from `"<seed>/train"` with every test question excluded, so no question is in both."""
    test = word_problems(n_test, seed=f"{seed}/test", difficulty=difficulty, **kwargs)
    exclude = {p["question"] for p in test} | set(kwargs.pop("exclude", None) or ())
    train = word_problems(n_train, seed=f"{seed}/train", difficulty=difficulty, exclude=exclude, **kwargs)
    return train, test


def word_problem_dataset(problems: Sequence[dict]):
    """`problems` as a `datasets.Dataset` (columns `prompt`, `question`, `answer`, `solution`,
    `difficulty`), ready for `FTISTrainer(train_dataset=...)`: the reward functions receive `answer`."""
    from datasets import Dataset

    return Dataset.from_list(list(problems))


# ---------------------------------------------------------------------------------------------------------------------
# Answer extraction and rewards

_NUMBER_AFTER_MARK = re.compile(r"^[ \t]*\$?[ \t]*(-?\d[\d,]*(?:\.\d+)?)")
_FINAL_LINE = re.compile(r"(?:^|\n)####[ \t]*(-?\d[\d,]*)[ \t]*$")


def _normalise_number(text: str) -> str | None:
    text = text.replace(",", "")
    try:
        if "." in text:
            value = float(text)
            if not value.is_integer():
                return None
            return str(int(value))
        return str(int(text))
    except ValueError:
        return None


def extract_answer(text: str) -> str | None:
    """The integer after the *last* `####` in `text` as a canonical string, else None.

    Commas, a leading `$` and a trailing period are ignored and anything after the number is allowed
    (`"#### $1,234."` -> `"1234"`, `"#### 47 apples"` -> `"47"`, `"#### 47.0"` -> `"47"`); a non-integer
    (`"#### 2.5"`), a missing number (`"#### many"`) or no `####` at all give None.
    """
    if not isinstance(text, str):
        return None
    index = text.rfind("####")
    if index < 0:
        return None
    match = _NUMBER_AFTER_MARK.match(text[index + 4 :])
    if match is None:
        return None
    return _normalise_number(match.group(1))


def has_final_answer_format(text: str) -> bool:
    """True iff `text` contains `####` exactly once, on a last line of the form `#### <integer>`
    (surrounding whitespace allowed, commas allowed in the number; no `$`, units or trailing text)."""
    if not isinstance(text, str) or text.count("####") != 1:
        return False
    return _FINAL_LINE.search(text.strip()) is not None


def completion_text(completion) -> str:
    """The text of a completion: a string, or the content of the last message of a chat completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        return str(last.get("content", "")) if isinstance(last, dict) else str(last)
    return ""


def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 iff [`extract_answer`] of the completion equals the reference `answer` (as an integer), else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        got = extract_answer(completion_text(completion))
        rewards.append(1.0 if got is not None and got == _normalise_number(str(expected).strip()) else 0.0)
    return rewards


def format_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """1.0 iff the completion ends with exactly one `#### <number>` line ([`has_final_answer_format`])."""
    return [1.0 if has_final_answer_format(completion_text(c)) else 0.0 for c in completions]


#: Demo default: correctness plus a small bonus for the answer format (GRPOConfig/FTISConfig `reward_weights`).
DEFAULT_REWARD_FUNCS = (correctness_reward, format_reward)
DEFAULT_REWARD_WEIGHTS = (1.0, 0.2)


def combined_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """`1.0 * correctness + 0.2 * format` in one function (the same as [`DEFAULT_REWARD_FUNCS`] with
    [`DEFAULT_REWARD_WEIGHTS`]): in {0, 0.2, 1.0, 1.2}."""
    correct = correctness_reward(prompts, completions, answer)
    formatted = format_reward(prompts, completions, answer)
    w_correct, w_format = DEFAULT_REWARD_WEIGHTS
    return [w_correct * c + w_format * f for c, f in zip(correct, formatted, strict=True)]


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation


def evaluate_problems(
    model,
    tokenizer,
    problems: Sequence[dict],
    *,
    max_new_tokens: int = 96,
    batch_size: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    num_samples: int = 1,
    seed: int = 0,
    return_texts: bool = False,
) -> dict:
    """Generate for `problems` (chat template, left padding, batches of `batch_size` prompts) and score.

    Greedy by default; with `do_sample=True` draws `num_samples` completions a prompt at `temperature`
    (seeded with `seed`). A completion ends at the tokenizer's or the model's EOS. Returns ``{"accuracy",
    "format_rate", "mean_reward", "mean_tokens", "n"}` over all completions (`mean_reward`` with
    [`combined_reward`]), plus `"texts"` if `return_texts`.
    """
    completions = generate_completions(
        model,
        tokenizer,
        [p["prompt"] for p in problems],
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        do_sample=do_sample,
        temperature=temperature,
        num_samples=num_samples,
        seed=seed,
    )
    texts = [c.text for c in completions]
    lengths = [c.n_tokens for c in completions]
    repeat = num_samples if do_sample else 1
    answers = [p["answer"] for p in problems for _ in range(repeat)]
    correct = correctness_reward(None, texts, answers)
    formatted = format_reward(None, texts, answers)
    rewards = combined_reward(None, texts, answers)
    n = max(len(texts), 1)
    result = {
        "accuracy": sum(correct) / n,
        "format_rate": sum(formatted) / n,
        "mean_reward": sum(rewards) / n,
        "mean_tokens": sum(lengths) / n,
        "n": len(texts),
    }
    if return_texts:
        result["texts"] = texts
    return result


def exact_accuracy(
    model, tokenizer, problems: Sequence[dict], max_new_tokens: int = 96, batch_size: int = 16
) -> float:
    """Greedy accuracy on `problems`: the fraction whose completion's number after the last `####` equals the
    answer (batched left-padded generation with the tokenizer's chat template)."""
    return evaluate_problems(model, tokenizer, problems, max_new_tokens=max_new_tokens, batch_size=batch_size)[
        "accuracy"
    ]
