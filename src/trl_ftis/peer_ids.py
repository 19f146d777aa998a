"""The peer-id rule, written once: `FTISConfig`, the round client, the wire format, the transports and the launcher all
check peer ids with it, so that an id one part takes the others take too (a peer id the config takes but the wire
refuses would be a peer that silently never publishes). Standard library only."""

from __future__ import annotations

import re

PEER_ID_MAX_CHARS = 64
# A peer id names files in a shared directory, Redis keys, tracker runs and a command-line value: ASCII letters,
# digits, '_', '.', '-', starting with a letter, digit or '_' (so never '.', a hidden file or an option '-x'), and
# without '..' anywhere (never a parent directory, whatever a transport builds from it).
_PEER_ID_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.-]*")
PEER_ID_RULE = (
    f"1-{PEER_ID_MAX_CHARS} ASCII letters, digits, '_', '.' or '-', starting with a letter, a digit or '_', "
    "without '..'"
)


def peer_id_problem(value: object) -> str | None:
    """Why `value` is not a valid peer id (one sentence), or `None` when it is one."""
    if not isinstance(value, str):
        return f"a peer id must be a string, got {type(value).__name__}"
    if not 1 <= len(value) <= PEER_ID_MAX_CHARS:
        return f"a peer id must have 1-{PEER_ID_MAX_CHARS} characters, got {len(value)}"
    if not _PEER_ID_RE.fullmatch(value):
        return f"a peer id must be {PEER_ID_RULE}, got {value[:80]!r}"
    return None


def is_peer_id(value: object) -> bool:
    """Whether `value` is a valid peer id."""
    return peer_id_problem(value) is None


def peer_id_from(name: str) -> str:
    """A valid peer id made from a model's name or path (`Qwen/Qwen2.5-1.5B` -> `qwen2.5-1.5b`): its last path part,
    lower-cased, with every other character replaced by '-'; `"peer"` when nothing is left."""
    last = str(name).rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()
    text = re.sub(r"\.{2,}", ".", re.sub(r"[^a-z0-9_.-]+", "-", last)).lstrip(".-")[:PEER_ID_MAX_CHARS]
    return text if is_peer_id(text) else "peer"


def check_peer_id(value: object, what: str = "peer_id") -> str:
    """Return `value` if it is a valid peer id, else raise `ValueError` naming `what` and the rule."""
    problem = peer_id_problem(value)
    if problem is not None:
        raise ValueError(f"{what}: {problem}.")
    return value  # type: ignore[return-value]
