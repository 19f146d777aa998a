"""The one generation loop of the tasks' evaluations: batched, left-padded `model.generate` without gradients, each
completion cut at its first stop token.

[`trl_ftis.tasks.addition.greedy_accuracy`], [`trl_ftis.tasks.word_problems.evaluate_problems`] and
[`trl_ftis.tasks.math_problems.evaluate_math`] all generate through [`generate_completions`] and differ only
in how they render prompts, which tokens stop a completion and how they score it. (The trainer's record of
generator log-probs is [`trl_ftis.generator_logps`].)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["Completion", "default_stop_ids", "generate_completions", "render_prompt", "stop_token_ids"]


class Completion(NamedTuple):
    """One generated completion."""

    #: The decoded text before the first stop token (special tokens skipped).
    text: str
    #: Tokens generated, the stop token included.
    n_tokens: int
    #: True when no stop token came (the completion ran into `max_new_tokens`).
    truncated: bool


def default_stop_ids(tokenizer, model=None) -> list[int]:
    """The tokenizer's EOS id and the ids the model's generation config declares as EOS, without repeats."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.extend([declared] if isinstance(declared, int) else list(declared or []))
    return list(dict.fromkeys(ids))


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS, the model's generation-config EOS ids and the chat
    template's end-of-turn token (e.g. Qwen's `<|im_end|>`, which base models do not list as EOS: without it a
    greedy completion runs on into a new turn and fails the strict format)."""
    ids = default_stop_ids(tokenizer, model)
    end_of_turn = _end_of_turn_token_id(tokenizer)
    if end_of_turn is not None:
        ids.append(end_of_turn)
    return list(dict.fromkeys(ids))


def _end_of_turn_token_id(tokenizer) -> int | None:
    """The special token the chat template writes right after an assistant message, if any."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "Zq7ANSWERzq7"
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": marker}], tokenize=False
        )
    except Exception:  # noqa: BLE001 - a template that refuses this conversation: rely on the declared EOS ids
        return None
    suffix = rendered.split(marker, 1)[-1] if marker in rendered else ""
    ids = tokenizer(suffix, add_special_tokens=False)["input_ids"] if suffix else []
    if not ids:
        return None
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    token = added.get(ids[0])
    return ids[0] if token is not None and getattr(token, "special", False) else None


def render_prompt(tokenizer, prompt: str | Sequence[dict]) -> str:
    """A prompt as the text the model continues: a string as it is, a conversation (a list of chat messages)
    through the tokenizer's chat template with the generation prompt."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)


def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[str | Sequence[dict]],
    *,
    max_new_tokens: int,
    batch_size: int,
    stop_ids: Sequence[int] | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    num_samples: int = 1,
    seed: int | None = None,
    sort_by_length: bool = False,
) -> list[Completion]:
    """Generate for every prompt and cut each completion at its first stop token.

    `prompts` are texts (tokenized as they are, without special tokens) or conversations (rendered with the chat
    template, [`render_prompt`]). They go through `model.generate` in batches of `batch_size`, left-padded,
    in eval mode and without gradients; the model's train mode and the tokenizer's padding side are restored
    afterwards, even on an error. `stop_ids` end a completion (default [`default_stop_ids`]); any
    generation setting not given here comes from `model.generation_config`.

    Greedy by default. `do_sample=True` draws `num_samples` completions a prompt with `temperature`,
    `top_p` and `top_k` (0: off). `seed`, if given, seeds torch's RNG for the call inside
    `torch.random.fork_rng` (the global RNG state is left as it was). `sort_by_length` batches the prompts
    longest first (less padding); the results are in prompt order either way.

    Returns one [`Completion`] `(text, n_tokens, truncated)` a prompt, or with `num_samples > 1` the
    `num_samples` completions of each prompt one after another.
    """
    import contextlib

    import torch
    from transformers import GenerationConfig

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    repeat = num_samples if do_sample else 1
    stop_ids = list(stop_ids) if stop_ids is not None else default_stop_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(stop_ids), None)
    sampling: dict[str, Any] = {"do_sample": do_sample}
    if do_sample:
        sampling.update(temperature=temperature, top_p=top_p, top_k=top_k)
    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        num_return_sequences=repeat,
        pad_token_id=pad_id,
        eos_token_id=stop_ids,
        **sampling,
    )
    rendered = [render_prompt(tokenizer, prompt) for prompt in prompts]
    order = list(range(len(rendered)))
    if sort_by_length:
        order.sort(key=lambda i: len(rendered[i]), reverse=True)
    completions: list[list[Completion]] = [[] for _ in rendered]

    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    seeded = torch.random.fork_rng() if seed is not None else contextlib.nullcontext()
    try:
        with torch.no_grad(), seeded:
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                encoded = tokenizer(
                    [rendered[i] for i in chunk], return_tensors="pt", padding=True, add_special_tokens=False
                ).to(model.device)
                output = model.generate(**encoded, generation_config=generation_config)
                generated = output[:, encoded["input_ids"].shape[1] :].tolist()
                for row, tokens in enumerate(generated):
                    completions[chunk[row // repeat]].append(_cut_at_stop(tokenizer, tokens, stop_ids))
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return [completion for per_prompt in completions for completion in per_prompt]


def _cut_at_stop(tokenizer, generated: list[int], stop_ids: Sequence[int]) -> Completion:
    """(text before the first stop token, tokens generated including it, whether no stop token came)."""
    for index, token in enumerate(generated):
        if token in stop_ids:
            return Completion(tokenizer.decode(generated[:index], skip_special_tokens=True), index + 1, False)
    return Completion(tokenizer.decode(generated, skip_special_tokens=True), len(generated), True)
