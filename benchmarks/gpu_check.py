"""The GPU check: one run, at most about five minutes on one H100 or H200 set-up included, that measures what a CPU
cannot, side by side, and writes every figure to a folder. `benchmarks/gpu_check.sh` runs it:

    bash benchmarks/gpu_check.sh --prepare      # here, once: the wheels to carry, into benchmarks/gpu_wheels/
    bash benchmarks/gpu_check.sh                # on the GPU machine: set-up, then the stages below
    bash benchmarks/gpu_check.sh --dry-run      # tiny shapes on the CPU, every stage, in seconds
    bash benchmarks/gpu_check.sh --cpu          # SmolLM2-135M's shape on the CPU: a few rows, short completions

Set-up (`gpu_check_setup.set_up`): the carried wheels the machine lacks go into one folder with one `pip install
--no-deps --target`, and stand-ins replace `pandas`, `pyarrow` and `datasets` where they cannot be imported. Then the
stages, each in its own processes with its own time limit (a stage that fails or runs out of time is recorded with
its reason, and the next one runs), fp32 first, then bf16:

* `fp32`, then `bf16` (one `gpu_check_worker.py` process): `generate` timed at 64, 128 and 256 rows of
  256 new tokens; a trainer alone for 3 steps of 64 rows (8 prompts x 8 completions of 256 tokens), its step split
  from the trainer's own clock (`ftis/time/*`), the first step left out as warm-up; the attention probe (one forward
  and backward per attention backend, left-padded and not: which give non-finite values).
* `fp32-swarm`, then `bf16-swarm`: the same trainer as two peers of a swarm on the same GPU (two processes, lock-step
  exchange over a `dir://` folder, each bound to this run by `FTIS_SWARM_RUN` and signing with a fresh secret).
* `launcher`: the swarm launcher itself (`trl-ftis swarm`, from a config the stage writes into its work folder) starts
  two peers (`gpu_check_peer.py`) pinned to the same GPU (`gpus`), each capped to a share of its memory
  (`gpu_share`), each generating with a colocated vLLM engine where `import vllm` works on a GPU, else with the
  trainer's own `generate`; reported per peer: steps, which generation it used, memory peaks and the peer rows it
  received and accepted from the other.
* `zero3`: one optimizer step of a peer under `accelerate launch` with `examples/accelerate/deepspeed_zero3.yaml`, next
  to a plain partner peer whose rows it merges; skipped, with the reason, without CUDA or an importable DeepSpeed.

The model is a randomly initialised Llama of SmolLM2-135M's shape ([`SMOLLM2_135M`], written here: no weights travel)
with a locally built character tokenizer of the same vocabulary. Output, into `--out` (default: `$OUT` when set, else
`benchmarks/results/gpu_check-<mode>`): `gpu_check.json` (the plan, the set-up, every stage's raw record, the derived
figures), `gpu_check.txt` (the report, also printed), `stages/*.json` and `logs/*.log` (each process's).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gpu_check_setup  # benchmarks/ is not a package: found through sys.path

WORKER = HERE / "gpu_check_worker.py"
PEER_SCRIPT = HERE / "gpu_check_peer.py"  # the `launcher` stage's peers
ZERO3_CONFIG = ROOT / "examples" / "accelerate" / "deepspeed_zero3.yaml"
TIME_PARTS = ("generation", "scoring", "exchange", "training", "other")
STAGES = ("fp32", "fp32-swarm", "bf16", "bf16-swarm", "launcher", "zero3")
PEERS = ("peer-a", "peer-b")

#: SmolLM2-135M's shape (its `config.json`): a Llama with tied embeddings.
SMOLLM2_135M = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu", "initializer_range": 0.041666666666666664,
}  # fmt: skip
#: The dry run's: the same family, tiny.
TINY = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 1024, "tie_word_embeddings": True,
}  # fmt: skip
#: The `launcher` stage's peers on one GPU: each one's share of its memory, and the share of the whole GPU each one's
#: colocated vLLM engine may take (below the share: the engine allocates inside the peer's cap).
GPU_SHARING = {"gpu_share": 0.45, "vllm_gpu_memory_utilization": 0.2, "vllm_max_model_length": 512}
#: Per mode: the device, the shape, each stage's settings, the time budget (seconds, set-up included) and each stage's
#: cap within it (a stage gets its cap, less what the later stages keep: `RESERVE` each).
MODES = {
    "gpu": {
        "device": "cuda", "shape": SMOLLM2_135M, "threads": 4, "budget": 300, "prompt_style": "word",
        "generation": {"rows": [64, 128, 256], "new_tokens": 256, "repeats": 1},
        "probe": {"rows": 8, "new_tokens": 64, "padded": [True, False],
                  "backends": ["default", "math", "efficient", "flash", "cudnn"]},
        "trainer": {"rows": 64, "micro_batch": 16, "num_generations": 8, "max_completion_length": 256, "steps": 3,
                    "learning_rate": 1e-5},
        "zero3": {"rows": 16, "micro_batch": 8, "num_generations": 8, "max_completion_length": 64, "steps": 1,
                  "learning_rate": 1e-5},
        "launcher": {"rows": 16, "micro_batch": 8, "num_generations": 8, "max_completion_length": 64, "steps": 2,
                     "learning_rate": 1e-5, "peer_timeout": 60, **GPU_SHARING},
        "caps": {"setup": 40, "fp32": 85, "fp32-swarm": 60, "bf16": 85, "bf16-swarm": 60, "launcher": 70,
                 "zero3": 60},
    },
    "cpu": {
        "device": "cpu", "shape": SMOLLM2_135M, "threads": 1, "budget": 1500, "prompt_style": "short",
        "generation": {"rows": [4, 8, 16], "new_tokens": 8, "repeats": 1},
        "probe": {"rows": 3, "new_tokens": 4, "padded": [True, False], "backends": ["default"]},
        "trainer": {"rows": 4, "micro_batch": 4, "num_generations": 2, "max_completion_length": 8, "steps": 2,
                    "learning_rate": 1e-5},
        "zero3": {"rows": 4, "micro_batch": 4, "num_generations": 2, "max_completion_length": 8, "steps": 1,
                  "learning_rate": 1e-5},
        "launcher": {"rows": 4, "micro_batch": 4, "num_generations": 2, "max_completion_length": 8, "steps": 2,
                     "learning_rate": 1e-5, "peer_timeout": 120, **GPU_SHARING},
        "caps": {"setup": 60, "fp32": 300, "fp32-swarm": 300, "bf16": 400, "bf16-swarm": 400, "launcher": 300,
                 "zero3": 60},
    },
    "dry-run": {
        "device": "cpu", "shape": TINY, "threads": 1, "budget": 240, "prompt_style": "word",
        "generation": {"rows": [4, 8, 16], "new_tokens": 8, "repeats": 2},
        "probe": {"rows": 4, "new_tokens": 8, "padded": [True, False], "backends": ["default", "math"]},
        "trainer": {"rows": 8, "micro_batch": 4, "num_generations": 4, "max_completion_length": 8, "steps": 2,
                    "learning_rate": 1e-5},
        "zero3": {"rows": 8, "micro_batch": 4, "num_generations": 4, "max_completion_length": 8, "steps": 1,
                  "learning_rate": 1e-5},
        "launcher": {"rows": 8, "micro_batch": 4, "num_generations": 4, "max_completion_length": 8, "steps": 2,
                     "learning_rate": 1e-5, "peer_timeout": 60, **GPU_SHARING},
        "caps": {"setup": 60, "fp32": 60, "fp32-swarm": 60, "bf16": 60, "bf16-swarm": 60, "launcher": 90,
                 "zero3": 30},
    },
}  # fmt: skip
#: Seconds each later stage keeps for itself out of an earlier stage's cap (enough to start and say why it failed).
RESERVE = 20


# ---- figures (pure; tests/benchmarks/test_gpu_check.py checks them by hand) ----------------------------------------
def step_split(steps: list[dict], skip_first: bool = True) -> dict | None:
    """Seconds per step and each part's share of the steps (`ftis/time/*` summed over the steps, then divided), the
    first step left out when others remain (CUDA and allocator warm-up); `f` is generation's share. `None` without a
    finite step."""
    rows = [s for s in steps if isinstance(s.get("step"), (int, float)) and s["step"] > 0]
    if skip_first and len(rows) > 1:
        rows = rows[1:]
    total = sum(s["step"] for s in rows)
    if not rows or total <= 0:
        return None
    shares = {part: sum(s.get(part, 0.0) for s in rows) / total for part in TIME_PARTS}
    peer_rows = [s.get("peer_rows") or 0.0 for s in rows]
    return {"steps": len(rows), "seconds_per_step": total / len(rows), "shares": shares, "f": shares["generation"],
            "peer_rows_per_step": statistics.fmean(peer_rows)}  # fmt: skip


def generation_scaling(record: dict) -> dict | None:
    """Mean seconds per row count, each as a ratio to the smallest row count's, and rows x tokens per second: a ratio
    near 1 means generation time does not grow with the rows (latency-bound); near rows / smallest, it grows with
    them."""
    seconds = {int(rows): statistics.fmean(values) for rows, values in (record.get("seconds") or {}).items() if values}
    if not seconds:
        return None
    smallest = min(seconds)
    return {
        "new_tokens": record["new_tokens"],
        "seconds": seconds,
        "ratio_to_smallest": {rows: s / seconds[smallest] for rows, s in seconds.items()},
        "rows_over_smallest": {rows: rows / smallest for rows in seconds},
        "tokens_per_second": {rows: rows * record["new_tokens"] / s for rows, s in seconds.items()},
    }


def swarm_against_alone(alone: dict | None, peers: dict[str, dict | None], own_rows: int) -> dict | None:
    """A swarm peer's step against the alone trainer's step (same own rows, the GPU shared by two processes), and rows
    trained per second (own rows, plus the peer rows a swarm step merges), per peer and their mean."""
    if not alone or not any(peers.values()):
        return None
    out = {"peers": {}}
    for name, split in peers.items():
        if split:
            trained = own_rows + split["peer_rows_per_step"]
            out["peers"][name] = {"step_over_alone": split["seconds_per_step"] / alone["seconds_per_step"],
                                  "rows_trained_per_second": trained / split["seconds_per_step"]}  # fmt: skip
    ratios = [p["step_over_alone"] for p in out["peers"].values()]
    out["step_over_alone"] = statistics.fmean(ratios)
    out["alone_rows_per_second"] = own_rows / alone["seconds_per_step"]
    out["swarm_rows_per_second"] = sum(p["rows_trained_per_second"] for p in out["peers"].values())
    return out


def stage_timeout(caps: dict, order: list[str], name: str, left: float) -> float:
    """`name`'s time limit when `left` seconds of the budget remain: its cap, less `RESERVE` for each later stage."""
    later = order[order.index(name) + 1 :]
    return max(min(caps[name], left - RESERVE * len(later)), 0.0)


def swarm_config(plan: dict, *, device: str, gpu: str, spec: Path, exchange: Path, records: dict[str, Path],
                 use_vllm: bool) -> dict:  # fmt: skip
    """The `launcher` stage's swarm config, as `trl-ftis swarm` reads it: one `gpu_check_peer.py` peer per entry of
    `records` (peer id -> its record file), each pinned to GPU `gpu` with `plan["gpu_share"]` of its memory and its
    own seed, trading rows over the `dir://` folder `exchange`; with `use_vllm`, each generating with a colocated vLLM
    engine that may take `plan["vllm_gpu_memory_utilization"]` of the GPU (inside its share)."""
    args = {
        "check_spec": str(spec), "max_steps": plan["steps"], "per_device_train_batch_size": plan["micro_batch"],
        "gradient_accumulation_steps": plan["rows"] // plan["micro_batch"],
        "num_generations": plan["num_generations"], "max_completion_length": plan["max_completion_length"],
        "learning_rate": plan["learning_rate"], "lr_scheduler_type": "constant", "preset": "paper", "bf16": False,
        "use_cpu": device == "cpu", "temperature": 1.0, "top_k": 0, "gradient_checkpointing": False,
        "logging_steps": 1, "report_to": "none", "save_strategy": "no", "disable_tqdm": True,
        "expected_peers": list(records), "peer_timeout": plan["peer_timeout"], "use_vllm": use_vllm,
    }  # fmt: skip
    if use_vllm:
        args.update(vllm_mode="colocate", vllm_gpu_memory_utilization=plan["vllm_gpu_memory_utilization"],
                    vllm_max_model_length=plan["vllm_max_model_length"])  # fmt: skip
    peers = [
        {"id": name, "gpus": gpu, "gpu_share": plan["gpu_share"], "args": {"seed": seed, "check_result": str(path)}}
        for seed, (name, path) in enumerate(records.items())
    ]
    return {"script": str(PEER_SCRIPT), "launcher": "python", "exchange_url": f"dir://{exchange}", "args": args,
            "peers": peers}  # fmt: skip


def config_text(config: dict) -> str:
    """`config` as YAML, or as JSON (which YAML reads too) where PyYAML cannot be imported in this process."""
    try:
        import yaml
    except ImportError:
        return json.dumps(config, indent=1) + "\n"
    return yaml.safe_dump(config, sort_keys=False)


def launcher_result(launcher: dict, records: dict[str, dict], steps: int) -> dict:
    """The `launcher` stage's result from the launcher process's outcome (`exit`, `stopped`) and each peer's record:
    per peer its steps, generation, GPU and share, memory, seconds per step and the peer rows it received and
    accepted, and from whom; `failed` unless the launcher exited 0 and every peer trained `steps` steps and accepted
    peer rows."""
    peers, problems = {}, []
    if launcher.get("exit") != 0:
        problems.append(f"trl-ftis swarm: {launcher.get('stopped') or 'exit ' + str(launcher.get('exit'))}")
    for name, record in records.items():
        trainer = record.get("trainer") or {}
        summary = record.get("summary") or {}
        split = step_split(trainer.get("steps") or [])
        peers[name] = {
            "steps": trainer.get("global_step"), "generation": record.get("generation"),
            "cuda_visible_devices": record.get("cuda_visible_devices"),
            "gpu_memory_fraction": record.get("gpu_memory_fraction"), "memory": record.get("memory"),
            "seconds_per_step": split["seconds_per_step"] if split else None,
            "peer_rows_per_step": split["peer_rows_per_step"] if split else None,
            "rows_sent": summary.get("rows_sent"), "rows_received": summary.get("rows_received"),
            "rows_accepted": summary.get("rows_accepted"),
            "from": [peer for peer in summary.get("peers") or [] if peer != name],
        }  # fmt: skip
        if not record:
            problems.append(f"{name}: no record")
            continue
        errors = "; ".join(e["error"].splitlines()[-1] for e in record.get("errors", []))
        if errors:
            problems.append(f"{name}: {errors}")
        if trainer.get("global_step") != steps:
            problems.append(f"{name}: {trainer.get('global_step')} of {steps} steps")
        if not summary.get("rows_accepted"):
            problems.append(f"{name}: accepted no peer rows ({summary.get('rows_received')} received)")
    processes = {name: {"record": record} for name, record in records.items()}  # raw, as the other stages keep them
    result = {"launcher": launcher, "peers": peers, "processes": processes, "status": "failed" if problems else "ok"}
    if problems:
        result["reason"] = "; ".join(problems)[:1500]
    return result


# ---- processes ----------------------------------------------------------------------------------------------------
def stop_group(process: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM to `process`'s group, SIGKILL after `grace` seconds if it is still there."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    process.wait()


def run_processes(commands: dict[str, list[str]], env: dict, logs: Path, timeout: float) -> dict[str, dict]:
    """Start every command at once (each in its own process group, output to `logs/<name>.log`), wait at most
    `timeout` seconds for all, stop what is left; per name its exit code (`None`: stopped) and seconds."""
    logs.mkdir(parents=True, exist_ok=True)
    began, processes, files = time.time(), {}, []
    for name, command in commands.items():
        log = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed below
        files.append(log)
        processes[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)  # fmt: skip
    done: dict[str, dict] = {}
    try:
        for name, process in processes.items():
            try:
                process.wait(timeout=max(began + timeout - time.time(), 0.1))
                done[name] = {"exit": process.returncode, "seconds": round(time.time() - began, 1)}
            except subprocess.TimeoutExpired:
                done[name] = {"exit": None, "seconds": round(time.time() - began, 1), "stopped": "time limit"}
    finally:
        for name, process in processes.items():
            if process.poll() is None:
                stop_group(process)
                done.setdefault(name, {"exit": None, "stopped": "interrupted"})
        for log in files:
            log.close()
    return done


def log_tail(path: Path, chars: int = 1500) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


# ---- stages -------------------------------------------------------------------------------------------------------
class Check:
    """One run of the check: its plan, folders, environment for the processes, and the records so far."""

    def __init__(self, options):
        self.mode = options.mode
        self.plan = MODES[self.mode]
        self.budget = options.budget or self.plan["budget"]
        self.began = time.time()
        self.out = Path(options.out).resolve()
        self.work = Path(options.work or tempfile.mkdtemp(prefix=f"ftis-gpu-check-{self.mode}-")).resolve()
        self.force_stand_ins = options.stand_ins or []
        self.order = [s for s in STAGES if s not in (options.skip or [])]
        for folder in (self.out / "stages", self.out / "logs"):
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
        self.results: dict = {
            "mode": self.mode, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_head(),
            "budget_seconds": self.budget, "plan": {k: v for k, v in self.plan.items() if k != "shape"},
            "shape": self.plan["shape"], "order": self.order, "out": str(self.out), "work": str(self.work),
            "stages": {},
        }  # fmt: skip
        self.env = dict(os.environ)

    def left(self) -> float:
        return self.budget - (time.time() - self.began)

    def save(self) -> None:
        self.results["seconds"] = round(time.time() - self.began, 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1, default=str))

    # -- set-up --
    def set_up(self) -> None:
        began = time.time()
        record = gpu_check_setup.set_up(self.work, force=self.force_stand_ins, timeout=self.plan["caps"]["setup"] / 2)
        record["seconds"] = round(time.time() - began, 1)
        self.results["setup"] = record
        self.env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [*record["pythonpath"], os.environ.get("PYTHONPATH")])),
            OMP_NUM_THREADS=str(self.plan["threads"]), TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
            WANDB_MODE="disabled", FTIS_SWARM_SECRET=secrets.token_hex(16),
        )  # fmt: skip
        if self.plan["device"] == "cuda":
            self.env["CUDA_VISIBLE_DEVICES"] = self.env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        self.save()

    def spec(self, stage: str, name: str, *, role: str, dtype: str, trainer: dict, peer: dict | None = None) -> Path:
        spec = {
            "role": role, "stage": stage, "dtype": dtype, "device": self.plan["device"], "shape": self.plan["shape"],
            "threads": self.plan["threads"], "prompt_style": self.plan["prompt_style"], "model_seed": 0,
            "seed": {"peer-b": 1, "partner": 1}.get(name, 0),
            "trainer": trainer, "peer": peer, "output_dir": str(self.work / stage / name),
            "result": str(self.out / "stages" / f"{stage}-{name}.json"),
        }  # fmt: skip
        if role == "solo":
            spec.update(generation=self.plan["generation"], probe=self.plan["probe"])
        path = self.work / "specs" / f"{stage}-{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec, indent=1))
        return path

    def worker(self, spec: Path) -> list[str]:
        return [sys.executable, str(WORKER), str(spec)]

    def collect(self, stage: str, done: dict[str, dict]) -> dict:
        """Each process's exit and record (its result file), its log's end when it failed; the stage's status."""
        processes, problems = {}, []
        for name, outcome in done.items():
            path = self.out / "stages" / f"{stage}-{name}.json"
            record = json.loads(path.read_text()) if path.exists() else {}
            entry = {**outcome, "record": record}
            if outcome.get("exit") != 0 or record.get("errors"):
                entry["log_tail"] = log_tail(self.out / "logs" / f"{stage}-{name}.log")
                reason = outcome.get("stopped") or f"exit {outcome.get('exit')}"
                errors = "; ".join(e["error"].splitlines()[-1] for e in record.get("errors", []))
                problems.append(f"{name}: {reason}" + (f" ({errors})" if errors else ""))
            processes[name] = entry
        result = {"processes": processes, "status": "failed" if problems else "ok"}
        if problems:
            result["reason"] = "; ".join(problems)[:1500]
        return result

    def run_stage(self, stage: str, commands: dict[str, list[str]], timeout: float) -> dict:
        logs = self.out / "logs"
        named = {f"{stage}-{name}": command for name, command in commands.items()}
        done = run_processes(named, self.env, logs, timeout)
        return self.collect(stage, {name[len(stage) + 1 :]: outcome for name, outcome in done.items()})

    def solo(self, stage: str, timeout: float) -> dict:
        spec = self.spec(stage, "alone", role="solo", dtype=stage, trainer=self.plan["trainer"])
        return self.run_stage(stage, {"alone": self.worker(spec)}, timeout)

    def swarm(self, stage: str, dtype: str, timeout: float) -> dict:
        exchange = self.work / stage / "exchange"
        shutil.rmtree(exchange, ignore_errors=True)
        self.env["FTIS_SWARM_RUN"] = f"gpu-check-{stage}-{os.getpid()}-{time.time_ns()}"
        commands = {}
        for name in PEERS:
            peer = {"peer_id": name, "exchange_url": f"dir://{exchange}", "expected_peers": list(PEERS),
                    "peer_timeout": 30}  # fmt: skip
            spec = self.spec(stage, name, role="peer", dtype=dtype, trainer=self.plan["trainer"], peer=peer)
            commands[name] = self.worker(spec)
        return self.run_stage(stage, commands, timeout)

    def import_problem(self, statement: str, timeout: float) -> str | None:
        """Why `statement` fails in this check's processes (the last line of its error); `None` when it runs."""
        try:
            probe = subprocess.run([sys.executable, "-c", statement], check=False, env=self.env, capture_output=True,
                                   text=True, timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"`{statement}` took more than {timeout:.0f} s"
        if probe.returncode == 0:
            return None
        return (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]

    def launcher(self, timeout: float) -> dict:
        """`trl-ftis swarm` on a config written here: two peers on one GPU, each with its share, with a colocated vLLM
        engine where vLLM imports on a GPU; skipped, with the reason, where the launcher cannot be imported."""
        began = time.time()
        problem = self.import_problem("import trl_ftis.launcher", max(min(timeout / 4, 60), 5))
        if problem:
            return {"status": "skipped", "reason": f"the swarm launcher cannot be imported: {problem} (it needs "
                    "PyYAML, pydantic and psutil; the check carries psutil, not pydantic)"}  # fmt: skip
        plan = self.plan["launcher"]
        vllm = "no CUDA GPU in this mode"
        if self.plan["device"] == "cuda":
            vllm = self.import_problem("import vllm", max(min(timeout / 4, 45), 5))
            vllm = f"vllm cannot be imported: {vllm}" if vllm else None
        work = self.work / "launcher"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        spec = work / "peer-spec.json"
        spec.write_text(json.dumps({"shape": self.plan["shape"], "model_seed": 0, "threads": self.plan["threads"],
                                    "prompt_style": self.plan["prompt_style"]}, indent=1))  # fmt: skip
        gpu = self.env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or "0"
        records = {name: self.out / "stages" / f"launcher-{name}.json" for name in PEERS}
        config = swarm_config(plan, device=self.plan["device"], gpu=gpu, spec=spec, exchange=work / "exchange",
                              records=records, use_vllm=vllm is None)  # fmt: skip
        path = work / "swarm.yaml"
        path.write_text(config_text(config))
        run_dir = work / "gpu-check-launcher"  # its name is the swarm's name, to which the peers bind their messages
        command = [sys.executable, "-m", "trl_ftis.cli", "swarm", str(path), "--run-dir", str(run_dir), "--grace", "3"]
        env = {k: v for k, v in self.env.items() if k != "FTIS_SWARM_RUN"}  # the launcher binds its own run
        logs = self.out / "logs"
        done = run_processes({"launcher-swarm": command}, env, logs, timeout - (time.time() - began))
        for name in PEERS:  # the peers' own logs, next to the launcher's (its lines carry every peer's, prefixed)
            if (run_dir / "logs" / f"{name}.log").exists():
                shutil.copyfile(run_dir / "logs" / f"{name}.log", logs / f"launcher-{name}.log")
        if (run_dir / "summary.json").exists():
            shutil.copyfile(run_dir / "summary.json", self.out / "stages" / "launcher-summary.json")
        read = {name: json.loads(p.read_text()) if p.exists() else {} for name, p in records.items()}
        result = launcher_result(done["launcher-swarm"], read, plan["steps"])
        utilization = plan["vllm_gpu_memory_utilization"] if vllm is None else None
        result.update(config=config, gpus=gpu, gpu_share=plan["gpu_share"], vllm=vllm or "colocated",
                      vllm_gpu_memory_utilization=utilization)  # fmt: skip
        if result["status"] != "ok":
            result["log_tail"] = log_tail(logs / "launcher-swarm.log")
        return result

    def zero3(self, timeout: float) -> dict:
        reasons = []
        if self.plan["device"] != "cuda":
            reasons.append("no CUDA GPU in this mode")
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            reasons.append("deepspeed is not installed here, and the check does not carry it (PyPI has only a "
                           "source package of the version this project uses)")  # fmt: skip
        else:
            probe = subprocess.run([sys.executable, "-c", "import deepspeed"], check=False, env=self.env,
                                   capture_output=True, text=True, timeout=max(min(timeout / 2, 60), 5))  # fmt: skip
            if probe.returncode != 0:
                reasons.append("deepspeed cannot be imported: " + (probe.stderr.strip().splitlines() or ["?"])[-1])
        if reasons:
            return {"status": "skipped", "reason": "; ".join(reasons)}
        exchange = self.work / "zero3" / "exchange"
        shutil.rmtree(exchange, ignore_errors=True)
        self.env["FTIS_SWARM_RUN"] = f"gpu-check-zero3-{os.getpid()}-{time.time_ns()}"
        commands = {}
        for name in ("zero3", "partner"):
            peer = {"peer_id": name, "exchange_url": f"dir://{exchange}", "expected_peers": ["zero3", "partner"],
                    "peer_timeout": 60}  # fmt: skip
            spec = self.spec("zero3", name, role="peer", dtype="fp32", trainer=self.plan["zero3"], peer=peer)
            commands[name] = self.worker(spec)
        commands["zero3"] = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ZERO3_CONFIG),
                             "--num_processes", "1", *commands["zero3"][1:]]  # fmt: skip
        result = self.run_stage("zero3", commands, timeout)
        trainer = result["processes"]["zero3"]["record"].get("trainer") or {}
        steps = trainer.get("steps") or []
        merged = steps[0].get("peer_rows") if steps else None
        result.update(optimizer_steps=trainer.get("global_step"), peer_rows_merged=merged,
                      grad_norm=steps[0].get("grad_norm") if steps else None)  # fmt: skip
        if result["status"] == "ok" and not (trainer.get("global_step") == 1 and merged):
            result.update(status="failed", reason=f"{trainer.get('global_step')} steps, {merged} peer rows merged")
        return result

    def run(self) -> dict:
        self.set_up()
        for stage in self.order:
            timeout = stage_timeout(self.plan["caps"], self.order, stage, self.left())
            began = time.time()
            if timeout < 5:
                record = {"status": "skipped", "reason": "no time left in the budget"}
            elif stage == "zero3":
                record = self.zero3(timeout)
            elif stage == "launcher":
                record = self.launcher(timeout)
            elif stage.endswith("-swarm"):
                record = self.swarm(stage, stage.split("-")[0], timeout)
            else:
                record = self.solo(stage, timeout)
            record.update(seconds=round(time.time() - began, 1), timeout=round(timeout))
            self.results["stages"][stage] = record
            self.results["figures"] = figures(self.results)
            self.save()
        return self.results


def git_head() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT, capture_output=True,
                              text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


# ---- figures from the records -------------------------------------------------------------------------------------
def record_of(results: dict, stage: str, process: str) -> dict:
    return ((results["stages"].get(stage) or {}).get("processes") or {}).get(process, {}).get("record") or {}


def figures(results: dict) -> dict:
    """What the report shows, derived from the stages' raw records."""
    out: dict = {}
    own_rows = results["plan"]["trainer"]["rows"]
    for dtype in ("fp32", "bf16"):
        solo = record_of(results, dtype, "alone")
        if not solo:
            continue
        trainer = solo.get("trainer") or {}
        alone = step_split(trainer.get("steps") or [])
        peers = {name: record_of(results, f"{dtype}-swarm", name) for name in PEERS}
        peer_splits = {name: step_split((r.get("trainer") or {}).get("steps") or []) for name, r in peers.items()}
        nonfinite = {"alone": trainer.get("nonfinite")}
        nonfinite.update({name: (r.get("trainer") or {}).get("nonfinite") for name, r in peers.items() if r})
        out[dtype] = {
            "generation": generation_scaling(solo["generation"]) if solo.get("generation") else None,
            "alone": alone,
            "swarm": peer_splits if any(peers.values()) else None,
            "swarm_against_alone": swarm_against_alone(alone, peer_splits, own_rows),
            "nonfinite": nonfinite,
            "probe": solo.get("probe"),
            "environment": solo.get("environment"),
        }
    return out


# ---- the report ---------------------------------------------------------------------------------------------------
def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def split_line(name: str, split: dict | None) -> str:
    if not split:
        return f"    {name:8s} no step recorded"
    sh = split["shares"]
    return (f"    {name:8s} {split['steps']:3d} {split['seconds_per_step']:8.3f}  " + "  ".join(
        f"{sh[part]:.3f}" for part in TIME_PARTS) + f"  {split['peer_rows_per_step']:6.1f}")  # fmt: skip


def memory_text(memory: dict | None) -> str:
    if not memory:
        return "not recorded"
    if memory.get("device") != "cuda":
        share = memory.get("gpu_memory_fraction")
        return f"on the {memory.get('device')} (gpu_memory_fraction {share} caps nothing there)"
    return (f"peak {fmt(memory.get('max_allocated_gib'))} GiB allocated, {fmt(memory.get('max_reserved_gib'))} GiB "
            f"reserved (cap {memory.get('cap_gib')} of {memory.get('gpu_total_gib')} GiB); the GPU's memory in use at "
            f"the end, every process: {fmt(memory.get('gpu_in_use_at_end_gib'))} GiB")  # fmt: skip


def launcher_lines(record: dict) -> list[str]:
    """The `launcher` stage's lines under its head line: the set-up, then one line per peer."""
    vllm = record.get("vllm")
    engine = (f"a colocated vLLM engine each (vllm_gpu_memory_utilization {record.get('vllm_gpu_memory_utilization')})"
              if vllm == "colocated" else f"the trainer's own generation ({vllm})")  # fmt: skip
    head = (f"    trl-ftis swarm: {len(record['peers'])} peers on GPU {record.get('gpus')}, gpu_share "
            f"{record.get('gpu_share')} each; {engine}")  # fmt: skip
    lines = [head]
    for name, peer in record["peers"].items():
        lines.append(
            f"    {name}: {peer.get('steps')} steps ({fmt(peer.get('seconds_per_step'))} s/step), generation "
            f"{peer.get('generation')}, CUDA_VISIBLE_DEVICES {peer.get('cuda_visible_devices')}, share "
            f"{peer.get('gpu_memory_fraction')}; peer rows received {peer.get('rows_received')}, accepted "
            f"{peer.get('rows_accepted')} (from {', '.join(peer.get('from') or []) or '-'}); memory "
            + memory_text(peer.get("memory"))
        )
    return lines


def report_text(results: dict) -> str:
    found = [f.get("environment") for f in results.get("figures", {}).values()]
    found += [record_of(results, "launcher", name).get("environment") for name in PEERS]
    env = next(filter(None, found), None) or {}
    where = env.get("gpu") or env.get("device", "?")
    head = (f"GPU check ({results['mode']}) at {results.get('git')}, {results['started']}, on {where}: "
            f"{results.get('seconds', '?')} s of a {results['budget_seconds']} s budget")  # fmt: skip
    lines = [head]
    lines.append(f"  python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('cuda')}), transformers "
                 f"{env.get('transformers')}, trl {env.get('trl')}, accelerate {env.get('accelerate')}, deepspeed "
                 f"{env.get('deepspeed')}; stand-ins: {', '.join(env.get('stand_ins') or []) or 'none'}")  # fmt: skip
    setup = results.get("setup") or {}
    install = setup.get("install") or {}
    kept = ", ".join(f"{k} {v}" for k, v in (install.get("kept") or {}).items()) or "none"
    stand_ins = ", ".join((setup.get("stand_ins") or {}).get("modules") or {}) or "none"
    lines.append(f"set-up: {install.get('status')} ({install.get('reason') or install.get('method', '')}), "
                 f"{setup.get('seconds')} s: {len(install.get('install') or [])} wheels installed; the machine's own "
                 f"kept: {kept}; stand-ins: {stand_ins}")  # fmt: skip
    for stage in results["order"]:
        record = results["stages"].get(stage)
        if record is None:
            continue
        head = f"{stage}: {record['status']} ({record.get('seconds')} s of {record.get('timeout')} s)"
        lines.append(head + (f": {record['reason']}" if record.get("reason") else ""))
        if stage == "launcher" and record.get("peers"):
            lines.extend(launcher_lines(record))
        if stage == "zero3" and record["status"] != "skipped":
            lines.append(f"    optimizer steps {record.get('optimizer_steps')}, peer rows merged "
                         f"{record.get('peer_rows_merged')}, grad norm {record.get('grad_norm')}")  # fmt: skip
    for dtype, fig in (results.get("figures") or {}).items():
        lines.append(f"== {dtype}")
        gen = fig.get("generation")
        if gen:
            lines.append(f"  generate, {gen['new_tokens']} new tokens a row (seconds; ratio to the smallest row count "
                         "against the ratio of rows; rows x tokens per second):")  # fmt: skip
            for rows, seconds in gen["seconds"].items():
                lines.append(
                    f"    {rows:5d} rows  {seconds:8.3f} s  x{gen['ratio_to_smallest'][rows]:.2f} (rows "
                    f"x{gen['rows_over_smallest'][rows]:.0f})  {gen['tokens_per_second'][rows]:10.0f} tok/s"
                )
        lines.append("  step split (first step left out): steps, s/step, shares of generation scoring exchange "
                     "training other, peer rows/step")  # fmt: skip
        lines.append(split_line("alone", fig.get("alone")))
        for name, split in (fig.get("swarm") or {}).items():
            lines.append(split_line(name, split))
        versus = fig.get("swarm_against_alone")
        alone = fig.get("alone")
        if alone:
            lines.append(
                f"  generation share f: alone {fmt(alone['f'])}, swarm peers "
                + ", ".join(fmt((s or {}).get("f")) for s in (fig.get("swarm") or {}).values())
            )
        if versus:
            lines.append(f"  swarm peer step / alone step {fmt(versus['step_over_alone'])} (same own rows, the device "
                         f"shared); rows trained per second: alone {fmt(versus['alone_rows_per_second'], 1)}, swarm "
                         f"(both peers) {fmt(versus['swarm_rows_per_second'], 1)}")  # fmt: skip
        bad = {k: v for k, v in (fig.get("nonfinite") or {}).items() if v}
        lines.append("  non-finite loss or gradient norm: " + (", ".join(
            f"{k} at step {v['step']} ({v['metric']} {v['value']})" for k, v in bad.items()) or "none"))  # fmt: skip
        for case in fig.get("probe") or []:
            detail = case.get("error")
            if detail is None:
                first = case.get("first_nonfinite_grad")
                detail = (
                    f"loss {fmt(case.get('loss'))}, logits at padding finite {case.get('logits_finite_at_padding')}"
                    f", non-finite grads {case.get('nonfinite_grads')}" + (f" (first: {first})" if first else "")
                )
            padded = "padded" if case["padded"] else "unpadded"
            lines.append(f"  probe {padded:8s} {case['backend']:9s} {case['status']:10s} {detail}")
    lines.append(f"raw: {results['out']}/gpu_check.json, stages/, logs/")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", dest="mode", action="store_const", const="dry-run",
                      help="tiny shapes on the CPU, every stage (seconds)")  # fmt: skip
    mode.add_argument("--cpu", dest="mode", action="store_const", const="cpu",
                      help="SmolLM2-135M's shape on the CPU, a few rows, short completions (minutes)")  # fmt: skip
    mode.add_argument("--prepare", dest="mode", action="store_const", const="prepare",
                      help=f"fill {gpu_check_setup.WHEEL_DIR} with the wheels to carry, and exit")  # fmt: skip
    parser.add_argument(
        "--out", default=None, help="the results (default: $OUT, else benchmarks/results/gpu_check-MODE)"
    )
    parser.add_argument(
        "--work", default=None, help="scratch: installed wheels, specs, trainer outputs (default: temp)"
    )
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole check, set-up included")
    parser.add_argument("--skip", nargs="*", choices=STAGES, help="stages not to run")
    parser.add_argument(
        "--stand-ins",
        nargs="*",
        choices=gpu_check_setup.STAND_IN_MODULES,
        help="use these stand-ins even where the real modules import (rehearses a bare machine)",
    )
    options = parser.parse_args()
    options.mode = options.mode or "gpu"
    if options.mode == "prepare":
        report = gpu_check_setup.prepare()
        print(json.dumps(report, indent=1))
        return 1 if report["problems"] else 0
    options.out = options.out or os.environ.get("OUT") or str(HERE / "results" / f"gpu_check-{options.mode}")
    check = Check(options)
    try:
        results = check.run()
    except KeyboardInterrupt:
        check.results["interrupted"] = True
        results = check.results
    check.save()
    text = report_text(results)
    (check.out / "gpu_check.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
