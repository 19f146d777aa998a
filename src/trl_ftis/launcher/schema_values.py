"""The values of a swarm config's keys (`launcher/schema.py`): the validators of each key, what the top level decides
for every peer (the validation context), and the names and patterns the schema shares. Each validator says what is
wrong in the launcher's words."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ValidationInfo

from ..exchange.transports.registry import normalise_exchange_url, transport_kind, transport_schemes
from ..peer_ids import peer_id_problem
from ..redaction import redact_url
from ..shared_names import PEER_ID_ENV
from .backends import DEFAULT_BACKEND, backend_kind, backend_names
from .controls import control_problem
from .validation import bad, said

LAUNCHERS = ("python", "accelerate")
# Arguments the launcher sets itself for every peer; a config that sets them would silently disagree.
RESERVED_ARGS = {
    "peer_id": "the peer's `id`",
    "exchange_url": "the top-level `exchange_url`",
    "output_dir": "`run_dir` (each peer writes to <run_dir>/<id>)",
}
GPU_MEMORY_FRACTION_ARG = "gpu_memory_fraction"  # FTISConfig.gpu_memory_fraction: what `gpu_share` sets

# Matched whole (`fullmatch`: `$` would let a trailing newline through, into a command line or a `.cmd` file).
ARG_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A newline in a path the SLURM batch script names (run_dir: submitit's folder, its #SBATCH --output) would start a
# line of its own there: a command the job runs.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# An index, or a GPU-/MIG- UUID: CUDA reads anything else ("two", "1.5") as "no GPU" and the peer runs on the CPU.
_GPU_ID_RE = re.compile(r"(?:[0-9]+|(?:GPU|MIG)-[A-Za-z0-9:_-]+)")
# FTISConfig's arguments the launcher reads: how long a round waits, and for whom.
PEER_TIMEOUT_ARG = "peer_timeout"
EXPECTED_PEERS_ARG = "expected_peers"
# What the sugar keys of a peer set in its args.
SUGAR_ARGS = {"model": "model_name_or_path", "lora": "use_peft", "gpu_share": GPU_MEMORY_FRACTION_ARG}


class ColonInt(int):
    """An integer YAML 1.1 read from a base-60 literal: unquoted `4:00:00` is 14400 to PyYAML. `schema`'s loader
    keeps the text so that `time: 4:00:00` means four hours (as SLURM reads a time limit), not 14400 minutes."""

    text: str

    def __new__(cls, value: int, text: str):
        obj = super().__new__(cls, value)
        obj.text = text
        return obj


class SwarmConfigError(ValueError):
    """A swarm config that cannot be run; `errors` lists every problem found, each naming the peer and the key."""

    def __init__(self, message: str, errors: list[str] | None = None):
        super().__init__(message)
        self.errors = list(errors) if errors else [message]


# --------------------------------------------------------------------------------------------------------------------
# What the top level decides for every peer (the validation context)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopLevel:
    """Read from the raw mapping before validation (the top level's own validators report its problems)."""

    # The backend that runs the peers (`backends.backend_kind`): `launcher: <backend>` at the top level, or the
    # command line's flag for it; inside what the backend starts, each peer still runs its own launcher.
    scheduler: str = DEFAULT_BACKEND
    launcher: str = "python"  # a peer's default
    has_script: bool = False
    backend: Mapping = field(default_factory=dict)  # what the backend's validators read (`BackendKind.context`)
    run_dir_given: bool = False  # --run-dir wins over the config's run_dir (which is then not checked)
    exchange_given: bool = False  # an exchange of the user's: peers started elsewhere may meet there too
    # The top-level `args` as written, for the checks across peers (so that a bad value there hides no other problem).
    args: Mapping = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping, backend: str | None, run_dir: Any) -> TopLevel:
        """`backend`: the one the command line chose (None: the config's `launcher`, else the default)."""
        launcher = raw.get("launcher", "python")
        if backend is None:
            backend = launcher if launcher in chosen_backends() else DEFAULT_BACKEND
        return cls(
            scheduler=backend,
            launcher=launcher if launcher in LAUNCHERS else "python",
            has_script=raw.get("script") is not None,
            backend=backend_kind(backend).context(raw),
            run_dir_given=run_dir is not None,
            exchange_given=raw.get("exchange_url") is not None,
            args=raw_args(raw),
        )


def raw_args(entry: Any) -> dict:
    """The `args` of a raw section (top level or peer) as written, less the keys `arg_key` refuses itself."""
    args = entry.get("args") if isinstance(entry, Mapping) else None
    if not isinstance(args, Mapping):
        return {}
    return {k: v for k, v in args.items() if isinstance(k, str) and ARG_KEY_RE.fullmatch(k)}


def top_level(info: ValidationInfo) -> TopLevel:
    return (info.context or {}).get("top") or TopLevel()


# --------------------------------------------------------------------------------------------------------------------
# The validators of the keys
# --------------------------------------------------------------------------------------------------------------------


def _mapping(what: str):
    def check(value: Any) -> dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise bad(f"must be a mapping of {what}, got {type(value).__name__}")
        return dict(value)

    return check


def arg_key(key: Any) -> str:
    if not isinstance(key, str) or not ARG_KEY_RE.fullmatch(key):
        raise said(f"args key {key!r} is not a valid argument name (write `lr`, not `--lr`)")
    if key in RESERVED_ARGS:
        raise said(f"`args.{key}` is set by the launcher; use {RESERVED_ARGS[key]} instead")
    return key


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


def _arg_value(value: Any) -> Any:
    """Arguments rendered as `--key value`: scalars or flat lists only (nothing argparse cannot take)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise bad("is an empty list, which has no command-line form; omit it")
        if not all(_is_scalar(v) and v is not None for v in value):
            raise bad("list items must be strings, numbers or booleans")
        return list(value)
    if not _is_scalar(value):
        raise bad(f"must be a string, number, boolean, null or a list of those, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(f"must be a finite number, got {value}")
    return value


def _env_name(name: Any) -> str:
    if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
        raise said(f"env name {name!r} is not a valid environment variable name")
    if name == PEER_ID_ENV:
        raise said(f"`env.{name}` is set by the launcher from the peer's `id`")
    return name


def _env_value(value: Any) -> str:
    """Environment values must be strings; numbers are converted. Booleans are refused: "True" vs "1" is a guess."""
    if isinstance(value, str) and "\x00" not in value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    hint = " (quote it: 'true' / '1')" if isinstance(value, bool) else ""
    raise bad(f"must be a string or a number, got {type(value).__name__} {value!r}{hint}")


def _peer_timeout(args: dict) -> dict:
    # FTISConfig takes 0 (a round that never waits), but a swarm whose rounds never wait trades almost nothing: in
    # the sync mode every peer trains before the others' rows arrive.
    value = args.get(PEER_TIMEOUT_ARG)
    if value is None:
        return args
    try:
        seconds = float(value) if not isinstance(value, bool) and isinstance(value, (int, float, str)) else math.nan
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise bad(
            f"must be a number of seconds > 0 (how long a round waits for the expected peers), got {value!r}",
            suffix=f".{PEER_TIMEOUT_ARG}",
        )
    return args


Args = Annotated[
    dict[Annotated[str, BeforeValidator(arg_key)], Annotated[Any, BeforeValidator(_arg_value)]],
    BeforeValidator(_mapping("argument names to values")),
    AfterValidator(_peer_timeout),
]
Env = Annotated[
    dict[Annotated[str, BeforeValidator(_env_name)], Annotated[str, BeforeValidator(_env_value)]],
    BeforeValidator(_mapping("variable names to strings")),
]


def path_value(value: Any) -> Path | None:
    # Relative paths are relative to the directory the launcher runs in, like every other command line path.
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise bad(f"must be a non-empty path string, got {value!r}")
    return Path(os.path.abspath(os.path.expanduser(value)))


PathValue = Annotated[Path | None, BeforeValidator(path_value)]


def cross_process_schemes() -> list[str]:
    """The registered exchange schemes whose transport crosses processes: every peer of a swarm is a process of its
    own, so an in-process transport (`TransportKind.in_process`) would leave each one alone."""
    return [scheme for scheme in transport_schemes() if not transport_kind(f"{scheme}://").in_process]


def exchange_url_value(url: Any) -> str | None:
    if url is None:
        return None  # the default exchange (`schema.load_swarm_config`), or the one the backend starts
    schemes = cross_process_schemes()
    accepted = ", ".join(f"{scheme}://" for scheme in schemes)
    try:
        url = normalise_exchange_url(url)  # the scheme checked and lower-cased
    except ValueError:
        shown = redact_url(url) if isinstance(url, str) else url
        examples = " or ".join(transport_kind(f"{scheme}://").example for scheme in schemes[:2])
        raise bad(f"must be a URL such as {examples} (schemes: {accepted}), got {shown!r}") from None
    kind = transport_kind(url)
    if kind.in_process:
        raise bad(f"{kind.scheme}:// only works inside one process, and peers are separate processes; use {accepted}")
    if kind.absolute is None:
        return url
    try:
        return kind.absolute(url)  # the same exchange for every peer (and the logs), whatever their working directory
    except ValueError as exc:
        raise bad(str(exc)) from None


def run_dir_problem(path: Any) -> str | None:
    """Why `path` cannot be a run directory (a newline or another control character in it), or None."""
    text = os.fspath(path)
    if _CONTROL_RE.search(text):
        return f"must not contain a newline or another control character (job scripts name it), got {text!r}"
    return None


def run_dir_value(value: Any, info: ValidationInfo) -> str | None:
    if value is None or top_level(info).run_dir_given:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise bad(f"must be a path string, got {value!r}")
    problem = run_dir_problem(value)
    if problem is not None:
        raise bad(problem)
    return os.fspath(value)


def chosen_backends() -> tuple[str, ...]:
    """The backends a config's top-level `launcher` may name (the default one is what `python` and `accelerate`
    run on)."""
    return tuple(name for name in backend_names() if name != DEFAULT_BACKEND)


def top_launcher_value(value: Any) -> str:
    if value not in (*LAUNCHERS, *chosen_backends()):
        raise bad(f"must be one of {', '.join((*LAUNCHERS, *chosen_backends()))}, got {value!r}")
    return value


ON_FAILURE = ("stop", "continue")
"""What the launcher does when a peer exits non-zero: stop every other peer (the default), or let them go on (a peer
can then be restarted with `--only PEER --resume` while the others train)."""


def on_failure_value(value: Any) -> str:
    if value not in ON_FAILURE:
        raise bad(
            "must be 'stop' (stop every peer when one fails, the default) or 'continue' (the others go on; restart "
            f"the failed one with --only PEER --resume), got {value!r}"
        )
    return value


MAX_SEEDS = 100  # seeds of one launcher run: each runs the whole swarm and its controls once


def seeds_value(value: Any) -> list[int]:
    """`seeds:`: distinct non-negative integers, each run as one whole swarm (every peer's `--seed`)."""
    if value is None:
        return []
    ok = isinstance(value, list) and all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in value
    )
    if not ok or not 1 <= len(value) <= MAX_SEEDS:
        raise bad(f"must be a list of 1 to {MAX_SEEDS} integers in [0, 2**31), got {value!r:.80}")
    if len(set(value)) != len(value):
        raise bad(f"lists a seed twice: {value!r:.80}")
    return list(value)


def controls_value(value: Any) -> list[str] | None:
    if value is None:
        return None
    problem = control_problem(value)
    if problem is not None:
        raise bad(problem)
    return list(value)


def peer_launcher_value(value: Any) -> str | None:
    if value in chosen_backends():
        flag = backend_kind(value).cli_flag
        raise said(
            f"`launcher: {value}` is for the whole swarm: set it at the top level"
            f"{f' (or run with {flag})' if flag else ''}; a peer's `launcher` says what runs inside its job "
            f"({' or '.join(LAUNCHERS)})"
        )
    if value is not None and value not in LAUNCHERS:
        raise bad(f"must be one of {', '.join(LAUNCHERS)}, got {value!r}")
    return value


def peer_id_value(value: Any) -> str:
    # The same rule as FTISConfig.peer_id, the wire format and the transports: a peer the launcher starts must be one
    # they accept.
    problem = peer_id_problem(value)
    if problem is not None:
        raise said(f"invalid `id`: {problem}")
    return value


def model_value(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise bad(f"must be a path or a Hub id string, got {value!r}")
    return value


def optional_flag_value(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise bad(f"must be true or false, got {value!r}")
    return value


def gpus_value(value: Any) -> str | None:
    """`gpus` -> a CUDA_VISIBLE_DEVICES string: "0,1", 0 or [0, 1] are all accepted."""
    if value is None:
        return None
    items = None
    if isinstance(value, int) and not isinstance(value, bool):
        items = [str(value)]
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, str)) and not isinstance(v, bool) for v in value
    ):
        items = [str(v).strip() for v in value]
    if not items or not all(item and _GPU_ID_RE.fullmatch(item) for item in items):
        raise bad(f'must be a device list such as "0,1", 0 or [0, 1], got {value!r}')
    return ",".join(items)


def gpu_share_value(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise bad(f"must be a fraction of one GPU's memory in (0, 1], got {value!r}")
    return float(value)


def num_processes_value(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise bad(f"must be an integer >= 1, got {value!r}")
    return value


def peer_where(index: int, peer_id: Any) -> str:
    return f"peers[{index}] (id {peer_id!r})" if isinstance(peer_id, str) and peer_id else f"peers[{index}]"


# --------------------------------------------------------------------------------------------------------------------
# The sections
