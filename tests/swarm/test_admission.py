"""`Admission` without a trainer: received rows in, frozen `AdmittedRow`s out (with their prompt ids), or dropped and
counted by reason in the ledger; rescoring and the last statistics check. The renderer and config are stand-ins
(`row_owners.py`); the tokenizer is the tiny character tokenizer."""

import math

import numpy as np
import pytest
from row_owners import admission, digit_reward  # tests/ is on sys.path
from swarm_helpers import rows

from trl_ftis import PeerRow
from trl_ftis.peer_rows import AdmittedRow, ScoredRow, with_group_statistics
from trl_ftis.swarm.admission import statistics_problem
from trl_ftis.swarm.scoring import RESERVED_REWARD_COLUMNS

CHAT = [{"role": "user", "content": "1+2="}]


def answering(answer, received):
    """The rows with the gold answer `answer` in their columns."""
    for row in received:
        row.extra = {"answer": answer}
    return received


def test_admitted_rows_carry_their_rendered_prompt_and_each_prompt_is_rendered_once(tokenizer):
    gate = admission(tokenizer)
    received = rows("a", 3) + rows("b", 2, prompt=CHAT) + rows("c", 2, prompt="99+1=")
    admitted = gate.admit(received)
    assert all(isinstance(row, AdmittedRow) for row in admitted) and len(admitted) == 7
    assert admitted[0].prompt_ids == tuple(tokenizer("12+34=", add_special_tokens=False)["input_ids"])
    assert admitted[3].prompt_ids == tuple(tokenizer("Q:1+2=A:", add_special_tokens=False)["input_ids"])
    assert admitted[0].prompt_ids is admitted[2].prompt_ids  # one rendering per distinct prompt
    assert gate.render.calls == [["12+34=", "99+1="], [CHAT]]  # plain and chat prompts apart, each once
    assert [row.sender for row in admitted] == ["a"] * 3 + ["b"] * 2 + ["c"] * 2
    assert not gate.ledger.dropped


def test_every_dropped_row_is_counted_by_reason_and_the_received_rows_are_never_changed(tokenizer):
    gate = admission(tokenizer, context_length=10)
    bad_ids = rows("a", 1)[0]
    bad_ids.completion_ids = [8, 10_000, 2]
    bad_logps = rows("a", 1)[0]
    bad_logps.generator_logps = [-0.5, math.nan, -0.5]
    too_long = PeerRow("12+34=", [8] * 7, [-0.1] * 7, 1.0, "g", sender="a")  # max_completion_length is 6
    out_of_context = PeerRow("1234567+1=", [8, 2], [-0.1] * 2, 1.0, "g", sender="a")  # 10 + 2 > 10
    empty = rows("a", 1, prompt="")[0]
    wizard = rows("a", 1, prompt=[{"role": "wizard", "content": "1"}])[0]
    refused = rows("a", 1, prompt="boom")[0]  # the renderer raises for it: the other prompts still render
    columns = rows("a", 1)[0]
    columns.extra = {1: "x"}
    good = rows("a", 1)[0]
    received = [bad_ids, bad_logps, too_long, out_of_context, empty, wizard, refused, columns, good]
    before = [(row.completion_ids, row.generator_logps, row.extra) for row in received]
    (kept,) = gate.admit(received)
    assert kept.sender == "a" and list(kept.completion_ids) == [8, 9, 2]
    assert gate.ledger.dropped == {
        "bad_ids": 1, "bad_logps": 1, "too_long": 2, "empty_prompt": 1, "bad_chat_prompt": 1, "bad_prompt": 1,
        "bad_columns": 1,
    }  # fmt: skip
    assert [(row.completion_ids, row.generator_logps, row.extra) for row in received] == before


def test_reserved_columns_are_removed_and_known_prompts_get_the_training_sets_columns(tokenizer):
    dataset = [{"prompt": "12+34=", "answer": "46"}]

    class Dataset(list):
        column_names = ["prompt", "answer"]

    gate = admission(tokenizer, dataset=Dataset(dataset), require_known_prompts=True)
    hostile = rows("a", 2, prompt="99+1=")
    for row in hostile:
        row.extra = {"prompts": "x", "answer": "100"}
    known = rows("b", 2)
    for row in known:
        row.extra = {"answer": "45"}  # a wrong gold answer sent along with a completion that matches it
    kept = gate.admit(hostile + known, local_columns=True)
    assert [row.sender for row in kept] == ["b", "b"] and [row.extra for row in kept] == [{"answer": "46"}] * 2
    assert gate.ledger.stripped == {"reserved_column": 2} and gate.ledger.dropped == {"unknown_prompt": 2}
    assert gate.ledger.refused == {"unknown_prompt": 2}
    assert hostile[0].extra == {"prompts": "x", "answer": "100"} and known[0].extra == {"answer": "45"}
    # Without local columns a reserved name is still removed, the others kept.
    (plain,) = admission(tokenizer).admit(hostile[:1])
    assert plain.extra == {"answer": "100"} and not RESERVED_REWARD_COLUMNS.intersection(plain.extra)


def test_another_tokenizers_row_is_re_tokenised_with_its_total_log_prob(tokenizer):
    foreign = PeerRow(
        "23+48=", [500, 7], [-0.5, -0.25], 1.0, "g", sender="bpe",
        completion_text="71", ends_with_eos=True, foreign_tokenizer=True,
    )  # fmt: skip
    unknown = PeerRow("23+48=", [1], [-0.5], 1.0, "g", sender="bpe", completion_text="7x", foreign_tokenizer=True)
    assert admission(tokenizer).admit([foreign]) == []  # cross_tokenizer off: dropped
    gate = admission(tokenizer, cross_tokenizer=True)
    (row,) = gate.admit([foreign, unknown])
    assert list(row.completion_ids) == [11, 5, tokenizer.eos_token_id] and row.text_level
    assert list(row.generator_logps) == pytest.approx([-0.25] * 3)  # Σ ℓgen = -0.75 over 3 tokens
    assert gate.ledger.totals["rows_retokenised"] == 1 and gate.ledger.dropped == {"text_round_trip": 1}
    assert foreign.completion_ids == [500, 7] and not foreign.text_level  # the received row is unchanged
    # text_level cannot be forged by a row in this tokenizer's tokens.
    forged = rows("x", 1)[0]
    forged.text_level = True
    assert not admission(tokenizer).admit([forged])[0].text_level


def test_rescoring_makes_new_rows_and_drops_what_no_function_can_score(tokenizer):
    def picky(completions, **kwargs):
        if any(c == "4" for c in completions):
            raise RuntimeError("cannot read '4'")
        return [None] * len(completions)

    gate = admission(tokenizer, reward_funcs=(digit_reward, picky))
    right = answering("45", rows("a", 2, reward=0.0))  # [8, 9, 2] decodes to "45"
    short = answering("45", rows("b", 2, reward=0.0))
    for row in short:
        row.completion_ids, row.generator_logps = [8], [-0.1]  # "4": picky raises for b's group
    admitted = gate.admit(right + short)
    rescored = gate.rescore(admitted)
    assert [row.sender for row in rescored] == ["a", "a"] and [row.reward for row in rescored] == [1.0, 1.0]
    assert rescored[0].rewards_per_func == {"digit_reward": 1.0, "picky": pytest.approx(math.nan, nan_ok=True)}
    assert rescored[0] is not admitted[0] and admitted[0].reward == 0.0  # a new stage, the old one untouched
    assert gate.ledger.dropped == {"reward_error": 2}
    unscorable = admission(tokenizer, reward_funcs=(picky,))
    assert unscorable.rescore(unscorable.admit(answering("45", rows("c", 2)))) == []
    assert unscorable.ledger.dropped == {"unscorable": 2}


def test_the_statistics_guard_drops_what_would_make_the_loss_non_finite(tokenizer):
    gate = admission(tokenizer)
    scored = with_group_statistics(gate.admit(rows("a", 3)), "group")
    assert all(isinstance(row, ScoredRow) for row in scored) and scored[0].group_max_length == 3
    huge = scored[0].with_statistics(1e8, 3)
    nan = scored[1].with_statistics(math.nan, 3)
    assert gate.guard_statistics([huge, nan, scored[2]]) == [scored[2]]
    assert gate.ledger.dropped == {"advantage_too_large": 1, "nonfinite": 1}
    assert statistics_problem(scored[2]) is None


def test_restored_rows_get_their_prompts_rendered_again_and_keep_text_level(tokenizer):
    gate = admission(tokenizer)
    saved = [row.to_peer_row() for row in gate.admit(rows("a", 2))]
    saved[0].text_level = True  # as a re-tokenised row comes back from a checkpoint
    saved[1].extra = None
    back = gate.restore(saved + rows("a", 1, prompt="boom"))
    assert [row.text_level for row in back] == [True, False] and back[1].extra == {}
    assert back[0].prompt_ids == tuple(tokenizer("12+34=", add_special_tokens=False)["input_ids"])
    assert gate.ledger.dropped == {"bad_prompt": 1}


def test_restored_rows_are_checked_as_received_rows_are_a_checkpoint_is_untrusted(tokenizer):
    gate = admission(tokenizer, context_length=64)
    saved = [row.to_peer_row() for row in gate.admit(rows("a", 5))]
    saved[0].completion_ids = [10**9, 1, 2]  # an id outside the vocabulary, edited into the file
    saved[1].generator_logps = [0.5, -1.0, -0.25]  # a positive log-prob
    saved[2].completion_ids, saved[2].generator_logps = [1] * 7, [-0.5] * 7  # longer than max_completion_length
    saved[3].extra = {"answer": "46", "prompts": ["smuggled"]}  # a column named like a reward-function argument
    back = gate.restore(saved)
    assert gate.ledger.dropped == {"bad_ids": 1, "bad_logps": 1, "too_long": 1}
    assert len(back) == 2 and all("prompts" not in row.extra for row in back)
    assert gate.ledger.stripped == {"reserved_column": 1}


def test_admitted_rows_are_frozen(tokenizer):
    (row,) = admission(tokenizer).admit(rows("a", 1))
    with pytest.raises(AttributeError):
        row.reward = 5.0
    assert isinstance(np.asarray(row.prompt_ids), np.ndarray)
