"""What runs inside the SLURM jobs `backend.SlurmBackend` submits: the callables submitit pickles and its worker calls.

* `PeerJob`: runs one peer's command (the one `commands.build_commands` builds, as the local launcher runs it) with
  its output in `<run_dir>/logs/<id>.log`, then writes the exit code to `<run_dir>/slurm/<id>.exit` (JSON) and, if it
  is not 0, raises, so that the job ends FAILED. With `slurm.nodes > 1` (accelerate peers only) it runs on every node
  of the job with accelerate's `--num_machines/--machine_rank/--main_process_ip` added; nodes other than the first
  write `<id>.node<K>.log` and `<id>.node<K>.exit`. A peer with a `vllm_server:` block (`ServerJob`) has its server
  started first on the job's first node, on the job's GPUs at the block's positions (the peer gets the others); the
  peer starts once the server's /health answers, and the server stops when the peer ends (SIGTERM to its process
  group, SIGKILL after a grace), or with the job. A server whose port is taken on the node, that exits first or never
  answers fails the job: the reason (and the server's last log lines) in the peer's log, the reason in the exit
  file's `error`.
* `RedisJob`: starts `redis-server` (config file mode 0600: the password never appears on a command line), waits until
  it answers, writes its address to `<run_dir>/slurm/redis.json` for the launcher, then serves until the launcher
  cancels the job. The peers get an ACL user (`redis_acl`) that can run only what their transport runs, on the
  swarm's stream only: no member can lock the others out (`CONFIG SET requirepass`, `CLIENT KILL`), flush the
  server or read anything else. With a password the default user is off; nobody holds an admin login (the launcher
  stops the server by cancelling its job).

The launcher reads these files, never submitit's result pickles (without SLURM accounting, submitit cannot tell a
cancelled job from a running one). submitit is only imported inside a job, where it runs. What this module imports
from trl_ftis (`files`, `rules`, `commands`, `processes`, `vllm_servers`) adds nothing that unpickling a job does
not load already: that imports the `trl_ftis` package (torch, through `trl_ftis.objective`) and the
`trl_ftis.launcher` package first.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...json_files import write_json_atomic
from ...shared_names import REDIS_PASSWORD_ENV
from ..commands import free_port, open_private, redact_argv
from ..processes import ProcessTracker, die_with_parent
from ..vllm_servers import health_answers, log_tail, port_problem

if TYPE_CHECKING:
    from ..vllm_servers import ServerCommand

__all__ = [
    "REDIS_PEER_COMMANDS",
    "REDIS_USER",
    "PeerFailedError",
    "PeerJob",
    "RedisJob",
    "ServerJob",
    "answers_ping",
    "ipv4_addresses",
    "redis_acl",
    "split_gpus",
]

REDIS_USER = "ftis"  # the peers' ACL user on the launcher's Redis job (when it has a password)
# What the peers' transport runs (exchange/transports/redis_streams.py): PING when it connects, XADD (with MAXLEN
# trimming) to publish, XREAD to poll and wait, XDEL to prune its own entries. AUTH is always allowed; redis-py's
# CLIENT SETINFO at connect is refused, which it ignores.
# time and xinfo|stream: a publish asks for an id of the server's clock, and reads the stream's last id when that
# fails; xrevrange and xsetid: a publish that finds ids more than a day ahead of the clock repairs the stream.
REDIS_PEER_COMMANDS = ("ping", "xadd", "xread", "xdel", "time", "xinfo|stream", "xrevrange", "xsetid")


def _node_layout() -> tuple[int, int, list[str], str]:
    """(node rank, number of nodes, host names, job id) of this task of the job."""
    try:
        import submitit

        env = submitit.JobEnvironment()
        return env.node, env.num_nodes, list(env.hostnames), str(env.job_id)
    except Exception:  # noqa: BLE001 - not under submitit (the job called by hand): SLURM's variables
        return (
            int(os.environ.get("SLURM_NODEID", "0")),
            int(os.environ.get("SLURM_JOB_NUM_NODES", "1")),
            [socket.gethostname()],
            os.environ.get("SLURM_JOB_ID", "?"),
        )


def _set_handler(signum: int, handler):
    """`signal.signal` where possible (the main thread; a test may call a job from another): the previous handler."""
    try:
        return signal.signal(signum, handler)
    except ValueError:
        return None


def _conf_word(text: str) -> str:
    """`text` as one double-quoted word of redis.conf (which unescapes \\, \", \n and \r in quotes)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def redis_acl(swarm: str, password: str | None) -> list[str]:
    """The redis.conf lines of the peers' user: `REDIS_USER` with `password` (the default user off), or the default
    user without one (`redis.password: false`: no login at all). Either way it may run `REDIS_PEER_COMMANDS` only, on
    the keys `ftis:<swarm>*` only (the transport's stream, `ftis:<swarm>`), and no pub/sub channel."""
    rights = f"resetkeys ~ftis:{swarm}* resetchannels -@all " + " ".join(f"+{c}" for c in REDIS_PEER_COMMANDS)
    if password is None:
        return [f"user default reset on nopass {rights}"]
    return ["user default reset off", f"user {REDIS_USER} reset on {_conf_word('>' + password)} {rights}"]


def _read_secret(path: str | None) -> str | None:
    if not path:
        return None
    return Path(path).read_text(encoding="utf-8").strip() or None


class PeerFailedError(RuntimeError):
    """The peer's command exited non-zero (raised so that SLURM records the job as FAILED)."""


# --------------------------------------------------------------------------------------------------------------------
# A peer's vLLM server, inside the peer's job
# --------------------------------------------------------------------------------------------------------------------

SERVER_FAILED_CODE = 1  # a job's exit code when its peer's vLLM server failed to come up (the peer never ran)


def split_gpus(positions: str, job_devices: str | None, job_gpus: int = 0) -> tuple[str, str | None]:
    """(the server's CUDA_VISIBLE_DEVICES, the peer's) for a server on the job's GPUs at `positions` ("3", "0,1").

    `job_devices` is the job's CUDA_VISIBLE_DEVICES (SLURM sets it); unset, the job's GPUs are 0 .. `job_gpus`-1
    (its `slurm.gpus`), and with neither the positions are the device ids themselves and the peer's devices are
    left as they are (None). The peer gets every job GPU the server does not. ValueError for a position that is no
    GPU of the job, naming the key and the GPUs."""
    wanted = [item.strip() for item in positions.split(",") if item.strip()]
    not_positions = [item for item in wanted if not item.isdigit()]
    if not_positions:
        raise ValueError(
            f"`vllm_server.gpus` {positions!r}: on SLURM these are positions among the job's GPUs (0, 1, ...), not "
            f"device ids ({', '.join(not_positions)})"
        )
    if job_devices is None and not job_gpus:
        return ",".join(wanted), None
    if job_devices is None:
        devices = [str(i) for i in range(job_gpus)]
        source = f"{job_gpus} GPU(s) (`slurm.gpus`; the job has no CUDA_VISIBLE_DEVICES)"
    else:
        devices = [item.strip() for item in job_devices.split(",") if item.strip()]
        source = f"{len(devices)} GPU(s) (CUDA_VISIBLE_DEVICES={job_devices!r})"
    outside = [item for item in wanted if int(item) >= len(devices)]
    if outside:
        room = f"positions 0 to {len(devices) - 1}" if devices else "no position"
        raise ValueError(
            f"`vllm_server.gpus` {positions!r}: position {', '.join(outside)} is not one of the job's {source}: "
            f"{room}; ask for more GPUs per node with `slurm.gpus`"
        )
    chosen = [int(item) for item in wanted]
    return ",".join(devices[i] for i in chosen), ",".join(d for i, d in enumerate(devices) if i not in chosen)


@dataclass
class ServerJob:
    """A peer's vLLM server (`vllm_server:`), which its `PeerJob` runs on the job's first node before the peer."""

    argv: list[str]
    env: dict[str, str]  # additions to the job's environment (CUDA_VISIBLE_DEVICES comes from `split_gpus`)
    cwd: str
    log_path: str
    host: str
    port: int
    group_port: int
    gpus: str  # positions among the job's GPUs
    health_url: str
    ready_timeout: float
    job_gpus: int = 0  # the job's `slurm.gpus`: its GPUs where SLURM sets no CUDA_VISIBLE_DEVICES
    stop_grace: float = 10.0  # seconds between SIGTERM and SIGKILL when it stops
    poll: float = 0.25  # seconds between health checks

    @classmethod
    def of(cls, command: ServerCommand, job_gpus: int | None) -> ServerJob:
        """The job's part of `command` (`commands.build_commands` built it with `visible_devices=False`)."""
        return cls(
            argv=list(command.argv),
            env={k: v for k, v in command.env.items() if k != "CUDA_VISIBLE_DEVICES"},
            cwd=str(command.cwd),
            log_path=str(command.log_path),
            host=command.host,
            port=command.port,
            group_port=command.group_port,
            gpus=command.gpus,
            health_url=command.health_url,
            ready_timeout=command.ready_timeout,
            job_gpus=job_gpus or 0,
        )


class ServerFailedError(Exception):
    """The server could not come up: `reason` (naming the peer), the job's exit `code`, `tail`: show its log."""

    def __init__(self, reason: str, code: int = SERVER_FAILED_CODE, tail: bool = False):
        super().__init__(reason)
        self.reason, self.code, self.tail = reason, code, tail


class _ServerRun:
    """One run of a `ServerJob` in a job: `start` (ports checked first), `wait_ready`, `stop` (all it started)."""

    def __init__(self, spec: ServerJob, peer_id: str, say):
        self.spec, self.peer_id, self.say = spec, peer_id, say
        self.what = f"the vLLM server of peer {peer_id}"
        self.node = socket.gethostname()
        self.proc: subprocess.Popen | None = None
        self.tracker = ProcessTracker()  # its process group, and whatever it started in other sessions
        self.stopping = False  # SIGTERM: stop waiting
        self.stopped = False

    def start(self, environ: dict[str, str]) -> str | None:
        """Check its ports, then start it on its GPUs; returns the peer's CUDA_VISIBLE_DEVICES (None: as it is)."""
        spec = self.spec
        try:
            server_gpus, peer_gpus = split_gpus(spec.gpus, environ.get("CUDA_VISIBLE_DEVICES"), spec.job_gpus)
        except ValueError as exc:
            raise ServerFailedError(f"{self.what}: {exc}") from None
        for key, port in (("port", spec.port), ("group_port", spec.group_port)):
            problem = port_problem(spec.host, port)
            if problem:
                raise ServerFailedError(
                    f"{self.what}: its {'weight-sync ' if key == 'group_port' else ''}port {port} "
                    f"(`vllm_server.{key}`) is not free on {spec.host} on node {self.node}: {problem}; set a free "
                    f"one in `vllm_server.{key}`, or leave it out and launch again to draw another"
                )
        env = dict(environ)
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = server_gpus
        peer_part = "its devices as they are" if peer_gpus is None else f"CUDA_VISIBLE_DEVICES={peer_gpus!r}"
        self.say(
            f"starting {self.what} on node {self.node} with CUDA_VISIBLE_DEVICES={server_gpus!r} (`vllm_server.gpus` "
            f"{spec.gpus!r}: positions among the job's GPUs; the peer gets {peer_part}); log {spec.log_path}: "
            f"{shlex.join(redact_argv(spec.argv))}"
        )
        with open_private(spec.log_path, "ab", buffering=0) as log:
            try:
                self.proc = subprocess.Popen(
                    spec.argv,
                    cwd=spec.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stopped as a whole
                    preexec_fn=die_with_parent(),  # SIGTERM if the job's process is killed outright
                )
            except OSError as exc:
                raise ServerFailedError(
                    f"{self.what}: could not start {spec.argv[0]}: {exc.strerror or exc}"
                ) from None
        self.tracker.add_peer(self.proc.pid, f"{self.peer_id} (vLLM server)")
        return peer_gpus

    def wait_ready(self) -> float:
        """Seconds until its health URL answered; ServerFailedError if it exits, times out or the job is stopped."""
        spec, proc = self.spec, self.proc
        assert proc is not None
        self.say(f"waiting up to {spec.ready_timeout:g}s until {spec.health_url} answers")
        started = time.monotonic()
        deadline = started + spec.ready_timeout
        while True:
            if self.stopping:
                raise ServerFailedError(f"stopped (SIGTERM) while waiting for {self.what}", code=-signal.SIGTERM)
            code = proc.poll()
            if code is not None:
                raise ServerFailedError(
                    f"{self.what} exited with code {code} before it answered at {spec.health_url}", tail=True
                )
            timeout = min(2.0, max(0.1, deadline - time.monotonic()))
            if health_answers(spec.health_url, timeout) and proc.poll() is None:  # its own answer, not another's
                return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise ServerFailedError(
                    f"{self.what} did not answer at {spec.health_url} within {spec.ready_timeout:g}s "
                    "(`vllm_server.ready_timeout`)",
                    tail=True,
                )
            time.sleep(spec.poll)

    def log_tail(self) -> list[str]:
        lines = [line for line in log_tail(self.spec.log_path, 16384).splitlines() if line.strip()]
        return [f"[vllm {self.peer_id}] {line}" for line in lines[-20:]]

    def terminate(self) -> None:
        """SIGTERM to its process group (a signal handler: no waiting)."""
        self.stopping = True
        if self.proc is not None and not self.stopped:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, peer_ran: bool) -> None:
        """SIGTERM to it and all it started, SIGKILL to what is left after `stop_grace` seconds; once."""
        if self.proc is None or self.stopped:
            return
        early = self.proc.poll()
        self.tracker.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.spec.stop_grace
        while self.tracker.alive() and time.monotonic() < deadline:  # an exited process not yet reaped counts as gone
            time.sleep(0.1)
        if self.tracker.alive():
            self.say(f"{self.what} still runs {self.spec.stop_grace:g}s after SIGTERM: SIGKILL")
            self.tracker.signal_all(signal.SIGKILL)
        code = self.proc.wait()
        self.stopped = True
        if early is None:
            self.say(f"stopped {self.what} (exit code {code})")
        elif peer_ran:  # (one that exited before it answered is reported as the job's failure)
            self.say(f"{self.what} exited with code {early} while the peer ran; its log: {self.spec.log_path}")


@dataclass
class PeerJob:
    """One peer's job. Pickled by submitit into `<run_dir>/slurm/<id>/` (a directory only its owner can read)."""

    peer_id: str
    argv: list[str]
    env: dict[str, str]  # additions to the job's environment (sbatch exports the launcher's own environment)
    cwd: str
    log_path: str
    exit_path: str
    secret_path: str | None = None  # the Redis password file (the launcher's Redis job), read here, never pickled
    nodes: int = 1
    server: ServerJob | None = None  # its vLLM server: started first, on the first node only, stopped after it

    def _per_node(self, path: str, rank: int, suffix: str) -> str:
        if rank == 0:
            return path
        return f"{path.removesuffix(suffix)}.node{rank}{suffix}"

    def command(self, rank: int, num_nodes: int, hosts: list[str]) -> list[str]:
        """The argv for node `rank`: accelerate peers on several nodes get accelerate's multi-machine options."""
        argv = list(self.argv)
        if num_nodes > 1 and "accelerate.commands.launch" in argv:
            at = argv.index("accelerate.commands.launch") + 1
            argv[at:at] = [
                "--num_machines", str(num_nodes),
                "--machine_rank", str(rank),
                "--main_process_ip", hosts[0],
            ]  # fmt: skip
        return argv

    def __call__(self) -> int:
        rank, num_nodes, hosts, job_id = _node_layout()
        log_path = self._per_node(self.log_path, rank, ".log")
        exit_path = self._per_node(self.exit_path, rank, ".exit")
        env = dict(os.environ)
        env.update(self.env)
        secret = _read_secret(self.secret_path)
        if secret is not None:
            env[REDIS_PASSWORD_ENV] = secret
        argv = self.command(rank, num_nodes, hosts)
        started = time.time()
        # Appended, never truncated: the launcher emptied the log before submitting, and a requeued job keeps it.
        # Owner only (a node's own log is created here): a peer may print a secret.
        with open_private(log_path, "ab", buffering=0) as log:

            def say(text: str) -> None:
                log.write(f"[trl-ftis slurm job {job_id}] {text}\n".encode())

            server = _ServerRun(self.server, self.peer_id, say) if self.server is not None and rank == 0 else None
            peer: list[subprocess.Popen] = []
            stop: list[int] = []

            def forward(signum, frame):  # scancel signals every process of the step; forward in case it did not
                stop.append(signum)
                if peer and peer[0].poll() is None:
                    peer[0].send_signal(signum)
                if server is not None:
                    server.terminate()

            # SLURM sends SIGUSR2 to the job's processes 90 s before its time limit (submitit's --signal); Python's
            # default would kill the peer then. The peer and its server ignore it (inherited across exec) and run
            # to the limit.
            previous = [
                (sig, _set_handler(sig, h)) for sig, h in ((signal.SIGTERM, forward), (signal.SIGUSR2, signal.SIG_IGN))
            ]
            try:
                code, error = self._run(argv, env, log, say, server, peer, stop, job_id)
            finally:
                if server is not None:  # before the exit file: once it is there, nothing of the job runs
                    server.stop(peer_ran=bool(peer))
                for sig, handler in previous:
                    _set_handler(sig, handler if handler is not None else signal.SIG_DFL)
        result = {"exit_code": code, "job_id": job_id, "rank": rank, "host": socket.gethostname()}
        result["wall_time_s"] = round(time.time() - started, 3)
        if error is not None:
            result["error"] = error
        write_json_atomic(exit_path, result)
        if code != 0:
            raise PeerFailedError(
                f"peer {self.peer_id}: {error}" if error else f"peer {self.peer_id} exited with code {code}"
            )
        return code

    def _run(self, argv, env, log, say, server: _ServerRun | None, peer: list, stop: list, job_id: str):
        """The server (if any, until it answers), then the peer until it exits: (exit code, error or None)."""
        if server is not None:
            try:
                devices = server.start(os.environ)
                waited = server.wait_ready()
            except ServerFailedError as exc:
                if exc.tail:
                    say(f"{exc.reason}; the last lines of its log ({server.spec.log_path}):")
                    log.write("".join(line + "\n" for line in server.log_tail()).encode())
                else:
                    say(exc.reason)
                return exc.code, exc.reason
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices
            say(f"{server.what} answers at {server.spec.health_url} after {waited:.1f}s; starting the peer")
        if stop:
            say("stopped (SIGTERM) before the peer started")
            return -stop[0], "stopped (SIGTERM) before the peer started"
        try:
            peer.append(
                subprocess.Popen(
                    argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            )
        except OSError as exc:
            say(f"could not start {argv[0]}: {exc}")
            return 127, f"could not start {argv[0]}: {exc}"

        def time_limit(signum, frame):  # replaces submitit's requeue handler (a peer is not checkpointable)
            log.write(f"[trl-ftis] SLURM job {job_id} reaches its time limit in about 90 s\n".encode())

        _set_handler(signal.SIGUSR2, time_limit)
        if stop and peer[0].poll() is None:  # SIGTERM came while it started
            peer[0].send_signal(stop[0])
        return peer[0].wait(), None


def ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback (Linux: every interface; elsewhere: what its name resolves
    to)."""
    found: list[str] = []
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                except OSError:
                    continue
                found.append(socket.inet_ntoa(packed[20:24]))
    except (ImportError, OSError, AttributeError):
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.append(info[4][0])
    except OSError:
        pass
    unique = []
    for address in found:
        if not address.startswith("127.") and address not in unique:
            unique.append(address)
    return unique


def answers_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """A raw RESP PING (no redis-py needed); `-NOAUTH` counts: the server is up, it wants the password."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


@dataclass
class RedisJob:
    """The exchange's Redis server, one job. Its address goes to `address_path` once it answers PING."""

    server: str
    port: int
    directory: str  # config file and working directory (<run_dir>/slurm/redis)
    log_path: str
    address_path: str
    secret_path: str | None = None
    start_timeout: float = 120.0
    extra_config: list[str] = field(default_factory=list)
    swarm: str = "default"  # the peers' `?swarm=`: their stream is `ftis:<swarm>`, all their ACL user may touch

    def __call__(self) -> int:
        _, _, _, job_id = _node_layout()
        host = socket.gethostname()
        directory = Path(self.directory)
        directory.mkdir(parents=True, exist_ok=True)
        port = self.port or free_port()
        password = _read_secret(self.secret_path)
        lines = [
            f"port {port}",
            "bind 0.0.0.0",  # peers on other nodes connect to this node's address
            # Without a password a server bound to every interface would refuse them all: the config asked for none
            # (the ACL below still limits what anyone can do).
            "protected-mode no",
            'save ""',
            "appendonly no",
            f"dir {directory}",
            "daemonize no",
            *self.extra_config,
            *redis_acl(self.swarm, password),
        ]
        conf = directory / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        os.chmod(conf, 0o600)

        def fail(message: str) -> None:
            write_json_atomic(self.address_path, {"error": message, "job_id": job_id, "host": host})
            raise RuntimeError(message)

        with open_private(self.log_path, "ab", buffering=0) as log:
            argv = [*shlex.split(self.server), str(conf)]
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            except OSError as exc:
                fail(
                    f"cannot run {self.server!r} on {host}: {exc.strerror or exc} (install Redis on the nodes, or set "
                    "`redis.server` to its path, or load it with `redis.setup`)"
                )
            _set_handler(signal.SIGTERM, lambda signum, frame: proc.terminate())
            deadline = time.monotonic() + self.start_timeout
            while not answers_ping("127.0.0.1", port):
                if proc.poll() is not None:
                    fail(
                        f"{self.server} exited with code {proc.returncode} on {host}; see {self.log_path} (the "
                        "launcher's Redis job needs redis-server >= 6, for its ACL user)"
                    )
                if time.monotonic() > deadline:
                    proc.kill()
                    fail(f"{self.server} did not answer on port {port} within {self.start_timeout:g}s on {host}")
                time.sleep(0.1)
            try:
                fqdn = socket.getfqdn()
            except OSError:
                fqdn = host
            write_json_atomic(
                self.address_path,
                {
                    "host": host,
                    "fqdn": fqdn,
                    "addresses": ipv4_addresses(),
                    "port": port,
                    "job_id": job_id,
                    "password": password is not None,
                    "user": REDIS_USER if password is not None else None,
                    "swarm": self.swarm,
                },
            )
            code = proc.wait()
        if code not in (0, -signal.SIGTERM):
            raise RuntimeError(f"{self.server} exited with code {code}")
        return 0
