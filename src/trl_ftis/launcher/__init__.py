"""`trl-ftis swarm`: start every peer of a swarm on this machine and supervise them.

A swarm is several independent training jobs ("peers") that exchange samples through one shared URL
(`dir:///shared/path` or `redis://...`). Each peer is its own job with its own process group and, with
`launcher: accelerate`, its own `main_process_port`: peers never share a torch process group, so one crashing peer
cannot hang the others in a collective.

The three steps are separate so that each can be used and tested alone:

* `load_swarm_config(path_or_dict)` validates the YAML schema (documented in ``docs/swarm-launcher.md``) and returns
  a `SwarmConfig`; every problem is reported at once, naming the peer and the key, before anything starts.
* `build_commands(config)` turns it into one `PeerCommand` (argv + environment additions) per peer; nothing starts.
* `run_swarm(config)` starts the peers, streams their output, stops all of them when one fails or on Ctrl-C, and
  prints a summary table.

Only the standard library and PyYAML are imported here, so `trl-ftis swarm --dry-run` stays fast.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "SUMMARY_FIELDS",
    "PeerCommand",
    "PeerConfig",
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

LAUNCHERS = ("python", "accelerate")
TOP_LEVEL_KEYS = ("script", "launcher", "exchange_url", "run_dir", "args", "env", "peers")
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
)
# Every peer of a swarm is a separate process, so only transports that cross processes make sense here
# (memory:// lives inside one process).
EXCHANGE_SCHEMES = ("dir", "redis", "rediss")
# Arguments the launcher sets itself for every peer; a config that sets them would silently disagree.
RESERVED_ARGS = {
    "peer_id": "the peer's `id`",
    "exchange_url": "the top-level `exchange_url`",
    "output_dir": "`run_dir` (each peer writes to <run_dir>/<id>)",
}
SUMMARY_FIELDS = ("steps", "rows_sent", "rows_received", "rows_accepted", "rows_filtered", "reward")
SUMMARY_FILE = "ftis_summary.json"
SECRET_ENV = "FTIS_SWARM_SECRET"
# Environment names whose values are never printed or written by the launcher (case-insensitive, anywhere in the
# name). TOKENIZERS_PARALLELISM & co. are not secrets.
_SECRET_NAME_RE = re.compile(r"SECRET|TOKEN(?!IZ)|PASSWORD|PASSWD|API_KEY|CREDENTIAL", re.IGNORECASE)
REDACTED = "<redacted>"
INTERRUPTED_EXIT_CODE = 130

_PEER_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ARG_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GPU_ID_RE = re.compile(r"^[A-Za-z0-9:_-]+$")  # an index, or a GPU-/MIG- UUID
# scheme://user:password@host -> the password part
_URL_PASSWORD_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)@")


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


@dataclass
class SwarmConfig:
    """A validated swarm: absolute `run_dir`, one `exchange_url` for all peers, at least one peer."""

    peers: list[PeerConfig]
    run_dir: Path
    exchange_url: str
    source: str | None = None  # the config file, for messages; None for a dict

    def peer(self, peer_id: str) -> PeerConfig:
        for peer in self.peers:
            if peer.id == peer_id:
                return peer
        raise KeyError(peer_id)


@dataclass
class PeerCommand:
    """What `run_swarm` starts for one peer: `argv` in `cwd`, with the caller's environment plus `env`."""

    id: str
    argv: list[str]
    env: dict[str, str]  # additions to the caller's environment only
    output_dir: Path
    log_path: Path
    cmd_path: Path
    cwd: Path
    launcher: str
    main_process_port: int | None = None

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The caller's environment (secrets such as FTIS_SWARM_SECRET included) with this peer's additions."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


# --------------------------------------------------------------------------------------------------------------------
# Config loading and validation
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
        if name == "FTIS_PEER_ID":
            problems.add(where, "env.FTIS_PEER_ID is set by the launcher from the peer's `id`")
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


def _normalise_exchange_url(url: Any, run_dir: Path, problems: _Problems) -> str:
    if url is None:
        return f"dir://{run_dir / 'exchange'}"  # run_dir is absolute, so this is dir:///...
    if not isinstance(url, str) or "://" not in url:
        problems.add(
            "top level", f"`exchange_url` must be a URL such as dir:///shared/ftis or redis://host:6379/0, got {url!r}"
        )
        return ""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme == "memory":
        problems.add(
            "top level",
            "`exchange_url` memory:// only works inside one process, and peers are separate processes; "
            "use dir:// or redis://",
        )
        return ""
    if scheme not in EXCHANGE_SCHEMES:
        problems.add(
            "top level",
            f"`exchange_url` scheme {scheme!r} is not supported; use {', '.join(s + '://' for s in EXCHANGE_SCHEMES)}",
        )
        return ""
    if scheme == "dir":
        if not rest:
            problems.add("top level", "`exchange_url` dir:// needs a directory, e.g. dir:///shared/ftis")
            return ""
        # Absolute, so that every peer (and the logs) name the same directory whatever their working directory.
        return f"dir://{os.path.abspath(os.path.expanduser(rest))}"
    return scheme + "://" + rest


def _load_raw(path_or_dict: Any) -> tuple[Mapping, str | None, str]:
    """Returns (raw mapping, source path or None, default run-dir name)."""
    if isinstance(path_or_dict, Mapping):
        return path_or_dict, None, "swarm"
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise TypeError(f"load_swarm_config takes a path or a mapping, got {type(path_or_dict).__name__}")
    import yaml  # only needed for files

    path = Path(path_or_dict)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SwarmConfigError(f"cannot read swarm config {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SwarmConfigError(f"swarm config {path} is not valid YAML: {exc}") from exc
    if raw is None:
        raise SwarmConfigError(f"swarm config {path} is empty; it needs at least `script` and `peers`")
    if not isinstance(raw, Mapping):
        raise SwarmConfigError(f"swarm config {path} must be a mapping at the top level, got {type(raw).__name__}")
    return raw, str(path), path.stem


def load_swarm_config(
    path_or_dict: str | os.PathLike | Mapping, run_dir: str | os.PathLike | None = None
) -> SwarmConfig:
    """Read and validate a swarm config (a YAML file or an already-parsed mapping).

    `run_dir` (the CLI's ``--run-dir``) wins over the config's ``run_dir``; the default is ``runs/<config file
    stem>`` (``runs/swarm`` for a mapping). Relative paths (``script``, ``accelerate_config``, ``run_dir`` and a
    relative ``dir://`` exchange) are made absolute against the current directory.

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

    exchange_url = _normalise_exchange_url(raw.get("exchange_url"), resolved_run_dir, problems)

    default_launcher = raw.get("launcher", "python")
    if default_launcher not in LAUNCHERS:
        problems.add(top, f"`launcher` must be one of {', '.join(LAUNCHERS)}, got {default_launcher!r}")
        default_launcher = "python"
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
        peer = _validate_peer(index, entry, default_script, default_launcher, base_args, base_env, problems)
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
    return SwarmConfig(peers=peers, run_dir=resolved_run_dir, exchange_url=exchange_url, source=source)


def _validate_peer(
    index: int,
    entry: Any,
    default_script: Path | None,
    default_launcher: str,
    base_args: dict[str, Any],
    base_env: dict[str, str],
    problems: _Problems,
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
    elif not isinstance(peer_id, str) or not _PEER_ID_RE.match(peer_id) or peer_id in (".", "..") or peer_id[0] == "-":
        # The id names a directory and a command-line value: no "..", and no leading "-" (argparse would read a
        # flag).
        problems.add(
            where,
            f"`id` must be 1-64 letters, digits, '_', '.' or '-' (not '.', '..', nor starting with '-'), "
            f"got {peer_id!r}",
        )

    launcher = entry.get("launcher", default_launcher)
    if launcher not in LAUNCHERS:
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
        elif "FTIS_GPU_MEMORY_FRACTION" in own_env:
            problems.add(where, "`gpu_share` and env.FTIS_GPU_MEMORY_FRACTION both set; keep `gpu_share`")
        else:
            gpu_share = float(gpu_share)

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


# --------------------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------------------


def _render_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # what HfArgumentParser's string_to_bool accepts
    return str(value)


def render_args(args: Mapping[str, Any]) -> list[str]:
    """``{"lr": 0.1, "use_peft": True, "report_to": ["wandb", "none"], "x": None}`` ->
    ``["--lr", "0.1", "--use_peft", "true", "--report_to", "wandb", "none"]`` (None is omitted)."""
    out: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        out.append(f"--{key}")
        if isinstance(value, (list, tuple)):
            out.extend(_render_value(v) for v in value)
        else:
            out.append(_render_value(value))
    return out


def _free_port(taken: set[int]) -> int:
    """A TCP port nobody listens on right now, not already given to another peer of this swarm.

    The OS picks it (bind to port 0); another program could still take it before the peer binds it, which is
    unlikely within the second between here and the peer's start.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))  # all interfaces, as torch binds its store
            port = sock.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("could not find a free TCP port for accelerate's main_process_port")


def build_commands(config: SwarmConfig) -> list[PeerCommand]:
    """One `PeerCommand` per peer, in config order. Starts nothing and writes nothing.

    Each command is ``sys.executable SCRIPT`` (launcher python) or ``sys.executable -m accelerate.commands.launch
    [--config_file F] [--num_processes N] --main_process_port PORT SCRIPT`` (launcher accelerate; every accelerate
    peer gets a different free port so that no two peers ever join one process group), followed by
    ``--peer_id ID --exchange_url URL --output_dir RUN_DIR/ID`` and the peer's args.
    """
    ports: set[int] = set()
    swarm_name = config.run_dir.name  # runs/<config file stem> by default
    cwd = Path(os.getcwd())
    logs = config.run_dir / "logs"
    commands = []
    for peer in config.peers:
        output_dir = config.run_dir / peer.id
        port = None
        if peer.launcher == "accelerate":
            argv = [sys.executable, "-m", "accelerate.commands.launch"]
            if peer.accelerate_config is not None:
                argv += ["--config_file", str(peer.accelerate_config)]
            if peer.num_processes is not None:
                argv += ["--num_processes", str(peer.num_processes)]
            port = _free_port(ports)
            argv += ["--main_process_port", str(port)]
        else:
            argv = [sys.executable]
        argv.append(str(peer.script))
        argv += ["--peer_id", peer.id, "--exchange_url", config.exchange_url, "--output_dir", str(output_dir)]
        argv += render_args(peer.args)
        if "project" not in peer.args:  # trackio groups the peers' runs (each named after its peer) by project
            argv += ["--project", swarm_name]

        env = {"FTIS_PEER_ID": peer.id}
        # Peers write to a pipe; unbuffered output reaches the console and the log as it is printed, and a crash
        # cannot swallow the last lines.
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(peer.env)
        if "WANDB_RUN_GROUP" not in os.environ and "WANDB_RUN_GROUP" not in env:
            env["WANDB_RUN_GROUP"] = swarm_name  # wandb groups the peers' runs
        if peer.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = peer.gpus
        if peer.gpu_share is not None:
            env["FTIS_GPU_MEMORY_FRACTION"] = repr(peer.gpu_share)
        commands.append(
            PeerCommand(
                id=peer.id,
                argv=argv,
                env=env,
                output_dir=output_dir,
                log_path=logs / f"{peer.id}.log",
                cmd_path=logs / f"{peer.id}.cmd",
                cwd=cwd,
                launcher=peer.launcher,
                main_process_port=port,
            )
        )
    return commands


def check_files(config: SwarmConfig) -> list[str]:
    """Problems only visible on this machine (missing script or accelerate config, accelerate not installed)."""
    import importlib.util

    problems = []
    for peer in config.peers:
        if not peer.script.is_file():
            problems.append(f"peer {peer.id!r}: script {peer.script} does not exist")
        if peer.accelerate_config is not None and not peer.accelerate_config.is_file():
            problems.append(f"peer {peer.id!r}: accelerate_config {peer.accelerate_config} does not exist")
        if peer.launcher == "accelerate" and importlib.util.find_spec("accelerate") is None:
            problems.append(f"peer {peer.id!r}: launcher accelerate, but the accelerate package is not installed")
    return problems


# --------------------------------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------------------------------


def _is_secret_name(name: str) -> bool:
    return _SECRET_NAME_RE.search(name) is not None


def redact_text(text: str) -> str:
    """Hide the password of any ``scheme://user:password@host`` URL in `text`."""
    return _URL_PASSWORD_RE.sub(lambda m: m.group(1) + REDACTED + "@", text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the value of every variable named like a secret (SECRET, TOKEN, PASSWORD, ...) replaced."""
    return {k: (REDACTED if _is_secret_name(k) else redact_text(v)) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """`argv` with URL passwords and the values of secret-named options (``--hub_token X``) replaced."""
    out = []
    hide_next = False
    for item in argv:
        if hide_next and not item.startswith("--"):
            out.append(REDACTED)
            continue
        hide_next = item.startswith("--") and _is_secret_name(item[2:])
        out.append(redact_text(item))
    return out


def _shell_line(command: PeerCommand, env: Mapping[str, str]) -> str:
    parts = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join(["env", *parts, *(shlex.quote(a) for a in redact_argv(command.argv))])


def describe_commands(commands: list[PeerCommand], environ: Mapping[str, str] | None = None) -> str:
    """Human-readable commands for ``--dry-run``: secrets redacted, the rest copy-pasteable."""
    environ = os.environ if environ is None else environ
    passed = sorted(k for k in environ if _is_secret_name(k) and k not in (c for cmd in commands for c in cmd.env))
    lines = []
    for command in commands:
        port = f", main_process_port {command.main_process_port}" if command.main_process_port else ""
        lines.append(f"# peer {command.id} (launcher {command.launcher}{port}; log {command.log_path})")
        lines.append("# env additions: " + " ".join(f"{k}={v}" for k, v in redact_env(command.env).items()))
        lines.append(f"cd {shlex.quote(str(command.cwd))} && {_shell_line(command, redact_env(command.env))}")
        lines.append("")
    if passed:
        lines.append(
            "# passed through from your environment (values hidden): " + " ".join(f"{k}={REDACTED}" for k in passed)
        )
    return "\n".join(lines).rstrip("\n") + "\n"


def dry_run(config: SwarmConfig, stream: TextIO | None = None) -> int:
    """Print what `run_swarm` would start; start nothing, write nothing. Returns 0."""
    stream = sys.stdout if stream is None else stream
    commands = build_commands(config)
    stream.write(
        f"# swarm: {len(commands)} peer(s), run_dir {config.run_dir}, exchange {redact_text(config.exchange_url)}\n"
    )
    stream.write(
        "# accelerate ports are picked again at launch\n" if any(c.main_process_port for c in commands) else ""
    )
    stream.write(describe_commands(commands))
    for problem in check_files(config):
        stream.write(f"# warning: {problem}\n")
    stream.flush()
    return 0


def _write_cmd_file(command: PeerCommand):
    """The exact command (secrets redacted) and environment of a peer, to reproduce or debug it by hand."""
    inherited = redact_env({k: v for k, v in os.environ.items() if k not in command.env})
    lines = [
        f"# peer {command.id}: started by `trl-ftis swarm` at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"# argv (JSON): {json.dumps(redact_argv(command.argv))}",
        f"cd {shlex.quote(str(command.cwd))} && {_shell_line(command, redact_env(command.env))}",
        "",
        "# environment added by the launcher:",
        *(f"#   {k}={v}" for k, v in redact_env(command.env).items()),
        "# inherited environment (secret-named values redacted):",
        *(f"#   {k}={v}" for k, v in sorted(inherited.items())),
    ]
    command.cmd_path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------------------------------
# Finding every process a peer started
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    sid: int
    state: str
    start: int  # clock ticks after boot: with the pid, identifies a process even if its pid is reused later


def _read_proc_table() -> dict[int, _Proc] | None:
    """Every live process from /proc (Linux), zombies left out; None where /proc is not available."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    if "self" not in names:
        return None
    table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces and parentheses: fields restart after the last ')'.
        fields = data[data.rfind(b")") + 2 :].split()
        try:
            proc = _Proc(
                int(name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), int(fields[19])
            )
        except (IndexError, ValueError):
            continue
        if proc.state not in ("Z", "X"):  # a zombie has already exited; its parent just has not collected it
            table[proc.pid] = proc
    return table


class _ProcessTracker:
    """Finds every live process started by the peers, so that none outlives the launcher.

    Each peer starts in its own session and process group (id = its pid), and most of what it starts stays in
    that group. Some programs move their children into new sessions, e.g. torchrun (accelerate launch with
    several processes) puts every worker in its own: those are found as descendants of a peer and remembered by
    (pid, start time), so they are still found once orphaned. Without /proc (not Linux), only process groups are
    used.
    """

    def __init__(self):
        self.groups: dict[int, str] = {}  # pgid (= peer pid) -> peer id
        self.leaders: dict[int, int | None] = {}  # peer pid -> start time (None: exited before we looked)
        self.known: dict[int, int] = {}  # pid -> start time
        self.procfs = _read_proc_table() is not None
        self.me = os.getpid()

    def add_peer(self, pid: int, peer_id: str):
        self.groups[pid] = peer_id
        if self.procfs:
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    data = handle.read()
                self.leaders[pid] = int(data[data.rfind(b")") + 2 :].split()[19])
            except (OSError, IndexError, ValueError):
                self.leaders[pid] = None

    def scan(self) -> dict[int, _Proc]:
        """Live processes belonging to the swarm (Linux); also refreshes what is remembered."""
        table = _read_proc_table()
        if table is None:
            return {}
        found = {}
        for proc in table.values():
            if proc.pid == self.me:
                continue
            if proc.pgrp in self.groups or proc.sid in self.groups or self.known.get(proc.pid) == proc.start:
                found[proc.pid] = proc
        children: dict[int, list[_Proc]] = {}
        for proc in table.values():
            children.setdefault(proc.ppid, []).append(proc)
        # A peer's own pid counts only while it is the same process (its pid may be reused once it has exited).
        leaders = [pid for pid, start in self.leaders.items() if pid in table and table[pid].start == start]
        stack = list(found) + leaders
        while stack:
            for child in children.get(stack.pop(), ()):
                if child.pid not in found and child.pid != self.me:
                    found[child.pid] = child
                    stack.append(child.pid)
        self.known = {pid: proc.start for pid, proc in found.items()}
        return found

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def alive(self) -> list[int]:
        """Pids still running (Linux), or pgids of groups that still have members (elsewhere)."""
        if self.procfs:
            return sorted(self.scan())
        return [pgid for pgid in self.groups if self._group_alive(pgid)]

    def signal_all(self, sig: int):
        """`sig` to every peer process group with live members and to every other swarm process found."""
        if not self.procfs:
            for pgid in self.groups:
                _quiet_killpg(pgid, sig)
            return
        found = self.scan()
        live_groups = {proc.pgrp for proc in found.values() if proc.pgrp in self.groups}
        for pgid in live_groups:
            _quiet_killpg(pgid, sig)  # atomic for the whole group, even for a process forked a moment ago
        for proc in found.values():
            if proc.pgrp not in live_groups:
                try:
                    os.kill(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass


def _quiet_killpg(pgid: int, sig: int):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent():
    """preexec_fn: on Linux, SIGTERM the peer if the launcher dies without stopping it (e.g. kill -9)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


# --------------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _PeerRun:
    command: PeerCommand
    proc: subprocess.Popen | None = None
    started: float = 0.0  # time.monotonic()
    started_at: float = 0.0  # time.time(), for the summary file's staleness check
    ended: float | None = None
    returncode: int | None = None
    status: str = "not started"
    reader: threading.Thread | None = None
    waiter: threading.Thread | None = None


class _Swarm:
    POLL = 0.1  # seconds between checks for signals while waiting
    SCAN_EVERY = 0.5  # seconds between /proc scans while running (to remember re-parented descendants)

    def __init__(self, config: SwarmConfig, grace: float, stream: TextIO):
        self.config = config
        self.grace = grace
        self.stream = stream
        self.commands = build_commands(config)
        self.runs = [_PeerRun(c) for c in self.commands]
        width = max(len(c.id) for c in self.commands)
        self.prefixes = {c.id: f"[{c.id}]".ljust(width + 2) + " " for c in self.commands}
        self.own_prefix = "[swarm]".ljust(max(width + 2, 7)) + " "
        self.lock = threading.Lock()
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # SimpleQueue.put is safe in a signal handler
        self.signals: list[int] = []
        self.stop_started: float | None = None
        self.tracker = _ProcessTracker()

    # ---- output ----------------------------------------------------------------------------------------------

    def emit(self, line: str):
        with self.lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed console (e.g. `| head`) must not stop the supervision; the logs still get everything

    def say(self, message: str):
        self.emit(self.own_prefix + message)

    def _pump(self, run: _PeerRun, log):
        """Reader thread: each line to the log file (raw, unbuffered) and to the console (prefixed)."""
        prefix = self.prefixes[run.command.id]
        try:
            for raw in iter(lambda: run.proc.stdout.readline(65536), b""):
                try:
                    log.write(raw)
                except OSError:
                    pass
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                # Progress bars redraw with '\r': show only the last state on the console.
                text = text.rsplit("\r", 1)[-1] if "\r" in text else text
                self.emit(prefix + text)
        finally:
            log.close()
            run.proc.stdout.close()

    def _wait(self, index: int, run: _PeerRun):
        """Waiter thread: a peer's exit is reported when its main process exits, even if children keep the pipe."""
        code = run.proc.wait()
        self.events.put(("exit", index, code, time.monotonic()))

    def _on_signal(self, signum, frame):
        self.signals.append(signum)
        self.events.put(("signal", signum, None, None))

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def start(self):
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        (self.config.run_dir / "logs").mkdir(exist_ok=True)
        if self.config.exchange_url.startswith("dir://"):
            Path(self.config.exchange_url[len("dir://") :]).mkdir(parents=True, exist_ok=True)
        self.say(f"run_dir {self.config.run_dir}; exchange {redact_text(self.config.exchange_url)}")
        preexec = _die_with_parent()
        logs = []
        error = None
        for index, run in enumerate(self.runs):
            if self.signals:
                break
            command = run.command
            command.output_dir.mkdir(parents=True, exist_ok=True)
            _write_cmd_file(command)
            log = open(command.log_path, "wb", buffering=0)  # noqa: SIM115 - closed by the reader thread
            try:
                run.proc = subprocess.Popen(
                    command.argv,
                    cwd=command.cwd,
                    env=command.full_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stopped as a whole, and Ctrl-C reaches only us
                    preexec_fn=preexec,  # noqa: PLW1509 - no thread of ours runs yet (see below); it only calls prctl
                )
            except OSError as exc:
                log.close()
                run.status = "failed to start"
                self.say(f"peer {command.id}: could not start: {exc}")
                error = exc
                break
            run.started, run.started_at, run.status = time.monotonic(), time.time(), "running"
            self.tracker.add_peer(run.proc.pid, command.id)
            logs.append((index, run, log))
            self.say(f"started {command.id} (pid {run.proc.pid}); log {command.log_path}")
        # Threads only after every fork: preexec_fn is only safe while this process has no other threads of ours.
        for index, run, log in logs:
            run.reader = threading.Thread(
                target=self._pump, args=(run, log), name=f"swarm-read-{run.command.id}", daemon=True
            )
            run.waiter = threading.Thread(
                target=self._wait, args=(index, run), name=f"swarm-wait-{run.command.id}", daemon=True
            )
            run.reader.start()
            run.waiter.start()
        if error is not None:
            raise error  # after the threads: the peers already started are stopped and reported like the others

    def _record_exit(self, index: int, code: int, when: float):
        run = self.runs[index]
        if run.returncode is not None:
            return
        run.returncode, run.ended = code, when
        if self.stop_started is not None and when >= self.stop_started:
            run.status = "stopped"
        else:
            run.status = "ok" if code == 0 else "failed"

    def supervise(self) -> tuple[int, str]:
        """Waits until every peer exited 0, one failed, or a signal came. Returns (exit code, reason)."""
        started = [r for r in self.runs if r.proc is not None]
        remaining = len(started)
        next_scan = 0.0
        while True:
            if self.signals:
                name = signal.Signals(self.signals[0]).name
                return INTERRUPTED_EXIT_CODE, f"interrupted by {name}"
            if remaining == 0:
                return 0, "all peers finished"
            try:
                kind, a, b, c = self.events.get(timeout=self.POLL)
            except queue.Empty:
                kind = None
            if kind == "exit":
                self._record_exit(a, b, c)
                remaining -= 1
                run = self.runs[a]
                if b != 0:
                    self.say(f"peer {run.command.id} exited with code {_describe_code(b)}; stopping the other peers")
                    return 1, f"peer {run.command.id} exited with code {b}"
                self.say(f"peer {run.command.id} finished (exit code 0)")
            if self.tracker.procfs and time.monotonic() >= next_scan:
                self.tracker.scan()  # remember descendants while their parents still lead back to a peer
                next_scan = time.monotonic() + self.SCAN_EVERY

    def stop(self):
        """SIGTERM everything the swarm started, wait up to `grace` seconds, then SIGKILL what is left."""
        self.stop_started = time.monotonic()
        alive = self.tracker.alive()
        if not alive:
            return
        unfinished = [
            r.command.id for r in self.runs if r.proc is not None and r.returncode is None and r.proc.poll() is None
        ]
        what = f"peers {', '.join(unfinished)}" if unfinished else f"processes left behind by the peers (pids {alive})"
        self.say(f"stopping {what}: SIGTERM, then SIGKILL after {self.grace:g}s")
        signals_before = len(self.signals)
        self.tracker.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and len(self.signals) == signals_before:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
            alive = self.tracker.alive()
            if not alive:
                return
        if len(self.signals) != signals_before:
            self.say("second signal: killing the peers now")
        # SIGKILL can't be ignored; repeat in case something forked between scan and kill.
        deadline = time.monotonic() + 10.0
        while alive and time.monotonic() < deadline:
            self.say(f"still running: pids {alive}; sending SIGKILL")
            self.tracker.signal_all(signal.SIGKILL)
            time.sleep(0.05)
            for _ in range(20):
                alive = self.tracker.alive()
                if not alive:
                    break
                time.sleep(0.05)
        if alive:
            self.say(f"WARNING: could not stop pids {alive} (uninterruptible?); they may still be running")

    def finish(self, timeout: float = 10.0):
        """Collect exit codes and the last output lines of every peer."""
        deadline = time.monotonic() + timeout
        for run in self.runs:
            if run.waiter is not None:
                run.waiter.join(max(deadline - time.monotonic(), 0.1))
        while True:
            try:
                kind, a, b, c = self.events.get_nowait()
            except queue.Empty:
                break
            if kind == "exit":
                self._record_exit(a, b, c)
        for run in self.runs:
            if run.reader is not None:
                run.reader.join(max(deadline - time.monotonic(), 0.1))


def _describe_code(code: int | None) -> str:
    if code is None:
        return "-"
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _format_field(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def _read_peer_summary(path: Path, not_before: float | None) -> tuple[dict | None, str | None]:
    """(fields, note): the peer's own ftis_summary.json, or a note saying why it is not shown. Never raises."""
    try:
        if not path.exists():
            return None, None
        if not_before is not None and path.stat().st_mtime < not_before - 1.0:
            return None, f"{path} is older than this run (left from an earlier one?); not shown"
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return None, f"could not read {path}: {exc}"
    if not isinstance(data, dict):
        return None, f"{path} does not hold a JSON object; not shown"
    return {key: data.get(key) for key in SUMMARY_FIELDS}, None


def _summary_rows(runs: list[_PeerRun]) -> list[dict]:
    rows = []
    for run in runs:
        wall = (run.ended - run.started) if run.ended is not None and run.started else None
        fields, note = _read_peer_summary(run.command.output_dir / SUMMARY_FILE, run.started_at or None)
        row = {
            "id": run.command.id,
            "status": run.status,
            "exit_code": run.returncode,
            "wall_time_s": None if wall is None else round(wall, 3),
            "pid": run.proc.pid if run.proc is not None else None,
            "log": str(run.command.log_path),
        }
        for key in SUMMARY_FIELDS:
            row[key] = fields.get(key) if fields else None
        row["note"] = note
        rows.append(row)
    return rows


def format_summary_table(rows: list[dict]) -> str:
    """The end-of-run table: one line per peer, `-` for anything unknown, notes below."""
    header = ["peer", "status", "exit", "wall", *SUMMARY_FIELDS]
    table = [header]
    for row in rows:
        table.append(
            [
                row["id"],
                row["status"],
                _describe_code(row["exit_code"]),
                _format_seconds(row["wall_time_s"]),
                *(_format_field(row[key]) for key in SUMMARY_FIELDS),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = []
    for n, line in enumerate(table):
        cells = [cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [f"note: {row['id']}: {row['note']}" for row in rows if row.get("note")]
    return "\n".join(lines + notes)


def _install_handlers(handler) -> dict:
    """Route SIGINT/SIGTERM/SIGHUP to `handler` (main thread only; elsewhere Python cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            previous[sig] = signal.signal(sig, handler)
    return previous


def run_swarm(config: SwarmConfig, *, grace: float = 10.0, stream: TextIO | None = None) -> int:
    """Start every peer, supervise them, print a summary table; returns the exit code for the command line.

    * 0: every peer exited 0.
    * 1: a peer exited non-zero (or could not start); every other peer was stopped.
    * 130: SIGINT (Ctrl-C), SIGTERM or SIGHUP reached the launcher; every peer was stopped.

    Stopping means SIGTERM to each peer's process group (and to any process a peer moved out of it), `grace`
    seconds to exit, then SIGKILL. A second Ctrl-C skips the rest of the grace period. The same clean-up runs when
    all peers succeeded, for anything they left running, so no process started by the swarm outlives this call.

    Console lines are written to `stream` (default: sys.stdout) prefixed with ``[<id>]``; each peer's raw output
    goes to ``<run_dir>/logs/<id>.log``, its command and environment (secrets redacted) to ``<id>.cmd``, and the
    summary table to ``<run_dir>/summary.json``. Signal handlers are installed only when called from the main thread.

    Raises `SwarmConfigError` before anything starts when a script or accelerate config file is missing.
    """
    stream = sys.stdout if stream is None else stream
    if not (grace >= 0):
        raise ValueError(f"grace must be >= 0 seconds, got {grace}")
    problems = check_files(config)
    if problems:
        raise SwarmConfigError("cannot start the swarm:\n" + "\n".join(f"  - {p}" for p in problems), problems)

    swarm = _Swarm(config, grace, stream)
    previous = _install_handlers(swarm._on_signal)
    code, reason = 1, "launcher error"
    try:
        try:
            swarm.start()
            code, reason = swarm.supervise()
        except OSError as exc:
            code, reason = 1, f"could not start the swarm: {exc}"
        finally:
            # Runs on success, failure, signal and on any bug above: nothing may outlive the launcher.
            swarm.stop()
            swarm.finish()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    rows = _summary_rows(swarm.runs)
    summary = {
        "exit_code": code,
        "reason": reason,
        "run_dir": str(config.run_dir),
        "exchange_url": redact_text(config.exchange_url),
        "config": os.path.abspath(config.source) if config.source else None,
        "peers": rows,
    }
    try:
        (config.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        swarm.say(f"could not write {config.run_dir / 'summary.json'}: {exc}")
    swarm.emit("")
    swarm.emit(format_summary_table(rows))
    swarm.say(f"{reason}; exit code {code}; summary in {config.run_dir / 'summary.json'}")
    return code
