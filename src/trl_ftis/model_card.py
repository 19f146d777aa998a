"""The F-TIS section of the model card: the variant and its settings, the swarm's peers and their models.

[`ftis_model_card_section`] takes what it shows as arguments (the trainer passes its config, settings, the ledger's
peers and counts and the swarm's peer models), so it is built and tested without a trainer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .peer_ids import is_peer_id

_CARD_CELL_CHARS = 120


def ftis_model_card_section(
    *,
    args,
    temperature: float,
    num_generations: int,
    global_step: int,
    paper: Mapping[str, str],
    model_name: str,
    peers: Sequence[str],
    accepted_by_peer: Mapping[str, int],
    peer_models: Mapping[str, str],
    collaboration: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
) -> str:
    """The Markdown section `FTISTrainer.create_model_card` adds to TRL's card (before its citations).

    Args:
        args ([`FTISConfig`]): the run's settings (variant, cap, threshold, ...).
        temperature, num_generations, global_step: the trainer's sampling temperature, group size and steps done.
        paper (`Mapping[str, str]`): the paper's `title` and arXiv `id`.
        model_name (`str`): this peer's model.
        peers (`Sequence[str]`): every peer it learned from ([`PeerRowLedger.peers`]).
        accepted_by_peer (`Mapping[str, int]`): the swarm rows trained on, per peer.
        peer_models (`Mapping[str, str]`): the models the peers reported (`Swarm.peer_models`).
        collaboration (`Mapping[str, Any]`, *optional*): `FTISTrainer.collaboration()`: the time split and the value
            of the peer rows, shown as a table of their own.
        results (`Mapping[str, Any]`, *optional*): what the run measured (the last logged reward, evaluation metrics,
            the dataset when known), shown as a table of their own.
    """
    rows = [
        ("variant", f"`{args.variant}`"),
        ("truncation cap C (`is_cap`)", f"{args.is_cap:g}"),
        ("filter threshold g (`kl_threshold`)", f"{args.kl_threshold:g}"),
        ("filter statistic (`kl_reduction`)", f"`{args.kl_reduction}`"),
        ("collaboration mode", f"`{args.collaboration_mode}`"),
        ("sampling temperature", f"{temperature:g}"),
        ("completions per prompt G (`num_generations`)", str(num_generations)),
        ("learning rate", f"{args.learning_rate:g}"),
        ("optimizer steps", str(global_step)),
        ("KL coefficient β", f"{args.beta:g}"),
    ]
    lines = [
        "## F-TIS training",
        "",
        (
            "Trained with trl-ftis: GRPO on its own completions plus those "
            "of the other peers of a swarm, through the F-TIS objective (importance weights truncated against the "
            "sender's log-probs, negative-advantage samples too far off-policy filtered out), "
            f"[{paper['title']}](https://arxiv.org/abs/{paper['id']})."
        ),
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in rows],
        "",
        "### Swarm",
        "",
    ]
    # Peer ids and model names come from other peers (or add_peer_rows callers): escaped for a table cell.
    own = f"{_card_peer(args.peer_id)} ({_card_cell(model_name)})"
    if not peers:
        lines += [f"This peer, {own}, trained on its own completions only.", ""]
    else:
        lines += [
            "| peer | model | completions trained on |",
            "|---|---|---|",
            f"| {_card_peer(args.peer_id)} (this model) | {_card_cell(model_name)} | own |",
            *[
                f"| {_card_peer(peer)} | {_card_cell(peer_models.get(peer, 'not reported'))} | "
                f"{accepted_by_peer.get(peer, '-')} |"
                for peer in peers
            ],
            "",
        ]
    if results:
        lines += [
            "### Results",
            "",
            "| measured | value |",
            "|---|---|",
            *[f"| {_card_cell(name)} | {_card_value(value)} |" for name, value in results.items()],
            "",
        ]
    if collaboration is not None:
        lines += _collaboration_lines(collaboration)
    return "\n".join(lines) + "\n"


def _card_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return _card_cell(value)


def card_results(log_history: Sequence[Mapping[str, Any]], dataset_name: str | None = None) -> dict[str, Any]:
    """What a run measured, for the card: the dataset (when known), the last logged training reward, and every
    evaluation metric as last logged (`eval_*`: TRL's, or a script's own evaluation)."""
    found: dict[str, Any] = {}
    if dataset_name:
        found["dataset"] = dataset_name
    rewards = [entry["reward"] for entry in log_history if isinstance(entry.get("reward"), (int, float))]
    if rewards:
        found["training reward (last logged)"] = float(rewards[-1])
    for entry in log_history:
        for key, value in entry.items():
            if key.startswith("eval_") and isinstance(value, (int, float)) and not isinstance(value, bool):
                found[key] = float(value)
    return found


def without_base_model_link(text: str, model_name: str) -> str:
    """TRL's card with its base-model sentence fixed for a model that is no Hub id (a local folder, a model built in
    code): TRL writes `[None](https://huggingface.co/None)` then; the card names the model instead."""
    broken = "[None](https://huggingface.co/None)"
    return text.replace(broken, f"a local model ({_card_cell(model_name)}), not on the Hugging Face Hub")


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _fraction(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def _collaboration_lines(collaboration: Mapping[str, Any]) -> list[str]:
    """The card's "What collaboration bought" section: where the training time went and what peer rows were worth."""
    times, value = collaboration["time_seconds"], collaboration["peer_value"]
    lines = [
        "### What collaboration bought",
        "",
        "| time (this process) | seconds |",
        "|---|---|",
        *[
            f"| {name} | {_seconds(times[name])} |"
            for name in ("step", "generation", "scoring", "exchange", "training", "other")
        ],
        f"| generation share f | {_fraction(collaboration['generation_share'])} |",
        "",
    ]
    if value["rows_in_loss"]:
        lines += [
            (
                "| peer | rows in the loss | effective sample size fraction | filtered | worth (own rows) | "
                "own generation stood in for |"
            ),
            "|---|---|---|---|---|---|",
            *[
                f"| {_card_peer(name)} | {entry['rows_in_loss']} | {_fraction(entry['ess_frac'])} | "
                f"{_fraction(entry['filtered_frac'])} | {entry['rows_worth'] or 0:.0f} | "
                f"{_seconds(entry['generation_seconds_stood_in'])} |"
                for name, entry in value["peers"].items()
                if entry["rows_in_loss"]
            ],
            "",
        ]
    lines += [_card_text(collaboration["collaboration"]), ""]
    return lines


_CARD_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "|": "&#124;",
    "`": "&#96;",
    "[": "&#91;",
    "]": "&#93;",
    "\\": "&#92;",
}


def _card_cell(value: Any) -> str:
    """`value` as the text of one Markdown table cell: control and format characters and line breaks become spaces,
    at most `_CARD_CELL_CHARS` characters are kept (`…` marks a cut), and every character that Markdown or HTML would
    read as markup (`& < > | \\ ` [ ]`: HTML, the end of a cell, code, links and images) is written as an HTML
    entity, so it shows as itself and never ends the cell."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in str(value)).split())
    if len(text) > _CARD_CELL_CHARS:
        text = text[: _CARD_CELL_CHARS - 1] + "…"
    return "".join(_CARD_ESCAPES.get(ch, ch) for ch in text) or "-"


def _card_text(value: Any) -> str:
    """`value` as a paragraph of the card: escaped like a cell, but never cut (a sentence the trainer wrote, whose
    numbers must stay whole; bounded all the same, at 2000 characters, at a word boundary)."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in str(value)).split())
    if len(text) > 2000:
        text = text[:2000].rsplit(" ", 1)[0] + " …"
    return "".join(_CARD_ESCAPES.get(ch, ch) for ch in text) or "-"


def _card_peer(peer: Any) -> str:
    """A peer id for the model card: in code style when it is a valid peer id (no markup character can be in one),
    else escaped like any other cell."""
    return f"`{peer}`" if is_peer_id(peer) else _card_cell(peer)


def with_quick_start_model(text: str, args: Any) -> str:
    """TRL's card with its Quick start loading this run's model: TRL fills in the trainer's Hub id, `None` unless it
    pushes to the Hub, and a reader copying `model="None"` gets an error. The config's `hub_model_id`, else the
    output directory (where the model is saved, which `pipeline` loads from)."""
    where = getattr(args, "hub_model_id", None) or str(args.output_dir)
    return text.replace('model="None"', f"model={json.dumps(where)}")


def model_card_name(args: Any) -> str:
    """The model name TRL's `GRPOTrainer._save_checkpoint` gives the card: the Hub id's last part, else the output
    directory's name."""
    hub_model_id = getattr(args, "hub_model_id", None)
    return hub_model_id.split("/")[-1] if hub_model_id else Path(args.output_dir).name


class ModelCardAtEndCallback(TrainerCallback):
    """Writes the model card when training ends in a run that saves no checkpoints (`save_strategy="no"`): TRL writes
    it only with each checkpoint, so such a run had none. `write` is the trainer's `create_model_card`, which writes
    on the main process only."""

    def __init__(self, write: Callable[..., None]):
        self.write = write

    def on_train_end(self, args, state, control, **kwargs):
        if str(getattr(args.save_strategy, "value", args.save_strategy)) == "no":
            self.write(model_name=model_card_name(args))


def add_ftis_section(path: Path, model_name: str, **section) -> None:
    """Add the F-TIS section ([`ftis_model_card_section`] of `section` and `model_name`) to the model card TRL wrote
    at `path`, before its citations, unlink a local base model ([`without_base_model_link`]) and name the model the
    Quick start loads ([`with_quick_start_model`])."""
    text = without_base_model_link(path.read_text(encoding="utf-8"), model_name)
    text = with_quick_start_model(text, section["args"])
    added = ftis_model_card_section(model_name=model_name, **section)
    marker = "## Citations"
    text = text.replace(marker, added + marker, 1) if marker in text else text + "\n" + added
    path.write_text(text, encoding="utf-8")
