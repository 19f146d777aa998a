"""The rules several parts of trl-ftis must agree on, each written once.

`FTISConfig`, the round client (`trl_ftis.swarm.client`), the wire format, the transports and the launcher all import their
rules from here, so that what one part accepts the others accept too (a peer id the config takes but the wire refuses
would be a peer that silently never publishes). Standard library only: importing it is free.

* Peer ids: [`peer_id_problem`] / [`check_peer_id`].
* Names shared between processes: the environment variables `*_ENV` and [`SUMMARY_FILE`].
* Numbers: [`MAX_LOGP`], the rounding slack above 0 a generator log-prob may have; [`MIN_TEMPERATURE`] and
  [`MAX_TEMPERATURE`], the sampling temperatures a config accepts and a message may carry ([`check_temperature`]).
* The round window's defaults and checks: [`DEFAULT_PEER_TIMEOUT`], [`DEFAULT_MAX_STALENESS`],
  [`DEFAULT_MAX_ROUNDS_AHEAD`], [`check_round_window`]; whom a round waits for: [`check_expected_peers`].
* The exit code of a run stopped by Ctrl-C or SIGTERM: [`INTERRUPTED_EXIT_CODE`].
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Sequence

# ---------------------------------------------------------------------------------------------------------------------
# Peer ids

PEER_ID_MAX_CHARS = 64
# A peer id names files in a shared directory, Redis keys, tracker runs and a command-line value: ASCII letters,
# digits, '_', '.', '-', starting with a letter, digit or '_' (so never '.', a hidden file or an option '-x'), and
# without '..' anywhere (never a parent directory, whatever a transport builds from it).
_PEER_ID_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.-]*")
PEER_ID_RULE = (
    f"1-{PEER_ID_MAX_CHARS} ASCII letters, digits, '_', '.' or '-', starting with a letter, a digit or '_', "
    "without '..'"
)


def peer_id_problem(value: object) -> str | None:
    """Why `value` is not a valid peer id (one sentence), or `None` when it is one."""
    if not isinstance(value, str):
        return f"a peer id must be a string, got {type(value).__name__}"
    if not 1 <= len(value) <= PEER_ID_MAX_CHARS:
        return f"a peer id must have 1-{PEER_ID_MAX_CHARS} characters, got {len(value)}"
    if not _PEER_ID_RE.fullmatch(value):
        return f"a peer id must be {PEER_ID_RULE}, got {value[:80]!r}"
    return None


def is_peer_id(value: object) -> bool:
    """Whether `value` is a valid peer id."""
    return peer_id_problem(value) is None


def peer_id_from(name: str) -> str:
    """A valid peer id made from a model's name or path (`Qwen/Qwen2.5-1.5B` -> `qwen2.5-1.5b`): its last path part,
    lower-cased, with every other character replaced by '-'; `"peer"` when nothing is left."""
    last = str(name).rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()
    text = re.sub(r"\.{2,}", ".", re.sub(r"[^a-z0-9_.-]+", "-", last)).lstrip(".-")[:PEER_ID_MAX_CHARS]
    return text if is_peer_id(text) else "peer"


def check_peer_id(value: object, what: str = "peer_id") -> str:
    """Return `value` if it is a valid peer id, else raise `ValueError` naming `what` and the rule."""
    problem = peer_id_problem(value)
    if problem is not None:
        raise ValueError(f"{what}: {problem}.")
    return value  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------------------------
# Model paths (the launcher checks them before start, the example scripts before loading)


def looks_like_local_path(value: object) -> bool:
    """A model that transformers would read from a folder: `/x`, `./x`, `../x`, `~/x`, or more than one `/`. A Hub id
    is `name` or `org/name`."""
    if not isinstance(value, str):
        return False
    return value.startswith(("/", "./", "../", "~")) or value in (".", "..") or value.count("/") > 1


def local_model_problem(value: object) -> str | None:
    """What is wrong with a `model` that is a local path (None for a Hub id, or a folder that exists)."""
    if not looks_like_local_path(value):
        return None
    path = os.path.abspath(os.path.expanduser(value))
    if os.path.isdir(path):
        return None
    if os.path.exists(path):
        return f"{path} is not a folder (a model is a folder with its config.json)"
    return f"no such local model folder {path}"


def hub_model_problem(value: object, *, elsewhere: Sequence[str | os.PathLike] = ()) -> str | None:
    """What is wrong with a `model` written like a Hub id (`name` or `org/name`) that the peers could not load: no
    folder of that name where they start (the working directory), and either a folder of that name in one of the
    `elsewhere` folders (beside the config or the run folder: the user meant it, without `./`) or, when the model is
    not in the local Hugging Face cache, no Hub to download it from (`HF_HUB_OFFLINE` is set). None when transformers
    would find it, or may (the Hub is not probed: a model that is not there fails at start, in transformers' words)."""
    if not isinstance(value, str) or not value or looks_like_local_path(value) or value.count("/") > 1:
        return None
    if os.path.isdir(value):
        return None  # transformers reads a folder of that name before it asks the Hub
    for folder in elsewhere:
        candidate = os.path.join(os.fspath(folder), value)
        if os.path.isdir(candidate):
            return (
                f"{value!r} is read as a Hugging Face Hub id: there is no folder of that name in the peers' working "
                f"directory {os.getcwd()}, but there is one at {os.path.abspath(candidate)}; write that path (or "
                f"`./{value}` relative to where you start the launcher)"
            )
    if _cached_on_this_machine(value):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return f"no local folder {value!r} and no Hub access (HF_HUB_OFFLINE is set; not in the Hugging Face cache)"
    return None


def _cached_on_this_machine(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds model `repo_id`'s `config.json` (then it loads offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an id the hub refuses, an unreadable cache: treated as not cached
        return False


# ---------------------------------------------------------------------------------------------------------------------
# Names shared between processes

SWARM_SECRET_ENV = "FTIS_SWARM_SECRET"
"""The swarm secret, read when `FTISConfig.swarm_secret` is not set."""
CREDENTIAL_REASONS = ("unsigned", "signature", "unknown_peer", "identity")
"""Refusal reasons that mean the sender and the receiver are set up with different credentials."""
CREDENTIAL_HINT = (
    " (this peer and that one are set up with different credentials: give every peer the same swarm_secret and the "
    "same peer_keys_file, each its own private_key_file)"
)
"""What a receiver adds when it refuses a message for one of `CREDENTIAL_REASONS`."""
SWARM_NAME_ENV = "FTIS_SWARM_NAME"
"""The swarm's name, read when `FTISConfig.swarm_name` is not set (the launcher sets it to the swarm's `name`)."""
SWARM_RUN_ENV = "FTIS_SWARM_RUN"
"""The swarm run's id, read when `FTISConfig.swarm_run` is not set (the launcher draws one for each run)."""
MAX_BINDING_CHARS = 128
"""The longest swarm name or run id a message may be bound to (the wire format's bound too)."""
REDIS_PASSWORD_ENV = "FTIS_REDIS_PASSWORD"
"""The Redis password, used when a `redis://` / `rediss://` URL carries none: it stays off command lines."""
CONSOLE_ENV = "FTIS_CONSOLE"
"""Set to [`CONSOLE_LINES`] (by the launcher, for its peers): one short line per logged step and the dependencies'
deprecation notices hidden (`trl_ftis.console.apply_console_env`); the full metrics stay in the trackers."""
CONSOLE_LINES = "lines"
CONSOLE_DICTS = "dict"
"""[`CONSOLE_ENV`] set to this: Trainer's full dict per logged step, also in the example scripts (which default to
step lines: `trl_ftis.console.use_script_console`)."""
PEER_ID_ENV = "FTIS_PEER_ID"
"""Set by the launcher to each peer's id (scripts read it as their default `peer_id`)."""
GPU_MEMORY_FRACTION_ENV = "FTIS_GPU_MEMORY_FRACTION"
"""No longer read by anything: a peer's share of its GPU is `FTISConfig.gpu_memory_fraction` (the launcher's
`gpu_share` passes `--gpu_memory_fraction`). The launcher refuses a peer that still sets it next to `gpu_share`."""
CACHE_ENV = "FTIS_CACHE"
"""Where the demo keeps converted model checkpoints (default `~/.cache/trl-ftis`)."""
SUMMARY_FILE = "ftis_summary.json"
"""Written by each trainer into its `output_dir` at the end of training; read by the launcher's summary table."""

# ---------------------------------------------------------------------------------------------------------------------
# Numbers

MAX_LOGP = 1e-4
"""Largest generator log-prob accepted: log-probs are <= 0, up to this much float rounding above 0."""
MIN_TEMPERATURE = 1e-2
"""Lowest sampling temperature `FTISConfig` and the wire format accept: below it sampling is greedy in all but name and
generator log-probs explode (a softmax at logits / 0.01 over logits within +-100 reaches about -2e4)."""
MAX_TEMPERATURE = 1e2
"""Highest sampling temperature `FTISConfig` and the wire format accept: above it sampling is uniform in all but
name."""


def binding_problem(value: object) -> str | None:
    """Why `value` cannot be a swarm name or run id (`FTISConfig.swarm_name`, `swarm_run`), or None: 1 to
    [`MAX_BINDING_CHARS`] printable characters."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value or len(value) > MAX_BINDING_CHARS or not value.isprintable():
        return f"must be 1 to {MAX_BINDING_CHARS} printable characters, got {value!r:.60}"
    return None


def check_temperature(value: object, what: str = "temperature") -> float:
    """`value` as a float when it is a sampling temperature in [`MIN_TEMPERATURE`, `MAX_TEMPERATURE`]; else
    `ValueError` naming `what` (NaN and non-numbers are refused too). Log-probs are compared at this temperature and
    the wire format carries no other."""
    try:
        temperature = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        temperature = float("nan")
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:  # also rejects NaN
        raise ValueError(
            f"{what} must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] (log-probs are compared at it, and the wire "
            f"format carries no other), got {value!r}."
        )
    return temperature


# ---------------------------------------------------------------------------------------------------------------------
# The round window

DEFAULT_PEER_TIMEOUT = 60.0
"""Seconds a round waits for the expected peers (`FTISConfig.peer_timeout`, `Swarm(peer_timeout=...)`)."""
DEFAULT_MAX_STALENESS = 2
"""Messages from rounds older than `round - max_staleness` are dropped as `stale`."""
DEFAULT_MAX_ROUNDS_AHEAD = 4
"""Messages from rounds later than `round + max_rounds_ahead` are refused as `ahead`."""


def check_round_window(max_staleness: object, max_rounds_ahead: object) -> tuple[int, int]:
    """`(max_staleness, max_rounds_ahead)` as ints when both are whole numbers of rounds >= 0 (Python or numpy
    integers, not bools); else `ValueError` naming the field. `FTISConfig` and `Swarm` both check with it."""
    window = []
    for name, value in (("max_staleness", max_staleness), ("max_rounds_ahead", max_rounds_ahead)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be a whole number of rounds >= 0, got {value!r}.")
        window.append(int(value))
    return window[0], window[1]


def check_expected_peers(expected_peers: object, num_expected_peers: object) -> None:
    """`ValueError` when a round is told whom to wait for twice: `expected_peers` (named peers; non-empty) and
    `num_expected_peers` (a number of peers, whatever their ids) are alternatives. Also when `num_expected_peers`
    is not a whole number >= 0. `FTISConfig` and `Swarm` both check with it."""
    if num_expected_peers is None:
        return
    if (
        isinstance(num_expected_peers, bool)
        or not isinstance(num_expected_peers, numbers.Integral)
        or num_expected_peers < 0
    ):
        raise ValueError(f"num_expected_peers must be a whole number of peers >= 0, got {num_expected_peers!r}.")
    if expected_peers:
        raise ValueError(
            "expected_peers and num_expected_peers are alternatives: set expected_peers to name the peers a round "
            "waits for, or num_expected_peers to wait for that many other peers whatever their ids, not both "
            f"(got expected_peers={list(expected_peers)!r} and num_expected_peers={num_expected_peers!r})."
        )


# ---------------------------------------------------------------------------------------------------------------------
# Processes

INTERRUPTED_EXIT_CODE = 130
"""Exit code of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT), for the launcher and every peer it starts."""


MULTI_TURN_REFUSAL = (
    "{} with tools or environment_factory: F-TIS peers exchange single-turn text completions, and a multi-turn one "
    "holds tool results that no model sampled. Train with tools alone, or exchange without them."
)
"""Why `FTISTrainer` refuses an exchange, `add_peer_rows` or `add_row_listener` (the `{}`) with multi-turn tools."""
