"""JSON files that other processes read while they are written (checkpoint states, launcher summaries): written
whole or not at all, NumPy values as plain JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def plain_json(value: Any) -> Any:
    """`json.dumps` default: NumPy scalars and arrays as Python values; anything else raises `TypeError`."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} cannot be written as JSON")


def write_json_atomic(path: str | os.PathLike, value: Any) -> None:
    """Write `value` as JSON to `path` through a temporary file (named after this process) and a rename: a reader
    never sees half a file, and two processes writing the same path never share a temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, default=plain_json) + "\n", encoding="utf-8")
    os.replace(temporary, path)
