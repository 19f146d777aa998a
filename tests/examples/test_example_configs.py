"""The example configs: the paper's swarms (`examples/swarms/paper/`) and the accelerate configs
(`examples/accelerate/`).

Fast and CPU-only: nothing is downloaded, trained or launched. Each paper swarm must pass the launcher's own
validation (also `trl-ftis swarm --dry-run`, with every file it names present), and each peer's command line must parse
into the paper's `FTISConfig` exactly as the training script would parse it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from trl_ftis import FTISConfig, cli
from trl_ftis.launcher import build_commands, check_files, load_swarm_config

ROOT = Path(__file__).resolve().parents[2]
PAPER_DIR = ROOT / "examples" / "swarms" / "paper"
ACCELERATE_DIR = ROOT / "examples" / "accelerate"
SCRIPT = "examples/gsm8k_ftis.py"
SINGLE_GPU = "examples/accelerate/single_gpu.yaml"

# file -> {peer id: (Hub model, LoRA?)}, and the paper's MATH-500 pass@1 (alone -> F-TIS) quoted in its header.
PAIRINGS = {
    "qwen2.5-1.5b_3b.yaml": {
        "peers": {"qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", False), "qwen2.5-3b": ("Qwen/Qwen2.5-3B", False)},
        "math500": ["0.406 -> 0.470", "0.575 -> 0.540"],
    },
    "qwen2.5-coder-1.5b_3b.yaml": {
        "peers": {
            "qwen2.5-coder-1.5b": ("Qwen/Qwen2.5-Coder-1.5B", False),
            "qwen2.5-coder-3b": ("Qwen/Qwen2.5-Coder-3B", False),
        },
        "math500": ["0.410 -> 0.470", "0.478 -> 0.590"],
    },
    "qwen2.5-3b_coder-3b.yaml": {
        "peers": {"qwen2.5-3b": ("Qwen/Qwen2.5-3B", False), "qwen2.5-coder-3b": ("Qwen/Qwen2.5-Coder-3B", False)},
        "math500": ["0.575 -> 0.520", "0.478 -> 0.530"],
    },
    "qwen2.5-1.5b_coder-1.5b.yaml": {
        "peers": {
            "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", False),
            "qwen2.5-coder-1.5b": ("Qwen/Qwen2.5-Coder-1.5B", False),
        },
        "math500": ["0.406 -> 0.403", "0.410 -> 0.410"],
    },
    "qwen2.5-1.5b_full_lora.yaml": {
        "peers": {"qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", False), "qwen2.5-1.5b-lora": ("Qwen/Qwen2.5-1.5B", True)},
        "math500": ["0.406 -> 0.430", "0.412 -> 0.430"],
    },
    "qwen2.5-3b_full_lora.yaml": {
        "peers": {"qwen2.5-3b": ("Qwen/Qwen2.5-3B", False), "qwen2.5-3b-lora": ("Qwen/Qwen2.5-3B", True)},
        "math500": ["0.575 -> 0.513", "0.500 -> 0.560"],
    },
    "shared_gpu.yaml": {
        "peers": {"qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", False), "qwen2.5-1.5b-lora": ("Qwen/Qwen2.5-1.5B", True)},
        "math500": ["0.406 -> 0.430", "0.412 -> 0.430"],
        "gpus": ["0", "0"],
        "vllm": "colocate",
    },
    # One 8-GPU node: each peer on four GPUs under ZeRO-2, with a vLLM server of its own or colocated engines.
    "node_8gpu_server.yaml": {
        "peers": {"qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", False), "qwen2.5-3b": ("Qwen/Qwen2.5-3B", False)},
        "math500": ["0.406 -> 0.470", "0.575 -> 0.540"],
        "gpus": ["0,1,2", "4,5,6"],
        "servers": ["3", "7"],
        "accelerate": "deepspeed_zero2.yaml",
        "vllm": "server",
    },
    "node_8gpu_colocate.yaml": {
        "peers": {"qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B", False), "qwen2.5-3b": ("Qwen/Qwen2.5-3B", False)},
        "math500": ["0.406 -> 0.470", "0.575 -> 0.540"],
        "gpus": ["0,1,2,3", "4,5,6,7"],
        "accelerate": "deepspeed_zero2.yaml",
        "vllm": "colocate",
    },
}
CONFIGS = sorted(PAIRINGS)
# What a GPU recipe needs that this machine may lack: its dry run warns about it, a real start refuses it.
GPU_PACKAGES = ("vllm", "deepspeed")

# The paper's recipe, as every peer's parsed FTISConfig must hold it.
PAPER_RECIPE = {
    "learning_rate": 1e-6,
    "max_grad_norm": 1.0,
    "bf16": False,
    "fp16": False,
    "max_steps": 50,
    "num_generations": 12,
    "temperature": 1.0,
    "top_k": 50,
    "max_completion_length": 600,
    "beta": 0.0,
    "loss_type": "grpo",
    "epsilon": 0.2,
    "variant": "f-tis",
    "is_cap": 2.0,
    "kl_threshold": 50.0,
    "collaboration_mode": "vertical",
    "num_iterations": 1,
    "logging_steps": 1,
}
PROMPTS_PER_STEP = 12  # per peer, in a two-peer vertical run
COMPLETIONS_PER_STEP = PROMPTS_PER_STEP * 12  # x G


@dataclasses.dataclass
class _StandInScriptArguments:
    """The script arguments of `examples/gsm8k_ftis.py`, for while that script is not there (or not importable)."""

    dataset_name: str = "openai/gsm8k"
    dataset_config: str | None = "main"
    dataset_path: str | None = None
    eval_dataset_path: str | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    system_prompt: str | None = None
    reward: str = dataclasses.field(default="strict", metadata={"choices": ["strict", "answer"]})


@functools.cache
def _script_arguments_class():
    """The real `GSM8KScriptArguments` when the script exists (so a typo in a config fails here), else a stand-in."""
    path = ROOT / SCRIPT
    if not path.is_file():
        return _StandInScriptArguments
    spec = importlib.util.spec_from_file_location("_gsm8k_ftis_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a TRL-style script: `main()` only runs under `__name__ == "__main__"`
    return module.GSM8KScriptArguments


def _stage(tmp_path: Path, name: str) -> Path:
    """A copy of what the swarm config names (the config, the accelerate config, the script) under `tmp_path`.

    The launcher resolves relative paths against the working directory and refuses a missing script; while
    `examples/gsm8k_ftis.py` is being written a placeholder stands in for it, here only, never in `examples/`.
    """
    work = tmp_path / "work"
    accelerate = f"examples/accelerate/{PAIRINGS[name].get('accelerate', 'single_gpu.yaml')}"
    for relative in (f"examples/swarms/paper/{name}", accelerate):
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, work / relative)
    script = work / SCRIPT
    if (ROOT / SCRIPT).is_file():
        shutil.copy(ROOT / SCRIPT, script)
    else:
        script.write_text("raise SystemExit('placeholder for examples/gsm8k_ftis.py')\n")
    return work


@pytest.fixture
def staged(tmp_path, monkeypatch):
    def stage(name):
        work = _stage(tmp_path, name)
        monkeypatch.chdir(work)
        return load_swarm_config(f"examples/swarms/paper/{name}", run_dir=str(tmp_path / "run"))

    return stage


def _parse_peer(command):
    """The peer's command line after the script, parsed as the script parses it."""
    from trl import ModelConfig, TrlParser

    script_index = next(i for i, arg in enumerate(command.argv) if arg.endswith("gsm8k_ftis.py"))
    rest = command.argv[script_index + 1 :]
    parser = TrlParser((_script_arguments_class(), FTISConfig, ModelConfig))
    # return_remaining_strings=False: an argument that no dataclass knows is an error, as in the script.
    return parser.parse_args_into_dataclasses(args=rest, return_remaining_strings=False)


def _missing_packages_only(problems: list[str]) -> bool:
    """Every problem is a GPU package this machine lacks (vllm and deepspeed are not installed on CPU machines)."""
    return all(any(package in problem for package in GPU_PACKAGES) for problem in problems)


def _processes(name: str) -> int:
    return len(PAIRINGS[name].get("gpus", ["0"])[0].split(","))


def test_paper_directory_holds_the_six_pairings_and_the_gpu_recipes():
    assert sorted(p.name for p in PAPER_DIR.glob("*.yaml")) == CONFIGS
    readme = (PAPER_DIR / "README.md").read_text(encoding="utf-8")
    for name in CONFIGS:
        assert name in readme, f"{name} is not in examples/swarms/paper/README.md"


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_swarm_passes_the_launcher_validation(name, staged, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # as on the GPU machine, with the Hub (nothing is downloaded)
    config = staged(name)
    assert _missing_packages_only(check_files(config)), check_files(config)
    expected = PAIRINGS[name]["peers"]
    assert [peer.id for peer in config.peers] == list(expected)
    for peer in config.peers:
        model, lora = expected[peer.id]
        assert peer.model == model
        assert bool(peer.lora) is lora
        assert peer.script.name == "gsm8k_ftis.py"
        assert peer.launcher == "accelerate"
        accelerate = PAIRINGS[name].get("accelerate", "single_gpu.yaml")
        assert peer.accelerate_config is not None and peer.accelerate_config.name == accelerate
        # One process per GPU: the accelerate config's one, or `num_processes` matching `gpus`.
        assert peer.num_processes == (None if accelerate == "single_gpu.yaml" else _processes(name))
    gpus = [peer.gpus for peer in config.peers]
    assert gpus == PAIRINGS[name].get("gpus", ["0", "1"])  # by default each peer on its own GPU
    if name == "shared_gpu.yaml":
        assert [peer.gpu_share for peer in config.peers] == [0.45, 0.45]
    else:
        assert all(peer.gpu_share is None for peer in config.peers)
    servers = [peer.vllm_server.gpus if peer.vllm_server else None for peer in config.peers]
    assert servers == PAIRINGS[name].get("servers", [None, None])
    assert config.exchange_url.startswith("dir://")


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_swarm_dry_run(name, tmp_path, monkeypatch, capsys):
    """`trl-ftis swarm CONFIG --dry-run`: exit code 0, no warning (every file it names exists), nothing written."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # as on the GPU machine, with the Hub
    monkeypatch.chdir(_stage(tmp_path, name))
    code = cli.main(["swarm", f"examples/swarms/paper/{name}", "--dry-run", "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    warnings = [line for line in out.splitlines() if "warning" in line]
    assert _missing_packages_only(warnings), out
    assert out.count("-m accelerate.commands.launch --config_file") == 2
    servers = PAIRINGS[name].get("servers", [])
    assert out.count("vllm-serve --model") == len(servers)
    for gpu in servers:
        assert f"CUDA_VISIBLE_DEVICES={gpu} " in out
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_swarm_header_quotes_the_paper_numbers(name):
    header = "".join(
        line for line in (PAPER_DIR / name).read_text(encoding="utf-8").splitlines(True) if line.startswith("#")
    )
    for numbers in PAIRINGS[name]["math500"]:
        assert numbers in header
    assert "MATH-500" in header


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_swarm_peers_build_the_paper_ftis_config(name, staged, tmp_path):
    config = staged(name)
    ids = [peer.id for peer in config.peers]
    assert len(ids) == 2 and len(set(ids)) == 2
    seeds = []
    for command in build_commands(config):
        script_args, args, model_args = _parse_peer(command)
        for key, value in PAPER_RECIPE.items():
            assert getattr(args, key) == value, f"{command.id}: {key}={getattr(args, key)!r}, paper: {value!r}"
        # One generation of 12 prompts x 12 completions per optimizer step (TRL 1.16's rules: generation_batch_size
        # = per_device_train_batch_size x processes x steps_per_generation, steps_per_generation defaulting to
        # gradient_accumulation_steps).
        # (Parsed here in one process: a peer of N processes generates N times this process's rows.)
        processes = _processes(name)
        assert args.generation_batch_size * processes == COMPLETIONS_PER_STEP
        assert args.generation_batch_size * processes // args.num_generations == PROMPTS_PER_STEP
        assert args.steps_per_generation == args.gradient_accumulation_steps
        assert args.per_device_train_batch_size * processes * args.gradient_accumulation_steps == COMPLETIONS_PER_STEP
        vllm = PAIRINGS[name].get("vllm")
        assert args.use_vllm is (vllm is not None)
        if vllm is not None:
            assert args.vllm_mode == vllm
        if vllm == "server":  # the address of the server the launcher starts for this peer
            assert (args.vllm_server_host, args.vllm_server_port) == (command.server.host, command.server.port)
            assert args.vllm_group_port == command.server.group_port
        if vllm == "colocate" and config.peer(command.id).gpu_share is not None:
            assert args.vllm_gpu_memory_utilization < config.peer(command.id).gpu_share
        assert args.lr_scheduler_type == "constant"
        assert args.save_strategy == "no"
        assert args.report_to in ([], ["none"], "none")
        assert args.cast_lm_head_to_fp32 is False  # fp32 throughout
        # The swarm: each peer names itself and waits for the other.
        assert args.peer_id == command.id
        assert sorted(args.expected_peers) == sorted(ids)
        assert args.exchange_url == config.exchange_url
        assert args.peer_timeout >= 600  # a 3B fp32 step takes minutes; a shorter wait would train alone
        assert Path(args.output_dir) == tmp_path / "run" / command.id
        seeds.append(args.seed)

        model, lora = PAIRINGS[name]["peers"][command.id]
        assert model_args.model_name_or_path == model
        assert model_args.dtype == "float32"
        assert model_args.use_peft is lora
        if lora:
            assert (model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout) == (128, 256, 0.1)
            assert model_args.lora_target_modules == "all-linear"
            assert args.disable_dropout is False  # else the LoRA dropout 0.1 would be switched off
        else:
            assert args.disable_dropout is True

        assert script_args.reward == "strict"
    assert len(set(seeds)) == 2  # vertical: each peer draws its own prompts


def test_what_the_examples_say_about_the_dropout_default_is_true():
    """`FTISConfig`'s own default is TRL's (`disable_dropout=False`); the paper preset is what sets it to True, so a
    LoRA peer of a paper swarm sets `disable_dropout: false` against the preset, not against FTISConfig."""
    assert FTISConfig(output_dir="o", use_cpu=True, report_to=[]).disable_dropout is False
    assert FTISConfig(output_dir="o", use_cpu=True, report_to=[], preset="paper").disable_dropout is True
    files = [*PAPER_DIR.glob("*.yaml"), PAPER_DIR / "README.md", *(ROOT / "examples" / "configs").glob("*.yaml")]
    for path in files:
        text = " ".join(path.read_text().lower().split())
        assert "ftisconfig defaults to disable_dropout=true" not in text, path
        assert "ftisconfig's default would switch" not in text, path


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_swarm_args_are_known_to_the_script(name):
    """Every top-level and peer arg is a field of the script's dataclasses (a typo would crash the peer)."""
    from trl import ModelConfig

    raw = yaml.safe_load((PAPER_DIR / name).read_text(encoding="utf-8"))
    known = {f.name for cls in (_script_arguments_class(), FTISConfig, ModelConfig) for f in dataclasses.fields(cls)}
    keys = set(raw.get("args") or {})
    for peer in raw["peers"]:
        keys |= set(peer.get("args") or {})
    assert keys - known == set()


ACCELERATE_CONFIGS = {
    "single_gpu.yaml": ("NO", 1, None),
    "multi_gpu.yaml": ("MULTI_GPU", 2, None),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 2, 2),
    "deepspeed_zero3.yaml": ("DEEPSPEED", 2, 3),
}


def test_accelerate_directory_lists_its_configs():
    assert sorted(p.name for p in ACCELERATE_DIR.glob("*.yaml")) == sorted(ACCELERATE_CONFIGS)
    readme = (ACCELERATE_DIR / "README.md").read_text(encoding="utf-8")
    for name in ACCELERATE_CONFIGS:
        assert name in readme


@pytest.mark.parametrize("name", sorted(ACCELERATE_CONFIGS))
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    distributed_type, num_processes, zero_stage = ACCELERATE_CONFIGS[name]
    config = load_config_from_file(str(ACCELERATE_DIR / name))
    assert isinstance(config, ClusterConfig)
    assert config.compute_environment == "LOCAL_MACHINE"
    assert config.distributed_type == distributed_type
    assert config.num_processes == num_processes
    assert config.num_machines == 1
    assert config.use_cpu is False
    # Precision comes from the training args: 'bf16' here would override `--bf16 false` (the paper's fp32).
    assert config.mixed_precision == "no"
    if zero_stage is None:
        assert not config.deepspeed_config
    else:
        assert config.deepspeed_config["zero_stage"] == zero_stage
        assert config.deepspeed_config["zero3_init_flag"] is (zero_stage == 3)


@pytest.mark.parametrize("name", ["tiny.yaml", "mixed_architectures.yaml", "mixed_tokenizers.yaml"])
def test_cpu_swarm_examples_load_and_name_their_peers(name, tmp_path):
    """The CPU swarm examples: valid launcher configs whose peers the tiny peer script can build."""
    from trl_ftis.demo.tiny import TINY_ARCHITECTURES

    root = Path(__file__).resolve().parents[2]
    config = load_swarm_config(root / "examples" / "swarms" / name, run_dir=str(tmp_path / "run"))
    ids = [peer.id for peer in config.peers]
    for peer in config.peers:
        assert peer.args["expected_peers"] == ids
        assert peer.args.get("architecture", "llama") in TINY_ARCHITECTURES
    if name == "mixed_architectures.yaml":
        assert {peer.args["architecture"] for peer in config.peers} == {"llama", "qwen2", "gemma2"}
        assert [bool(peer.args.get("use_peft")) for peer in config.peers] == [False, True, False]
    if name == "mixed_tokenizers.yaml":
        from trl_ftis.demo.tiny import build_tokenizer
        from trl_ftis.exchange import tokenizer_fingerprint

        kinds = [peer.args["tokenizer"] for peer in config.peers]
        assert all(peer.args["cross_tokenizer"] is True for peer in config.peers)
        fingerprints = {tokenizer_fingerprint(build_tokenizer(kind)) for kind in kinds}
        assert len(fingerprints) == 2  # genuinely different tokenizers


MEMORY_MARK = "# Memory per GPU, estimated (python examples/swarms/paper/memory.py "


@functools.cache
def _memory_script():
    spec = importlib.util.spec_from_file_location("_paper_memory", PAPER_DIR / "memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["node_8gpu_server.yaml", "node_8gpu_colocate.yaml", "shared_gpu.yaml"])
def test_gpu_recipe_header_holds_its_memory_estimate(name, monkeypatch):
    """The estimate a GPU recipe's header shows is what `memory.py` computes from the recipe now (a changed batch,
    share or model changes the lines), with the command that prints it."""
    monkeypatch.chdir(ROOT)
    lines = (PAPER_DIR / name).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(MEMORY_MARK))
    command = lines[start][len(MEMORY_MARK) : -len("):")].split()
    assert command[:2] == [f"examples/swarms/paper/{name}", "--gpu-gb"] and len(command) == 3
    shown = []
    for line in lines[start + 1 :]:
        if not line.startswith("#   "):
            break
        shown.append(line[len("#   ") :])
    computed = _memory_script().estimate_lines(command[0], float(command[2]), 200)
    assert shown == computed
    gpu_gb = float(command[2])
    peers = {peer.id: peer for peer in load_swarm_config(command[0]).peers}
    for line in computed:  # every training GPU set fits its GPU, or its share of it
        peer_id, _, rest = line.partition(",")
        if "server" in peer_id or peer_id not in peers:
            continue
        total = float(rest.split(": ")[-1].split(" GB")[0])
        limit = gpu_gb * (peers[peer_id].gpu_share or 0.9)  # a tenth of a GPU kept free of its own peer
        assert total < limit, line
