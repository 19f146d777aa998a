"""The seams between `FTISTrainer` and TRL: every TRL (and transformers) method it overrides or wraps, in one list.

`FTISTrainer` is a `GRPOTrainer` that overrides some of TRL's private methods. A private method can change in any TRL
release without notice, and a subclass whose override was written against an older body then degrades silently
(TRL's own `GRPOWithReplayBufferTrainer` kept training, wrongly, after its copy of `_generate_and_score_completions`
drifted from the one it replaced). So each private seam below carries a fingerprint of the TRL source it was written
against; [`changed_seams`] compares them with the installed TRL, and `tests/core/test_trl_seams.py` fails, naming
each changed seam and what to re-read, when they differ. The public methods `FTISTrainer` overrides (`__init__`,
`train`, `create_model_card`) are listed too, without a fingerprint: their contract is TRL's public API.

`docs/api.md`, "How FTISTrainer hooks into TRL", is generated from this list (`docs/generate_api_reference.py`).

After a TRL upgrade that changes a seam: re-read the new TRL method next to the override named by the seam, adapt the
override if needed, run `tests/core/test_trainer.py` and `tests/core/test_dropin.py`, then record the new fingerprint
(`trl_ftis.trl_seams.fingerprint(...)`, printed by the failing test) and TRL version here.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from dataclasses import dataclass

TRL_VERSION = "1.16.0"  # the TRL release the fingerprints below were taken from


@dataclass(frozen=True)
class Seam:
    """One TRL or transformers method that `FTISTrainer` overrides or wraps.

    `owner` is the class that defines the method as `trl.GRPOTrainer` resolves it (`GRPOTrainer` or transformers'
    `Trainer`); `hook` is `"override"` (a method of `FTISTrainer` that calls the original) or `"wrap"` (the original,
    wrapped, assigned to `FTISTrainer`); `why` is what `FTISTrainer` adds there, `narrowest` why no public hook (a
    `TrainerCallback` or a public method) would do; `fingerprint` is [`fingerprint`] of the original's source, `None`
    for a public method.
    """

    method: str
    owner: str
    hook: str
    why: str
    narrowest: str
    fingerprint: str | None

    @property
    def public(self) -> bool:
        """A public method: overridden under TRL's public contract, no fingerprint kept."""
        return self.fingerprint is None

    @property
    def qualified_name(self) -> str:
        """`Owner.method`, as TRL's source names it."""
        return f"{self.owner}.{self.method}"


_NO_CALLBACK_SEES_IT = "no TrainerCallback event sees the batch or the tensors"

SEAMS: tuple[Seam, ...] = (
    Seam(
        "__init__",
        "GRPOTrainer",
        "override",
        "accepts a GRPOConfig (converted) or an FTISConfig; reads the swarm credentials and caps GPU memory "
        "(`gpu_memory_fraction`) before the model is loaded; turns off a `cast_lm_head_to_fp32` TRL cannot apply "
        "(LoRA with tied embeddings); connects the main process to the swarm and composes the ledger, the admission, "
        "the round runner (with its exchange mode), the peer-row merge and the loss hook. The same parameters, in "
        "the same order, with the same defaults (a test compares the signatures).",
        "the public constructor",
        None,
    ),
    Seam(
        "train",
        "Trainer",
        "override",
        "with `resume_from_checkpoint`, restores the F-TIS state first (`trl_ftis.swarm.checkpoint`); closes the "
        "swarm's transport and the background exchange worker when training ends or fails (and reopens it for a "
        "second `train()`).",
        "a public method",
        None,
    ),
    Seam(
        "create_model_card",
        "_BaseTrainer",
        "override",
        "adds the F-TIS settings, the swarm's peers and their models and what collaboration bought to TRL's card.",
        "a public method",
        None,
    ),
    Seam(
        "_generate",
        "GRPOTrainer",
        "override",
        "times generation (`ftis/time/generation`).",
        "generation runs inside TRL's `_prepare_inputs`, between no two callback events.",
        "7ab4c9d3681259b3",
    ),
    Seam(
        "_generate_single_turn",
        "GRPOTrainer",
        "override",
        "records the generator's log-probs during `generate` itself, when someone listens (own rows are shared with "
        "them).",
        "the recorder must be around the model's `generate` call, which only this method makes.",
        "f54eacb60f1e9f43",
    ),
    Seam(
        "_calculate_rewards",
        "GRPOTrainer",
        "override",
        "keeps the raw per-function rewards, which TRL does not store and the shared rows carry; times scoring "
        "(`ftis/time/scoring`).",
        "TRL returns the rewards to `_generate_and_score_completions` and keeps only their statistics; "
        + _NO_CALLBACK_SEES_IT
        + ".",
        "d57f41b9d87b5712",
    ),
    Seam(
        "_generate_and_score_completions",
        "GRPOTrainer",
        "override",
        "adds the F-TIS fields to TRL's batch, hands own rows to listeners, runs the swarm round and merges peer rows "
        "into the batch; times it all, so that `training_step` can subtract it from its own time. The override calls "
        "TRL's method whole and works on its output: it copies none of it.",
        "its output, the generation batch, is where peer rows must join; " + _NO_CALLBACK_SEES_IT + ".",
        "162e6e74cfe523f8",
    ),
    Seam(
        "training_step",
        "GRPOTrainer",
        "override",
        "times the micro-batch's forward and backward (`ftis/time/training`: the step without the generation batch "
        "it may make); logs the counts of filtered peer rows once per optimizer step (TRL's `_step` counts "
        "micro-batches).",
        "`on_step_begin` and `on_substep_end` bracket more than the forward and backward (generation included).",
        "3899daadc79c2a60",
    ),
    Seam(
        "_compute_loss",
        "GRPOTrainer",
        "override",
        "hands the F-TIS hook a shallow copy of the batch (the buffered batch is reused across `num_iterations`), "
        "then runs TRL's loss unchanged; a micro-batch that peer rows made larger than `peer_micro_batch_size` is "
        "computed in weighted row chunks with the same gradient (`trl_ftis.micro_batches`).",
        "the loss is computed inside `training_step`; " + _NO_CALLBACK_SEES_IT + ".",
        "38c44fc2c1ee52b3",
    ),
    Seam(
        "_get_per_token_logps_and_entropies",
        "GRPOTrainer",
        "override",
        "the F-TIS hook: on its first call inside `_compute_loss` it replaces the batch's advantages and ratio "
        "reference by the F-TIS terms, so that TRL's clipped surrogate computes the F-TIS loss without a copy of "
        "TRL's loss (the contract with TRL it relies on: `trl_ftis.loss_hook`; `tests/core/test_trainer.py::"
        "test_trl_loss_contract_*` check it).",
        "the learner's log-probs `ℓθ` exist only inside TRL's loss; " + _NO_CALLBACK_SEES_IT + ".",
        "ad5d27408c5ee295",
    ),
    Seam(
        "_save_checkpoint",
        "GRPOTrainer",
        "override",
        "writes the F-TIS state (counters, swarm, queued peer rows) into each checkpoint folder, on every process, "
        "before TRL and transformers write theirs.",
        "`on_save` comes after the checkpoint is complete (`trainer_state.json`), pushed and rotated: a run killed "
        "in between would leave a complete checkpoint without its F-TIS state, and `save_total_limit` would rotate "
        "before it is written; an `ExportableState` callback's `state()` runs on the saving process only.",
        "e6a9d8f185cbd1cd",
    ),
    Seam(
        "_save",
        "Trainer",
        "wrap",
        "writes `training_args.bin` with `self.args` swapped for a copy without the secrets "
        "(`FTISConfig.saving_redacted`).",
        "one of the two methods that write `training_args.bin` (`torch.save(self.args)`), which no hook reaches.",
        "57bc24e672ff5f0f",
    ),
    Seam(
        "_push_from_checkpoint",
        "Trainer",
        "wrap",
        "the same, for the copy of `training_args.bin` pushed to the Hub.",
        "the other method that writes `training_args.bin`.",
        "02b2563d6a685150",
    ),
)


def fingerprint(function) -> str:
    """A short hash of `function`'s source that ignores comments, docstrings, blank lines and formatting: its parsed
    source (`ast`), docstrings removed, written out field by field and hashed with sha256 (the first 16 hex digits)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()[:16]


def _canonical(node) -> str:
    """`node` as text: its type and its non-empty fields, positions left out. Unlike `ast.dump`, the same on every
    Python version that parses the source to the same tree (3.13's `ast.dump` leaves out empty fields, 3.12 added
    `type_params`)."""
    if isinstance(node, ast.AST):
        fields = ((name, getattr(node, name, None)) for name in node._fields)
        inner = ",".join(f"{name}={_canonical(value)}" for name, value in fields if value not in (None, []))
        return f"{type(node).__name__}({inner})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    return repr(node)


@dataclass(frozen=True)
class SeamChange:
    """A seam whose TRL method is no longer the one `FTISTrainer`'s override was written against."""

    seam: Seam
    found: str  # what the installed TRL has: `Owner.method` and its fingerprint, or that it is missing

    def describe(self) -> str:
        """One line naming the seam, what changed and what to re-read."""
        return (
            f"{self.seam.qualified_name} ({self.seam.hook} in FTISTrainer): written against TRL {TRL_VERSION} "
            f"(fingerprint {self.seam.fingerprint}), installed: {self.found}. Re-read the installed "
            f"{self.seam.method} next to FTISTrainer.{self.seam.method} ({self.seam.why})"
        )


def changed_seams(base: type | None = None, seams: tuple[Seam, ...] = SEAMS) -> list[SeamChange]:
    """The private seams whose method, as `base` (default `trl.GRPOTrainer`) resolves it, is defined by another class
    or has another fingerprint than recorded; empty when every seam is as it was written against."""
    if base is None:
        from trl import GRPOTrainer as base
    changes = []
    for seam in seams:
        if seam.public:
            continue
        method = getattr(base, seam.method, None)
        if method is None:
            changes.append(SeamChange(seam, "no such method"))
            continue
        owner = method.__qualname__.rpartition(".")[0]
        found = fingerprint(method)
        if owner != seam.owner or found != seam.fingerprint:
            changes.append(SeamChange(seam, f"{owner}.{seam.method} with fingerprint {found}"))
    return changes
