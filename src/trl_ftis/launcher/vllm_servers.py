"""The vLLM servers the launcher starts for the peers that have a `vllm_server:` block (`vllm_schema`).

`server_command(...)` builds one `ServerCommand` (argv, environment additions, address, log) for a peer; the
backends start it before the peer, wait until `http://HOST:PORT/health` answers (`health_answers`), and stop it
with the peer. Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .preflight import render_args
from .vllm_schema import VllmServerConfig

__all__ = ["SERVER_LOG_SUFFIX", "ServerCommand", "server_command"]

SERVER_LOG_SUFFIX = ".vllm"  # logs/<peer id>.vllm.log and .vllm.cmd


@dataclass
class ServerCommand:
    """What the launcher starts for one peer's vLLM server: `argv` in `cwd`, the caller's environment plus `env`."""

    peer_id: str
    argv: list[str]
    env: dict[str, str]  # additions to the caller's environment only
    host: str
    port: int
    group_port: int
    gpus: str  # CUDA_VISIBLE_DEVICES locally; positions among the job's GPUs on SLURM
    log_path: Path
    cmd_path: Path
    cwd: Path
    ready_timeout: float

    @property
    def health_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/health"

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


def server_command(
    peer_id: str,
    model: str,
    server: VllmServerConfig,
    *,
    port: int,
    group_port: int,
    peer_env: Mapping[str, str],
    logs: Path,
    cwd: Path,
    visible_devices: bool = True,
) -> ServerCommand:
    """The command of peer `peer_id`'s server, serving `model` on `server.gpus` at `server.host:port`.

    `peer_env`: the peer's environment additions, which the server gets too (a cache folder, say), but not its
    CUDA_VISIBLE_DEVICES. `visible_devices`: set CUDA_VISIBLE_DEVICES to the server's GPUs (locally); on SLURM the
    job maps its positions to devices itself."""
    program = (
        list(server.command) if server.command is not None else [sys.executable, "-m", "trl.cli.main", "vllm-serve"]
    )
    argv = [*program, "--model", model, "--host", server.host, "--port", str(port), *render_args(server.args)]
    env = {key: value for key, value in peer_env.items() if key != "CUDA_VISIBLE_DEVICES"}
    env.setdefault("PYTHONUNBUFFERED", "1")
    if visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = server.gpus
    return ServerCommand(
        peer_id=peer_id,
        argv=argv,
        env=env,
        host=server.host,
        port=port,
        group_port=group_port,
        gpus=server.gpus,
        log_path=logs / f"{peer_id}{SERVER_LOG_SUFFIX}.log",
        cmd_path=logs / f"{peer_id}{SERVER_LOG_SUFFIX}.cmd",
        cwd=cwd,
        ready_timeout=server.ready_timeout,
    )
