"""Shared fixtures: one torch thread, no Hugging Face Hub, tiny local models."""

import os
import uuid

# Before torch/transformers are imported by any test module.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests' hand-built peers take messages of any run, on purpose (an empty run id); the tests of the binding set
# or remove it (a peer with an exchange and no run id at all refuses to start).
os.environ.setdefault("FTIS_SWARM_RUN", "")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    from trl_ftis.demo.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def make_args(tmp_path):
    """FTISConfig (or another config class, e.g. TRL's GRPOConfig) with the tiny models' CPU settings
    (`trl_ftis.demo.tiny.tiny_grpo_config`), made smaller and faster for tests: well under a second a step."""

    def make(config_class=None, **overrides):
        from trl_ftis.demo.tiny import tiny_grpo_config

        settings = {
            "max_steps": 2,
            "per_device_train_batch_size": 16,  # 2 prompts x 8 completions
            "learning_rate": 1e-3,
        }
        settings.update(overrides)
        output_dir = settings.pop("output_dir", str(tmp_path / "out"))
        return tiny_grpo_config(output_dir, config_class=config_class, **settings)

    return make


class ScriptedLM:
    """Stands in for a causal LM in evaluation tests: `generate` appends, to each prompt, the token ids
    `reply(prompt_text)` returns (cut at `max_new_tokens`, right-padded). It records each call's decoded prompts and
    checks that evaluation runs it in eval mode, without gradient, left-padded and, by default, greedily."""

    def __init__(self, tokenizer, reply, *, expect_greedy: bool = True):
        self.tokenizer, self.reply, self.expect_greedy = tokenizer, reply, expect_greedy
        self.training = True
        self.device = torch.device("cpu")
        from transformers import GenerationConfig

        self.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        self.calls: list[list[str]] = []

    def eval(self):
        return self.train(False)

    def train(self, mode=True):
        self.training = mode
        return self

    def generate(self, input_ids, attention_mask, generation_config, **kwargs):
        assert not self.training and not torch.is_grad_enabled()
        assert not (self.expect_greedy and generation_config.do_sample)
        assert self.tokenizer.padding_side == "left"  # batched prompts must end where generation starts
        prompts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        self.calls.append(prompts)
        rows = [list(self.reply(prompt))[: generation_config.max_new_tokens] for prompt in prompts]
        width = max(map(len, rows))
        padded = [row + [self.tokenizer.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(padded)], dim=1)


@pytest.fixture
def scripted_lm():
    """The :class:`ScriptedLM` class, for tests that need a language model whose replies they choose."""
    return ScriptedLM


# Registers the session-scoped `redis_url` fixture (a throwaway redis-server; tests skip when none can start).
from redis_server import redis_url  # noqa: E402,F401


@pytest.fixture(params=["memory", "dir"])
def url(request, tmp_path):
    """A fresh exchange on each transport that needs no server (modules with a memory-only `url` define their own)."""
    if request.param == "memory":
        return f"memory://{request.module.__name__}-{uuid.uuid4().hex}"
    return f"dir://{tmp_path / 'exchange'}"


@pytest.fixture
def memory_url(request):
    """A fresh in-process exchange."""
    return f"memory://{request.module.__name__}-{uuid.uuid4().hex}"

