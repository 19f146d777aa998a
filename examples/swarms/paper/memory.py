"""Estimate the GPU memory of every peer of a swarm config, from parameter counts, before anything is loaded.

    python examples/swarms/paper/memory.py examples/swarms/paper/node_8gpu_server.yaml --gpu-gb 80

Prints one line per training GPU set and per vLLM server (`trl_ftis.launcher.memory` says what is counted and what
is not). The GPU recipes of this folder hold these lines in their headers (a test checks that they match). Models
outside `trl_ftis.launcher.memory.MODEL_SHAPES` are skipped with a note.
"""

from __future__ import annotations

import argparse
import sys

from trl_ftis.launcher import load_swarm_config
from trl_ftis.launcher.memory import MODEL_SHAPES, peer_memory, server_memory
from trl_ftis.launcher.placement import VLLM_MEMORY_DEFAULT, accelerate_settings, colocated_vllm, process_count

TRL_SERVER_GPU_MEMORY_UTILIZATION = 0.9  # `trl vllm-serve`'s default


def _rows_per_step(peer, processes: int) -> int:
    rows = int(peer.args.get("per_device_train_batch_size", 8))
    return rows * processes * int(peer.args.get("gradient_accumulation_steps", 1))


def estimate_lines(config_path: str, gpu_gb: float, prompt_tokens: int) -> list[str]:
    """The estimate's lines for the config at `config_path` (what the recipes' headers hold)."""
    config = load_swarm_config(config_path)
    peers = [peer for peer in config.peers if peer.control_of is None]
    layout = {}
    for peer in peers:
        accelerate = accelerate_settings(peer.accelerate_config) or {}
        processes = process_count(peer) or 1
        layout[peer.id] = (accelerate, processes, _rows_per_step(peer, processes))
    lines = []
    for peer in peers:
        model = peer.model or peer.args.get("model_name_or_path")
        shape = MODEL_SHAPES.get(model)
        if shape is None:
            lines.append(f"{peer.id}: {model} has no known shape; not estimated")
            continue
        accelerate, processes, _ = layout[peer.id]
        deepspeed = accelerate.get("distributed_type") == "DEEPSPEED"
        zero = int((accelerate.get("deepspeed_config") or {}).get("zero_stage", 0)) if deepspeed else 0
        args = peer.args
        micro_batches = processes * int(args.get("gradient_accumulation_steps", 1))
        received = sum(rows for other, (_, _, rows) in layout.items() if other != peer.id) // micro_batches
        colocated = colocated_vllm(peer)
        estimate = peer_memory(
            shape,
            processes=processes,
            zero_stage=zero,
            weight_bytes=2 if args.get("dtype") == "bfloat16" else 4,
            lora_rank=int(args.get("lora_r", 16)) if args.get("use_peft") else None,
            rows=int(args.get("per_device_train_batch_size", 8)),
            received_rows=received,
            peer_micro_batch_size=args.get("peer_micro_batch_size"),
            deepspeed=deepspeed,
            tokens=prompt_tokens + int(args.get("max_completion_length", 256)),
            vllm_utilization=float(args.get("vllm_gpu_memory_utilization", VLLM_MEMORY_DEFAULT))
            if colocated
            else 0.0,
            gpu_gb=gpu_gb,
        )
        where = f"each of GPUs {peer.gpus}" if peer.gpus and "," in peer.gpus else f"GPU {peer.gpus or '?'}"
        share = f", gpu_share {peer.gpu_share:g} = {peer.gpu_share * gpu_gb:.1f} GB" if peer.gpu_share else ""
        lines.append(f"{peer.id}, {where}{share}: {estimate.line(gpu_gb)}")
        if peer.vllm_server is not None:
            utilization = float(peer.vllm_server.args.get("gpu_memory_utilization", TRL_SERVER_GPU_MEMORY_UTILIZATION))
            taken = server_memory(utilization, gpu_gb)
            lines.append(
                f"{peer.id}'s vLLM server, GPU {peer.vllm_server.gpus}: {taken / 1e9:.1f} GB of {gpu_gb:g} GB "
                f"(gpu_memory_utilization {utilization:g}: weights, then KV cache)"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a swarm config (YAML)")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="each GPU's memory in GB (H100: 80, H200: 141)")
    parser.add_argument("--prompt-tokens", type=int, default=200, help="prompt tokens of a row (GSM8K: about 200)")
    options = parser.parse_args(argv)
    for line in estimate_lines(options.config, options.gpu_gb, options.prompt_tokens):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
