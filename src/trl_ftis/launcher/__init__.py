"""`trl-ftis swarm`: start every peer of a swarm on this machine (or one SLURM job each) and supervise them.

A swarm is several independent training jobs ("peers") that exchange samples through one shared URL
(`dir:///shared/path` or `redis://...`). Each peer is its own job with its own process group and, with
`launcher: accelerate`, its own `main_process_port`: peers never share a torch process group, so one crashing peer
cannot hang the others in a collective.

The package, one concern per module (each step can be used and tested alone):

* `schema`: the YAML schema (documented in `docs/swarm-launcher.md`) and its validation. `load_swarm_config`
  returns a `SwarmConfig`; every problem is reported at once, naming the peer and the key, before anything starts.
* `commands`: `build_commands(config)` turns it into one `PeerCommand` (argv + environment additions) per peer;
  nothing starts. Also `check_files`, `dry_run` and the redaction of secrets for display (`redact_env`,
  `redact_argv`).
* `supervisor`: `run_swarm(config)` starts the peers, streams their output, stops all of them when one fails or on
  Ctrl-C (the `Supervisor` class, its process tracking, signals and die-with-parent), and prints a summary table.
* `summary`: each peer's summary file, the summary rows and `format_summary_table`.
* `slurm_schema`, `slurm`, `slurm_jobs`: `launcher: slurm` (or `--slurm`). The `slurm:` resources and the `redis:` job
  in the config (`SlurmResources`, `RedisJobConfig`); `run_swarm` then submits one job per peer with submitit
  (`slurm.run_slurm_swarm`), after a Redis server job whose address it hands to the peers, follows their logs and
  exit files, and cancels every job on a failure or Ctrl-C; `slurm_jobs` is what runs inside those jobs.

The rules shared with the rest of trl-ftis (peer ids, exchange URL schemes, redaction, environment variable and file
names) come from `trl_ftis.rules`. Only the standard library and PyYAML are imported here (submitit only when jobs are
submitted), so `trl-ftis swarm --dry-run` stays fast. `__all__` is the package's API, re-exported from the modules (`redact_text`
from `trl_ftis.rules`); the `X as X` imports keep the constants that the package exported before it was split.
"""

from __future__ import annotations

from ..rules import redact_text
from .commands import (
    PeerCommand,
    build_commands,
    check_files,
    describe_commands,
    dry_run,
    redact_argv,
    redact_env,
    render_args,
)
from .schema import LAUNCHERS as LAUNCHERS
from .schema import PEER_KEYS as PEER_KEYS
from .schema import RESERVED_ARGS as RESERVED_ARGS
from .schema import TOP_LEVEL_KEYS as TOP_LEVEL_KEYS
from .schema import PeerConfig, SwarmConfig, SwarmConfigError, load_swarm_config
from .slurm_schema import RedisJobConfig, SlurmResources
from .summary import SUMMARY_FIELDS, format_summary_table
from .supervisor import INTERRUPTED_EXIT_CODE as INTERRUPTED_EXIT_CODE
from .supervisor import run_swarm

__all__ = [
    "SUMMARY_FIELDS",
    "PeerCommand",
    "PeerConfig",
    "RedisJobConfig",
    "SlurmResources",
    "SwarmConfig",
    "SwarmConfigError",
    "build_commands",
    "check_files",
    "describe_commands",
    "dry_run",
    "format_summary_table",
    "load_swarm_config",
    "redact_argv",
    "redact_env",
    "redact_text",
    "render_args",
    "run_swarm",
]
