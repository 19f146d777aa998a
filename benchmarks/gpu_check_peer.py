"""`examples/gsm8k_ftis.py` with a training clock, for `benchmarks/gpu_check.py`: the same script, arguments and
trainer, plus one callback that the clocked comparison needs (the time-to-target protocol of
`benchmarks/time_to_target.py`):

* start together: once built, the process marks itself ready in a barrier folder and waits (at most `barrier_timeout`
  seconds) until every process of its slot is ready, so that no clock contains another process's loading;
* a training clock from that moment, with a budget: the run stops at the first step that ends at or after
  `budget_seconds` (none: `max_steps` alone ends it);
* weight snapshots (`snapshot: true`) every `checkpoint_seconds` of training clock (0: after every step), kept in
  memory, their time taken off the clock, written to disk after training, so that they are evaluated offline and no
  clock contains an evaluation;
* `run.json` in the output directory: the step ends on the clock, the trainer's own per-step split
  (`ftis/time/*`, `trl_ftis.collaboration.StepClock`) and the snapshots.

The settings come as a JSON file named by the environment variable `FTIS_GPU_CHECK_SPEC` (set through the swarm
launcher's `env`, so that `trl-ftis swarm` runs this script with the example's own arguments); without it the script
is `examples/gsm8k_ftis.py` unchanged.

    FTIS_GPU_CHECK_SPEC=spec.json python benchmarks/gpu_check_peer.py --model_name_or_path ... (the example's flags)
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parent.parent
SPEC_ENV = "FTIS_GPU_CHECK_SPEC"
TIME_METRICS = ("step", "generation", "scoring", "exchange", "training", "other")


def load_example():
    """`examples/gsm8k_ftis.py` as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("gsm8k_ftis_example", ROOT / "examples" / "gsm8k_ftis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ClockedRun(TrainerCallback):
    """Barrier, training clock, budget and snapshots of one process (see the module docstring); `spec` keys:
    `barrier` (folder), `processes`, `barrier_timeout`, `budget_seconds`, `checkpoint_seconds`, `snapshot`."""

    def __init__(self, spec: dict, trainer):
        self.spec, self.trainer = spec, trainer
        self.start, self.paused, self.next = None, 0.0, 0.0
        self.step_ends: list[list[float]] = []
        self.snapshots: list[dict] = []
        self.weights: list[dict] = []

    def clock(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def on_train_begin(self, args, state, control, **kwargs):
        barrier = Path(self.spec["barrier"])
        barrier.mkdir(parents=True, exist_ok=True)
        (barrier / f"{args.peer_id}.ready").write_text("")
        deadline = time.time() + self.spec.get("barrier_timeout", 120)
        while len(list(barrier.glob("*.ready"))) < self.spec["processes"] and time.time() < deadline:
            time.sleep(0.05)
        self.start = time.perf_counter()
        self.next = self.spec.get("checkpoint_seconds") or 0.0

    def snapshot(self, step: int) -> None:
        began = time.perf_counter()
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.snapshots.append({"index": len(self.snapshots), "step": step, "clock": round(self.clock(), 4)})
        self.paused += time.perf_counter() - began

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        self.step_ends.append([state.global_step, round(now, 4)])
        if self.spec.get("snapshot") and now >= self.next:
            self.snapshot(state.global_step)
            every = self.spec.get("checkpoint_seconds") or 0.0
            while every > 0 and self.next <= now:
                self.next += every
        budget = self.spec.get("budget_seconds")
        if budget is not None and now >= budget:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        train_clock = self.clock()
        if self.spec.get("snapshot") and (not self.snapshots or self.snapshots[-1]["step"] != state.global_step):
            self.snapshot(state.global_step)
        if not state.is_world_process_zero:
            return
        import torch

        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        for item, weights in zip(self.snapshots, self.weights, strict=True):
            item["path"] = str(out / f"snapshot-{item['index']}.pt")
            torch.save(weights, item["path"])
        self.weights.clear()
        run = {
            "peer": args.peer_id,
            "steps": state.global_step,
            "train_clock": train_clock,
            "step_log": self.step_ends,
            # The trainer's own split of each step, [step, step, generation, scoring, exchange, training, other]
            # seconds (`ftis/time/*`, logged every step with logging_steps=1).
            "time_log": [
                [entry["step"], *(entry.get(f"ftis/time/{name}", 0.0) for name in TIME_METRICS)]
                for entry in state.log_history
                if "ftis/time/step" in entry
            ],
            "peer_rows": [entry.get("ftis/peer_rows", 0.0) for entry in state.log_history if "loss" in entry],
            "snapshots": self.snapshots,
        }
        (out / "run.json").write_text(json.dumps(run))


def main() -> None:
    example = load_example()
    spec_path = os.environ.get(SPEC_ENV)
    if spec_path:
        spec = json.loads(Path(spec_path).read_text())
        base = example.FTISTrainer

        class ClockedTrainer(base):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.add_callback(ClockedRun(spec, self))

        example.FTISTrainer = ClockedTrainer
    parser = example.TrlParser((example.GSM8KScriptArguments, example.FTISConfig, example.ModelConfig))
    example.main(*parser.parse_args_and_config())


if __name__ == "__main__":
    main()
