"""Checkpoints: the F-TIS state a resumed run needs besides TRL's (counters, the swarm, queued peer rows).

`Trainer` checkpoints hold the model, optimizer, scheduler, RNG and `TrainerState` (whose `global_step` is also the
swarm round). `FTISTrainer` adds one JSON file per process, `ftis_state_<process>.json` (format 1), written into the
checkpoint folder before the Trainer's own files, and reads it back in `train(resume_from_checkpoint=...)`. This
module saves and reads what the state's owners hand it, and needs no trainer:

* the ledger's state ([`PeerRowLedger.state_dict`], `trl_ftis.swarm.ledger`): the counters behind `summary()`, the
  model card and the per-reason drop metrics (rows sent, received, accepted, filtered, refused and dropped; rows
  trained on per peer; the peers that `ftis_source` indexes);
* the loss's adaptive filter threshold (`kl_threshold_mode="quantile"`);
* the swarm's state ([`Swarm.state_dict`]): peers seen and their models, who is not waited for, and the digests of
  the messages accepted in the round window, so that a restarted peer that reads them again from the exchange does
  not train on them twice;
* the peer rows queued by `FTISTrainer.add_peer_rows` and not yet merged ([`rows_to_json`]);
* the exchange mode's own state, under the mode's name (`ExchangeMode.state_dict`: the free mode's queue of arrived
  rows; nothing for the sync and async modes), checked by the mode itself (`ExchangeMode.check_state`) when it is
  this run's mode, and not restored otherwise;
* what collaboration bought so far (`trl_ftis.step_clock`, `trl_ftis.peer_value`): the step clock's totals and the
  value of peer rows, so that a resumed run's summary covers the whole run.

[`build_state`] writes the dict, [`parse_state`] checks one (a malformed dict raises `ValueError` before anything is
restored; the swarm's part is checked by `Swarm.load_state_dict` itself). A checkpoint without the file (written by
`GRPOTrainer`, or by a run without checkpointing) resumes with a warning and every counter at zero
([`read_state_file`]). A file that is not valid raises `ValueError` naming it and the field, before any training
([`read_checked_state`]), and nothing is restored.

Checkpoints are shared and pushed to the Hub, so the file is as untrusted as a peer's message. What the file alone
decides is checked against what this run would ever hold ([`restore_limits`]), and a file beyond it is refused whole:
every field's type and range (counts and rounds whole numbers in [0, 2**63), numbers finite), exactly the fields
[`rows_to_json`] writes (a row's `advantage` is recomputed, never read), at most as many rows as the queue holds,
completions of at most `max_completion_length` tokens (queued rows were admitted by the run that saved them; a
mode's queue of arrived rows, only received, at most the swarm's wire limit), and a `global_step` that is the
checkpoint's own. Rows that pass are admitted again as received rows are (queued ones by `Admission.restore` at
once, a mode's when a step takes them): what depends on this trainer's model, tokenizer or template (ids outside
its vocabulary, a prompt it cannot render, special tokens, too long for the context) drops the row and counts it by
reason.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..exchange.limits import Limits
from ..json_files import plain_json, write_json_atomic
from ..peer_rows import PeerRow
from ..peer_value import PeerValue
from ..sampling_bounds import MAX_LOGP
from ..step_clock import StepClock
from .ledger import LedgerState, PeerRowLedger
from .round_budget import RoundBudget

logger = logging.getLogger(__name__)

STATE_FILE = "ftis_state_{process}.json"
"""The F-TIS state file of process `process` inside a checkpoint folder."""
STATE_FORMAT = 1
"""Version of the file's layout; a file of another version is refused."""
STATE_KEYS = ("format", "peer_id", "global_step", "adaptive_threshold", "pending_peer_rows", "swarm", "exchange_mode",
              "time", "peer_value")  # fmt: skip
"""The keys every state file has (besides the ledger's): a file without one is malformed."""

ROW_FIELDS = ("prompt", "completion_ids", "generator_logps", "reward", "group", "sender", "rewards_per_func", "extra",
              "round")  # fmt: skip
"""The fields [`rows_to_json`] writes for every row (format 1 always had them)."""
OPTIONAL_ROW_FIELDS = ("text_level", "foreign_tokenizer", "completion_text", "ends_with_eos")
"""The fields it writes for some rows only. Any other (`advantage`, ...) makes the file malformed: a row's advantage
and statistics are always recomputed, never read."""
MAX_KEY_DEPTH = 8
"""Tuples nested in a saved group key (the swarm's are `(sender, round, index)`: one)."""

_LAST = ("last", "latest", "true")  # command-line spellings of `resume_from_checkpoint=True`


def state_path(checkpoint: str | os.PathLike, process_index: int) -> Path:
    """The state file of process `process_index` in the checkpoint folder `checkpoint`."""
    return Path(checkpoint) / STATE_FILE.format(process=process_index)


# -- peer rows as JSON ------------------------------------------------------------------------------------------------
def _key_to_json(key: Hashable) -> Any:
    """A group key as JSON that [`_key_from_json`] turns back into an equal key: JSON scalars as they are, tuples
    (the swarm's `(sender, round, index)`) tagged, anything else by its `repr` (equal keys stay equal)."""
    if key is None or isinstance(key, (str, bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return key
    if isinstance(key, tuple):
        return {"tuple": [_key_to_json(item) for item in key]}
    return {"repr": repr(key)}


def _key_from_json(value: Any, depth: int = 0) -> Hashable:
    if depth > MAX_KEY_DEPTH:  # deeper than any key a trainer writes; also keeps the recursion shallow
        raise ValueError(f"a group key nested deeper than {MAX_KEY_DEPTH} tuples")
    if isinstance(value, dict) and isinstance(value.get("tuple"), list):
        return tuple(_key_from_json(item, depth + 1) for item in value["tuple"])
    if isinstance(value, dict) and isinstance(value.get("repr"), str):
        return ("repr", value["repr"])
    if isinstance(value, (dict, list)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"not a group key: {value!r:.80}")
    return value


def rows_to_json(rows: Sequence[Any]) -> tuple[list[dict[str, Any]], int]:
    """The rows ([`PeerRow`]s or admitted rows) as JSON-serialisable dicts, and how many could not be (a prompt or
    column that JSON cannot hold)."""
    out, unwritable = [], 0
    for row in rows:
        record = {
            "prompt": row.prompt,
            "completion_ids": [int(token) for token in row.completion_ids],
            "generator_logps": [float(logp) for logp in row.generator_logps],
            "reward": float(row.reward),
            "group": _key_to_json(row.group),
            "sender": str(row.sender),
            "rewards_per_func": row.rewards_per_func,
            "extra": row.extra,
            "round": None if row.round is None else int(row.round),
        }
        if row.text_level:  # re-tokenised from another tokenizer's text: trained on with the text-level weight
            record["text_level"] = True
        if getattr(row, "foreign_tokenizer", False):  # an arrived row in its sender's tokens: re-tokenised when taken
            record.update(foreign_tokenizer=True, completion_text=row.completion_text, ends_with_eos=row.ends_with_eos)
        try:
            json.dumps(record, default=plain_json)
        except (TypeError, ValueError):
            unwritable += 1
            continue
        out.append(record)
    return out, unwritable


def rows_from_json(
    records: Any, name: str = "pending_peer_rows", label: str = "pending peer", limits: RowLimits | None = None
) -> list[PeerRow]:
    """The rows [`rows_to_json`] wrote (under the state's key `name`), as [`PeerRow`]s; `ValueError` naming the first
    malformed one and its field ([`record_problem`]), or saying that there are more than `limits.max_rows`."""
    limits = limits or RowLimits()
    if not isinstance(records, list):
        raise ValueError(f"{name!r} is not a list")  # noqa: TRY004 - a malformed file, not a wrong argument
    if len(records) > limits.max_rows:
        raise ValueError(f"{name!r} holds {len(records)} rows, more than the {limits.max_rows} the queue holds")
    rows = []
    for index, record in enumerate(records):
        problem = record_problem(record, limits)
        if problem is not None:
            raise ValueError(f"{label} row {index}: {problem}")
        try:
            rows.append(PeerRow(**{**record, "group": _key_from_json(record["group"])}))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{label} row {index}: {error}") from None
    return rows


@dataclass(frozen=True)
class RowLimits:
    """What one queue of a state file may hold, from the run that reads it ([`restore_limits`]). The defaults are
    the wire format's own ceilings, for a state checked without a trainer."""

    max_rows: int = RoundBudget().max_rows
    """Rows in the queue: what the trainer's queue holds (`RoundRunner.queue_rows`)."""
    max_tokens: int = Limits().max_completion_tokens
    """Tokens in one completion."""
    foreign: bool = False
    """Whether rows in another tokenizer's tokens may be queued (arrived rows, `cross_tokenizer`)."""


def record_problem(record: Any, limits: RowLimits) -> str | None:
    """What makes one saved row malformed (its field and why), or `None`. Only what the file alone decides, within
    what this run would ever accept: a row that passes is admitted again like a received one, and dropped and
    counted if the admission refuses it (ids outside this vocabulary, a prompt this tokenizer cannot render, special
    tokens, the context)."""
    if not isinstance(record, dict):
        return "not an object"
    keys = set(record)
    if not set(ROW_FIELDS) <= keys <= set(ROW_FIELDS) | set(OPTIONAL_ROW_FIELDS):
        extra, missing = sorted(keys - set(ROW_FIELDS) - set(OPTIONAL_ROW_FIELDS)), sorted(set(ROW_FIELDS) - keys)
        return f"fields {extra or missing} are {'not row fields' if extra else 'missing'}"  # 'advantage': recomputed
    for field_name, check in (
        ("prompt", lambda v: isinstance(v, (str, list))),
        ("sender", lambda v: isinstance(v, str)),
        ("reward", _finite_number),
        ("round", lambda v: v is None or _count(v)),
        ("extra", lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) for k in v))),
        ("rewards_per_func", _reward_columns),
        ("text_level", lambda v: isinstance(v, bool)),
        ("foreign_tokenizer", lambda v: isinstance(v, bool) and (not v or limits.foreign)),
        ("completion_text", lambda v: v is None or isinstance(v, str)),
        ("ends_with_eos", lambda v: isinstance(v, bool)),
    ):
        if field_name in record and not check(record[field_name]):
            return f"{field_name!r} is malformed ({type(record[field_name]).__name__})"
    ids, logps = record["completion_ids"], record["generator_logps"]
    if not isinstance(ids, list) or not 0 < len(ids) <= limits.max_tokens:
        return f"'completion_ids' is not a list of 1 to {limits.max_tokens} token ids"
    # This vocabulary's bound is the admission's (`bad_ids`, counted): another model may resume from the file.
    if not all(_count(token) for token in ids):
        return "'completion_ids' holds an id that is not a whole number >= 0"
    if not isinstance(logps, list) or len(logps) != len(ids):
        return "'generator_logps' is not a list with one log-prob per token"
    if not all(_finite_number(logp) and logp <= MAX_LOGP for logp in logps):
        return f"'generator_logps' holds a value that is not a finite number <= {MAX_LOGP}"
    return None


def _count(value: Any) -> bool:
    """A whole number in [0, 2**63) (a round, a token id, a counter): never a bool, a float or a string."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _reward_columns(value: Any) -> bool:
    """`None`, or reward function names to rewards: finite, or NaN where the function declined (the scorer's None)."""
    if value is None:
        return True
    return isinstance(value, dict) and all(
        isinstance(k, str) and (_finite_number(v) or (isinstance(v, float) and math.isnan(v)))
        for k, v in value.items()
    )


# -- the state -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointState:
    """A checked state file ([`parse_state`]), ready to be handed back to its owners."""

    global_step: Any
    ledger: LedgerState
    adaptive_threshold: float | None
    pending_rows: list[PeerRow]
    swarm: Any
    time: dict[str, Any]
    """The step clock's state ([`StepClock.state_dict`], checked)."""
    peer_value: dict[str, Any]
    """The peer-value state ([`PeerValue.state_dict`], checked)."""
    mode_name: str
    """The exchange mode whose state the file holds (`exchange_mode.name`)."""
    mode_state: Any
    """That state: as saved after [`parse_state`], checked by the mode ([`ExchangeMode.check_state`]) after
    [`read_checked_state`] when it is this run's mode (else `None`: another mode's state is not restored)."""


def build_state(
    *,
    peer_id: str,
    global_step: int,
    ledger: dict[str, Any],
    adaptive_threshold: float | None,
    pending_rows: Sequence[Any],
    swarm: dict[str, Any] | None,
    mode_name: str,
    mode_state: Any,
    time: dict[str, Any],
    peer_value: dict[str, Any],
) -> dict[str, Any]:
    """One process's F-TIS state (JSON-serialisable, format [`STATE_FORMAT`]) from what its owners hand over: the
    ledger's [`PeerRowLedger.state_dict`], the adaptive threshold, the queued rows, the swarm's state (only on the
    process that holds it), the exchange mode's own state (`ExchangeMode.state_dict`, under its name), the step
    clock's and the peer value's. Queued rows that JSON cannot hold are left out, with a warning."""
    rows, unwritable = rows_to_json(pending_rows)
    if unwritable:
        logger.warning(
            "%d queued peer row(s) hold a prompt or column that JSON cannot hold: they are not in the checkpoint "
            "(a run resumed from it will not train on them).",
            unwritable,
        )
    return {
        "format": STATE_FORMAT,
        "peer_id": peer_id,
        "global_step": global_step,
        **ledger,
        "adaptive_threshold": adaptive_threshold,
        "pending_peer_rows": rows,
        "swarm": swarm,
        "exchange_mode": {"name": mode_name, "state": mode_state},
        "time": time,
        "peer_value": peer_value,
    }


@dataclass(frozen=True)
class StateLimits:
    """What the queue of a state file may hold ([`restore_limits`] for a trainer's; an exchange mode checks its own
    state itself)."""

    pending: RowLimits = RowLimits()


def restore_limits(config: Any, queue_rows: int) -> StateLimits:
    """The limits of a trainer's state file: the queue at most `queue_rows` rows, admitted by the run that saved
    them (in this tokenizer's tokens, at most `config.max_completion_length` of them)."""
    return StateLimits(pending=RowLimits(queue_rows, config.max_completion_length))


def parse_state(state: Any, limits: StateLimits | None = None) -> CheckpointState:
    """Check a state ([`build_state`], read from a file) against `limits` and return its parts; `ValueError` saying
    which field is wrong. Nothing is restored here: the caller hands the parts to their owners once every check
    passed."""
    try:
        return _parsed(state, limits or StateLimits())
    except (TypeError, OverflowError, RecursionError) as error:  # a shape no check foresaw: still the file's fault
        raise ValueError(f"malformed ({type(error).__name__}: {error})") from None


def _parsed(state: Any, limits: StateLimits) -> CheckpointState:
    if not isinstance(state, dict):
        raise ValueError("not a JSON object")  # noqa: TRY004 - a malformed file, not a wrong argument
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"format {state.get('format')!r}, this version reads format {STATE_FORMAT}")
    if not _count(state.get("global_step")):
        raise ValueError("'global_step' is not a whole number of steps >= 0")
    ledger = PeerRowLedger.parse_state(state)
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"{missing} missing")
    rows = rows_from_json(state["pending_peer_rows"], limits=limits.pending)
    threshold = state["adaptive_threshold"]
    if threshold is not None and not _finite_number(threshold):
        raise ValueError("'adaptive_threshold' is not a finite number")
    mode = state["exchange_mode"]
    if not (isinstance(mode, dict) and set(mode) == {"name", "state"} and isinstance(mode["name"], str)):
        raise ValueError("'exchange_mode' is not {'name': <the mode's name>, 'state': <its state>}")
    # Checked by loading them into scratch owners: the trainer's own are changed only once everything passed.
    clock_state, value_state = state["time"], state["peer_value"]
    StepClock().load_state_dict(clock_state)
    PeerValue().load_state_dict(value_state)
    return CheckpointState(
        global_step=state["global_step"],
        ledger=ledger,
        adaptive_threshold=None if threshold is None else float(threshold),
        pending_rows=rows,
        swarm=state["swarm"],
        time=clock_state,
        peer_value=value_state,
        mode_name=mode["name"][:100],
        mode_state=mode["state"],
    )


def read_checked_state(
    checkpoint: str | os.PathLike, process_index: int, limits: StateLimits, swarm: Any = None, mode: Any = None
) -> CheckpointState | None:
    """The state file of `process_index` in `checkpoint`, checked whole ([`parse_state`], the exchange mode's part
    by `mode` when the file holds that mode's state ([`ExchangeMode.check_state`]), and its step against the
    checkpoint's `trainer_state.json`), or `None` when there is none ([`read_state_file`]). The swarm's part is
    loaded into `swarm` last (`Swarm.load_state_dict` checks before it changes anything): once this returns, every
    part is valid and the caller's restoring cannot fail. `ValueError` naming the file and the field otherwise."""
    state = read_state_file(checkpoint, process_index)
    if state is None:
        return None
    try:
        parsed = parse_state(state, limits)
        step = trainer_step(checkpoint)
        if step is not None and parsed.global_step != step:  # a file copied from another checkpoint, or forged
            raise ValueError(f"'global_step' is {parsed.global_step}, but this checkpoint is of step {step}")
        if mode is not None:
            mode_state = None
            if parsed.mode_name == mode.name:
                try:
                    mode_state = mode.check_state(parsed.mode_state)
                except (TypeError, OverflowError, RecursionError) as error:  # a shape the mode did not foresee
                    raise ValueError(f"malformed ({type(error).__name__}: {error})") from None
            else:
                logger.warning(
                    "%s holds the state of exchange_mode=%r; this run's is %r: that state is not restored.",
                    state_path(checkpoint, process_index),
                    parsed.mode_name,
                    mode.name,
                )
            parsed = replace(parsed, mode_state=mode_state)
        if swarm is not None and parsed.swarm is not None:
            swarm.load_state_dict(parsed.swarm)
    except ValueError as error:
        raise ValueError(f"{state_path(checkpoint, process_index)}: {error}") from None
    return parsed


def trainer_step(checkpoint: str | os.PathLike) -> int | None:
    """The `global_step` of the checkpoint's `trainer_state.json`, or `None` when it has none readable (the Trainer
    itself then resumes as it does, or raises)."""
    try:
        step = json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text(encoding="utf-8")).get("global_step")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return step if _count(step) else None


# -- the trainer's checkpoints ---------------------------------------------------------------------------------------
class StateCheckpoints:
    """The F-TIS part of a trainer's checkpoints: [`save`] collects the owners' state into the checkpoint folder
    before the Trainer writes its own files, [`restore`] checks a saved state whole and hands it back to the same
    owners before a resume. The owners are given once: `ledger` ([`PeerRowLedger`]), `inbox` (the rows of
    `add_peer_rows`: `rows`, `restore`), `rounds` (the round runner: its `lock`, its exchange mode's queue, its
    swarm client), `clock` ([`StepClock`]) and `value` ([`PeerValue`]). The adaptive threshold is a number the loss
    owns: it is passed to `save` and returned by `restore`."""

    def __init__(self, *, config: Any, ledger: Any, inbox: Any, rounds: Any, clock: Any, value: Any, accelerator: Any):
        self.config, self.ledger, self.inbox, self.rounds = config, ledger, inbox, rounds
        self.clock, self.value, self.accelerator = clock, value, accelerator

    def save(self, folder: str | os.PathLike, global_step: int, adaptive_threshold: float | None) -> None:
        """Write this process's state file into `folder`."""
        # Async: the swarm's state is read once its worker's round is done (the rows of that round are trained on at
        # the next step of this run, but are not in the checkpoint); the free mode: they are queued, and saved.
        self.rounds.wait()
        with self.rounds.lock:
            swarm = self.rounds.swarm
            state = build_state(
                peer_id=self.config.peer_id,
                global_step=global_step,
                ledger=self.ledger.state_dict(),
                adaptive_threshold=adaptive_threshold,
                pending_rows=self.inbox.rows,
                swarm=swarm.state_dict() if swarm is not None else None,
                mode_name=self.rounds.mode.name,
                mode_state=self.rounds.mode.state_dict(),  # whatever the mode keeps (the free mode: its queue)
                time=self.clock.state_dict(),
                peer_value=self.value.state_dict(),
            )
        write_state_file(folder, self.accelerator.process_index, state)

    def restore(self, checkpoint: str | os.PathLike) -> CheckpointState | None:
        """Restore the state saved in the checkpoint folder `checkpoint` into the owners and return it (`None` when
        the checkpoint has none); `ValueError` naming the file when it is not valid, and then nothing is restored."""
        config, rounds, swarm = self.config, self.rounds, self.rounds.swarm
        limits = restore_limits(config, rounds.queue_rows(config.generation_batch_size))
        parsed = read_checked_state(checkpoint, self.accelerator.process_index, limits, swarm, rounds.mode)
        if parsed is None:
            return None
        with rounds.lock:
            self.ledger.load_state_dict(parsed.ledger)
            if parsed.time is not None:
                self.clock.load_state_dict(parsed.time)
            if parsed.peer_value is not None:
                self.value.load_state_dict(parsed.peer_value)
        self.inbox.restore(parsed.pending_rows)  # after the ledger: the drops of the admission count on top of it
        arrived = 0
        if self.accelerator.is_main_process:  # the mode's state lives with the swarm client
            if parsed.mode_state is not None:
                arrived = rounds.mode.load_state_dict(parsed.mode_state)
            warn_unread_states(checkpoint, self.accelerator.num_processes)
        logger.warning(  # a warning so that a restarted peer's log shows it by default
            "Resumed the F-TIS state of step %s from %s (%d queued peer row(s), %d of the exchange mode's).",
            parsed.global_step,
            checkpoint,
            len(parsed.pending_rows),
            arrived,
        )
        return parsed


# -- files ---------------------------------------------------------------------------------------------------------
def write_state_file(checkpoint: str | os.PathLike, process_index: int, state: dict[str, Any]) -> None:
    """Write `state` as the state file of `process_index` in `checkpoint` (atomically: a reader never sees half)."""
    write_json_atomic(state_path(checkpoint, process_index), state)


def read_state_file(checkpoint: str | os.PathLike, process_index: int) -> Any | None:
    """The state file of `process_index` in `checkpoint`, parsed as JSON (not checked: [`parse_state`]); `None`, with
    a warning, when the checkpoint has none; `ValueError` naming the file when it is not readable JSON."""
    path = state_path(checkpoint, process_index)
    if not path.is_file():
        logger.warning(
            "%s has no %s (saved by GRPOTrainer or without trl-ftis): the F-TIS counters, the swarm state and "
            "queued peer rows start empty.",
            checkpoint,
            path.name,
        )
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # also JSON nested too deep, or an integer too long
        raise ValueError(f"{path}: not a readable trl-ftis state file ({type(error).__name__}: {error})") from None


def warn_unread_states(checkpoint: str | os.PathLike, world_size: int) -> None:
    """Warn when `checkpoint` holds state files of more processes than `world_size`: their queued rows are lost."""
    extra = [
        path.name
        for path in Path(checkpoint).glob(STATE_FILE.format(process="*"))
        if not path.stem.rsplit("_", 1)[-1].isdigit() or int(path.stem.rsplit("_", 1)[-1]) >= world_size
    ]
    if extra:
        logger.warning(
            "%s was saved by more processes than this run has (%s): their queued peer rows are not restored.",
            checkpoint,
            ", ".join(sorted(extra)),
        )


def resolve_resume(resume_from_checkpoint: str | bool | None, output_dir: str | os.PathLike) -> str | None:
    """What `train(resume_from_checkpoint=...)` resumes from: `True` takes the last *complete* checkpoint in
    `output_dir` ([`last_complete_checkpoint`]; `ValueError` when there is none); on a command line, `last` (or
    `latest`, `true`) does the same and gives `None` (start afresh) when there is no checkpoint yet; `False` is
    `None`; a path is returned as it is."""
    checkpoint = resume_from_checkpoint
    from_command_line = isinstance(checkpoint, str) and checkpoint.lower() in _LAST and not os.path.exists(checkpoint)
    if checkpoint is True or from_command_line:
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is None and not from_command_line:
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
        if checkpoint is None:
            logger.info("No checkpoint in %s yet: training from the start.", output_dir)
    elif checkpoint is False:
        checkpoint = None
    return checkpoint


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest `checkpoint-<step>` folder of `output_dir` that holds its `trainer_state.json` (the Trainer writes
    it after the model, optimizer and RNG states), or `None`. Newer incomplete folders are skipped with a warning."""
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for entry in os.scandir(output_dir):
        prefix, _, step = entry.name.partition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit() and entry.is_dir():
            steps.append((int(step), entry.path))
    for step, path in sorted(steps, reverse=True):
        if os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)):
            return path
        logger.warning("Skipping %s: it has no %s (the run stopped while saving it).", path, TRAINER_STATE_NAME)
    return None
