"""The launcher's backends by name: what each one adds to the swarm config and the command line (`BackendKind`), and
the one place the rest of the launcher asks about them.

A backend is the place that runs a swarm's peers: `local` (this machine) and `slurm` (one SLURM job each) are built
in. Each declares, in its own package, a `BackendKind`: its name (`launcher: <name>` at the top level of a config, or
its command-line flag), its own sections of the config (pydantic models, with their validators), the keys of the
core schema it refuses, how its sections resolve into the validated config, its placement rules, what `--only` and
`--resume` need, and the `Backend` (`launcher.backend`) that runs the peers. It registers itself with
`register_backend(kind)`; the built-in ones are imported on the first question (`BUILT_IN`). The schema, the
placement checks, the restarts, the driver and the command line ask this registry: none of them names a backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

__all__ = [
    "BUILT_IN",
    "DEFAULT_BACKEND",
    "BackendKind",
    "backend_kind",
    "backend_names",
    "register_backend",
    "unregister_backend",
]

DEFAULT_BACKEND = "local"
"""The backend of a config that names none: its peers are processes on this machine."""
BUILT_IN = ("trl_ftis.launcher.local", "trl_ftis.launcher.slurm.kind")
"""The modules that register the built-in backends (imported on the registry's first question)."""


class BackendKind(Protocol):
    """What a backend declares to the launcher. A backend subclasses it (the defaults below are a backend with no
    keys of its own) and registers an instance with `register_backend`.

    `config` below is a `swarm_config.SwarmConfig`, `peers` its `swarm_config.PeerConfig`s, `spec` the validated top
    level (`schema.SwarmSpec`, the backend's sections as attributes) and `peer_spec` one validated `peers` entry.
    """

    name: ClassVar[str]
    """`launcher: <name>` at the top level of a config selects it (and `SwarmConfig.scheduler` is then `name`)."""
    where: ClassVar[str] = ""
    """Where it runs the peers, for messages: `"on SLURM"` in "`slurm` is only used on SLURM"."""
    cli_flag: ClassVar[str | None] = None
    """A flag of `trl-ftis swarm` that selects it whatever the config says (`--slurm`); None for none."""
    cli_help: ClassVar[str] = ""
    runs_here: ClassVar[bool] = False
    """Whether the peers run on this machine: `gpus` then names its devices, and the packages a peer needs are
    checked here before start."""
    top_sections: ClassVar[Mapping[str, Any]] = {}
    """Top-level keys of its own: key -> the pydantic annotation of its value (None when absent)."""
    peer_sections: ClassVar[Mapping[str, Any]] = {}
    """Keys of its own in each `peers` entry, the same way."""
    refused_peer_keys: ClassVar[Mapping[str, str]] = {}
    """Keys of every peer that mean nothing with this backend, and why (`gpus` on SLURM)."""

    def top_validators(self) -> dict[str, Any]:
        """pydantic validators (`field_validator` class methods, by name) added to the top level's model."""
        return {}

    def peer_validators(self) -> dict[str, Any]:
        """pydantic validators added to a peer's model."""
        return {}

    def context(self, raw: Mapping) -> dict:
        """What its validators need of the raw top-level mapping (read before validation: `TopLevel.backend`)."""
        return {}

    def resolve(self, spec: Any) -> tuple[str | None, dict, bool]:
        """(the exchange URL it gives the peers, or None for the config's own or the default; its resolved top-level
        sections, `SwarmConfig.sections`; whether it starts that exchange itself, `SwarmConfig.exchange_started`)."""
        return None, {}, False

    def peer_resolve(self, spec: Any, peer_spec: Any) -> dict:
        """One peer's resolved sections (`PeerConfig.sections`), its own over the top level's."""
        return {}

    def placement_problems(self, peers: Sequence[Any]) -> list[str]:
        """Its own placement mistakes of the peers (controls included), one line each; `placement.py` adds the
        checks every backend shares (and, when `runs_here`, those of this machine's GPUs)."""
        return []

    def restart_argv(self, config: Any) -> list[str]:
        """What `trl-ftis swarm CONFIG` needs beyond the config to run this swarm again (its `cli_flag`)."""
        return [self.cli_flag] if self.cli_flag else []

    def create(self, config: Any) -> Any:
        """The `backend.Backend` that runs `config` (not imported here: the backends import this registry)."""
        raise NotImplementedError


_KINDS: dict[str, BackendKind] = {}
_loaded = False


def _load_built_in() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILT_IN:
            importlib.import_module(module)  # each registers its backend


def register_backend(kind: BackendKind) -> None:
    """Make `kind.name` a backend of the launcher (one registered again is replaced)."""
    if not kind.name.isidentifier():
        raise ValueError(f"a backend's name is an identifier (`launcher: <name>`), got {kind.name!r}")
    _KINDS[kind.name] = kind


def unregister_backend(name: str) -> None:
    """Forget the backend `name` (a test's own, once the test is done)."""
    _KINDS.pop(name, None)


def backend_names() -> tuple[str, ...]:
    """The registered backends, the built-in ones first."""
    _load_built_in()
    return tuple(_KINDS)


def backend_kind(name: str) -> BackendKind:
    """The registered backend `name`; KeyError naming the registered ones when there is none."""
    _load_built_in()
    if name not in _KINDS:
        raise KeyError(f"no launcher backend {name!r} (registered: {', '.join(_KINDS)})")
    return _KINDS[name]
