"""A throwaway single-node SLURM cluster on localhost for tests, and the session-scoped `slurm_cluster` fixture.

`start_slurm_cluster(base_dir)` starts `munged`, `slurmctld` and `slurmd` (Debian's `munge` and `slurm-wlm`) as plain
background daemons, without systemd, as root, with everything (config, state, spool, logs, pid files, the munge key
and socket) under `base_dir` and the daemons on free TCP ports: it touches nothing of a SLURM or munge the machine may
run already. It returns a `SlurmCluster` once a trivial `srun` step runs; `cluster.stop()` cancels every job, waits for
them, then stops the daemons by their pids. When the packages are missing it installs them with apt-get (as root,
unless `FTIS_TEST_SLURM_INSTALL=0`). It raises `SlurmUnavailable` with the reason when any of this is impossible
(not root, no apt, a daemon that does not come up: the reason quotes its log).

The `slurm_cluster` fixture uses `$FTIS_TEST_SLURM_CONF` when set (an existing cluster: the tests then only submit and
cancel their own jobs), else starts one for the session; when neither works, the tests that use it are skipped with
"SLURM could not be started: <reason>". It sets `SLURM_CONF` in `os.environ` for the session (every SLURM client,
the launcher included, needs it) and restores it afterwards. `FTIS_TEST_SLURM_KEEP=1` keeps the cluster's directory
(logs) after the session.

Written from the findings of `shared/tools/slurm-local` (Debian 12, slurm-wlm 22.05, munge 0.5.15):

* apt's postinst would start the daemons through /etc/init.d: a temporary /usr/sbin/policy-rc.d (exit 101) stops it.
* munged refuses a socket directory that is not executable by all: the socket directory is mode 755.
* No accounting (no slurmdbd): `sacct` fails, so the launcher must not need it (it polls squeue/scontrol).
* Batch jobs are otherwise scheduled every 3 s at best: `batch_sched_delay=0`; the first job after a start still waits
  a few seconds.
* submitit's job processes ignore SIGTERM, so `scancel` waits KillWait seconds before SIGKILL: KillWait=5.
* slurmctld stopped while a job step is still ending leaves a `slurmstepd` behind: jobs are cancelled and waited for
  first, leftover task pids (`scontrol listpids`) killed, then slurmd, slurmctld, munged are stopped in that order.
* An exiting daemon is a zombie for a moment: stopping waits for the pid to be gone or a zombie.
* With munged down every client retries for about 50 s: munge is checked first, and every call has a timeout.
* Every client needs SLURM_CONF (the config is not in /etc/slurm); sbatch exports it into the jobs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGES = ("slurm-wlm", "munge")
NEEDED = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo", "munged", "munge")
PARTITION = "debug"
NODE_CPUS = 8  # more than the machine has (config_overrides): a test swarm's jobs never wait for each other


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here (the message says why)."""


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def _tail(path: Path, size: int = 800) -> str:
    try:
        return path.read_bytes()[-size:].decode("utf-8", "replace").strip() or "(empty)"
    except OSError:
        return "(no log)"


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _install_packages() -> None:
    if os.environ.get("FTIS_TEST_SLURM_INSTALL", "1") == "0":
        raise SlurmUnavailable(f"{', '.join(PACKAGES)} not installed and FTIS_TEST_SLURM_INSTALL=0")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"{', '.join(PACKAGES)} not installed and no apt-get to install them")
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = False
    if not policy.exists():  # no systemd here: keep the packages' postinst from starting the system's daemons
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        made_policy = True
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    try:
        result = subprocess.run(install, env=env, check=False, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:  # maybe only the package lists are missing or stale
            subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, capture_output=True, timeout=300)
            result = subprocess.run(install, env=env, check=False, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"apt-get timed out installing {', '.join(PACKAGES)}") from exc
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    if result.returncode != 0:
        raise SlurmUnavailable(
            f"apt-get install {' '.join(PACKAGES)} failed: {(result.stderr or result.stdout)[-400:]}"
        )


@dataclass
class SlurmCluster:
    """A running test cluster: `conf` is its SLURM_CONF; `env` the environment every client needs."""

    base: Path
    conf: Path
    node: str
    partition: str = PARTITION
    pids: dict[str, int] = field(default_factory=dict)  # daemon name -> pid (what `stop` stops)
    started: bool = True  # False for an external cluster ($FTIS_TEST_SLURM_CONF): never stopped by us

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, check=False, capture_output=True, text=True, timeout=timeout)

    def jobs(self, name_contains: str = "") -> list[tuple[str, str, str]]:
        """(job id, name, state) of every job still known to slurmctld that is not finished, optionally only those
        whose name contains `name_contains`."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T").stdout
        rows = [tuple(line.split("|", 2)) for line in out.splitlines() if line.count("|") == 2]
        return [row for row in rows if name_contains in row[1]]

    def wait_no_jobs(self, name_contains: str = "", timeout: float = 60.0) -> list[tuple[str, str, str]]:
        """Wait until no unfinished job (whose name contains `name_contains`) is left; return what is left."""
        deadline = time.monotonic() + timeout
        left = self.jobs(name_contains)
        while left and time.monotonic() < deadline:
            time.sleep(0.25)
            left = self.jobs(name_contains)
        return left

    def stop(self) -> None:
        if not self.started:
            return
        try:
            if self.pids.get("slurmctld") and not _pid_gone(self.pids["slurmctld"]):
                self.run("scancel", "--full", "--quiet", *[job for job, _, _ in self.jobs()], timeout=30)
                self.wait_no_jobs(timeout=30)  # KillWait=5 and some margin
                listed = self.run("scontrol", "listpids", timeout=15).stdout.split("\n")[1:]
                for line in listed:
                    fields = line.split()
                    if fields and fields[0].isdigit():
                        try:
                            os.kill(int(fields[0]), signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        except (OSError, subprocess.SubprocessError):
            pass
        for name in ("slurmd", "slurmctld", "munged"):  # the compute node first, munge last
            pid = self.pids.pop(name, None)
            if pid is None or _pid_gone(pid):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 20
            while not _pid_gone(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _pid_gone(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if os.environ.get("FTIS_TEST_SLURM_KEEP") != "1":
            shutil.rmtree(self.base, ignore_errors=True)


def _wait(predicate, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(step)


def _start_daemon(argv: list[str], pid_file: Path, log: Path, env: dict[str, str], what: str) -> int:
    """Run a daemon that forks into the background and writes `pid_file`; return its pid."""
    try:
        result = subprocess.run(
            argv,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"{what} could not be started: {exc}") from exc
    if result.returncode != 0:
        raise SlurmUnavailable(
            f"{what} exited with code {result.returncode}: {(result.stderr or result.stdout).strip()[-400:]}; "
            f"log: {_tail(log)}"
        )
    if not _wait(lambda: pid_file.is_file() and pid_file.read_text().strip().isdigit(), 10, 0.05):
        raise SlurmUnavailable(f"{what} wrote no pid file {pid_file}; log: {_tail(log)}")
    return int(pid_file.read_text().strip())


def start_slurm_cluster(base_dir: str | os.PathLike | None = None, *, cpus: int = NODE_CPUS) -> SlurmCluster:
    """Start munged, slurmctld and slurmd on localhost; return the running cluster. Raises SlurmUnavailable."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise SlurmUnavailable("the test cluster's daemons must run as root (SlurmUser=root), and this is not root")
    missing = [name for name in NEEDED if shutil.which(name) is None]
    if missing:
        _install_packages()
        missing = [name for name in NEEDED if shutil.which(name) is None]
        if missing:
            raise SlurmUnavailable(f"still missing after installing {', '.join(PACKAGES)}: {', '.join(missing)}")

    base = Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="ftis-slurm-"))
    for sub in ("state", "spool", "log", "run", "munge"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for directory in (base, base / "munge"):
        directory.chmod(0o755)  # munged: "execute permissions for all required" on its socket directory
    node = socket.gethostname().split(".")[0] or "localhost"
    cluster = SlurmCluster(base=base, conf=base / "slurm.conf", node=node)
    env = {**os.environ, "SLURM_CONF": str(cluster.conf)}
    try:
        # ---- munge: its own key, socket and pid file, so a system munged (if any) is left alone
        key, sock = base / "munge" / "munge.key", base / "munge" / "munge.socket"
        if shutil.which("mungekey"):
            subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--bits=1024"], check=True, timeout=30)
        else:
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        cluster.pids["munged"] = _start_daemon(
            [
                "munged",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={base / 'munge' / 'munged.pid'}",
                f"--log-file={base / 'log' / 'munged.log'}",
                f"--seed-file={base / 'munge' / 'munged.seed'}",
            ],
            base / "munge" / "munged.pid",
            base / "log" / "munged.log",
            env,
            "munged",
        )

        def munge_ok() -> bool:
            try:
                token = subprocess.run(["munge", "-n", "-S", str(sock)], check=False, capture_output=True, timeout=5)
                return (
                    token.returncode == 0
                    and subprocess.run(
                        ["unmunge", "-S", str(sock)], check=False, input=token.stdout, capture_output=True, timeout=5
                    ).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                return False

        if not _wait(munge_ok, 10):
            raise SlurmUnavailable(f"munged does not answer on {sock}; log: {_tail(base / 'log' / 'munged.log')}")

        # ---- slurm.conf
        ctld_port, slurmd_port = _free_ports(2)
        probe = subprocess.run(["slurmd", "-C"], check=False, capture_output=True, text=True, timeout=30, env=env)
        memory = next((f.split("=", 1)[1] for f in probe.stdout.split() if f.startswith("RealMemory=")), "1000")
        cluster.conf.write_text(
            f"""# written by tests/launcher/slurm_cluster.py
ClusterName=ftistest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={base / "state"}
SlurmdSpoolDir={base / "spool"}
SlurmctldPidFile={base / "run" / "slurmctld.pid"}
SlurmdPidFile={base / "run" / "slurmd.pid"}
SlurmctldLogFile={base / "log" / "slurmctld.log"}
SlurmdLogFile={base / "log" / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={base / "log" / "jobcomp.txt"}
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=300
SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
        )

        # ---- slurmctld, slurmd
        cluster.pids["slurmctld"] = _start_daemon(
            ["slurmctld", "-f", str(cluster.conf)],
            base / "run" / "slurmctld.pid",
            base / "log" / "slurmctld.log",
            env,
            "slurmctld",
        )
        cluster.pids["slurmd"] = _start_daemon(
            ["slurmd", "-f", str(cluster.conf), "-N", node],
            base / "run" / "slurmd.pid",
            base / "log" / "slurmd.log",
            env,
            "slurmd",
        )

        def node_ready() -> bool:
            try:
                state = cluster.run("sinfo", "-h", "-n", node, "-o", "%T", timeout=15).stdout.strip()
            except subprocess.TimeoutExpired:
                return False
            return state.rstrip("*") in ("idle", "mixed", "allocated", "completing")

        if not _wait(node_ready, 30):
            cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
            if not _wait(node_ready, 30):
                raise SlurmUnavailable(
                    f"node {node} not usable; slurmctld log: {_tail(base / 'log' / 'slurmctld.log')}; "
                    f"slurmd log: {_tail(base / 'log' / 'slurmd.log')}"
                )
        smoke = cluster.run("srun", "--quiet", "-N1", "-n1", "-t", "1", "-J", "ftis-smoke", "true", timeout=60)
        if smoke.returncode != 0:
            raise SlurmUnavailable(f"a trivial srun step failed: {smoke.stderr.strip()[-400:]}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A SLURM cluster for the session (external via FTIS_TEST_SLURM_CONF, else a local one); skips without one."""
    external = os.environ.get("FTIS_TEST_SLURM_CONF")
    if external:
        cluster = SlurmCluster(base=Path(external).parent, conf=Path(external), node="", started=False)
        partition = os.environ.get("FTIS_TEST_SLURM_PARTITION")
        if partition:
            cluster.partition = partition
    else:
        started = time.monotonic()
        try:
            cluster = start_slurm_cluster()
        except SlurmUnavailable as exc:
            pytest.skip(f"SLURM could not be started: {exc}")
        print(f"\n[slurm_cluster] started in {time.monotonic() - started:.1f}s: SLURM_CONF={cluster.conf}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        cluster.stop()
