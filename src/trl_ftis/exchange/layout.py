"""The byte layout of a message (schema version 1), written once: the preamble, the flags, the signature trailers,
the body's columns and dtypes, the optional text section, the header's keys and the bounds the format fixes.

Everything here is a constant or plain arithmetic on them ([`body_size`], [`is_int`]): the limits
([`trl_ftis.exchange.limits`]), the checks ([`trl_ftis.exchange.checks`], [`trl_ftis.exchange.text`]), the frame
([`trl_ftis.exchange.frame`]), the codec ([`trl_ftis.exchange.wire`]) and the `dir://` transport's completeness hint
all read the layout from here. `docs/wire-format.md` draws it. Standard library and numpy only.
"""

from __future__ import annotations

import numbers
import struct
from typing import Any

import numpy as np

from ..peer_ids import PEER_ID_MAX_CHARS
from .keys import ED25519_SIGNATURE_SIZE

__all__ = [
    "COMPACT_LOGP_ABS_ERROR",
    "COMPACT_LOGP_REL_ERROR",
    "FIXED_PER_COMPLETION",
    "FLAG_COMPACT",
    "FLAG_COMPRESSED",
    "FLAG_ED25519",
    "FLAG_SIGNED",
    "FLOAT16_MIN",
    "HEADER_KEYS",
    "ID_DTYPES",
    "KNOWN_FLAGS",
    "LOGP_DTYPES",
    "MAGIC",
    "MAX_CREATED",
    "MAX_JSON_DEPTH",
    "MAX_NAME_CHARS",
    "MAX_REWARD_NAME_CHARS",
    "MAX_ROUND",
    "MAX_TRAILER_BYTES",
    "NO_TEXT",
    "OPTIONAL_HEADER_KEYS",
    "PREAMBLE",
    "PREAMBLE_SIZE",
    "SCHEMA_VERSION",
    "SIGNATURE_SIZE",
    "TEXT_FLAGS_UNKNOWN",
    "TEXT_FLAG_EOS",
    "TEXT_PER_COMPLETION",
    "ZLIB_LEVEL",
    "body_size",
    "is_int",
]

# --------------------------------------------------------------------------------------------------------------
# The frame: preamble, header, body, trailers

SCHEMA_VERSION = 1
"""Version of the layout below; a receiver rejects messages with a newer version (reason `"version"`)."""

MAGIC = b"FTIS"
PREAMBLE = struct.Struct("<4sHHIQ")
"""magic, schema version (u16), flags (u16), header length (u32), body length (u64); all little-endian."""
PREAMBLE_SIZE = PREAMBLE.size  # 20 bytes
SIGNATURE_SIZE = 32  # HMAC-SHA256 digest

FLAG_SIGNED = 1 << 0  # an HMAC-SHA256 (swarm secret) trailer
FLAG_COMPACT = 1 << 1
FLAG_COMPRESSED = 1 << 2
FLAG_ED25519 = 1 << 3  # an Ed25519 (per-peer key) block: signer id length (u8), signer id, 64-byte signature
KNOWN_FLAGS = FLAG_SIGNED | FLAG_COMPACT | FLAG_COMPRESSED | FLAG_ED25519
MAX_TRAILER_BYTES = 1 + PEER_ID_MAX_CHARS + ED25519_SIGNATURE_SIZE + SIGNATURE_SIZE
"""The longest signature trailers: the Ed25519 block with the longest signer id, then the HMAC."""

# --------------------------------------------------------------------------------------------------------------
# The header (JSON)

HEADER_KEYS = ("sender", "round", "created", "tokenizer_fingerprint", "tokenizer_name", "temperature")
HEADER_KEYS += ("reward_names", "groups", "counts", "dtypes")
OPTIONAL_HEADER_KEYS = ("model", "text_bytes", "final", "swarm", "run", "epoch", "sampling")
SAMPLING_LOGPS = ("sampler", "generation", "trainer")
"""What a message's generator log-probs are (`Message.sampling["logps"]`; `trl_ftis.own_rows.LOGPS_SOURCES`)."""
"""Keys a header may carry or leave out (added after schema version 1 without breaking it)."""
MAX_JSON_DEPTH = 32  # a chat prompt reaches depth 6 in the header; anything near 32 is hostile
MAX_ROUND = 2**63 - 1  # fits int64 wherever a round is stored
MAX_EPOCH = 2**63 - 1  # a sender's start (`Message.epoch`), int64 too
MAX_CREATED = 253_402_300_799.0  # 9999-12-31T23:59:59Z: datetime.fromtimestamp works on every accepted value
MAX_NAME_CHARS = 4096  # tokenizer_name and model (a name_or_path can be a long local path)
MAX_REWARD_NAME_CHARS = 256

# --------------------------------------------------------------------------------------------------------------
# The body: columns, then the optional text section

ID_DTYPES = {"<i4": np.dtype("<i4"), "<u2": np.dtype("<u2")}
LOGP_DTYPES = {"<f4": np.dtype("<f4"), "<f2": np.dtype("<f2")}
FIXED_PER_COMPLETION = 12
"""Fixed part of the body per completion: group index (u32), length (u32), reward (f32); then K f32 per completion."""
# The optional text section (header key "text_bytes"): N x <u4 byte lengths, N x u8 flags, then the UTF-8 bytes.
NO_TEXT = 0xFFFFFFFF  # the length of a completion without text
TEXT_FLAG_EOS = 1 << 0  # the completion ended with the sender's end-of-sequence token
TEXT_FLAGS_UNKNOWN = 0xFF & ~TEXT_FLAG_EOS  # must be 0
TEXT_PER_COMPLETION = 5  # its length (u4) and flags (u8)

# --------------------------------------------------------------------------------------------------------------
# Compact mode

COMPACT_LOGP_REL_ERROR = 2.0**-11
"""Compact mode sends log-probs as float16: round-to-nearest with a 10-bit mantissa, so the relative error of a
log-prob is at most 2^-11 (about 4.9e-4), e.g. at most 0.0098 nats at -20 nats."""
COMPACT_LOGP_ABS_ERROR = 2.0**-25
"""Below float16's smallest normal (6.1e-5 in magnitude) the error is absolute instead: at most 2^-25 (3e-8)."""
FLOAT16_MIN = float(np.finfo(np.float16).min)  # -65504: compact mode clamps lower log-probs to this
ZLIB_LEVEL = 1
"""Level 1: on ids + float16 log-probs, levels 3-9 gain < 1% in size and cost up to 5x the time (measured)."""


def is_int(value: Any) -> bool:
    """Whether `value` is an integer the format counts as one: a Python or numpy integer, never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def body_size(
    *, completions: int, tokens: int, reward_functions: int, id_size: int, logp_size: int, text_bytes: int | None
) -> int:
    """Exact size of an uncompressed body (Python ints: no overflow): the columns of `completions` rows with
    `reward_functions` rewards each and `tokens` ids and log-probs of the given item sizes, plus the text section
    when `text_bytes` is not None."""
    size = completions * (FIXED_PER_COMPLETION + 4 * reward_functions) + tokens * (id_size + logp_size)
    if text_bytes is not None:
        size += TEXT_PER_COMPLETION * completions + text_bytes
    return size
