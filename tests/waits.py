"""Checks that a blocking call returns, with no verdict on how fast the machine is.

A test that asks "does this wait give up / wake up / not wait at all?" runs the call in a thread and waits for it with
a hang guard far longer than any machine needs, but far shorter than the timeout the call would run into if the
behaviour broke (a wait that ignores a publish, retries forever, or sleeps its full timeout though a message is
pending). The guard then fails the test; a slow machine cannot trip it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HANG_GUARD = 30.0  # seconds: a hang guard only; the calls it guards would block for minutes if broken
PROCESS_HANG_GUARD = 120.0  # the same for calls that start Python processes or train (slow on a loaded machine)


def returns_within(call: Callable[[], T], guard: float = HANG_GUARD, what: str = "the call") -> T:
    """`call()`'s result (or its exception, raised again here), failing if it has not returned after `guard` seconds.

    The call runs in a daemon thread, so one that hangs does not keep the test process alive.
    """
    returned = threading.Event()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test's thread below
            outcome["error"] = exc
        finally:
            returned.set()

    threading.Thread(target=run, daemon=True, name="returns_within").start()
    assert returned.wait(guard), f"{what} had not returned after {guard:g} s"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
