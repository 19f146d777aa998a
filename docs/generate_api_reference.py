"""Regenerate the generated blocks of docs/api.md from the code, so that the reference cannot drift from it.

    .venv/bin/python docs/generate_api_reference.py          # rewrite the blocks in docs/api.md
    .venv/bin/python docs/generate_api_reference.py --check  # exit 1, naming the blocks, when they differ

A generated block sits between `<!-- generated: KEY -->` and `<!-- end of generated: KEY -->` lines; everything
outside the blocks is written by hand (the guide parts) and left as it is. The keys:

* `exports`: the names `trl_ftis` exports;
* `FTISConfig fields`: every field `FTISConfig` declares, with its type, default and help text;
* `FTISTrainer signature`: the constructor's parameters;
* `seams`: the TRL methods `FTISTrainer` overrides or wraps, from `trl_ftis.trl_seams.SEAMS`;
* `signatures of MODULE: NAME, ...`: the signatures of these names of MODULE, quoted in a guide part;
* `reference`: every package of `trl_ftis` that declares `__all__` (found by walking the package, so that a package
  renamed or added is followed), each exported name with its signature and the first paragraph of its docstring; for
  a class, also its own public methods and properties.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path

API_MD = Path(__file__).resolve().parent / "api.md"
ROOT = "trl_ftis"
REGENERATE = ".venv/bin/python docs/generate_api_reference.py"
BEGIN, END = "<!-- generated: {} -->", "<!-- end of generated: {} -->"
BLOCK = re.compile(
    r"^<!-- generated: (?P<key>[^>]+?) -->\n(?P<body>.*?)^<!-- end of generated: (?P=key) -->$", re.M | re.S
)
WIDTH = 119
MAX_PARAMETERS = 40  # a longer constructor is shown as its count
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
SOURCE_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://)[^)]*\)")


# ---------------------------------------------------------------------------------------------------------------------
# Signatures and docstrings
# ---------------------------------------------------------------------------------------------------------------------
def _annotation(annotation) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _value(value) -> str:
    if value is dataclasses.MISSING:
        return "<required>"
    text = ADDRESS.sub("", repr(value))
    return text if not text.startswith("<function ") else f"<function {value.__qualname__}>"


def _parameters(signature: inspect.Signature) -> list[str]:
    parts, kinds = [], [p.kind for p in signature.parameters.values()]
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and inspect.Parameter.VAR_POSITIONAL not in kinds[:index]:
            if index == 0 or kinds[index - 1] is not inspect.Parameter.KEYWORD_ONLY:
                parts.append("*")
        text = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        text += parameter.name
        annotation = _annotation(parameter.annotation)
        if annotation:
            text += f": {annotation}"
        if parameter.default is not inspect.Parameter.empty:
            text += f" = {_value(parameter.default)}" if annotation else f"={_value(parameter.default)}"
        parts.append(text)
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY and (
            index + 1 == len(kinds) or kinds[index + 1] is not inspect.Parameter.POSITIONAL_ONLY
        ):
            parts.append("/")
    return parts


def signature_text(name: str, function: Callable, *, drop_self: bool = False) -> str:
    """`name(parameters) -> return`, one line when it fits in the page's width, else one parameter a line."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return f"{name}(...)"
    parts = _parameters(signature)
    if drop_self and parts and parts[0] in ("self", "cls"):
        parts = parts[1:]
    returns = _annotation(signature.return_annotation)
    tail = f" -> {returns}" if returns else ""
    line = f"{name}({', '.join(parts)}){tail}"
    if len(line) <= WIDTH:
        return line
    return f"{name}(\n" + "".join(f"    {part},\n" for part in parts) + f"){tail}"


def summary(obj) -> str:
    """The first paragraph of `obj`'s own docstring, on one line; empty when it has none (a dataclass's generated
    `Name(field, ...)` docstring counts as none)."""
    doc = obj.__doc__ if isinstance(obj, type) else inspect.getdoc(obj)
    if not doc or (isinstance(obj, type) and doc.startswith(f"{obj.__name__}(")):
        return ""
    paragraph = inspect.cleandoc(doc).split("\n\n")[0]
    paragraph = SOURCE_LINK.sub(r"\1", paragraph)  # a docstring's links are relative to its module, not to docs/
    return " ".join(line.strip() for line in paragraph.splitlines())


def _wrapped(text: str, indent: str = "") -> list[str]:
    """`text` as markdown lines of at most WIDTH characters (words are never cut), continued lines indented."""
    lines, line = [], ""
    for word in text.split():
        if len(line) + len(word) + 1 > WIDTH and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += word + " "
    if line.strip():
        lines.append(line.rstrip())
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# The blocks
# ---------------------------------------------------------------------------------------------------------------------
def documented_packages() -> list[str]:
    """`trl_ftis` and each of its packages (not plain modules) that declares `__all__`, in name order."""
    root = importlib.import_module(ROOT)
    names = [ROOT] + [info.name for info in pkgutil.walk_packages(root.__path__, ROOT + ".") if info.ispkg]
    return sorted(name for name in names if hasattr(importlib.import_module(name), "__all__"))


def _own_members(cls: type) -> list[tuple[str, object]]:
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") or not (callable(value) or isinstance(value, property | classmethod | staticmethod)):
            continue
        if getattr(value, "__doc__", None) is None and any(hasattr(base, name) for base in cls.__bases__):
            continue  # an override of a base class's hook (TRL's `training_step`) that adds no API of its own
        members.append((name, value))
    return sorted(members)


def _member_lines(cls: type) -> list[str]:
    lines = []
    for name, value in _own_members(cls):
        if isinstance(value, property):
            head, doc = f"`.{name}` (property)", summary(value)
        else:
            function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
            drop = not isinstance(value, staticmethod)
            head, doc = f"`{signature_text('.' + name, function, drop_self=drop)}`", summary(function)
        if "\n" in head:  # a long signature: its name only
            head = f"`.{name}(...)`"
        lines += _wrapped(f"* {head}: {doc}" if doc else f"* {head}", "  ")
    return lines


def _base_name(base: type) -> str:
    """A base class as a reader imports it: `trl.GRPOConfig`, `typing.Protocol`, or the package's own name."""
    return (
        base.__qualname__ if base.__module__.startswith(ROOT) else f"{base.__module__.split('.')[0]}.{base.__name__}"
    )


def object_reference(module: str, name: str) -> list[str]:
    """One exported name: its kind and signature in a code block, its docstring's first paragraph, its members."""
    value = getattr(importlib.import_module(module), name)
    if inspect.isclass(value):
        bases = ", ".join(
            base.__qualname__
            if base.__module__.startswith(ROOT)
            else f"{base.__module__.split('.')[0]}.{base.__name__}"
            for base in value.__bases__
            if base is not object
        )
        header = f"class {name}({bases})" if bases else f"class {name}"
        lines = ["```python", header]
        constructor = signature_text(name, value)
        if constructor.count("\n") > MAX_PARAMETERS:  # a config of TRL's: its own fields are listed elsewhere
            constructor = f"{name}(...)  # {constructor.count(chr(10)) - 1} parameters"
        if "__init__" in vars(value) or dataclasses.is_dataclass(value):
            lines.append(constructor)
        lines.append("```")
        doc = summary(value)
        lines += ([""] + _wrapped(doc)) if doc else []
        members = _member_lines(value)
        return lines + ([""] + members if members else [])
    if callable(value):
        lines = ["```python", signature_text(name, value), "```"]
        doc = summary(value)
        return lines + ([""] + _wrapped(doc) if doc else [])
    text = _value(value)
    shown = f"{name} = {text}" if len(text) <= 100 else f"{name}: {type(value).__name__} of {len(value)} entries"
    return ["```python", shown, "```"]


def reference_block() -> str:
    lines = []
    for module in documented_packages():
        names = sorted(importlib.import_module(module).__all__)
        exports = f"`{module}.__all__`: " + ", ".join(f"`{n}`" for n in names) + "."
        lines += [f"### `{module}`", "", *_wrapped(exports), ""]
        for name in names:
            lines += [f"#### `{module}.{name}`", "", *object_reference(module, name), ""]
    return "\n".join(lines)


def exports_block() -> str:
    names = sorted(importlib.import_module(ROOT).__all__)
    return (
        "\n".join(_wrapped(f"`{ROOT}.__all__`: " + ", ".join(f"`{n}`" for n in names) + "; and `__version__`.")) + "\n"
    )


def config_fields_block() -> str:
    from trl_ftis.config import FTISConfig

    fields = {field.name: field for field in dataclasses.fields(FTISConfig)}
    lines = ["| field | type | default | help |", "|---|---|---|---|"]
    for name in FTISConfig.__annotations__:  # the fields FTISConfig declares, in its order; not GRPOConfig's others
        field = fields[name]
        help_text = " ".join(field.metadata.get("help", "").split()).replace("|", "\\|")
        choices = field.metadata.get("choices")
        if choices:
            help_text += " Choices: " + ", ".join(f"`{c}`" for c in choices) + "."
        kind = _annotation(field.type).replace("|", "\\|")
        lines.append(f"| `{field.name}` | `{kind}` | `{_value(field.default)}` | {help_text} |")
    return "\n".join(lines) + "\n"


def trainer_signature_block() -> str:
    from trl_ftis.trainer import FTISTrainer

    return "```python\n" + signature_text("FTISTrainer", FTISTrainer) + "\n```\n"


def seams_block() -> str:
    from trl_ftis.trl_seams import SEAMS, TRL_VERSION

    lines = _wrapped(
        f"Written against TRL {TRL_VERSION}. For each private method, `trl_ftis.trl_seams` keeps a fingerprint of "
        "TRL's source, and a test fails, naming the method and what to re-read, when the installed TRL's differs."
    )
    for seam in SEAMS:
        how = "wraps" if seam.hook == "wrap" else "overrides"
        text = f"* `{seam.method}` (`{seam.owner}`; FTISTrainer {how} it): {seam.why}"
        if not seam.public:
            text += f" Why no public hook: {seam.narrowest}"
        lines += [""] + _wrapped(text, "  ")
    return "\n".join(lines) + "\n"


def signatures_block(spec: str) -> str:
    """The signatures (a constant: its value) of the names of `spec`, `module: name, Class.method, ...`, in one code
    block, for the guide parts that quote them. `ValueError` naming a name that no longer exists."""
    module, _, names = spec.partition(":")
    lines = []
    for name in (name.strip() for name in names.split(",")):
        try:
            value = importlib.import_module(module.strip())
            for part in name.split("."):  # `Class.method`: a method, quoted without `self`
                value = getattr(value, part)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"docs/api.md quotes {module}.{name}, which does not exist: {error}") from None
        method = "." in name
        lines.append(signature_text(name, value, drop_self=method) if callable(value) else f"{name} = {_value(value)}")
    return "```python\n" + "\n".join(lines) + "\n```\n"


SIGNATURES = "signatures of "
BLOCKS: dict[str, Callable[[], str]] = {
    "exports": exports_block,
    "FTISConfig fields": config_fields_block,
    "FTISTrainer signature": trainer_signature_block,
    "seams": seams_block,
    "reference": reference_block,
}


def regenerate(text: str) -> tuple[str, list[str]]:
    """`text` with every generated block rewritten, and the keys of the blocks that changed. `ValueError` for a key
    this script does not know, or for a known key with no block in `text`."""
    found, changed = set(), []

    def replace(match: re.Match) -> str:
        key = match["key"]
        if key.startswith(SIGNATURES):
            body = signatures_block(key.removeprefix(SIGNATURES))
        elif key in BLOCKS:
            found.add(key)
            body = BLOCKS[key]()
        else:
            raise ValueError(f"docs/api.md has a generated block {key!r} that {REGENERATE} does not know")
        body = body if body.endswith("\n") else body + "\n"
        if body != match["body"]:
            changed.append(key)
        return f"{BEGIN.format(key)}\n{body}{END.format(key)}"

    result = BLOCK.sub(replace, text)
    missing = sorted(set(BLOCKS) - found)
    if missing:
        raise ValueError(f"docs/api.md lacks the generated block(s) {missing}: add {BEGIN.format('KEY')} ... lines")
    return result, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when a block differs")
    args = parser.parse_args(argv)
    text = API_MD.read_text(encoding="utf-8")
    result, changed = regenerate(text)
    if args.check:
        if changed:
            print(f"docs/api.md: generated block(s) out of date: {', '.join(changed)}. Run: {REGENERATE}")
            return 1
        return 0
    if result != text:
        API_MD.write_text(result, encoding="utf-8")
    print(f"docs/api.md: {len(changed)} block(s) rewritten" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
