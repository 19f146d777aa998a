"""The names processes share: the environment variables the launcher, the trainers and the scripts read (`*_ENV`) and
the summary file each trainer writes. Standard library only."""

from __future__ import annotations

SWARM_SECRET_ENV = "FTIS_SWARM_SECRET"
"""The swarm secret, read when `FTISConfig.swarm_secret` is not set."""
SWARM_NAME_ENV = "FTIS_SWARM_NAME"
"""The swarm's name, read when `FTISConfig.swarm_name` is not set (the launcher sets it to the swarm's `name`)."""
SWARM_RUN_ENV = "FTIS_SWARM_RUN"
"""The swarm run's id, read when `FTISConfig.swarm_run` is not set (the launcher draws one for each run)."""
REDIS_PASSWORD_ENV = "FTIS_REDIS_PASSWORD"
"""The Redis password, used when a `redis://` / `rediss://` URL carries none: it stays off command lines."""
CONSOLE_ENV = "FTIS_CONSOLE"
"""Set to [`CONSOLE_LINES`] (by the launcher, for its peers): one short line per logged step and the dependencies'
deprecation notices hidden (`trl_ftis.console.apply_console_env`); the full metrics stay in the trackers."""
CONSOLE_LINES = "lines"
CONSOLE_DICTS = "dict"
"""[`CONSOLE_ENV`] set to this: Trainer's full dict per logged step, also in the example scripts (which default to
step lines: `trl_ftis.console.use_script_console`)."""
PEER_ID_ENV = "FTIS_PEER_ID"
"""Set by the launcher to each peer's id (scripts read it as their default `peer_id`)."""
CACHE_ENV = "FTIS_CACHE"
"""Where the demo keeps converted model checkpoints (default `~/.cache/trl-ftis`)."""
SUMMARY_FILE = "ftis_summary.json"
"""Written by each trainer into its `output_dir` at the end of training; read by the launcher's summary table."""
