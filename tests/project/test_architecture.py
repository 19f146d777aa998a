"""The package layout is the architecture: each room imports only the rooms below it, through their front doors, and
no module grows past one concern's size.

Rooms, bottom to top:

* the core, at the top of the package: `config`, `objective`, `trainer` and the modules they alone need (`peer_rows`,
  `own_rows`, `peer_merge`, `peer_inbox`, `micro_batches`, `step_clock`, `peer_value`, `rules`, ...);
* the exchange (`exchange/`: the wire format and the transports) and the swarm (`swarm/`: the client, the rounds
  and their exchange modes, the admission of received rows, the ledger, the checkpointed state). The core reaches
  the swarm only through `trl_ftis.swarm`'s own exports, never its modules;
* then the launcher (`launcher/`), the tasks (`tasks/`) and the demo (`demo/`). The core, the exchange and the swarm
  never import the launcher, the tasks or the demo; the tasks never import the launcher or the demo.

Each name has one import path: only a package's `__init__.py` (its front door) may list in `__all__` a name defined
in another module; any other module exports only what it defines.

Inside and across rooms: no module imports another module's private (underscore) names, and no two modules import
each other, directly or through others (function-level imports count: a cycle hidden inside a function is still one;
so do imports under `if TYPE_CHECKING:`: a cycle only a type checker follows still ties the modules together).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import (
    PACKAGE,
    PATHS,
    cycle_path,
    cycles,
    import_graph,
    imported_names,
    lazy_exports,
    module_name,
    private_uses,
    reexports,
)

UPPER_ROOMS = ("trl_ftis.launcher", "trl_ftis.tasks", "trl_ftis.demo")
FORBIDDEN = {
    "core": UPPER_ROOMS,
    "exchange": (*UPPER_ROOMS, "trl_ftis.swarm"),
    "swarm": UPPER_ROOMS,
    "tasks": ("trl_ftis.launcher", "trl_ftis.demo"),
    "launcher": ("trl_ftis.tasks", "trl_ftis.demo", "trl_ftis.trainer"),
}
SWARM = "trl_ftis.swarm"
MAX_MODULE_LINES = 800
MODULES = PATHS


def _room(module: str) -> str | None:
    for prefix in ("tasks", "launcher", "demo", "swarm", "exchange"):
        if module == f"trl_ftis.{prefix}" or module.startswith(f"trl_ftis.{prefix}."):
            return prefix
    return None if module == "trl_ftis.cli" else "core"


def _swarm_internals(names: set[str]) -> list[str]:
    """What of `names` reaches past `trl_ftis.swarm`'s exports: one of its modules, or a name it does not export."""
    exported = {f"{SWARM}.{name}" for name in lazy_exports(SWARM)}
    return sorted(name for name in names if name.startswith(SWARM + ".") and name not in exported)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_room_imports_only_rooms_below_it(path):
    room = _room(module_name(path))
    forbidden = FORBIDDEN.get(room, ())
    names = imported_names(path)
    bad = sorted(name for name in names if any(name == f or name.startswith(f + ".") for f in forbidden))
    assert not bad, f"{path.relative_to(PACKAGE)} ({room}) imports {bad}"
    if room == "core":
        inside = _swarm_internals(names)
        assert not inside, f"{path.relative_to(PACKAGE)} (core) imports the swarm's modules {inside}: use its exports"


def test_the_core_reaches_the_swarm_through_its_exports_only(monkeypatch):
    # The check itself: a core module importing a swarm module, or a name the swarm does not export, is caught.
    assert {"Swarm", "RoundRunner", "StateCheckpoints", "ExchangeMode"} <= set(lazy_exports(SWARM))
    fake, read = PACKAGE / "trainer.py", Path.read_text
    source = "from .swarm import Swarm\nfrom .swarm.rounds import RoundRunner\nfrom .swarm import _helper\n"
    monkeypatch.setattr(
        Path, "read_text", lambda self, encoding=None: source if self == fake else read(self, encoding)
    )
    assert _swarm_internals(imported_names(fake)) == [
        f"{SWARM}._helper",
        f"{SWARM}.rounds",
        f"{SWARM}.rounds.RoundRunner",
    ]


def test_importing_the_core_loads_no_upper_room():
    code = (
        "import sys\n"
        "import trl_ftis, trl_ftis.trainer, trl_ftis.config, trl_ftis.swarm.client, trl_ftis.exchange.transports\n"
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
    assert {"trl_ftis.demo", "trl_ftis.demo.tiny"} <= imported_names(fake)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_eight_hundred_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines: split it by concern"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_another_modules_private_names(path):
    bad = private_uses(path)
    assert not bad, f"{path.relative_to(PACKAGE)} imports private names {bad}: make them public, or move them"


def test_there_is_no_import_cycle_not_even_through_type_checking_imports():
    # A cycle only through `if TYPE_CHECKING:` imports never fails at run time, but it still ties the modules
    # together: neither can be read, typed or moved without the other.
    graph = import_graph()
    found = [" -> ".join(cycle_path(graph, component)) for component in cycles(graph)]
    assert not found, "import cycles between trl_ftis modules:\n" + "\n".join(found)


def test_the_cycle_and_private_name_checks_catch_what_they_look_for(monkeypatch):
    # The checks themselves: a private name imported from a sibling, one reached through an imported module, and two
    # modules importing each other inside functions, must be caught.
    trainer, swarm = PACKAGE / "trainer.py", PACKAGE / "swarm" / "client.py"
    sources = {
        trainer: "def f():\n    from .swarm.client import Swarm, _private_helper\n    from .exchange import keys\n"
        "    keys._ed25519()\n",
        swarm: "def g():\n    from .. import trainer\n",
    }
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: sources.get(self, ""))
    assert private_uses(trainer) == ["trl_ftis.swarm.client._private_helper", "trl_ftis.exchange.keys._ed25519"]
    assert ["trl_ftis.swarm.client", "trl_ftis.trainer"] in cycles(import_graph())
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]] and cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "a"]


def test_the_cycle_check_counts_imports_under_type_checking(monkeypatch):
    # The check itself: two modules that import each other, one of them only for its annotations, are a cycle of the
    # graph the check reads, though not of what runs.
    config, swarm = PACKAGE / "config.py", PACKAGE / "swarm" / "admission.py"
    sources = {
        config: "from .objective import parse_variant\n",
        swarm: "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config import FTISConfig\n",
    }
    sources[config] += "from .swarm import admission\n"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: sources.get(self, ""))
    assert ["trl_ftis.config", "trl_ftis.swarm.admission"] in cycles(import_graph())
    assert ["trl_ftis.config", "trl_ftis.swarm.admission"] not in cycles(import_graph(runtime=True))


NOT_FRONT_DOORS = [path for path in MODULES if path.name != "__init__.py"]


@pytest.mark.parametrize("path", NOT_FRONT_DOORS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_but_a_front_door_re_exports_a_name(path):
    bad = reexports(path)
    assert not bad, f"{path.relative_to(PACKAGE)} lists in __all__ names defined elsewhere {bad}: import from there"


def test_the_re_export_check_catches_what_it_looks_for(monkeypatch):
    # The check itself: a name imported from a sibling (under an alias too) and listed in `__all__` is caught; one
    # only used, a submodule listed by name, and the module's own definitions are not.
    layout = PACKAGE / "exchange" / "layout.py"
    source = (
        "from . import keys\n"
        "from .errors import REASONS, ExchangeError\n"
        "from .keys import ED25519_SIGNATURE_SIZE as SIZE\n"
        "MAGIC = b'FTIS'\n"
        "__all__ = ['MAGIC', 'REASONS', 'SIZE', 'keys']\n"
    )
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source if self == layout else "")
    assert reexports(layout) == ["trl_ftis.exchange.errors.REASONS", "trl_ftis.exchange.keys.ED25519_SIGNATURE_SIZE"]
