"""Generator log-probs recorded during the generation pass itself (no extra forward): what `FTISTrainer` hands out
with its own rows. (Named apart from `trl_ftis.tasks.generation`, the evaluations' decoding loop.)"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# Options that make `generate` insert logits processors *before* user-supplied ones. With any of them set, a recorder
# would see processed scores, which differ from the learner's full-softmax log-probs.
_PRE_PROCESSING_OPTIONS = {
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "min_new_tokens": (None, 0),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
}


# Sampling warpers that `generate` applies after user-supplied processors and that the recorder does not replay.
_UNREPLAYED_WARPERS = {
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "top_h": (None,),
}


def sampling_warpers(generation_config: GenerationConfig) -> LogitsProcessorList:
    """transformers' top-k, top-p and min-p warpers of `generation_config`, in the order `generate` applies them
    after the temperature (none when sampling from the full distribution)."""
    warpers = LogitsProcessorList()
    top_k, top_p, min_p = (getattr(generation_config, name, None) for name in ("top_k", "top_p", "min_p"))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=int(top_k)))
    if top_p is not None and top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=float(top_p)))
    if min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=float(min_p)))
    return warpers


def records_raw_logits(generation_config: GenerationConfig) -> bool:
    """Whether a logits processor passed to `generate` sees the model's raw logits under this config, and the
    distribution sampled from is the temperature's with at most top-k, top-p and min-p ([`sampling_warpers`])."""
    for name, neutral in {**_PRE_PROCESSING_OPTIONS, **_UNREPLAYED_WARPERS}.items():
        value = getattr(generation_config, name, None)
        if value not in neutral and value != []:
            return False
    min_length = getattr(generation_config, "min_length", None)
    return not min_length  # min_length > 0 suppresses EOS before user processors run


class GeneratorLogpsRecorder(LogitsProcessor):
    """A pass-through logits processor that records the log-prob of each sampled token under the distribution
    `generate` sampled it from: `log_softmax(warpers(logits / T))`, with `warpers` the top-k / top-p / min-p of the
    generation config ([`sampling_warpers`]; none: the full softmax at the temperature).

    At step `t` it sees the scores for token `t` and, in `input_ids`, the token sampled at step `t-1`, so it
    only keeps one step of log-probs in memory. Call [`finish`] with the returned sequences to score the last token.
    """

    def __init__(self, temperature: float = 1.0, warpers: LogitsProcessorList | None = None):
        self.temperature = float(temperature)
        self.warpers = warpers or LogitsProcessorList()
        self._steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._steps.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(self.warpers(input_ids, scores.float() / self.temperature), dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """Per-token log-probs of the generated part, shape `(B, new_tokens)`, fp32."""
        if self._pending is not None:
            self._steps.append(self._pending.gather(1, sequences[:, -1:]).squeeze(1))
            self._pending = None
        steps, self._steps = self._steps, []
        if not steps:
            return torch.zeros((sequences.shape[0], 0), dtype=torch.float32, device=sequences.device)
        return torch.stack(steps, dim=1)


@contextmanager
def generate_with(model, recorder: GeneratorLogpsRecorder):
    """Temporarily route `model.generate` through `recorder` (a pass-through logits processor); yields a dict whose
    `"logps"` holds the recorded per-token log-probs (on the CPU) once `generate` has run."""
    original = model.generate
    recorded: dict[str, torch.Tensor] = {}

    def generate(*args, **kwargs):
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(recorder)
        sequences = original(*args, logits_processor=processors, **kwargs)
        recorded["logps"] = recorder.finish(sequences).cpu()
        return sequences

    model.generate = generate
    try:
        yield recorded
    finally:
        del model.generate  # back to the class method


def ties_embeddings(model) -> bool:
    """Whether `model` (or the checkpoint a string names) ties its output head to its input embeddings: then TRL
    cannot cast a LoRA model's head to fp32 (`cast_lm_head_to_fp32`)."""
    if isinstance(model, str):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model)
    else:
        config = model.config
    return bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
