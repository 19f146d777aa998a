"""Helpers of the tests that check file permissions (key files, launcher files): a file's mode and a umask."""

import os
import stat
from contextlib import contextmanager


def file_mode(path) -> int:
    """The permission bits of `path` (`0o600`, ...)."""
    return stat.S_IMODE(os.stat(path).st_mode)


@contextmanager
def umask(mask: int):
    """Run the block under umask `mask` (restored after)."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)
