"""Tiny models and a character tokenizer, built locally in seconds, and the one CPU training config they use.

They make tests, the quick demo and the CPU benchmarks independent of the Hugging Face Hub: a Llama with hidden
size 64 and 2 layers learns 2-digit addition ([`trl_ftis.tasks.addition`], `"23+48="` -> `"71<eos>"`) on a
2-core CPU in under a minute.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

ALPHABET = "0123456789+-*=QA: "
#: Every printable ASCII character plus newline: enough for GSM8K-style text (anything else becomes `<unk>`).
PRINTABLE_ALPHABET = "".join(chr(code) for code in range(32, 127)) + "\n"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")

# A minimal chat template, so the tiny tokenizer also serves conversational prompts.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}Q:{{ message['content'] }}"
    "{% else %}A:{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)

# With a system message and role names, for the printable alphabet (e.g. the R1-style GSM8K prompts).
SYSTEM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}System: {{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)


def build_char_tokenizer(
    chat_template: str | None = CHAT_TEMPLATE, *, alphabet: str = ALPHABET
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over `alphabet` plus `<pad> <bos> <eos> <unk>`, padding on the left.

    The default [`ALPHABET`] covers the addition task; ``alphabet=PRINTABLE_ALPHABET,
    chat_template=SYSTEM_CHAT_TEMPLATE`` encodes word problems and R1-style prompts.
    """
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in alphabet:
        vocab.setdefault(char, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()  # characters join without spaces
    return _wrap(backend, chat_template)


def _wrap(backend: Tokenizer, chat_template: str | None) -> PreTrainedTokenizerFast:
    """`backend` as a transformers tokenizer with [`SPECIAL_TOKENS`] in their roles, padding on the left."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def build_bpe_tokenizer(
    corpus: Sequence[str] | None = None,
    *,
    vocab_size: int = 160,
    alphabet: str = ALPHABET,
    chat_template: str | None = CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A BPE tokenizer trained in a fraction of a second on `corpus` (default: every `"a+b=c"` of 2-digit addition),
    over `alphabet` plus the character tokenizer's special tokens, padding on the left.

    Its tokens are pieces of numbers (`"23"`, `"147"`, ...): token ids mean something else than the character
    tokenizer's, and a completion is fewer tokens. Peers using both form a swarm of genuinely different tokenizers
    (`cross_tokenizer`). Characters outside `alphabet` become `<unk>`.
    """
    from tokenizers import trainers

    if corpus is None:
        corpus = [f"{a}+{b}={a + b}" for a in range(100) for b in range(100)]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d+"), behavior="isolated")  # merges within numbers
    backend.decoder = decoders.Fuse()  # pieces join without spaces
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=list(alphabet),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    return _wrap(backend, chat_template)


#: The tokenizers [`build_tokenizer`] builds: `char` (one token a character) and `bpe` (multi-character pieces).
TINY_TOKENIZERS = ("char", "bpe")


def build_tokenizer(kind: str = "char") -> PreTrainedTokenizerFast:
    """The tiny task's tokenizer of `kind` ([`TINY_TOKENIZERS`])."""
    if kind == "char":
        return build_char_tokenizer()
    if kind == "bpe":
        return build_bpe_tokenizer()
    raise ValueError(f"Unknown tokenizer {kind!r}; expected one of {', '.join(TINY_TOKENIZERS)}.")


def build_tiny_llama(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    max_position_embeddings: int = 64,
) -> LlamaForCausalLM:
    """A randomly initialised Llama sized for the character tokenizer (about 133k parameters by default).

    Raise `max_position_embeddings` for longer texts (a character a token: an R1-style prompt is ~600).
    """
    return build_tiny_causal_lm(
        tokenizer,
        "llama",
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        seed=seed,
        max_position_embeddings=max_position_embeddings,
    )


#: The decoder architectures [`build_tiny_causal_lm`] builds; all share the character tokenizer, so peers of different
#: architectures can trade token ids.
TINY_ARCHITECTURES = ("llama", "qwen2", "mistral", "gemma2")


def _tiny_family(architecture: str, max_position_embeddings: int, head_dim: int):
    """`(config class, model class, family-specific config fields)` of `architecture`."""
    import transformers

    if architecture == "llama":
        return LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False}
    if architecture == "qwen2":
        return transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": False}
    if architecture == "mistral":
        extra = {"sliding_window": max_position_embeddings, "tie_word_embeddings": False}
        return transformers.MistralConfig, transformers.MistralForCausalLM, extra
    if architecture == "gemma2":
        extra = {"head_dim": head_dim, "sliding_window": max_position_embeddings}
        return transformers.Gemma2Config, transformers.Gemma2ForCausalLM, extra
    raise ValueError(f"Unknown architecture {architecture!r}; expected one of {', '.join(TINY_ARCHITECTURES)}.")


def build_tiny_causal_lm(
    tokenizer: PreTrainedTokenizerFast,
    architecture: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    max_position_embeddings: int = 64,
):
    """A randomly initialised tiny causal LM of `architecture` ([`TINY_ARCHITECTURES`]) for the character tokenizer:
    the same sizes in each family's code (Llama; Qwen2's attention biases, Mistral's sliding window, Gemma2's
    soft-capping, tied embeddings and normalisation), for swarms that mix architectures."""
    config_class, model_class, extra = _tiny_family(architecture, max_position_embeddings, hidden_size // num_heads)
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


#: The CPU settings of GRPO with these tiny models on the addition task: 16 prompts x 8 completions of at most 6
#: tokens a step, constant lr 2e-4 (5e-4 wrecks the policy), fp32, no gradient checkpointing, no tqdm bars.
#: [`tiny_grpo_config`] builds a config from them; scripts that pass flags to a peer process use them directly.
TINY_GRPO_SETTINGS = {
    "per_device_train_batch_size": 128,
    "num_generations": 8,
    "max_completion_length": 6,
    "learning_rate": 2e-4,
    "lr_scheduler_type": "constant",
    "bf16": False,
    "gradient_checkpointing": False,
    "use_cpu": True,
    "logging_steps": 1,
    "report_to": [],
    "save_strategy": "no",
    "disable_tqdm": True,
}


def tiny_grpo_config(output_dir: str, *, max_steps: int, seed: int = 0, config_class=None, **overrides):
    """A config for GRPO with these tiny models on a CPU ([`TINY_GRPO_SETTINGS`], then `overrides`).

    `config_class` is `FTISConfig` by default; TRL's `GRPOConfig` (or any subclass of it) gets the same settings.
    An `FTISConfig` starts from the paper's preset (`preset="paper"`, unless `overrides` name another or `None`),
    which the demo, the benchmarks and most tests measure. This is the one source of the tiny CPU settings: the
    tests' `make_args` fixture, the quick demo and the CPU benchmarks all start from it.
    """
    from ..config import FTISConfig

    if config_class is None:
        config_class = FTISConfig
    settings = {"output_dir": output_dir, "max_steps": max_steps, "seed": seed, **copy.deepcopy(TINY_GRPO_SETTINGS)}
    if issubclass(config_class, FTISConfig):
        settings["preset"] = "paper"
    settings.update(overrides)
    return config_class(**settings)


def warmup_dev_problems(n: int, *, seed: int, digits: int = 2) -> list[dict]:
    """`n` distinct addition problems of the early-stopping split (`trl_ftis.tasks.addition.in_dev_split`) drawn
    with `seed`: the dev set of [`supervised_warmup`], disjoint from every held-out evaluation set (`split="test"`);
    [`supervised_warmup`] leaves them out of its own training batches."""
    from ..tasks.addition import addition_problems

    return addition_problems(n, seed=seed, digits=digits, split="dev")


def supervised_warmup(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[dict],
    *,
    steps: int = 400,
    batch_size: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    target_accuracy: float | None = None,
    dev_problems: Sequence[dict] | None = None,
    eval_every: int = 50,
) -> int:
    """Teach `model` the task by next-token prediction on `prompt + answer + <eos>` (loss on the answer only,
    [`trl_ftis.demo.supervised.supervised_steps`]), on `batch_size` problems drawn with `seed` a step.

    Stops after `steps` steps, or earlier once greedy accuracy on `dev_problems` reaches `target_accuracy`
    (GRPO needs a non-zero starting reward, and a model that already solves the task leaves nothing to learn).
    Draw `dev_problems` with [`warmup_dev_problems`]: they are then disjoint from every held-out evaluation set
    (`split="test"`); dev problems inside that split are used but warned about, since stopping on them selects the
    starting model on the evaluation problems. Problems of `dev_problems` are left out of the training batches.
    Returns the number of steps taken.
    """
    from ..tasks.addition import greedy_accuracy, in_test_split
    from .supervised import supervised_steps

    if dev_problems:
        held_out = sum(in_test_split(p["prompt"]) for p in dev_problems)
        if held_out:
            logger.warning(
                "%d of the %d early-stopping problems are in the addition task's held-out split, which evaluations "
                "draw from: draw them with trl_ftis.demo.tiny.warmup_dev_problems.",
                held_out,
                len(dev_problems),
            )
        dev_prompts = {p["prompt"] for p in dev_problems}
        problems = [p for p in problems if p["prompt"] not in dev_prompts]

    def batches():
        generator = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            index = torch.randint(len(problems), (batch_size,), generator=generator).tolist()
            batch = [problems[i] for i in index]
            prompts = tokenizer([p["prompt"] for p in batch], add_special_tokens=False)["input_ids"]
            answers = tokenizer([p["answer"] for p in batch], add_special_tokens=False)["input_ids"]
            yield [(p, a + [tokenizer.eos_token_id]) for p, a in zip(prompts, answers, strict=True)]

    def reached_target(step: int, loss: float) -> bool:
        if target_accuracy is None or not dev_problems or step % eval_every != 0:
            return False
        return greedy_accuracy(model, tokenizer, dev_problems) >= target_accuracy

    taken, _ = supervised_steps(model, batches(), lr=lr, pad_id=tokenizer.pad_token_id, on_step=reached_target)
    return taken
