"""Many peers: what one receiver's `Swarm.collect` costs as the swarm grows (issue 20).

One receiver `trl_ftis.swarm.client.Swarm` faces S = 64, 128 and 256 simulated senders on memory:// and dir:// (a
temporary directory). Every round each sender publishes one realistic message: 64 rows (8 prompts x 8 completions) of
300 tokens each, Zipf token ids and fp32 log-probs (the generators of benchmarks/exchange.py), signed with a shared
swarm secret (HMAC over the whole message, so verification costs what it does in a swarm). The rows of every sender are
built once (`trl_ftis.swarm.peer_messages.rows_to_message`); each round's messages are encoded
(`trl_ftis.exchange.encode_message`) and published before the receiver's collect, outside the measured time. The
receiver has met every sender (its `known_peers` holds them all, as after a first round that took everyone), so every
sender is a regular with its own allowance: the case where nothing but `max_rows` can bound the work. It does not wait
(no expected peers): everything is in the exchange when the round starts.

Two row allowances, measured in the same run, round after round interleaved with every S and transport:

* `max_rows=256`: what `trl_ftis.swarm.rounds` passes for `cap = 64` peer rows (`max(4 * cap, 64)`), the rows a trainer
  can use;
* `max_rows=None`: unbounded (the default `RoundBudget.max_rows`, 16 384 rows = 256 messages), for reference.

Per round on the receiver: the wall time of `collect` (median over rounds), the messages and bytes it examined
(hashed, verified, decoded: `RoundResult.messages_read`, `bytes_read`), the rows it accepted, the envelopes it dropped
(`refused["round_budget"]`), and the peak of Python memory allocated during collect (tracemalloc, in separate rounds,
since tracing slows everything); over all rounds, how many distinct senders had rows accepted at least once. The result
is the cost at S = 128 and 256 relative to S = 64, side by side for both allowances: no absolute time is a result (the
machine is shared and noisy); raw medians are printed for context only.

    OMP_NUM_THREADS=1 python benchmarks/many_peers.py            # a few minutes
    OMP_NUM_THREADS=1 python benchmarks/many_peers.py --quick    # about a minute
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # overhead.py, exchange.py: the shared helpers

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import overhead as common  # noqa: E402  (sets the environment and one torch thread before torch is used)
from exchange import FINGERPRINT, GSM8K_LIKE, PAPER_VOCAB, realistic_ids, realistic_logps  # noqa: E402

SECRET = "many-peers-benchmark-secret"
ROWS_PER_MESSAGE = 64
PROMPTS = 8  # 8 prompts x 8 completions
TOKENS = 300
CAP = 64  # peer rows a step trains on
ALLOWANCES = {"256": max(4 * CAP, 64), "None": None}  # max_rows as trl_ftis.swarm.rounds passes it, and unbounded
REPO = Path(__file__).resolve().parent.parent


def git_line() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    changed = git("diff", "--numstat", "HEAD", "--", "src/trl_ftis/swarm/client.py").split()
    state = f"+{changed[0]} -{changed[1]} lines not committed" if changed else "as committed"
    return f"git rev {git('rev-parse', '--short', 'HEAD')} (src/trl_ftis/swarm/client.py: {state})"


def sender_rows(sender: str, seed: int):
    """One sender's 64 rows of 300 tokens (the same every round; the round is in the signed message)."""
    from trl_ftis import PeerRow

    rng = np.random.default_rng(seed)
    rows = []
    for p in range(PROMPTS):
        a, b = int(rng.integers(10, 99)), int(rng.integers(10, 99))
        prompt = GSM8K_LIKE.format(a=a, b=b, i=p)
        for _ in range(ROWS_PER_MESSAGE // PROMPTS):
            reward = float(rng.random())
            rows.append(
                PeerRow(
                    prompt=prompt,
                    completion_ids=realistic_ids(rng, TOKENS, PAPER_VOCAB),
                    generator_logps=realistic_logps(rng, TOKENS),
                    reward=reward,
                    group=(sender, p),
                    sender=sender,
                    rewards_per_func={"digit_match_reward": reward},
                    extra={"answer": str(a + b)},
                )
            )
    return rows


def build_messages(count: int):
    from trl_ftis.swarm.peer_messages import rows_to_message

    senders = [f"peer-{k:03d}" for k in range(count)]
    messages = {
        sender: rows_to_message(
            sender_rows(sender, seed=k),
            sender=sender,
            round=0,
            tokenizer_fingerprint=FINGERPRINT,
            tokenizer_name="synthetic-49k",
            temperature=1.0,
            reward_names=["digit_match_reward"],
        )
        for k, sender in enumerate(senders)
    }
    return senders, messages


def encode_round(messages, round: int) -> dict[str, bytes]:
    from trl_ftis.exchange import encode_message

    out = {}
    for sender, message in messages.items():
        message.round = round
        out[sender] = encode_message(message, secret=SECRET)
    return out


class Case:
    """One receiver on its own exchange, facing `senders`, with one row allowance."""

    def __init__(self, transport: str, senders: list[str], allowance: str, tmp: str):
        from trl_ftis.exchange.transports import open_transport
        from trl_ftis.swarm.client import Swarm

        self.transport, self.senders, self.allowance = transport, senders, allowance
        self.max_rows = ALLOWANCES[allowance]
        if transport == "memory":
            self.url = f"memory://many-peers-{uuid.uuid4().hex}"
            self.path = None
        else:
            self.path = Path(tmp) / f"{len(senders)}-{allowance}"
            self.url = f"dir://{self.path}"
        self.publisher = open_transport(self.url)
        self.receiver = Swarm(
            self.url,
            peer_id="receiver",
            tokenizer_fingerprint=FINGERPRINT,
            tokenizer_name="synthetic-49k",
            vocab_limit=PAPER_VOCAB,
            temperature=1.0,
            reward_names=["digit_match_reward"],
            secret=SECRET,
            peer_timeout=0.0,
        )
        self.receiver.known_peers = set(senders)  # it has met everyone: all regulars
        self.times: list[float] = []
        self.peaks: list[float] = []
        self.read: list[int] = []
        self.bytes: list[int] = []
        self.rows: list[int] = []
        self.dropped: list[int] = []
        self.accepted_by: Counter = Counter()
        self.rounds = 0

    def publish(self, data: dict[str, bytes], round: int) -> None:
        for sender in self.senders:
            self.publisher.publish(data[sender], sender=sender, round=round)

    def clear(self, round: int) -> None:
        """Remove this round's messages from the exchange (outside the measured time)."""
        if self.path is None:
            for sender in self.senders:
                self.publisher.prune(sender=sender, keep_rounds=0, current_round=round + 1)
        else:
            for name in os.listdir(self.path):
                if name.endswith(".ftis"):
                    os.unlink(self.path / name)

    def round(self, data: dict[str, bytes], round: int, *, trace: bool) -> None:
        self.publish(data, round)
        if trace:
            tracemalloc.start()
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        result = self.receiver.collect(round, max_rows=self.max_rows)
        elapsed = time.perf_counter() - started
        if trace:
            peak = tracemalloc.get_traced_memory()[1] - before
            tracemalloc.stop()
            self.peaks.append(peak / 2**20)
        else:
            self.times.append(elapsed)
            self.read.append(result.messages_read)
            self.bytes.append(result.bytes_read)
            self.rows.append(len(result.rows))
            self.dropped.append(result.refused["round_budget"])
            self.rounds += 1
            for sender in {row.sender for row in result.rows}:
                self.accepted_by[sender] += 1
        del result
        self.clear(round)

    def close(self) -> None:
        self.receiver.close()
        self.publisher.close()


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="What one receiver's Swarm.collect costs facing 64/128/256 senders, with max_rows=256 and "
        "unbounded, on memory:// and dir://.",
    )
    parser.add_argument("--quick", action="store_true", help="about a minute: fewer rounds")
    parser.add_argument("--senders", type=int, nargs="+", default=[64, 128, 256], help="swarm sizes S [64 128 256]")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per configuration [9; quick 3]")
    parser.add_argument("--memory-rounds", type=int, default=None, help="tracemalloc rounds [2; quick 1]")
    parser.add_argument(
        "--transports", nargs="+", choices=["memory", "dir"], default=["memory", "dir"], help="[memory dir]"
    )
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 9)
    args.memory_rounds = args.memory_rounds if args.memory_rounds is not None else (1 if args.quick else 2)
    args.senders = sorted(args.senders)

    common.quiet()
    common.header()
    print(git_line())
    message_bytes = None
    started = time.perf_counter()
    senders, messages = build_messages(max(args.senders))
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            (transport, allowance, size): Case(transport, senders[:size], allowance, tmp)
            for transport in args.transports
            for allowance in ALLOWANCES
            for size in args.senders
        }
        total = args.rounds + args.memory_rounds
        for round in range(total):
            data = encode_round(messages, round)
            message_bytes = message_bytes or len(next(iter(data.values())))
            trace = round >= args.rounds  # the memory rounds come last, timed rounds untraced
            # Every configuration once per round, in a rotating order, so that drifts of the machine hit all alike.
            keys = list(cases)
            shift = round % len(keys)
            for key in keys[shift:] + keys[:shift]:
                cases[key].round(data, round, trace=trace)
            print(f"  round {round + 1}/{total} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        print(
            f"\nOne receiver, S senders, each publishing one message a round: {ROWS_PER_MESSAGE} rows x {TOKENS} "
            f"tokens, fp32 log-probs, HMAC-signed, {message_bytes:,} B. All senders are regulars (known peers); "
            f"no waiting. {args.rounds} timed rounds (medians), {args.memory_rounds} tracemalloc round(s) (peak of "
            "memory allocated during collect, max over them)."
        )
        base_label = f"x S={args.senders[0]}"
        header = (
            f"  {'transport':<10}{'max_rows':>9}{'S':>5}{'collect ms':>12}{base_label:>8}{'examined':>10}"
            f"{base_label:>8}{'MB read':>9}{'rows':>7}{'dropped':>9}{'peak MiB':>10}{base_label:>8}"
            f"{'senders read':>14}"
        )
        print(header)
        summary = []
        for transport in args.transports:
            for allowance in ALLOWANCES:
                base = cases[(transport, allowance, args.senders[0])]
                base_time = statistics.median(base.times)
                base_read = statistics.median(base.read)
                base_peak = max(base.peaks) if base.peaks else 0.0
                for size in args.senders:
                    case = cases[(transport, allowance, size)]
                    t = statistics.median(case.times)
                    read = statistics.median(case.read)
                    peak = max(case.peaks) if case.peaks else 0.0
                    print(
                        f"  {transport + '://':<10}{allowance:>9}{size:>5}{1000 * t:>12.1f}{ratio(t, base_time):>8}"
                        f"{read:>10.0f}{ratio(read, base_read):>8}{statistics.median(case.bytes) / 1e6:>9.1f}"
                        f"{statistics.median(case.rows):>7.0f}{statistics.median(case.dropped):>9.0f}"
                        f"{peak:>10.1f}{ratio(peak, base_peak):>8}{f'{len(case.accepted_by)}/{size}':>14}"
                    )
                    peak_ratio = peak / base_peak if base_peak else 0.0
                    summary.append((transport, allowance, size, t / base_time, read, peak_ratio))
        print(
            "\n  collect ms: median wall time of Swarm.collect; examined: RoundResult.messages_read (hashed, "
            "verified, decoded); MB read: bytes_read; rows: rows accepted; dropped: refused['round_budget'] (dropped "
            "unread, or decoded and then refused for the row allowance); senders read: distinct senders with rows "
            f"accepted in at least one of the {args.rounds} timed rounds; {base_label}: relative to "
            f"S={args.senders[0]}, same transport and max_rows."
        )
        print(
            f"\nSummary: cost at S relative to S={args.senders[0]} (collect time / examined messages / peak memory)"
        )
        for transport in args.transports:
            for size in args.senders[1:]:
                parts = []
                for allowance in ALLOWANCES:
                    row = next(s for s in summary if s[:3] == (transport, allowance, size))
                    parts.append(f"max_rows={allowance}: {row[3]:.2f} / {row[4]:.0f} msgs / {row[5]:.2f}")
                print(f"  {transport + '://':<10}S={size:<4} " + "   ".join(parts))
        for case in cases.values():
            case.close()
    print(f"(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
