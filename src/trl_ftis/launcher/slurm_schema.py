"""The SLURM part of the swarm config: `launcher: slurm`, the `slurm:` resources (top level and per peer) and the
`redis:` job, validated like the rest of the schema (every problem at once, each naming the peer and the key).

`schema.load_swarm_config` calls the `validate_*` functions below; they report problems through an `add(where,
message)` callback and return plain values, so this module imports nothing from the rest of the launcher. Standard
library only (submitit is needed only to submit, see `launcher/slurm.py`).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "REDIS_JOB_EXCHANGE",
    "REDIS_KEYS",
    "SLURM_KEYS",
    "RedisJobConfig",
    "SlurmResources",
    "parse_slurm_time",
]

Add = Callable[[str, str], None]

SLURM_KEYS = ("nodes", "gpus", "cpus", "mem", "time", "partition", "account", "extra", "setup")
# The Redis job: what it runs, plus the SLURM keys that make sense for one small CPU job.
REDIS_KEYS = ("start", "port", "password", "server", "start_timeout", "cpus", "mem", "time", "partition", "account")
REDIS_KEYS = (*REDIS_KEYS, "extra", "setup")
# What `SwarmConfig.exchange_url` holds while the address of the Redis job the launcher starts is not known yet
# (`--dry-run` shows it; `run_swarm` replaces it with redis://HOST:PORT/0 once the job answers).
REDIS_JOB_EXCHANGE = "redis://<redis-job-host>:<port>/0"

# sbatch options the launcher writes itself: `extra` may not set them (the value would silently disagree).
_SBATCH_SET_BY_KEY = {
    "nodes": "slurm.nodes",
    "gpus-per-node": "slurm.gpus",
    "cpus-per-task": "slurm.cpus",
    "mem": "slurm.mem",
    "time": "slurm.time",
    "partition": "slurm.partition",
    "account": "slurm.account",
}
_SBATCH_SET_BY_LAUNCHER = (
    "job-name",
    "output",
    "error",
    "open-mode",
    "ntasks",
    "ntasks-per-node",
    "array",
    "signal",
    "wrap",
    "parsable",
    "wait",
)
_SBATCH_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
_NAME_RE = re.compile(r"^[^\s'\"\\]+$")  # partition, account: one word (a comma-separated list for partitions)
_MEM_RE = re.compile(r"^(0|[1-9][0-9]*)([KMGTkmgt][Bb]?)?$")
# SLURM's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


# --------------------------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------------------------


class ColonInt(int):
    """An integer YAML 1.1 read from a base-60 literal: unquoted `4:00:00` is 14400 to PyYAML. `schema`'s loader
    keeps the text so that `time: 4:00:00` means four hours, as SLURM reads it, not 14400 minutes."""

    text: str

    def __new__(cls, value: int, text: str):
        obj = super().__new__(cls, value)
        obj.text = text
        return obj


def parse_slurm_time(value: Any) -> int | None:
    """Minutes (rounded up, at least 1) of a `time` value: an integer number of minutes, or a SLURM time string
    (`"30"`, `"30:00"` = 30 min, `"04:00:00"`, `"1-00:00:00"`, `"2-12"` = 2 days 12 hours). `None` if invalid."""
    if isinstance(value, ColonInt):
        value = value.text
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, float):
        return math.ceil(value) if math.isfinite(value) and value > 0 else None
    if not isinstance(value, str):
        return None
    match = _TIME_RE.match(value.strip())
    if match is None:
        return None
    days, first, second, third = match.groups()
    numbers = [int(first)] + [int(x) for x in (second, third) if x is not None]
    if days is not None:
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif len(numbers) == 1:
        total = numbers[0] * 60
    elif len(numbers) == 2:
        total = numbers[0] * 60 + numbers[1]
    else:
        total = (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]
    if any(n >= 60 for n in numbers[1:]):
        return None  # 1:75 is a typo, not 2 h 15 min
    minutes = math.ceil(total / 60)
    return minutes if minutes >= 1 else None


def format_minutes(minutes: int) -> str:
    """`90` -> `"1:30:00"`, `1500` -> `"1-01:00:00"` (for messages and the dry run)."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours}:{mins:02d}:00"


@dataclass(frozen=True)
class SlurmResources:
    """What one SLURM job asks for. `None` leaves a value to the cluster's defaults (no such `#SBATCH` line).

    `extra` holds sbatch options as `(name, value)`, value `True` for a flag (`--exclusive`); `setup` shell lines run
    in the batch script before the job's command."""

    nodes: int = 1
    gpus: int | None = None  # per node
    cpus: int | None = None  # per task (one task per node)
    mem: str | None = None  # per node, SLURM's --mem syntax (MB without a unit)
    time: int | None = None  # minutes
    partition: str | None = None
    account: str | None = None
    extra: tuple[tuple[str, str | bool], ...] = ()
    setup: tuple[str, ...] = ()

    def sbatch_options(self) -> dict[str, str | bool]:
        """The `#SBATCH` options these resources write (name without `--` -> value, `True` for a flag)."""
        options: dict[str, str | bool] = {"nodes": str(self.nodes), "ntasks-per-node": "1"}
        for name, value in (
            ("gpus-per-node", self.gpus),
            ("cpus-per-task", self.cpus),
            ("mem", self.mem),
            ("time", self.time),
            ("partition", self.partition),
            ("account", self.account),
        ):
            if value is not None:
                options[name] = str(value)
        options.update(self.extra)
        return options

    def submitit_parameters(self) -> dict[str, Any]:
        """Keyword arguments for `submitit.SlurmExecutor.update_parameters` (job name and folder excluded)."""
        params: dict[str, Any] = {
            "nodes": self.nodes,
            "ntasks_per_node": 1,
            "cpus_per_task": self.cpus,
            "gpus_per_node": self.gpus,
            "mem": self.mem,
            "time": self.time,  # None: no --time line, the partition's default applies
            "partition": self.partition,
            "account": self.account,
            "setup": list(self.setup) or None,
            "wckey": None,  # submitit's default "submitit" would be refused where wckeys are enforced
            "additional_parameters": {name: value for name, value in self.extra} or None,
        }
        return params


@dataclass(frozen=True)
class RedisJobConfig:
    """The Redis server job the launcher submits before the peers (top-level `redis:` with `start: true`)."""

    port: int = 0  # 0: a free port on the node the job lands on
    password: bool = True  # a password for the server (generated, or $FTIS_REDIS_PASSWORD); never printed
    server: str = "redis-server"
    start_timeout: float = 120.0  # seconds from the job running to the server answering
    resources: SlurmResources = field(default_factory=lambda: SlurmResources(cpus=1))


# --------------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------------


def unknown_key(key: Any, allowed: tuple[str, ...], prefix: str) -> str:
    hint = difflib.get_close_matches(str(key), allowed, n=1)
    did_you_mean = f"; did you mean `{prefix}{hint[0]}`?" if hint else ""
    return f"unknown key `{prefix}{key}` (allowed: {', '.join(allowed)}){did_you_mean}"


def _positive_int(value: Any, minimum: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return None
    return int(value)


def _parse_extra_item(item: Any) -> tuple[str, str | bool] | str:
    """`"--qos=high"` / `"--qos high"` / `"#SBATCH --qos=high"` -> `("qos", "high")`; `"--exclusive"` ->
    `("exclusive", True)`; a problem string otherwise."""
    if not isinstance(item, str) or not item.strip():
        return f"must be an sbatch option string such as '--qos=high', got {item!r}"
    text = item.strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH") :].strip()
    if any(ch in text for ch in "\n\r\x00"):
        return "must be one line"
    if not text.startswith("--"):
        return f"write the long form of the option, e.g. '--qos=high' (got {item!r})"
    name, sep, value = text[2:].partition("=")
    if not sep and " " in name:
        name, _, value = name.partition(" ")
        sep = " "
    name, value = name.strip(), value.strip()
    if not _SBATCH_NAME_RE.match(name):
        return f"{item!r} is not an sbatch option"
    if sep and not value:
        return f"{item!r} has no value after {sep.strip() or 'the space'}"
    return (name, value if sep else True)


def validate_slurm_mapping(raw: Any, where: str, add: Add, *, prefix: str = "slurm.") -> dict[str, Any]:
    """The keys set in one `slurm:` mapping (top level or a peer's), validated; `None` values are kept (they drop a
    top-level default in a peer)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        add(where, f"`{prefix.rstrip('.')}` must be a mapping of SLURM resources ({', '.join(SLURM_KEYS)})")
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in SLURM_KEYS:
            add(where, unknown_key(key, SLURM_KEYS, prefix))
            continue
        checked = _check_slurm_value(key, value, where, add, prefix)
        if checked is not _INVALID:
            out[key] = checked
    return out


_INVALID = object()


def _check_slurm_value(key: str, value: Any, where: str, add: Add, prefix: str) -> Any:
    name = f"`{prefix}{key}`"
    if value is None:
        return None
    if key in ("nodes", "cpus", "gpus"):
        number = _positive_int(value, 0 if key == "gpus" else 1)
        if number is None:
            floor = "0" if key == "gpus" else "1"
            meaning = {"nodes": "nodes", "cpus": "CPUs per task", "gpus": "GPUs per node"}[key]
            add(where, f"{name} must be an integer >= {floor} ({meaning}), got {value!r}")
            return _INVALID
        return number
    if key == "mem":
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not _MEM_RE.match(text.strip()):
            add(where, f"{name} must be a memory size per node such as 64G, 500M or 32000 (MB), got {value!r}")
            return _INVALID
        return text.strip().upper()
    if key == "time":
        minutes = parse_slurm_time(value)
        if minutes is None:
            add(
                where,
                f'{name} must be minutes (an integer >= 1) or a SLURM time such as "04:00:00" or "1-12:00:00" '
                f"(quote it in YAML), got {getattr(value, 'text', value)!r}",
            )
            return _INVALID
        return minutes
    if key in ("partition", "account"):
        if not isinstance(value, str) or not _NAME_RE.match(value.strip()):
            add(where, f"{name} must be a {key} name (one word), got {value!r}")
            return _INVALID
        return value.strip()
    if key == "extra":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            add(where, f"{name} must be a list of sbatch options such as ['--qos=high'], got {type(value).__name__}")
            return _INVALID
        out, seen, ok = [], set(), True
        for index, item in enumerate(items):
            parsed = _parse_extra_item(item)
            if isinstance(parsed, str):
                add(where, f"`{prefix}extra[{index}]` {parsed}")
                ok = False
                continue
            option = parsed[0]
            if option in _SBATCH_SET_BY_KEY:
                add(where, f"`{prefix}extra[{index}]` --{option}: use the key `{_SBATCH_SET_BY_KEY[option]}`")
                ok = False
            elif option in _SBATCH_SET_BY_LAUNCHER:
                add(where, f"`{prefix}extra[{index}]` --{option} is set by the launcher")
                ok = False
            elif option in seen:
                add(where, f"`{prefix}extra[{index}]` --{option} is given twice")
                ok = False
            seen.add(option)
            out.append(parsed)
        return tuple(out) if ok else _INVALID
    if key == "setup":
        lines = value.splitlines() if isinstance(value, str) else value
        if not isinstance(lines, (list, tuple)) or not all(isinstance(line, str) for line in lines):
            add(where, f"{name} must be shell lines (a string or a list of strings), got {value!r}")
            return _INVALID
        if any("\x00" in line for line in lines):
            add(where, f"{name} must not contain NUL characters")
            return _INVALID
        return tuple(line for line in lines if line.strip())
    raise AssertionError(key)


def merge_resources(*layers: Mapping[str, Any], base: SlurmResources | None = None) -> SlurmResources:
    """`base` (default: all cluster defaults) overridden by each layer in turn, key by key; a `None` value drops the
    key back to its default."""
    resources = base or SlurmResources()
    defaults = SlurmResources()
    for layer in layers:
        changes = {key: (getattr(defaults, key) if value is None else value) for key, value in layer.items()}
        resources = replace(resources, **changes)
    return resources


def validate_redis(raw: Any, top_slurm: Mapping[str, Any], add: Add) -> tuple[RedisJobConfig | None, bool | None]:
    """The top-level `redis:` mapping -> (the Redis job or None, `start` as written or None when absent). The job
    inherits the top-level `slurm` partition, account, time, extra and setup unless it sets its own; it never
    inherits nodes, GPUs, CPUs or memory (it is one small CPU job: 1 CPU unless `redis.cpus`)."""
    where = "top level"
    if raw is None:
        return None, None
    if not isinstance(raw, Mapping):
        add(where, f"`redis` must be a mapping such as {{start: true}}, got {type(raw).__name__}")
        return None, None
    ok = True
    for key in raw:
        if key not in REDIS_KEYS:
            hint = " (the Redis job is one CPU job on one node)" if key in ("nodes", "gpus") else ""
            add(where, unknown_key(key, REDIS_KEYS, "redis.") + hint)
            ok = False
    start = raw.get("start", True)
    if not isinstance(start, bool):
        add(where, f"`redis.start` must be true or false, got {start!r}")
        ok, start = False, None
    port = raw.get("port", 0)
    if _positive_int(port, 0) is None or port > 65535:
        add(where, f"`redis.port` must be a TCP port (1-65535), or 0 for a free port on the job's node, got {port!r}")
        ok = False
    password = raw.get("password", True)
    if not isinstance(password, bool):
        add(
            where,
            "`redis.password` must be true or false: with true the launcher uses $FTIS_REDIS_PASSWORD or makes a "
            "random password and hands it to the server and the peers (never write a password in the config)",
        )
        ok = False
    server = raw.get("server", "redis-server")
    if not isinstance(server, str) or not server.strip() or any(ch in server for ch in "\n\x00"):
        add(where, f"`redis.server` must be the redis-server program (a name on PATH or a path), got {server!r}")
        ok = False
    timeout = raw.get("start_timeout", 120)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout < math.inf):
        add(where, f"`redis.start_timeout` must be a number of seconds > 0, got {timeout!r}")
        ok = False
    own = validate_slurm_mapping({k: v for k, v in raw.items() if k in SLURM_KEYS}, where, add, prefix="redis.")
    if not ok or start is None:
        return None, start
    inherited = {k: v for k, v in top_slurm.items() if k in ("partition", "account", "time", "extra", "setup")}
    resources = merge_resources(inherited, own, base=SlurmResources(cpus=1))
    job = RedisJobConfig(
        port=int(port), password=password, server=server.strip(), start_timeout=float(timeout), resources=resources
    )
    return job, start
