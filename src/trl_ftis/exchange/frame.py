"""The frame around a message's header and body: the fixed-size preamble and the signature trailers (the Ed25519
block of a per-peer key, the HMAC of the swarm secret), written by [`seal`] and read and verified by [`read_frame`]
and [`verify`] before any parser sees the header or the body.

Only fixed-size fields are read here: the preamble's lengths are checked against the [`Limits`] and the bytes present,
and the signatures on the exact signed bytes, in place. Every failure is an [`ExchangeError`]. Standard library only
(Ed25519 through [`trl_ftis.exchange.keys`], which imports `cryptography` on first use).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..peer_ids import PEER_ID_MAX_CHARS, peer_id_problem
from . import keys
from .errors import ExchangeError
from .layout import (
    FLAG_COMPACT,
    FLAG_COMPRESSED,
    FLAG_ED25519,
    FLAG_SIGNED,
    KNOWN_FLAGS,
    MAGIC,
    PREAMBLE,
    PREAMBLE_SIZE,
    SCHEMA_VERSION,
    SIGNATURE_SIZE,
)
from .limits import Limits

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["Frame", "as_view", "read_frame", "seal", "secret_key", "verify"]


def secret_key(secret: bytes | str) -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("the exchange secret is empty; pass None to disable signing")
    return key


def seal(
    flags: int,
    header: bytes,
    body: bytes,
    *,
    sender: str,
    secret: bytes | str | None,
    private_key: Ed25519PrivateKey | None,
) -> bytes:
    """The whole message: the preamble (with `flags`, which must already name the signatures), `header`, `body`, then
    the Ed25519 block (the signer `sender` and its signature of everything before the signature) when `private_key`
    is given, then the HMAC of everything before it (the Ed25519 block included) when `secret` is."""
    data = PREAMBLE.pack(MAGIC, SCHEMA_VERSION, flags, len(header), len(body)) + header + body
    if private_key is not None:
        data += bytes([len(sender)]) + sender.encode("ascii")
        data += keys.sign(private_key, data)
    if secret is not None:
        data += hmac.new(secret_key(secret), data, hashlib.sha256).digest()
    return data


@dataclass
class Frame:
    """The preamble's fields and the signature trailers, checked against the limits and the bytes present."""

    view: memoryview
    version: int
    flags: int
    header_length: int
    body_length: int
    total_length: int
    signer: str | None = None
    """The peer id in the Ed25519 block (unverified until [`verify`] checked it); None without the block or when
    only the header was read."""

    @property
    def signed(self) -> bool:
        return bool(self.flags & FLAG_SIGNED)

    @property
    def compact(self) -> bool:
        return bool(self.flags & FLAG_COMPACT)

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    @property
    def body_end(self) -> int:
        return PREAMBLE_SIZE + self.header_length + self.body_length


def as_view(data: Any) -> memoryview:
    if isinstance(data, (bytes, bytearray)):
        return memoryview(data)
    if isinstance(data, memoryview):
        try:
            return data.cast("B")
        except (TypeError, ValueError):
            raise ExchangeError("header", "message: the buffer is not a contiguous byte buffer") from None
    raise ExchangeError("header", f"message: expected bytes, got {type(data).__name__}")


def read_frame(data: Any, limits: Limits, *, need_body: bool, required_flags: int = 0) -> Frame:
    """Parses and checks the preamble (magic, version, flags, declared lengths vs limits and vs the byte count) and,
    with `need_body`, the Ed25519 block's signer id. Only fixed-size fields are read: no parser runs here."""
    view = as_view(data)
    size = len(view)
    if size > limits.max_message_bytes:
        raise ExchangeError("too_large", f"message: {size} bytes, more than {limits.max_message_bytes}")
    head = bytes(view[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise ExchangeError("magic", f"message: not a trl-ftis message (starts with {head!r}, expected {MAGIC!r})")
    if size < PREAMBLE_SIZE:
        raise ExchangeError("truncated", f"message: {size} bytes, shorter than the {PREAMBLE_SIZE}-byte preamble")
    _, version, flags, header_length, body_length = PREAMBLE.unpack(view[:PREAMBLE_SIZE])
    if version != SCHEMA_VERSION:
        newer = " (newer than this trl-ftis; upgrade it)" if version > SCHEMA_VERSION else ""
        raise ExchangeError(
            "version", f"message: schema version {version}{newer}, this receiver reads version {SCHEMA_VERSION}"
        )
    if flags & ~KNOWN_FLAGS:
        raise ExchangeError("header", f"message: unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    if required_flags & ~flags:  # from the flags alone: an unsigned message costs 20 bytes of reading
        which = "HMAC" if required_flags & ~flags & FLAG_SIGNED else "Ed25519"
        raise ExchangeError("unsigned", f"message: no {which} signature, but this receiver requires one")
    if header_length > limits.max_header_bytes:
        raise ExchangeError(
            "too_large", f"message: header of {header_length} bytes, more than {limits.max_header_bytes}"
        )
    frame = Frame(view, version, flags, header_length, body_length, 0)
    total = frame.body_end + (SIGNATURE_SIZE if frame.signed else 0)  # Python ints: a 2**64 claim cannot wrap
    total += 1 + keys.ED25519_SIGNATURE_SIZE if flags & FLAG_ED25519 else 0  # + the signer id, read below
    if total > limits.max_message_bytes:
        raise ExchangeError("too_large", f"message: declares {total} bytes, more than {limits.max_message_bytes}")
    needed = total if need_body else PREAMBLE_SIZE + header_length
    if size < needed:
        raise ExchangeError("truncated", f"message: {size} bytes, but the preamble declares {needed}")
    if need_body and flags & FLAG_ED25519:
        signer_length = view[frame.body_end]
        if not 1 <= signer_length <= PEER_ID_MAX_CHARS:
            raise ExchangeError("signature", f"message: the Ed25519 block names a signer of {signer_length} bytes")
        total += signer_length
        if total > limits.max_message_bytes or size < total:
            reason = "too_large" if total > limits.max_message_bytes else "truncated"
            raise ExchangeError(reason, f"message: {size} bytes, but the frame and its Ed25519 block declare {total}")
        signer = bytes(view[frame.body_end + 1 : frame.body_end + 1 + signer_length]).decode("ascii", "replace")
        if peer_id_problem(signer) is not None:
            raise ExchangeError("signature", f"message: the Ed25519 block names an invalid signer {signer!r}")
        frame.signer = signer
    elif flags & FLAG_ED25519 and size > frame.body_end:  # peek_header's message_bytes only: not checked
        total += view[frame.body_end]
    if need_body and size > total:
        raise ExchangeError("too_large", f"message: {size - total} unexpected bytes after the declared end")
    frame.total_length = total
    return frame


def verify(frame: Frame, key: bytes | None, public_keys: Mapping[str, Ed25519PublicKey] | None) -> None:
    """Checks the required signatures on the exact signed bytes, in place (nothing is copied or parsed)."""
    view = frame.view
    if key is not None:  # membership first: it is the cheaper check, and strangers then never reach Ed25519
        start = frame.total_length - SIGNATURE_SIZE  # the HMAC covers everything before it
        expected = hmac.new(key, view[:start], hashlib.sha256).digest()
        if not hmac.compare_digest(expected, bytes(view[start : frame.total_length])):
            raise ExchangeError("signature", "message: the signature does not match (wrong secret or tampered)")
    if public_keys is not None:
        signer = frame.signer
        public_key = public_keys.get(signer)
        if public_key is None:
            raise ExchangeError("unknown_peer", f"message: signed as peer {signer!r}, who has no registered key")
        start = frame.body_end + 1 + len(signer)  # the signature covers everything before it
        if not keys.verify(public_key, view[start : start + keys.ED25519_SIGNATURE_SIZE], view[:start]):
            problem = f"the Ed25519 signature does not match peer {signer!r}'s key (forged or tampered)"
            raise ExchangeError("signature", f"message: {problem}")
