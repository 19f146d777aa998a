"""CUDA checks, run where a GPU is present (skipped elsewhere): bf16 training with peer rows, generator log-probs
recorded during `generate` against teacher forcing, and the per-peer GPU memory share."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from trl_ftis import FTISConfig, FTISTrainer, PeerRow
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def gpu_args(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, num_generations=8,
        max_completion_length=6, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[],
        save_strategy="no", seed=0, bf16=False, gradient_checkpointing=False, preset="paper",
    )  # fmt: skip
    settings.update(overrides)
    return FTISConfig(**settings)


def peer_rows(count=8):
    return [
        PeerRow(prompt="12+34=", completion_ids=[8, 9, 2], generator_logps=[-0.5, -1.0, -0.25], reward=float(k),
                group="g", sender="other", rewards_per_func={"digit_match_reward": float(k)}, extra={"answer": "46"})
        for k in range(count)
    ]  # fmt: skip


def test_bf16_training_with_peer_rows_on_the_gpu(tokenizer, tmp_path):
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer), digit_match_reward, args=gpu_args(tmp_path, bf16=True),
        train_dataset=addition_dataset(64, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    assert trainer.args.cast_lm_head_to_fp32 and trainer.model.device.type == "cuda"
    before = {name: p.detach().float().clone() for name, p in trainer.model.named_parameters()}
    trainer.add_peer_rows(peer_rows())
    trainer.train()
    (first, *_) = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert first["ftis/peer_rows"] == 8 and 0 < first["ftis/peers/other/is_weight_mean"] <= trainer.args.is_cap
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach().float(), before[n])]
    assert changed


def test_recorded_generator_logps_match_teacher_forcing_on_the_gpu(tokenizer, tmp_path):
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer, seed=2), digit_match_reward, args=gpu_args(tmp_path, max_steps=1),
        train_dataset=addition_dataset(64, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    published = []
    trainer.add_row_listener(published.append)
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer._recorded_logps is not None  # recorded during generate, not recomputed
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            p.copy_(start[name])  # the generator's weights
    (rows,) = published
    for row in rows[:6]:
        prompt = tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + list(row.completion_ids)], device="cuda")
        with torch.no_grad():
            logits = trainer.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / trainer.temperature
        expected = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0].cpu()
        torch.testing.assert_close(torch.tensor(row.generator_logps), expected, atol=2e-3, rtol=0)


def test_the_gpu_memory_fraction_caps_the_allocator(tmp_path):
    """`gpu_memory_fraction` (what the launcher's `gpu_share` passes) caps PyTorch's allocator on the peer's GPU."""
    script = textwrap.dedent(
        """
        import torch
        from trl_ftis import FTISConfig, FTISTrainer
        from trl_ftis.tasks.addition import addition_dataset, digit_match_reward
        from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama

        tokenizer = build_char_tokenizer()
        args = FTISConfig(output_dir=%r, max_steps=1, per_device_train_batch_size=8, num_generations=8,
                          report_to=[], bf16=False, gpu_memory_fraction=0.05)
        FTISTrainer(build_tiny_llama(tokenizer), digit_match_reward, args=args,
                    train_dataset=addition_dataset(16, seed=0), processing_class=tokenizer)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.empty(int(0.02 * total), dtype=torch.uint8, device="cuda")  # inside the 5%% share
        try:
            torch.empty(int(0.10 * total), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("CAPPED")
        """
        % str(tmp_path / "out")
    )
    env = {key: value for key, value in os.environ.items() if key != "FTIS_GPU_MEMORY_FRACTION"}  # the field only
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CAPPED" in done.stdout


@pytest.mark.parametrize("accelerate_config", ["single_gpu.yaml", "deepspeed_zero2.yaml"])
def test_the_gsm8k_example_under_accelerate_on_the_gpu(tmp_path, accelerate_config):
    """`accelerate launch --config_file examples/accelerate/<config> examples/gsm8k_ftis.py`, two steps, one GPU."""
    if "deepspeed" in accelerate_config:
        pytest.importorskip("deepspeed")
    pytest.importorskip("math_verify")
    import json

    import yaml

    from trl_ftis.demo.tiny import PRINTABLE_ALPHABET, SYSTEM_CHAT_TEMPLATE, build_char_tokenizer

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    model_dir = tmp_path / "model"
    tokenizer = build_char_tokenizer(SYSTEM_CHAT_TEMPLATE, alphabet=PRINTABLE_ALPHABET)
    build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, max_position_embeddings=1024).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    train = tmp_path / "train.jsonl"
    train.write_text(
        "\n".join(json.dumps({"question": f"What is {a} + 2?", "answer": f"#### {a + 2}"}) for a in range(8)) + "\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": str(model_dir),
                "dataset_path": str(train),
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 2,
                "num_generations": 4,
                "max_completion_length": 16,
                "learning_rate": 1e-3,
                "bf16": True,
                "logging_steps": 1,
                "report_to": "none",
                "save_strategy": "no",
                "disable_tqdm": True,
            }  # fmt: skip
        )
    )
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        os.path.join(root, "examples", "accelerate", accelerate_config),
        "--num_processes",
        "1",
        os.path.join(root, "examples", "gsm8k_ftis.py"),
        "--config",
        str(config),
        "--peer_id",
        "gpu-peer",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="disabled", CUDA_VISIBLE_DEVICES="0")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
