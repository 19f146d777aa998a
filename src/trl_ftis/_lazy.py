"""Module-level lazy exports: heavy submodules (TRL, transports) load on first attribute access."""

from __future__ import annotations

from importlib import import_module


def lazy_exports(package: str, exports: dict[str, str], namespace: dict):
    """`__getattr__` and `__dir__` for `package` that import `exports[name]` (a submodule) on first access."""

    def __getattr__(name):
        if name in exports:
            value = getattr(import_module(f".{exports[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
