"""One process of the GPU check (`benchmarks/gpu_check.py` starts it): `python gpu_check_worker.py SPEC.json`.

The spec (JSON, written by the driver) says what to do, in this order, each part as it asks:

* build the model: a randomly initialised `LlamaForCausalLM` of the spec's `shape` (SmolLM2-135M's, or a tiny one),
  on the device, with a character tokenizer of exactly the model's vocabulary ([`build_tokenizer`]);
* `generation`: time `generate` at several row counts;
* `trainer`: train a few steps, alone, or (`peer`) as one peer of a swarm: its id, the `dir://` exchange, whom it
  waits for. The ZeRO-3 step is such a peer under `accelerate launch` with `examples/accelerate/deepspeed_zero3.yaml`;
* `probe`: the attention probe (below), last, on a fresh model with the same initial weights.

The reward reads token ids (the share of even ids): a random model's completions mean nothing as text. Prompts have
different lengths (word problems; short sums in the CPU mode, where bf16 is emulated and slow), so batches are
left-padded, as in real training.

Timing. The trainer's own clock (`ftis/time/{generation,scoring,exchange,training,other}`) times host spans; on a GPU
the kernels of a training step run asynchronously, so their time would land in whatever waits for them next. The
check's trainer therefore synchronizes the device at the end of each micro-batch's `training_step` (inside the
trainer's "training" span) and after each optimizer step (inside the step, as "other"): a step's total is unchanged,
and each part holds its own GPU time. `generate` is timed between two synchronizations.

Non-finite values. A callback stops the run at the first step whose loss or gradient norm is not finite and records
the step (the next step would sample from non-finite weights). The attention probe runs one forward and backward of a
fixed batch, left-padded and not, under each requested scaled-dot-product-attention backend, and records whether the
logits, the loss and every gradient are finite: with left padding, each padding position is a query row with no key
to attend to, which a fused attention kernel may turn into NaN.

Everything the worker learns goes to the spec's `result` file, rewritten after each part, so that a part that fails
or runs out of time leaves the earlier parts' figures.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path

TIME_METRICS = ("step", "generation", "scoring", "exchange", "training", "other")
BACKENDS = {"math": "MATH", "efficient": "EFFICIENT_ATTENTION", "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


class Result:
    """The result file, rewritten (atomically) on every [`save`]."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.data: dict = {"pid": os.getpid(), "errors": []}

    def save(self, **parts) -> None:
        self.data.update(parts)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)

    def error(self, part: str, error: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        self.data["errors"].append({"part": part, "error": text[-2000:]})
        self.save()


# ---- environment, model, data -----------------------------------------------------------------------------------
def environment(device: str) -> dict:
    import importlib
    import importlib.metadata

    import torch
    import transformers

    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    stand_ins = []  # which of TRL's module-level imports are the set-up's stand-ins (TRL imports them all)
    for name in ("pandas", "pyarrow", "datasets"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if "stand-in" in (module.__doc__ or "").lower():
            stand_ins.append(name)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": version("trl"),
        "accelerate": version("accelerate"),
        "deepspeed": version("deepspeed"),
        "stand_ins": stand_ins,
        "device": device,
        "cuda": torch.version.cuda,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        env["sdpa_enabled"] = {
            name: getattr(torch.backends.cuda, f"{name}_sdp_enabled", lambda: None)()
            for name in ("flash", "mem_efficient", "math", "cudnn")
        }
    return env


def synchronize(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def build_tokenizer(vocab_size: int):
    """`trl_ftis.demo.tiny`'s character tokenizer (printable ASCII, left padding), its alphabet filled up with
    characters of Unicode plane 2 to exactly `vocab_size` tokens: every id a model of that vocabulary samples then
    decodes to one character, and a peer's rows stay within the receiver's vocabulary (the trainer admits only ids
    below the tokenizer's size)."""
    from trl_ftis.demo.tiny import PRINTABLE_ALPHABET, SPECIAL_TOKENS, build_char_tokenizer

    filler = vocab_size - len(SPECIAL_TOKENS) - len(PRINTABLE_ALPHABET)
    if filler < 0:
        raise ValueError(f"a vocabulary of {vocab_size} is smaller than the tokenizer's alphabet")
    alphabet = PRINTABLE_ALPHABET + "".join(chr(0x20000 + i) for i in range(filler))
    tokenizer = build_char_tokenizer(None, alphabet=alphabet)
    if len(tokenizer) != vocab_size:
        raise RuntimeError(f"the tokenizer has {len(tokenizer)} tokens, not {vocab_size}")
    return tokenizer


def build_model(spec: dict, tokenizer):
    """The spec's `shape`, randomly initialised (seed `model_seed`) on the device, in fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**spec["shape"], pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer's {len(tokenizer)} tokens do not fit the vocabulary of {config.vocab_size}")
    torch.manual_seed(spec.get("model_seed", 0))
    with torch.device(spec["device"]):
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def prompts(n: int, seed: int, style: str = "word") -> list[str]:
    """`n` prompts of different lengths (one token a character), so that a batch of them is left-padded: `word`,
    word problems of 70-140 characters; `short`, sums of 4-8 characters (the CPU mode, where bf16 is emulated)."""
    rng = random.Random(seed)
    if style == "short":
        return [f"{rng.randint(1, 999)}+{rng.randint(1, 999)}=" for _ in range(n)]
    items = ("apples", "pears", "books", "coins", "stamps", "marbles")
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        first, second = rng.sample(items, 2)
        detail = " on the way home from the market" * rng.randint(0, 2)
        out.append(f"Q: Sam has {a} {first} and finds {b} {second}{detail}. How many things does Sam have? A:")
    return out


def even_ids_reward(completions, completion_ids=None, **kwargs):
    """The share of even token ids in each completion: varies between completions of a random model."""
    return [sum(i % 2 == 0 for i in ids) / max(len(ids), 1) for ids in completion_ids]


def precision(spec: dict):
    """Autocast in bf16 (as the trainer with `bf16: true` runs fp32 weights), nothing in fp32."""
    import torch

    if spec["dtype"] == "bf16":
        return torch.autocast(device_type="cuda" if spec["device"] == "cuda" else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---- generation --------------------------------------------------------------------------------------------------
def time_generation(spec: dict, model, tokenizer) -> dict:
    """Seconds of one `generate` call per row count, `new_tokens` tokens per row (sampling, EOS suppressed by
    `min_new_tokens`), after a short warm-up; the row counts alternate in order (A B C, C B A, ...)."""
    import torch

    g = spec["generation"]
    device = spec["device"]
    texts = prompts(max(g["rows"]), seed=1, style=spec.get("prompt_style", "word"))
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(device)
    model.eval()

    def once(rows: int, tokens: int) -> float:
        synchronize(device)
        began = time.perf_counter()
        with torch.no_grad(), precision(spec):
            out = model.generate(input_ids=batch.input_ids[:rows], attention_mask=batch.attention_mask[:rows],
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens,
                                 min_new_tokens=tokens, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        synchronize(device)
        seconds = time.perf_counter() - began
        if out.shape[1] - batch.input_ids.shape[1] != tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - batch.input_ids.shape[1]} tokens, not {tokens}")
        return seconds

    warm = once(g["rows"][0], min(8, g["new_tokens"]))
    seconds: dict[str, list[float]] = {str(rows): [] for rows in g["rows"]}
    for repeat in range(g.get("repeats", 1)):
        for rows in g["rows"] if repeat % 2 == 0 else reversed(g["rows"]):
            seconds[str(rows)].append(round(once(rows, g["new_tokens"]), 4))
    model.train()
    return {"new_tokens": g["new_tokens"], "prompt_tokens": int(batch.input_ids.shape[1]),
            "warm_up_seconds": round(warm, 4), "seconds": seconds}  # fmt: skip


# ---- attention probe ----------------------------------------------------------------------------------------------
def attention_probe(spec: dict, model, tokenizer) -> list[dict]:
    """One forward and backward of a fixed batch per (padding, SDPA backend): are logits, loss, gradients finite?"""
    import torch

    p = spec["probe"]
    device = spec["device"]
    texts = prompts(p["rows"], seed=2, style=spec.get("prompt_style", "word"))
    texts[0] = texts[0][: max(len(texts[0]) // 2, 1)]  # shorter than the others: the padded batch has padding
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    generator = torch.Generator().manual_seed(0)
    continuation = torch.randint(0, model.config.vocab_size, (p["rows"], p["new_tokens"]), generator=generator)
    shortest = int(batch.attention_mask.sum(1).min())
    inputs = {
        True: (torch.cat([batch.input_ids, continuation], 1), torch.cat([batch.attention_mask,
                                                                          torch.ones_like(continuation)], 1)),
        False: (torch.cat([batch.input_ids[:, -shortest:], continuation], 1), None),
    }  # fmt: skip
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # an old torch: only the default
        SDPBackend = sdpa_kernel = None
    cases = []
    model.train()
    for padded in p["padded"]:
        ids, mask = inputs[padded]
        ids = ids.to(device)
        mask = torch.ones_like(ids) if mask is None else mask.to(device)
        labels = ids.masked_fill(mask == 0, -100)
        for backend in p["backends"]:
            # Each padding position is a query row with no key to attend to (left padding, causal mask).
            case = {"padded": padded, "backend": backend, "padding_positions": int((mask == 0).sum())}
            member = BACKENDS.get(backend)
            if backend != "default" and (SDPBackend is None or not hasattr(SDPBackend, member or "")):
                cases.append(case | {"status": "unavailable"})
                continue
            context = sdpa_kernel(getattr(SDPBackend, member)) if member else contextlib.nullcontext()
            model.zero_grad(set_to_none=True)
            try:
                with context:
                    with precision(spec):
                        out = model(input_ids=ids, attention_mask=mask, labels=labels)
                    out.loss.backward()
                synchronize(device)
            except Exception as error:  # noqa: BLE001 - a backend that cannot run these inputs
                cases.append(case | {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]})
                continue
            bad = [name for name, param in model.named_parameters()
                   if param.grad is not None and not torch.isfinite(param.grad).all()]  # fmt: skip
            logits = out.logits.float()
            real = mask.bool()
            case.update(
                loss=float(out.loss.detach()),
                loss_finite=bool(torch.isfinite(out.loss.detach())),
                logits_finite_at_tokens=bool(torch.isfinite(logits[real]).all()),
                logits_finite_at_padding=bool(torch.isfinite(logits[~real]).all()) if (~real).any() else None,
                grads_finite=not bad,
                nonfinite_grads=len(bad),
                first_nonfinite_grad=bad[0] if bad else None,
            )
            case["status"] = "finite" if case["loss_finite"] and not bad else "nonfinite"
            cases.append(case)
    model.zero_grad(set_to_none=True)
    return cases


# ---- training ----------------------------------------------------------------------------------------------------
def trainer_class():
    """`FTISTrainer` with a device synchronization at the end of each `training_step` of TRL (inside the F-TIS
    trainer's "training" span): `CheckTrainer -> FTISTrainer -> _Synced -> GRPOTrainer` in the method order."""
    from trl import GRPOTrainer

    from trl_ftis import FTISTrainer

    class _Synced(GRPOTrainer):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            synchronize(self.args.device)
            return loss

    class CheckTrainer(FTISTrainer, _Synced):
        pass

    return CheckTrainer


def watch_callback(record: dict):
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        """Synchronizes after the optimizer step; stops at the first non-finite loss or gradient norm."""

        def on_optimizer_step(self, args, state, control, **kwargs):
            synchronize(args.device)

        def on_log(self, args, state, control, logs=None, **kwargs):
            for key in ("loss", "grad_norm"):
                value = (logs or {}).get(key)
                if isinstance(value, (int, float)) and not math.isfinite(value) and record.get("nonfinite") is None:
                    record["nonfinite"] = {"step": state.global_step, "metric": key, "value": str(value)}
                    control.should_training_stop = True

    return Watch()


def trainer_config(spec: dict):
    from trl_ftis import FTISConfig

    t = spec["trainer"]
    peer = spec.get("peer") or {}
    kwargs = {
        # One generation of `rows` a step, trained in micro-batches (TRL: steps_per_generation = accumulation steps).
        "output_dir": spec["output_dir"], "max_steps": t["steps"], "per_device_train_batch_size": t["micro_batch"],
        "gradient_accumulation_steps": t["rows"] // t["micro_batch"],
        "num_generations": t["num_generations"], "max_completion_length": t["max_completion_length"],
        "learning_rate": t["learning_rate"], "lr_scheduler_type": "constant", "preset": "paper",
        "bf16": spec["dtype"] == "bf16", "use_cpu": spec["device"] == "cpu", "temperature": 1.0, "top_k": 0,
        "gradient_checkpointing": False, "logging_steps": 1, "report_to": [], "save_strategy": "no",
        "disable_tqdm": True, "seed": spec.get("seed", 0), "peer_id": peer.get("peer_id", "alone"),
    }  # fmt: skip
    if peer:
        kwargs.update(exchange_url=peer["exchange_url"], expected_peers=peer["expected_peers"],
                      peer_timeout=peer.get("peer_timeout", 60))  # fmt: skip
    return FTISConfig(**kwargs)


def train(spec: dict, args, model, tokenizer, result: Result) -> None:
    """A few steps of the trainer; per step its split (`ftis/time/*`), loss, gradient norm and peer rows, saved into
    `result` as the record's `trainer` (also when training raises)."""
    t = spec["trainer"]
    record: dict = {"rows": t["rows"], "micro_batch": t["micro_batch"], "num_generations": t["num_generations"],
                    "max_completion_length": t["max_completion_length"], "steps_asked": t["steps"],
                    "cast_lm_head_to_fp32": args.cast_lm_head_to_fp32, "loss_type": args.loss_type}  # fmt: skip
    result.save(trainer=record)
    from datasets import Dataset  # the real one, or the set-up's stand-in (a list of rows)

    texts = prompts(
        max(256, 2 * t["rows"] * t["steps"]), seed=spec.get("seed", 0) + 10, style=spec.get("prompt_style", "word")
    )
    rows = [{"prompt": p} for p in texts]
    train_set = Dataset.from_list(rows)
    began = time.perf_counter()
    trainer = trainer_class()(model, even_ids_reward, args=args, train_dataset=train_set, processing_class=tokenizer,
                              callbacks=[watch_callback(record)])  # fmt: skip
    record["init_seconds"] = round(time.perf_counter() - began, 3)
    began = time.perf_counter()
    try:
        trainer.train()
    finally:
        record["train_seconds"] = round(time.perf_counter() - began, 3)
        steps = []
        for entry in trainer.state.log_history:
            if "ftis/time/step" not in entry:
                continue
            step = {name: entry.get(f"ftis/time/{name}", 0.0) for name in TIME_METRICS}
            step.update(step_number=entry.get("step"), loss=entry.get("loss"), grad_norm=entry.get("grad_norm"),
                        peer_rows=entry.get("ftis/peer_rows", 0.0),
                        peer_rows_filtered=entry.get("ftis/peer_rows_filtered", 0.0))  # fmt: skip
            steps.append(
                {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in step.items()}
            )
        record["steps"] = steps
        record["global_step"] = trainer.state.global_step
        result.save(trainer=record)


# ---- roles ---------------------------------------------------------------------------------------------------------
def run(spec: dict) -> int:
    import torch

    result = Result(spec["result"])
    result.save(role=spec["role"], stage=spec.get("stage"), started=time.time())
    threads = spec.get("threads")
    if threads:
        torch.set_num_threads(threads)
    try:
        result.save(environment=environment(spec["device"]))
        tokenizer = build_tokenizer(spec["shape"]["vocab_size"])
        began = time.perf_counter()
        model = build_model(spec, tokenizer)
        result.save(build_seconds=round(time.perf_counter() - began, 3),
                    parameters=sum(p.numel() for p in model.parameters()))  # fmt: skip
    except Exception as error:
        result.error("set-up", error)
        raise
    # The model is built before the trainer's config: under DeepSpeed ZeRO-3 the config turns on `zero.Init`; built
    # first, the model is initialised on the device as everywhere else, and partitioned when training starts.
    failed = False

    def attempt(part: str, function) -> None:
        nonlocal failed
        began = time.perf_counter()
        try:
            value = function()
        except Exception as error:  # noqa: BLE001 - recorded; the other parts still run
            traceback.print_exc()
            result.error(part, error)
            failed = True
            return
        if value is not None:
            result.save(**{part: value})
        result.save(**{f"{part}_part_seconds": round(time.perf_counter() - began, 3)})

    if spec.get("generation"):
        attempt("generation", lambda: time_generation(spec, model, tokenizer))
    if spec.get("trainer"):
        attempt("trainer", lambda: train(spec, trainer_config(spec), model, tokenizer, result))
    if spec.get("probe"):
        # Last, on a fresh copy of the initial weights (the same seed): a kernel that fails here cannot spoil the
        # trainer's figures, and weights a non-finite step left behind cannot spoil the probe's.
        attempt("probe", lambda: attention_probe(spec, build_model(spec, tokenizer), tokenizer))
    return 1 if failed else 0


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    return run(spec)


if __name__ == "__main__":
    sys.exit(main())
