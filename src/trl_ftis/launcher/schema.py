"""The swarm config: its YAML schema (documented in `docs/swarm-launcher.md`), declared with pydantic, and the
validated `SwarmConfig` the backends run.

The schema is three kinds of section, each a `validation.Spec` model whose fields are its keys: `SwarmSpec` (the top
level), `PeerSpec` (one entry of `peers`) and the sections each backend declares (`backends.BackendKind`:
`top_sections`, `peer_sections`, with their validators), added to the two by `spec_models()` for every registered
backend; a backend's section is refused unless that backend runs the swarm. Each field's validator says what is wrong
in the launcher's words; checks across the keys of one peer run as validators of the later key (pydantic hands them the
earlier ones), checks across peers as the validator of `peers`, and what the top level decides for every peer (the
scheduler, the default launcher, whether there is a default script) is read from the raw mapping first and handed to
the validators as pydantic's validation context.

`load_swarm_config(path_or_dict)` returns a `SwarmConfig` of `PeerConfig`s (their `args` and `env` merged over the
top-level ones, the sugar applied, paths absolute), or raises `SwarmConfigError` listing every problem pydantic found,
each naming the peer and the key (with a did-you-mean for unknown keys), before anything starts. Across peers it also
checks each `args` key against the options of the peer's script when they can be read (`preflight.script_options`)
and that `expected_peers` names peers of the config; last, where the peers, their controls and their vLLM servers
run (`placement.placement_problems`: GPUs shared without `gpu_share`, a server on a peer's GPUs, ...). The rules
shared with the rest of trl-ftis come from the core (`trl_ftis.peer_ids`, `trl_ftis.shared_names`) and the transport
registry (exchange URLs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, create_model, field_validator
from pydantic_core import PydanticCustomError

from ..exchange.transports.directory import dir_exchange_url
from ..peer_ids import peer_id_problem
from .backends import BackendKind, backend_kind, backend_names
from .controls import control_peers
from .placement import placement_problems
from .preflight import ScriptOptions, expected_peer_problems, script_options
from .schema_values import (
    EXPECTED_PEERS_ARG,
    GPU_MEMORY_FRACTION_ARG,
    RESERVED_ARGS,
    SUGAR_ARGS,
    Args,
    ColonInt,
    Env,
    PathValue,
    SwarmConfigError,
    TopLevel,
    controls_value,
    exchange_url_value,
    gpu_share_value,
    gpus_value,
    model_value,
    num_processes_value,
    on_failure_value,
    optional_flag_value,
    path_value,
    peer_id_value,
    peer_launcher_value,
    peer_where,
    raw_args,
    run_dir_problem,
    run_dir_value,
    seeds_value,
    top_launcher_value,
    top_level,
)
from .swarm_config import PeerConfig, SwarmConfig
from .validation import Spec, bad, format_problems, problems, said, with_problems
from .vllm_schema import VllmServerSpec, server_arg_conflicts

__all__ = [
    "PeerSpec",
    "SwarmSpec",
    "load_swarm_config",
    "spec_models",
]

# --------------------------------------------------------------------------------------------------------------------


class PeerSpec(Spec):
    """One entry of `peers`, as written (before the top-level `args` and `env` are merged in)."""

    ENTRY: ClassVar[str] = "peer"
    MAPPING_HINT: ClassVar[str] = " with at least `id`"

    id: Annotated[str, BeforeValidator(peer_id_value)]
    model: Annotated[str | None, BeforeValidator(model_value)] = Field(
        None, description="sugar for args.model_name_or_path"
    )
    lora: Annotated[bool | None, BeforeValidator(optional_flag_value)] = Field(
        None, description="sugar for args.use_peft"
    )
    args: Args = Field(default_factory=dict, description="merged over the top-level args")
    env: Env = Field(default_factory=dict, description="merged over the top-level env")
    script: PathValue = Field(None, validate_default=True, description="overrides the top-level script")
    launcher: Annotated[str | None, BeforeValidator(peer_launcher_value)] = None
    accelerate_config: PathValue = None
    num_processes: Annotated[int | None, BeforeValidator(num_processes_value)] = None
    gpus: Annotated[str | None, BeforeValidator(gpus_value)] = Field(None, description="CUDA_VISIBLE_DEVICES")
    gpu_share: Annotated[float | None, BeforeValidator(gpu_share_value)] = Field(
        None, description="sugar for args.gpu_memory_fraction"
    )
    vllm_server: VllmServerSpec | None = Field(
        None, description="a vLLM server the launcher starts for this peer on GPUs of its own"
    )
    controls: Annotated[list[str] | None, BeforeValidator(controls_value)] = Field(
        None, description="overrides the top-level controls for this peer ([] for none)"
    )

    def launcher_in(self, top: TopLevel) -> str:
        return self.launcher or top.launcher

    @field_validator("args")
    @classmethod
    def _sugar_or_args(cls, args: dict, info: ValidationInfo) -> dict:
        found = []
        if info.data.get("model") is not None and "model_name_or_path" in args:
            found.append("`model` and args.model_name_or_path both set; keep one")
        if info.data.get("lora") is not None and "use_peft" in args:
            found.append("`lora` and args.use_peft both set; keep one")
        if found:
            raise said("; ".join(found))
        return args

    @field_validator("script")
    @classmethod
    def _some_script(cls, script: Path | None, info: ValidationInfo) -> Path | None:
        if script is None and not top_level(info).has_script:
            raise said("no `script`: set a top-level `script` or one for this peer")
        return script

    @field_validator("accelerate_config", "num_processes")
    @classmethod
    def _needs_accelerate(cls, value: Any, info: ValidationInfo) -> Any:
        launcher = info.data.get("launcher") or top_level(info).launcher
        if value is not None and launcher != "accelerate":
            raise said(f"`{info.field_name}` needs `launcher: accelerate` (this peer uses {launcher!r})")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _refused_by_the_backend(cls, value: Any, info: ValidationInfo) -> Any:
        refused = backend_kind(top_level(info).scheduler).refused_peer_keys
        if value is not None and info.field_name in refused:
            raise said(refused[info.field_name])
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus_here(cls, gpus: str | None, info: ValidationInfo) -> str | None:
        if gpus is None:
            return None
        if "CUDA_VISIBLE_DEVICES" in info.data.get("env", {}):
            raise said("`gpus` and env.CUDA_VISIBLE_DEVICES both set; keep `gpus`")
        return gpus

    @field_validator("gpu_share")
    @classmethod
    def _share_once(cls, share: float | None, info: ValidationInfo) -> float | None:
        if share is not None and GPU_MEMORY_FRACTION_ARG in info.data.get("args", {}):
            raise said(f"`gpu_share` and args.{GPU_MEMORY_FRACTION_ARG} both set; keep one")
        return share

    @field_validator("vllm_server")
    @classmethod
    def _server_peer(cls, server: VllmServerSpec | None, info: ValidationInfo) -> VllmServerSpec | None:
        if server is None:
            return None
        args = {**top_level(info).args, **info.data.get("args", {})}
        found = [
            f"`args.{key}` is set by the launcher from `vllm_server`; drop it" for key in server_arg_conflicts(args)
        ]
        if info.data.get("model") is None and args.get("model_name_or_path") is None:
            found.append("`vllm_server` serves the peer's model: set the peer's `model`")
        if found:
            raise said("; ".join(found))
        return server


def _peers_list(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise bad("must be a non-empty list of peers")
    return value


def _raw_script(entry: Any, top_script: Path | None) -> Path | None:
    script = entry.get("script") if isinstance(entry, Mapping) else None
    if script is None:
        return top_script
    try:
        return path_value(script)
    except PydanticCustomError:
        return None  # its own problem


def _unknown_argument(key: str, script: Path, options: ScriptOptions) -> str:
    hint = options.suggestion(key)
    suggestion = f"; did you mean `args.{hint}`?" if hint else ""
    takes = f"{script.name} takes the fields of {', '.join(options.classes)}"
    return f"unknown argument `args.{key}` ({takes}){suggestion}"


def _argument_problems(entries: list, top_args: Mapping, top_script: Path | None) -> list[tuple[str, str]]:
    """The `args` keys (and sugar) a peer's script does not take, for the scripts whose options can be read
    (`preflight.script_options`; the others are not checked: their options cannot be known)."""
    found: list[tuple[str, str]] = []
    top_keys = [k for k in top_args if k not in RESERVED_ARGS]
    top_said: set[tuple[str, Path]] = set()
    for index, entry in enumerate(entries):
        script = _raw_script(entry, top_script)
        options = script_options(script) if script is not None else None
        if options is None:
            continue
        where = peer_where(index, entry.get("id") if isinstance(entry, Mapping) else None)
        for key in top_keys:
            if (key, script) in top_said:
                continue
            if not options.accepts(key):
                top_said.add((key, script))  # once per script, not once per peer
                found.append(("top level", _unknown_argument(key, script, options)))
            elif (problem := options.value_problem(key, top_args[key])) is not None:
                top_said.add((key, script))
                found.append(("top level", f"`args.{key}`: {problem} ({script.name} would refuse it at start)"))
        for key, value in raw_args(entry).items():
            if key not in RESERVED_ARGS and not options.accepts(key):
                found.append((where, _unknown_argument(key, script, options)))
            elif key not in RESERVED_ARGS and (problem := options.value_problem(key, value)) is not None:
                found.append((where, f"`args.{key}`: {problem} ({script.name} would refuse it at start)"))
        for sugar, arg in SUGAR_ARGS.items():
            if isinstance(entry, Mapping) and entry.get(sugar) is not None and not options.accepts(arg):
                found.append((where, f"`{sugar}` sets `args.{arg}`, which {script.name} does not take"))
    return found


def _expected_peer_problems(entries: list, top: TopLevel) -> list[tuple[str, str]]:
    """`expected_peers` names that no peer of the config has: on the launcher's own exchange nobody else can join, so
    a round would wait `peer_timeout` for them every time. With the user's `exchange_url` a peer started elsewhere
    may join: `preflight.before_start` only warns."""
    if top.exchange_given:
        return []
    ids = [e.get("id") for e in entries if isinstance(e, Mapping) and peer_id_problem(e.get("id")) is None]
    ids = list(dict.fromkeys(ids))  # a duplicate is its own problem
    if not ids:
        return []
    found = [
        ("top level", f"`args.{EXPECTED_PEERS_ARG}` {message}")
        for message in expected_peer_problems(top.args.get(EXPECTED_PEERS_ARG), ids)
    ]
    for index, entry in enumerate(entries):
        for message in expected_peer_problems(raw_args(entry).get(EXPECTED_PEERS_ARG), ids):
            found.append((peer_where(index, entry.get("id")), f"`args.{EXPECTED_PEERS_ARG}` {message}"))
    return found


def _only_with(kind: BackendKind, key: str, at_top: bool):
    """A backend's own section: refused unless that backend runs the swarm."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if value is not None and top_level(info).scheduler != kind.name:
            where = " at the top level" if not at_top else ""
            flag = f" (or run with {kind.cli_flag})" if kind.cli_flag else ""
            raise said(f"`{key}` is only used {kind.where}: add `launcher: {kind.name}`{where}{flag}")
        return value

    return check


class SwarmSpec(Spec):
    """The top level of a swarm config, as written."""

    MISSING_HINTS: ClassVar[dict[str, str]] = {"peers": "; list at least one peer, e.g. peers: [{id: a}, {id: b}]"}

    script: PathValue = Field(None, description="the default script of every peer")
    launcher: Annotated[str, BeforeValidator(top_launcher_value)] = Field(
        "python", description="python | accelerate (every peer's default), or a backend's name (`backends`)"
    )
    exchange_url: Annotated[str | None, BeforeValidator(exchange_url_value)] = None
    run_dir: Annotated[str | None, BeforeValidator(run_dir_value)] = None
    args: Args = Field(default_factory=dict, description="every peer's arguments")
    env: Env = Field(default_factory=dict, description="every peer's environment additions")
    on_failure: Annotated[str, BeforeValidator(on_failure_value)] = Field(
        "stop", description="stop | continue: whether a peer that fails stops the others"
    )
    controls: Annotated[list[str], BeforeValidator(controls_value)] = Field(
        default_factory=list, description="alone | alone-rows: each peer's configuration run again without peers"
    )
    seeds: Annotated[list[int], BeforeValidator(seeds_value)] = Field(
        default_factory=list,
        description="run the whole swarm (and its controls) once per seed, each peer with `--seed N`, each seed in "
        "`<run_dir>/seed-N`; the end reads the seeds together (intervals over seeds)",
    )
    peers: Annotated[list[PeerSpec], BeforeValidator(_peers_list)]

    @field_validator("peers", mode="wrap")
    @classmethod
    def _peers_together(cls, value: Any, handler, info: ValidationInfo) -> list[PeerSpec]:
        # Duplicate ids, the args a peer's script does not take and `expected_peers` are read from the raw entries,
        # so that they are reported with the other peers' errors.
        entries = value if isinstance(value, list) else []
        found = _argument_problems(entries, top_level(info).args, info.data.get("script"))
        found += _expected_peer_problems(entries, top_level(info))
        seen: dict[str, int] = {}
        for index, entry in enumerate(entries):
            peer_id = entry.get("id") if isinstance(entry, Mapping) else None
            if not isinstance(peer_id, str) or peer_id_problem(peer_id) is not None:
                continue  # its own problem
            if peer_id in seen:
                found.append(
                    (peer_where(index, peer_id), f"duplicate `id` {peer_id!r} (also used by peers[{seen[peer_id]}])")
                )
            seen.setdefault(peer_id, index)
        try:
            peers = handler(value)
        except ValidationError as error:
            if found:
                raise with_problems(error, problems(found)) from None
            raise
        if found:
            raise problems(found)
        return peers


_MODELS: dict[tuple, tuple[type[SwarmSpec], type[PeerSpec]]] = {}


def spec_models() -> tuple[type[SwarmSpec], type[PeerSpec]]:
    """`SwarmSpec` and `PeerSpec` with the sections of every registered backend (`BackendKind.top_sections`,
    `peer_sections`, and their validators), each refused unless its backend runs the swarm. Built again when the
    registered backends change."""
    kinds = [backend_kind(name) for name in backend_names()]
    key = tuple((kind.name, id(kind)) for kind in kinds)
    if key not in _MODELS:
        peer_fields: dict[str, Any] = {}
        top_fields: dict[str, Any] = {}
        peer_validators: dict[str, Any] = {}
        top_validators: dict[str, Any] = {}
        for kind in kinds:
            for name, annotation in kind.peer_sections.items():
                checked = Annotated[annotation | None, BeforeValidator(_only_with(kind, name, at_top=False))]
                peer_fields[name] = (checked, Field(None, validate_default=True))
            for name, annotation in kind.top_sections.items():
                checked = Annotated[annotation | None, BeforeValidator(_only_with(kind, name, at_top=True))]
                top_fields[name] = (checked, Field(None, validate_default=True))
            peer_validators.update({f"{kind.name}_{n}": v for n, v in kind.peer_validators().items()})
            top_validators.update({f"{kind.name}_{n}": v for n, v in kind.top_validators().items()})
        peer_model = create_model("PeerSpec", __base__=PeerSpec, __validators__=peer_validators, **peer_fields)
        top_fields["peers"] = (Annotated[list[peer_model], BeforeValidator(_peers_list)], ...)
        top_model = create_model("SwarmSpec", __base__=SwarmSpec, __validators__=top_validators, **top_fields)
        _MODELS.clear()
        _MODELS[key] = (top_model, peer_model)
    return _MODELS[key]


def _load_raw(path_or_dict: Any) -> tuple[Mapping, str | None, str]:
    """Returns (raw mapping, source path or None, default run-dir name)."""
    if isinstance(path_or_dict, Mapping):
        return path_or_dict, None, "swarm"
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise TypeError(f"load_swarm_config takes a path or a mapping, got {type(path_or_dict).__name__}")
    import yaml  # only needed for files

    class _Loader(yaml.SafeLoader):
        """YAML 1.1 reads an unquoted `4:00:00` as the base-60 integer 14400; keep its text (a time limit, say)."""

    def _int(loader, node):
        value = yaml.SafeLoader.construct_yaml_int(loader, node)
        return ColonInt(value, node.value) if ":" in str(node.value) else value

    _Loader.add_constructor("tag:yaml.org,2002:int", _int)

    path = Path(path_or_dict)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SwarmConfigError(f"cannot read swarm config {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SwarmConfigError(f"swarm config {path} is not valid YAML: {exc}") from exc
    if raw is None:
        raise SwarmConfigError(f"swarm config {path} is empty; it needs at least `script` and `peers`")
    if not isinstance(raw, Mapping):
        raise SwarmConfigError(f"swarm config {path} must be a mapping at the top level, got {type(raw).__name__}")
    return raw, str(path), path.stem


def _locator(raw: Mapping):
    peers = raw.get("peers")

    def locate(loc: tuple) -> tuple[str, int]:
        if len(loc) >= 2 and loc[0] == "peers" and isinstance(loc[1], int):
            entry = peers[loc[1]] if isinstance(peers, list) and loc[1] < len(peers) else None
            return peer_where(loc[1], entry.get("id") if isinstance(entry, Mapping) else None), 2
        return "top level", 0

    return locate


def _order(problem: str) -> int:
    if problem.startswith("top level"):
        return -1
    index = re.match(r"peers\[(\d+)\]", problem)
    return int(index.group(1)) if index else 1 << 30  # "peers 'a', 'b'": after the peers themselves


def load_swarm_config(
    path_or_dict: str | os.PathLike | Mapping, run_dir: str | os.PathLike | None = None, *, backend: str | None = None
) -> SwarmConfig:
    """Read and validate a swarm config (a YAML file or an already-parsed mapping).

    `run_dir` (the CLI's `--run-dir`) wins over the config's `run_dir`; the default is `runs/<config file stem>`
    (`runs/swarm` for a mapping). Relative paths (`script`, `accelerate_config`, `run_dir` and a relative `dir://`
    exchange) are made absolute against the current directory. `backend` (a backend's command-line flag, e.g.
    `--slurm`: `backend="slurm"`) runs the swarm there as `launcher: <backend>` does, keeping a top-level `launcher:
    python|accelerate` as what runs inside each peer's job.

    Raises `SwarmConfigError` listing every problem, each naming the peer and the key.
    """
    raw, source, default_name = _load_raw(path_or_dict)
    if backend is not None:
        backend_kind(backend)  # KeyError naming the registered backends
    top = TopLevel.of(raw, backend, run_dir)
    top_model, _ = spec_models()
    try:
        spec = top_model.model_validate(dict(raw), context={"top": top})
    except ValidationError as error:
        found = format_problems(error, top_model, _locator(raw))
        found.sort(key=_order)  # the top level first, then peer by peer
        where = f" {source}" if source else ""
        lines = "\n".join(f"  - {item}" for item in found)
        raise SwarmConfigError(f"invalid swarm config{where}:\n{lines}", found) from None
    return _resolve(spec, top, source, run_dir if run_dir is not None else spec.run_dir, default_name)


def _resolve(spec: SwarmSpec, top: TopLevel, source: str | None, run_dir: Any, default_name: str) -> SwarmConfig:
    """The validated spec as the backends run it: defaults filled in, every peer merged over the top level."""
    chosen = os.fspath(run_dir) if run_dir is not None else os.path.join("runs", default_name)
    resolved_run_dir = Path(os.path.abspath(os.path.expanduser(chosen)))
    problem = run_dir_problem(resolved_run_dir)  # --run-dir, or the default named after the config file
    if problem is not None:
        what = "--run-dir" if top.run_dir_given else "run_dir" if spec.run_dir is not None else "the default run_dir"
        raise SwarmConfigError(f"invalid swarm config{f' {source}' if source else ''}: `{what}` {problem}")
    kind = backend_kind(top.scheduler)
    started_url, sections, exchange_started = kind.resolve(spec)
    # The backend's own exchange, the config's, or a folder in the run directory.
    exchange_url = started_url or spec.exchange_url or dir_exchange_url(resolved_run_dir / "exchange")

    peers = []
    for peer in spec.peers:
        args = {**spec.args, **peer.args}
        if peer.model is not None:
            args["model_name_or_path"] = peer.model
        if peer.lora is not None:
            args["use_peft"] = peer.lora
        if peer.gpu_share is not None:
            args[GPU_MEMORY_FRACTION_ARG] = peer.gpu_share  # FTISConfig caps the peer's GPU memory to it
        peers.append(
            PeerConfig(
                id=peer.id,
                script=peer.script or spec.script,
                launcher=peer.launcher_in(top),
                args=args,
                env={**spec.env, **peer.env},
                model=peer.model,
                lora=peer.lora,
                accelerate_config=peer.accelerate_config,
                num_processes=peer.num_processes,
                gpus=peer.gpus,
                gpu_share=peer.gpu_share,
                sections=kind.peer_resolve(spec, peer),
                vllm_server=peer.vllm_server.config() if peer.vllm_server is not None else None,
            )
        )
    kinds_of = {peer.id: peer.controls if peer.controls is not None else spec.controls for peer in spec.peers}
    for peer in spec.peers:
        if peer.vllm_server is not None and kinds_of[peer.id]:
            raise SwarmConfigError(
                f"invalid swarm config{f' {source}' if source else ''}: peer {peer.id!r} has a `vllm_server`, and its "
                "controls would each need a server on GPUs of their own: set `controls: []` for it (or run the "
                "controls as a config of their own)"
            )
    controls = control_peers(peers, kinds_of)
    taken = {peer.id for peer in peers}
    for control in controls:
        problem = peer_id_problem(control.id)
        if problem is None and control.id in taken:
            problem = "is also the id of a peer of the config"
        if problem is not None:
            raise SwarmConfigError(
                f"invalid swarm config{f' {source}' if source else ''}: the control {control.id!r} of peer "
                f"{control.control_of!r}: its id {problem}; rename the peer or the other one"
            )
        taken.add(control.id)
    peers += controls
    # Where everything runs, the controls included (they run at the same time as the swarm): every mistake at once.
    found = placement_problems(peers, kind)
    if found:
        lines = "\n".join(f"  - {item}" for item in found)
        raise SwarmConfigError(f"invalid swarm config{f' {source}' if source else ''}:\n{lines}", found)
    return SwarmConfig(
        peers=peers,
        run_dir=resolved_run_dir,
        exchange_url=exchange_url,
        source=source,
        scheduler=top.scheduler,
        sections=sections,
        exchange_started=exchange_started,
        on_failure=spec.on_failure,
        seeds=tuple(spec.seeds),
    )
