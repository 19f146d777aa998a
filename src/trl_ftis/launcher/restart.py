"""Restarting some peers of a swarm: `trl-ftis swarm CONFIG --only PEER_ID [--only ...] [--resume]`.

`restart_config(config, only, resume)` returns the config the launcher then runs like any other, and the lines to
say about it:

* `--only`: the swarm cut down to the named peers, in the config's order. Each runs the command the full run builds
  for it (`commands.build_commands` depends on the peer and the top level only; accelerate ports are picked again),
  with the same output directory and exchange. An unknown id is refused in one line, with a did-you-mean. A swarm
  whose exchange is the Redis job the launcher starts itself (SLURM, `redis: {start: true}`) is refused: that server
  lives and dies with one launcher, so peers started by another could not meet the rest of the swarm there.
  They join the run the others are in (`commands.RUN_ID_FILE`), so that their messages are accepted.
* `--resume`: each peer started gets `--resume_from_checkpoint <its newest complete checkpoint>`, found in its output
  directory by the rule `trl_ftis.swarm.checkpoint.last_complete_checkpoint` follows (the newest `checkpoint-<step>`
  folder holding `trainer_state.json`: a peer killed while saving leaves a newer, incomplete one); a peer without one
  yet starts from the beginning. The path itself is passed, not `last`, so that any TRL script resumes (`Trainer.train(
  resume_from_checkpoint=...)`) and the `.cmd` file says which checkpoint.

Standard library only, like the rest of the launcher (the checkpoint names are checked against transformers' in the
tests).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from .backends import backend_kind
from .commands import peer_output_dir, recorded_run_id
from .schema_values import SwarmConfigError
from .swarm_config import SwarmConfig

__all__ = [
    "CHECKPOINT_PREFIX",
    "RESUME_ARG",
    "TRAINER_STATE_FILE",
    "latest_checkpoint",
    "restart_command",
    "restart_config",
]

CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR: checkpoint-<step>
TRAINER_STATE_FILE = (
    "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME: written last, so it marks a whole one
)
RESUME_ARG = "resume_from_checkpoint"  # TrainingArguments' (FTISConfig's) argument, which the example scripts pass on


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest `checkpoint-<step>` folder of `output_dir` that holds its `trainer_state.json`, or None."""
    try:
        entries = list(os.scandir(output_dir))
    except OSError:  # no output directory yet: nothing to resume
        return None
    steps = []
    for entry in entries:
        prefix, _, step = entry.name.partition("-")
        if prefix == CHECKPOINT_PREFIX and step.isascii() and step.isdigit() and entry.is_dir():
            steps.append((int(step), Path(entry.path)))
    for _, path in sorted(steps, reverse=True):
        if (path / TRAINER_STATE_FILE).is_file():
            return path
    return None


def restart_command(config: SwarmConfig, only: Sequence[str] = ()) -> str:
    """The command that resumes this run: its config file and run folder, the peers `only` (all when empty), each
    from its newest complete checkpoint (`--resume`). A config given as a dict, not a file, is named `CONFIG`."""
    source = os.path.abspath(config.source) if config.source else "CONFIG"
    argv = ["trl-ftis", "swarm", source, "--run-dir", str(config.run_dir)]
    argv += backend_kind(config.scheduler).restart_argv(config)
    for peer_id in only:
        argv += ["--only", peer_id]
    return shlex.join([*argv, "--resume"])


def _select(config: SwarmConfig, only: Sequence[str]) -> SwarmConfig:
    ids = [peer.id for peer in config.peers]
    for peer_id in only:
        if peer_id not in ids:
            close = difflib.get_close_matches(peer_id, ids, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SwarmConfigError(f"--only {peer_id!r}: no such peer (peers: {', '.join(ids)}){hint}")
    if config.exchange_started:
        raise SwarmConfigError(
            "--only: this swarm's exchange is a server the launcher starts itself (on SLURM by default: the Redis "
            "job of `redis: {start: true}`), which lives only as long as that launcher, so a peer started alone "
            "could not meet the others there; set `exchange_url` to an exchange you run yourself (`exchange_url: "
            "redis://HOST:PORT/0` for a Redis server, or a folder every node shares), start the swarm with it, then "
            "restart peers with --only"
        )
    wanted = set(only)
    return dataclasses.replace(
        config,
        peers=[peer for peer in config.peers if peer.id in wanted],
        not_started=tuple(peer.id for peer in config.peers if peer.id not in wanted),
    )


def _resume(config: SwarmConfig) -> tuple[SwarmConfig, list[str]]:
    peers, said = [], []
    for peer in config.peers:
        output_dir = peer_output_dir(config, peer.id)
        checkpoint = latest_checkpoint(output_dir)
        if checkpoint is None:
            said.append(f"{peer.id}: no complete checkpoint in {output_dir} yet; it starts from the beginning")
            peers.append(peer)
            continue
        said.append(f"{peer.id}: resuming from {checkpoint}")
        # Replaces a resume_from_checkpoint of the config's args: --resume is the newer word.
        peers.append(dataclasses.replace(peer, args={**peer.args, RESUME_ARG: str(checkpoint)}))
    return dataclasses.replace(config, peers=peers), said


def restart_config(
    config: SwarmConfig, only: Sequence[str] = (), resume: bool = False
) -> tuple[SwarmConfig, list[str]]:
    """(the config to run, lines to say): `config` cut down to the peers in `only` (all when empty) and, with
    `resume`, each of them resuming from its newest complete checkpoint. Raises `SwarmConfigError` (one line) for
    an unknown peer id, or for `only` in a swarm whose exchange is a launcher-started Redis job. `config` itself is
    left as it is."""
    said = []
    if config.seeds and (only or resume):
        raise SwarmConfigError(
            "--only and --resume restart peers of one run, and this config runs one per seed (`seeds:`): to restart "
            "peers of one seed, give a config without `seeds:` and `--run-dir <run_dir>/seed-N` (each peer with "
            "`seed: N` in its args)"
        )
    if only:
        config = _select(config, only)
        # Join the run the others are in: their messages are bound to it. With none recorded (a run of an earlier
        # version), no binding, as the others have none either.
        config = dataclasses.replace(config, run_id=recorded_run_id(config) or "")
        said.append(f"joining run {config.run_id!r}" if config.run_id else "no run id recorded: messages unbound")
    if resume:
        config, said = _resume(config)
    return config, said
