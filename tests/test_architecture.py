"""The package layout is the architecture: each room imports only the rooms below it, and no module grows past one
concern's size.

Rooms, bottom to top: the core (`objective`, `config`, `trainer`, `generation`, `peer_rows`, `rules`) and the swarm
(`swarm`, `exchange/`), then the launcher (`launcher/`), the tasks (`tasks/`) and the demo (`demo/`). The core and the
swarm never import the launcher, the tasks or the demo; the tasks never import the launcher or the demo.
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


def _imports(path: Path) -> set[str]:
    """Every trl_ftis module `path` imports, anywhere in it (function-level imports included)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import demo`
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
