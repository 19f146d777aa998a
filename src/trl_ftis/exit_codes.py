"""The exit code of a run stopped by a signal, for the launcher and every peer it starts."""

from __future__ import annotations

INTERRUPTED_EXIT_CODE = 130
"""Exit code of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT), for the launcher and every peer it starts."""
