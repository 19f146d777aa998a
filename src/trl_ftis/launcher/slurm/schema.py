"""The SLURM section of the swarm config: the `slurm:` resources (top level and per peer) and the `redis:` job, as
pydantic models of the schema (`validation.Spec`): every problem at once, each naming the peer and the key.

`SlurmResources` is both the schema of one `slurm:` mapping and the value the launcher submits with: a peer's
resources are the top-level mapping overridden key by key by its own (`merge_resources`, through the keys each one
set). `RedisSpec` is the `redis:` mapping; `schema.load_swarm_config` turns it into the `RedisJobConfig` of the job
the launcher starts. Standard library and pydantic only (submitit is needed only to submit, see
`launcher/slurm/backend.py`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field

from ..schema_values import ColonInt
from ..validation import Spec, bad

__all__ = [
    "REDIS_JOB_EXCHANGE",
    "REDIS_KEY",
    "SLURM_KEY",
    "REDIS_KEYS",
    "SLURM_KEYS",
    "RedisJobConfig",
    "RedisSpec",
    "SlurmResources",
    "format_minutes",
    "job_resources",
    "merge_resources",
    "parse_slurm_time",
    "redis_job",
]

# What `SwarmConfig.exchange_url` holds while the address of the Redis job the launcher starts is not known yet
# (`--dry-run` shows it; the SLURM backend replaces it with redis://HOST:PORT/0 once the job answers).
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


# --------------------------------------------------------------------------------------------------------------------
# The validators of the resource keys (shared by `slurm:` and `redis:`)
# --------------------------------------------------------------------------------------------------------------------


def _count(minimum: int, meaning: str, default: int | None = None):
    def check(value: Any) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise bad(f"must be an integer >= {minimum} ({meaning}), got {value!r}")
        return int(value)

    return check


def _mem(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _MEM_RE.match(text.strip()):
        raise bad(f"must be a memory size per node such as 64G, 500M or 32000 (MB), got {value!r}")
    return text.strip().upper()


def _time(value: Any) -> int | None:
    if value is None:
        return None
    minutes = parse_slurm_time(value)
    if minutes is None:
        raise bad(
            'must be minutes (an integer >= 1) or a SLURM time such as "04:00:00" or "1-12:00:00" (quote it in YAML), '
            f"got {getattr(value, 'text', value)!r}"
        )
    return minutes


def _word(what: str):
    def check(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not _NAME_RE.match(value.strip()):
            raise bad(f"must be a {what} name (one word), got {value!r}")
        return value.strip()

    return check


def _parse_extra_item(item: Any) -> tuple[str, str | bool] | str:
    """`"--qos=high"` / `"--qos high"` / `"#SBATCH --qos=high"` -> `("qos", "high")`; `"--exclusive"` ->
    `("exclusive", True)`; a problem string otherwise. An already parsed `(name, value)` pair is kept."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        return item
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


def _extra(value: Any) -> tuple[tuple[str, str | bool], ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise bad(f"must be a list of sbatch options such as ['--qos=high'], got {type(value).__name__}")
    out, seen, found = [], set(), []
    for index, item in enumerate(items):
        parsed = _parse_extra_item(item)
        if isinstance(parsed, str):
            found.append((index, parsed))
            continue
        option = parsed[0]
        if option in _SBATCH_SET_BY_KEY:
            found.append((index, f"--{option}: use the key `{_SBATCH_SET_BY_KEY[option]}`"))
        elif option in _SBATCH_SET_BY_LAUNCHER:
            found.append((index, f"--{option} is set by the launcher"))
        elif option in seen:
            found.append((index, f"--{option} is given twice"))
        seen.add(option)
        out.append(parsed)
    if found:  # every bad item at once: the first after the key's path, the others after it
        index, message = found[0]
        others = "".join(f"; `[{other}]`: {text}" for other, text in found[1:])
        raise bad(message + others, suffix=f"[{index}]")
    return tuple(out)


def _setup(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    lines = value.splitlines() if isinstance(value, str) else value
    if not isinstance(lines, (list, tuple)) or not all(isinstance(line, str) for line in lines):
        raise bad(f"must be shell lines (a string or a list of strings), got {value!r}")
    if any("\x00" in line for line in lines):
        raise bad("must not contain NUL characters")
    # One line per item (an item holding a newline is its lines): the dry run and the `.cmd` file show each one on a
    # comment line of its own, and submitit writes them one per line all the same.
    return tuple(part for line in lines for part in line.splitlines() if part.strip())


Nodes = Annotated[int, BeforeValidator(_count(1, "nodes", default=1))]
Gpus = Annotated[int | None, BeforeValidator(_count(0, "GPUs per node"))]
Cpus = Annotated[int | None, BeforeValidator(_count(1, "CPUs per task"))]
Mem = Annotated[str | None, BeforeValidator(_mem)]
Minutes = Annotated[int | None, BeforeValidator(_time)]
Partition = Annotated[str | None, BeforeValidator(_word("partition"))]
Account = Annotated[str | None, BeforeValidator(_word("account"))]
Extra = Annotated[tuple[tuple[str, str | bool], ...], BeforeValidator(_extra)]
Setup = Annotated[tuple[str, ...], BeforeValidator(_setup)]


# --------------------------------------------------------------------------------------------------------------------
# The sections
# --------------------------------------------------------------------------------------------------------------------


class SlurmResources(Spec):
    """What one SLURM job asks for (one `slurm:` mapping). `None` leaves a value to the cluster's defaults (no such
    `#SBATCH` line); `null` in a peer's mapping drops the top-level value back to that default.

    `extra` holds sbatch options as `(name, value)`, value `True` for a flag (`--exclusive`); `setup` shell lines run
    in the batch script before the job's command."""

    MAPPING_HINT: ClassVar[str] = (
        " of SLURM resources (nodes, gpus, cpus, mem, time, partition, account, extra, setup)"
    )
    # (sbatch's `gpus-per-node`, `cpus_per_task`, ... are found by the did-you-mean's own prefix rule.)
    ALIASES: ClassVar[dict[str, str]] = {
        "memory": "mem",
        "time_limit": "time",
        "qos": "extra",
        "constraint": "extra",
    }

    nodes: Nodes = Field(1, description="nodes of the job")
    gpus: Gpus = Field(None, description="GPUs per node")
    cpus: Cpus = Field(None, description="CPUs per task (one task per node)")
    mem: Mem = Field(None, description="memory per node, SLURM's --mem syntax (MB without a unit)")
    time: Minutes = Field(None, description="the time limit, in minutes")
    partition: Partition = None
    account: Account = None
    extra: Extra = Field((), description="other sbatch options")
    setup: Setup = Field((), description="shell lines run before the job's command")

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
        return {
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


def merge_resources(*layers: SlurmResources, base: SlurmResources | None = None) -> SlurmResources:
    """`base` (default: all cluster defaults) overridden by each layer in turn, by the keys that layer set (a key set
    to `null` is back at its default)."""
    resources = base or SlurmResources()
    for layer in layers:
        resources = resources.model_copy(update={key: getattr(layer, key) for key in layer.model_fields_set})
    return resources


def _flag(what: str):
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise bad(f"must be true or false, got {value!r}" if what is None else what)
        return value

    return check


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise bad(f"must be a TCP port (1-65535), or 0 for a free port on the job's node, got {value!r}")
    return int(value)


def _server(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(ch in value for ch in "\n\x00"):
        raise bad(f"must be the redis-server program (a name on PATH or a path), got {value!r}")
    return value.strip()


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise bad(f"must be a number of seconds > 0, got {value!r}")
    return float(value)


class RedisSpec(Spec):
    """The top-level `redis:` mapping: the Redis server job the launcher starts for the exchange. It takes the
    resource keys of one small CPU job; the ones it does not set come from the top-level `slurm` (partition, account,
    time, extra, setup), never nodes, GPUs, CPUs or memory."""

    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {
        "nodes": " (the Redis job is one CPU job on one node)",
        "gpus": " (the Redis job is one CPU job on one node)",
    }
    MAPPING_HINT: ClassVar[str] = " such as {start: true}"
    INHERITED: ClassVar[tuple[str, ...]] = ("partition", "account", "time", "extra", "setup")

    start: Annotated[bool, BeforeValidator(_flag(None))] = True
    port: Annotated[int, BeforeValidator(_port)] = 0
    password: Annotated[
        bool,
        BeforeValidator(
            _flag(
                "must be true or false: with true the launcher uses $FTIS_REDIS_PASSWORD or makes a random password "
                "and hands it to the server and the peers (never write a password in the config)"
            )
        ),
    ] = True
    server: Annotated[str, BeforeValidator(_server)] = "redis-server"
    start_timeout: Annotated[float, BeforeValidator(_seconds)] = 120.0
    cpus: Cpus = None
    mem: Mem = None
    time: Minutes = None
    partition: Partition = None
    account: Account = None
    extra: Extra = ()
    setup: Setup = ()

    def job(self, top: SlurmResources | None) -> RedisJobConfig:
        """The job: its own resource keys over the inherited top-level ones, 1 CPU unless `cpus` says otherwise."""
        inherited = {
            key: getattr(top, key) for key in self.INHERITED if top is not None and key in top.model_fields_set
        }
        own = {key: getattr(self, key) for key in self.model_fields_set if key in SlurmResources.model_fields}
        resources = SlurmResources(cpus=1).model_copy(update={**inherited, **own})
        return RedisJobConfig(
            port=self.port,
            password=self.password,
            server=self.server,
            start_timeout=self.start_timeout,
            resources=resources,
        )


@dataclass(frozen=True)
class RedisJobConfig:
    """The Redis server job the launcher submits before the peers (top-level `redis:` with `start: true`)."""

    port: int = 0  # 0: a free port on the node the job lands on
    password: bool = True  # a password for the server (generated, or $FTIS_REDIS_PASSWORD); never printed
    server: str = "redis-server"
    start_timeout: float = 120.0  # seconds from the job running to the server answering
    resources: SlurmResources = field(default_factory=lambda: SlurmResources(cpus=1))


SLURM_KEYS = tuple(SlurmResources.model_fields)
REDIS_KEYS = tuple(RedisSpec.model_fields)

SLURM_KEY = "slurm"  # the resources section, top level and per peer
REDIS_KEY = "redis"  # the Redis job section, top level


def job_resources(peer: Any) -> SlurmResources:
    """What a peer's job asks for (a `swarm_config.PeerConfig` of a SLURM swarm: its resolved `slurm` section)."""
    return peer.sections.get(SLURM_KEY) or SlurmResources()


def redis_job(config: Any) -> RedisJobConfig | None:
    """The Redis job the launcher starts for a SLURM swarm (`swarm_config.SwarmConfig`), or None."""
    return config.sections.get(REDIS_KEY)
