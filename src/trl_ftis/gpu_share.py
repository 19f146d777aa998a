"""A peer's share of a GPU: peers colocated on one GPU (the launcher's `gpu_share`) each cap PyTorch's allocator."""

from __future__ import annotations

import logging
import math
import os

from typing import TYPE_CHECKING

import torch

from .rules import GPU_MEMORY_FRACTION_ENV

if TYPE_CHECKING:
    from .config import FTISConfig

logger = logging.getLogger(__name__)


def gpu_memory_fraction() -> float | None:
    """The share of one GPU's memory this process may use, from `FTIS_GPU_MEMORY_FRACTION` (set by the swarm
    launcher's `gpu_share` for peers that share a GPU); `None` when unset. A bad value raises `ValueError`."""
    text = os.environ.get(GPU_MEMORY_FRACTION_ENV, "").strip()
    if not text:
        return None
    try:
        fraction = float(text)
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 1:
        raise ValueError(f"{GPU_MEMORY_FRACTION_ENV} must be a fraction in (0, 1], got {text!r}.")
    return fraction


def cap_gpu_memory(fraction: float, args: FTISConfig) -> None:
    """Cap PyTorch's allocator on this process's GPU, so peers sharing a GPU cannot starve each other. A colocated
    vLLM engine allocates outside that cap, from its own fraction of the whole GPU: it must fit inside the share."""
    if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization >= fraction:
        raise ValueError(
            f"vllm_gpu_memory_utilization={args.vllm_gpu_memory_utilization} is a fraction of the whole GPU and "
            f"does not fit in this peer's share {GPU_MEMORY_FRACTION_ENV}={fraction}: set it below the share "
            "(e.g. half of it, leaving the rest for training)."
        )
    if not torch.cuda.is_available() or args.use_cpu:
        return
    device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    logger.info("This peer may use %.0f%% of GPU %d's memory (%s).", 100 * fraction, device, GPU_MEMORY_FRACTION_ENV)
