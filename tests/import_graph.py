"""The package's import graph, read from the source (never by importing it), for the architecture tests
(`tests/project/test_architecture.py`, `tests/exchange/test_modules.py`): which trl_ftis modules each module imports,
anywhere in it (function-level imports and those under `if TYPE_CHECKING:` included), and which private names of other
modules it uses."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trl_ftis"
PATHS = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PATHS}
"""Module name -> its file."""


def _is_ours(name: str) -> bool:
    return name == "trl_ftis" or name.startswith("trl_ftis.")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"))


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside `if TYPE_CHECKING:` blocks: imports there never run."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(inner) for child in node.body for inner in ast.walk(child))
    return found


def from_imports(path: Path, runtime: bool = False) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """`(target module, [(name, alias), ...])` of every `from ... import ...` in `path` that names a trl_ftis module,
    with relative targets made absolute; `runtime=True` leaves out those under `if TYPE_CHECKING:`."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = _tree(path)
    skipped = _type_checking_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in skipped:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if _is_ours(target):
                yield target, [(alias.name, alias.asname) for alias in node.names]


def plain_imports(path: Path) -> list[tuple[str, str | None]]:
    """`(module, alias)` of every `import trl_ftis...` in `path`."""
    return [
        (alias.name, alias.asname)
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Import)
        for alias in node.names
        if _is_ours(alias.name)
    ]


def imported_names(path: Path) -> set[str]:
    """Every trl_ftis module and `module.name` that `path` imports (what the room checks compare with prefixes)."""
    found = {name for name, _ in plain_imports(path)}
    for target, names in from_imports(path):
        found.add(target)
        found.update(f"{target}.{name}" for name, _ in names)  # `from . import demo`
    return found


def lazy_exports(package: str) -> dict[str, str]:
    """A package's lazily exported names (its `_LAZY = {name: submodule}` literal, `trl_ftis._lazy`), as
    `{name: module}`; empty for a package without one."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            try:
                return {name: f"{package}.{sub}" for name, sub in ast.literal_eval(node.value).items()}
            except ValueError:
                return {}
    return {}


def imported_modules(path: Path, runtime: bool = True) -> set[str]:
    """The trl_ftis modules `path` imports: `from trl_ftis.x import y` is module `x.y` when `y` is a submodule
    (importing it runs `x.y`, not more of `x`), module `x` and the submodule `x` loads `y` from when `x` exports `y`
    lazily, else module `x`. With `runtime` (what runs), imports under `if TYPE_CHECKING:` are left out; without it
    they count: a type checker follows them, and a cycle through them is a cycle of what each module needs to be
    understood."""
    found = {name for name, _ in plain_imports(path)}
    for target, names in from_imports(path, runtime=runtime):
        lazy = lazy_exports(target)
        for name, _ in names:
            if f"{target}.{name}" in MODULES:
                found.add(f"{target}.{name}")
            else:
                found.update({target, lazy.get(name, target)})
    return {name for name in found if name in MODULES and name != module_name(path)}


def import_graph(runtime: bool = False) -> dict[str, set[str]]:
    """Module -> the trl_ftis modules it imports ([`imported_modules`]): all of them, those under
    `if TYPE_CHECKING:` included, unless `runtime`."""
    return {name: imported_modules(path, runtime=runtime) for name, path in MODULES.items()}


def private_uses(path: Path) -> list[str]:
    """Each private name of another trl_ftis module that `path` uses: imported by name
    (`from .checks import _fail`) or reached through a module it imported (`keys._ed25519()`). A submodule imported
    by name (`from . import _lazy`) is a module of its own package, not a private name of another module."""
    own = module_name(path)
    found, aliases = [], {}
    for target, names in from_imports(path):
        for name, alias in names:
            if f"{target}.{name}" in MODULES:
                aliases[alias or name] = f"{target}.{name}"
            elif is_private(name) and target != own:
                found.append(f"{target}.{name}")
    for name, alias in plain_imports(path):
        if alias:
            aliases[alias] = name
    for node in ast.walk(_tree(path)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and is_private(node.attr)
        ):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def all_names(path: Path) -> set[str]:
    """The names `path` lists in its `__all__` literal (none without one)."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return set()
    return set()


def reexports(path: Path) -> list[str]:
    """Each name `path` lists in `__all__` but imports from another trl_ftis module, as `target.name`: a second
    import path for a name defined elsewhere. A submodule imported by name is not one (it is the module itself)."""
    exported = all_names(path)
    return sorted(
        f"{target}.{name}"
        for target, names in from_imports(path)
        for name, alias in names
        if (alias or name) in exported and f"{target}.{name}" not in MODULES
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One import chain around `component` (a strongly connected component of `graph`), starting and ending at its
    first module: the shortest way back to it through the component, so that a failure names the imports to cut."""
    start, inside = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph.get(node, ())):
                if other == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(previous[chain[-1]])
                    return [start, *reversed(chain[:-1]), start] if node != start else [start, start]
                if other in inside and other not in previous:
                    previous[other] = node
                    following.append(other)
        frontier = following
    return component
