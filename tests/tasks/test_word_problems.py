"""Word-problem task: generation, splits, answer extraction, rewards, evaluation (no real model needed)."""

import re

import pytest

from trl_ftis.tasks.word_problems import (
    DEFAULT_REWARD_FUNCS,
    DEFAULT_REWARD_WEIGHTS,
    FEW_SHOT,
    SYSTEM_PROMPT,
    chat_prompt,
    combined_reward,
    correctness_reward,
    evaluate_problems,
    exact_accuracy,
    extract_answer,
    format_reward,
    train_test_split_problems,
    word_problem_dataset,
    word_problems,
)


@pytest.mark.parametrize("difficulty", [1, 2, "mixed"])
def test_generation_is_deterministic_distinct_and_well_formed(difficulty):
    problems = word_problems(300, seed=7, difficulty=difficulty)
    assert problems == word_problems(300, seed=7, difficulty=difficulty)
    assert problems != word_problems(300, seed=8, difficulty=difficulty)
    questions = [p["question"] for p in problems]
    assert len(set(questions)) == len(questions) == 300
    for p in problems:
        assert set(p) >= {"prompt", "question", "answer", "solution"}
        assert re.fullmatch(r"\d+", p["answer"]), p  # non-negative integers
        assert p["solution"].endswith(f"\n#### {p['answer']}")
        assert extract_answer(p["solution"]) == p["answer"]
        assert format_reward(None, [p["solution"]]) == [1.0]
        assert p["prompt"][-1] == {"role": "user", "content": p["question"]}
        assert p["question"].endswith("?")
    levels = {p["difficulty"] for p in problems}
    assert levels == ({1, 2} if difficulty == "mixed" else {difficulty})


def test_problems_are_varied():
    problems = word_problems(200, seed=0, difficulty="mixed")
    first_words = {p["question"].split()[0] for p in problems}
    assert len(first_words) >= 10  # many names
    stems = {re.sub(r"\d+", "N", p["question"]) for p in problems}
    assert len(stems) >= 100
    assert len({int(p["answer"]) for p in problems}) >= 20
    assert max(len(p["question"]) for p in problems) < 220  # short prompts: CPU generation stays cheap


def test_two_step_solutions_have_two_steps():
    for p in word_problems(50, seed=1, difficulty=2):
        assert len(p["solution"].splitlines()) == 3


def test_train_test_split_is_disjoint_and_deterministic():
    train, test = train_test_split_problems(2000, 200, seed=3)
    assert len(train) == 2000 and len(test) == 200
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    assert (train, test) == train_test_split_problems(2000, 200, seed=3)
    other_train, other_test = train_test_split_problems(2000, 200, seed=4)
    assert other_test != test
    # a larger training set from the same seed keeps the same held-out set
    assert train_test_split_problems(3000, 200, seed=3)[1] == test


def test_exclude_skips_questions():
    held_out = word_problems(100, seed="x")
    train = word_problems(500, seed="y", exclude={p["question"] for p in held_out})
    assert not {p["question"] for p in train} & {p["question"] for p in held_out}


def test_bad_difficulty():
    with pytest.raises(ValueError, match="difficulty"):
        word_problems(3, seed=0, difficulty=3)


def test_chat_prompt_structure():
    messages = chat_prompt("Tom has 3 apples. How many?")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT
    assert "#### <number>" in SYSTEM_PROMPT and len(SYSTEM_PROMPT) < 200
    # the worked example is itself a correct, well-formatted answer
    ((example_question, example_answer),) = FEW_SHOT
    assert messages[1:3] == [{"role": "user", "content": example_question},
                             {"role": "assistant", "content": example_answer}]  # fmt: skip
    assert format_reward(None, [example_answer]) == [1.0] and extract_answer(example_answer) == "7"
    assert messages[-1] == {"role": "user", "content": "Tom has 3 apples. How many?"}
    assert chat_prompt("Q?", system_prompt=None, examples=()) == [{"role": "user", "content": "Q?"}]
    assert [m["role"] for m in chat_prompt("Q?", examples=())] == ["system", "user"]
    p = word_problems(1, seed=0)[0]
    assert p["prompt"] == chat_prompt(p["question"])
    custom = word_problems(1, seed=0, system_prompt=None, examples=())[0]
    assert custom["prompt"] == [{"role": "user", "content": custom["question"]}]
    # the example never appears as a problem
    assert example_question not in {q["question"] for q in word_problems(2000, seed=0, difficulty="mixed")}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("12 + 35 = 47\n#### 47", "47"),
        ("#### 47", "47"),
        ("so the answer is\n####47", "47"),
        ("12 + 35 = 50\n#### 50", "50"),  # extracted; wrong answers are the reward's business
        ("The answer is 47.", None),  # no ####
        ("", None),
        ("#### ", None),
        ("#### many", None),
        ("#### 12\nwait, no\n#### 47", "47"),  # the last one counts
        ("#### 47\n#### 12", "12"),
        ("#### 1,234", "1234"),
        ("#### $1,234.", "1234"),
        ("#### $ 47", "47"),
        ("#### 47.", "47"),
        ("#### 47.0", "47"),
        ("#### 2.5", None),
        ("#### 47 apples", "47"),
        ("#### 47\nI hope this helps!", "47"),
        ("#### -5", "-5"),
        ("#### 007", "7"),
        ("##### 47", "47"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_non_string():
    assert extract_answer(None) is None


COMPLETIONS = [
    "Mia has 14 + 9 = 23 marbles.\n#### 23",  # correct, formatted
    "Mia has 14 + 9 = 23 marbles.\n#### 23\n",  # trailing newline is fine
    "Mia has 14 + 9 = 24 marbles.\n#### 24",  # wrong, formatted
    "Mia has 14 + 9 = 23 marbles. The answer is 23.",  # no ####
    "#### 23\nThat is because 14 + 9 = 23.",  # correct, text after: not formatted
    "#### 20\nNo wait.\n#### 23",  # correct (last), two #### lines: not formatted
    "Mia has 23 marbles.\n#### $23.",  # correct, decorated: not formatted
    "Mia has 1,023 marbles.\n#### 1,023",  # formatted (commas allowed), wrong here
]


@pytest.mark.parametrize("as_chat", [False, True])
def test_rewards_on_realistic_completions(as_chat):
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS] if as_chat else COMPLETIONS
    prompts = [chat_prompt("Mia has 14 marbles. She buys 9 more. How many marbles does Mia have now?")] * len(
        COMPLETIONS
    )
    answer = ["23"] * len(COMPLETIONS)
    assert correctness_reward(prompts, completions, answer) == [1, 1, 0, 0, 1, 1, 1, 0]
    assert format_reward(prompts, completions, answer) == [1, 1, 1, 0, 0, 0, 0, 1]
    combined = combined_reward(prompts, completions, answer)
    assert combined == pytest.approx([1.2, 1.2, 0.2, 0.0, 1.0, 1.0, 1.0, 0.2])
    per_function = [f(prompts, completions, answer) for f in DEFAULT_REWARD_FUNCS]
    weighted = [
        sum(w * r[i] for w, r in zip(DEFAULT_REWARD_WEIGHTS, per_function, strict=True))
        for i in range(len(COMPLETIONS))
    ]
    assert weighted == pytest.approx(combined)


def test_correctness_reward_takes_kwargs_and_normalises_answers():
    assert correctness_reward(None, ["#### 1,234"], ["1234"], question=["?"], trainer_state=None) == [1.0]
    assert correctness_reward(None, ["#### 47"], [47]) == [1.0]
    with pytest.raises(ValueError):
        correctness_reward(None, ["#### 47", "#### 1"], ["47"])


def test_dataset_columns():
    dataset = word_problem_dataset(word_problems(5, seed=0))
    assert set(dataset.column_names) >= {"prompt", "question", "answer", "solution"}
    assert dataset[0]["prompt"][0]["role"] == "system"


def test_evaluate_with_a_tiny_model():
    """The evaluator runs end to end (batched, left padding, greedy and sampled) on a tiny local model."""
    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()  # our own: this test changes its padding side
    model = build_tiny_llama(tokenizer, seed=0)
    problems = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)} for a in range(10, 15)]
    tokenizer.padding_side = "right"
    accuracy = exact_accuracy(model, tokenizer, problems, max_new_tokens=4, batch_size=2)
    assert tokenizer.padding_side == "right"  # restored
    assert accuracy == 0.0  # untrained, and the character tokenizer cannot even write "####"
    result = evaluate_problems(
        model, tokenizer, problems, max_new_tokens=4, batch_size=3, do_sample=True, num_samples=2, return_texts=True
    )
    assert result["n"] == 10 and len(result["texts"]) == 10
    assert 1 <= result["mean_tokens"] <= 4
    assert model.training  # restored (a fresh model is in training mode)
