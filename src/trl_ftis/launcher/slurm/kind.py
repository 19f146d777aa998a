"""The SLURM backend as the launcher knows it (`backends.BackendKind`): `launcher: slurm` or `--slurm`, its `slurm:`
and `redis:` sections and their checks, the keys it refuses, its placement rules, and `SlurmBackend`. Importing this
module registers it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import ValidationInfo, field_validator

from ..backends import BackendKind, register_backend
from ..placement import gpu_ids, on_gpus
from ..schema_values import top_level
from ..validation import said
from .backend import SlurmBackend
from .schema import (
    REDIS_JOB_EXCHANGE,
    REDIS_KEY,
    SLURM_KEY,
    RedisJobConfig,
    RedisSpec,
    SlurmResources,
    job_resources,
    merge_resources,
)

__all__ = ["SlurmKind"]

NAME = "slurm"
_NODES = "nodes"  # the validation context's key: the top-level `slurm.nodes`, every peer job's default


def _nodes_need_accelerate(cls, own: SlurmResources | None, info: ValidationInfo) -> SlurmResources | None:
    top = top_level(info)
    if top.scheduler != NAME:
        return own
    nodes = own.nodes if own is not None and "nodes" in own.model_fields_set else top.backend.get(_NODES, 1)
    launcher = info.data.get("launcher") or top.launcher
    if nodes > 1 and launcher != "accelerate":
        raise said(
            f"`slurm.nodes` is {nodes}, but a {launcher!r} peer is one process on one node; use "
            "`launcher: accelerate` (one `accelerate launch` per node) or nodes: 1"
        )
    return own


def _one_exchange(cls, redis: RedisSpec | None, info: ValidationInfo) -> RedisSpec | None:
    if redis is not None and redis.start and info.data.get("exchange_url") is not None:
        raise said(
            "`exchange_url` and `redis.start: true` both set: the launcher gives every peer the address of the "
            "Redis job it starts; drop one"
        )
    return redis


def _server_problems(peer: Any) -> list[str]:
    """On SLURM a server's `gpus` are positions among the job's GPUs per node, and leave the training some."""
    server = peer.vllm_server
    if server is None:
        return []
    resources = job_resources(peer)
    job_gpus = resources.gpus
    if not job_gpus:
        return [
            f"peer {peer.id!r}: has a `vllm_server` (`vllm_server.gpus` {server.gpus!r}) but its job asks for no "
            "GPUs: set `slurm.gpus` (GPUs per node) to the server's GPUs plus the training's"
        ]
    if resources.nodes > 1:
        return [
            f"peer {peer.id!r}: has a `vllm_server` and `slurm.nodes` {resources.nodes}: the server takes GPUs of the "
            "job's first node only, and accelerate starts as many processes on every node; run a server peer on one "
            "node"
        ]
    gpus = gpu_ids(server.gpus)
    outside = [gpu for gpu in gpus if not gpu.isdigit() or int(gpu) >= job_gpus]
    if outside:
        return [
            f"peer {peer.id!r}: `vllm_server.gpus` {server.gpus!r} names {on_gpus(outside)}, but on SLURM they are "
            f"positions among the job's {job_gpus} GPU{'s' if job_gpus > 1 else ''} per node (`slurm.gpus` "
            f"{job_gpus}): 0 to {job_gpus - 1}"
        ]
    if len(gpus) >= job_gpus:
        return [
            f"peer {peer.id!r}: `vllm_server.gpus` {server.gpus!r} takes all {job_gpus} of the job's GPUs "
            f"(`slurm.gpus` {job_gpus}), leaving none for training: ask for more (`slurm.gpus`) or give the server "
            "fewer"
        ]
    return []


class SlurmKind(BackendKind):
    """Every peer one SLURM job (`SlurmBackend`); by default the exchange is a Redis server job the launcher starts."""

    name: ClassVar[str] = NAME
    where: ClassVar[str] = "on SLURM"
    cli_flag: ClassVar[str | None] = "--slurm"
    cli_help: ClassVar[str] = (
        "run every peer as a SLURM job (as `launcher: slurm` does; a top-level `launcher: python|accelerate` then "
        "says what runs inside each job)"
    )
    top_sections: ClassVar[Mapping[str, Any]] = {SLURM_KEY: SlurmResources, REDIS_KEY: RedisSpec}
    peer_sections: ClassVar[Mapping[str, Any]] = {SLURM_KEY: SlurmResources}
    refused_peer_keys: ClassVar[Mapping[str, str]] = {
        "gpus": "`gpus` picks devices on this machine; on SLURM ask for GPUs with `slurm.gpus` (GPUs per node), and "
        "SLURM sets CUDA_VISIBLE_DEVICES in the job"
    }

    def top_validators(self) -> dict[str, Any]:
        return {"one_exchange": field_validator(REDIS_KEY)(classmethod(_one_exchange))}

    def peer_validators(self) -> dict[str, Any]:
        return {"nodes_need_accelerate": field_validator(SLURM_KEY)(classmethod(_nodes_need_accelerate))}

    def context(self, raw: Mapping) -> dict:
        section = raw.get(SLURM_KEY)
        nodes = section.get("nodes") if isinstance(section, Mapping) else None
        return {_NODES: nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 else 1}

    def resolve(self, spec: Any) -> tuple[str | None, dict, bool]:
        redis: RedisSpec | None = getattr(spec, REDIS_KEY)
        top: SlurmResources | None = getattr(spec, SLURM_KEY)
        job: RedisJobConfig | None = None
        if redis is not None:
            job = redis.job(top) if redis.start else None
        elif spec.exchange_url is None:
            # On SLURM the default exchange is a Redis server the launcher starts as a job of its own: peers on
            # different nodes only need to reach it (a folder exchange needs a directory every node shares).
            job = RedisSpec().job(top)
        return (REDIS_JOB_EXCHANGE if job is not None else None), {REDIS_KEY: job}, job is not None

    def peer_resolve(self, spec: Any, peer_spec: Any) -> dict:
        layers = (getattr(spec, SLURM_KEY), getattr(peer_spec, SLURM_KEY))
        return {SLURM_KEY: merge_resources(*(layer for layer in layers if layer is not None))}

    def placement_problems(self, peers: Sequence[Any]) -> list[str]:
        return [problem for peer in peers if peer.control_of is None for problem in _server_problems(peer)]

    def create(self, config: Any) -> SlurmBackend:
        return SlurmBackend(config)


register_backend(SlurmKind())
