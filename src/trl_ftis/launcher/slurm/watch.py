"""Following the SLURM backend's submitted jobs (`slurm.SlurmBackend`): what each job is (`SlurmJob`), the exit
files its peer writes (`<run_dir>/slurm/<id>.exit`, and `<id>.node<K>.exit` on a multi-node peer's other nodes),
the states `squeue` and `scontrol` show, and what they mean for the swarm (`JobWatch`): a peer that finished, one
that failed, a job that ended before its peer reported an exit code.

`sacct` is never needed, so clusters without accounting work. The backend submits the jobs and stops them; this
module only reads what they left and decides each one's outcome.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..backend import Console, Outcome, PeerState
from ..restart import restart_command
from ..summary import describe_code
from ..swarm_config import SwarmConfig
from .cli import job_outcome, squeue
from .schema import SlurmResources

__all__ = ["TERMINAL_STATES", "JobWatch", "SlurmJob", "exit_path", "node_exit_paths", "read_exit_code"]

# States in which a job no longer runs (squeue -t all lists them for MinJobAge seconds, then forgets the job).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# A peer's non-zero exit during one of these is the job's doing: the summary and the console name the state.
JOB_CAUSED_STATES = ("TIMEOUT", "DEADLINE", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY")


@dataclass
class SlurmJob(PeerState):
    """One submitted job: a peer's (`command` set) or the Redis job's (`command` None)."""

    name: str = ""
    resources: SlurmResources = field(default_factory=SlurmResources)
    status: str = "not submitted"
    job_id: str | None = None
    state: str | None = None  # last state squeue showed
    node: str | None = None
    reason: str | None = None
    submitted: float | None = None  # time.monotonic()
    folder: Path | None = None  # submitit's folder for it (batch script, the job's stdout/stderr)
    # `started`: time.monotonic() when first seen RUNNING (summary: wall time); `started_at`: the log's mtime at
    # submission (summary: a peer summary file older than this is stale); `pid` stays None (no local process).
    ended_seen: float | None = None  # when its job was first seen ended without an exit file
    gone: bool = False  # SLURM no longer runs it (terminal state, or forgotten)
    attempted: bool = False  # sbatch was called for it (it may exist even if its id never came back)

    @property
    def active(self) -> bool:
        return self.job_id is not None and not self.gone


# --------------------------------------------------------------------------------------------------------------------
# Exit files (written by `jobs.PeerJob`)
# --------------------------------------------------------------------------------------------------------------------


def exit_path(root: Path, peer_id: str) -> Path:
    """Where the job of peer `peer_id` writes its exit code, `root` being `<run_dir>/slurm`."""
    return root / f"{peer_id}.exit"


def node_exit_paths(root: Path, peer_id: str) -> list[Path]:
    """The exit files of a multi-node peer's other nodes (`<id>.node<K>.exit`)."""
    return list(root.glob(f"{peer_id}.node*.exit"))


def read_exit_code(root: Path, peer_id: str) -> int | None:
    """The exit code the peer's job wrote; None until a complete exit file is there."""
    try:
        data = json.loads(exit_path(root, peer_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data["exit_code"] if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None


def _failed_node(root: Path, peer_id: str) -> tuple[int, int] | None:
    """(node rank, exit code) of a non-first node of a multi-node peer that exited non-zero."""
    for path in node_exit_paths(root, peer_id):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            rank = int(path.name[len(peer_id) + len(".node") : -len(".exit")])
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("exit_code") not in (0, None):
            return rank, data["exit_code"]
    return None


def _submitit_log_tail(job: SlurmJob, lines: int = 12) -> list[str]:
    """The last lines of the job's own stdout and stderr (submitit's files): why a job died before its peer said."""
    out: list[str] = []
    if job.folder is None:
        return out
    for suffix in ("out", "err"):
        path = job.folder / f"{job.job_id}_0_log.{suffix}"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out += [f"({path.name}) {line}" for line in text.splitlines()[-lines:]]
    return out


# --------------------------------------------------------------------------------------------------------------------
# The watch
# --------------------------------------------------------------------------------------------------------------------


class JobWatch:
    """Reads the jobs' exit files and states and decides what they mean: `check_exit_files` and `poll_states` return
    the `Outcome` that ends the swarm (a failed peer, a job gone before its peer finished), or None. Once the backend
    calls `mark_stopping`, an ending job counts as stopped, never as a failure."""

    SQUEUE_EVERY = 1.0  # seconds between squeue calls
    ENDED_GRACE = 5.0  # seconds to wait for a peer's exit file once its job has ended (shared filesystems lag)

    def __init__(self, config: SwarmConfig, root: Path, redis_log: Path):
        self.config = config
        self.root = root  # <run_dir>/slurm, where the exit files are
        self.redis_log = redis_log  # named when the Redis job ends
        self.stop_started: float | None = None  # time.monotonic() when the backend began to stop the swarm
        self.next_squeue = 0.0
        self.squeue_warned = 0.0

    def mark_stopping(self) -> None:
        self.stop_started = time.monotonic()

    def record_exit(self, run: SlurmJob, code: int, when: float) -> None:
        if run.returncode is not None:
            return
        run.returncode, run.ended = code, when
        if not run.started:
            run.started = run.submitted or when
        if self.stop_started is not None and when >= self.stop_started:
            run.status = "stopped"
        else:
            run.status = "ok" if code == 0 else "failed"

    def check_exit_files(self, runs: list[SlurmJob], console: Console) -> Outcome | None:
        """Record each peer whose exit file arrived; the failure that stops the swarm, if one did."""
        for run in runs:
            if run.job_id is None or run.returncode is not None:
                continue
            node_failure = _failed_node(self.root, run.command.id) if run.resources.nodes > 1 else None
            if node_failure is not None and self.stop_started is None:
                rank, code = node_failure
                run.note = f"node {rank} of its job exited with code {code}"
                console.say(f"peer {run.command.id}: node {rank} exited with code {describe_code(code)}; stopping")
                return Outcome(1, f"peer {run.command.id} (node {rank}) exited with code {code}")
            code = read_exit_code(self.root, run.command.id)
            if code is None:
                continue
            self.record_exit(run, code, time.monotonic())
            if self.stop_started is not None:
                continue
            if code != 0:
                state = job_outcome(run.job_id)[0]
                why = ""
                if state in JOB_CAUSED_STATES:
                    run.note = f"job {run.job_id} {state}"
                    why = f", job {state}" + (
                        ": it reached its time limit (`slurm.time`)" if state == "TIMEOUT" else ""
                    )
                if self.config.on_failure == "continue":
                    console.say(
                        f"peer {run.command.id} exited with code {describe_code(code)} (job {run.job_id}{why}); the "
                        f"others go on (on_failure: continue): restart it with "
                        f"`{restart_command(self.config, [run.command.id])}`"
                    )
                    continue
                console.say(
                    f"peer {run.command.id} exited with code {describe_code(code)} (job {run.job_id}{why}); "
                    f"cancelling the other jobs (resume the swarm from its checkpoints with "
                    f"`{restart_command(self.config)}`)"
                )
                return Outcome(1, f"peer {run.command.id} exited with code {code}{why}")
            console.say(f"peer {run.command.id} finished (exit code 0)")
        return None

    def poll_states(self, jobs: list[SlurmJob], console: Console, force: bool = False) -> Outcome | None:
        """The states of `jobs` from squeue (at most every SQUEUE_EVERY seconds, unless `force`): announce what
        changed, and handle the jobs SLURM no longer runs."""
        now = time.monotonic()
        if now < self.next_squeue and not force:
            return None
        self.next_squeue = now + self.SQUEUE_EVERY
        jobs = [job for job in jobs if job.active]
        if not jobs:
            return None
        states = squeue(job.job_id for job in jobs)
        if states is None:
            if now - self.squeue_warned > 60:
                self.squeue_warned = now
                console.say("squeue failed (is slurmctld reachable?); retrying")
            return None
        for job in jobs:
            state, node, reason = states.get(job.job_id, (None, None, None))
            what = "the Redis job" if job.command is None else f"peer {job.command.id}"
            if state is not None and (state, reason) != (job.state, job.reason) and state not in TERMINAL_STATES:
                if state == "PENDING":
                    why = f" ({reason})" if reason and reason != "None" else ""
                    console.say(f"{what}: job {job.job_id} pending{why}")
                elif state == "RUNNING" and job.state != "RUNNING":
                    job.started = job.started or time.monotonic()
                    job.node = node
                    console.say(f"{what}: job {job.job_id} running on {node}")
                elif state not in ("RUNNING", "COMPLETING"):
                    console.say(f"{what}: job {job.job_id} {state} ({reason})")
                if job.status in ("pending", "running"):
                    job.status = "running" if state == "RUNNING" else "pending"
            if state is not None:
                job.state, job.reason = state, reason
                job.node = node or job.node
            if state is None or state in TERMINAL_STATES:
                failure = self._job_ended(job, state, console)
                if failure is not None:
                    return failure
        return None

    def _job_ended(self, job: SlurmJob, state: str | None, console: Console) -> Outcome | None:
        """A job SLURM no longer runs. For a peer whose exit file has not arrived, allow ENDED_GRACE seconds (a
        shared filesystem may show it late), then count it as failed."""
        now = time.monotonic()
        if job.command is not None:
            if job.returncode is not None:
                job.gone = True
                return None
            if read_exit_code(self.root, job.command.id) is not None:
                return None  # check_exit_files records it
            if job.ended_seen is None:
                job.ended_seen = now
            # While stopping, a missing exit status changes nothing (the peer counts as stopped): no need to wait.
            if now - job.ended_seen < self.ENDED_GRACE and self.stop_started is None:
                return None
        job.gone = True
        final, code, sig = job_outcome(job.job_id)
        final = final or state or "gone from the queue"
        job.state = final
        if job.ended is None:
            job.ended = now
            job.started = job.started or job.submitted or now
        if job.returncode is None and code is not None:
            job.returncode = -sig if sig else code
        if self.stop_started is not None:
            job.status = "stopped"
            return None
        job.status = "failed"
        if job.command is None:
            console.say(f"the Redis job {job.job_id} ended ({final}); see {self.redis_log}")
            for line in _submitit_log_tail(job):
                console.say(line)
            return Outcome(1, f"the Redis job {job.job_id} ended ({final})")
        job.note = f"job {job.job_id} ended {final} before the peer reported an exit code"
        console.say(
            f"peer {job.command.id}: job {job.job_id} ended {final} before the peer finished; cancelling the rest"
        )
        for line in _submitit_log_tail(job):
            console.peer(job.command.id, line)
        return Outcome(1, f"peer {job.command.id}: job {job.job_id} ended {final}")
