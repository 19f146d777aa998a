"""Where a swarm's processes run: the GPUs of every peer, control and vLLM server of a validated config, checked
together before anything starts, and the packages a peer's config needs on the machine that starts it.

`placement_problems(peers, kind)` lists the placement mistakes of a config's `PeerConfig`s (controls included:
they run at the same time as the swarm), one line each naming the peers and the GPUs; `schema.load_swarm_config`
refuses a config that has any (`--dry-run` and a real start alike). Where the peers run on this machine (a backend
that `runs_here`: `gpus` are device ids):

* peers on one GPU need a `gpu_share` each, and the shares on one GPU add up to at most 1;
* a vLLM server's GPUs are its own: no peer trains on them, no other server runs on them;
* an accelerate peer starts one process per GPU: its process count (`num_processes`, else its accelerate config's)
  is its number of `gpus` (a python peer is one process, which may spread a model over several GPUs);
* a server's tensor x data parallel size fits its GPUs; colocated vLLM's `vllm_tensor_parallel_size` divides the
  peer's processes (TRL refuses it otherwise), and its `vllm_gpu_memory_utilization` (a fraction of the whole GPU) is
  below the peer's share, inside which the engine allocates (`trl_ftis.gpu_share` refuses it, but only on the GPU).

A backend adds its own rules (`BackendKind.placement_problems`: on SLURM, a server's `gpus` are positions among the
job's GPUs).

`dependency_problems(peers)` lists the packages a peer needs that cannot be imported here: vllm (colocated vLLM, or a
`vllm_server` that runs `trl vllm-serve`) and deepspeed (an accelerate config with `distributed_type: DEEPSPEED`);
`commands.check_files` reports them (warnings of a dry run, refused at a real start). Standard library and PyYAML.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .schema_values import GPU_MEMORY_FRACTION_ARG

if TYPE_CHECKING:
    from .backends import BackendKind
    from .swarm_config import PeerConfig

__all__ = [
    "VLLM_MEMORY_DEFAULT",
    "accelerate_settings",
    "colocated_vllm",
    "dependency_problems",
    "gpu_ids",
    "on_gpus",
    "placement_problems",
    "process_count",
]

VLLM_MEMORY_DEFAULT = 0.3
"""TRL's `GRPOConfig.vllm_gpu_memory_utilization` default, which FTISConfig keeps: colocated vLLM's share of a GPU."""
_TRUE = ("true", "yes", "t", "y", "1")  # what transformers' HfArgumentParser reads as true
_EPSILON = 1e-9


# --------------------------------------------------------------------------------------------------------------------
# What a peer's config says
# --------------------------------------------------------------------------------------------------------------------


def accelerate_settings(path: Path | None) -> Mapping[str, Any] | None:
    """The mapping of an accelerate config file, or None when there is none or it cannot be read (not checked)."""
    if path is None:
        return None
    import yaml

    try:
        settings = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return settings if isinstance(settings, Mapping) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _process_count(peer: PeerConfig) -> tuple[int | None, str]:
    """(the peer's processes or None when unknown, where that number comes from)."""
    if peer.launcher != "accelerate":
        return 1, "a python peer is one process"
    if peer.num_processes is not None:
        return peer.num_processes, f"`num_processes` {peer.num_processes}"
    count = _count((accelerate_settings(peer.accelerate_config) or {}).get("num_processes"))
    if count is None:
        return None, ""
    return count, f"`num_processes: {count}` in its accelerate_config {Path(peer.accelerate_config).name}"


def process_count(peer: PeerConfig) -> int | None:
    """How many processes the peer starts: 1 for a python peer; an accelerate peer's `num_processes`, else its
    accelerate config's `num_processes`; None when unknown (no config, or one that cannot be read)."""
    return _process_count(peer)[0]


def _true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in _TRUE)


def colocated_vllm(peer: PeerConfig) -> bool:
    """Whether the peer generates with vLLM inside its own processes (`use_vllm: true`, `vllm_mode` colocate, TRL's
    default); a peer with a `vllm_server` runs in server mode."""
    mode = peer.args.get("vllm_mode")
    return peer.vllm_server is None and _true(peer.args.get("use_vllm")) and mode in (None, "colocate")


def _fraction(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _share(peer: PeerConfig) -> float | None:
    """The peer's share of its GPU's memory: `gpu_share` (sugar for args.gpu_memory_fraction) or that argument."""
    return peer.gpu_share if peer.gpu_share is not None else _fraction(peer.args.get(GPU_MEMORY_FRACTION_ARG))


def gpu_ids(gpus: str | None) -> list[str]:
    return list(dict.fromkeys(gpus.split(","))) if gpus else []


# --------------------------------------------------------------------------------------------------------------------
# How the problems are said
# --------------------------------------------------------------------------------------------------------------------


def _names(peers: Sequence[PeerConfig]) -> str:
    return ", ".join(repr(peer.id) for peer in peers)


def on_gpus(gpus: Sequence[str]) -> str:
    return f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {','.join(gpus)}"


def _control_note(peers: Sequence[PeerConfig]) -> str:
    controls = [peer for peer in peers if peer.control_of is not None]
    if not controls:
        return ""
    return (
        f" ({_names(controls)} {'is a control' if len(controls) == 1 else 'are controls'}: a control runs at the "
        "same time as its peer, on the same `gpus`)"
    )


# --------------------------------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------------------------------


def _repeated(peer: PeerConfig) -> list[str]:
    found = []
    for key, gpus in (("gpus", peer.gpus), ("vllm_server.gpus", peer.vllm_server and peer.vllm_server.gpus)):
        items = gpus.split(",") if gpus else []
        twice = sorted({gpu for gpu in items if items.count(gpu) > 1})
        if twice and peer.control_of is None:
            found.append(f"peer {peer.id!r}: `{key}` {gpus!r} lists {on_gpus(twice)} more than once")
    return found


def _shared_gpus(peers: Sequence[PeerConfig]) -> list[str]:
    """Peers whose `gpus` overlap: each needs a `gpu_share`, and the shares on one GPU add up to at most 1."""
    on_gpu: dict[str, list[PeerConfig]] = {}
    for peer in peers:
        for gpu in gpu_ids(peer.gpus):
            on_gpu.setdefault(gpu, []).append(peer)
    unshared: dict[tuple[str, ...], list[str]] = {}
    over: dict[tuple[str, ...], list[str]] = {}
    together: dict[tuple[str, ...], list[PeerConfig]] = {}
    for gpu, group in on_gpu.items():
        if len(group) < 2:
            continue
        key = tuple(peer.id for peer in group)
        together[key] = group
        shares = [_share(peer) for peer in group]
        if any(share is None for share in shares):
            unshared.setdefault(key, []).append(gpu)
        elif sum(shares) > 1.0 + _EPSILON:
            over.setdefault(key, []).append(gpu)
    found = []
    for key, gpus in unshared.items():
        group = together[key]
        lacking = [peer for peer in group if _share(peer) is None]
        who = "both use" if len(group) == 2 else "all use"
        found.append(
            f"peers {_names(group)}: {who} {on_gpus(gpus)} (`gpus`), and {_names(lacking)} "
            f"{'has' if len(lacking) == 1 else 'have'} no `gpu_share`: peers on one GPU each need a `gpu_share` "
            f"(adding up to at most 1), or GPUs of their own{_control_note(group)}"
        )
    for key, gpus in over.items():
        group = together[key]
        total = sum(_share(peer) for peer in group)
        found.append(
            f"peers {_names(group)}: `gpu_share` values on {on_gpus(gpus)} add up to {total:g} > 1 (one GPU's memory)"
            f"{_control_note(group)}"
        )
    return found


def _server_gpus(peers: Sequence[PeerConfig]) -> list[str]:
    """A vLLM server's GPUs (local device ids) that a peer trains on or another server runs on."""
    found = []
    servers = [peer for peer in peers if peer.vllm_server is not None]
    for peer in servers:
        server = peer.vllm_server
        if peer.gpus is None:
            found.append(
                f"peer {peer.id!r}: its vLLM server runs on {on_gpus(gpu_ids(server.gpus))} (`vllm_server.gpus` "
                f"{server.gpus!r}), but the peer has no `gpus`: it would see every GPU, the server's too; set its "
                "`gpus` to the GPUs it trains on"
            )
        for other in peers:
            common = [gpu for gpu in gpu_ids(server.gpus) if gpu in gpu_ids(other.gpus)]
            if not common:
                continue
            if other is peer:
                found.append(
                    f"peer {peer.id!r}: its vLLM server (`vllm_server.gpus` {server.gpus!r}) and its training "
                    f"(`gpus` {peer.gpus!r}) both use {on_gpus(common)}: the server needs GPUs of its own"
                )
            else:
                found.append(
                    f"peers {peer.id!r}, {other.id!r}: the vLLM server of {peer.id!r} (`vllm_server.gpus` "
                    f"{server.gpus!r}) and the training of {other.id!r} (`gpus` {other.gpus!r}) both use "
                    f"{on_gpus(common)}: a server needs GPUs of its own"
                )
    for index, peer in enumerate(servers):
        for other in servers[index + 1 :]:
            common = [gpu for gpu in gpu_ids(peer.vllm_server.gpus) if gpu in gpu_ids(other.vllm_server.gpus)]
            if common:
                found.append(
                    f"peers {peer.id!r}, {other.id!r}: their vLLM servers (`vllm_server.gpus` "
                    f"{peer.vllm_server.gpus!r} and {other.vllm_server.gpus!r}) both use {on_gpus(common)}: "
                    "each server needs GPUs of its own"
                )
    return found


def _processes_per_gpu(peer: PeerConfig) -> list[str]:
    """An accelerate peer starts one process per GPU of its `gpus`."""
    gpus = gpu_ids(peer.gpus)
    if peer.launcher != "accelerate" or not gpus:
        return []
    count, said = _process_count(peer)
    if count is None or count == len(gpus):
        return []
    return [
        f"peer {peer.id!r}: {said}, but `gpus` {peer.gpus!r} is {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}: "
        "accelerate starts one process per GPU; make them agree (a peer's `num_processes` overrides its "
        "accelerate_config's)"
    ]


def _vllm_sizes(peer: PeerConfig) -> list[str]:
    """A server's engine fits its GPUs; colocated vLLM's tensor parallel size divides the peer's processes."""
    found = []
    server = peer.vllm_server
    if server is not None and server.parallel_size > len(gpu_ids(server.gpus)):
        gpus = len(gpu_ids(server.gpus))
        found.append(
            f"peer {peer.id!r}: its vLLM server needs {server.parallel_size} GPUs (tensor_parallel_size x "
            f"data_parallel_size of `vllm_server.args`), but `vllm_server.gpus` {server.gpus!r} is {gpus} "
            f"GPU{'s' if gpus > 1 else ''}"
        )
    if colocated_vllm(peer):
        size = _count(peer.args.get("vllm_tensor_parallel_size", 1))
        count, said = _process_count(peer)
        if size is not None and count is not None and count % size:
            found.append(
                f"peer {peer.id!r}: colocated vLLM's `args.vllm_tensor_parallel_size` {size} does not divide the "
                f"peer's {count} process{'es' if count > 1 else ''} ({said}): TRL needs it to (each tensor-parallel "
                "group is that many of the peer's processes)"
            )
    return found


def _vllm_memory(peer: PeerConfig) -> list[str]:
    """Colocated vLLM allocates inside the peer's share of its GPU: its fraction of the whole GPU is below it."""
    share = _share(peer)
    if share is None or not colocated_vllm(peer):
        return []
    given = "vllm_gpu_memory_utilization" in peer.args
    memory = _fraction(peer.args.get("vllm_gpu_memory_utilization", VLLM_MEMORY_DEFAULT))
    if memory is None or memory < share:
        return []
    where = f" on {on_gpus(gpu_ids(peer.gpus))}" if peer.gpus else ""
    return [
        f"peer {peer.id!r}: colocated vLLM's `args.vllm_gpu_memory_utilization` {memory:g}"
        f"{'' if given else ' (TRL default)'} is not below its `gpu_share` {share:g}{where}: the engine allocates "
        f"inside the peer's share of the GPU, so set it below the share (e.g. {share / 2:g}), leaving the rest for "
        "training"
    ]


def placement_problems(peers: Sequence[PeerConfig], kind: BackendKind) -> list[str]:
    """Every placement mistake of a config's peers (controls included), one line each naming the peers and GPUs;
    [] when none. `kind` is the backend that runs them: its own rules (`BackendKind.placement_problems`), and, when
    its peers run on this machine (`runs_here`: `gpus` are its device ids), this machine's GPUs."""
    found = [problem for peer in peers for problem in _repeated(peer)]
    found += kind.placement_problems(peers)
    if kind.runs_here:
        found += _shared_gpus(peers)
        found += _server_gpus(peers)
        # One peer's own mistakes are said once, for the peer (its controls repeat its configuration).
        found += [problem for peer in peers if peer.control_of is None for problem in _processes_per_gpu(peer)]
    for peer in peers:
        if peer.control_of is None:
            found += _vllm_sizes(peer) + _vllm_memory(peer)
    return found


# --------------------------------------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------------------------------------


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _deepspeed(peer: PeerConfig) -> str | None:
    """What in the peer's accelerate config asks for DeepSpeed, or None."""
    if peer.launcher != "accelerate":
        return None
    settings = accelerate_settings(peer.accelerate_config) or {}
    if str(settings.get("distributed_type", "")).upper() == "DEEPSPEED":
        return "`distributed_type: DEEPSPEED`"
    return "`deepspeed_config`" if "deepspeed_config" in settings else None


def dependency_problems(peers: Sequence[PeerConfig]) -> list[str]:
    """The packages a peer's config needs that cannot be imported here, one line per peer and package, with how to
    install it. Controls run their peer's configuration: said once, for the peer."""
    found = []
    for peer in peers:
        if peer.control_of is not None:
            continue
        needs = []
        if colocated_vllm(peer):
            needs.append(("vllm", "colocated vLLM (`args.use_vllm: true`)"))
        elif peer.vllm_server is not None and peer.vllm_server.command is None:
            needs.append(("vllm", "its `vllm_server` (`trl vllm-serve`)"))
        if (asks := _deepspeed(peer)) is not None:
            needs.append(("deepspeed", f"its accelerate_config {Path(peer.accelerate_config).name} ({asks})"))
        for package, what in needs:
            if not _installed(package):
                found.append(
                    f"peer {peer.id!r}: {what} needs the {package} package, which is not installed: "
                    f"pip install {package}"
                )
    return found
