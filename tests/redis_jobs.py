"""The launcher's Redis job (`trl_ftis.launcher.slurm_jobs.RedisJob`) as the launcher tests run it: its files under
one folder, run in a subprocess from its pickle, as submitit's worker runs it."""

import pickle
import subprocess
import sys

from trl_ftis.launcher.slurm.jobs import RedisJob


def redis_job_in(folder, *, server="redis-server", secret_path=None, start_timeout=20) -> RedisJob:
    """A job on a free port with its data, log and address (`redis.json`) in `folder`."""
    return RedisJob(
        server=server,
        port=0,
        directory=str(folder / "redis"),
        log_path=str(folder / "redis.log"),
        address_path=str(folder / "redis.json"),
        secret_path=None if secret_path is None else str(secret_path),
        start_timeout=start_timeout,
    )


def run_pickled(job, *, then: str = "", **popen) -> subprocess.Popen:
    """Start `job()` in a new Python process fed its pickle (`then`: code run after it returns)."""
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())()" + (f"; {then}" if then else "")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, **popen)
    proc.stdin.write(pickle.dumps(job))
    proc.stdin.close()
    return proc
