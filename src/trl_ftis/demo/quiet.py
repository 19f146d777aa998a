"""Dependency warnings a demo user cannot act on, hidden (one function, imported first by the demo's scripts)."""

import warnings

DEPENDENCY_MODULES = r"(transformers|trl|peft|accelerate|torch|datasets|huggingface_hub)(\.|$)"
"""The modules whose deprecation notices the demo hides (a regular expression on the warning's module)."""


def quiet_dependency_warnings() -> None:
    """Hide the deprecation notices that dependencies issue and a demo user cannot act on (`FutureWarning`,
    `DeprecationWarning` raised inside transformers, TRL, PEFT, accelerate, torch, datasets); ours still show."""
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=DEPENDENCY_MODULES)
