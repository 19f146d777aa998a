"""Fixtures of the launcher tests: `slurm_cluster` (a throwaway SLURM on localhost; see slurm_cluster.py)."""

from slurm_cluster import slurm_cluster  # noqa: F401 - registers the session-scoped fixture
