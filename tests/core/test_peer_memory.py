"""Memory: peer rows do not enlarge what one forward and backward hold (a micro-batch they made larger is computed in
row chunks with the same gradient), and `add_peer_rows` queues a bounded number of rows, merged a step's cap at a
time."""

import pytest
import torch
from tiny_trainers import tiny_trainer, without_control_tokens  # tests/ is on sys.path

from trl_ftis import FTISConfig, PeerRow
from trl_ftis.micro_batches import chunk_weights, split_rows


def test_split_rows_cuts_every_per_row_value_and_shares_the_rest():
    inputs = {
        "completion_ids": torch.arange(10).view(5, 2),
        "completion_mask": torch.ones(5, 2),
        "advantages": torch.arange(5.0),
        "num_items_in_batch": torch.tensor(7.0),
        "ratio": torch.ones(5, 1),
    }
    chunks = split_rows(inputs, 2)
    assert [chunk["advantages"].tolist() for chunk in chunks] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert all(chunk["num_items_in_batch"] is inputs["num_items_in_batch"] for chunk in chunks)
    assert chunks[2]["completion_ids"].tolist() == [[8, 9]] and chunks[1]["ratio"].shape == (2, 1)


def test_chunk_weights_make_the_weighted_sum_the_whole_loss():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    chunks = split_rows({"completion_ids": torch.zeros(3, 3), "completion_mask": mask}, 2)
    assert chunk_weights("grpo", chunks) == pytest.approx([2 / 3, 1 / 3])  # rows
    assert chunk_weights("dr_grpo", chunks) == pytest.approx([2 / 3, 1 / 3])
    assert chunk_weights("bnpo", chunks) == pytest.approx([4 / 6, 2 / 6])  # tokens
    assert chunk_weights("dapo", chunks) == [1.0, 1.0]  # already divided by the generation batch's tokens
    # bnpo by hand: per-token losses 1..6 on the 6 tokens; the whole micro-batch's mean is 21 / 6.
    losses = torch.tensor([[1.0, 2, 3], [4, 0, 0], [5, 6, 0]])
    parts = [(losses[:2] * mask[:2]).sum() / mask[:2].sum(), (losses[2:] * mask[2:]).sum() / mask[2:].sum()]
    weights = chunk_weights("bnpo", chunks)
    assert float(parts[0] * weights[0] + parts[1] * weights[1]) == pytest.approx(21 / 6)


def peer_rows(tokenizer, count=16):
    rows = [
        PeerRow(prompt=f"{10 + k % 4}+{20 + k % 4}=", completion_ids=[4 + k % 10, 5 + k % 7, tokenizer.eos_token_id],
                generator_logps=[-1.0, -1.5, -0.5], reward=float(k % 3), group=f"g{k % 4}", sender="peer",
                extra={"answer": str(30 + 2 * (k % 4))})
        for k in range(count)
    ]  # fmt: skip
    return without_control_tokens(rows, tokenizer)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_a_micro_batch_enlarged_by_peers_gets_the_same_update_in_chunks(tokenizer, make_args, loss_type):
    trained, sizes, logged = [], [], []
    for chunk in (0, None):  # 0: the whole micro-batch at once; None: chunks of per_device_train_batch_size
        args = make_args(max_steps=1, loss_type=loss_type, peer_micro_batch_size=chunk)
        trainer = tiny_trainer(tokenizer, args, hidden_size=32)
        seen = []

        def chunk_loss(model, inputs, seen=seen, compute=trainer._chunk_loss):
            seen.append(inputs["completion_ids"].shape[0])
            return compute(model, inputs)

        trainer._chunk_loss = chunk_loss
        assert trainer.add_peer_rows(peer_rows(tokenizer)) == 16
        trainer.train()
        trained.append({name: p.detach().clone() for name, p in trainer.model.named_parameters()})
        sizes.append(seen)
        (entry,) = [e for e in trainer.state.log_history if "loss" in e]
        logged.append({key: value for key, value in entry.items() if key.startswith(("ftis/own/", "ftis/peer"))})
    assert sizes == [[32], [16, 16]]  # 16 own rows + 16 peer rows; per_device_train_batch_size 16
    # The F-TIS statistics are the micro-batch's, logged once, whatever the chunks.
    assert logged[1].keys() == logged[0].keys() and "ftis/peer/is_weight_mean" in logged[0]
    assert logged[1] == pytest.approx(logged[0], rel=1e-5, abs=1e-6)
    for name, whole in trained[0].items():
        torch.testing.assert_close(trained[1][name], whole, atol=2e-6, rtol=1e-5, msg=name)
    assert any(not torch.equal(whole, start) for whole, start in zip(trained[0].values(), _start(tokenizer)))


def _start(tokenizer):
    from trl_ftis.demo.tiny import build_tiny_llama

    return [p.detach() for _, p in build_tiny_llama(tokenizer, hidden_size=32, seed=0).named_parameters()]


def test_add_peer_rows_queues_a_bounded_number_and_a_step_merges_its_cap(tokenizer, make_args):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=1, max_peer_ratio=0.5), hidden_size=32)
    bound = trainer._rounds.queue_rows(trainer.args.generation_batch_size)
    assert bound == 64  # 4 x (0.5 x 16 own rows), at least 64
    queued = trainer.add_peer_rows(peer_rows(tokenizer, 100))
    assert queued == trainer.num_pending_peer_rows == 64
    assert trainer.summary()["dropped"] == {"queue_full": 36}  # counted, never silently lost
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peer_rows"] == 8  # this step's cap: 0.5 x 16 own rows, as whole groups
    assert trainer.num_pending_peer_rows == 56  # the rest waits for later steps


@pytest.mark.parametrize(
    "options, size",
    [
        ({}, 16),
        ({"peer_micro_batch_size": 8}, 8),
        ({"peer_micro_batch_size": 0}, None),
        ({"peer_weighting": "ess"}, None),
        ({"kl_threshold_mode": "quantile"}, None),
        ({"top_entropy_quantile": 0.5}, None),
    ],
    ids=str,
)
def test_a_micro_batch_is_cut_only_when_the_options_allow(tmp_path, options, size):
    from trl_ftis.micro_batches import chunk_size

    args = FTISConfig(str(tmp_path), use_cpu=True, per_device_train_batch_size=16, num_generations=8, **options)
    assert chunk_size(args, 32, training=True, deepspeed=False) == size
    assert chunk_size(args, 16, training=True, deepspeed=False) is None  # no peers: as TRL computes it
    assert chunk_size(args, 32, training=False, deepspeed=False) is None
    assert chunk_size(args, 32, training=True, deepspeed=True) is None


def test_peer_micro_batch_size_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="peer_micro_batch_size must be >= 0"):
        FTISConfig(str(tmp_path), use_cpu=True, peer_micro_batch_size=-1)


def test_a_swarm_peer_trains_with_gradient_checkpointing_on(tokenizer, make_args):
    # TRL's default (the tiny test settings turn it off for speed): peer rows merged, scored with it disabled for the
    # no-grad forwards, and trained in chunks through checkpointed layers.
    import math
    import uuid

    from swarm_helpers import make_swarm

    url = f"memory://checkpointing-{uuid.uuid4().hex}"
    sender = make_swarm(url, "other", tokenizer)
    sender.publish(peer_rows(tokenizer, 24), 0)
    args = make_args(
        max_steps=2, exchange_url=url, peer_id="me", gradient_checkpointing=True, num_iterations=2, peer_timeout=0.0
    )
    trainer = tiny_trainer(tokenizer, args, hidden_size=32)
    trainer.train()
    assert trainer.model.is_gradient_checkpointing  # enabled by the Trainer when training starts
    steps = [e for e in trainer.state.log_history if "loss" in e]
    assert steps[0]["ftis/peer_rows"] == 24 and all(
        math.isfinite(e["grad_norm"]) and e["grad_norm"] > 0 for e in steps
    )
