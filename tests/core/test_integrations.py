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
    monkeypatch.setenv("FTIS_GPU_MEMORY_FRACTION", "0.3")  # what the launcher used to set: no longer read
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


def test_own_rows_carry_the_log_probs_that_sampled_them():
    """Recorded while generating (transformers) first; else the sampler's own (vLLM's processed log-probs, TRL's
    `sampling_per_token_logps`: the distribution after top-k / top-p); else, and for a batch where vLLM left a
    token unscored (NaN), the trainer's forward, computed only then."""
    from trl_ftis.own_rows import generator_logps

    old = -torch.rand(2, 3)
    sampler = old - 0.7
    calls = []

    def scored():
        calls.append(1)
        return old

    recorded = [[-0.1, -0.2, -0.3], [-0.4, -0.5]]
    assert generator_logps([3, 2], recorded=recorded, sampler=sampler, scored=scored) == (recorded, "generation")
    logps, source = generator_logps([3, 2], recorded=None, sampler=sampler, scored=scored)
    assert source == "sampler" and logps == [sampler[0].tolist(), sampler[1, :2].tolist()] and not calls
    sampler[1, 0] = float("nan")
    logps, source = generator_logps([3, 2], recorded=[[-0.1]], sampler=sampler, scored=scored)
    assert source == "trainer" and logps == [old[0].tolist(), old[1, :2].tolist()] and calls == [1]
    sampler[1, 2] = float("nan")  # padding: beyond the row's length, never read


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
    saved = args.redacted_copy()  # what the trainer writes to training_args.bin (see tests/core/test_secrets.py)
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


class StandInVLLMGeneration(FakeVLLM):
    """Takes the place of TRL's `VLLMGeneration` class: built by `GRPOTrainer.__init__` with the arguments TRL gives
    it (recorded in `built`), then generating as [`FakeVLLM`]."""

    built: list[dict] = []

    def __init__(self, **kwargs):
        from types import SimpleNamespace

        StandInVLLMGeneration.built.append(kwargs)
        super().__init__(kwargs["processing_class"].eos_token_id)
        # Server mode: TRL asks the server which log-probs it returns (the processed ones, as TRL requires).
        info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
        self.vllm_client = SimpleNamespace(get_server_info=lambda: info)


@pytest.mark.parametrize(
    "vllm_mode, is_mode", [("server", "sequence_mask"), ("colocate", "token_truncate")]
)  # TRL's ratio: (B, 1) or (B, T)
def test_vllm_generation_joins_the_swarm_with_the_samplers_logps(
    tokenizer, make_args, monkeypatch, tmp_path, vllm_mode, is_mode
):
    """`FTISTrainer(use_vllm=True)` built as TRL builds it (the vLLM engine or server client stood in for), trained
    on the CPU: own rows are published with the log-probs vLLM sampled them with (its processed log-probs, which
    TRL requests for its own correction), the message says so, peer rows train against them, and TRL's vLLM
    correction stays on its own rows only."""
    import uuid

    from trl_ftis.exchange import tokenizer_fingerprint
    from trl_ftis.swarm.client import Swarm

    monkeypatch.setattr("trl.trainer.grpo_trainer.VLLMGeneration", StandInVLLMGeneration)
    StandInVLLMGeneration.built = []
    url = f"memory://vllm-{uuid.uuid4().hex}"
    observer = Swarm(
        url, peer_id="observer", tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), tokenizer_name="char",
        vocab_limit=len(tokenizer), temperature=1.0, reward_names=["digit_match_reward"], peer_timeout=5.0,
    )  # fmt: skip
    args = make_args(
        max_steps=1, exchange_url=url, peer_id="vllm-peer", use_vllm=True, vllm_mode=vllm_mode,
        vllm_importance_sampling_mode=is_mode, top_k=50,
    )  # fmt: skip
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer, seed=4), digit_match_reward, args=args,
        train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    (built,) = StandInVLLMGeneration.built
    assert built["mode"] == vllm_mode and built["top_k"] == 50
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
    fake = trainer.vllm_generation
    trainer.train()
    assert fake.calls == 1 and trainer.state.global_step == 1
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ftis/peer_rows"] == 8 and math.isfinite(entry["grad_norm"]) and entry["grad_norm"] > 0
    assert 0 < entry["ftis/peers/other/is_weight_mean"] <= trainer.args.is_cap
    result = observer.collect(0)
    rows = [row for row in result.rows if row.sender == "vllm-peer"]
    assert len(rows) == 16 and trainer.logps_source == "sampler"
    assert trainer.swarm.sampling == {"logps": "sampler", "top_k": 50, "top_p": 1.0, "min_p": 0.0}  # its messages say
    for row in rows:  # what vLLM sampled with, not the trainer's teacher-forced log-probs
        assert list(row.generator_logps) == pytest.approx([fake.processed_logp] * len(row.completion_ids))
    # A receiver with the sender's starting model weighs the rows against vLLM's log-probs (-0.05 a token, far more
    # likely than this untrained model finds them): w = exp(ℓθ - ℓgen) is small, where the trainer's own log-probs
    # would have given exactly 1.
    receiver = FTISTrainer(
        build_tiny_llama(tokenizer, seed=4), digit_match_reward, args=make_args(max_steps=1, output_dir=str(tmp_path)),
        train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
    )  # fmt: skip
    receiver.add_peer_rows(rows)
    receiver.train()
    (entry,) = [e for e in receiver.state.log_history if "loss" in e]
    assert 0 < entry["ftis/peers/vllm-peer/is_weight_mean"] < 0.5


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
