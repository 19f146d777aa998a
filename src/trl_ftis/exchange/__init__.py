"""Exchange of sampled completions between peers: the wire format and the transports that carry it.

[`.wire`] (standard library + numpy only) encodes and decodes [`Message`] objects within [`Limits`];
[`.keys`] holds the per-peer Ed25519 keys (the `cryptography` package, imported on first use); the transports
(`Transport`, `Envelope`, `open_transport`) are imported on first use, so the wire format works on its own
and importing this package stays cheap.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .keys import (
    KeyFileError,
    generate_keypair,
    load_private_key,
    load_public_keys,
    public_key_text,
    save_private_key,
    save_public_keys,
)
from .limits import Limits
from .wire import (
    SCHEMA_VERSION,
    ExchangeError,
    Message,
    WireCompletion,
    WireGroup,
    decode_message,
    encode_message,
    peek_header,
    tokenizer_fingerprint,
)

if TYPE_CHECKING:  # editors and type checkers see the lazily exported names
    from .transports import Envelope, Transport, open_transport

_LAZY = {
    "Transport": "transports",
    "Envelope": "transports",
    "open_transport": "transports",
}

__all__ = [
    "SCHEMA_VERSION",
    "Envelope",
    "ExchangeError",
    "KeyFileError",
    "Limits",
    "Message",
    "Transport",
    "WireCompletion",
    "WireGroup",
    "decode_message",
    "encode_message",
    "generate_keypair",
    "load_private_key",
    "load_public_keys",
    "open_transport",
    "peek_header",
    "public_key_text",
    "save_private_key",
    "save_public_keys",
    "tokenizer_fingerprint",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
