"""Exchange of sampled completions between peers: the wire format and the transports that carry it.

The wire format (standard library + numpy only), one concern per module, each importing only the ones above it in
this list and only their public names:

* [`.errors`]: [`ExchangeError`], the one exception of bad input, and its [`REASONS`];
* [`.keys`]: the per-peer Ed25519 keys (the `cryptography` package, imported on first use);
* [`.layout`]: the byte layout's constants: preamble, flags, trailers, dtypes, sizes, the format's fixed bounds;
* [`.limits`]: [`Limits`], what a receiver accepts from one message;
* [`.message`]: the data model, [`Message`], [`WireGroup`], [`WireCompletion`];
* [`.checks`]: the header and column checks encode and decode share;
* [`.text`]: the optional text section (completion texts for peers with other tokenizers);
* [`.frame`]: the preamble and the signature trailers, sealed and verified before anything is parsed;
* [`.fingerprint`]: [`tokenizer_fingerprint`];
* [`.wire`]: the codec, [`encode_message`], [`decode_message`], [`peek_header`].

The transports ([`.transports`]: `Transport`, `Envelope`, `open_transport`) are imported on first use, so the wire
format works on its own and importing this package stays cheap.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .errors import ExchangeError
from .fingerprint import tokenizer_fingerprint
from .keys import (
    KeyFileError,
    generate_keypair,
    load_private_key,
    load_public_keys,
    public_key_text,
    save_private_key,
    save_public_keys,
)
from .layout import SCHEMA_VERSION
from .limits import Limits
from .message import Message, WireCompletion, WireGroup
from .wire import decode_message, encode_message, is_signed, peek_header

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
    "is_signed",
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
