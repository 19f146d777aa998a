"""TRL options that change the completion mask, with peers: `mask_truncated_completions` (a truncated completion is
still sent whole; each receiver applies its own option to peer rows) and `pad_to_multiple_of`."""

import pytest
import torch
from tiny_trainers import tiny_trainer  # tests/ is on sys.path

from trl_ftis import PeerRow
from trl_ftis.own_rows import completion_lengths, is_truncated, unmasked_completions

EOS = 2  # the tiny character tokenizer's end of sequence


def test_completion_lengths_find_the_tokens_of_a_row_whose_mask_trl_zeroed():
    ids = torch.tensor([[5, 6, 2, 0], [5, 6, 7, 8], [5, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]])  # row 1: truncated, masked out by TRL
    assert completion_lengths(ids, mask, pad_token_id=0) == [3, 4, 1]
    assert completion_lengths(torch.tensor([[0, 0]]), torch.tensor([[0, 0]]), pad_token_id=0) == [0]
    restored = unmasked_completions({"completion_mask": mask, "other": 1}, [3, 4, 1])
    assert restored["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert restored["other"] == 1 and mask[1].sum() == 0  # a copy: the batch is untouched


def test_trls_truncation_rule():
    assert not is_truncated([5, 2], {2, 0}) and not is_truncated([5, 0], {2, 0})
    assert is_truncated([5, 6], {2, 0}) and is_truncated([], {2, 0})


def sent_rows(tokenizer, make_args, monkeypatch=None, **overrides):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=1, **overrides), hidden_size=32)
    sent = []
    trainer.add_row_listener(sent.extend)
    trainer.train()
    return sent


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded-at-generation", "scored-after"])
def test_a_sender_masking_truncated_completions_sends_them_whole(tokenizer, make_args, monkeypatch, recorded):
    # The same seed samples the same completions with and without the option: the rows sent must be the same,
    # truncated ones included, with their log-probs, whether they were recorded while generating or scored after
    # (as with vLLM, where no recorder runs: scored with the attention TRL's mask took away restored).
    if not recorded:
        monkeypatch.setattr("trl_ftis.trainer.records_raw_logits", lambda config: False)
    plain = sent_rows(tokenizer, make_args)
    masked = sent_rows(tokenizer, make_args, mask_truncated_completions=True)
    truncated = [row for row in masked if row.completion_ids[-1] != EOS]
    assert truncated and all(len(row.completion_ids) == 6 for row in truncated)  # max_completion_length
    assert [row.completion_ids for row in masked] == [row.completion_ids for row in plain]
    for a, b in zip(masked, plain, strict=True):
        assert a.generator_logps == pytest.approx(b.generator_logps, abs=1e-5)
        assert a.reward == b.reward


def peer_group(sender="peer"):
    common = {"prompt": "12+34=", "group": "g", "sender": sender, "extra": {"answer": "46"}}
    return [
        PeerRow(completion_ids=[8, 9, EOS], generator_logps=[-0.5, -1.0, -0.1], reward=1.0, **common),
        PeerRow(completion_ids=[8, 9, 10], generator_logps=[-0.5, -1.0, -0.2], reward=0.0, **common),  # truncated
    ]


@pytest.mark.parametrize("mask", [True, False])
def test_a_receiver_applies_its_own_mask_truncated_completions_to_peer_rows(tokenizer, make_args, mask):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=1, mask_truncated_completions=mask), hidden_size=32)
    trainer.add_peer_rows(peer_group())
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    summary = trainer.summary()
    if mask:  # the truncated row counted in its group's advantages, then dropped: counted, never trained on
        assert entry["ftis/peer_rows"] == 1 and entry["ftis/peer_rows_dropped/truncated"] == 1
        assert summary["dropped"] == {"truncated": 1}
    else:
        assert entry["ftis/peer_rows"] == 2 and "truncated" not in summary["dropped"]


def test_peer_rows_merge_into_batches_padded_to_a_multiple(tokenizer, make_args):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=1, pad_to_multiple_of=8), hidden_size=32)
    trainer.add_peer_rows(peer_group())
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peer_rows"] == 2 and torch.isfinite(torch.tensor(entry["loss"]))


@pytest.mark.parametrize(
    "option",
    [{"top_entropy_quantile": 0.5}, {"mask_truncated_completions": True, "pad_to_multiple_of": 8}],
    ids=["entropy-mask", "truncated-and-padded"],
)
def test_loss_masks_apply_to_merged_peer_rows(tokenizer, make_args, option):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=1, **option), hidden_size=32)
    trainer.add_peer_rows(peer_group())
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peer_rows"] >= 1 and torch.isfinite(torch.tensor([entry["loss"], entry["grad_norm"]])).all()
