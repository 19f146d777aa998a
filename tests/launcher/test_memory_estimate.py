"""`trl_ftis.launcher.memory`: the GPU memory estimate of the GPU recipes, checked against values computed by hand."""

from __future__ import annotations

import pytest

from trl_ftis.launcher.memory import GB, MODEL_SHAPES, ModelShape, lora_parameters, peer_memory, server_memory

QWEN_15B = MODEL_SHAPES["Qwen/Qwen2.5-1.5B"]
QWEN_3B = MODEL_SHAPES["Qwen/Qwen2.5-3B"]


def test_lora_parameters_of_the_paper_models_at_rank_128():
    # 1.5B: per layer (in + out) = q 3072 + k 1792 + v 1792 + o 3072 + gate 10496 + up 10496 + down 10496 = 41216.
    assert lora_parameters(QWEN_15B, 128) == 128 * 41216 * 28 == 147_718_144
    # 3B: q 4096 + k 2304 + v 2304 + o 4096 + 3 x 13056 = 51968 per layer, 36 layers.
    assert lora_parameters(QWEN_3B, 128) == 128 * 51968 * 36 == 239_468_544


def test_zero2_shards_gradients_and_adam_but_not_weights_and_peer_rows_share_the_forward():
    estimate = peer_memory(
        QWEN_15B, processes=3, zero_stage=2, rows=4, received_rows=4, deepspeed=True, tokens=800, gpu_gb=80
    )
    assert estimate.weights == pytest.approx(1.54e9 * 4)
    assert estimate.gradients == pytest.approx(1.54e9 * 4 / 3)
    assert estimate.adam == pytest.approx(1.54e9 * 8 / 3)
    # 8 rows (4 own + 4 received: DeepSpeed does not chunk) x 800 tokens x (151936 x 8 + 1536 x 28 x 4) bytes.
    assert estimate.activations == 8 * 800 * (151936 * 8 + 1536 * 28 * 4) == 8_880_128_000
    assert estimate.vllm == 0
    assert estimate.line(80) == "21.2 GB of 80 GB (27%) = weights 6.2 + gradients 2.1 + Adam 4.1 + activations 8.9"


def test_zero3_shards_weights_ddp_shards_nothing():
    zero3 = peer_memory(QWEN_3B, processes=4, zero_stage=3, rows=1, tokens=1)
    ddp = peer_memory(QWEN_3B, processes=4, zero_stage=0, rows=1, tokens=1)
    assert zero3.weights == pytest.approx(3.09e9 * 4 / 4)
    assert (ddp.weights, ddp.gradients, ddp.adam) == pytest.approx((3.09e9 * 4, 3.09e9 * 4, 3.09e9 * 8))
    zero1 = peer_memory(QWEN_3B, processes=4, zero_stage=1, rows=1, tokens=1)
    assert (zero1.gradients, zero1.adam) == pytest.approx((3.09e9 * 4, 3.09e9 * 8 / 4))


@pytest.mark.parametrize(
    "peer_micro_batch_size, rows_in_forward",
    [(None, 4), (6, 6), (16, 8), (0, 12)],  # chunks of per_device rows, of 6, of all 8 received, none (4 + 8)
)
def test_received_rows_in_chunks_of_peer_micro_batch_size(peer_micro_batch_size, rows_in_forward):
    shape = ModelShape(parameters=10, hidden=2, intermediate=4, layers=3, kv_dim=2, vocab=5)
    estimate = peer_memory(shape, rows=4, received_rows=8, peer_micro_batch_size=peer_micro_batch_size, tokens=10)
    assert estimate.activations == rows_in_forward * 10 * (5 * 8 + 2 * 3 * 4)


def test_lora_peer_keeps_frozen_weights_and_trains_the_adapter_in_fp32():
    rank = 128
    trainable = lora_parameters(QWEN_15B, rank)
    estimate = peer_memory(QWEN_15B, weight_bytes=2, lora_rank=rank, rows=1, tokens=1)
    assert estimate.weights == pytest.approx(1.54e9 * 2 + trainable * 4)
    assert estimate.gradients == pytest.approx(trainable * 4)
    assert estimate.adam == pytest.approx(trainable * 8)


def test_a_colocated_engine_and_a_server_take_their_share_of_the_gpu():
    estimate = peer_memory(QWEN_15B, rows=1, tokens=1, vllm_utilization=0.1, gpu_gb=141)
    assert estimate.vllm == pytest.approx(14.1 * GB)
    assert "vLLM 14.1" in estimate.line(141)
    assert server_memory(0.9, 80) == pytest.approx(72 * GB)


def test_impossible_layouts_are_refused():
    with pytest.raises(ValueError):
        peer_memory(QWEN_15B, zero_stage=4, rows=1, tokens=1)
    with pytest.raises(ValueError):
        peer_memory(QWEN_15B, rows=0, tokens=1)
