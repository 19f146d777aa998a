"""Finding and stopping every process a local swarm's peers started, with psutil (Linux, macOS, any POSIX system).

Each peer starts in its own session and process group (id = its pid), and most of what it starts stays in that
group. Some programs move their children into new sessions, e.g. torchrun (accelerate launch with several processes)
puts every worker in its own: `ProcessTracker` finds those as descendants of a peer and remembers them by (pid,
creation time), so they are still found once orphaned. `die_with_parent` makes a peer's main process follow a
launcher killed with SIGKILL (Linux only: a parent-death signal).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

import psutil

__all__ = ["ProcessTracker", "die_with_parent"]

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # exited; only their parents have not collected them yet


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    created: float  # with the pid, identifies a process even if its pid is reused later


def _process_table() -> dict[int, _Proc]:
    """Every live process this user may see, zombies left out."""
    table = {}
    for proc in psutil.process_iter(["ppid", "create_time", "status"]):
        info = proc.info
        if info.get("status") in _GONE or info.get("ppid") is None or info.get("create_time") is None:
            continue
        try:
            pgid = os.getpgid(proc.pid)
        except OSError:
            continue  # exited meanwhile
        try:
            sid = os.getsid(proc.pid)
        except OSError:
            sid = -1  # some systems refuse it outside the caller's session: the groups and descendants still count
        table[proc.pid] = _Proc(proc.pid, info["ppid"], pgid, sid, info["create_time"])
    return table


def _created(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def _quiet(kill, target: int, sig: int) -> None:
    try:
        kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ProcessTracker:
    """Every live process started by the peers: their process groups and sessions, their descendants, and the
    descendants seen before (even once orphaned), so that none outlives the launcher."""

    def __init__(self):
        self.groups: dict[int, str] = {}  # pgid (= peer pid) -> peer id
        self.leaders: dict[int, float | None] = {}  # peer pid -> creation time (None: exited before we looked)
        self.known: dict[int, float] = {}  # pid -> creation time
        self.me = os.getpid()

    def add_peer(self, pid: int, peer_id: str) -> None:
        self.groups[pid] = peer_id
        self.leaders[pid] = _created(pid)

    def scan(self) -> dict[int, _Proc]:
        """Live processes belonging to the swarm; also refreshes what is remembered."""
        table = _process_table()
        found = {
            proc.pid: proc
            for proc in table.values()
            if proc.pid != self.me
            and (proc.pgid in self.groups or proc.sid in self.groups or self.known.get(proc.pid) == proc.created)
        }
        children: dict[int, list[_Proc]] = {}
        for proc in table.values():
            children.setdefault(proc.ppid, []).append(proc)
        # A peer's own pid counts only while it is the same process (its pid may be reused once it has exited).
        leaders = [pid for pid, created in self.leaders.items() if pid in table and table[pid].created == created]
        stack = list(found) + leaders
        while stack:
            for child in children.get(stack.pop(), ()):
                if child.pid not in found and child.pid != self.me:
                    found[child.pid] = child
                    stack.append(child.pid)
        self.known = {pid: proc.created for pid, proc in found.items()}
        return found

    def alive(self) -> list[int]:
        """Pids of the swarm's processes still running."""
        return sorted(self.scan())

    def signal_all(self, sig: int) -> None:
        """`sig` to every peer process group with live members and to every other swarm process found."""
        found = self.scan()
        live_groups = {proc.pgid for proc in found.values() if proc.pgid in self.groups}
        for pgid in live_groups:
            _quiet(os.killpg, pgid, sig)  # atomic for the whole group, even for a process forked a moment ago
        for proc in found.values():
            if proc.pgid not in live_groups:
                _quiet(os.kill, proc.pid, sig)


def die_with_parent():
    """A `preexec_fn`: on Linux, SIGTERM the peer if the launcher dies without stopping it (e.g. kill -9); None
    elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec
