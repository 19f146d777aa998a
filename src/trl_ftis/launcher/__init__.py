"""`trl-ftis swarm`: start every peer of a swarm (on this machine, or one SLURM job each) and supervise them.

A swarm is several independent training jobs ("peers") that exchange samples through one shared URL
(`dir:///shared/path` or `redis://...`). Each peer is its own job with its own process group and, with
`launcher: accelerate`, its own `main_process_port`: peers never share a torch process group, so one crashing peer
cannot hang the others in a collective.

The package, one concern per module (each step can be used and tested alone), imported bottom to top without a cycle:

* `backends`: the registry of backends (`BackendKind`: a backend's name, its own config sections and their checks,
  the keys it refuses, its placement rules, its command-line flag, its `Backend`); `register_backend` adds one.
* `validation`, `schema`: the YAML schema (documented in `docs/swarm-launcher.md`), declared with pydantic, the
  registered backends' sections included. `load_swarm_config` returns a `SwarmConfig`; every problem is reported at
  once, naming the peer and the key (a did-you-mean for unknown keys), before anything starts.
* `commands`: `build_commands(config)` turns it into one `PeerCommand` (argv + environment additions) per peer,
  whatever the backend; nothing starts. Also `check_files` and the redaction of secrets for display (`redact_env`,
  `redact_argv`).
* `backend`: the backend protocol (`Backend`: start the peers, watch them, stop them, gather their logs and results)
  and what the driver hands a backend (`Console`, `Signals`, `Outcome`, `PeerState`).
* `driver`: the one driver every backend shares, `run_swarm(config)` / `dry_run(config)`: the pre-start check,
  signals, prefixed output, the watch loop, the stop that always runs, the summary and the exit code.
* `local` (`LocalKind`, `LocalBackend`, with `processes`: every process the peers started, found with psutil, and
  die-with-parent) and the `slurm` subpackage (`slurm.kind.SlurmKind`; `slurm.schema`, its `slurm:` and `redis:`
  sections; `SlurmBackend`: a Redis job, one submitit job per peer, `squeue`/`scontrol`/`scancel`, their logs and exit
  files; `slurm.jobs` is what runs inside those jobs): the two built-in backends.
* `summary`: each peer's summary file, the summary rows, `format_summary_table` and the end-of-run exchange warnings
  (worded by `trl_ftis.exchange_report`, standard library only).
* `restart`: `restart_config(config, only, resume)`, the CLI's `--only PEER_ID` (some peers of the swarm, each with the
  command the full run gives it) and `--resume` (each from its newest complete checkpoint).

A new backend (Ray, Kubernetes, ...) is a `backends.BackendKind` and a `backend.Backend`, in a module of its own
(inside this package or not) that calls `register_backend`; nothing else changes (`docs/swarm-launcher.md`, "Adding a
backend").

The rules shared with the rest of trl-ftis come from the core's modules, each for one concern (`peer_ids`,
`redaction`, `shared_names`, `exit_codes`, ...) and from the transport registry (`exchange.transports.registry`: the
exchange URL schemes). Only the standard library, PyYAML, pydantic and psutil are imported here (submitit only when
jobs are submitted), so `trl-ftis swarm --dry-run` stays fast. `__all__` is the package's API, re-exported from its
modules; every other name is imported from the module that defines it.
"""

from __future__ import annotations

from .backend import Backend, Outcome
from .backends import backend_kind, backend_names, register_backend
from .commands import (
    PeerCommand,
    build_commands,
    check_files,
    describe_commands,
    redact_argv,
    redact_env,
)
from .driver import dry_run, run_swarm
from .preflight import render_args
from .restart import restart_config
from .schema import load_swarm_config
from .schema_values import SwarmConfigError
from .slurm.schema import RedisJobConfig, SlurmResources
from .summary import SUMMARY_FIELDS, format_summary_table
from .swarm_config import PeerConfig, SwarmConfig

__all__ = [
    "SUMMARY_FIELDS",
    "Backend",
    "backend_kind",
    "backend_names",
    "register_backend",
    "Outcome",
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
    "render_args",
    "restart_config",
    "run_swarm",
]
