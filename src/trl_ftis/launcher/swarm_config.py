"""The validated swarm config, as the backends run it: `SwarmConfig` and its `PeerConfig`s (`schema.load_swarm_config`
makes them from a YAML file or a mapping)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends import DEFAULT_BACKEND
from .vllm_schema import VllmServerConfig

__all__ = ["PeerConfig", "SwarmConfig"]


@dataclass
class PeerConfig:
    """One validated peer. `args` and `env` are already merged over the top-level ones, sugar applied (`model`,
    `lora` and `gpu_share` are in `args` as `model_name_or_path`, `use_peft` and `gpu_memory_fraction`)."""

    id: str
    script: Path
    launcher: str = "python"
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    lora: bool | None = None
    accelerate_config: Path | None = None
    num_processes: int | None = None
    gpus: str | None = None
    gpu_share: float | None = None
    # The backend's own sections of this peer, resolved (`BackendKind.peer_resolve`: its SLURM job's resources, ...).
    sections: dict[str, Any] = field(default_factory=dict)
    vllm_server: VllmServerConfig | None = None  # the vLLM server the launcher starts for this peer
    control_of: str | None = None  # a control (`controls.py`): the swarm peer whose configuration it runs alone


@dataclass
class SwarmConfig:
    """A validated swarm: absolute `run_dir`, one `exchange_url` for all peers, at least one peer.

    `scheduler` names the backend that runs it (`backends.backend_kind`); `sections` are that backend's own top-level
    sections, resolved (`BackendKind.resolve`). With `exchange_started` the backend starts the exchange itself (a
    server job, say): `exchange_url` is then a placeholder until it does, nothing probes it before start, and a peer
    restarted alone (`--only`) could not join it."""

    peers: list[PeerConfig]
    run_dir: Path
    exchange_url: str
    source: str | None = None  # the config file, for messages; None for a dict
    scheduler: str = DEFAULT_BACKEND
    sections: dict[str, Any] = field(default_factory=dict)
    exchange_started: bool = False
    on_failure: str = "stop"  # `ON_FAILURE`: whether a peer that fails stops the others
    not_started: tuple[str, ...] = ()  # peers of the config this launcher leaves alone (`--only`, `restart.py`)
    seeds: tuple[int, ...] = ()  # `seeds:`: the swarm runs once per seed (`seeds.py`); () runs it once as written
    seed: int | None = None  # the seed this config runs, when it is one of several (`seeds.seed_config`)
    # Every peer's FTIS_SWARM_RUN (`commands.RUN_ID_FILE`): None, run_swarm draws one; "", no run binding.
    run_id: str | None = None

    def peer(self, peer_id: str) -> PeerConfig:
        for peer in self.peers:
            if peer.id == peer_id:
                return peer
        raise KeyError(peer_id)
