"""The one driver every backend shares: `run_swarm(config)` and `dry_run(config)` pick the backend of the config's
scheduler (`backends.backend_kind(config.scheduler).create(config)`), and `drive(backend, ...)` runs it.

`drive` does, for every backend alike: the pre-start check (a negative `grace`, the backend's `problems()`: raised
as `SwarmConfigError` before anything starts), the SIGINT/SIGTERM/SIGHUP handlers (main thread only; restored when
it returns), the prefixed console, the loop that watches the peers (`poll`, signals), the stop that always runs
(`stop`, `finish`, even after an exception), the summary table and `summary.json`, and the exit code:

* 0: every peer exited 0;
* 1: a peer failed (or could not start, or the launcher hit an error); every other peer was stopped;
* 130 (`trl_ftis.exit_codes.INTERRUPTED_EXIT_CODE`): SIGINT (Ctrl-C), SIGTERM or SIGHUP reached the launcher; every
  peer was stopped. A second signal skips the rest of the grace period.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from typing import TextIO

from ..redaction import redact_text
from ..worth_report import record_in_peer_outputs, run_reading
from .backend import Backend, Console, Outcome, Signals, short_error
from .backends import backend_kind
from .commands import SECRET_ARGS, is_secret_name, new_run_id, peer_output_dir, record_run_id
from .preflight import before_start, secret_warnings
from .restarts_merge import merge_restarts
from .schema_values import SwarmConfigError
from .seeds import run_seeds, seed_config
from .summary import earlier_rows, report_summary, summary_rows
from .swarm_config import SwarmConfig

__all__ = ["backend_for", "drive", "dry_run", "run_swarm"]


def backend_for(config: SwarmConfig) -> Backend:
    """The backend that runs `config`: the one registered under its `scheduler` (`backends.backend_kind`)."""
    return backend_kind(config.scheduler).create(config)


def dry_run(config: SwarmConfig, stream: TextIO | None = None) -> int:
    """Print what `run_swarm` would start (for SLURM: the jobs it would submit), secrets hidden; start nothing, write
    nothing. Returns 0."""
    stream = sys.stdout if stream is None else stream
    # What a real run warns about too (no Redis check here).
    for warning in secret_warnings(config, is_secret_name, SECRET_ARGS):
        stream.write(f"# warning: {redact_text(warning)}\n")
    if config.seeds:
        stream.write(
            f"# seeds {', '.join(map(str, config.seeds))}: the whole swarm runs once per seed, in "
            f"{config.run_dir}/seed-N with every peer's --seed N; shown: seed {config.seeds[0]}\n"
        )
        config = seed_config(config, config.seeds[0])
    if config.run_id is None:
        config = dataclasses.replace(config, run_id="<drawn at start>")
    backend_for(config).dry_run(stream)
    stream.flush()
    return 0


def run_swarm(config: SwarmConfig, *, grace: float = 10.0, stream: TextIO | None = None) -> int:
    """Start every peer with the config's backend, supervise them, print a summary table; returns the exit code for
    the command line (0, 1 or 130, see the module docstring).

    Console lines are written to `stream` (default: sys.stdout) prefixed with `[<id>]`; each peer's raw output goes
    to `<run_dir>/logs/<id>.log`, its command and environment (secrets redacted) to `<id>.cmd`, and the summary table
    to `<run_dir>/summary.json`. Stopping means a polite stop (SIGTERM), `grace` seconds to exit, then a forced one
    (SIGKILL); the same clean-up runs when all peers succeeded, so nothing the swarm started outlives this call.

    Raises `SwarmConfigError` before anything starts when a file or a prerequisite of the backend is missing, or
    when an external Redis exchange does not answer (`preflight.before_start`, which also prints its warnings)."""
    problems, warnings = before_start(config, is_secret_name, SECRET_ARGS)
    for warning in warnings:
        print(f"warning: {redact_text(warning)}", file=sys.stderr)
    if problems:
        raise SwarmConfigError("cannot start the swarm:\n" + "\n".join(f"  - {p}" for p in problems), problems)
    if config.seeds:  # the whole swarm once per seed, then the seeds read together
        console = Console(sys.stdout if stream is None else stream, [peer.id for peer in config.peers])

        def run_one(one: SwarmConfig) -> int:
            one = dataclasses.replace(one, run_id=new_run_id())
            return drive(backend_for(one), one, grace=grace, stream=stream)

        return run_seeds(config, run_one, say=console.say)
    if config.run_id is None:  # a new run: messages of earlier ones (left in the exchange, or replayed) are refused
        config = dataclasses.replace(config, run_id=new_run_id())
    return drive(backend_for(config), config, grace=grace, stream=stream)


def _install_handlers(handler) -> dict:
    """Route SIGINT/SIGTERM/SIGHUP to `handler` (main thread only; elsewhere Python cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            previous[sig] = signal.signal(sig, handler)
    return previous


def _watch(backend: Backend, signals: Signals) -> Outcome:
    while True:
        interrupted = signals.outcome()
        if interrupted is not None:
            return interrupted
        outcome = backend.poll()
        if outcome is not None:
            return outcome
        signals.wait(backend.poll_interval)


def drive(backend: Backend, config: SwarmConfig, *, grace: float = 10.0, stream: TextIO | None = None) -> int:
    """Run one swarm on `backend` from start to summary; returns the exit code. See the module docstring."""
    if not (grace >= 0):
        raise ValueError(f"grace must be >= 0 seconds, got {grace}")
    problems = backend.problems()
    if problems:
        raise SwarmConfigError(
            f"cannot {backend.verb} the swarm:\n" + "\n".join(f"  - {p}" for p in problems), problems
        )
    record_run_id(config)  # where `--only` restarts find the run to join
    console = Console(sys.stdout if stream is None else stream, [peer.id for peer in config.peers])
    signals = Signals()
    previous = _install_handlers(signals.handler)
    outcome = Outcome(1, "launcher error")
    try:
        try:
            outcome = backend.start(console, signals) or _watch(backend, signals)
        except Exception as exc:  # noqa: BLE001 - a bug or an odd answer from the scheduler: still stop everything
            outcome = Outcome(1, redact_text(f"launcher error: {type(exc).__name__}: {short_error(exc)}"))
            console.say(outcome.reason)
        finally:
            # Runs on success, failure, signal and on any bug above: nothing may outlive the launcher.
            backend.stop(grace)
            backend.finish()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    rows = [backend.summary_row(state, row) for state, row in zip(backend.states(), summary_rows(backend.states()))]
    # After `--only`, the peers not restarted here keep their rows of the earlier summary: one file covers the swarm.
    rows += earlier_rows(config.run_dir, list(getattr(config, "not_started", ())))
    summary = {
        "exit_code": outcome.code,
        "reason": outcome.reason,
        "run_dir": str(config.run_dir),
        "exchange_url": redact_text(backend.exchange_url or config.exchange_url),
        "config": os.path.abspath(config.source) if config.source else None,
        **backend.summary_fields(),
        "peers": rows,
    }
    if config.seed is None:  # one seed of several is read with the others (`seeds.run_seeds`)
        summary = {**{k: v for k, v in summary.items() if k != "peers"}, "joining": run_reading([rows]), "peers": rows}
        for problem in record_in_peer_outputs(
            {peer.id: peer_output_dir(config, peer.id) for peer in config.peers}, summary["joining"]
        ):
            console.say(f"could not keep the reading: {problem}")
    summary = merge_restarts(config.run_dir, summary, backend.states())  # a later --only restart's rows win
    report_summary(config.run_dir, summary, say=console.say, emit=console.emit)
    return summary["exit_code"]
