"""A peer's `vllm_server:` block: the vLLM server the launcher starts for that peer (TRL's `vllm_mode: server`).

```yaml
peers:
  - id: qwen2.5-1.5b
    model: Qwen/Qwen2.5-1.5B
    launcher: accelerate
    num_processes: 3
    gpus: "0,1,2"            # training
    vllm_server:
      gpus: "3"              # the server's GPUs (on SLURM: positions among the job's GPUs)
      args: {max_model_len: 1024}   # more `trl vllm-serve` arguments
```

`VllmServerSpec` is the block as written (validated with the rest of the schema); `VllmServerConfig` is what the
backends run. The launcher starts `trl vllm-serve --model <the peer's model> --host HOST --port PORT` plus `args`
on the block's GPUs before the peer, waits until `http://HOST:PORT/health` answers, and gives the peer `--use_vllm
true --vllm_mode server --vllm_server_host HOST --vllm_server_port PORT --vllm_group_port GROUP_PORT`
(`PEER_ARGS`). A port left out is drawn free at launch, never one another server of the launch uses. The server
stops with its peer. Standard library and pydantic only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, field_validator

from .schema_values import Args, gpus_value
from .validation import Spec, bad, said

__all__ = [
    "DEFAULT_SERVER_COMMAND",
    "PEER_ARGS",
    "SERVER_ARGS",
    "VllmServerConfig",
    "VllmServerSpec",
    "peer_vllm_args",
    "server_arg_conflicts",
]

DEFAULT_HOST = "127.0.0.1"  # the server and its peer run on one machine (one job's first node on SLURM)
DEFAULT_READY_TIMEOUT = 900.0  # seconds: loading a model, compiling and capturing CUDA graphs takes minutes
DEFAULT_SERVER_COMMAND = ("trl", "vllm-serve")
"""What starts a server when `command` is not given: TRL's `trl vllm-serve` (run as `python -m trl.cli.main
vllm-serve` with the launcher's Python, so that it is the TRL the peers import)."""

# The peer's arguments the launcher sets from the block (a config that sets them otherwise would disagree).
PEER_ARGS = (
    "use_vllm",
    "vllm_mode",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_group_port",
    "vllm_server_base_url",
)
# `trl vllm-serve` arguments the launcher sets itself.
SERVER_ARGS = {
    "model": "the peer's `model` (the server serves the model the peer trains)",
    "host": "`vllm_server.host`",
    "port": "`vllm_server.port`",
}
_HOST_RE = re.compile(r"[A-Za-z0-9.:_-]+")


def _port(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise bad(f"must be a TCP port (1-65535); leave it out for a free one drawn at launch, got {value!r}")
    return int(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise bad(f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def _host(value: Any) -> str:
    if not isinstance(value, str) or not _HOST_RE.fullmatch(value):
        raise bad(f"must be a host name or an IP address, got {value!r}")
    return value


def _command(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split() if isinstance(value, str) else value
    if (
        not isinstance(items, (list, tuple))
        or not items
        or not all(isinstance(item, str) and item and "\x00" not in item and "\n" not in item for item in items)
    ):
        raise bad(f"must be a program and its first arguments, as a list of strings, got {value!r:.80}")
    return tuple(items)


def _server_gpus(value: Any) -> str:
    if value is None:
        raise bad('must list the server\'s GPUs, such as "3" or [6, 7]')
    return gpus_value(value)


class VllmServerSpec(Spec):
    """A peer's `vllm_server:` block, as written."""

    MAPPING_HINT: ClassVar[str] = ' such as {gpus: "3"}'
    MISSING_HINTS: ClassVar[dict[str, str]] = {"gpus": " (the GPUs the server runs on, apart from the peer's own)"}
    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {
        "model": " (the server serves the peer's own `model`)",
        "tensor_parallel_size": " (a `trl vllm-serve` argument: put it under `vllm_server.args`)",
        "gpu_memory_utilization": " (a `trl vllm-serve` argument: put it under `vllm_server.args`)",
    }

    gpus: Annotated[str, BeforeValidator(_server_gpus)] = Field(
        description="the server's GPUs: device ids on this machine, or on SLURM positions among the job's GPUs"
    )
    host: Annotated[str, BeforeValidator(_host)] = Field(DEFAULT_HOST, description="where the server listens")
    port: Annotated[int | None, BeforeValidator(_port)] = Field(None, description="its HTTP port; drawn when absent")
    group_port: Annotated[int | None, BeforeValidator(_port)] = Field(
        None, description="the weight-sync port (TRL's vllm_group_port); drawn when absent"
    )
    args: Args = Field(default_factory=dict, description="more `trl vllm-serve` arguments")
    command: Annotated[tuple[str, ...] | None, BeforeValidator(_command)] = Field(
        None, description="the program that serves, instead of `trl vllm-serve`"
    )
    ready_timeout: Annotated[float, BeforeValidator(_seconds)] = Field(
        DEFAULT_READY_TIMEOUT, description="seconds to wait until its /health answers"
    )

    @field_validator("args")
    @classmethod
    def _launcher_sets(cls, args: dict) -> dict:
        taken = [key for key in args if key.replace("-", "_") in SERVER_ARGS]
        if taken:
            key = taken[0]
            raise said(f"`vllm_server.args.{key}` is set by the launcher from {SERVER_ARGS[key.replace('-', '_')]}")
        return args

    @field_validator("group_port")
    @classmethod
    def _two_ports(cls, group_port: int | None, info) -> int | None:
        if group_port is not None and group_port == info.data.get("port"):
            raise said(f"`vllm_server.port` and `vllm_server.group_port` are both {group_port}; they need two ports")
        return group_port

    def config(self) -> VllmServerConfig:
        return VllmServerConfig(
            gpus=self.gpus,
            host=self.host,
            port=self.port,
            group_port=self.group_port,
            args=dict(self.args),
            command=self.command,
            ready_timeout=self.ready_timeout,
        )


@dataclass
class VllmServerConfig:
    """A peer's validated vLLM server. `port` and `group_port` are None until drawn (`commands.build_commands`)."""

    gpus: str
    host: str = DEFAULT_HOST
    port: int | None = None
    group_port: int | None = None
    args: dict[str, Any] = field(default_factory=dict)
    command: tuple[str, ...] | None = None  # None: `trl vllm-serve` (DEFAULT_SERVER_COMMAND)
    ready_timeout: float = DEFAULT_READY_TIMEOUT

    @property
    def gpu_list(self) -> list[str]:
        return self.gpus.split(",")

    @property
    def parallel_size(self) -> int:
        """GPUs the server's engine uses: tensor parallel size times data parallel size (its args; 1 each)."""
        size = 1
        for key in ("tensor_parallel_size", "data_parallel_size"):
            value = self.args.get(key, self.args.get(key.replace("_", "-"), 1))
            size *= value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1
        return size


def peer_vllm_args(server: VllmServerConfig, port: int, group_port: int) -> dict[str, Any]:
    """The arguments a peer gets from its server: TRL's server mode at the server's address."""
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_host": server.host,
        "vllm_server_port": port,
        "vllm_group_port": group_port,
    }


def server_arg_conflicts(args: dict[str, Any]) -> list[str]:
    """The peer `args` that disagree with a `vllm_server` block: each `PEER_ARGS` key set to anything but what the
    launcher gives it (`use_vllm: true` and `vllm_mode: server` agree and are accepted)."""
    found = []
    for key in PEER_ARGS:
        if key not in args:
            continue
        value = args[key]
        if (key == "use_vllm" and value is True) or (key == "vllm_mode" and value == "server"):
            continue
        found.append(key)
    return found
