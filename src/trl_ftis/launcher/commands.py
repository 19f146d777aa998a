"""Peer commands: what each peer of a validated `SwarmConfig` runs, whatever the backend, and how it is shown without
its secrets.

`build_commands(config)` returns one `PeerCommand` (argv + environment additions) per peer and starts nothing;
`check_files` lists what is missing on this machine; `describe_commands` (the dry runs) and `write_cmd_file` (one
peer's command next to its log) show them with secrets redacted (`redact_env`, `redact_argv`, `is_secret_name`;
passwords in URLs through `trl_ftis.redaction.redact_text`). `free_port` picks the accelerate ports (and the Redis
job's).
`new_run_id`, `recorded_run_id` and `record_run_id` draw, read and keep the id of a run of the swarm (every peer's
`FTIS_SWARM_RUN`: messages of other runs are refused), so that a peer restarted with `--only` joins the same run.
`keep_earlier` keeps an earlier run's log and `.cmd` file of a peer before a new run writes them. `open_private`
opens every file the launcher writes that may hold a secret (logs, `.cmd` files) readable by its owner only, whatever
the umask; `shell_quote` quotes a value on one line, so that nothing a config holds can start a line of its own in
a script or a comment block.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..message_trust import MAX_BINDING_CHARS, binding_problem
from ..model_paths import hub_model_problem, local_model_problem
from ..redaction import REDACTED, redact_text
from ..shared_names import CONSOLE_ENV, CONSOLE_LINES, PEER_ID_ENV, SWARM_NAME_ENV, SWARM_RUN_ENV, SWARM_SECRET_ENV
from .backends import backend_kind
from .preflight import render_args, render_value
from .schema_values import SwarmConfigError
from .swarm_config import SwarmConfig
from .vllm_schema import peer_vllm_args
from .vllm_servers import ServerCommand, server_command

__all__ = [
    "HUB_TOKEN_ENV",
    "RUN_ID_FILE",
    "SECRET_ARGS",
    "PeerCommand",
    "build_commands",
    "check_files",
    "describe_commands",
    "free_port",
    "is_secret_name",
    "keep_earlier",
    "new_run_id",
    "open_private",
    "peer_output_dir",
    "record_run_id",
    "recorded_run_id",
    "redact_argv",
    "redact_env",
    "redact_shell_line",
    "shell_line",
    "shell_quote",
    "write_cmd_file",
]

# Environment names whose values are never printed or written by the launcher (case-insensitive, anywhere in the
# name). TOKENIZERS_PARALLELISM & co. are not secrets.
_SECRET_NAME_RE = re.compile(r"SECRET|TOKEN(?!IZ)|PASSWORD|PASSWD|API_KEY|CREDENTIAL", re.IGNORECASE)
# `NAME=VALUE` as a command-line item (what `env` takes).
_ASSIGNMENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# In a shell line (`slurm.setup`): `NAME=VALUE` / `--name=VALUE` anywhere, and `--name VALUE`; VALUE one shell word
# (quoted or not).
_WORD = r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|[^\s;&|()'"]+)+"""
_SHELL_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
_SHELL_ASSIGNMENT_RE = re.compile(rf"(?P<name>(?<![^\s;&|(])(?:--?)?{_SHELL_NAME})=(?P<value>{_WORD})?")
_SHELL_OPTION_RE = re.compile(rf"(?P<name>(?<!\S)--?{_SHELL_NAME})(?P<space>[ \t]+)(?P<value>(?!-){_WORD})")
# Characters a shell line or a comment must not hold raw: a newline would start a line of its own.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

HUB_TOKEN_ENV = "HF_TOKEN"  # huggingface_hub reads it when TrainingArguments.hub_token is not set
# Secret arguments the peers read from the environment as well: the launcher passes them there, never on a command
# line (others on the machine read command lines with `ps`). FTISConfig reads FTIS_SWARM_SECRET when swarm_secret is
# not set.
SECRET_ARGS = {"swarm_secret": SWARM_SECRET_ENV, "hub_token": HUB_TOKEN_ENV}


@dataclass
class PeerCommand:
    """What `run_swarm` starts for one peer: `argv` in `cwd`, with the caller's environment plus `env`."""

    id: str
    argv: list[str]
    env: dict[str, str]  # additions to the caller's environment only
    output_dir: Path
    log_path: Path
    cmd_path: Path
    cwd: Path
    launcher: str
    main_process_port: int | None = None
    control_of: str | None = None  # a control (`controls.py`): the swarm peer whose configuration it runs alone
    server: ServerCommand | None = None  # its vLLM server (`vllm_server:`), started before it and stopped with it

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The caller's environment (secrets such as the swarm secret included) with this peer's additions."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


# --------------------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------------------


def free_port(taken: set[int] | None = None) -> int:
    """A TCP port nobody listens on right now on any interface, not in `taken` (which gets it).

    The OS picks it (bind to port 0); another program could still take it before the peer binds it, which is
    unlikely within the second between here and the peer's start.
    """
    taken = set() if taken is None else taken
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))  # all interfaces, as torch binds its store
            port = sock.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("could not find a free TCP port")


def peer_output_dir(config: SwarmConfig, peer_id: str) -> Path:
    """The `--output_dir` the launcher gives peer `peer_id`: `<run_dir>/<id>`."""
    return config.run_dir / peer_id


RUN_ID_FILE = "swarm_run"
"""In `run_dir`: the id of the swarm's latest run, which `--only` restarts join (peers started by hand set
`FTIS_SWARM_RUN` to it)."""


def new_run_id() -> str:
    """A fresh run id: the UTC start time and 8 random hex digits (printable, well within the 128 characters)."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def recorded_run_id(config: SwarmConfig) -> str | None:
    """The run id `record_run_id` kept in `run_dir`, or None when there is no such file (a run of an earlier
    version: its peers are unbound). `SwarmConfigError` naming the file when it exists but holds no valid id (not
    UTF-8, a control character, over `MAX_BINDING_CHARS` characters, empty, unreadable): a restart must never fall
    back to an unbound peer, which the others would refuse and which would accept any run's messages."""
    path = config.run_dir / RUN_ID_FILE
    try:
        with open(path, "rb") as handle:  # a valid id and its newline, no more
            data = handle.read(4 * MAX_BINDING_CHARS + 2)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise SwarmConfigError(f"cannot read the run id file {path}: {error}") from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        problem = "is not UTF-8"
    else:
        problem = binding_problem(text) if text else "is empty"
    if problem is not None:
        raise SwarmConfigError(
            f"the run id file {path} is damaged: it {problem}. It should hold the id of the swarm's latest run (the "
            f"FTIS_SWARM_RUN of its peers' logs/<id>.cmd files); write that id into it, or delete the file to "
            "restart the peer unbound"
        )
    return text


def record_run_id(config: SwarmConfig) -> None:
    """Keep `config.run_id` in `run_dir` (not a secret: it binds messages to the run; the secret and keys sign
    them)."""
    if config.run_id:
        config.run_dir.mkdir(parents=True, exist_ok=True)
        (config.run_dir / RUN_ID_FILE).write_text(config.run_id + "\n", encoding="utf-8")


def build_commands(config: SwarmConfig, *, exchange_url: str | None = None) -> list[PeerCommand]:
    """One `PeerCommand` per peer, in config order. Starts nothing and writes nothing.

    Each command is `sys.executable SCRIPT` (launcher python) or ``sys.executable -m accelerate.commands.launch
    [--config_file F] [--num_processes N] --main_process_port PORT SCRIPT`` (launcher accelerate; every accelerate
    peer gets a different free port so that no two peers ever join one process group), followed by
    `--peer_id ID --exchange_url URL --output_dir RUN_DIR/ID` and the peer's args. `exchange_url` replaces the
    config's (the SLURM launcher passes the address of the Redis job it started). With a `run_id`, every peer's
    messages are bound to the swarm (`FTIS_SWARM_NAME`, the run_dir's name) and to the run (`FTIS_SWARM_RUN`); a
    peer's `env` may override either (an empty value: no binding).
    """
    exchange_url = config.exchange_url if exchange_url is None else exchange_url
    # Ports a config names are never drawn for another server or peer of the launch.
    ports: set[int] = {
        port
        for peer in config.peers
        if peer.vllm_server is not None
        for port in (peer.vllm_server.port, peer.vllm_server.group_port)
        if port is not None
    }
    swarm_name = config.run_dir.name  # runs/<config file stem> by default
    cwd = Path(os.getcwd())
    logs = config.run_dir / "logs"
    commands = []
    for peer in config.peers:
        output_dir = peer_output_dir(config, peer.id)
        port = None
        if peer.launcher == "accelerate":
            argv = [sys.executable, "-m", "accelerate.commands.launch"]
            if peer.accelerate_config is not None:
                argv += ["--config_file", str(peer.accelerate_config)]
            if peer.num_processes is not None:
                argv += ["--num_processes", str(peer.num_processes)]
            port = free_port(ports)
            argv += ["--main_process_port", str(port)]
        else:
            argv = [sys.executable]
        argv.append(str(peer.script))
        # A control runs as its peer (the same --peer_id: a script that derives its data or seeds from the id draws
        # the same), with its own output directory and log.
        as_peer = peer.control_of or peer.id
        argv += ["--peer_id", as_peer]
        if peer.control_of is None:  # a control trains alone (`controls.py`): no exchange
            argv += ["--exchange_url", exchange_url]
        argv += ["--output_dir", str(output_dir)]
        argv += render_args({k: v for k, v in peer.args.items() if k not in SECRET_ARGS})
        server = None
        if peer.vllm_server is not None:
            server = server_command(
                peer.id,
                str(peer.model if peer.model is not None else peer.args["model_name_or_path"]),
                peer.vllm_server,
                port=peer.vllm_server.port or free_port(ports),
                group_port=peer.vllm_server.group_port or free_port(ports),
                peer_env=peer.env,
                logs=logs,
                cwd=cwd,
                visible_devices=backend_kind(config.scheduler).runs_here,
            )
            argv += render_args(peer_vllm_args(peer.vllm_server, server.port, server.group_port))
        if "project" not in peer.args:  # trackio groups the peers' runs (each named after its peer) by project
            argv += ["--project", swarm_name]

        env = {PEER_ID_ENV: as_peer}
        # Peers write to a pipe; unbuffered output reaches the console and the log as it is printed, and a crash
        # cannot swallow the last lines.
        env.setdefault("PYTHONUNBUFFERED", "1")
        # One short line per logged step and no dependency deprecation notices (trl_ftis.console); a peer's `env`
        # may set FTIS_CONSOLE to "dict" for Trainer's full dicts.
        env.setdefault(CONSOLE_ENV, CONSOLE_LINES)
        in_swarm = peer.control_of is None  # a control has no exchange: nothing to bind it to
        if in_swarm and config.run_id:  # messages of other swarms and runs (replays, leftovers) are refused
            env[SWARM_NAME_ENV] = swarm_name
            env[SWARM_RUN_ENV] = config.run_id
        elif in_swarm and config.run_id == "":  # unbound on purpose (a restart of a run that recorded none)
            env[SWARM_RUN_ENV] = ""
        env.update(peer.env)
        if "WANDB_RUN_GROUP" not in os.environ and "WANDB_RUN_GROUP" not in env:
            env["WANDB_RUN_GROUP"] = swarm_name  # wandb groups the peers' runs
        if peer.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = peer.gpus
        for name, variable in SECRET_ARGS.items():  # the argument wins over the same variable in `env`
            if peer.args.get(name) is not None:
                env[variable] = render_value(peer.args[name])
        commands.append(
            PeerCommand(
                id=peer.id,
                argv=argv,
                env=env,
                output_dir=output_dir,
                log_path=logs / f"{peer.id}.log",
                cmd_path=logs / f"{peer.id}.cmd",
                cwd=cwd,
                launcher=peer.launcher,
                main_process_port=port,
                control_of=peer.control_of,
                server=server,
            )
        )
    return commands


def keep_earlier(paths: Sequence[Path], *, private: bool = False) -> int | None:
    """Keep what an earlier run wrote at `paths` (a peer's log and `.cmd` file; `summary.json`) before a new run
    writes there: each one that exists is renamed to `<name>.<N>` (`logs/b.log.1`, `logs/b.cmd.1`), one N for all of
    `paths` so that they stay a pair, the next one free (1, 2, ...: the highest is the most recent earlier run).
    Returns N, or None when none existed.

    The number goes after the whole name, not before `.log`: a peer id may hold dots and digits (`b.1`), and
    `b.1.log` is that peer's own log. With `private`, the kept files become readable by their owner only (an
    earlier version's `.cmd` file listed the whole environment)."""
    existing = [path for path in paths if os.path.lexists(path)]
    if not existing:
        return None
    taken = 0
    for path in paths:
        prefix = path.name + "."
        for name in os.listdir(path.parent) if path.parent.is_dir() else ():
            number = name[len(prefix) :] if name.startswith(prefix) else ""
            if number.isascii() and number.isdigit():
                taken = max(taken, int(number))
    for path in existing:
        kept = path.with_name(f"{path.name}.{taken + 1}")
        os.replace(path, kept)
        if private and not kept.is_symlink():
            try:
                kept.chmod(0o600)
            except OSError:
                pass
    return taken + 1


def open_private(path: str | os.PathLike, mode: str = "w", **kwargs: Any):
    """`open(path, mode)` ("w", "a", "wb", "ab"; `kwargs` as for `open`), the file readable and writable by its owner
    only (0600) whatever the umask, an existing file included: logs and `.cmd` files may hold what a peer prints or
    the config holds."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # os.open's mode is masked by the umask and ignored for an existing file
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def check_files(config: SwarmConfig) -> list[str]:
    """Problems only visible on this machine (missing script or accelerate config, accelerate not installed, a local
    model folder that does not exist; for a local swarm, vllm or deepspeed not installed where a peer needs them)."""
    import importlib.util

    from .placement import dependency_problems

    problems = []
    for index, peer in enumerate(config.peers):
        if peer.control_of is not None:
            continue  # a control runs its peer's script and model: checked (and said) once, for the peer
        if not peer.script.is_file():
            problems.append(f"peer {peer.id!r}: script {peer.script} does not exist")
        if peer.accelerate_config is not None and not peer.accelerate_config.is_file():
            problems.append(f"peer {peer.id!r}: accelerate_config {peer.accelerate_config} does not exist")
        if peer.launcher == "accelerate" and importlib.util.find_spec("accelerate") is None:
            problems.append(f"peer {peer.id!r}: launcher accelerate, but the accelerate package is not installed")
        # transformers takes a path that is no folder for a Hub id and answers "Repo id must be in the form ...".
        key = "model" if peer.model is not None else "args.model_name_or_path"
        model = peer.model if peer.model is not None else peer.args.get("model_name_or_path")
        problem = local_model_problem(model)
        if problem is None:  # a Hub id: a folder of that name beside the config or run folder, or no Hub at all
            beside = [Path(config.source).parent] if config.source else []
            problem = hub_model_problem(model, elsewhere=[*beside, config.run_dir])
        if problem is not None:
            problems.append(f"`peers[{index}] (id {peer.id!r}).{key}`: {problem}")
    # Elsewhere (SLURM jobs, ...) the peers import them on their own machines, not here.
    if backend_kind(config.scheduler).runs_here:
        problems += dependency_problems(config.peers)
    return problems


# --------------------------------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or option named `name` holds a secret (SECRET, TOKEN, PASSWORD, ...)."""
    return _SECRET_NAME_RE.search(name) is not None


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the value of every variable named like a secret (SECRET, TOKEN, PASSWORD, ...) replaced."""
    return {k: (REDACTED if is_secret_name(k) else redact_text(v)) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """`argv` with every secret replaced by `<redacted>`.

    * The values of secret-named options (SECRET, TOKEN, PASSWORD, API_KEY, ... anywhere in the name, any case), in
      both forms: `--hub_token X` (every value up to the next `--option`, for list-valued options) and
      `--swarm_secret=X`.
    * Secret-named `NAME=VALUE` items (an `env FTIS_SWARM_SECRET=X ...` command line).
    * URL passwords in every other item (`redis://:X@host`, `?password=X`; `trl_ftis.redaction.redact_text`).
    """
    out = []
    hide_values = False
    for item in argv:
        if item.startswith("--"):
            name, equals, _ = item[2:].partition("=")
            hide_values = not equals and is_secret_name(name)  # `--flag=value` holds its value: nothing follows
            out.append(f"--{name}={REDACTED}" if equals and is_secret_name(name) else redact_text(item))
        elif hide_values:
            out.append(REDACTED)
        elif _ASSIGNMENT_RE.match(item) and is_secret_name(item.partition("=")[0]):
            out.append(item.partition("=")[0] + "=" + REDACTED)
        else:
            out.append(redact_text(item))
    return out


def redact_shell_line(line: str) -> str:
    """A shell line (a `slurm.setup` line, a line of a batch script) with its secrets replaced by `<redacted>`: the
    value of every secret-named `NAME=VALUE` or `--name=VALUE` (`export GH_TOKEN=X`, `--password=X`), of every
    secret-named `--name VALUE`, and URL passwords (`trl_ftis.redaction.redact_text`). A secret the line holds under
    another name (`curl -H "Authorization: ..."`) is not recognised."""

    def assignment(match: re.Match) -> str:
        if not is_secret_name(match.group("name").lstrip("-")):
            return match.group(0)
        return f"{match.group('name')}={REDACTED}"

    def option(match: re.Match) -> str:
        if not is_secret_name(match.group("name").lstrip("-")):
            return match.group(0)
        return f"{match.group('name')}{match.group('space')}{REDACTED}"

    return redact_text(_SHELL_OPTION_RE.sub(option, _SHELL_ASSIGNMENT_RE.sub(assignment, line)))


def shell_quote(value: str) -> str:
    """`shlex.quote(value)`, on one line: a value holding a newline or another control character is written in
    bash's `$'...'` form (`$'a\\nb'`), so that it cannot start a line of its own in a script or a comment."""
    if not _CONTROL_RE.search(value):
        return shlex.quote(value)

    def escape(char: str) -> str:
        if char in "\\'":
            return "\\" + char
        if _CONTROL_RE.match(char):
            return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{ord(char):02x}")
        return char

    return "$'" + "".join(escape(char) for char in value) + "'"


def _shown(value: str) -> str:
    """A value on a comment line: the placeholder as it is, anything else quoted on one line."""
    return value if value == REDACTED else shell_quote(value)


def shell_line(command: PeerCommand | ServerCommand, env: Mapping[str, str]) -> str:
    """`env K=V ... <argv>`, shell-quoted on one line, secrets in `argv` redacted (`env` is shown as given: redact it
    first)."""
    parts = [f"{k}={shell_quote(v)}" for k, v in env.items()]
    return " ".join(["env", *parts, *(shell_quote(a) for a in redact_argv(command.argv))])


def describe_commands(commands: list[PeerCommand], environ: Mapping[str, str] | None = None) -> str:
    """Human-readable commands for `--dry-run`: secrets redacted, the rest copy-pasteable."""
    environ = os.environ if environ is None else environ
    passed = sorted(k for k in environ if is_secret_name(k) and k not in (c for cmd in commands for c in cmd.env))
    lines = []
    for command in commands:
        port = f", main_process_port {command.main_process_port}" if command.main_process_port else ""
        lines.append(f"# peer {command.id} (launcher {command.launcher}{port}; log {command.log_path})")
        added = redact_env(command.env)
        lines.append("# env additions: " + " ".join(f"{k}={_shown(v)}" for k, v in added.items()))
        lines.append(f"cd {shell_quote(str(command.cwd))} && {shell_line(command, redact_env(command.env))}")
        if command.server is not None:
            server = command.server
            lines.append(
                f"# its vLLM server, started first on GPUs {server.gpus}, ready when {server.health_url} answers "
                f"(weight sync on port {server.group_port}; log {server.log_path}):"
            )
            lines.append(f"cd {shell_quote(str(server.cwd))} && {shell_line(server, redact_env(server.env))}")
        lines.append("")
    if passed:
        lines.append(
            "# passed through from your environment (values hidden): " + " ".join(f"{k}={REDACTED}" for k in passed)
        )
    return "\n".join(lines).rstrip("\n") + "\n"


def write_cmd_file(command: PeerCommand | ServerCommand, what: str | None = None):
    """The exact command (secrets redacted) of a peer (or of its vLLM server, `what` saying which) and the
    environment the launcher adds to the caller's, to reproduce or debug it by hand. Only what the launcher adds is
    written: the rest is the caller's own environment, already theirs, and may hold secrets under any name. Readable
    by its owner only (`open_private`); every value is quoted on one line (`shell_quote`)."""
    added = redact_env(command.env)
    what = f"peer {command.id}" if what is None else what
    lines = [
        f"# {what}: started by `trl-ftis swarm` at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"# argv (JSON): {json.dumps(redact_argv(command.argv))}",
        f"cd {shell_quote(str(command.cwd))} && {shell_line(command, added)}",
        "",
        "# environment added by the launcher (secret-named values redacted), on top of the environment it was",
        "# started in (not written here):",
        *(f"#   {k}={_shown(v)}" for k, v in added.items()),
    ]
    with open_private(command.cmd_path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
