"""The exchange package (and the swarm, the config and the rules above and beside it) is split by concern: no module
imports another module's private (underscore) names or reaches them through a module it imported, no import cycle
remains (function-level imports count), and the wire format's modules are layered in the order the package's
docstring lists them, each importing only modules listed before it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import trl_ftis.exchange

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "trl_ftis"
MODULES = {}
for _path in sorted(PACKAGE.rglob("*.py")):
    _parts = list(_path.relative_to(PACKAGE.parent).with_suffix("").parts)
    MODULES[".".join(_parts[:-1] if _parts[-1] == "__init__" else _parts)] = _path
OURS = sorted(
    name
    for name in MODULES
    if name.startswith("trl_ftis.exchange") or name in ("trl_ftis.swarm", "trl_ftis.config", "trl_ftis.rules")
)


def _scan(module: str) -> tuple[set[str], list[str]]:
    """The trl_ftis modules `module` imports (anywhere in it), and its uses of other modules' private names."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported, private, aliases = set(), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("trl_ftis"):
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in MODULES:  # `from . import keys`: a module
                    imported.add(full)
                    aliases[alias.asname or alias.name] = full
                else:
                    imported.add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"from {target} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trl_ftis"):
                    imported.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
    for node in ast.walk(tree):  # keys._ed25519(): a private name reached through an imported module
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            private.append(f"{aliases[node.value.id]}.{node.attr}")
    return {name for name in imported if name in MODULES and name != module}, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("module", OURS)
def test_no_module_uses_another_modules_private_names(module):
    _, private = _scan(module)
    assert private == [], f"{module} uses private names of other modules: {private}"


def test_no_import_cycle_in_the_package():
    edges = {module: _scan(module)[0] for module in MODULES}
    cycles = [cycle for cycle in _cycles(edges) if any(module in OURS for module in cycle)]
    assert cycles == []


def test_the_scanner_sees_private_imports_and_cycles(monkeypatch):
    # The scanner itself, on made-up sources: a function-level private import, a private attribute of an imported
    # module, and a two-module cycle through function-level imports.
    fake = {
        "trl_ftis.exchange.wire": "def f():\n    from .checks import _hidden\n    from . import keys\n    keys._x()\n",
        "trl_ftis.exchange.checks": "def g():\n    from .wire import encode_message\n",
    }
    original = Path.read_text
    monkeypatch.setattr(
        Path,
        "read_text",
        lambda self, encoding=None: next(
            (src for name, src in fake.items() if MODULES[name] == self), None
        ) or original(self, encoding=encoding),
    )
    imported, private = _scan("trl_ftis.exchange.wire")
    assert private == ["from trl_ftis.exchange.checks import _hidden", "trl_ftis.exchange.keys._x"]
    assert {"trl_ftis.exchange.checks", "trl_ftis.exchange.keys"} <= imported
    edges = {name: _scan(name)[0] for name in fake}
    assert _cycles(edges) == [["trl_ftis.exchange.checks", "trl_ftis.exchange.wire"]]


def test_the_wire_format_modules_are_layered_as_documented():
    # exchange/__init__.py lists the modules of the wire format, bottom to top: each imports only earlier ones.
    listed = re.findall(r"^\* \[`\.(\w+)`\]", trl_ftis.exchange.__doc__, flags=re.MULTILINE)
    assert listed[0] == "errors" and listed[-1] == "wire" and "transports" not in listed
    layers = [f"trl_ftis.exchange.{name}" for name in listed]
    wire_format = {name for name in MODULES if name.count(".") == 2 and name.startswith("trl_ftis.exchange.")}
    assert set(layers) == wire_format - {"trl_ftis.exchange.transports"}  # every module is listed once
    for position, module in enumerate(layers):
        inside = {name for name in _scan(module)[0] if name.startswith("trl_ftis.exchange")}
        assert inside <= set(layers[:position]), f"{module} imports {sorted(inside - set(layers[:position]))}"


def test_the_transports_share_only_public_helpers_of_their_base():
    for name in ("memory", "directory", "redis_streams"):
        imported, private = _scan(f"trl_ftis.exchange.transports.{name}")
        assert "trl_ftis.exchange.transports.base" in imported and private == []
        assert "trl_ftis.exchange.wire" not in imported  # a transport carries bytes: it never decodes them
