"""The package layout is the architecture: each room imports only the rooms below it, and no module grows past one
concern's size.

Rooms, bottom to top: the core (`objective`, `config`, `trainer` and the objects it composes: `ledger`, `admission`,
`scoring`, `rounds`, `checkpoint`; `peer_rows`, `generator_logps`, `rules`) and the swarm (`swarm`, `exchange/`),
then the launcher (`launcher/`), the tasks (`tasks/`) and the demo (`demo/`). The core and the swarm never import the
launcher, the tasks or the demo; the tasks never import the launcher or the demo.

Inside and across rooms: no module imports another module's private (underscore) names, and no two modules import
each other, directly or through others (function-level imports count: a cycle hidden inside a function is still one).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trl_ftis"
UPPER_ROOMS = ("trl_ftis.launcher", "trl_ftis.tasks", "trl_ftis.demo")
FORBIDDEN = {
    "core and swarm": UPPER_ROOMS,
    "tasks": ("trl_ftis.launcher", "trl_ftis.demo"),
    "launcher": ("trl_ftis.tasks", "trl_ftis.demo", "trl_ftis.trainer"),
}
MAX_MODULE_LINES = 1000


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str | None:
    for prefix, room in (("trl_ftis.tasks", "tasks"), ("trl_ftis.launcher", "launcher"), ("trl_ftis.demo", "demo")):
        if module == prefix or module.startswith(prefix + "."):
            return room
    return None if module == "trl_ftis.cli" else "core and swarm"


def _from_imports(path: Path):
    """`(target module, imported names)` of every `from ... import ...` in `path` that names a trl_ftis module,
    anywhere in it (function-level imports included), with relative targets made absolute."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "trl_ftis" or target.startswith("trl_ftis."):
                yield target, [alias.name for alias in node.names]


def _imports(path: Path) -> set[str]:
    """Every trl_ftis module `path` imports, anywhere in it (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    for target, names in _from_imports(path):
        found.add(target)
        found.update(f"{target}.{name}" for name in names)  # `from . import demo`
    return {name for name in found if name == "trl_ftis" or name.startswith("trl_ftis.")}


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_room_imports_only_rooms_below_it(path):
    room = _room(_module_name(path))
    forbidden = FORBIDDEN.get(room, ())
    bad = sorted(name for name in _imports(path) if any(name == f or name.startswith(f + ".") for f in forbidden))
    assert not bad, f"{path.relative_to(PACKAGE)} ({room}) imports {bad}"


def test_importing_the_core_loads_no_upper_room():
    code = (
        "import sys\n"
        "import trl_ftis, trl_ftis.trainer, trl_ftis.config, trl_ftis.swarm, trl_ftis.exchange.transports\n"
        "from trl_ftis import FTISConfig, FTISTrainer, PeerRow, ftis_loss\n"
        f"print(sorted(m for m in sys.modules if m.startswith({UPPER_ROOMS!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_import_scanner_sees_relative_and_function_level_imports(tmp_path, monkeypatch):
    # The scanner itself: a core module that imports the demo inside a function must be caught.
    fake = PACKAGE / "trainer.py"
    source = "def f():\n    from .demo import tiny\n"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source if self == fake else "")
    assert {"trl_ftis.demo", "trl_ftis.demo.tiny"} <= _imports(fake)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_a_thousand_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines: split it by concern"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(path: Path) -> list[str]:
    """`module.name` for each private name `path` imports from another trl_ftis module (a submodule imported by
    name, `from . import _lazy`, is a module of its own package, not a private name of another module)."""
    modules = {_module_name(p) for p in MODULES}
    own = _module_name(path)
    found = []
    for target, names in _from_imports(path):
        for name in names:
            if _is_private(name) and f"{target}.{name}" not in modules and target != own:
                found.append(f"{target}.{name}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_modules_private_names(path):
    bad = _private_imports(path)
    assert not bad, f"{path.relative_to(PACKAGE)} imports private names {bad}: make them public, or move them"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the trl_ftis modules it imports. `from trl_ftis.x import y` is an edge to module `x.y` when `y` is a
    submodule (importing it runs `x.y`, not more of `x`), else to module `x`."""
    modules = {_module_name(p): p for p in MODULES}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        for target, names in _from_imports(path):
            edges.update(f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names)
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_there_is_no_import_cycle():
    assert _cycles(_import_graph()) == []


def test_the_cycle_and_private_name_checks_catch_what_they_look_for(monkeypatch):
    # The checks themselves: a private name imported from a sibling, and two modules importing each other inside
    # functions, must be caught.
    trainer, swarm = PACKAGE / "trainer.py", PACKAGE / "swarm.py"
    sources = {
        trainer: "def f():\n    from .swarm import Swarm, _private_helper\n",
        swarm: "def g():\n    from . import trainer\n",
    }
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: sources.get(self, ""))
    assert _private_imports(trainer) == ["trl_ftis.swarm._private_helper"]
    assert ["trl_ftis.swarm", "trl_ftis.trainer"] in _cycles(_import_graph())
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
