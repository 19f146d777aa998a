"""The SLURM backend (`launcher: slurm`): every peer of a swarm is one SLURM job, submitted with submitit, followed
from here. `SlurmBackend` follows `backend.Backend`; the driver runs it (signals, console, summary, exit code).

What it does in the driver's steps:

1. `start`: with a Redis job (`redis: {start: true}`, the default on SLURM): submits `jobs.RedisJob`, waits until the
   server it starts answers from this machine, and hands every peer `--exchange_url redis://ftis@HOST:PORT/0?swarm=S`
   (its ACL user, `jobs.redis_acl`; the password through `FTIS_REDIS_PASSWORD`, read in the job from a file
   only the user can read; never printed).
   Then it submits one job per peer (`jobs.PeerJob`, which runs the command `commands.build_commands` builds, as the
   local launcher runs it) with the peer's `slurm` resources. A peer's vLLM server (`vllm_server:`) runs in the peer's
   own job (`jobs.ServerJob`): started on its first node before the peer, stopped when the peer ends.
2. `poll`: polls `squeue` (and `scontrol` for a job that ended; `sacct` is never needed, so clusters without
   accounting work), prints each peer's log lines as they arrive in `<run_dir>/logs/<id>.log`, prefixed like the
   local launcher, and reads each peer's exit code from `<run_dir>/slurm/<id>.exit` (`watch.JobWatch` reads the
   states and exit codes and decides what they mean).
3. `stop`: on a failing peer (non-zero exit, or its job ending FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ... before the
   peer finished), on Ctrl-C / SIGTERM / SIGHUP, and after success, every job still in the queue is cancelled: running
   peers get SIGTERM (`scancel --signal=TERM`) and `grace` seconds to exit, then everything left, the Redis job
   included, is cancelled (`scancel`), and the launcher waits until SLURM lists none of them as active. Jobs whose
   submission a signal interrupted are found by their unique job name. No job outlives the launcher, unless the
   launcher itself is killed with SIGKILL (`scancel $(cut -d' ' -f1 <run_dir>/slurm/jobs.txt)` then cancels them).

The summary table and `summary.json` are the driver's, with each peer's job id, node and state added
(`summary_row`) and the Redis job (`summary_fields`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import TextIO

from ...exchange.transports.registry import exchange_folder, transport_kind
from ...redaction import redact_text
from ...shared_names import REDIS_PASSWORD_ENV
from ..backend import Console, Outcome, PeerState, Signals, finished_outcome, short_error
from ..commands import (
    build_commands,
    check_files,
    is_secret_name,
    keep_earlier,
    open_private,
    redact_env,
    redact_shell_line,
    shell_line,
    shell_quote,
    write_cmd_file,
)
from ..placement import dependency_problems
from ..swarm_config import SwarmConfig
from ..vllm_servers import ServerCommand
from .cli import (
    describe_resources,
    options_text,
    restrict_folder,
    scancel,
    scancel_names,
    script_lines,
    signals_blocked,
    submitit_parameters,
)
from .jobs import PeerJob, RedisJob, ServerJob, answers_ping
from .schema import REDIS_JOB_EXCHANGE, job_resources, redis_job
from .watch import JobWatch, SlurmJob, exit_path, node_exit_paths, read_exit_code

__all__ = ["LogTail", "SlurmBackend", "redis_job_url", "slurm_problems", "swarm_name"]

SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scancel", "scontrol")
SLURM_DIR = "slurm"  # <run_dir>/slurm: submitit's folders, exit files, the Redis job's files, jobs.txt
REDIS_LOG = "redis.server.log"  # in <run_dir>/logs


# --------------------------------------------------------------------------------------------------------------------
# Checks, names, parameters
# --------------------------------------------------------------------------------------------------------------------


def slurm_problems(config: SwarmConfig) -> list[str]:
    """What this machine lacks to submit the swarm (submitit, the SLURM commands, the redis package)."""
    problems = []
    if importlib.util.find_spec("submitit") is None:
        problems.append(
            "launcher slurm submits its jobs with submitit, which is not installed: pip install 'trl-ftis[slurm]'"
        )
    missing = [name for name in SLURM_COMMANDS if shutil.which(name) is None]
    if missing:
        problems.append(
            f"launcher slurm needs the SLURM commands {', '.join(missing)} on PATH (run trl-ftis on a SLURM login "
            "node)"
        )
    kind = transport_kind(config.exchange_url)  # the Redis job's exchange too (`schema.REDIS_JOB_EXCHANGE`)
    problems += [
        f"the peers exchange through {kind.scheme}://, which needs {pip}, not installed here: pip install '{pip}'"
        for pip in kind.missing_packages()
    ]
    return problems


def swarm_name(config: SwarmConfig) -> str:
    """The swarm's name on SLURM: its run_dir's name, in characters job names and Redis swarm names take (the
    Redis job's stream is `ftis:<name>`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", config.run_dir.name)[:40] or "swarm"


def _job_name(config: SwarmConfig, token: str, what: str) -> str:
    """`<swarm>.<token>.<peer id>` (the Redis job: `<swarm>.<token>:redis`): unique per launch, so that the
    launcher can cancel by name a job whose submission a signal interrupted."""
    return f"{swarm_name(config)}.{token}{what}"


def peer_job_name(config: SwarmConfig, token: str, peer_id: str) -> str:
    return _job_name(config, token, f".{peer_id}")


def redis_job_name(config: SwarmConfig, token: str) -> str:
    return _job_name(config, token, ":redis")


# --------------------------------------------------------------------------------------------------------------------
# Dry run
# --------------------------------------------------------------------------------------------------------------------


def _folder_exchange_note(config: SwarmConfig) -> str | None:
    kind = transport_kind(config.exchange_url)
    if kind.folder is None:
        return None
    return (
        f"{kind.scheme}:// exchange on SLURM: {kind.folder(config.exchange_url)} must be a directory every node "
        "shares (a network filesystem); the default on SLURM, a Redis job (`redis: {start: true}`), needs no shared "
        "directory"
    )


def _server_lines(server: ServerCommand) -> list[str]:
    """How a peer's job runs its vLLM server (the dry run, the peer's `.cmd` file), secrets hidden."""
    return [
        f"#   first, on the job's first node: its vLLM server on the job's GPUs at positions {server.gpus} (its "
        "CUDA_VISIBLE_DEVICES; the peer gets the job's other GPUs); the peer starts once "
        f"{server.health_url} answers (within {server.ready_timeout:g}s), and the server stops when the peer ends; "
        f"weight sync on port {server.group_port}; the job fails if port {server.port} or {server.group_port} is "
        f"taken on its node; log {server.log_path}",
        f"#   server: cd {shell_quote(str(server.cwd))} && {shell_line(server, redact_env(server.env))}",
    ]


def _write_server_cmd_file(server: ServerCommand) -> None:
    """`logs/<id>.vllm.cmd`: the server's command as its peer's job runs it (secrets redacted), owner only."""
    lines = [
        f"# vLLM server of peer {server.peer_id}: run by the peer's SLURM job, started at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
        *_server_lines(server),
    ]
    with open_private(server.cmd_path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def _dry_run(config: SwarmConfig, token: str, stream: TextIO) -> None:
    """Print the jobs the backend would submit (their sbatch options, setup lines, submitit's batch script and the
    command each runs, secrets hidden); submit nothing, write nothing."""
    root = config.run_dir / SLURM_DIR
    commands = build_commands(config)
    out = [f"# swarm: {len(commands)} peer(s) on SLURM, one job each; run_dir {config.run_dir}"]
    if redis_job(config) is not None:
        redis = redis_job(config)
        out.append(f"# exchange: a Redis server job started first; peers get --exchange_url {REDIS_JOB_EXCHANGE}")
    else:
        out.append(f"# exchange: {redact_text(config.exchange_url)}")
    out.append(f"# job names end in a new token at every launch (here {token}); submitit writes to {root}/<id>/")
    note = _folder_exchange_note(config)
    if note:
        out.append(f"# note: {note}")
    out.append("")
    if redis_job(config) is not None:
        name = redis_job_name(config, token)
        port = redis.port or "free on its node"
        secret = f"${REDIS_PASSWORD_ENV} (set here)" if os.environ.get(REDIS_PASSWORD_ENV) else "a random one"
        password = (
            f"password: {secret}, handed to the peers as {REDIS_PASSWORD_ENV}" if redis.password else "no password"
        )
        out.append(f"# ---- job {name}: the exchange's Redis server ({describe_resources(redis.resources)})")
        out.append(f"#   runs: {redis.server} (port: {port}; {password}); log {config.run_dir / 'logs' / REDIS_LOG}")
        out.extend(script_lines(redis.resources, name, root / "redis-job"))
        out.append("")
    for command, peer in zip(commands, config.peers):
        resources = job_resources(peer)
        name = peer_job_name(config, token, peer.id)
        out.append(f"# ---- job {name}: peer {peer.id} (launcher {peer.launcher}; {describe_resources(resources)})")
        if resources.nodes > 1:
            out.append(
                f"#   on each of its {resources.nodes} nodes: accelerate launch with --num_machines {resources.nodes} "
                "--machine_rank <node> --main_process_ip <first node>"
            )
        if command.server is not None:
            out.extend(_server_lines(command.server))
        env = redact_env(command.env)
        out.append(f"#   runs: cd {shell_quote(str(command.cwd))} && {shell_line(command, env)}")
        out.append(f"#   log {command.log_path}; exit status {root / (peer.id + '.exit')}")
        out.extend(script_lines(resources, name, root / peer.id))
        out.append("")
    passed = sorted(name for name in os.environ if is_secret_name(name))
    if passed:
        out.append(
            "# passed to the jobs from your environment (sbatch exports it; values hidden): " + " ".join(passed)
        )
    for problem in check_files(config) + slurm_problems(config):
        out.append(f"# warning: {problem}")
    for problem in dependency_problems(config.peers):  # the jobs may import it on their nodes (`slurm.setup`)
        out.append(f"# warning: {problem} (here, where you submit; the jobs need it on their nodes)")
    stream.write("\n".join(out).rstrip("\n") + "\n")


# --------------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------------


def redis_job_url(address: dict, host: str) -> str:
    """The exchange URL of the launcher's Redis job from its `redis.json`: its ACL user (when it has a password,
    which the peers get as FTIS_REDIS_PASSWORD) and its swarm, whose stream is all that user may touch."""
    user = f"{address['user']}@" if address.get("user") else ""
    swarm = f"?swarm={address['swarm']}" if address.get("swarm") else ""
    return f"redis://{user}{host}:{int(address['port'])}/0{swarm}"


class LogTail:
    """New complete lines of a file that another machine appends to (re-opened at each poll: NFS close-to-open)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:  # truncated (a job requeued by hand): start again
                    self.offset, self.partial = 0, b""
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [self._text(line) for line in lines]

    def flush(self) -> list[str]:
        lines = self.read()
        if self.partial:
            lines.append(self._text(self.partial))
            self.partial = b""
        return lines

    @staticmethod
    def _text(raw: bytes) -> str:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        return text.rsplit("\r", 1)[-1] if "\r" in text else text  # progress bars: the last state


class SlurmBackend:
    """Runs one swarm on SLURM: `start` (the Redis job, the peer jobs), `poll` (logs, exit files, job states), then
    `stop` and `finish`, which the driver always calls, whatever happened."""

    verb = "submit"
    POLL = 0.25  # seconds between log and exit-file checks
    poll_interval = POLL
    QUEUE_WAIT = 120.0  # seconds to wait, after scancel, for SLURM to end the jobs

    def __init__(self, config: SwarmConfig):
        self.config = config
        self.grace = 10.0
        self.token = secrets.token_hex(3)
        self.root = config.run_dir / SLURM_DIR
        self.commands = build_commands(config)
        self.runs = [
            SlurmJob(
                command=command,
                name=peer_job_name(config, self.token, peer.id),
                resources=job_resources(peer),
            )
            for peer, command in zip(config.peers, self.commands)
        ]
        self.redis = (
            SlurmJob(command=None, name=redis_job_name(config, self.token), resources=redis_job(config).resources)
            if redis_job(config) is not None
            else None
        )
        self.exchange_url = config.exchange_url if redis_job(config) is None else None
        self.tails = {run.command.id: LogTail(run.command.log_path) for run in self.runs}
        self.console: Console | None = None
        self.signals: Signals | None = None
        self.watch = JobWatch(config, self.root, config.run_dir / "logs" / REDIS_LOG)
        self.secret: Path | None = None  # the Redis password file (mode 0600), when the Redis job has one

    # ---- before submitting -----------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        return check_files(self.config) + slurm_problems(self.config)

    def dry_run(self, stream: TextIO) -> None:
        _dry_run(self.config, self.token, stream)

    # ---- output ----------------------------------------------------------------------------------------------

    def say(self, message: str):
        self.console.say(message)

    def emit(self, line: str):
        self.console.emit(line)

    def _sleep(self, seconds: float):
        """Sleep, waking up at once on a signal."""
        self.signals.wait(seconds)

    def _tail_logs(self, final: bool = False):
        for run in self.runs:
            if not run.attempted:
                continue  # its log is still an earlier run's (emptied only when its job is submitted)
            tail = self.tails[run.command.id]
            for line in tail.flush() if final else tail.read():
                self.console.peer(run.command.id, line)

    # ---- files -----------------------------------------------------------------------------------------------

    def _prepare(self):
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        (self.config.run_dir / "logs").mkdir(exist_ok=True)
        self.root.mkdir(exist_ok=True)
        try:
            self.root.chmod(0o700)  # submitit's pickles hold the peers' environment additions
        except OSError:
            pass
        (self.root / "jobs.txt").unlink(missing_ok=True)  # this launch's jobs only
        directory = exchange_folder(self.config.exchange_url)
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)

    def _record_job(self, job: SlurmJob, what: str):
        with open(self.root / "jobs.txt", "a", encoding="utf-8") as handle:
            handle.write(f"{job.job_id} {job.name} {what}\n")

    def _submit(self, job: SlurmJob, function, folder: Path):
        import submitit

        executor = submitit.SlurmExecutor(folder=folder)
        executor.update_parameters(**submitit_parameters(job.resources, job.name))
        if not job.started_at:
            job.started_at = time.time()
        job.attempted = True
        job.folder = folder
        try:
            with signals_blocked():
                submitted = executor.submit(function)
        finally:
            restrict_folder(folder)
        job.job_id = str(submitted.job_id)
        job.submitted = time.monotonic()
        job.status = "pending"
        self._record_job(job, "redis" if job.command is None else job.command.id)

    # ---- the Redis job ---------------------------------------------------------------------------------------

    def _secret_file(self) -> Path | None:
        if redis_job(self.config) is None or not redis_job(self.config).password:
            return None
        path = self.root / "redis.secret"
        password = os.environ.get(REDIS_PASSWORD_ENV) or secrets.token_urlsafe(24)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(password + "\n")
        return path

    def start_redis(self) -> Outcome | None:
        """Submit the Redis job and wait until it answers; sets `self.exchange_url`. A failure: (code, reason)."""
        redis, job = redis_job(self.config), self.redis
        assert redis is not None and job is not None
        address_path = self.root / "redis.json"
        address_path.unlink(missing_ok=True)
        log_path = self.config.run_dir / "logs" / REDIS_LOG
        open_private(log_path, "wb").close()
        self.secret = self._secret_file()
        function = RedisJob(
            server=redis.server,
            port=redis.port,
            directory=str(self.root / "redis"),
            log_path=str(log_path),
            address_path=str(address_path),
            secret_path=str(self.secret) if self.secret else None,
            start_timeout=redis.start_timeout,
            swarm=swarm_name(self.config),
        )
        try:
            self._submit(job, function, self.root / "redis-job")
        except Exception as exc:  # noqa: BLE001 - sbatch refused it (submitit's error says why)
            job.status = "failed to submit"
            return Outcome(1, redact_text(f"could not submit the Redis job: {short_error(exc)}"))
        self.say(f"submitted the Redis job {job.job_id} ({job.name}); waiting until it answers")
        running_since = None
        announced = None
        while True:
            if self.signals.received:
                return self.signals.outcome()
            failure = self.watch.poll_states([job], self.console)
            if failure is not None:
                return failure
            if job.state == "RUNNING" and running_since is None:
                running_since = time.monotonic()
            try:
                address = json.loads(address_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                address = None
            if isinstance(address, dict) and address.get("error"):
                return Outcome(1, f"the Redis job {job.job_id} failed: {address['error']}")
            if isinstance(address, dict) and address.get("port"):
                candidates = [address.get("host"), address.get("fqdn"), *address.get("addresses", [])]
                candidates = [c for i, c in enumerate(candidates) if c and c not in candidates[:i]]
                if announced is None:
                    announced = time.monotonic()
                    self.say(f"Redis is up on {address.get('host')} port {address['port']}; checking it answers here")
                for host in candidates:
                    if answers_ping(host, int(address["port"])):
                        self.exchange_url = redis_job_url(address, host)
                        self.say(f"exchange {self.exchange_url} (Redis job {job.job_id} on {job.node or host})")
                        return None
                if time.monotonic() - announced > redis.start_timeout:
                    return Outcome(
                        1,
                        f"the Redis job {job.job_id} runs on {address.get('host')}, but none of its addresses "
                        f"({', '.join(candidates)}) answers on port {address['port']} from this machine",
                    )
            elif running_since is not None and time.monotonic() - running_since > redis.start_timeout + 30:
                return Outcome(
                    1, f"the Redis job {job.job_id} runs, but wrote no address within {redis.start_timeout:g}s"
                )
            self._sleep(self.POLL)

    # ---- the peers -------------------------------------------------------------------------------------------

    def submit_peers(self) -> Outcome | None:
        if self.exchange_url != self.config.exchange_url:
            self.commands = build_commands(self.config, exchange_url=self.exchange_url)
            for run, command in zip(self.runs, self.commands):
                run.command = command
        for run in self.runs:
            if self.signals.received:
                return self.signals.outcome()
            command = run.command
            command.output_dir.mkdir(parents=True, exist_ok=True)
            # An earlier run's logs (its nodes' too: their jobs append) are kept as <name>.<N>, never reused.
            node_logs = [
                command.log_path.with_name(f"{command.id}.node{k}.log") for k in range(1, run.resources.nodes)
            ]
            server = command.server
            server_files = [server.log_path, server.cmd_path] if server is not None else []
            keep_earlier([command.log_path, command.cmd_path, *node_logs, *server_files], private=True)
            # The job appends (so the mode stays); a log left by an earlier run must not show.
            for log in [command.log_path, *server_files[:1]]:
                open_private(log, "wb").close()
            # A peer summary file older than this is stale: the log's mtime comes from the clock of the filesystem
            # the job writes to as well, so a skewed clock on this machine cannot make a fresh summary look stale.
            run.started_at = command.log_path.stat().st_mtime
            for stale in [exit_path(self.root, command.id), *node_exit_paths(self.root, command.id)]:
                stale.unlink(missing_ok=True)
            function = PeerJob(
                peer_id=command.id,
                argv=list(command.argv),
                env=dict(command.env),
                cwd=str(command.cwd),
                log_path=str(command.log_path),
                exit_path=str(exit_path(self.root, command.id)),
                secret_path=str(self.secret) if self.secret else None,
                nodes=run.resources.nodes,
                server=ServerJob.of(server, run.resources.gpus) if server is not None else None,
            )
            folder = self.root / command.id
            write_cmd_file(command)
            if server is not None:
                _write_server_cmd_file(server)
            self._append_job_to_cmd_file(run, folder)
            try:
                self._submit(run, function, folder)
            except Exception as exc:  # noqa: BLE001 - sbatch refused it (submitit's error says why)
                run.status = "failed to submit"
                self.say(f"peer {command.id}: could not submit its job: {short_error(exc)}")
                return Outcome(1, redact_text(f"could not submit peer {command.id}: {short_error(exc)}"))
            self.say(
                f"submitted {command.id}: job {run.job_id} ({describe_resources(run.resources)}); "
                f"log {command.log_path}"
            )
        return None

    def _append_job_to_cmd_file(self, run: SlurmJob, folder: Path):
        lines = [
            "",
            f"# SLURM job {run.name}: sbatch {options_text(run.resources)}",
            *(f"# setup: {redact_shell_line(line)}" for line in run.resources.setup),
            f"# submitit folder (batch script, stdout/stderr of the job): {folder}",
            f"# exit status: {exit_path(self.root, run.command.id)}",
            *(_server_lines(run.command.server) if run.command.server is not None else []),
        ]
        with open_private(run.command.cmd_path, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")

    # ---- supervision -----------------------------------------------------------------------------------------

    def _jobs(self) -> list[SlurmJob]:
        return [*self.runs, *([self.redis] if self.redis is not None else [])]

    def poll(self) -> Outcome | None:
        self._tail_logs()
        failure = self.watch.check_exit_files(self.runs, self.console)
        if failure is not None:
            self._tail_logs()
            return failure
        if all(run.returncode is not None for run in self.runs):  # non-zero ones only with on_failure: continue
            return finished_outcome([run.command.id for run in self.runs if run.returncode])
        failure = self.watch.poll_states(self._jobs(), self.console)
        if failure is not None:
            self._tail_logs()
            return failure
        return None

    def start(self, console: Console, signals: Signals) -> Outcome | None:
        """The Redis job (and its address), then every peer's job. None once they are all submitted."""
        self.console, self.signals = console, signals
        self._prepare()
        self.say(
            f"run_dir {self.config.run_dir}; {len(self.runs)} peer job(s) on SLURM; "
            f"job names {self.config.run_dir.name}.{self.token}.*"
        )
        note = _folder_exchange_note(self.config)
        if note:
            self.say(f"note: {note}")
        if self.redis is not None:
            failure = self.start_redis()
            if failure is not None:
                return failure
        else:
            self.say(f"exchange {redact_text(self.exchange_url)}")
        return self.submit_peers()

    # ---- stopping --------------------------------------------------------------------------------------------

    def _refresh(self):
        """Exit files and job states now (no failure handling: the swarm is stopping)."""
        self.watch.check_exit_files(self.runs, self.console)
        self.watch.poll_states(self._jobs(), self.console, force=True)

    def stop(self, grace: float) -> None:
        """Cancel every job still in the queue: SIGTERM to running peers and `grace` seconds to exit, then
        `scancel` for everything left (the Redis job too), then wait until SLURM lists none of them as active."""
        self.grace = grace
        self.watch.mark_stopping()
        self._refresh()
        unfinished = [run for run in self.runs if run.active and run.returncode is None]
        running = [run for run in unfinished if run.state == "RUNNING"]
        waiting = [run for run in unfinished if run not in running]
        # Peers that exited: their jobs end by themselves within a moment (cancelling them would record CANCELLED).
        ending = [run for run in self.runs if run.active and run.returncode is not None]
        if waiting:
            self.say(f"cancelling queued jobs: {', '.join(f'{r.command.id} ({r.job_id})' for r in waiting)}")
            scancel(run.job_id for run in waiting)
        signals_before = self.signals.count
        if running:
            names = ", ".join(f"{r.command.id} ({r.job_id})" for r in running)
            self.say(f"stopping peers {names}: SIGTERM, then scancel after {self.grace:g}s")
            scancel((run.job_id for run in running), signal_name="TERM")
        if running or ending:
            deadline = time.monotonic() + self.grace
            while time.monotonic() < deadline and self.signals.count == signals_before:
                self._tail_logs()
                self._refresh()
                if not any(run.active for run in running + ending):
                    break
                self._sleep(self.POLL)
            if self.signals.count != signals_before:
                self.say("second signal: cancelling the jobs now")
        stubborn = [run for run in running if run.active and run.returncode is None]
        if stubborn:  # SIGKILL now, as the local launcher does, rather than after the cluster's KillWait
            self.say(f"still running after {self.grace:g}s: {', '.join(r.command.id for r in stubborn)}; SIGKILL")
            scancel((run.job_id for run in stubborn), signal_name="KILL")
            deadline = time.monotonic() + 5.0  # their jobs end by themselves once the step's processes are gone
            while any(run.active for run in stubborn) and time.monotonic() < deadline:
                self._sleep(self.POLL)
                self._refresh()
        left = [job for job in self._jobs() if job.active]
        if left:
            what = ", ".join(f"{'the Redis job' if j.command is None else j.command.id} ({j.job_id})" for j in left)
            self.say(f"cancelling {what}")
            scancel(job.job_id for job in left)
        unknown = [job.name for job in self._jobs() if job.job_id is None and job.attempted]
        if unknown:
            scancel_names(unknown)  # a submission that failed or was cut short: its job, if any, has this unique name
        self._wait_gone()

    def _wait_gone(self):
        deadline = time.monotonic() + self.QUEUE_WAIT
        signals_before = self.signals.count
        next_note = time.monotonic() + 10
        while True:
            self._tail_logs()
            self._refresh()
            left = [job for job in self._jobs() if job.active]
            if not left:
                return
            if time.monotonic() > deadline or self.signals.count != signals_before:
                ids = " ".join(job.job_id for job in left)
                states = ", ".join(j.state or "?" for j in left)
                self.say(
                    f"WARNING: jobs {ids} are cancelled but SLURM still lists them ({states}); "
                    f"check with `squeue -j {ids.replace(' ', ',')}`"
                )
                return
            if time.monotonic() > next_note:
                self.say(f"waiting for SLURM to end jobs {' '.join(job.job_id for job in left)}")
                next_note = time.monotonic() + 10
            self._sleep(self.POLL * 2)

    def finish(self):
        """The last log lines; the final status of every peer."""
        self._tail_logs(final=True)
        for run in self.runs:
            if run.returncode is None:
                code = read_exit_code(self.root, run.command.id)
                if code is not None:
                    self.watch.record_exit(run, code, run.ended or time.monotonic())
            if run.status in ("pending", "running"):
                run.status = "stopped"
                run.ended = run.ended or time.monotonic()
                run.started = run.started or run.submitted or run.ended

    # ---- results ---------------------------------------------------------------------------------------------

    def states(self) -> list[PeerState]:
        return list(self.runs)

    def summary_row(self, state: PeerState, row: dict) -> dict:
        assert isinstance(state, SlurmJob)
        row["job_id"] = state.job_id
        row["node"] = state.node
        row["slurm_state"] = state.state
        row["slurm_folder"] = str(self.root / state.command.id)
        return row

    def summary_fields(self) -> dict:
        redis = self.redis
        return {
            "scheduler": "slurm",
            "redis_job": None
            if redis is None
            else {
                "job_id": redis.job_id,
                "node": redis.node,
                "state": redis.state,
                "log": str(self.config.run_dir / "logs" / REDIS_LOG),
            },
        }
