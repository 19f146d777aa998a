"""The SLURM commands the launcher's SLURM backend (`slurm.SlurmBackend`) runs, and the job scripts it shows: `squeue`,
`scontrol`, `scancel` (each in its own session, so that a Ctrl-C in the terminal reaches only the launcher), the
batch script submitit writes for a job's resources, and its options with secrets redacted for the dry run."""

from __future__ import annotations

import getpass
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...redaction import REDACTED, redact_text
from ..commands import is_secret_name, redact_shell_line
from .schema import SlurmResources, format_minutes

__all__ = [
    "describe_resources",
    "job_outcome",
    "option_text",
    "options_text",
    "restrict_folder",
    "run_command",
    "sbatch_script",
    "scancel",
    "scancel_names",
    "script_lines",
    "signals_blocked",
    "squeue",
    "submitit_parameters",
]


def submitit_parameters(resources: SlurmResources, name: str) -> dict[str, Any]:
    params = resources.submitit_parameters()
    params["job_name"] = name
    return params


def describe_resources(resources: SlurmResources) -> str:
    parts = [f"{resources.nodes} node{'s' if resources.nodes != 1 else ''}"]
    if resources.gpus:
        parts.append(f"{resources.gpus} GPU{'s' if resources.gpus != 1 else ''}/node")
    if resources.cpus:
        parts.append(f"{resources.cpus} CPU{'s' if resources.cpus != 1 else ''}")
    if resources.mem:
        parts.append(f"mem {resources.mem}")
    if resources.time:
        parts.append(f"time {format_minutes(resources.time)}")
    if resources.partition:
        parts.append(f"partition {resources.partition}")
    return ", ".join(parts)


def restrict_folder(folder: Path) -> None:
    """`folder` and the files in it (submitit's batch script, with the setup lines, and its pickles, with the job's
    environment additions) readable by their owner only, whatever the umask."""
    try:
        folder.chmod(0o700)
        for path in folder.iterdir():
            if path.is_file() and not path.is_symlink():
                path.chmod(0o600)
    except OSError:
        pass


def sbatch_script(resources: SlurmResources, name: str, folder: Path) -> str | None:
    """The batch script submitit writes for these resources (None when submitit is not installed)."""
    try:
        from submitit.slurm.slurm import _make_sbatch_string  # the function submitit's executor calls
    except ImportError:
        return None
    params = {k: v for k, v in submitit_parameters(resources, name).items()}
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    try:
        return _make_sbatch_string(command=command, folder=folder, **params)
    except Exception as exc:  # noqa: BLE001 - another submitit version: the dry run still shows the options
        return f"# (submitit could not render the script: {exc})"


# --------------------------------------------------------------------------------------------------------------------
# SLURM commands (run in their own session: a Ctrl-C in the terminal reaches only the launcher)
# --------------------------------------------------------------------------------------------------------------------


def run_command(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            argv,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def squeue(job_ids: Iterable[str]) -> dict[str, tuple[str, str, str]] | None:
    """{job id: (state, node list, reason)} for the jobs slurmctld still knows (finished ones for MinJobAge seconds);
    a job missing from the result is gone. None when squeue failed (slurmctld unreachable, ...)."""
    ids = [job_id for job_id in job_ids if job_id]
    if not ids:
        return {}
    result = run_command(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%N|%r"])
    if result is None:
        return None
    if result.returncode != 0:
        return {} if "Invalid job id" in result.stderr else None  # every one of them already forgotten
    states = {}
    for line in result.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4:
            states[fields[0]] = (fields[1], fields[2], fields[3])
    return states


def job_outcome(job_id: str) -> tuple[str | None, int | None, int | None]:
    """(state, exit code, signal) of a job from `scontrol show job` (None where unknown)."""
    result = run_command(["scontrol", "show", "job", "-o", job_id])
    if result is None or result.returncode != 0:
        return None, None, None
    state = re.search(r"\bJobState=(\S+)", result.stdout)
    code = re.search(r"\bExitCode=(\d+):(\d+)", result.stdout)
    return (
        state.group(1) if state else None,
        int(code.group(1)) if code else None,
        int(code.group(2)) if code else None,
    )


def scancel(job_ids: Iterable[str], *, signal_name: str | None = None) -> None:
    ids = [job_id for job_id in job_ids if job_id]
    if ids:
        run_command(["scancel", "--quiet", *([f"--signal={signal_name}"] if signal_name else []), *ids])


def scancel_names(names: Iterable[str]) -> None:
    """Cancel this user's jobs named `names` (each name is unique to one launch)."""
    user = getpass.getuser()
    for name in names:
        run_command(["scancel", "--quiet", f"--user={user}", f"--name={name}"])


@contextmanager
def signals_blocked():
    """SIGINT/SIGTERM/SIGHUP held back (and blocked in the sbatch that submitit starts): a Ctrl-C in the terminal
    must not kill sbatch halfway, leaving a job whose id the launcher never learned. Delivered right after."""
    sigs = {signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def script_lines(resources: SlurmResources, name: str, folder: Path) -> list[str]:
    """The job's sbatch options, setup lines and batch script for the dry run, secrets redacted
    (`commands.redact_shell_line`): the setup may export a token or name a URL with its password."""
    lines = ["#   sbatch options: " + options_text(resources)]
    if resources.setup:
        lines.append("#   setup: " + " ; ".join(redact_shell_line(line) for line in resources.setup))
    script = sbatch_script(resources, name, folder)
    if script is None:
        lines.append("#   (install submitit, pip install 'trl-ftis[slurm]', to see the batch script it writes)")
    else:
        lines.append("#   batch script (written by submitit at submission):")
        lines.extend("#   | " + redact_shell_line(line) for line in script.rstrip("\n").splitlines())
    return lines


def option_text(name: str, value: str | bool) -> str:
    """`--name=VALUE` as shown (never as submitted): a secret-named option's value and URL passwords redacted."""
    if value is True:
        return f"--{name}"
    return f"--{name}={REDACTED if is_secret_name(name) else redact_text(shlex.quote(str(value)))}"


def options_text(resources: SlurmResources) -> str:
    return " ".join(option_text(k, v) for k, v in resources.sbatch_options().items())
