"""What the launcher checks before any peer starts, beyond the shape of the config: what a peer script accepts, local
model folders, an exchange server the launcher did not start, and the secrets written in the config.

* `script_options(path)`: the `--key` options a peer script accepts, read from its source without running it: the
  dataclasses it hands to `HfArgumentParser` / `TrlParser` (its own, read from its source, and those it imports from
  trl, transformers or trl_ftis, imported). `None` when they cannot be known: then nothing is checked (the schema
  checks the `args` keys against it, `schema.load_swarm_config`).
* local model folders: `trl_ftis.model_paths.local_model_problem`, which `commands.check_files` and the example scripts
  call.
* `before_start(config, is_secret)`: what `driver.run_swarm` says before anything starts: the problems that stop the
  swarm (an exchange server that does not answer, asked through its transport's probe) and the warnings printed
  once (secrets written in the config, `expected_peers` names no peer of the config runs).

Pure functions apart from the file, network and import look-ups they are named after; `config` is a
`swarm_config.SwarmConfig` (not imported: the schema imports this module).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exchange.transports.registry import transport_kind
from ..redaction import redact_text, redact_url
from ..shared_names import REDIS_PASSWORD_ENV, SWARM_SECRET_ENV
from .validation import did_you_mean

__all__ = [
    "ARGUMENT_PARSERS",
    "credential_problems",
    "PROBE_TIMEOUT",
    "ScriptOptions",
    "before_start",
    "expected_peer_problems",
    "render_args",
    "render_value",
    "script_options",
    "secret_warnings",
]

# The parsers whose options are the fields of the dataclasses they are given (`--name`, `--name-with-dashes`,
# `--no_name` for a true boolean, a field's `aliases`). TrlParser also reads `--config FILE`.
ARGUMENT_PARSERS = {"HfArgumentParser": (), "TrlParser": ("config",)}
# Packages whose argument dataclasses are imported to read their fields: installed with trl-ftis, and importing them
# runs no code of the user's. A dataclass from anywhere else leaves the script's options unknown.
_KNOWN_PACKAGES = ("trl", "transformers", "trl_ftis")
# Keywords of the parse call that let unknown options through: the script's options are then not all it accepts.
_LENIENT_KEYWORDS = {"return_remaining_strings": True, "fail_with_unknown_args": False}
PROBE_TIMEOUT = 3.0  # seconds: an exchange server that is up answers in milliseconds, one that is not fails in seconds


# --------------------------------------------------------------------------------------------------------------------
# What a peer script accepts
# --------------------------------------------------------------------------------------------------------------------


def render_value(value: Any) -> str:
    """One value as it goes on a command line or into an environment variable."""
    if isinstance(value, bool):
        return "true" if value else "false"  # what HfArgumentParser's string_to_bool accepts
    return str(value)


def render_args(args: Mapping[str, Any]) -> list[str]:
    """`{"lr": 0.1, "use_peft": True, "report_to": ["wandb", "none"], "x": None}` ->
    `["--lr", "0.1", "--use_peft", "true", "--report_to", "wandb", "none"]` (None is omitted)."""
    out: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        out.append(f"--{key}")
        if isinstance(value, (list, tuple)):
            out.extend(render_value(v) for v in value)
        else:
            out.append(render_value(value))
    return out


class _ParseError(Exception):
    """What argparse would print before exiting."""


class _CheckingParser(argparse.ArgumentParser):
    """Raises instead of printing the usage and exiting."""

    def error(self, message: str):
        raise _ParseError(message)


@dataclass(frozen=True)
class ScriptOptions:
    """The options of a peer script: `names` (every spelling argparse accepts), `fields` (the dataclass fields, for
    did-you-mean), `classes` (the dataclasses they come from, for messages) and `types` (those of them that are
    imported, not the script's own: their values are checked too)."""

    names: frozenset[str]
    fields: tuple[str, ...]
    classes: tuple[str, ...]
    types: tuple[type, ...] = ()

    def accepts(self, key: str) -> bool:
        return key in self.names

    def suggestion(self, key: str) -> str | None:
        return did_you_mean(key, self.fields)

    def value_problem(self, key: str, value: Any) -> str | None:
        """Why the peer script would refuse `--key value` as it is rendered on its command line (an invalid choice,
        a value of the wrong type: argparse's own words, without its usage text), or None. Only the fields of the
        imported dataclasses are checked; the script's own fields are not."""
        parser = _value_parser(self.types)
        if parser is None or value is None or f"--{key}" not in parser._option_string_actions:
            return None  # the script's own field (or not an option): not checked here
        try:
            parser.parse_known_args(render_args({key: value}))
        except (_ParseError, argparse.ArgumentError) as error:
            text = str(error)  # "argument --name/--name-dashed: invalid choice: ..." -> what follows the name
            return text.split(": ", 1)[1] if text.startswith("argument ") and ": " in text else text
        return None


@functools.lru_cache(maxsize=16)
def _value_parser(types: tuple[type, ...]) -> argparse.ArgumentParser | None:
    """The parser the script builds (`HfArgumentParser(types)`), raising instead of exiting; no argument required
    (only values are checked here). None when it cannot be built."""
    if not types:
        return None
    try:
        from transformers import HfArgumentParser

        class Checking(_CheckingParser, HfArgumentParser):
            pass

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parser = Checking(types, exit_on_error=False, allow_abbrev=False)
    except Exception:  # noqa: BLE001 - a dataclass HfArgumentParser cannot take: values stay unchecked
        return None
    for action in parser._actions:
        action.required = False
    return parser


class _Unknown(Exception):
    """The script's options cannot be known (a dataclass from elsewhere, a parser call this module does not read)."""


def _is_dataclass_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass"
    )


def _annotation_text(node: ast.expr) -> str:
    # A quoted annotation ("ClassVar[int]") reads as its text.
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ast.unparse(node)


def _field_aliases(value: ast.expr | None) -> list[str]:
    """The `--` aliases of `field(metadata={"aliases": [...]})`, which HfArgumentParser accepts too."""
    keywords = value.keywords if isinstance(value, ast.Call) else []
    metadata = next((k.value for k in keywords if k.arg == "metadata"), None)
    if not isinstance(metadata, ast.Dict):
        return []
    for key, item in zip(metadata.keys, metadata.values):
        if isinstance(key, ast.Constant) and key.value == "aliases":
            try:
                aliases = ast.literal_eval(item)
            except ValueError:
                raise _Unknown from None  # computed aliases: what they are is not in the source
            aliases = [aliases] if isinstance(aliases, str) else list(aliases)
            return [a.lstrip("-") for a in aliases if isinstance(a, str) and a.startswith("--")]
    return []


def _local_fields(node: ast.ClassDef) -> list[tuple[str, bool, list[str]]]:
    """(name, may have a --no_ form, aliases) of each init field a dataclass declares in its body (the ones argparse
    sees)."""
    found = []
    for item in node.body:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
            continue
        annotation = _annotation_text(item.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")):
            continue
        value = item.value
        if isinstance(value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords
        ):
            continue  # field(init=False): not an option
        found.append((item.target.id, "bool" in annotation, _field_aliases(value)))
    return found


def _imported_fields(cls: Any) -> list[tuple[str, bool, list[str]]]:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise _Unknown
    found = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        aliases = f.metadata.get("aliases") or []
        aliases = [aliases] if isinstance(aliases, str) else list(aliases)
        found.append((f.name, f.default is True, [a.lstrip("-") for a in aliases if a.startswith("--")]))
    return found


class _Module:
    """The names a script binds at its top level: its classes and what it imports."""

    def __init__(self, tree: ast.Module):
        self.classes: dict[str, ast.ClassDef] = {}
        self.imported: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute or None for a module)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    # `import a.b` binds `a`; `import a.b as c` binds `c` to `a.b`.
                    bound = alias.asname or alias.name.split(".")[0]
                    self.imported[bound] = (alias.name if alias.asname else bound, None)

    def resolve(self, node: ast.expr) -> Any:
        """The imported object `node` names (`FTISConfig`, `trl.ModelConfig`), or the script's own ClassDef."""
        if isinstance(node, ast.Name):
            if node.id in self.classes:
                return self.classes[node.id]
            if node.id in self.imported:
                module, attribute = self.imported[node.id]
                found = _import(module)
                return found if attribute is None else _attribute(found, attribute)
        if isinstance(node, ast.Attribute):
            return _attribute(self.resolve(node.value), node.attr)
        raise _Unknown

    def fields_of(self, node: ast.expr, seen: frozenset[str] = frozenset()) -> list[tuple[str, bool, list[str]]]:
        target = self.resolve(node)
        if not isinstance(target, ast.ClassDef):
            return _imported_fields(target)
        if target.name in seen or not any(_is_dataclass_decorator(d) for d in target.decorator_list):
            raise _Unknown
        found: list[tuple[str, bool, list[str]]] = []
        for base in target.bases:
            if not (isinstance(base, ast.Name) and base.id == "object"):
                found += self.fields_of(base, seen | {target.name})
        return found + _local_fields(target)


def _import(module: str) -> Any:
    if module.split(".")[0] not in _KNOWN_PACKAGES:
        raise _Unknown
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the libraries' import-time notices are not the launcher's to show
            return importlib.import_module(module)
    except Exception:  # noqa: BLE001 - not installed here, or broken: the options stay unknown
        raise _Unknown from None


def _attribute(owner: Any, name: str) -> Any:
    if isinstance(owner, ast.ClassDef):
        raise _Unknown
    try:
        return getattr(owner, name)
    except Exception:  # noqa: BLE001 - a lazy module that fails to load the name
        raise _Unknown from None


def _parser_call(tree: ast.Module) -> tuple[str, list[ast.expr]]:
    """The one argument parser the script builds, and the dataclasses it is given."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _call_name(node) in ARGUMENT_PARSERS]
    if len(calls) != 1:
        raise _Unknown  # none (argparse, say), or several: which one parses the command line is not known
    call = calls[0]
    given = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataclass_types"), None)
    if isinstance(given, (ast.Tuple, ast.List)) and given.elts:
        return _call_name(call), list(given.elts)
    if isinstance(given, (ast.Name, ast.Attribute)):
        return _call_name(call), [given]
    raise _Unknown


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _lenient(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Call)
        and any(
            k.arg in _LENIENT_KEYWORDS
            and isinstance(k.value, ast.Constant)
            and k.value.value == _LENIENT_KEYWORDS[k.arg]
            for k in node.keywords
        )
        for node in ast.walk(tree)
    )


@functools.lru_cache(maxsize=64)
def _options_of(path: str, mtime_ns: int, size: int) -> ScriptOptions | None:
    del mtime_ns, size  # the cache key: an edited script is read again
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # `commands.check_files` reports a script that is missing; the rest is the script's own business
    try:
        if _lenient(tree):
            raise _Unknown
        module = _Module(tree)
        parser, given = _parser_call(tree)
        fields: list[tuple[str, bool, list[str]]] = []
        types: list[type] = []
        for node in given:
            fields += module.fields_of(node)
            target = module.resolve(node)
            if isinstance(target, type):
                types.append(target)
    except _Unknown:
        return None
    names = set(ARGUMENT_PARSERS[parser])
    for name, maybe_bool, aliases in fields:
        names.update({name, name.replace("_", "-"), *aliases})
        if maybe_bool:
            names.update({f"no_{name}", f"no-{name.replace('_', '-')}"})
    ordered = tuple(dict.fromkeys(name for name, _, _ in fields))
    return ScriptOptions(frozenset(names), ordered, tuple(_annotation_text(node) for node in given), tuple(types))


def script_options(path: str | os.PathLike) -> ScriptOptions | None:
    """The options the peer script at `path` accepts, or `None` when they cannot be known (see the module docstring).

    Read from the script's source, which is not run; the dataclasses it imports from trl, transformers or trl_ftis
    are imported (trl_ftis's `FTISConfig` imports torch: a few seconds, once per process)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _options_of(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


# --------------------------------------------------------------------------------------------------------------------
# Local models, expected peers
# --------------------------------------------------------------------------------------------------------------------


def expected_peer_problems(expected: Any, peer_ids: Iterable[str]) -> list[str]:
    """One message per name of `expected` (an `expected_peers` value) that is none of `peer_ids`."""
    names = [expected] if isinstance(expected, str) else expected if isinstance(expected, (list, tuple)) else []
    ids = list(peer_ids)
    found = []
    for name in names:
        if name in ids:
            continue
        hint = did_you_mean(name, ids)
        suggestion = f"; did you mean {hint!r}?" if hint else ""
        found.append(f"names {name!r}, which is no peer of this config (peers: {', '.join(ids)}){suggestion}")
    return found


# --------------------------------------------------------------------------------------------------------------------
# Before start
# --------------------------------------------------------------------------------------------------------------------


def _peers_text(ids: list[str], every: int) -> str:
    return "every peer" if len(ids) == every else "peer" + ("s " if len(ids) > 1 else " ") + ", ".join(map(repr, ids))


def _secret_hint(name: str, where: str, passed_as: dict[str, str]) -> str:
    if where == "args" and name in passed_as:  # the launcher hands it over by environment, never as an argument
        variable = passed_as[name]
        return (
            f"the peers get it as {variable}, never on their command lines; export {variable} in your shell instead "
            "(every peer inherits the launcher's environment)"
        )
    if name.lower() == "swarm_secret" or name == SWARM_SECRET_ENV:
        return (
            f"export {SWARM_SECRET_ENV} in your shell instead (every peer inherits the launcher's environment)"
        )
    if where == "args":
        return (
            "it is on the peers' command lines, which others on the machine can read (`ps`): pass it through the "
            "environment or a file only you can read instead"
        )
    return "export it in your shell instead (every peer inherits the launcher's environment)"


def credential_problems(config: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """The swarm peers (controls aside) that would refuse each other's messages, said before anything starts: a swarm
    secret (`args.swarm_secret`, `env.FTIS_SWARM_SECRET`, else the launcher's own environment, which every peer
    inherits) given to some peers and not others, or different secrets; per-peer keys (`private_key_file`,
    `peer_keys_file`) set on some peers only, or different public-key files. Values are never shown."""
    environ = os.environ if environ is None else environ
    peers = [peer for peer in config.peers if getattr(peer, "control_of", None) is None]
    if len(peers) < 2:
        return []
    found = []

    def secret(peer) -> str | None:
        value = peer.args.get("swarm_secret")
        if value is None:
            value = peer.env.get(SWARM_SECRET_ENV, environ.get(SWARM_SECRET_ENV))
        return str(value) if value else None

    secrets_of = {peer.id: secret(peer) for peer in peers}
    with_secret = [peer for peer, value in secrets_of.items() if value is not None]
    if with_secret and len(with_secret) < len(peers):
        without = [peer for peer in secrets_of if secrets_of[peer] is None]
        found.append(
            f"a swarm secret is given to {', '.join(with_secret)} but not to {', '.join(without)}: the peers with one "
            "refuse every message of the others (unsigned) and the others cannot check theirs; give every peer the "
            f"same secret (export {SWARM_SECRET_ENV} in the shell that runs the launcher)"
        )
    elif len(set(value for value in secrets_of.values() if value is not None)) > 1:
        found.append(
            "the peers are given different swarm secrets (values not shown): each refuses the others' messages "
            "(signature); give every peer the same one"
        )
    for key in ("private_key_file", "peer_keys_file"):
        given = {peer.id: peer.args.get(key) for peer in peers}
        having = [peer for peer, value in given.items() if value]
        if having and len(having) < len(peers):
            missing = [peer for peer, value in given.items() if not value]
            found.append(
                f"`args.{key}` is set for {', '.join(having)} but not for {', '.join(missing)}: with per-peer keys "
                "every peer needs its own key and the same public-key file, or the others refuse its messages"
            )
    files = {os.path.abspath(str(peer.args["peer_keys_file"])) for peer in peers if peer.args.get("peer_keys_file")}
    if len(files) > 1:
        found.append(
            f"the peers are given different public-key files ({', '.join(sorted(files))}): give them all one file"
        )
    return found


def secret_warnings(
    config: Any, is_secret: Callable[[str], bool], passed_as: dict[str, str] | None = None
) -> list[str]:
    """One warning per secret written in the config (an `args` or `env` key named like a secret, a password in a URL):
    whoever can read the file can read it. The launcher never shows it (`commands.redact_argv`), but it is better
    kept out of the file. `passed_as`: the secret `args` the launcher hands to the peers as environment variables
    (`commands.SECRET_ARGS`), named in the hint."""
    passed_as = passed_as or {}
    source = f" ({config.source})" if config.source else ""
    holders: dict[tuple[str, str], list[str]] = {}
    for peer in config.peers:
        for where, section in (("args", peer.args), ("env", peer.env)):
            for name, value in section.items():
                in_url = any(isinstance(v, str) and redact_text(v) != v for v in _values(value))
                if is_secret(name) or in_url:
                    holders.setdefault((where, name), []).append(peer.id)
    lines = []
    for (where, name), ids in holders.items():
        whose = _peers_text(ids, len(config.peers))
        lines.append(
            f"`{where}.{name}` holds a secret written in the config{source}, for {whose}; "
            f"{_secret_hint(name, where, passed_as)}"
        )
    if redact_url(config.exchange_url) != config.exchange_url:
        lines.append(
            f"`exchange_url` holds a password written in the config{source}; leave it out of the URL and export "
            f"{REDIS_PASSWORD_ENV} in your shell instead (the peers' Redis transport reads it)"
        )
    return lines


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _uses_exchange(config: Any) -> bool:
    """Whether some peer's script is known to take `--exchange_url` (an FTISConfig script connects at start)."""
    for script in dict.fromkeys(peer.script for peer in config.peers):
        options = script_options(script)
        if options is not None and options.accepts("exchange_url"):
            return True
    return False


def before_start(
    config: Any, is_secret: Callable[[str], bool], passed_as: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of `config` that `driver.run_swarm` reports before anything starts.

    Problems: an exchange the launcher did not start whose transport has a probe (`TransportKind.probe`: a
    `redis://` server, say) and that does not answer within `PROBE_TIMEOUT` seconds, when a peer's script is known
    to connect to it (its options include `exchange_url`); for scripts whose options are not known it is a warning.
    Warnings: the secrets written in the config (`secret_warnings`), and `expected_peers` names that no peer of the
    config has (refused by the schema when the exchange is the launcher's own; with an external exchange a peer
    started elsewhere may join)."""
    problems: list[str] = credential_problems(config)
    found = secret_warnings(config, is_secret, passed_as)
    probe = transport_kind(config.exchange_url).probe
    if not getattr(config, "exchange_started", False) and probe is not None:
        problem = probe(config.exchange_url, PROBE_TIMEOUT)
        if problem is not None and _uses_exchange(config):
            problems.append(problem)
        elif problem is not None:
            found.append(f"{problem} (the peers' scripts are not known to use it: starting anyway)")
    ids = [peer.id for peer in config.peers] + list(getattr(config, "not_started", ()))  # --only: still peers
    said: set[str] = set()
    for peer in config.peers:
        for message in expected_peer_problems(peer.args.get("expected_peers"), ids):
            if message not in said:
                said.add(message)
                found.append(f"`args.expected_peers` {message}; a round waits for it up to `peer_timeout` each time")
    return problems, found
