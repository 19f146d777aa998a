"""Whether a `model` names a local folder or a Hugging Face Hub id, and what is wrong with one the peers could not
load: the launcher checks them before start, the example scripts before loading. Standard library only (the Hub cache
is asked through huggingface_hub when it is installed)."""

from __future__ import annotations

import os
from collections.abc import Sequence


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
