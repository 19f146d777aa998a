"""What TRL users plug in around the trainer: trackers (wandb, trackio), run names, GPU sharing, vLLM's log-probs."""

import glob
import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import torch

from trl_ftis import FTISConfig, FTISTrainer, PeerRow
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.rules import GPU_MEMORY_FRACTION_ENV
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward


def test_each_peer_run_is_named_after_the_peer(tmp_path):
    assert FTISConfig(str(tmp_path), peer_id="qwen-3b", use_cpu=True).run_name == "qwen-3b"
    assert FTISConfig(str(tmp_path), peer_id="qwen-3b", run_name="mine", use_cpu=True).run_name == "mine"
    assert FTISConfig(str(tmp_path), run_name="from-run", use_cpu=True).peer_id == "from-run"


def _capped(monkeypatch, tokenizer, args) -> list[float]:
    """The fractions `FTISTrainer.__init__` capped GPU memory to, building a trainer with `args`."""
    capped = []
    monkeypatch.setattr("trl_ftis.trainer.cap_gpu_memory", lambda fraction, config: capped.append(fraction))
    FTISTrainer(
        build_tiny_llama(tokenizer), digit_match_reward, args=args,
        train_dataset=addition_dataset(16, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    return capped


def test_the_trainer_caps_gpu_memory_from_the_config_field_not_the_environment(monkeypatch, tokenizer, make_args):
    monkeypatch.setenv(GPU_MEMORY_FRACTION_ENV, "0.3")  # what the launcher used to set: no longer read
    assert _capped(monkeypatch, tokenizer, make_args(max_steps=1)) == []
    assert _capped(monkeypatch, tokenizer, make_args(max_steps=1, gpu_memory_fraction=0.45)) == [0.45]


@pytest.mark.parametrize("value", [0.0, 1.5, -0.2, float("nan")])
def test_a_bad_gpu_share_is_refused_by_name(tmp_path, value):
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        FTISConfig(str(tmp_path), use_cpu=True, report_to=[], gpu_memory_fraction=value)


def test_a_gpu_share_on_a_cpu_run_trains_normally(tokenizer, make_args):
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer), digit_match_reward, args=make_args(max_steps=1, gpu_memory_fraction=0.3),
        train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1


def test_vllm_processed_logprobs_never_travel(tokenizer, make_args):
    """With vLLM, TRL's batch carries vLLM's `processed_logprobs` (after top-k/top-p) as `sampling_per_token_logps`
    and, for its own importance correction, `old_per_token_logps` (teacher-forced, full softmax at the sampling
    temperature, fp32 head). Peers get the latter: the convention every generator's log-probs follow."""
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer), digit_match_reward, args=make_args(max_steps=1),
        train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    old = -torch.rand(2, 3)
    output = {"completion_mask": mask, "old_per_token_logps": old, "sampling_per_token_logps": old - 0.7}
    logps = trainer._own_generator_logps(output)
    assert logps == [old[0].tolist(), old[1, :2].tolist()]

    # vLLM without its importance correction: TRL makes no old log-probs, so one teacher-forced forward does.
    prompt = tokenizer(["12+34=", "50+7="], padding=True, return_tensors="pt", add_special_tokens=False)
    completion = torch.tensor([[8, 9, 2], [10, 4, 0]])
    output = {
        "prompt_ids": prompt["input_ids"], "prompt_mask": prompt["attention_mask"],
        "completion_ids": completion, "completion_mask": mask, "sampling_per_token_logps": old - 0.7,
    }  # fmt: skip
    logps = trainer._own_generator_logps(output)
    expected = trainer._completion_logps(trainer.model, output)
    assert logps[0] == pytest.approx(expected[0].tolist()) and logps[1] == pytest.approx(expected[1, :2].tolist())
    assert len(logps[1]) == 2


REPORTING_SCRIPT = textwrap.dedent(
    """
    import sys
    from trl_ftis import FTISConfig, FTISTrainer, PeerRow
    from trl_ftis.tasks.addition import addition_dataset, digit_match_reward
    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    args = FTISConfig(
        output_dir=sys.argv[1], report_to=sys.argv[2].split(","), peer_id="big", project="swarm-test",
        bf16=False, use_cpu=True, per_device_train_batch_size=16, num_generations=8, max_completion_length=6,
        max_steps=1, logging_steps=1, save_strategy="no", disable_tqdm=True,
    )
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer), digit_match_reward, args=args, train_dataset=addition_dataset(32, seed=1),
        processing_class=tokenizer,
    )
    trainer.add_peer_rows(
        PeerRow(prompt="12+34=", completion_ids=[8, 9, 2], generator_logps=[-0.5, -1.0, -0.25], reward=float(k),
                group="g", sender="coder", rewards_per_func={"digit_match_reward": float(k)}, extra={"answer": "46"})
        for k in range(8)
    )
    trainer.train()
    """
)


def run_reporting(tmp_path, report_to):
    script = tmp_path / "report.py"
    script.write_text(REPORTING_SCRIPT)
    env = dict(
        os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"), WANDB_SILENT="true",
        TRACKIO_DIR=str(tmp_path / "trackio"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
    )  # fmt: skip
    (tmp_path / "wandb").mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out"), report_to],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_wandb_gets_the_per_peer_metrics_under_the_peer_name(tmp_path):
    pytest.importorskip("wandb")
    run_reporting(tmp_path, "wandb")
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = open(run_file, "rb").read()  # protobuf records: keys and names are stored as plain strings
    for key in ("ftis/peers/coder/is_weight_mean", "ftis/peers/coder/kl_mean", "ftis/peer_rows", "ftis/own/kl_max"):
        assert key.encode() in data, key
    assert b"big" in data


def test_trackio_gets_the_per_peer_metrics_under_the_peer_name(tmp_path):
    pytest.importorskip("trackio")
    run_reporting(tmp_path, "trackio")
    database = sqlite3.connect(tmp_path / "trackio" / "swarm-test.db")
    rows = database.execute("select run_name, metrics from metrics").fetchall()
    assert {name for name, _ in rows} == {"big"}
    logged = {}
    for _, metrics in rows:
        logged.update(json.loads(metrics))
    assert logged["train/ftis/peer_rows"] == 8
    assert 0 < logged["train/ftis/peers/coder/is_weight_mean"] <= 2.0  # the truncation cap C
    assert "train/ftis/peers/coder/rows_filtered" in logged


def test_secrets_never_reach_trackers_logs_or_saved_arguments(tmp_path):
    import pickle

    args = FTISConfig(
        str(tmp_path), use_cpu=True, swarm_secret="s3cret-value", exchange_url="redis://:hunter2@redis.local:6379/0"
    )
    saved = args.redacted_copy()  # what the trainer writes to training_args.bin (see tests/test_secrets.py)
    for text in (json.dumps(args.to_dict()), str(args), repr(args), pickle.dumps(saved).decode("latin-1")):
        assert "s3cret-value" not in text and "hunter2" not in text
    assert pickle.loads(pickle.dumps(args)).swarm_secret == "s3cret-value"  # a pickled copy still trains
    assert args.to_dict()["exchange_url"] == "redis://:<redacted>@redis.local:6379/0"
    assert args.exchange_url.endswith(":hunter2@redis.local:6379/0")  # the live object still connects
    plain = FTISConfig(str(tmp_path), use_cpu=True, exchange_url="dir:///tmp/swarm")
    assert plain.to_dict()["exchange_url"] == "dir:///tmp/swarm"


class FakeVLLM:
    """Stands in for TRL's `VLLMGeneration` (colocate or server): one completion per prompt entry, with
    'processed' log-probs that are deliberately not the model's, as top-k/top-p processed scores would be."""

    def __init__(self, eos_token_id: int, processed_logp: float = -0.05):
        self.eos_token_id = eos_token_id
        self.processed_logp = processed_logp
        self.generator = torch.Generator().manual_seed(0)
        self.calls = 0

    def sync_weights(self):
        pass

    def generate(self, prompts, images=None, num_generations=1, profiler=None):
        self.calls += 1
        completions = []
        for _ in prompts:
            length = int(torch.randint(1, 5, (1,), generator=self.generator))
            digits = torch.randint(4, 14, (length,), generator=self.generator).tolist()  # '0'..'9'
            completions.append(digits + [self.eos_token_id])
        logprobs = [[[self.processed_logp] for _ in ids] for ids in completions]
        return prompts, completions, logprobs, [[[t] for t in ids] for ids in completions]


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])  # TRL's ratio: (B, 1) or (B, T)
def test_vllm_generation_joins_the_swarm_with_teacher_forced_logps(tokenizer, make_args, mode):
    """TRL's vLLM branch end to end on the CPU (generation faked): own rows are published with the learner's
    teacher-forced log-probs, peer rows train with them, and TRL's vLLM correction stays on its own rows only."""
    import uuid

    from trl_ftis.exchange import tokenizer_fingerprint
    from trl_ftis.swarm import Swarm

    url = f"memory://vllm-{uuid.uuid4().hex}"
    observer = Swarm(
        url, peer_id="observer", tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), tokenizer_name="char",
        vocab_limit=len(tokenizer), temperature=1.0, reward_names=["digit_match_reward"], peer_timeout=5.0,
    )  # fmt: skip
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer, seed=4), digit_match_reward,
        args=make_args(max_steps=1, exchange_url=url, peer_id="vllm-peer"),
        train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    sender = Swarm(
        url, peer_id="other", tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), tokenizer_name="char",
        vocab_limit=len(tokenizer), temperature=1.0, reward_names=["digit_match_reward"],
    )  # fmt: skip
    sender.publish(
        [
            PeerRow(
                prompt="12+34=",
                completion_ids=[8, 9, 2],
                generator_logps=[-0.5, -1.0, -0.25],
                reward=float(k),
                group="g",
                sender="other",
                rewards_per_func={"digit_match_reward": float(k)},
                extra={"answer": "46"},
            )
            for k in range(8)
        ],  # fmt: skip
        0,
    )
    start = build_tiny_llama(tokenizer, seed=4)
    fake = FakeVLLM(tokenizer.eos_token_id)
    trainer.use_vllm, trainer.vllm_generation, trainer.vllm_importance_sampling_correction = True, fake, True
    trainer._last_loaded_step = -1  # set by GRPOTrainer.__init__ only when use_vllm
    trainer.vllm_importance_sampling_mode = mode
    trainer.train()
    assert fake.calls == 1 and trainer.state.global_step == 1
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peer_rows"] == 8 and math.isfinite(entry["grad_norm"]) and entry["grad_norm"] > 0
    assert 0 < entry["ftis/peers/other/is_weight_mean"] <= trainer.args.is_cap
    rows = [row for row in observer.collect(0).rows if row.sender == "vllm-peer"]
    assert len(rows) == 16 and {row.sender for row in rows} == {"vllm-peer"}
    for row in rows[:5]:
        prompt = tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + list(row.completion_ids)])
        with torch.no_grad():
            logits = start(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        expected = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        torch.testing.assert_close(torch.as_tensor(row.generator_logps), expected, atol=1e-5, rtol=0)
        assert not torch.allclose(torch.as_tensor(row.generator_logps), torch.full_like(expected, -0.05))


def test_push_to_hub_uploads_the_ftis_card_and_no_secret(tokenizer, make_args, monkeypatch):
    """`trainer.push_to_hub()` with the Hub replaced by a recorder: what would be uploaded is read at upload time."""
    import uuid
    from types import SimpleNamespace

    import transformers.trainer

    uploaded = {}

    class FakeHub:
        def create_repo(self, repo_id, **kwargs):
            return SimpleNamespace(repo_id=f"someone/{repo_id}")

        def upload_folder(self, repo_id, folder_path, **kwargs):
            folder = folder_path
            uploaded["repo_id"] = repo_id
            uploaded["files"] = sorted(os.listdir(folder))
            uploaded["card"] = open(os.path.join(folder, "README.md")).read()
            uploaded["args"] = open(os.path.join(folder, "training_args.bin"), "rb").read()
            return SimpleNamespace(commit_url="fake")

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeHub())
    url = f"memory://hub-{uuid.uuid4().hex}"
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer), digit_match_reward,
        args=make_args(max_steps=1, exchange_url=url, peer_id="big", swarm_secret="s3cret-value", variant="f-vis",
                       hub_model_id="tiny-ftis-big"),
        train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    trainer.push_to_hub(dataset_name="addition")
    assert uploaded["repo_id"] == "someone/tiny-ftis-big"
    assert {"README.md", "model.safetensors", "training_args.bin"} <= set(uploaded["files"])
    card = uploaded["card"]
    assert "## F-TIS training" in card and "| variant | `f-vis` |" in card and "2605.22537" in card
    assert "`big` (" in card and "ftis" in card
    assert b"s3cret-value" not in uploaded["args"]


def test_a_colocated_vllm_share_that_does_not_fit_the_gpu_share_is_refused(tokenizer, make_args):
    args = make_args(
        max_steps=1, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, gpu_memory_fraction=0.3
    )
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization=0.3 .*gpu_memory_fraction=0.3"):
        FTISTrainer(
            build_tiny_llama(tokenizer), digit_match_reward, args=args,
            train_dataset=addition_dataset(16, seed=0), processing_class=tokenizer,
        )  # fmt: skip
