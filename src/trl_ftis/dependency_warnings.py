"""The dependencies' deprecation notices a user cannot act on, hidden. Standard library only, so that a script can
call it before importing transformers, TRL or torch (`import trl_ftis...` loads none of them)."""

import warnings

DEPENDENCY_MODULES = r"(transformers|trl|peft|accelerate|torch|datasets|huggingface_hub)(\.|$)"
"""The modules whose deprecation notices are hidden (a regular expression on the warning's module)."""


def quiet_dependency_warnings() -> None:
    """Hide the deprecation notices that dependencies issue and a user cannot act on (`FutureWarning`,
    `DeprecationWarning` raised inside transformers, TRL, PEFT, accelerate, torch, datasets); ours still show."""
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=DEPENDENCY_MODULES)
