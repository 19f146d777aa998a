"""Exchange of sampled completions between peers: the wire format and the transports that carry it.

:mod:`.wire` (standard library + numpy only) encodes and decodes :class:`Message` objects; the transports
(``Transport``, ``Envelope``, ``open_transport``) are imported on first use, so the wire format works on its own
and importing this package stays cheap.
"""

from importlib import import_module

from .wire import (
    SCHEMA_VERSION,
    ExchangeError,
    Limits,
    Message,
    WireCompletion,
    WireGroup,
    decode_message,
    encode_message,
    peek_header,
    tokenizer_fingerprint,
)

_LAZY = {
    "Transport": "transports",
    "Envelope": "transports",
    "open_transport": "transports",
}

__all__ = [
    "SCHEMA_VERSION",
    "Envelope",
    "ExchangeError",
    "Limits",
    "Message",
    "Transport",
    "WireCompletion",
    "WireGroup",
    "decode_message",
    "encode_message",
    "open_transport",
    "peek_header",
    "tokenizer_fingerprint",
]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
