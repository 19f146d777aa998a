"""The exchange package is split by concern: the wire format's modules are layered in the order the package's
docstring lists them, each importing only modules listed before it, and the transports share only public helpers of
their base. (That no module anywhere uses another's private names, and that there is no import cycle, is checked
for the whole package by `tests/project/test_architecture.py`, with the same scanner: `tests/import_graph.py`.)
"""

from __future__ import annotations

import re

from import_graph import MODULES, imported_modules, private_uses

import trl_ftis.exchange


def test_the_wire_format_modules_are_layered_as_documented():
    # exchange/__init__.py lists the modules of the wire format, bottom to top: each imports only earlier ones.
    listed = re.findall(r"^\* \[`\.(\w+)`\]", trl_ftis.exchange.__doc__, flags=re.MULTILINE)
    assert listed[0] == "errors" and listed[-1] == "wire" and "transports" not in listed
    layers = [f"trl_ftis.exchange.{name}" for name in listed]
    wire_format = {name for name in MODULES if name.count(".") == 2 and name.startswith("trl_ftis.exchange.")}
    assert set(layers) == wire_format - {"trl_ftis.exchange.transports"}  # every module is listed once
    for position, module in enumerate(layers):
        inside = {name for name in imported_modules(MODULES[module]) if name.startswith("trl_ftis.exchange")}
        assert inside <= set(layers[:position]), f"{module} imports {sorted(inside - set(layers[:position]))}"


def test_the_transports_share_only_public_helpers_of_their_base():
    for name in ("memory", "directory", "redis_streams"):
        path = MODULES[f"trl_ftis.exchange.transports.{name}"]
        imported = imported_modules(path)
        assert "trl_ftis.exchange.transports.base" in imported and private_uses(path) == []
        assert "trl_ftis.exchange.wire" not in imported  # a transport carries bytes: it never decodes them
