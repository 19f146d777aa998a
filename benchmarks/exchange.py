"""The exchange: bytes on the wire, and the cost of one swarm round relative to a training step.

(a) Bytes per completion token on the wire, exact and compact (float16 + zlib) and the other modes, for a realistic
    paper-size message (12 prompts x 12 completions x 200 tokens, vocabulary 49 152), the same with uniformly random
    ids and log-uniform log-probs (the pessimistic data of docs/wire-format.md), and a real message of the tiny task
    (rows sampled by a tiny trainer); plus the fixed overhead per completion.
(b) One round as the receiving trainer sees it, with `trl_ftis.swarm.client.Swarm` instances (one receiver,
    P publishers) on dir:// (a temporary directory) and Redis (a throwaway redis-server from tests/redis_server.py):
    encode and publish its own message; collect (poll, decode with its checks, message_to_rows) what P = 2, 8, 32 peers
    published; merge (group statistics, the receiver's prompt tokenization, build_peer_batch), for a small message per
    peer (16 completions x 32 tokens) and a large one (12 x 12 x 200 tokens). Each round is timed right after a
    training step of the tiny model (FTISTrainer, hidden 64, 16 rows), alternating step / round in one run, and
    reported as a fraction of that step (median and IQR over repeats), with the time per row across P to check
    linearity.

No absolute time is a result (the machine is shared and noisy); raw medians are printed for context only.

    OMP_NUM_THREADS=1 python benchmarks/exchange.py            # a few minutes
    OMP_NUM_THREADS=1 python benchmarks/exchange.py --quick    # about a minute
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # overhead.py: the shared helpers

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import io  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import overhead as common  # noqa: E402  (sets the environment and one torch thread before torch is used)

GOAL_FRACTION = 0.02
PAPER_VOCAB = 49_152
FINGERPRINT = "ab" * 32  # a stand-in tokenizer fingerprint for the synthetic large messages
TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"

# --------------------------------------------------------------------------------------------------------------------
# Synthetic but realistic rows
# --------------------------------------------------------------------------------------------------------------------

GSM8K_LIKE = (
    "Natalia sold clips to {a} of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Think step by step and put the final "
    "answer after '####'. Question {i}: a baker makes {b} loaves a day for {a} days; how many loaves?"
)


def realistic_ids(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """Zipf-distributed token ids (a few frequent tokens, a long tail), scattered over the vocabulary."""
    ranks = np.minimum(rng.zipf(1.15, n), vocab) - 1
    permutation = np.random.default_rng(12345).permutation(vocab)  # fixed: the same "language" for every message
    return permutation[ranks].astype(np.int32)


def realistic_logps(rng: np.random.Generator, n: int) -> np.ndarray:
    """Sampled-token log-probs of a trained model at temperature 1: most tokens near-certain, a heavy tail."""
    confident = rng.random(n) < 0.65
    values = np.where(confident, -rng.exponential(0.03, n), -rng.exponential(1.8, n))
    return np.maximum(values, -30.0).astype(np.float32)


def random_ids_logps(rng: np.random.Generator, n: int, vocab: int):
    """The pessimistic data of docs/wire-format.md: uniform ids, log-probs log-uniform on [-20, -0.001]."""
    ids = rng.integers(0, vocab, n).astype(np.int32)
    logps = -np.exp(rng.uniform(np.log(1e-3), np.log(20.0), n)).astype(np.float32)
    return ids, logps


def synthetic_rows(
    *,
    sender: str,
    round: int,
    prompts: int,
    per_prompt: int,
    tokens: int,
    vocab: int,
    seed: int,
    long_prompts: bool,
    pessimistic: bool = False,
):
    """PeerRows of one message: `prompts` groups of `per_prompt` completions, each of length `tokens`."""
    from trl_ftis import PeerRow

    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        a, b = int(rng.integers(10, 99)), int(rng.integers(10, 99))
        prompt = GSM8K_LIKE.format(a=a, b=b, i=p) if long_prompts else f"{a}+{b}="
        for g in range(per_prompt):
            if pessimistic:
                ids, logps = random_ids_logps(rng, tokens, vocab)
            else:
                ids, logps = realistic_ids(rng, tokens, vocab), realistic_logps(rng, tokens)
            reward = float(rng.random())
            rows.append(
                PeerRow(
                    prompt=prompt,
                    completion_ids=ids.tolist(),
                    generator_logps=logps.astype(np.float64).tolist(),
                    reward=reward,
                    group=(round, p),
                    sender=sender,
                    rewards_per_func={"digit_match_reward": reward},
                    extra={"answer": str(a + b)},
                    round=round,
                )
            )
    return rows


# --------------------------------------------------------------------------------------------------------------------
# (a) bytes on the wire
# --------------------------------------------------------------------------------------------------------------------

MODES = (
    ("exact", dict(compact=False, compress=False), None),
    ("exact, signed", dict(compact=False, compress=False), "a swarm secret"),
    ("exact + zlib", dict(compact=False, compress=True), None),
    ("compact, uncompressed", dict(compact=True, compress=False), None),
    ("compact (f16 + zlib)", dict(compact=True, compress=True), None),
)


def message_sizes(name: str, message, vocab_limit: int) -> None:
    from trl_ftis.exchange import decode_message, encode_message, peek_header

    n = len(message.completions)
    t = message.num_tokens()
    k = len(message.reward_names)
    print(
        f"\n  {name}: N = {n} completions, T = {t} tokens ({t / n:.1f} per completion), K = {k}, "
        f"{len(message.groups)} prompts"
    )
    print(
        f"    {'mode':<24}{'total B':>10}{'header B':>10}{'body B':>10}{'B/token':>9}{'B/compl.':>10}"
        f"{'fixed B/compl.':>16}"
    )
    for mode, options, secret in MODES:
        data = encode_message(message, secret=secret, **options)
        info = peek_header(data)
        back = decode_message(data, secret=secret, vocab_limit=vocab_limit)
        exact_back = all(
            np.array_equal(c.completion_ids, d.completion_ids) and np.array_equal(c.generator_logps, d.generator_logps)
            for c, d in zip(message.completions, back.completions, strict=True)
        )
        if not options["compact"]:
            assert exact_back, "exact mode must round-trip bit for bit"
        per_token = len(data) / t
        # Fixed part per completion: everything that is not the per-token arrays (uncompressed modes only).
        if options["compress"]:
            fixed = "-"
        else:
            small_ids = max(int(c.completion_ids.max()) for c in message.completions) < 65536
            token_bytes = 8 if not options["compact"] else (2 if small_ids else 4) + 2
            fixed = f"{(len(data) - token_bytes * t) / n:.1f}"
        print(
            f"    {mode:<24}{len(data):>10,}{info['header_bytes']:>10,}{info['body_bytes']:>10,}{per_token:>9.2f}"
            f"{len(data) / n:>10.1f}{fixed:>16}"
        )
    body_fixed = n * (12 + 4 * k)
    print(
        f"    fixed body part per completion: 12 + 4K = {12 + 4 * k} B; header per completion "
        f"{(peek_header(encode_message(message))['header_bytes']) / n:.1f} B (prompts, extra, names); "
        f"exact body = 8 T + (12 + 4K) N = {8 * t + body_fixed:,} B"
    )


def tiny_task_message(tokenizer, tmp: str):
    """A real message of the tiny task: 4 prompts x 8 completions sampled by a tiny FTISTrainer, K = 2."""
    from trl_ftis import FTISConfig, FTISTrainer
    from trl_ftis.demo.tiny import build_tiny_llama
    from trl_ftis.exchange import tokenizer_fingerprint
    from trl_ftis.swarm.peer_messages import rows_to_message
    from trl_ftis.tasks.addition import addition_dataset, digit_match_reward, exact_answer_reward

    args = common.trainer_args(
        FTISConfig, f"{tmp}/tinymsg", per_device_train_batch_size=32, max_steps=1, logging_steps=1000
    )
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer, hidden_size=64, seed=0),
        [digit_match_reward, exact_answer_reward],
        args=args,
        train_dataset=addition_dataset(256, seed=1),
        processing_class=tokenizer,
    )
    published = []
    trainer.add_row_listener(published.append)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return rows_to_message(
        published[0],
        sender="tiny",
        round=0,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        tokenizer_name="tiny-char",
        temperature=1.0,
        reward_names=trainer.reward_func_names,
    ), trainer.vocab_limit


def bench_sizes(tokenizer, tmp: str) -> None:
    from trl_ftis.swarm.peer_messages import rows_to_message

    print(
        "\n(a) bytes on the wire (B/token = total bytes / completion tokens; fixed B/compl. = bytes that are not "
        "the per-token arrays, per completion)"
    )

    def to_message(rows):
        return rows_to_message(
            rows,
            sender="peer-0",
            round=0,
            tokenizer_fingerprint=FINGERPRINT,
            tokenizer_name="synthetic-49k",
            temperature=1.0,
            reward_names=["digit_match_reward"],
        )

    paper = synthetic_rows(
        sender="peer-0", round=0, prompts=12, per_prompt=12, tokens=200, vocab=PAPER_VOCAB, seed=0, long_prompts=True
    )
    message_sizes(
        "paper-size step, realistic data (Zipf ids, peaked log-probs), vocab 49 152", to_message(paper), PAPER_VOCAB
    )
    pessimistic = synthetic_rows(
        sender="peer-0",
        round=0,
        prompts=12,
        per_prompt=12,
        tokens=200,
        vocab=PAPER_VOCAB,
        seed=0,
        long_prompts=True,
        pessimistic=True,
    )
    message_sizes(
        "same size, uniform ids and log-uniform log-probs (pessimistic for compression)",
        to_message(pessimistic),
        PAPER_VOCAB,
    )
    message, vocab_limit = tiny_task_message(tokenizer, tmp)
    message_sizes(f"tiny task, real rows from a tiny trainer (vocab {vocab_limit})", message, vocab_limit)


# --------------------------------------------------------------------------------------------------------------------
# (b) one round
# --------------------------------------------------------------------------------------------------------------------

SETTINGS = {
    # name: (prompts per message, completions per prompt, tokens per completion, vocab, long prompts)
    "small": (2, 8, 32, None, False),  # 16 completions x 32 tokens, the tiny tokenizer's vocabulary
    "large": (12, 12, 200, PAPER_VOCAB, True),  # 144 completions x 200 tokens
}


class PhaseClock:
    """Times the functions a round calls by patching module attributes of trl_ftis.swarm.client (the benchmark's
    process only; nothing in src/ changes)."""

    def __init__(self):
        import trl_ftis.swarm.client as swarm_module

        self.timer = common.SectionTimer()
        for name, section in (
            ("encode_message", "encode"),
            ("decode_message", "decode"),
            ("message_to_rows", "to rows"),
        ):  # the swarm reads no header on its own (decode_message checks it): nothing separate to time
            self.timer.wrap(swarm_module, name, section)

    def take(self) -> dict:
        return self.timer.take()


class RoundBench:
    """One receiver and P publishers on one exchange, publishing `setting`-sized messages."""

    def __init__(self, url: str, peers: int, setting: str, tokenizer, trainer, clock: PhaseClock, *, redis=False):
        from trl_ftis.exchange import tokenizer_fingerprint
        from trl_ftis.swarm.client import Swarm

        prompts, per_prompt, tokens, vocab, long_prompts = SETTINGS[setting]
        self.vocab = vocab or len(tokenizer)
        fingerprint = FINGERPRINT if vocab else tokenizer_fingerprint(tokenizer)

        def swarm(peer_id):
            return Swarm(
                url,
                peer_id=peer_id,
                tokenizer_fingerprint=fingerprint,
                tokenizer_name="bench",
                vocab_limit=self.vocab,
                temperature=1.0,
                reward_names=["digit_match_reward"],
                peer_timeout=5.0,
            )

        self.receiver = swarm("receiver")
        self.publishers = [swarm(f"peer-{i:02d}") for i in range(peers)]
        self.peers, self.setting, self.redis = peers, setting, redis
        self.trainer, self.clock = trainer, clock
        self.shape = (prompts, per_prompt, tokens, long_prompts)
        self.rows_per_message = prompts * per_prompt
        # A few distinct messages per sender, reused round after round (rows are rebuilt with the right round).
        self.templates = {}
        for i, sender in enumerate([self.receiver.peer_id] + [p.peer_id for p in self.publishers]):
            self.templates[sender] = synthetic_rows(
                sender=sender,
                round=0,
                prompts=prompts,
                per_prompt=per_prompt,
                tokens=tokens,
                vocab=self.vocab,
                seed=1000 * peers + i,
                long_prompts=long_prompts,
            )
        self.round = 0
        self.publish_times: list[float] = []

    def rows_for(self, sender: str, round: int):
        rows = [copy.copy(row) for row in self.templates[sender]]
        for row in rows:
            row.round, row.group = round, (round, row.group[1])
        return rows

    def publish_peers(self) -> None:
        """Every other peer publishes its message of this round (each peer pays this on its own machine)."""
        self.round += 1
        for publisher in self.publishers:
            rows = self.rows_for(publisher.peer_id, self.round)
            start = time.perf_counter()
            publisher.publish(rows, self.round)
            self.publish_times.append(time.perf_counter() - start)
        self.clock.take()  # the publishers' encode time is not the receiver's

    def receive(self) -> dict:
        """The receiver's round: publish its own rows, collect the peers' rows, merge them. Seconds per phase."""
        from trl_ftis.peer_rows import assign_group_statistics, build_peer_batch

        own = self.rows_for(self.receiver.peer_id, self.round)
        phases = {}
        start = time.perf_counter()
        self.receiver.publish(own, self.round)
        phases["publish (own)"] = time.perf_counter() - start

        wrapped = self.receiver.transport.poll
        poll_time = [0.0]

        def poll():
            t0 = time.perf_counter()
            try:
                return wrapped()
            finally:
                poll_time[0] += time.perf_counter() - t0

        self.receiver.transport.poll = poll
        start = time.perf_counter()
        result = self.receiver.collect(self.round)
        phases["collect"] = time.perf_counter() - start
        self.receiver.transport.poll = wrapped
        rows = result.rows
        expected = self.peers * self.rows_per_message
        if len(rows) != expected or result.refused:
            print(
                f"  WARNING: {self.setting}/{self.peers} peers round {self.round}: {len(rows)} rows, expected "
                f"{expected}; refused {dict(result.refused)}"
            )

        # What FTISTrainer does with received rows (RoundRunner.run_round, _merge_rows), minus the rest of the
        # admission, rescoring and the cap (max_peer_ratio would keep at most 4 x 16 rows here; uncapped, to see how
        # the cost grows with rows). The prompts are rendered as the admission renders them, once per distinct prompt.
        t0 = time.perf_counter()
        assign_group_statistics(rows, "group")
        t1 = time.perf_counter()
        prompt_ids = self.trainer._admission.render_prompts([row.prompt for row in rows])
        assert not any(isinstance(ids, str) for ids in prompt_ids), "a benchmark prompt failed to render"
        t2 = time.perf_counter()
        batch = build_peer_batch(rows, prompt_ids, pad_token_id=self.trainer._tokenizer.pad_token_id)
        t3 = time.perf_counter()
        phases["merge"] = t3 - t0
        phases["  statistics"], phases["  tokenize"], phases["  build"] = t1 - t0, t2 - t1, t3 - t2
        assert len(batch) == expected or len(rows) != expected
        inner = self.clock.take()
        phases["  encode (own)"] = inner.get("encode", 0.0)
        phases["  poll (transport)"] = poll_time[0]
        phases["  decode"] = inner.get("decode", 0.0)
        phases["  message_to_rows"] = inner.get("to rows", 0.0)
        phases["round"] = phases["publish (own)"] + phases["collect"] + phases["merge"]
        phases["rows"] = len(rows)
        return phases

    def close(self) -> None:
        for swarm in [self.receiver, *self.publishers]:
            swarm.close()


def start_redis(tmp: str):
    """(url, stop) of a throwaway redis-server, or (None, reason)."""
    sys.path.insert(0, str(TESTS_DIR))
    try:
        from redis_server import RedisServerUnavailable, start_redis_server
    except Exception as error:  # e.g. pytest missing: tests/redis_server.py imports it
        return None, f"cannot import tests/redis_server.py: {type(error).__name__}: {error}"
    try:
        return start_redis_server(Path(tmp) / "redis")
    except RedisServerUnavailable as error:
        return None, str(error)
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def bench_rounds(args, tokenizer, tmp: str) -> dict:
    from trl_ftis.demo.tiny import build_tiny_llama
    from trl_ftis.tasks.addition import addition_dataset

    print(
        f"\n(b) one round, receiver side, as a fraction of a training step of the tiny model (FTISTrainer, hidden 64, "
        f"{common.LOCAL_ROWS} rows/step), step and round alternating; {args.repeats} rounds per configuration"
    )
    trainer = common.build_trainer(
        "ftis",
        build_tiny_llama(tokenizer, hidden_size=64, seed=0),
        tokenizer,
        addition_dataset(2048, seed=1),
        f"{tmp}/stepper",
    )
    driver = common.StepDriver(trainer)
    for i in range(args.warmup):
        driver.step(i)
    clock = PhaseClock()

    transports = [("dir", f"dir://{tmp}/exchange")]
    redis_url, stop = start_redis(tmp)
    if redis_url is None:
        print(f"  Redis: SKIPPED, redis-server could not be started: {stop}")
        stop = None
    else:
        transports.append(("redis", redis_url))
    benches = []
    try:
        for transport, base in transports:
            for setting in args.settings:
                for peers in args.peers:
                    name = f"{transport}-{setting}-{peers}-{uuid.uuid4().hex[:6]}"
                    url = f"{base}/{name}" if transport == "dir" else f"{base}?swarm={name}"
                    benches.append(
                        (
                            (transport, setting, peers),
                            RoundBench(url, peers, setting, tokenizer, trainer, clock, redis=transport == "redis"),
                        )
                    )
        # Warm each configuration up once (first connection, first file, first decode).
        for _, bench in benches:
            bench.publish_peers()
            bench.receive()
        records = {key: [] for key, _ in benches}
        steps = {key: [] for key, _ in benches}
        seed = 100
        for rep in range(args.repeats):
            order = benches if rep % 2 == 0 else benches[::-1]
            for key, bench in order:
                bench.publish_peers()
                seed += 1
                steps[key].append(driver.step(seed))
                records[key].append(bench.receive())
            if (rep + 1) % max(1, args.repeats // 4) == 0:
                print(f"  rounds: repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
        publish_per_message = {key: statistics.median(bench.publish_times) for key, bench in benches}
    finally:
        for _, bench in benches:
            bench.close()
        if stop is not None:
            stop()

    all_steps = [t for key in steps for t in steps[key]]
    print(
        f"  training step: raw median {1e3 * statistics.median(all_steps):.1f} ms (context only; "
        f"{len(all_steps)} steps, each followed by one round)"
    )
    phases = [
        "round",
        "publish (own)",
        "  encode (own)",
        "collect",
        "  poll (transport)",
        "  decode",
        "  message_to_rows",
        "merge",
        "  statistics",
        "  tokenize",
        "  build",
    ]
    columns = [
        "round",
        "publish",
        "encode",
        "collect",
        "poll",
        "decode",
        "to_rows",
        "merge",
        "stats",
        "tokenize",
        "build",
    ]
    print(
        "  columns, each as % of the training step just before the round (median over rounds): round = publish + "
        "collect + merge;\n  publish: own message (rows_to_message, encode, write, prune), of which encode; "
        "collect: Swarm.collect, of which poll\n  (transport read), decode (decode_message), to_rows "
        "(message_to_rows), the rest the round's own checks; merge: stats\n  (assign_group_statistics), "
        "tokenize (the admission's render_prompts of every row's prompt), build (build_peer_batch)"
    )
    summary = {}
    for transport, _ in transports:
        for setting in args.settings:
            p, g, tokens, _, _ = SETTINGS[setting]
            print(f"\n  {transport}://, {setting} messages ({p * g} completions x {tokens} tokens per peer):")
            print(f"    {'peers':>5}{'rows':>6} " + "".join(f"{name:>9}" for name in columns))
            per_row = {}
            for peers in args.peers:
                key = (transport, setting, peers)
                fractions = {}
                for phase in phases:
                    fractions[phase] = [r[phase] / s for r, s in zip(records[key], steps[key], strict=True)]
                rows = records[key][0]["rows"]
                cells = "".join(f"{100 * statistics.median(fractions[phase]):>8.2f}%" for phase in phases)
                print(f"    {peers:>5}{rows:>6} {cells}")
                summary[key] = fractions["round"]
                per_row[peers] = {phase: statistics.median(fractions[phase]) / rows for phase in phases}
            print(
                "    IQR of the round fraction: "
                + "; ".join(f"{peers} peers {fmt_pct(summary[(transport, setting, peers)])}" for peers in args.peers)
            )
            base = args.peers[0]
            print(
                f"    time per row relative to {base} peers (1.00 = linear; below 1: fixed costs amortised): "
                + "; ".join(
                    f"{peers} peers round {per_row[peers]['round'] / per_row[base]['round']:.2f}, collect "
                    f"{per_row[peers]['collect'] / per_row[base]['collect']:.2f}, merge "
                    f"{per_row[peers]['merge'] / per_row[base]['merge']:.2f}, decode "
                    f"{per_row[peers]['  decode'] / per_row[base]['  decode']:.2f}"
                    for peers in args.peers[1:]
                )
            )
            publish = statistics.median(publish_per_message[(transport, setting, q)] for q in args.peers)
            step = statistics.median(all_steps)
            print(
                f"    publishing one message (each peer, rows_to_message + encode + write): "
                f"{100 * publish / step:.2f}% of a median step"
            )
    return summary


def fmt_pct(values) -> str:
    q25, med, q75 = common.quantiles(values)
    return f"{100 * med:.2f}% [IQR {100 * q25:.2f} - {100 * q75:.2f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Bytes per token on the wire, and the cost of one swarm round (encode, publish, collect, decode, "
        "merge) as a fraction of a tiny-model training step, for 2/8/32 peers on dir:// and Redis.",
    )
    parser.add_argument("--quick", action="store_true", help="about a minute: fewer repeats")
    parser.add_argument("--peers", type=int, nargs="+", default=[2, 8, 32], help="publishing peers per round [2 8 32]")
    parser.add_argument(
        "--settings", nargs="+", choices=sorted(SETTINGS), default=None, help="message sizes [small large]"
    )
    parser.add_argument("--repeats", type=int, default=None, help="rounds per configuration [20; quick 4]")
    parser.add_argument("--warmup", type=int, default=4, help="unmeasured training steps first [4]")
    parser.add_argument("--skip-sizes", action="store_true", help="skip (a)")
    args = parser.parse_args(argv)
    args.settings = args.settings or ["small", "large"]
    args.repeats = args.repeats or (4 if args.quick else 20)
    args.peers = sorted(args.peers)

    common.quiet()
    common.header()
    from trl_ftis.demo.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_sizes:
            bench_sizes(tokenizer, tmp)
        summary = bench_rounds(args, tokenizer, tmp)
    print(
        f"\nSummary: one round (own publish + collect + merge) as a fraction of a tiny training step, median [IQR]; "
        f"goal <= {100 * GOAL_FRACTION:.0f}%"
    )
    for (transport, setting, peers), fractions in summary.items():
        med = statistics.median(fractions)
        print(
            f"  {transport + '://':<9}{setting:<6}{peers:>3} peers  {fmt_pct(fractions):<28} "
            f"{'met' if med <= GOAL_FRACTION else 'NOT met'}"
        )
    print(f"(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
