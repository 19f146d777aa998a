"""A peer's GPU memory, estimated from parameter counts before anything is loaded: what the GPU recipes of
`examples/swarms/paper/` print (`examples/swarms/paper/memory.py`) and write in their headers.

Per training GPU of one peer, in bytes (`peer_memory`):

* weights: every parameter at the weights' dtype (4 bytes fp32, 2 bf16); ZeRO-3 shards them over the processes;
* gradients: the trainable parameters at the weights' dtype; ZeRO-2 and ZeRO-3 shard them;
* Adam: two moments per trainable parameter at the weights' dtype (plus the LoRA weights themselves, fp32, for a LoRA
  peer); ZeRO-1, 2 and 3 shard them;
* activations of the largest forward: its rows x tokens x (vocabulary x 8 bytes for the fp32 logits and their
  log-softmax, + hidden size x layers x 4 bytes for the layer inputs gradient checkpointing keeps). The largest
  forward holds `per_device_train_batch_size` own rows, or a chunk of `peer_micro_batch_size` peer rows when that is
  larger; under DeepSpeed peer rows are not chunked, so it holds the own rows plus every received row of the
  micro-batch (`received_rows`);
* vLLM: a colocated engine's `vllm_gpu_memory_utilization` of the GPU (it runs in the training process).

A vLLM server's GPU holds its `gpu_memory_utilization` of the GPU (`server_memory`). Not counted: the CUDA context
(about 0.5 GB a process), the allocator's fragmentation, and the temporary buffers of the optimizer step: keep a few
GB free. The result is an estimate to choose GPUs and shares with, not a promise. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GB", "MODEL_SHAPES", "MemoryEstimate", "ModelShape", "lora_parameters", "peer_memory", "server_memory"]

GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a decoder-only model: its parameter count and the sizes of its layers."""

    parameters: int
    hidden: int
    intermediate: int
    layers: int
    kv_dim: int  # key/value heads x head size
    vocab: int


# The models of the paper's recipes (their config.json: hidden_size, intermediate_size, num_hidden_layers,
# num_key_value_heads x head size, vocab_size; parameters as their model cards give them).
_QWEN25_15B = ModelShape(parameters=1_540_000_000, hidden=1536, intermediate=8960, layers=28, kv_dim=256, vocab=151936)
_QWEN25_3B = ModelShape(parameters=3_090_000_000, hidden=2048, intermediate=11008, layers=36, kv_dim=256, vocab=151936)
MODEL_SHAPES = {
    "Qwen/Qwen2.5-1.5B": _QWEN25_15B,
    "Qwen/Qwen2.5-Coder-1.5B": _QWEN25_15B,
    "Qwen/Qwen2.5-3B": _QWEN25_3B,
    "Qwen/Qwen2.5-Coder-3B": _QWEN25_3B,
}


def lora_parameters(shape: ModelShape, rank: int) -> int:
    """LoRA's trainable parameters on every linear layer but the LM head (`all-linear`): rank x (inputs + outputs)
    for q, k, v, o, gate, up and down in each layer."""
    h, i, kv = shape.hidden, shape.intermediate, shape.kv_dim
    per_layer = (h + h) + (h + kv) + (h + kv) + (h + h) + 2 * (h + i) + (i + h)
    return rank * per_layer * shape.layers


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one training GPU of a peer, by what holds them."""

    weights: float
    gradients: float
    adam: float
    activations: float
    vllm: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.adam + self.activations + self.vllm

    def line(self, gpu_gb: float | None = None) -> str:
        """`"41.6 GB = weights 6.2 + gradients 2.1 + Adam 4.1 + activations 5.2 + vLLM 24.0"` (of `gpu_gb`)."""
        parts = [
            f"weights {self.weights / GB:.1f}",
            f"gradients {self.gradients / GB:.1f}",
            f"Adam {self.adam / GB:.1f}",
            f"activations {self.activations / GB:.1f}",
        ]
        if self.vllm:
            parts.append(f"vLLM {self.vllm / GB:.1f}")
        share = f" of {gpu_gb:g} GB ({self.total / (gpu_gb * GB):.0%})" if gpu_gb else ""
        return f"{self.total / GB:.1f} GB{share} = " + " + ".join(parts)


def peer_memory(
    shape: ModelShape,
    *,
    processes: int = 1,
    zero_stage: int = 0,
    weight_bytes: int = 4,
    lora_rank: int | None = None,
    rows: int,
    received_rows: int = 0,
    peer_micro_batch_size: int | None = None,
    deepspeed: bool = False,
    tokens: int,
    vllm_utilization: float = 0.0,
    gpu_gb: float = 80.0,
) -> MemoryEstimate:
    """One training GPU of a peer (see the module docstring). `rows`: `per_device_train_batch_size`;
    `received_rows`: the peer rows one micro-batch trains on; `tokens`: prompt plus completion tokens of a row;
    `vllm_utilization`: a colocated engine's share of the GPU (0: none); `zero_stage` 0 is DDP (or one process)."""
    if processes < 1 or zero_stage not in (0, 1, 2, 3) or rows < 1 or tokens < 1:
        raise ValueError("processes >= 1, zero_stage 0-3, rows >= 1 and tokens >= 1")
    trainable = lora_parameters(shape, lora_rank) if lora_rank else shape.parameters
    weights = shape.parameters * weight_bytes / (processes if zero_stage >= 3 else 1)
    gradients = trainable * (4 if lora_rank else weight_bytes) / (processes if zero_stage >= 2 else 1)
    adam = trainable * 2 * (4 if lora_rank else weight_bytes) / (processes if zero_stage >= 1 else 1)
    if lora_rank:
        weights += trainable * 4  # the adapter itself, fp32
    if deepspeed or peer_micro_batch_size == 0:
        forward_rows = rows + received_rows  # peer rows in the same forward
    else:
        chunk = rows if peer_micro_batch_size is None else peer_micro_batch_size
        forward_rows = max(rows, min(chunk, received_rows)) if received_rows else rows
    per_token = shape.vocab * 8 + shape.hidden * shape.layers * 4
    activations = forward_rows * tokens * per_token
    return MemoryEstimate(weights, gradients, adam, activations, vllm_utilization * gpu_gb * GB)


def server_memory(utilization: float, gpu_gb: float = 80.0) -> float:
    """Bytes a vLLM server takes on each of its GPUs: its `gpu_memory_utilization` of the GPU (TRL's default 0.9)."""
    return utilization * gpu_gb * GB
