"""`memory://NAME`: an in-process, thread-safe transport for unit tests."""

from __future__ import annotations

import threading
from typing import ClassVar

from .base import DEFAULT_MAX_MESSAGE_BYTES, Envelope, Transport
from .registry import TransportKind, register_transport


class _MemoryChannel:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        # (sender, round, data), or None where the sender pruned it: indices stay stable for every cursor.
        self.messages: list[tuple[str, int, bytes] | None] = []


class MemoryTransport(Transport):
    """In-process transport for unit tests: a class-level registry of named channels, one cursor per instance.

    Polls are bounded like the other transports': at most `max_batch` entries and `max_poll_bytes` bytes of
    messages (always at least one message); messages over this instance's `max_message_bytes` (another instance
    may allow bigger ones) are reported as "too_large" and cost nothing.
    """

    _registry: ClassVar[dict[str, _MemoryChannel]] = {}
    _registry_lock = threading.Lock()

    def __init__(
        self,
        url: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_batch: int = 1000,
        max_poll_bytes: int | None = None,
    ):
        if not url.startswith("memory://"):
            raise ValueError(f"not a memory:// URL: {url!r}")
        self.url = url
        self.name = url[len("memory://") :] or "default"
        self._set_bounds(max_message_bytes=max_message_bytes, max_batch=max_batch, max_poll_bytes=max_poll_bytes)
        with self._registry_lock:
            self._channel = self._registry.setdefault(self.name, _MemoryChannel())
        self._cursor = 0

    @classmethod
    def reset(cls, name: str | None = None) -> None:
        """Forget one channel (or all of them); open instances keep the old channel object."""
        with cls._registry_lock:
            if name is None:
                cls._registry.clear()
            else:
                cls._registry.pop(name, None)

    def _publish(self, data: bytes, *, sender: str, round: int) -> None:
        with self._channel.cond:
            self._channel.messages.append((sender, round, data))
            self._channel.cond.notify_all()

    def _poll(self) -> list[Envelope]:
        out: list[Envelope] = []
        taken = 0  # message bytes handed out by this poll
        with self._channel.cond:
            messages = self._channel.messages
            index = self._cursor
            end = min(len(messages), index + self.max_batch)  # pruned entries count too: bounded work
            while index < end:
                item = messages[index]
                if item is None:  # pruned by its sender
                    index += 1
                    continue
                sender, round, data = item
                envelope = self._received(data, str(index), sender, round)  # too large: refused, costs nothing
                if envelope.error is None:
                    if taken and taken + len(data) > self.max_poll_bytes:
                        break  # the byte budget is spent: the rest comes with the next poll
                    taken += len(data)
                out.append(envelope)
                index += 1
            self._cursor = index
        return out

    def _wait(self, timeout: float) -> bool:
        with self._channel.cond:
            return self._channel.cond.wait_for(lambda: len(self._channel.messages) > self._cursor, timeout=timeout)

    def _prune(self, *, sender: str, cutoff: int) -> None:
        with self._channel.cond:
            messages = self._channel.messages
            for i, item in enumerate(messages):
                if item is not None and item[0] == sender and item[1] < cutoff:
                    messages[i] = None


register_transport(TransportKind(scheme="memory", opener=MemoryTransport, example="memory://NAME", in_process=True))
