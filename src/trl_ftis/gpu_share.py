"""A peer's share of a GPU: peers colocated on one GPU each cap PyTorch's allocator to `FTISConfig.gpu_memory_fraction`
(the swarm launcher's `gpu_share` passes it as `--gpu_memory_fraction`); `FTISTrainer` calls [`cap_gpu_memory`] with it
before it loads the model."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import FTISConfig

logger = logging.getLogger(__name__)


def cap_gpu_memory(fraction: float, args: FTISConfig) -> None:
    """Cap PyTorch's allocator on this process's GPU to `fraction` of its memory, so peers sharing a GPU cannot starve
    each other (nothing on the CPU). A colocated vLLM engine runs in this process, so its weights and KV cache are
    allocated inside that cap; its `vllm_gpu_memory_utilization` is a fraction of the whole GPU, which must be below
    the share (training gets the rest), else `ValueError`."""
    if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization >= fraction:
        raise ValueError(
            f"vllm_gpu_memory_utilization={args.vllm_gpu_memory_utilization} is a fraction of the whole GPU and "
            f"does not fit in this peer's share gpu_memory_fraction={fraction}: set it below the share "
            "(e.g. half of it, leaving the rest for training)."
        )
    if not torch.cuda.is_available() or args.use_cpu:
        return
    device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    logger.info("This peer may use %.0f%% of GPU %d's memory (gpu_memory_fraction).", 100 * fraction, device)
