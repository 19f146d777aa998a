"""Every swarm a benchmark starts is bound to one run of that benchmark (`FTISConfig.swarm_run`): messages of earlier
runs, left in a reused exchange, are refused, and no peer starts unbound (one with an exchange and no run id refuses
to start). Peers started as subprocesses inherit the id."""

import os
import time

from trl_ftis.shared_names import SWARM_RUN_ENV


def bind_peers_to_this_run() -> str:
    """Set `FTIS_SWARM_RUN` for this process and its children, unless it is set already (then a parent benchmark's
    run id is kept); returns the id."""
    return os.environ.setdefault(SWARM_RUN_ENV, f"bench-{os.getpid()}-{time.time_ns()}")
