"""The carry-chain task: hand-computed chains, a disjoint and deterministic held-out split, the reward's parts,
greedy accuracy through the tasks' generation loop, and a supervised warm-up that teaches the format."""

import pytest

from trl_ftis.demo.tiny import ALPHABET, build_char_tokenizer, build_tiny_llama
from trl_ftis.tasks.addition import in_dev_split, in_test_split
from trl_ftis.tasks.carry_chain import (
    CARRY_CHAIN_ALPHABET,
    carry_chain,
    carry_chain_accuracy,
    carry_chain_dataset,
    carry_chain_problems,
    carry_chain_reward,
    carry_chain_warmup,
    final_answer,
    max_chain_tokens,
)


def test_chains_add_digit_by_digit_from_the_right_with_carries():
    assert carry_chain(937, 486) == "7+6=13,3+8+1=12,9+4+1=14;1423"
    assert carry_chain(123, 456) == "3+6=9,2+5=7,1+4=5;579"  # no carry anywhere
    assert carry_chain(105, 905) == "5+5=10,0+0+1=1,1+9=10;1010"  # a carry into a zero column, then none
    assert carry_chain(999, 999) == "9+9=18,9+9+1=19,9+9+1=19;1998"
    assert len(carry_chain(999, 999)) + 1 == max_chain_tokens(3) == 30  # the longest 3-digit chain and EOS
    assert carry_chain(95, 7) == "5+7=12,9+0+1=10;102"  # the shorter number's missing column counts as 0


def test_the_alphabet_extends_the_tiny_tokenizer_and_encodes_a_chain_one_token_a_character():
    assert CARRY_CHAIN_ALPHABET.startswith(ALPHABET) and set(",;") <= set(CARRY_CHAIN_ALPHABET)
    default, tokenizer = build_char_tokenizer(), build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)
    assert {c: tokenizer.convert_tokens_to_ids(c) for c in ALPHABET} == {
        c: default.convert_tokens_to_ids(c) for c in ALPHABET
    }  # every old character keeps its id
    chain = "7+6=13,3+8+1=12,9+4+1=14;1423"
    ids = tokenizer(chain, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(chain) and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == chain


def test_problems_are_deterministic_and_the_split_is_fixed_and_disjoint():
    first = carry_chain_problems(300, seed=7, split="train")
    assert first == carry_chain_problems(300, seed=7, split="train")
    assert first != carry_chain_problems(300, seed=8, split="train")
    test = carry_chain_problems(300, seed=7, split="test")
    assert all(in_test_split(p["prompt"]) for p in test)
    assert not any(in_test_split(p["prompt"]) for p in first)
    assert not {p["prompt"] for p in first} & {p["prompt"] for p in test}
    assert len({p["prompt"] for p in first}) == 300  # distinct
    for problem in first[:50] + test[:50]:
        a, b = map(int, problem["prompt"][:-1].split("+"))
        assert 100 <= a <= 999 and 100 <= b <= 999
        assert problem["answer"] == str(a + b) and problem["chain"] == carry_chain(a, b)
    everything = carry_chain_problems(2000, seed=3)  # no split: about a tenth held out
    assert 0.07 < sum(in_test_split(p["prompt"]) for p in everything) / 2000 < 0.13
    dataset = carry_chain_dataset(5, seed=7, split="test")
    assert dataset.column_names == ["prompt", "answer", "chain"] and list(dataset) == test[:5]
    # The early-stopping split: on the training side, disjoint from the held-out one.
    dev = carry_chain_problems(100, seed=7, split="dev", digits=2)
    assert all(in_dev_split(p["prompt"]) and not in_test_split(p["prompt"]) for p in dev)
    with pytest.raises(ValueError, match="split must be"):
        carry_chain_problems(1, seed=0, split="validation")


def test_reward_counts_the_answer_and_the_steps_right_at_their_position():
    answer, chain = ["1423"], ["7+6=13,3+8+1=12,9+4+1=14;1423"]

    def reward(text):
        return carry_chain_reward([text], answer, chain)[0]

    assert reward("7+6=13,3+8+1=12,9+4+1=14;1423") == pytest.approx(1.5)  # all right
    assert reward("7+6=13,3+8=11,9+4=13;1313") == pytest.approx(0.5 / 3)  # a dropped carry: 1 step of 3
    assert reward("7+6=13,3+8=11,9+4+1=14;1423") == pytest.approx(1.0 + 0.5 * 2 / 3)  # right answer, a wrong step
    assert reward("7+6=13,3+8+1=12,9+4+1=14;1424") == pytest.approx(0.5)  # right chain, wrong answer
    assert reward("1423") == 0.0  # an answer without ';' is not an answer
    assert reward(";1423") == pytest.approx(1.0)
    assert reward("") == 0.0 and reward("3+7=10") == 0.0
    assert final_answer(" 7+6=13;12;1423 ") == "1423"
    chat = [[{"role": "assistant", "content": "7+6=13,3+8+1=12,9+4+1=14;1423"}]]
    assert carry_chain_reward(chat, answer, chain) == [pytest.approx(1.5)]


def test_accuracy_is_greedy_exact_final_answer(scripted_lm):
    tokenizer = build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)
    problems = [{"prompt": "937+486=", "answer": "1423"}, {"prompt": "123+456=", "answer": "579"}]
    replies = {"937+486=": "7+6=13,3+8=11,9+4+1=14;1423", "123+456=": "3+6=9,2+5=7,1+4=5;578"}

    def reply(prompt):
        return tokenizer(replies[prompt], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    model = scripted_lm(tokenizer, reply)
    assert carry_chain_accuracy(model, tokenizer, problems) == 0.5  # a wrong step does not matter, the answer does
    assert carry_chain_accuracy(model, tokenizer, []) == 0.0


def test_warmup_teaches_the_chain_format_in_a_few_steps():
    import re

    from trl_ftis.tasks.generation import generate_completions

    tokenizer = build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)
    model = build_tiny_llama(tokenizer, hidden_size=32, seed=0)
    problems = carry_chain_problems(256, seed=1, split="train", digits=2)
    dev = carry_chain_problems(16, seed=2, split="test", digits=2)
    shape = re.compile(r"\d\+\d(\+1)?=\d+,\d\+\d(\+1)?=\d+;\d+")  # two steps, then the answer

    def well_formed():
        prompts = [p["prompt"] for p in dev]
        completions = generate_completions(model, tokenizer, prompts, max_new_tokens=max_chain_tokens(2),
                                           batch_size=16, stop_ids=[tokenizer.eos_token_id])  # fmt: skip
        return sum(bool(shape.fullmatch(c.text)) for c in completions)

    assert well_formed() == 0  # a random model writes no chain
    taken, accuracy = carry_chain_warmup(
        model, tokenizer, problems, steps=80, batch_size=64, lr=3e-3, target_accuracy=1.0, dev_problems=dev,
        eval_every=40, seed=0,
    )  # fmt: skip
    assert taken == 80 and accuracy is not None and 0.0 <= accuracy <= 1.0  # the target was never reached
    assert well_formed() >= 10  # most chains have the shape (the sums need more steps)
    assert model.training
