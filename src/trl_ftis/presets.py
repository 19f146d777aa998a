"""The paper's settings of TRL's own options as one named preset (`FTISConfig.preset`), and how a preset resolves:
it sets only the options not given (left `None`), so a value given, TRL's default included, always wins.

Also the config's once-per-process start-up lines ([`warn_once`]): what a preset set, the fp32 head's warning. A
process that builds many configs (a sweep, the tests) says each line once.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from trl import GRPOConfig

logger = logging.getLogger(__name__)

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        # The paper's aggregation: the mean over completions of each completion's token mean (TRL: "dapo").
        "loss_type": "grpo",
        # With dropout on, generation and scoring differ and even a peer's own rows are off-policy (TRL: False).
        "disable_dropout": True,
        # Log-probs are compared across models: bf16 noise summed over a completion moves the filter statistic.
        # `None` here: on with bf16/fp16, off in fp32, where it changes nothing (TRL: False).
        "cast_lm_head_to_fp32": None,
    },
}
"""`FTISConfig.preset`: named sets of TRL's own options. A preset sets only the options not given,
so a value given (TRL's default included) wins; the rest of the paper's recipe (G = 12, top-k 50, ...) is in
`examples/configs/`."""
START_UP_LINES_LOGGED: set[str] = set()
"""The keys of the once-per-process lines already logged ([`warn_once`])."""
TRL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
"""`GRPOConfig`'s field defaults, as TRL sets them (an option a preset may set resolves to these without one)."""


def warn_once(log: logging.Logger, key: str, message: str, *args: Any) -> None:
    """Log `message % args` as a warning on `log`, unless a line under `key` was logged already in this process."""
    if key not in START_UP_LINES_LOGGED:
        START_UP_LINES_LOGGED.add(key)
        log.warning(message, *args)


def check_preset(name: str | None) -> None:
    """`ValueError` unless `name` is a preset of [`PRESETS`] or `None` (no preset)."""
    if name is not None and name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; expected one of {', '.join(PRESETS)} (or none).")


def resolve_preset_options(config: Any, names: tuple[str, ...]) -> list[str]:
    """Each of `names` that `config` does not give (`None`) gets its preset's value, or TRL's default without one;
    returns what the preset set, for the start-up line ([`say_what_the_preset_set`])."""
    preset = PRESETS.get(config.preset, {})
    changed = []
    for name in names:
        if getattr(config, name) is not None:
            continue
        value = TRL_DEFAULTS[name]
        if name in preset:
            value = preset[name]
            if name == "cast_lm_head_to_fp32" and value is None:
                value = bool(config.bf16 or config.fp16)
            if value != TRL_DEFAULTS[name]:
                changed.append(f"{name}={value!r} (TRL's default: {TRL_DEFAULTS[name]!r})")
        setattr(config, name, value)
    return changed


def say_what_the_preset_set(preset: str | None, changed: list[str]) -> None:
    """The start-up line of a preset that changed TRL's defaults: once per process and set of changes."""
    if changed:
        line = f"preset={preset!r} sets " + ", ".join(changed)
        warn_once(logger, line, "%s.", line)
