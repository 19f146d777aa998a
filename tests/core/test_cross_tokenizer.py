"""Peers with different tokenizers (`cross_tokenizer`): the text-level weight and statistic, re-tokenisation of a
peer's text (kept or dropped and counted), the swarm's acceptance rules, and a learner trained on a BPE model's
rows."""

import logging
import math
import uuid

import numpy as np
import pytest
import torch
from swarm_helpers import make_swarm, rows  # tests/ is on sys.path
from tiny_trainers import tiny_trainer

from trl_ftis import PeerRow
from trl_ftis.demo.tiny import build_bpe_tokenizer, build_tiny_causal_lm
from trl_ftis.exchange import tokenizer_fingerprint
from trl_ftis.peer_rows import AdmittedRow
from trl_ftis.objective import (
    ftis_terms,
    sequence_filter_statistic,
    text_log_ratio,
    text_truncated_weights,
)


@pytest.fixture(scope="module")
def bpe():
    return build_bpe_tokenizer()


def k3(log_r):
    return math.exp(log_r) - log_r - 1


# --------------------------------------------------------------------------------------------------------------------
# The objective: one weight per text, the sequence statistic per token of the receiver
# --------------------------------------------------------------------------------------------------------------------
LEARNER = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, -9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# The sender's totals, -2.0 over 3 receiver tokens and -0.9 over 2, spread evenly (what re-tokenisation does).
SPREAD = torch.tensor([[-2.0 / 3] * 3, [-0.45, -0.45, 0.0]])


def test_text_weight_is_the_capped_ratio_of_the_two_models_probabilities_of_the_text():
    # Row 0: Σℓθ = -3.5, Σℓgen = -2.0 -> exp(-1.5). Row 1: Σℓθ = -0.3, Σℓgen = -0.9 -> exp(0.6) = 1.822 (< C = 2).
    assert text_log_ratio(LEARNER, SPREAD, MASK).tolist() == pytest.approx([-1.5, 0.6])
    weights = text_truncated_weights(LEARNER, SPREAD, MASK, is_cap=2.0)
    assert weights[0].tolist() == pytest.approx([math.exp(-1.5)] * 3)
    assert weights[1].tolist() == pytest.approx([math.exp(0.6), math.exp(0.6), 0.0])  # 0 on padding
    capped = text_truncated_weights(LEARNER, SPREAD, MASK, is_cap=1.5)
    assert capped[1, :2].tolist() == pytest.approx([1.5, 1.5])
    # A per-token mean would give exp(-0.5) and exp(0.3): the text weight is the sum's, as specified.
    assert weights[0, 0].item() != pytest.approx(math.exp(-0.5))


def test_text_rows_get_the_text_weight_and_the_sequence_statistic_next_to_token_rows():
    advantages = torch.tensor([-1.0, -1.0])
    text = torch.tensor([False, True])
    terms = ftis_terms(
        LEARNER, None, SPREAD, advantages, MASK, kl_threshold=0.035, kl_reduction="mean", text_level=text
    )
    # Row 0 is token-level: min(exp(ℓθ - ℓgen), 2) per token, its statistic the mean of per-token k3.
    token_log_ratio = (LEARNER[0] - SPREAD[0]).tolist()
    assert terms.weights[0].tolist() == pytest.approx([min(math.exp(x), 2.0) for x in token_log_ratio])
    assert terms.filter_statistic[0].item() == pytest.approx(sum(k3(-x) for x in token_log_ratio) / 3)
    # Row 1 is text-level: min(exp(0.6), 2) on each token; statistic k3 of the per-token mean log-ratio 0.3.
    assert terms.weights[1, :2].tolist() == pytest.approx([math.exp(0.6)] * 2)
    assert terms.filter_statistic[1].item() == pytest.approx(k3(-0.3))
    assert terms.filter_statistic[1].item() == pytest.approx(sequence_filter_statistic(LEARNER, SPREAD, MASK)[1])
    # k3(-0.3) = 0.0408 > g = 0.035 with a negative advantage: filtered; row 0's statistic is far above g too.
    assert terms.keep.tolist() == [False, False]
    assert terms.token_advantages[1].tolist() == [0.0, 0.0, 0.0]
    kept = ftis_terms(
        LEARNER, None, SPREAD, -advantages, MASK, kl_threshold=0.035, kl_reduction="mean", text_level=text
    )
    assert kept.token_advantages[1, :2].tolist() == pytest.approx([math.exp(0.6)] * 2)  # w · Â, Â = +1
    assert not kept.capped[1].any()
    capped = ftis_terms(LEARNER, None, SPREAD, advantages, MASK, is_cap=1.5, kl_reduction="mean", text_level=text)
    assert capped.capped[1].tolist() == [True, True, False]


def test_without_text_rows_the_terms_are_unchanged():
    advantages = torch.tensor([1.0, -0.5])
    plain = ftis_terms(LEARNER, None, SPREAD, advantages, MASK, kl_reduction="sum")
    unmarked = torch.tensor([False, False])
    none_marked = ftis_terms(LEARNER, None, SPREAD, advantages, MASK, kl_reduction="sum", text_level=unmarked)
    for name in ("token_advantages", "weights", "filter_statistic", "keep"):
        assert torch.equal(getattr(plain, name), getattr(none_marked, name))


# --------------------------------------------------------------------------------------------------------------------
# Re-tokenisation: a BPE peer's row becomes a character-level row, or is dropped and counted
# --------------------------------------------------------------------------------------------------------------------
def bpe_row(bpe, text="71", *, logps=None, ends_with_eos=True, **overrides):
    """A row as a peer with the BPE tokenizer sends it: its ids and log-probs, and its text."""
    ids = bpe(text, add_special_tokens=False)["input_ids"] + ([bpe.eos_token_id] if ends_with_eos else [])
    settings = {
        "prompt": "23+48=",
        "completion_ids": ids,
        "generator_logps": logps if logps is not None else [-0.5] * len(ids),
        "reward": 1.0,
        "group": "g",
        "sender": "bpe-peer",
        "completion_text": text,
        "ends_with_eos": ends_with_eos,
        "foreign_tokenizer": True,
    }
    settings.update(overrides)
    return PeerRow(**settings)


def test_a_bpe_peers_row_becomes_character_tokens_carrying_the_senders_total_logp(tokenizer, bpe, make_args):
    trainer = tiny_trainer(tokenizer, make_args(cross_tokenizer=True))
    row = bpe_row(bpe, "71", logps=[-0.5, -0.25])  # BPE: "71" is one token, then <eos>
    assert len(row.completion_ids) == 2
    assert trainer.add_peer_rows([row]) == 1
    (queued,) = trainer._inbox.rows
    expected = tokenizer("71", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert list(queued.completion_ids) == expected  # 3 character tokens
    assert list(queued.generator_logps) == pytest.approx([-0.25] * 3)  # Σ ℓgen = -0.75, spread evenly
    assert queued.text_level and isinstance(queued, AdmittedRow)  # in this tokenizer's tokens now
    assert trainer.summary()["rows_retokenised"] == 1


def test_a_text_without_eos_gets_none_and_an_empty_text_with_eos_is_just_eos(tokenizer, bpe, make_args):
    trainer = tiny_trainer(tokenizer, make_args(cross_tokenizer=True))
    assert trainer.add_peer_rows([bpe_row(bpe, "7", ends_with_eos=False), bpe_row(bpe, "", logps=[-1.0])]) == 2
    no_eos, only_eos = trainer._inbox.rows
    assert list(no_eos.completion_ids) == tokenizer("7", add_special_tokens=False)["input_ids"]
    assert list(only_eos.completion_ids) == [tokenizer.eos_token_id]


def test_texts_this_tokenizer_cannot_carry_are_dropped_and_counted(tokenizer, bpe, make_args, caplog):
    trainer = tiny_trainer(tokenizer, make_args(cross_tokenizer=True))
    unknown = bpe_row(bpe, "71", completion_text="7x")  # 'x' is not in the character alphabet: <unk>
    special = bpe_row(bpe, "71", completion_text="7<eos>1")  # read as this tokenizer's end of sequence
    missing = bpe_row(bpe, "71", completion_text=None)
    empty = bpe_row(bpe, "71", completion_text="", ends_with_eos=False)
    bad_logps = bpe_row(bpe, "71", logps=[0.5, -0.1])
    with caplog.at_level(logging.WARNING, logger="trl_ftis"):
        kept = trainer.add_peer_rows([unknown, special, missing, empty, bad_logps, bpe_row(bpe, "71")])
    assert kept == 1
    assert dict(trainer._ledger.dropped) == {
        "text_round_trip": 1,
        "text_special_tokens": 1,
        "no_text": 2,
        "bad_logps": 1,
    }
    assert "re-tokenisation" in caplog.text and "bpe-peer" in caplog.text


def test_hostile_texts_are_dropped_not_trained_on(tokenizer, bpe, make_args):
    """A text far longer than max_completion_length once re-tokenised, a text that is not a string, an empty text
    without end of sequence, a flood of them: each row dropped and counted, none raises."""
    trainer = tiny_trainer(tokenizer, make_args(cross_tokenizer=True))  # max_completion_length 6
    long = bpe_row(bpe, "71", completion_text="7" * 5000)
    not_text = bpe_row(bpe, "71", completion_text=12345)
    negative_ids = bpe_row(bpe, "71")
    negative_ids.completion_ids = [-3, 9]
    flood = [bpe_row(bpe, "71", completion_text="1" * 40) for _ in range(200)]
    assert trainer.add_peer_rows([long, not_text, negative_ids, *flood]) == 0
    assert dict(trainer._ledger.dropped) == {"too_long": 201, "no_text": 1, "bad_ids": 1}
    assert trainer.summary()["rows_retokenised"] == 0  # too long from their length alone: never tokenised


def test_admission_drops_foreign_rows_when_cross_tokenizer_is_off(tokenizer, bpe, make_args):
    trainer = tiny_trainer(tokenizer, make_args())
    own = PeerRow("23+48=", [11, 5, 2], [-0.1, -0.1, -0.1], 1.0, "g", sender="same")
    (admitted,) = trainer._admission.admit([bpe_row(bpe), own])  # add_peer_rows raises first; the admission drops
    assert list(admitted.completion_ids) == [11, 5, 2] and admitted.sender == "same"
    assert dict(trainer._ledger.dropped) == {"foreign_tokenizer": 1}


def test_foreign_rows_need_cross_tokenizer_and_text_level_cannot_be_forged(tokenizer, bpe, make_args):
    trainer = tiny_trainer(tokenizer, make_args())
    with pytest.raises(ValueError, match="cross_tokenizer"):
        trainer.add_peer_rows([bpe_row(bpe)])
    # Marked text-level by the caller, in this tokenizer's tokens: trained on as the token-level row it is.
    forged = PeerRow("23+48=", [11, 5, 2], [-0.1, -0.1, -0.1], 1.0, "g", sender="x", text_level=True)
    assert trainer.add_peer_rows([forged]) == 1 and not trainer._inbox.rows[0].text_level


def test_text_level_peer_rows_needs_cross_tokenizer(make_args):
    with pytest.raises(ValueError, match="text_level_peer_rows=True needs cross_tokenizer=True"):
        make_args(text_level_peer_rows=True)


def test_own_rows_carry_their_text_and_eos_flag_when_cross_tokenizer_is_on(tokenizer, make_args):
    trainer = tiny_trainer(tokenizer, make_args(cross_tokenizer=True, max_steps=1))
    published = []
    trainer.add_row_listener(published.append)
    trainer.train()
    (own,) = published
    for row in own:
        ids = list(row.completion_ids)
        ends = ids[-1] == tokenizer.eos_token_id
        assert row.ends_with_eos == ends
        assert row.completion_text == tokenizer.decode(ids[:-1] if ends else ids)
    plain = tiny_trainer(tokenizer, make_args(max_steps=1))
    plain_rows = []
    plain.add_row_listener(plain_rows.append)
    plain.train()
    assert all(row.completion_text is None for row in plain_rows[0])  # no text unless asked for


# --------------------------------------------------------------------------------------------------------------------
# Training: the logged weight is min(exp(Σ ℓθ - Σ ℓgen), C) of the re-tokenised text
# --------------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def text_logp(model, tokenizer, prompt, ids):
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([prompt_ids + list(ids)])
    logits = model(input_ids=input_ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids).unsqueeze(-1)).sum().item()


def test_a_bpe_models_rows_reach_the_loss_with_the_text_weight(tokenizer, bpe, make_args):
    """A character-level Llama learns from rows a BPE-tokenised Qwen2 sampled: the logged weight of each row is the
    capped ratio of the two models' probabilities of the same text."""
    sender = build_tiny_causal_lm(bpe, "qwen2", hidden_size=32, seed=3)
    prompt, texts = "23+48=", ["71", "7", "70", "171"]
    rows_in = []
    for text in texts:
        ids = bpe(text, add_special_tokens=False)["input_ids"] + [bpe.eos_token_id]
        per_token = text_logp(sender, bpe, prompt, ids) / len(ids)
        rows_in.append(bpe_row(bpe, text, logps=[per_token] * len(ids), reward=float(text == "71")))
    args = make_args(cross_tokenizer=True, max_steps=1, learning_rate=0.0, is_cap=1e6)
    trainer = tiny_trainer(tokenizer, args)
    assert trainer.add_peer_rows(rows_in) == 4
    expected = []
    for text, row in zip(texts, rows_in, strict=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        learner = text_logp(trainer.model, tokenizer, prompt, ids)
        weight = math.exp(learner - float(np.sum(row.generator_logps)))
        expected.append((weight, len(ids)))
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peer_rows"] == 4
    # The metric is the token-weighted mean of the weights: each text row has one weight on its tokens.
    mean = sum(w * n for w, n in expected) / sum(n for _, n in expected)
    assert entry["ftis/peers/bpe-peer/is_weight_mean"] == pytest.approx(mean, rel=1e-4)
    assert entry["ftis/peers/bpe-peer/is_weight_max"] == pytest.approx(max(w for w, _ in expected), rel=1e-4)


# --------------------------------------------------------------------------------------------------------------------
# The swarm: who is accepted, who is refused
# --------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def url():
    return f"memory://cross-{uuid.uuid4().hex}"


def texts(row_list, text="71"):
    for row in row_list:
        row.completion_text, row.ends_with_eos = text, True
    return row_list


def test_a_peer_with_another_tokenizer_is_accepted_only_with_cross_tokenizer_and_text(tokenizer, bpe, url):
    other = {"tokenizer_fingerprint": tokenizer_fingerprint(bpe), "tokenizer_name": "bpe"}
    receiver = make_swarm(url, "a", tokenizer, cross_tokenizer=True)
    strict = make_swarm(url, "strict", tokenizer)
    with_text = make_swarm(url, "texts", bpe, vocab_limit=len(bpe), cross_tokenizer=True, **other)
    without_text = make_swarm(url, "ids-only", bpe, vocab_limit=len(bpe), **other)
    with_text.publish(texts(rows("texts")), 0)
    without_text.publish(rows("ids-only"), 0)
    got = receiver.collect(0)
    assert {row.sender for row in got.rows} == {"texts"}
    assert all(row.foreign_tokenizer and row.completion_text == "71" and row.ends_with_eos for row in got.rows)
    assert got.refused["tokenizer"] == 1  # ids only: nothing to re-tokenise
    refused = strict.collect(0)
    assert refused.rows == [] and refused.refused["tokenizer"] == 2


def test_with_cross_tokenizer_a_same_tokenizer_peers_ids_are_still_checked(tokenizer, url):
    receiver = make_swarm(url, "a", tokenizer, cross_tokenizer=True)
    same = make_swarm(url, "same", tokenizer, vocab_limit=10_000)
    fine = make_swarm(url, "fine", tokenizer)
    bad = rows("same")
    for row in bad:
        row.completion_ids = [8, 5000, 2]
    same.publish(bad, 0)
    fine.publish(rows("fine"), 0)
    got = receiver.collect(0)
    assert {row.sender for row in got.rows} == {"fine"}
    assert not any(row.foreign_tokenizer for row in got.rows)
    assert got.refused["ids"] == 1
