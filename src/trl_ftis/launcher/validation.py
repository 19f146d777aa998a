"""How the launcher's pydantic schema says what is wrong: the base model, the errors its validators raise, and the
translation of pydantic's `ValidationError` into the user's list of problems, each naming where it is and the key.

The schema (`schema.py`, `slurm/schema.py`) declares every YAML section as a `Spec` model: its fields are the keys
(unknown keys are refused with a did-you-mean), and each field's validator raises one of

* `bad(message)`: the message follows the key's path, ``peers[1] (id 'b'): `slurm.gpus` must be an integer >= 0 ...``
  (`bad(message, suffix="[2]")` for an item the path does not reach, ``slurm.extra[2]``);
* `said(message)`: a whole sentence, shown as it is after the location;
* `problems([(where, message), ...])`: several whole problems at once, each with its own location (a check across
  peers, say).

pydantic runs every validator it can and reports every error at once; `format_problems` turns them into the lines of
`SwarmConfigError` in the launcher's words (pydantic's own wording is only a fallback). Standard library and
pydantic only.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

__all__ = [
    "Spec",
    "bad",
    "did_you_mean",
    "format_problems",
    "problems",
    "said",
    "unknown_key",
    "with_problems",
]

_BAD = "launcher_bad"
_SAID = "launcher_said"
_PROBLEMS = "launcher_problems"
_KEY = "[key]"  # pydantic's location element for a mapping key (rather than its value)


class Spec(BaseModel):
    """One section of the YAML schema: its fields are its keys, nothing else is accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Said after "unknown key `x` (...)" for these keys (e.g. why the Redis job has no `gpus`).
    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {}
    # Other names users write for a key (sbatch's, say), for the did-you-mean.
    ALIASES: ClassVar[dict[str, str]] = {}
    # Said after "`key` is missing" for these keys.
    MISSING_HINTS: ClassVar[dict[str, str]] = {}
    # What a value of this section looks like, for "`key` must be a mapping <this>, got ...".
    MAPPING_HINT: ClassVar[str] = ""
    # What one item of a list of these sections is called ("each peer must be a mapping ...").
    ENTRY: ClassVar[str] = "entry"


def bad(message: str, *, suffix: str = "") -> PydanticCustomError:
    """A problem with the value of the key being validated: shown after the key's path (plus `suffix`)."""
    return PydanticCustomError(_BAD, "{message}", {"message": message, "suffix": suffix})


def said(message: str) -> PydanticCustomError:
    """A problem written as a whole sentence (it names its keys itself)."""
    return PydanticCustomError(_SAID, "{message}", {"message": message})


def problems(items: Iterable[tuple[str, str]]) -> PydanticCustomError:
    """Several problems at once, each `(where, message)` with its own location (`peers[1] (id 'a')`)."""
    items = [(str(where), str(message)) for where, message in items]
    return PydanticCustomError(_PROBLEMS, "{message}", {"message": "; ".join(m for _, m in items), "items": items})


def with_problems(error: ValidationError, extra: PydanticCustomError) -> ValidationError:
    """`error` (raised by the inner validation of a `mode="wrap"` validator) with the problems of `extra` added, so
    that a check that runs on the raw input is reported together with the errors of its items."""
    items: list[Any] = [{"type": extra, "loc": (), "input": None}]
    for item in error.errors(include_url=False):
        kind, ctx = item["type"], item.get("ctx")
        if kind in (_BAD, _SAID, _PROBLEMS):
            items.append(
                {"type": PydanticCustomError(kind, "{message}", ctx), "loc": item["loc"], "input": item["input"]}
            )
        else:
            items.append({"type": kind, "loc": item["loc"], "input": item["input"], **({"ctx": ctx} if ctx else {})})
    return ValidationError.from_exception_data(error.title, items)


def did_you_mean(key: Any, allowed: Iterable[str], aliases: dict[str, str] | None = None) -> str | None:
    """The allowed key `key` was probably meant to be: its alias (another tool's name for it, `gpus_per_node` for
    `gpus`), the closest one if close enough to be a typo, or the one it starts or ends with (`gpus_per_node`)."""
    allowed = list(allowed)
    text = str(key)
    if aliases and text in aliases:
        return aliases[text]
    hint = difflib.get_close_matches(text, allowed, n=1)
    if hint:
        return hint[0]
    lowered = text.lower().replace("-", "_")
    for name in allowed:
        if lowered.startswith(name + "_") or lowered.endswith("_" + name):
            return name
    return None


def unknown_key(key: Any, allowed: tuple[str, ...], prefix: str = "", aliases: dict[str, str] | None = None) -> str:
    """ "unknown key `slurm.gpu` (allowed: nodes, gpus, ...); did you mean `slurm.gpus`?"."""
    hint = did_you_mean(key, allowed, aliases)
    suggestion = f"; did you mean `{prefix}{hint}`?" if hint else ""
    return f"unknown key `{prefix}{key}` (allowed: {', '.join(allowed)}){suggestion}"


# --------------------------------------------------------------------------------------------------------------------
# From pydantic's errors to the user's problems
# --------------------------------------------------------------------------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _model_at(root: type[BaseModel], path: tuple) -> type[BaseModel] | None:
    """The section model that validates the mapping at `path` (`("peers", 1, "slurm")` -> the slurm section)."""
    model: type[BaseModel] | None = root
    for element in path:
        if isinstance(element, int):
            continue  # an item of a list of sections
        if model is None or element not in model.model_fields:
            return None
        found = _models_in(model.model_fields[element].annotation)
        model = found[0] if found else None
    return model


def _path_text(path: Iterable[Any]) -> str:
    text = ""
    for element in path:
        text += f"[{element}]" if isinstance(element, int) else (f".{element}" if text else str(element))
    return text


def _problem(root: type[BaseModel], loc: tuple, shown: int, error: dict) -> str:
    """The problem of one pydantic error at `loc`; key paths are written from `loc[shown:]` on (the part inside the
    location that `format_problems` writes before it), models are looked up from the whole of `loc`."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == _SAID or (kind == _BAD and loc and loc[-1] == _KEY):
        return ctx["message"]  # a key's own problem names the key itself
    name = _path_text(loc[shown:])
    if kind == _BAD:
        return f"`{name}{ctx.get('suffix', '')}` {ctx['message']}"
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
        allowed = tuple(model.model_fields) if model is not None else ()
        prefix = _path_text(loc[shown:-1])
        spec = model if model is not None and issubclass(model, Spec) else Spec
        text = unknown_key(loc[-1], allowed, prefix + "." if prefix else "", spec.ALIASES)
        return text + spec.UNKNOWN_KEY_HINTS.get(str(loc[-1]), "")
    if kind == "missing":
        model = _model_at(root, loc[:-1])
        hint = model.MISSING_HINTS.get(loc[-1], "") if model is not None and issubclass(model, Spec) else ""
        return f"`{name}` is missing{hint}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        model = _model_at(root, loc)
        spec = model if model is not None and issubclass(model, Spec) else Spec
        what = f"`{name}`" if name else f"each {spec.ENTRY}"  # an item of a list: its location names it
        return f"{what} must be a mapping{spec.MAPPING_HINT}, got {type(error.get('input')).__name__}"
    return f"`{name}`: {error['msg']}"  # pydantic's own words: a case the validators do not cover


def format_problems(
    error: ValidationError, root: type[BaseModel], locate: Callable[[tuple], tuple[str, int]]
) -> list[str]:
    """One `"<where>: <problem>"` line per problem of `error`, in the order pydantic found them.

    `locate(loc)` returns the text that says where pydantic's location `loc` is (`"top level"`, `"peers[1] (id
    'b')"`) and how many of its first elements that text stands for; `root` is the model validated (to name the
    allowed keys of each section)."""
    lines = []
    for item in error.errors(include_url=False):
        if item["type"] == _PROBLEMS:
            lines += [f"{where}: {message}" for where, message in item["ctx"]["items"]]
            continue
        loc = tuple(item["loc"])
        where, shown = locate(loc)
        lines.append(f"{where}: {_problem(root, loc, shown, item)}")
    return lines
