"""GSM8K / MATH-500 task: R1 prompt, gold answers, strict and lenient extraction, math-verify rewards, datasets and
greedy evaluation (no download, no real model)."""

import json
import sys
import threading

import pytest
from waits import returns_within  # tests/ is on sys.path

from trl_ftis.demo.tiny import PRINTABLE_ALPHABET, SYSTEM_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama
from trl_ftis.tasks.generation import stop_token_ids
from trl_ftis.tasks.math_problems import (
    MAX_ANSWER_CHARS,
    R1_ZERO_SYSTEM_PROMPT,
    answer_reward,
    answers_match,
    evaluate_math,
    gsm8k_gold_answer,
    lenient_answer,
    load_math_dataset,
    r1_prompt,
    strict_answer,
    strict_reward,
)

pytest.importorskip("math_verify")

THINK = "<think>Natalia sold 48 clips in April and 48 / 2 = 24 in May, so 48 + 24 = 72 in all.</think>"


def test_system_prompt_asks_for_think_and_answer_tags():
    assert R1_ZERO_SYSTEM_PROMPT.startswith("A conversation between User and Assistant.")
    assert "<think> reasoning process here </think> <answer> answer here </answer>" in R1_ZERO_SYSTEM_PROMPT


def test_r1_prompt_is_a_conversation():
    assert r1_prompt("What is 2+2?") == [
        {"role": "system", "content": R1_ZERO_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 2+2?"},
    ]
    for empty in ("", None):
        assert r1_prompt("What is 2+2?", system_prompt=empty) == [{"role": "user", "content": "What is 2+2?"}]


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72"),
        ("... so the total is\n#### 1,234", "1234"),
        ("#### $18", "18"),
        ("#### -3", "-3"),
        ("#### 2.5\n", "2.5"),
    ],
)
def test_gsm8k_gold_answer(text, gold):
    assert gsm8k_gold_answer(text) == gold


@pytest.mark.parametrize("text", ["The answer is 72", "#### ", "#### many"])
def test_gsm8k_gold_answer_without_a_number_names_the_text(text):
    with pytest.raises(ValueError, match="GSM8K answer") as error:
        gsm8k_gold_answer(text)
    assert repr(text)[1:-1].strip() in str(error.value)


# ---------------------------------------------------------------------------------------------------------------------
# Strict format


@pytest.mark.parametrize(
    "completion",
    [
        f"{THINK} <answer>72</answer>",
        f"{THINK}\n<answer>\n72\n</answer>\n",
        f"  \n{THINK}<answer>72</answer>",
        "<think></think><answer>72</answer>",
    ],
)
def test_strict_answer_accepts_the_exact_format(completion):
    assert strict_answer(completion) == "72"
    assert strict_reward([completion], ["72"]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>72</answer>",  # no think block
        "The answer: <think>x</think><answer>72</answer>",  # text before <think>
        f"{THINK} <answer>72</answer> <answer>72</answer>",  # two answer blocks
        f"{THINK} {THINK} <answer>72</answer>",  # two think blocks
        f"{THINK} <answer>72</answer> Hope this helps!",  # text after </answer>
        f"{THINK} So: <answer>72</answer>",  # text between the blocks
        f"<answer>72</answer> {THINK}",  # answer before think
        "<think>x<answer>72</answer></think>",  # answer inside think
        f"{THINK} <answer>72",  # unclosed answer
        "72",
        "",
    ],
)
def test_strict_reward_is_zero_for_a_correct_answer_in_the_wrong_format(completion):
    assert strict_answer(completion) is None
    assert strict_reward([completion], ["72"]) == [0.0]


def test_strict_reward_is_zero_for_a_wrong_answer():
    assert strict_reward([f"{THINK} <answer>71</answer>", f"{THINK} <answer></answer>"], ["72", "72"]) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1,234", "1234"),
        ("1234", "1234"),
        ("$1,234", "1234"),
        ("\\$1,234", "1234"),
        ("-1,234,567", "-1234567"),
        ("\\boxed{1234}", "1234"),
        ("$1234$", "1234"),
        ("1234.0", "1234"),
        ("1234 dollars", "1234"),
        ("\\frac{2468}{2}", "1234"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac12", "0.5"),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{2\\sqrt{2}}", "2\\sqrt{2}"),
    ],
)
def test_answers_verify_across_notations(answer, gold):
    assert answers_match(answer, gold)
    assert strict_reward([f"{THINK} <answer>{answer}</answer>"], [gold]) == [1.0]


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("1,235", "1234"), ("12,34", "1234"), ("2\\sqrt{2}", "2"), ("\\frac{1}{3}", "0.5"), ("72 or 73", "74")],
)
def test_different_answers_do_not_verify(answer, gold):
    assert not answers_match(answer, gold)


def test_conversational_completions_use_the_last_assistant_message():
    good = [{"role": "assistant", "content": f"{THINK} <answer>72</answer>"}]
    bad = [{"role": "assistant", "content": "<answer>72</answer>"}]
    with_tool = [
        {"role": "assistant", "content": f"{THINK} <answer>72</answer>"},
        {"role": "tool", "content": "irrelevant"},
    ]
    parts = [{"role": "assistant", "content": [{"type": "text", "text": f"{THINK} <answer>72</answer>"}]}]
    assert strict_reward([good, bad, with_tool, parts], ["72"] * 4) == [1.0, 0.0, 1.0, 1.0]
    assert answer_reward([good, bad], ["72"] * 2) == [1.0, 1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "x" * 1_000_000,  # huge
        "<think>" * 10_000 + "</answer>" * 10_000,
        f"<think>a</think><answer>{'9' * (MAX_ANSWER_CHARS + 1)}</answer>",
        "<think>a</think><answer>\\frac{{{{{(((]]]\\sqrt</answer>",
        "<think>a</think><answer>\\boxed{</answer>",
        "<think>a</think><answer>\x00\x01\ufffd\u202e</answer>",
        "\\boxed{" * 1000,
        [],
        [{"role": "assistant", "content": None}],
        None,
        12,
    ],
)
def test_garbage_never_raises(completion):
    # a hang guard only (a pattern that backtracks without end on such input would never return)
    assert returns_within(lambda: strict_reward([completion], ["72"]), what="strict_reward") == [0.0]
    assert returns_within(lambda: answer_reward([completion], ["\\frac{1}{2}"]), what="answer_reward") == [0.0]


def test_unparsable_gold_gives_zero_rather_than_raising():
    assert strict_reward([f"{THINK} <answer>72</answer>"], ["\\frac{(}"]) == [0.0]
    assert not answers_match("72", "")


def test_verification_works_outside_the_main_thread():
    # math-verify's signal-based timeout fails outside the main thread: it must run without it there.
    results = []
    thread = threading.Thread(
        target=lambda: results.append(strict_reward([f"{THINK} <answer>1,234</answer>"], ["1234"]))
    )
    thread.start()
    thread.join()
    assert results == [[1.0]]


def test_missing_math_verify_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'trl-ftis\[math\]'"):
        answers_match("72", "72")


# ---------------------------------------------------------------------------------------------------------------------
# Lenient (answer-only)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (f"{THINK} <answer>72</answer> trailing text", "72"),
        ("<answer>70</answer> no wait <answer>72</answer>", "72"),  # the last answer block
        ("<answer> </answer> so \\boxed{72}", "72"),  # an empty block does not count
        ("The total is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{1} then \\boxed{72}", "72"),
        ("She has 3 + 4 = 7 pens, 1,234 in total.", "1,234"),  # the last number
        ("From 3-4 it drops to -5.5", "-5.5"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_lenient_answer(completion, expected):
    assert lenient_answer(completion) == expected


def test_answer_reward_ignores_the_format_but_not_the_answer():
    completions = [
        f"{THINK} <answer>72</answer>",  # strict and right
        "72",  # no tags at all
        "<answer>72</answer> and more text",  # text after the block
        "<answer>71</answer> I think \\boxed{72}",  # the answer block wins over \boxed
        "Natalia sold 48 + 24 = 72 clips. So \\boxed{72}.",
        "Natalia sold 48 + 24 = 72 clips, 7 boxes",  # last number is 7
    ]
    assert answer_reward(completions, ["72"] * len(completions)) == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert strict_reward(completions, ["72"] * len(completions)) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_reward_names_are_what_trl_logs():
    assert strict_reward.__name__ == "strict_reward"
    assert answer_reward.__name__ == "answer_reward"
    # TRL passes prompts, completion ids, dataset columns and logging hooks as keyword arguments.
    rewards = strict_reward(
        prompts=[[{"role": "user", "content": "q"}]],
        completions=[[{"role": "assistant", "content": f"{THINK}<answer>72</answer>"}]],
        completion_ids=[[1, 2]],
        solution=["72"],
        question=["q"],
        log_extra=None,
        trainer_state=None,
    )
    assert rewards == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# Datasets


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


GSM8K_ROWS = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "48+24\n#### 72",
    },
    {"question": "A shop sells 1234 pens. How many?", "answer": "It sells 1,234.\n#### 1,234"},
    {"question": "Weng earns $12 an hour. How much for 50 minutes?", "answer": "12/60*50=10\n#### $10"},
]


def test_load_gsm8k_from_a_local_jsonl(tmp_path):
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    dataset = load_math_dataset("gsm8k", path=path)
    assert dataset.column_names == ["prompt", "solution", "question"]
    assert dataset["solution"] == ["72", "1234", "10"]
    assert dataset["question"] == [row["question"] for row in GSM8K_ROWS]
    assert dataset[0]["prompt"] == r1_prompt(GSM8K_ROWS[0]["question"])

    short = load_math_dataset("gsm8k", path=str(path), limit=2, system_prompt="")
    assert len(short) == 2
    assert short[1]["prompt"] == [{"role": "user", "content": GSM8K_ROWS[1]["question"]}]


def test_load_math500_from_a_local_jsonl(tmp_path):
    rows = [
        {"problem": "Convert $(0,3)$ to polar coordinates.", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)"},
        {"problem": "What is $1+1$?", "answer": "2", "subject": "Algebra", "level": 1},
    ]
    path = tmp_path / "math500.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")  # blank lines are skipped
    dataset = load_math_dataset("math500", path=path)
    assert dataset["solution"] == ["\\left( 3, \\frac{\\pi}{2} \\right)", "2"]
    assert dataset["question"] == [rows[0]["problem"], rows[1]["problem"]]
    assert strict_reward([f"{THINK}<answer>(3, \\frac{{\\pi}}{{2}})</answer>"], dataset["solution"][:1]) == [1.0]


def test_load_errors_name_the_file_the_line_and_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_math_dataset("gsm8k", path=tmp_path / "nowhere.jsonl")

    path = _write_jsonl(tmp_path / "gsm8k.jsonl", [GSM8K_ROWS[0], {"question": "no answer here"}])
    with pytest.raises(ValueError, match=r"gsm8k\.jsonl:2: .*'answer'"):
        load_math_dataset("gsm8k", path=path)

    path = _write_jsonl(tmp_path / "no_mark.jsonl", [{"question": "q", "answer": "the answer is 5"}])
    with pytest.raises(ValueError, match=r"no_mark\.jsonl:1: GSM8K answer has no '#### <number>'"):
        load_math_dataset("gsm8k", path=path)

    path = _write_jsonl(tmp_path / "math.jsonl", [{"question": "q", "answer": "5"}])
    with pytest.raises(ValueError, match=r"math\.jsonl:1: .*'problem'"):
        load_math_dataset("math500", path=path)

    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: not valid JSON"):
        load_math_dataset("gsm8k", path=path)

    with pytest.raises(ValueError, match="kind must be one of"):
        load_math_dataset("aime", path=path)


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation


@pytest.fixture(scope="module")
def text_tokenizer():
    return build_char_tokenizer(SYSTEM_CHAT_TEMPLATE, alphabet=PRINTABLE_ALPHABET)


def scripted_replies(scripted_lm, tokenizer, replies: dict[str, str]):
    """A stand-in LM replying to the first question of `replies` found in the prompt with its text, then EOS."""

    def reply(prompt):
        text = next(text for question, text in replies.items() if question in prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    return scripted_lm(tokenizer, reply)


def test_evaluate_math_scores_greedy_completions(tmp_path, text_tokenizer, scripted_lm):
    questions = {
        "Q-strict": (f"{THINK} <answer>72</answer>", "72"),  # strict and right
        "Q-lenient": ("The answer is \\boxed{1234}.", "1,234"),  # right answer, no format
        "Q-wrong-but-formatted": ("<think>hmm</think><answer>5</answer>", "6"),
        "Q-truncated": ("<think>" + "long " * 50, "7"),  # runs past max_new_tokens
    }
    rows = [{"question": q, "answer": f"... #### {gold}"} for q, (_, gold) in questions.items()]
    dataset = load_math_dataset("gsm8k", path=_write_jsonl(tmp_path / "test.jsonl", rows))
    model = scripted_replies(scripted_lm, text_tokenizer, {q: reply for q, (reply, _) in questions.items()})
    text_tokenizer.padding_side = "right"

    result = evaluate_math(model, text_tokenizer, dataset, batch_size=3, max_new_tokens=120)

    assert text_tokenizer.padding_side == "right" and model.training  # both restored
    assert [len(call) for call in model.calls] == [3, 1]
    assert result["n"] == 4
    assert result["strict_accuracy"] == 0.25
    assert result["answer_accuracy"] == 0.5
    assert result["format_rate"] == 0.5
    assert result["truncated_rate"] == 0.25
    records = result["records"]
    assert [r["question"] for r in records] == list(questions)  # dataset order, whatever the batching
    assert [r["strict_correct"] for r in records] == [True, False, False, False]
    assert [r["answer_correct"] for r in records] == [True, True, False, False]
    assert records[0]["completion"] == questions["Q-strict"][0]
    assert records[0]["completion_tokens"] == len(questions["Q-strict"][0]) + 1  # a character a token, then EOS
    assert records[1]["lenient_answer"] == "1234" and records[1]["strict_answer"] is None
    assert records[3]["truncated"] and records[3]["completion_tokens"] == 120
    assert result["mean_completion_tokens"] == sum(r["completion_tokens"] for r in records) / 4
    assert json.loads(json.dumps(result)) == result  # JSON-ready


def test_evaluate_math_with_a_real_tiny_model(tmp_path, text_tokenizer):
    model = build_tiny_llama(text_tokenizer, hidden_size=32, num_layers=1, max_position_embeddings=1024)
    dataset = load_math_dataset("gsm8k", path=_write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS))
    result = evaluate_math(model, text_tokenizer, dataset, batch_size=2, max_new_tokens=8)
    assert result["n"] == len(result["records"]) == 3
    assert 0.0 <= result["strict_accuracy"] <= result["answer_accuracy"] <= 1.0
    assert all(1 <= r["completion_tokens"] <= 8 for r in result["records"])
    assert result["format_rate"] >= result["strict_accuracy"]


def test_stop_tokens_include_the_chat_templates_end_of_turn(text_tokenizer, scripted_lm):
    # Like Qwen2.5 base: EOS is <|endoftext|>, but the chat template ends a turn with <|im_end|>.
    tokenizer = build_char_tokenizer(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        alphabet=PRINTABLE_ALPHABET,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(tokenizer) == [tokenizer.eos_token_id, im_end]
    model = scripted_lm(tokenizer, reply=None)
    model.generation_config.eos_token_id = [99, tokenizer.eos_token_id]
    assert stop_token_ids(tokenizer, model) == [tokenizer.eos_token_id, 99, im_end]
    # The tiny template ends a turn with EOS itself; a plain-text end of turn adds nothing.
    assert stop_token_ids(text_tokenizer) == [text_tokenizer.eos_token_id]
    assert stop_token_ids(build_char_tokenizer()) == [build_char_tokenizer().eos_token_id]
