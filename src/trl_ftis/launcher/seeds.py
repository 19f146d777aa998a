"""Several seeds of one swarm: `seeds: [0, 1, 2]` at the top level of a swarm config runs the whole swarm, its
controls included, once per seed, one seed after the other, so that what joining was worth is read over seeds
(training noise included) and not from one run's evaluation noise.

Seed N runs as the config says with every peer's `--seed N` (a script that derives its prompts from the seed, as
`examples/tiny_peer.py` does, draws others each seed; a peer and its controls share the seed, hence the pairing),
in `<run_dir>/seed-N` (its own exchange folder, run id, logs and `summary.json`). Each seed ends with its own table;
the last one reads every seed together (`trl_ftis.worth_report`) and writes `<run_dir>/summary.json` with each
seed's exit code and summary file, and the reading.

Standard library only, like the rest of the launcher.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..exchange.transports.directory import dir_exchange_url
from ..exit_codes import INTERRUPTED_EXIT_CODE
from ..worth_report import record_in_peer_outputs, run_reading
from .commands import peer_output_dir
from .summary import say_reading, write_summary_file
from .swarm_config import SwarmConfig

__all__ = ["SEED_DIR", "read_seed_summaries", "run_seeds", "seed_config"]

SEED_DIR = "seed-{seed}"
"""Each seed's folder under the run directory."""
MAX_SUMMARY_BYTES = 16 * 2**20  # a seed's summary.json larger than this is not read


def seed_config(config: SwarmConfig, seed: int) -> SwarmConfig:
    """`config` as seed `seed` runs it: every peer with `seed: <seed>` in its args, in `<run_dir>/seed-<seed>`, with
    a folder exchange of its own when the config uses the default one (another exchange keeps its address: each
    seed's new run id keeps the seeds' messages apart)."""
    run_dir = config.run_dir / SEED_DIR.format(seed=seed)
    exchange_url = config.exchange_url
    if exchange_url == dir_exchange_url(config.run_dir / "exchange"):
        exchange_url = dir_exchange_url(run_dir / "exchange")
    peers = [dataclasses.replace(peer, args={**peer.args, "seed": seed}) for peer in config.peers]
    return dataclasses.replace(
        config, run_dir=run_dir, exchange_url=exchange_url, peers=peers, seeds=(), seed=seed, run_id=None
    )


def read_seed_summaries(run_dir: Path, seeds: list[int]) -> list[dict[str, Any] | None]:
    """Each seed's `summary.json` (None where missing, too large or not a summary). Never raises."""
    found: list[dict[str, Any] | None] = []
    for seed in seeds:
        path = Path(run_dir) / SEED_DIR.format(seed=seed) / "summary.json"
        try:
            if not path.is_file() or path.stat().st_size > MAX_SUMMARY_BYTES:
                found.append(None)
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            found.append(None)
            continue
        ok = isinstance(data, dict) and isinstance(data.get("peers"), list)
        found.append(data if ok else None)
    return found


def run_seeds(config: SwarmConfig, run_one: Callable[[SwarmConfig], int], *, say: Callable[[str], None]) -> int:
    """Run `config` once per seed with `run_one` (which returns the seed's exit code), then read the seeds together
    and write `<run_dir>/summary.json`. Stops after a seed interrupted (exit 130), and after a failed one unless
    `on_failure: continue`. Returns the first non-zero exit code, else 0."""
    codes: dict[int, int] = {}
    for index, seed in enumerate(config.seeds):
        say(f"seed {seed} ({index + 1} of {len(config.seeds)}) in {config.run_dir / SEED_DIR.format(seed=seed)}")
        codes[seed] = run_one(seed_config(config, seed))
        if codes[seed] == INTERRUPTED_EXIT_CODE or (codes[seed] != 0 and config.on_failure == "stop"):
            break
    ran = list(codes)
    summaries = read_seed_summaries(config.run_dir, ran)
    rows = [summary["peers"] for summary in summaries if summary is not None]
    reading = run_reading(rows) if rows else {"seeds": 0, "peers": {}}
    code = next((c for c in codes.values() if c != 0), 0)
    skipped = [seed for seed in config.seeds if seed not in codes]
    reason = "every seed finished" if code == 0 else f"seed {next(s for s, c in codes.items() if c != 0)} ended {code}"
    if skipped:
        reason += f"; not run: seeds {', '.join(map(str, skipped))}"
    summary = {
        "exit_code": code,
        "reason": reason,
        "run_dir": str(config.run_dir),
        "config": str(config.source) if config.source else None,
        "seeds": [
            {"seed": seed, "exit_code": codes[seed], "summary": str(Path(SEED_DIR.format(seed=seed)) / "summary.json")}
            for seed in ran
        ],
        "joining": reading,
    }
    path = write_summary_file(config.run_dir, summary, say=say)
    for seed in ran:  # each seed's peers keep the reading over every seed in their summary and model card
        one = seed_config(config, seed)
        for problem in record_in_peer_outputs({p.id: peer_output_dir(one, p.id) for p in one.peers}, reading):
            say(f"could not keep the reading: {problem}")
    say_reading(
        reading, f"what joining was worth, read over {len(rows)} seed{'s' if len(rows) != 1 else ''}:", say=say
    )
    say(f"{reason}; exit code {code}; summary in {path}")
    return code
