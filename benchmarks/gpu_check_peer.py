"""One peer of the GPU check's `launcher` stage: `benchmarks/gpu_check.py` writes a swarm config naming this script and
starts it with `trl-ftis swarm`, which runs one process of it per peer:

    python benchmarks/gpu_check_peer.py --check_spec SPEC.json --check_result RECORD.json \
        --peer_id peer-a --exchange_url dir:///... --output_dir RUN/peer-a [every FTISConfig option]

Its options are those of [`CheckPeerArguments`] and of `FTISConfig` (parsed by TRL's `TrlParser`, so that the launcher
reads and checks them before it starts anything). `--check_spec` is the check's JSON: the model's shape, its seed, the
prompt style and the CPU threads. The model, tokenizer, reward, prompts and trainer are `gpu_check_worker.py`'s: a
randomly initialised Llama of that shape, the share of even token ids as the reward, and a trainer that synchronizes
the device in each step (its `ftis/time/*` split then holds GPU time).

The model is built on the CPU: the trainer caps this process's share of the GPU (`--gpu_memory_fraction`, which the
launcher's `gpu_share` passes) before it moves the model there. With `--use_vllm true --vllm_mode colocate` the model
and tokenizer are first saved to `<output_dir>/initial-model` and loaded back from there, since the colocated vLLM
engine loads its copy from the model's path (`model.name_or_path`); it runs in this process, inside the cap.

The record (`--check_result`, rewritten after each part, as the worker's) holds: the environment, which generation the
peer used, `CUDA_VISIBLE_DEVICES` and the GPU share it was given, the trainer's steps (split, loss, peer rows merged),
the memory peaks (`torch.cuda.max_memory_allocated` and `max_memory_reserved` of this process, and the GPU's memory in
use by every process at the end), and the peer's own summary (`ftis_summary.json`: rows sent, received, accepted).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import gpu_check_worker as worker  # benchmarks/, this script's folder, is first on sys.path
from trl import TrlParser

from trl_ftis import FTISConfig
from trl_ftis.shared_names import SUMMARY_FILE

GIB = 2**30
#: What the record keeps of the peer's own summary file.
SUMMARY_KEYS = ("peer_id", "steps", "rows_sent", "rows_received", "rows_accepted", "rows_filtered", "peers", "dropped",
                "refused")  # fmt: skip


@dataclass
class CheckPeerArguments:
    """Where the GPU check's plan for this peer is, and where its record goes."""

    check_spec: str = field(
        default="", metadata={"help": "The check's JSON for this stage: shape, model_seed, prompt_style, threads."}
    )
    check_result: str = field(default="", metadata={"help": "This peer's record (JSON), rewritten after each part."})


def generation_used(args) -> str:
    """Which generation the trainer runs, in words."""
    if args.use_vllm:
        return f"vllm {args.vllm_mode} (vllm_gpu_memory_utilization {args.vllm_gpu_memory_utilization})"
    return "trainer (transformers generate)"


def memory_record(device: str, fraction: float | None) -> dict:
    """This process's memory peaks on its GPU and the GPU's memory in use by every process now (GiB); on the CPU only
    the share it was given."""
    import torch

    record: dict = {"device": device, "gpu_memory_fraction": fraction}
    if device != "cuda":
        return record
    free, total = torch.cuda.mem_get_info()
    record.update(
        max_allocated_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
        max_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3),
        gpu_total_gib=round(total / GIB, 2),
        gpu_in_use_at_end_gib=round((total - free) / GIB, 3),
        cap_gib=round(fraction * total / GIB, 2) if fraction else None,
    )
    return record


def peer_summary(output_dir: str) -> dict | None:
    path = Path(output_dir) / SUMMARY_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {key: data.get(key) for key in SUMMARY_KEYS}


def load_for_vllm(model, tokenizer, folder: Path):
    """Save the model and tokenizer to `folder` and load the model back from it: its `name_or_path` is then a path the
    colocated vLLM engine can load."""
    from transformers import AutoModelForCausalLM

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    loaded.generation_config.pad_token_id = tokenizer.pad_token_id
    loaded.generation_config.eos_token_id = tokenizer.eos_token_id
    return loaded


def run(check: CheckPeerArguments, args) -> int:
    import torch

    spec = json.loads(Path(check.check_spec).read_text())
    result = worker.Result(check.check_result)
    device = "cuda" if torch.cuda.is_available() and not args.use_cpu else "cpu"
    result.save(role="launcher-peer", peer_id=args.peer_id, started=time.time(), generation=generation_used(args),
                cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                gpu_memory_fraction=args.gpu_memory_fraction)  # fmt: skip
    torch.set_num_threads(spec.get("threads") or 1)
    trainer_plan = {
        "rows": args.per_device_train_batch_size * args.gradient_accumulation_steps,
        "micro_batch": args.per_device_train_batch_size, "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length, "steps": args.max_steps,
    }  # fmt: skip
    plan = {**spec, "device": "cpu", "dtype": "bf16" if args.bf16 else "fp32", "seed": args.seed,
            "trainer": trainer_plan}  # fmt: skip
    failed = False
    try:
        result.save(environment=worker.environment(device))
        tokenizer = worker.build_tokenizer(spec["shape"]["vocab_size"])
        model = worker.build_model(plan, tokenizer)  # on the CPU: the trainer caps the share, then moves it
        if args.use_vllm:
            model = load_for_vllm(model, tokenizer, Path(args.output_dir) / "initial-model")
        result.save(parameters=sum(p.numel() for p in model.parameters()))
        worker.train(plan, args, model, tokenizer, result)
    except Exception as error:  # noqa: BLE001 - recorded with what came before it
        import traceback

        traceback.print_exc()
        result.error("trainer", error)
        failed = True
    finally:
        result.save(memory=memory_record(device, args.gpu_memory_fraction), summary=peer_summary(args.output_dir),
                    finished=time.time())  # fmt: skip
    return 1 if failed else 0


def main() -> int:
    check, args = TrlParser((CheckPeerArguments, FTISConfig)).parse_args_and_config()
    return run(check, args)


if __name__ == "__main__":
    sys.exit(main())
