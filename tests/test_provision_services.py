"""tests/provision_services.sh, which `make test` runs: it never fails, and says which tests will skip and why."""

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "provision_services.sh"
BASH = shutil.which("bash")


def _run(path: str) -> subprocess.CompletedProcess:
    env = {"PATH": path, "FTIS_PROVISION": "0"}  # never install from a test
    return subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_missing_services_are_reported_with_the_tests_that_skip_and_the_script_succeeds(tmp_path):
    result = _run(str(tmp_path))  # a PATH where neither redis-server nor slurmctld exists
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("redis-server unavailable" in line and "will be skipped" in line for line in lines), lines
    assert any("slurmctld unavailable" in line and "SLURM launcher tests will be skipped" in line for line in lines)


def test_services_on_path_are_found_and_nothing_is_installed(tmp_path):
    for program in ("redis-server", "slurmctld"):
        fake = tmp_path / program
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    result = _run(f"{tmp_path}{os.pathsep}/nonexistent")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["test services: redis-server found", "test services: slurmctld found"]
