"""Checkpoints: the F-TIS state a resumed run needs besides TRL's (counters, the swarm, queued peer rows).

`Trainer` checkpoints hold the model, optimizer, scheduler, RNG and `TrainerState` (whose `global_step` is also the
swarm round). [`SwarmCheckpointing`] adds one JSON file per process, `ftis_state_<process>.json`, written into the
checkpoint folder before the Trainer's own files, and reads it back in `train(resume_from_checkpoint=...)`:

* the counters behind `summary()`, the model card and the per-reason drop metrics (rows sent, received, accepted,
  filtered, refused and dropped; rows trained on per peer; the peers that `ftis_source` indexes);
* the swarm's state ([`Swarm.state_dict`]): peers seen and their models, who is not waited for, and the digests of
  the messages accepted in the round window, so that a restarted peer that reads them again from the exchange does
  not train on them twice;
* the peer rows queued by [`FTISTrainer.add_peer_rows`] and not yet merged.

A checkpoint without the file (written by `GRPOTrainer`, or by a run without checkpointing) resumes with a warning
and every counter at zero. A file that is not valid raises `ValueError` naming it, before any training.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .peer_rows import PeerRow

logger = logging.getLogger(__name__)

STATE_FILE = "ftis_state_{process}.json"
"""The F-TIS state file of process `process` inside a checkpoint folder."""
STATE_FORMAT = 1
"""Version of the file's layout; a file of another version is refused."""

_COUNTERS = ("refused", "dropped", "dropped_since_merge", "stripped_since_merge", "accepted_by_peer")
_LAST = ("last", "latest", "true")  # command-line spellings of `resume_from_checkpoint=True`
_TOTALS = ("rows_sent", "rows_received", "rows_accepted", "rows_filtered", "bytes_sent", "rows_retokenised")
_LATER_TOTALS = ("rows_retokenised",)  # absent from files of earlier versions: 0 when missing


def state_path(checkpoint: str | os.PathLike, process_index: int) -> Path:
    return Path(checkpoint) / STATE_FILE.format(process=process_index)


# -- peer rows as JSON -------------------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """`json.dumps` default: NumPy scalars and arrays as Python values; anything else is not checkpointable."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} cannot be written to a checkpoint")


def _key_to_json(key: Hashable) -> Any:
    """A group key as JSON that [`_key_from_json`] turns back into an equal key: JSON scalars as they are, tuples
    (the swarm's `(sender, round, index)`) tagged, anything else by its `repr` (equal keys stay equal)."""
    if key is None or isinstance(key, (str, bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return key
    if isinstance(key, tuple):
        return {"tuple": [_key_to_json(item) for item in key]}
    return {"repr": repr(key)}


def _key_from_json(value: Any) -> Hashable:
    if isinstance(value, dict) and isinstance(value.get("tuple"), list):
        return tuple(_key_from_json(item) for item in value["tuple"])
    if isinstance(value, dict) and isinstance(value.get("repr"), str):
        return ("repr", value["repr"])
    if isinstance(value, (dict, list)):
        raise ValueError(f"not a group key: {value!r:.80}")  # noqa: TRY004 - a malformed file, not a wrong argument
    return value


def rows_to_json(rows: Sequence[PeerRow]) -> tuple[list[dict[str, Any]], int]:
    """The rows as JSON-serialisable dicts, and how many could not be (a prompt or column that JSON cannot hold)."""
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
        try:
            json.dumps(record, default=_plain)
        except (TypeError, ValueError):
            unwritable += 1
            continue
        out.append(record)
    return out, unwritable


def rows_from_json(records: Any) -> list[PeerRow]:
    if not isinstance(records, list):
        raise ValueError("'pending_peer_rows' is not a list")  # noqa: TRY004 - a malformed file, not a wrong argument
    rows = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"pending peer row {index} is not an object")  # noqa: TRY004 - a malformed file, not a wrong argument
        try:
            rows.append(PeerRow(**{**record, "group": _key_from_json(record.get("group"))}))
        except (TypeError, ValueError) as error:
            raise ValueError(f"pending peer row {index}: {error}") from None
    return rows


# -- the trainer's state -------------------------------------------------------------------------------------------
def trainer_state(trainer) -> dict[str, Any]:
    """This process's F-TIS state (JSON-serialisable); the swarm's only on the process that holds it."""
    rows, unwritable = rows_to_json(trainer._pending_peer_rows)
    if unwritable:
        logger.warning(
            "%d queued peer row(s) hold a prompt or column that JSON cannot hold: they are not in the checkpoint "
            "(a run resumed from it will not train on them).",
            unwritable,
        )
    return {
        "format": STATE_FORMAT,
        "peer_id": trainer.args.peer_id,
        "global_step": trainer.state.global_step,
        "totals": {key: trainer._totals[key] for key in _TOTALS},
        "refused": dict(trainer._refused_totals),
        "dropped": dict(trainer._dropped_totals),
        "dropped_since_merge": dict(trainer._dropped),
        "stripped_since_merge": dict(trainer._stripped),
        "accepted_by_peer": dict(trainer._accepted_by_peer),
        "row_count_keys": sorted(trainer._row_count_keys),
        "sources": list(trainer._sources),
        "adaptive_threshold": trainer._adaptive_threshold,
        "pending_peer_rows": rows,
        "swarm": trainer.swarm.state_dict() if trainer.swarm is not None else None,
    }


def restore_trainer_state(trainer, state: Any, source: str = "F-TIS state") -> None:
    """Put `state` ([`trainer_state`]) back into `trainer`. Checks everything first: a malformed state raises
    `ValueError` naming `source` and changes nothing."""
    try:
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")  # noqa: TRY004 - a malformed file, not a wrong argument
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"format {state.get('format')!r}, this version reads format {STATE_FORMAT}")
        totals = _numbers(state.get("totals"), "totals")
        if not set(_TOTALS) - set(_LATER_TOTALS) <= set(totals) <= set(_TOTALS):
            raise ValueError(f"'totals' must have exactly {', '.join(_TOTALS)}")
        totals = {**dict.fromkeys(_LATER_TOTALS, 0), **totals}
        counters = {name: _numbers(state.get(name), name) for name in _COUNTERS}
        keys = state.get("row_count_keys")
        sources = state.get("sources")
        for name, value in (("row_count_keys", keys), ("sources", sources)):
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ValueError(f"{name!r} is not a list of strings")
        rows = rows_from_json(state.get("pending_peer_rows"))
        threshold = state.get("adaptive_threshold")  # absent in files of earlier versions
        if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
            raise ValueError("'adaptive_threshold' is not a finite number")
        swarm_state = state.get("swarm")
        if trainer.swarm is not None and swarm_state is not None:
            trainer.swarm.load_state_dict(swarm_state)  # checks before it changes anything
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
    trainer._totals.update(totals)
    trainer._refused_totals = Counter(counters["refused"])
    trainer._dropped_totals = Counter(counters["dropped"])
    trainer._dropped = Counter(counters["dropped_since_merge"])
    trainer._stripped = Counter(counters["stripped_since_merge"])
    trainer._accepted_by_peer = Counter(counters["accepted_by_peer"])
    trainer._row_count_keys = set(keys)
    trainer._sources = list(sources)
    trainer._adaptive_threshold = None if threshold is None else float(threshold)
    trainer._pending_peer_rows = rows + trainer._pending_peer_rows


def _numbers(value: Any, name: str) -> dict[str, int]:
    if not isinstance(value, Mapping) or not all(
        isinstance(key, str) and isinstance(count, (int, float)) and not isinstance(count, bool) and count >= 0
        for key, count in value.items()
    ):
        raise ValueError(f"{name!r} is not a mapping of names to non-negative counts")
    return {key: int(count) for key, count in value.items()}


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


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as JSON to `path` through a temporary file and a rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, default=_plain), encoding="utf-8")
    os.replace(temporary, path)


class SwarmCheckpointing:
    """Saves and restores the F-TIS state with the Trainer's checkpoints (mixed into [`FTISTrainer`])."""

    def _save_checkpoint(self, model, trial):
        # Written first: the Trainer's own files (trainer_state.json last) complete the checkpoint.
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        # exchange_mode="async": the swarm's state is read once its worker's round is done (the rows of that round
        # are trained on at the next step of this run, but are not in the checkpoint).
        if self._exchange_worker is not None:
            self._exchange_worker.wait()
        with self._exchange_lock:
            state = trainer_state(self)
        write_json_atomic(state_path(folder, self.args.process_index), state)
        return super()._save_checkpoint(model, trial)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """[`~transformers.Trainer.train`]; when resuming, the F-TIS state saved with the checkpoint is restored
        first. `resume_from_checkpoint=True` takes the last *complete* checkpoint in `output_dir` (one that has its
        `trainer_state.json`: a process killed while saving leaves a newer, incomplete folder behind). On a command
        line, `--resume_from_checkpoint last` (or `latest`, `true`) does the same, and starts afresh when there is
        no checkpoint yet: a peer can be started and restarted with one command."""
        checkpoint = resume_from_checkpoint
        from_command_line = (
            isinstance(checkpoint, str) and checkpoint.lower() in _LAST and not os.path.exists(checkpoint)
        )
        if checkpoint is True or from_command_line:
            checkpoint = last_complete_checkpoint(self.args.output_dir)
            if checkpoint is None and not from_command_line:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
            if checkpoint is None:
                logger.info("No checkpoint in %s yet: training from the start.", self.args.output_dir)
        elif checkpoint is False:
            checkpoint = None
        if checkpoint is not None and os.path.isdir(checkpoint):  # else the Trainer raises its own error
            self.load_ftis_state(checkpoint)
        return super().train(checkpoint, *args, **kwargs)

    def load_ftis_state(self, checkpoint: str | os.PathLike) -> bool:
        """Restore the F-TIS state saved in the checkpoint folder `checkpoint` (done by `train(resume_from_checkpoint=
        ...)`). Returns whether a state was found; `ValueError` naming the file when it is not valid."""
        path = state_path(checkpoint, self.args.process_index)
        if not path.is_file():
            logger.warning(
                "%s has no %s (saved by GRPOTrainer or without trl-ftis): the F-TIS counters, the swarm state and "
                "queued peer rows start empty.",
                checkpoint,
                path.name,
            )
            return False
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not a readable trl-ftis state file ({error})") from None
        restore_trainer_state(self, state, source=str(path))
        if self.accelerator.is_main_process:
            self._warn_unread_states(Path(checkpoint))
        logger.warning(  # a warning so that a restarted peer's log shows it by default
            "Resumed the F-TIS state of step %s from %s (%d queued peer row(s)).",
            state.get("global_step"),
            path,
            len(state["pending_peer_rows"]),
        )
        return True

    def _warn_unread_states(self, checkpoint: Path) -> None:
        extra = [
            path.name
            for path in checkpoint.glob(STATE_FILE.format(process="*"))
            if not path.stem.rsplit("_", 1)[-1].isdigit() or int(path.stem.rsplit("_", 1)[-1]) >= self.args.world_size
        ]
        if extra:
            logger.warning(
                "%s was saved by more processes than this run has (%s): their queued peer rows are not restored.",
                checkpoint,
                ", ".join(sorted(extra)),
            )
