"""Several ranks: rows added with `add_peer_rows` on one rank only are shared out, so that every rank merges as many
peer rows and runs the same forward passes (under DeepSpeed ZeRO-3 or FSDP each forward is a collective: a rank
running one more than another hangs the job). Two CPU processes under `accelerate launch` (gloo), for each setting
that adds forwards for peer rows: `num_iterations > 1`, `beta != 0` and TRL's vLLM importance correction."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from types import SimpleNamespace

    import torch
    from transformers import LlamaForCausalLM

    from trl_ftis import FTISTrainer, PeerRow
    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama, tiny_grpo_config
    from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

    # Forward passes outside `generate` (sampling may take different numbers of steps on each rank; under ZeRO-3
    # transformers keeps those in step itself): the log-prob and loss forwards, which must match across ranks.
    depth, forwards = [0], [0]
    generate = LlamaForCausalLM.generate

    def counted_generate(self, *args, **kwargs):
        depth[0] += 1
        try:
            return generate(self, *args, **kwargs)
        finally:
            depth[0] -= 1

    def count_forward(module, args, kwargs):
        forwards[0] += depth[0] == 0

    LlamaForCausalLM.generate = counted_generate


    class StandInVLLM:  # TRL's VLLMGeneration: completions of digits, with log-probs of their own
        def __init__(self, **kwargs):
            self.eos = kwargs["processing_class"].eos_token_id
            self.generator = torch.Generator().manual_seed(0)

        def sync_weights(self):
            pass

        def generate(self, prompts, images=None, num_generations=1, profiler=None):
            ids = [torch.randint(4, 14, (3,), generator=self.generator).tolist() + [self.eos] for _ in prompts]
            return prompts, ids, [[[-0.1] for _ in row] for row in ids], None


    import trl.trainer.grpo_trainer
    trl.trainer.grpo_trainer.VLLMGeneration = StandInVLLM
    SETTINGS = {
        "num_iterations": {"num_iterations": 2},
        "beta": {"beta": 0.04},
        "vllm": {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": True},
    }
    tokenizer = build_char_tokenizer()
    model_dir = f"{sys.argv[1]}/model{os.environ['RANK']}"  # a path: with beta, TRL loads the reference model from it
    build_tiny_llama(tokenizer, hidden_size=32).save_pretrained(model_dir)
    found = {}
    for name, overrides in SETTINGS.items():
        args = tiny_grpo_config(f"{sys.argv[1]}/{name}", max_steps=1, per_device_train_batch_size=8,
                                num_generations=4, **overrides)
        trainer = FTISTrainer(model_dir, digit_match_reward, args=args,
                              train_dataset=addition_dataset(64, seed=1), processing_class=tokenizer)
        trainer.model.register_forward_pre_hook(count_forward, with_kwargs=True)
        merged = []
        merge = trainer._merge.batch  # the tensors of the rows this rank merges
        trainer._merge.batch = lambda output, rows: merged.append(len(rows)) or merge(output, rows)
        if trainer.accelerator.process_index == 0:  # on one rank only
            trainer.add_peer_rows([
                PeerRow(prompt="12+34=", completion_ids=[8, 9, 2], generator_logps=[-0.5, -1.0, -0.25],
                        reward=float(k), group="g", sender="peer", extra={"answer": "46"})
                for k in range(6)
            ])
        forwards[0] = 0
        trainer.train()
        steps = [e for e in trainer.state.log_history if "loss" in e]
        found[name] = {"forwards": forwards[0], "merged": merged, "peer_rows": [e["ftis/peer_rows"] for e in steps]}
    rank = trainer.accelerator.process_index
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as out:
        json.dump(found, out)
    """
)


def test_peer_rows_on_one_rank_are_shared_out_and_every_rank_runs_the_same_forwards(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}  # fmt: skip
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        str(script), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    for setting in ("num_iterations", "beta", "vllm"):
        zero, one = ranks[0][setting], ranks[1][setting]
        assert zero["merged"] == one["merged"] == [3], (setting, zero, one)  # 6 rows added on rank 0: 3 each
        assert zero["forwards"] == one["forwards"] > 0, (setting, zero, one)
        assert zero["peer_rows"] == [6], (setting, zero)  # logged over both ranks


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
