"""Processes the launcher tests' fixture peers and stand-in servers started, found by the pid files they write."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return not os.path.exists("/proc/self")  # gone meanwhile, or no /proc at all


def written_pids(pid_dir: Path) -> dict[str, int]:
    """`<name>.pid` files of `pid_dir`: name -> pid."""
    return {p.name[: -len(".pid")]: int(p.read_text()) for p in pid_dir.glob("*.pid")}


def kill_left(pid_dir: Path) -> None:
    """SIGKILL every process of `pid_dir` still alive, so that no test leaks processes."""
    for pid in written_pids(pid_dir).values():
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
