"""The swarm config: its YAML schema (documented in `docs/swarm-launcher.md`) and its validation.

`load_swarm_config(path_or_dict)` returns a `SwarmConfig` of `PeerConfig`s, or raises `SwarmConfigError` listing every
problem at once, each naming the peer and the key, before anything starts. The rules shared with the rest of trl-ftis
(peer ids, exchange URL schemes, environment variable names) come from `trl_ftis.rules`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import rules
from . import slurm_schema
from .slurm_schema import REDIS_JOB_EXCHANGE, RedisJobConfig, SlurmResources

__all__ = [
    "CROSS_PROCESS_SCHEMES",
    "LAUNCHERS",
    "PEER_KEYS",
    "RESERVED_ARGS",
    "SCHEDULERS",
    "TOP_LEVEL_KEYS",
    "PeerConfig",
    "SwarmConfig",
    "SwarmConfigError",
    "dir_exchange_url",
    "exchange_dir",
    "load_swarm_config",
]

LAUNCHERS = ("python", "accelerate")
# Where the peers run: this machine, or one SLURM job each (`launcher: slurm` at the top level, or --slurm). A swarm is
# either local or on SLURM; inside its job each peer still runs its own launcher (python or accelerate).
SCHEDULERS = ("local", "slurm")
TOP_LEVEL_KEYS = ("script", "launcher", "exchange_url", "run_dir", "args", "env", "slurm", "redis", "peers")
PEER_KEYS = (
    "id",
    "model",
    "lora",
    "args",
    "env",
    "script",
    "launcher",
    "accelerate_config",
    "num_processes",
    "gpus",
    "gpu_share",
    "slurm",
)
# Every peer of a swarm is a separate process, so only transports that cross processes make sense here
# (rules.IN_PROCESS_SCHEMES, memory://, live inside one process).
CROSS_PROCESS_SCHEMES = tuple(s for s in rules.EXCHANGE_SCHEMES if s not in rules.IN_PROCESS_SCHEMES)
# Arguments the launcher sets itself for every peer; a config that sets them would silently disagree.
RESERVED_ARGS = {
    "peer_id": "the peer's `id`",
    "exchange_url": "the top-level `exchange_url`",
    "output_dir": "`run_dir` (each peer writes to <run_dir>/<id>)",
}

_ARG_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GPU_ID_RE = re.compile(r"^[A-Za-z0-9:_-]+$")  # an index, or a GPU-/MIG- UUID
_DIR_PREFIX = "dir://"  # the shared-directory exchange: made absolute here, created by the supervisor at start


class SwarmConfigError(ValueError):
    """A swarm config that cannot be run; `errors` lists every problem found, each naming the peer and the key."""

    def __init__(self, message: str, errors: list[str] | None = None):
        super().__init__(message)
        self.errors = list(errors) if errors else [message]


@dataclass
class PeerConfig:
    """One validated peer. `args` and `env` are already merged over the top-level ones, sugar applied."""

    id: str
    script: Path
    launcher: str = "python"
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    lora: bool | None = None
    accelerate_config: Path | None = None
    num_processes: int | None = None
    gpus: str | None = None
    gpu_share: float | None = None
    slurm: SlurmResources | None = None  # the peer's job (merged over the top-level `slurm`); None when local


@dataclass
class SwarmConfig:
    """A validated swarm: absolute `run_dir`, one `exchange_url` for all peers, at least one peer.

    With `scheduler == "slurm"` every peer is one SLURM job; `redis` is then the Redis server job the launcher starts
    first (or None), and while its address is unknown `exchange_url` is `slurm_schema.REDIS_JOB_EXCHANGE`."""

    peers: list[PeerConfig]
    run_dir: Path
    exchange_url: str
    source: str | None = None  # the config file, for messages; None for a dict
    scheduler: str = "local"
    redis: RedisJobConfig | None = None

    def peer(self, peer_id: str) -> PeerConfig:
        for peer in self.peers:
            if peer.id == peer_id:
                return peer
        raise KeyError(peer_id)


# --------------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------------


class _Problems:
    """Collects every problem so the user fixes the config in one go instead of one error per run."""

    def __init__(self):
        self.items: list[str] = []

    def add(self, where: str, message: str):
        self.items.append(f"{where}: {message}")


def _unknown_key_message(key: Any, allowed: tuple[str, ...]) -> str:
    hint = difflib.get_close_matches(str(key), allowed, n=1)
    did_you_mean = f"; did you mean `{hint[0]}`?" if hint else ""
    return f"unknown key `{key}` (allowed: {', '.join(allowed)}){did_you_mean}"


def _peer_where(index: int, peer_id: Any) -> str:
    return f"peers[{index}] (id {peer_id!r})" if isinstance(peer_id, str) and peer_id else f"peers[{index}]"


def _check_scalar_arg(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


def _validate_args(raw: Any, where: str, problems: _Problems) -> dict[str, Any]:
    """Arguments rendered as `--key value`: scalars or flat lists only (nothing argparse cannot take)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.add(where, f"`args` must be a mapping of argument names to values, got {type(raw).__name__}")
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _ARG_KEY_RE.match(key):
            problems.add(where, f"args key {key!r} is not a valid argument name (write `lr`, not `--lr`)")
            continue
        if key in RESERVED_ARGS:
            problems.add(where, f"args.{key} is set by the launcher; use {RESERVED_ARGS[key]} instead")
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                problems.add(where, f"args.{key} is an empty list, which has no command-line form; omit it")
                continue
            if not all(_check_scalar_arg(v) and v is not None for v in value):
                problems.add(where, f"args.{key}: list items must be strings, numbers or booleans")
                continue
            out[key] = list(value)
        elif _check_scalar_arg(value):
            if isinstance(value, float) and not math.isfinite(value):
                problems.add(where, f"args.{key} must be a finite number, got {value}")
                continue
            out[key] = value
        else:
            problems.add(
                where,
                f"args.{key} must be a string, number, boolean, null or a list of those, got {type(value).__name__}",
            )
    return out


def _env_value(value: Any) -> str | None:
    """Environment values must be strings; numbers are converted. Booleans are refused: "True" vs "1" is a guess."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value if "\x00" not in value else None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def _validate_env(raw: Any, where: str, problems: _Problems) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.add(where, f"`env` must be a mapping of variable names to strings, got {type(raw).__name__}")
        return {}
    out: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            problems.add(where, f"env name {name!r} is not a valid environment variable name")
            continue
        if name == rules.PEER_ID_ENV:
            problems.add(where, f"env.{name} is set by the launcher from the peer's `id`")
            continue
        converted = _env_value(value)
        if converted is None:
            problems.add(
                where,
                f"env.{name} must be a string or a number, got {type(value).__name__} {value!r}"
                + (" (quote it: 'true' / '1')" if isinstance(value, bool) else ""),
            )
            continue
        out[name] = converted
    return out


def _validate_gpus(raw: Any, where: str, problems: _Problems) -> str | None:
    """`gpus` -> a CUDA_VISIBLE_DEVICES string: "0,1", 0 or [0, 1] are all accepted."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        items = None
    elif isinstance(raw, int):
        items = [str(raw)]
    elif isinstance(raw, str):
        items = [part.strip() for part in raw.split(",")]
    elif isinstance(raw, (list, tuple)) and all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in raw):
        items = [str(v).strip() for v in raw]
    else:
        items = None
    if not items or not all(item and _GPU_ID_RE.match(item) for item in items):
        problems.add(where, f'`gpus` must be a device list such as "0,1", 0 or [0, 1], got {raw!r}')
        return None
    return ",".join(items)


def _resolve_path(value: Any, key: str, where: str, problems: _Problems) -> Path | None:
    # Relative paths are relative to the directory the launcher runs in, like every other command line path.
    if not isinstance(value, str) or not value.strip():
        problems.add(where, f"`{key}` must be a non-empty path string, got {value!r}")
        return None
    return Path(os.path.abspath(os.path.expanduser(value)))


def dir_exchange_url(path: str | os.PathLike) -> str:
    """The `dir://` exchange URL of the directory `path` (`dir:///abs/path` for an absolute one)."""
    return f"{_DIR_PREFIX}{os.fspath(path)}"


def exchange_dir(url: str) -> str | None:
    """The directory of a `dir://` exchange URL as `load_swarm_config` writes it (lower-case scheme); `None` for
    any other scheme."""
    return url[len(_DIR_PREFIX) :] if url.startswith(_DIR_PREFIX) else None


def _normalise_exchange_url(url: Any, run_dir: Path, problems: _Problems) -> str:
    if url is None:
        return dir_exchange_url(run_dir / "exchange")  # run_dir is absolute, so this is dir:///...
    accepted = ", ".join(f"{scheme}://" for scheme in CROSS_PROCESS_SCHEMES)
    try:
        url = rules.normalise_exchange_url(url)  # the scheme checked and lower-cased
    except ValueError:
        shown = rules.redact_url(url) if isinstance(url, str) else url
        problems.add(
            "top level",
            f"`exchange_url` must be a URL such as dir:///shared/ftis or redis://host:6379/0 (schemes: {accepted}), "
            f"got {shown!r}",
        )
        return ""
    scheme = rules.exchange_scheme(url)
    if scheme in rules.IN_PROCESS_SCHEMES:
        problems.add(
            "top level",
            f"`exchange_url` {scheme}:// only works inside one process, and peers are separate processes; "
            f"use {accepted}",
        )
        return ""
    directory = exchange_dir(url)
    if directory is not None:
        if not directory:
            problems.add("top level", "`exchange_url` dir:// needs a directory, e.g. dir:///shared/ftis")
            return ""
        # Absolute, so that every peer (and the logs) name the same directory whatever their working directory.
        return dir_exchange_url(os.path.abspath(os.path.expanduser(directory)))
    return url


def _load_raw(path_or_dict: Any) -> tuple[Mapping, str | None, str]:
    """Returns (raw mapping, source path or None, default run-dir name)."""
    if isinstance(path_or_dict, Mapping):
        return path_or_dict, None, "swarm"
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise TypeError(f"load_swarm_config takes a path or a mapping, got {type(path_or_dict).__name__}")
    import yaml  # only needed for files

    class _Loader(yaml.SafeLoader):
        """YAML 1.1 reads an unquoted `4:00:00` as the base-60 integer 14400; keep its text (`slurm.time`)."""

    def _int(loader, node):
        value = yaml.SafeLoader.construct_yaml_int(loader, node)
        return slurm_schema.ColonInt(value, node.value) if ":" in str(node.value) else value

    _Loader.add_constructor("tag:yaml.org,2002:int", _int)

    path = Path(path_or_dict)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SwarmConfigError(f"cannot read swarm config {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SwarmConfigError(f"swarm config {path} is not valid YAML: {exc}") from exc
    if raw is None:
        raise SwarmConfigError(f"swarm config {path} is empty; it needs at least `script` and `peers`")
    if not isinstance(raw, Mapping):
        raise SwarmConfigError(f"swarm config {path} must be a mapping at the top level, got {type(raw).__name__}")
    return raw, str(path), path.stem


def load_swarm_config(
    path_or_dict: str | os.PathLike | Mapping, run_dir: str | os.PathLike | None = None, *, slurm: bool = False
) -> SwarmConfig:
    """Read and validate a swarm config (a YAML file or an already-parsed mapping).

    `run_dir` (the CLI's `--run-dir`) wins over the config's `run_dir`; the default is ``runs/<config file
    stem>` (`runs/swarm` for a mapping). Relative paths (`script`, `accelerate_config`, `run_dir`` and a
    relative `dir://` exchange) are made absolute against the current directory. `slurm=True` (the CLI's
    `--slurm`) runs the swarm on SLURM as `launcher: slurm` does, keeping a top-level `launcher: python|accelerate`
    as what runs inside each peer's job.

    Raises `SwarmConfigError` listing every problem, each naming the peer and the key.
    """
    raw, source, default_name = _load_raw(path_or_dict)
    problems = _Problems()
    top = "top level"

    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            problems.add(top, _unknown_key_message(key, TOP_LEVEL_KEYS))

    chosen_run_dir = run_dir if run_dir is not None else raw.get("run_dir")
    if chosen_run_dir is None:
        chosen_run_dir = os.path.join("runs", default_name)
    if not isinstance(chosen_run_dir, (str, os.PathLike)) or not str(chosen_run_dir).strip():
        problems.add(top, f"`run_dir` must be a path string, got {chosen_run_dir!r}")
        chosen_run_dir = os.path.join("runs", default_name)
    resolved_run_dir = Path(os.path.abspath(os.path.expanduser(os.fspath(chosen_run_dir))))

    default_launcher = raw.get("launcher", "python")
    scheduler = "slurm" if slurm or default_launcher == "slurm" else "local"
    if default_launcher == "slurm":
        default_launcher = "python"  # what runs inside each job; a peer's own `launcher` may say accelerate
    elif default_launcher not in LAUNCHERS:
        problems.add(top, f"`launcher` must be one of {', '.join(LAUNCHERS)}, slurm, got {default_launcher!r}")
        default_launcher = "python"

    top_slurm = slurm_schema.validate_slurm_mapping(raw.get("slurm"), top, problems.add)
    redis_job, redis_start = slurm_schema.validate_redis(raw.get("redis"), top_slurm, problems.add)
    if scheduler == "local":
        for key in ("slurm", "redis"):
            if key in raw:
                problems.add(top, f"`{key}` is only used on SLURM: add `launcher: slurm` (or run with --slurm)")
        redis_job = None
    elif redis_start is None and raw.get("exchange_url") is None:
        # On SLURM the default exchange is a Redis server the launcher starts as a job of its own: peers on
        # different nodes only need to reach it (dir:// needs a directory every node shares).
        redis_job, _ = slurm_schema.validate_redis({}, top_slurm, problems.add)
    elif not redis_start:
        redis_job = None
    if redis_job is not None and raw.get("exchange_url") is not None:
        problems.add(
            top,
            "`exchange_url` and `redis.start: true` both set: the launcher gives every peer the address of the "
            "Redis job it starts; drop one",
        )
        redis_job = None
    if redis_job is not None:
        exchange_url = REDIS_JOB_EXCHANGE
    else:
        exchange_url = _normalise_exchange_url(raw.get("exchange_url"), resolved_run_dir, problems)
    default_script = raw.get("script")
    if default_script is not None:
        default_script = _resolve_path(default_script, "script", top, problems)
    base_args = _validate_args(raw.get("args"), top, problems)
    base_env = _validate_env(raw.get("env"), top, problems)

    peers_raw = raw.get("peers")
    peers: list[PeerConfig] = []
    if peers_raw is None:
        problems.add(top, "`peers` is missing; list at least one peer, e.g. peers: [{id: a}, {id: b}]")
        peers_raw = []
    elif not isinstance(peers_raw, list) or not peers_raw:
        problems.add(top, "`peers` must be a non-empty list of peers")
        peers_raw = []

    seen_ids: dict[str, int] = {}
    for index, entry in enumerate(peers_raw):
        peer = _validate_peer(
            index, entry, default_script, default_launcher, base_args, base_env, problems, scheduler, top_slurm
        )
        if peer is None:
            continue
        if peer.id in seen_ids:
            problems.add(
                _peer_where(index, peer.id), f"duplicate `id` {peer.id!r} (also used by peers[{seen_ids[peer.id]}])"
            )
            continue
        seen_ids[peer.id] = index
        peers.append(peer)

    _check_gpu_shares(peers, problems)

    if problems.items:
        where = f" {source}" if source else ""
        lines = "\n".join(f"  - {item}" for item in problems.items)
        raise SwarmConfigError(f"invalid swarm config{where}:\n{lines}", problems.items)
    return SwarmConfig(
        peers=peers,
        run_dir=resolved_run_dir,
        exchange_url=exchange_url,
        source=source,
        scheduler=scheduler,
        redis=redis_job,
    )


def _validate_peer(
    index: int,
    entry: Any,
    default_script: Path | None,
    default_launcher: str,
    base_args: dict[str, Any],
    base_env: dict[str, str],
    problems: _Problems,
    scheduler: str = "local",
    top_slurm: Mapping[str, Any] | None = None,
) -> PeerConfig | None:
    if not isinstance(entry, Mapping):
        problems.add(f"peers[{index}]", f"each peer must be a mapping with at least `id`, got {type(entry).__name__}")
        return None
    peer_id = entry.get("id")
    where = _peer_where(index, peer_id)
    before = len(problems.items)

    for key in entry:
        if key not in PEER_KEYS:
            problems.add(where, _unknown_key_message(key, PEER_KEYS))
    if peer_id is None:
        problems.add(where, "`id` is missing")
    elif (problem := rules.peer_id_problem(peer_id)) is not None:
        # The same rule as FTISConfig.peer_id, the wire format and the transports: a peer the launcher starts must
        # be one they accept.
        problems.add(where, f"invalid `id`: {problem}")

    launcher = entry.get("launcher", default_launcher)
    if launcher == "slurm":
        problems.add(
            where,
            "`launcher: slurm` is for the whole swarm: set it at the top level (or run with --slurm); a peer's "
            "`launcher` says what runs inside its job (python or accelerate)",
        )
        launcher = default_launcher
    elif launcher not in LAUNCHERS:
        problems.add(where, f"`launcher` must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        launcher = default_launcher

    script = default_script
    if "script" in entry:
        script = _resolve_path(entry["script"], "script", where, problems)
    elif default_script is None:
        problems.add(where, "no `script`: set a top-level `script` or one for this peer")

    peer_args = _validate_args(entry.get("args"), where, problems)
    model = entry.get("model")
    if model is not None:
        if not isinstance(model, str) or not model.strip():
            problems.add(where, f"`model` must be a path or a Hub id string, got {model!r}")
        elif "model_name_or_path" in peer_args:
            problems.add(where, "`model` and args.model_name_or_path both set; keep one")
    lora = entry.get("lora")
    if lora is not None:
        if not isinstance(lora, bool):
            problems.add(where, f"`lora` must be true or false, got {lora!r}")
        elif "use_peft" in peer_args:
            problems.add(where, "`lora` and args.use_peft both set; keep one")

    args = dict(base_args)
    args.update(peer_args)
    if isinstance(model, str):
        args["model_name_or_path"] = model
    if isinstance(lora, bool):
        args["use_peft"] = lora

    env = dict(base_env)
    env.update(_validate_env(entry.get("env"), where, problems))

    accelerate_config = None
    if entry.get("accelerate_config") is not None:
        if launcher != "accelerate":
            problems.add(where, f"`accelerate_config` needs `launcher: accelerate` (this peer uses {launcher!r})")
        else:
            accelerate_config = _resolve_path(entry["accelerate_config"], "accelerate_config", where, problems)
    num_processes = entry.get("num_processes")
    if num_processes is not None:
        if launcher != "accelerate":
            problems.add(where, f"`num_processes` needs `launcher: accelerate` (this peer uses {launcher!r})")
            num_processes = None
        elif isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            problems.add(where, f"`num_processes` must be an integer >= 1, got {num_processes!r}")
            num_processes = None

    own_env = entry.get("env") if isinstance(entry.get("env"), Mapping) else {}
    gpus = _validate_gpus(entry.get("gpus"), where, problems)
    if gpus is not None and "CUDA_VISIBLE_DEVICES" in own_env:
        problems.add(where, "`gpus` and env.CUDA_VISIBLE_DEVICES both set; keep `gpus`")
    gpu_share = entry.get("gpu_share")
    if gpu_share is not None:
        if isinstance(gpu_share, bool) or not isinstance(gpu_share, (int, float)) or not 0 < gpu_share <= 1:
            problems.add(where, f"`gpu_share` must be a fraction of one GPU's memory in (0, 1], got {gpu_share!r}")
            gpu_share = None
        elif rules.GPU_MEMORY_FRACTION_ENV in own_env:
            problems.add(where, f"`gpu_share` and env.{rules.GPU_MEMORY_FRACTION_ENV} both set; keep `gpu_share`")
        else:
            gpu_share = float(gpu_share)

    resources = None
    if scheduler == "slurm":
        if entry.get("gpus") is not None:
            problems.add(
                where,
                "`gpus` picks devices on this machine; on SLURM ask for GPUs with `slurm.gpus` (GPUs per node), and "
                "SLURM sets CUDA_VISIBLE_DEVICES in the job",
            )
        own_slurm = slurm_schema.validate_slurm_mapping(entry.get("slurm"), where, problems.add)
        resources = slurm_schema.merge_resources(top_slurm or {}, own_slurm)
        if resources.nodes > 1 and launcher != "accelerate":
            problems.add(
                where,
                f"`slurm.nodes` is {resources.nodes}, but a {launcher!r} peer is one process on one node; use "
                "`launcher: accelerate` (one `accelerate launch` per node) or nodes: 1",
            )
    elif "slurm" in entry:
        problems.add(where, "`slurm` is only used on SLURM: add `launcher: slurm` at the top level (or --slurm)")

    if len(problems.items) != before or script is None:
        return None
    return PeerConfig(
        id=peer_id,
        script=script,
        launcher=launcher,
        args=args,
        env=env,
        model=model,
        lora=lora,
        accelerate_config=accelerate_config,
        num_processes=num_processes,
        gpus=gpus,
        gpu_share=gpu_share,
        slurm=resources,
    )


def _check_gpu_shares(peers: list[PeerConfig], problems: _Problems):
    # Peers pinned to the same single GPU whose memory fractions add up to more than the GPU are sure to run out
    # of memory, but only once both have loaded their models: better to say so before anything starts.
    by_gpu: dict[str, list[PeerConfig]] = {}
    for peer in peers:
        if peer.gpu_share is not None and peer.gpus is not None and "," not in peer.gpus:
            by_gpu.setdefault(peer.gpus, []).append(peer)
    for gpu, sharing in by_gpu.items():
        total = sum(p.gpu_share for p in sharing)
        if total > 1.0 + 1e-9:
            names = ", ".join(repr(p.id) for p in sharing)
            problems.add(
                f"peers {names}", f"`gpu_share` values on GPU {gpu} add up to {total:g} > 1 (one GPU's memory)"
            )
