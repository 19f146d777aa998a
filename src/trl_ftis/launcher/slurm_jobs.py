"""What runs inside the SLURM jobs `launcher/slurm.py` submits: the callables submitit pickles and its worker calls.

* `PeerJob`: runs one peer's command (the one `commands.build_commands` builds, as the local launcher runs it) with
  its output in `<run_dir>/logs/<id>.log`, then writes the exit code to `<run_dir>/slurm/<id>.exit` (JSON) and, if it
  is not 0, raises, so that the job ends FAILED. With `slurm.nodes > 1` (accelerate peers only) it runs on every node
  of the job with accelerate's `--num_machines/--machine_rank/--main_process_ip` added; nodes other than the first
  write `<id>.node<K>.log` and `<id>.node<K>.exit`.
* `RedisJob`: starts `redis-server` (config file mode 0600: the password never appears on a command line), waits until
  it answers, writes its address to `<run_dir>/slurm/redis.json` for the launcher, then serves until the launcher
  cancels the job. The peers get an ACL user (`redis_acl`) that can run only what their transport runs, on the
  swarm's stream only: no member can lock the others out (`CONFIG SET requirepass`, `CLIENT KILL`), flush the
  server or read anything else. With a password the default user is off; nobody holds an admin login (the launcher
  stops the server by cancelling its job).

The launcher reads these files, never submitit's result pickles (without SLURM accounting, submitit cannot tell a
cancelled job from a running one). submitit is only imported inside a job, where it runs. What this module imports
from trl_ftis (`files`, `rules`, `commands.free_port`) adds nothing that unpickling a job does not load already: that
imports the `trl_ftis` package (torch, through `trl_ftis.objective`) and the `trl_ftis.launcher` package first.
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

from ..files import write_json_atomic
from ..rules import REDIS_PASSWORD_ENV
from .commands import free_port, open_private

__all__ = [
    "REDIS_PEER_COMMANDS",
    "REDIS_USER",
    "PeerFailedError",
    "PeerJob",
    "RedisJob",
    "answers_ping",
    "ipv4_addresses",
    "redis_acl",
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
            # SLURM sends SIGUSR2 to the job's processes 90 s before its time limit (submitit's --signal); Python's
            # default would kill the peer then. The peer ignores it (inherited across exec) and runs to the limit.
            previous = _set_handler(signal.SIGUSR2, signal.SIG_IGN)
            try:
                proc = subprocess.Popen(
                    argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            except OSError as exc:
                log.write(f"[trl-ftis slurm job {job_id}] could not start {argv[0]}: {exc}\n".encode())
                write_json_atomic(exit_path, {"exit_code": 127, "error": str(exc), "job_id": job_id, "rank": rank})
                raise PeerFailedError(f"peer {self.peer_id}: could not start: {exc}") from exc
            finally:
                _set_handler(signal.SIGUSR2, previous if previous is not None else signal.SIG_DFL)

            def forward(signum, frame):  # scancel signals every process of the step; forward in case it did not
                if proc.poll() is None:
                    proc.send_signal(signum)

            def time_limit(signum, frame):  # replaces submitit's requeue handler (a peer is not checkpointable)
                log.write(f"[trl-ftis] SLURM job {job_id} reaches its time limit in about 90 s\n".encode())

            _set_handler(signal.SIGTERM, forward)
            _set_handler(signal.SIGUSR2, time_limit)
            code = proc.wait()
        write_json_atomic(
            exit_path,
            {
                "exit_code": code,
                "job_id": job_id,
                "rank": rank,
                "host": socket.gethostname(),
                "wall_time_s": round(time.time() - started, 3),
            },
        )
        if code != 0:
            raise PeerFailedError(f"peer {self.peer_id} exited with code {code}")
        return code


def ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback (Linux: every interface; elsewhere: what its name resolves to)."""
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
