"""Fixtures of the launcher tests: `slurm_cluster` (a throwaway SLURM on localhost; see slurm_cluster.py) and
`pid_dir` (where fixture peers and stand-in servers write their pids; see pids.py)."""

import pytest
from pids import kill_left
from slurm_cluster import slurm_cluster  # noqa: F401 - registers the session-scoped fixture


@pytest.fixture
def pid_dir(tmp_path):
    """Where fixture peers and servers write their pids; anything still alive at the end is killed, so that no test
    leaks processes."""
    directory = tmp_path / "pids"
    directory.mkdir()
    yield directory
    kill_left(directory)
