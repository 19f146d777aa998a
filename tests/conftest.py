"""Shared fixtures: one torch thread, no Hugging Face Hub, tiny local models."""

import os

# Before torch/transformers are imported by any test module.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    from trl_ftis.demo.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def make_args(tmp_path):
    """FTISConfig (or another config class) with settings that run on a CPU in well under a second a step."""

    def make(config_class=None, **overrides):
        from trl_ftis import FTISConfig

        config_class = config_class or FTISConfig
        settings = dict(
            output_dir=str(tmp_path / "out"),
            bf16=False,
            gradient_checkpointing=False,
            use_cpu=True,
            per_device_train_batch_size=16,
            num_generations=8,
            max_completion_length=6,
            max_steps=2,
            learning_rate=1e-3,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            seed=0,
            dataloader_num_workers=0,
        )
        settings.update(overrides)
        return config_class(**settings)

    return make


# Registers the session-scoped `redis_url` fixture (a throwaway redis-server; tests skip when none can start).
from redis_server import redis_url  # noqa: E402,F401
