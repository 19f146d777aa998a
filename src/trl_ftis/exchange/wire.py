"""The wire format peers use to exchange sampled completions: versioned, typed, size-limited, optionally signed.

A [`Message`] is what one peer publishes for one training step: the prompts it sampled (as the dataset gave
them, so every receiver renders them with its own chat template), and per completion the token ids, the
generator's per-token log-probs and the rewards (optionally also its text, for peers with another tokenizer).
[`encode_message`] turns it into bytes, [`decode_message`] turns bytes from an *untrusted* peer back into a
validated [`Message`].

Decoding never executes anything (no pickle, no `torch.load`, no `eval`): the small text parts are JSON, the
numbers are raw little-endian arrays read with [`numpy.frombuffer`]. Required signatures (a swarm secret, per-peer
Ed25519 keys, or both) are verified on the exact signed bytes right after the fixed-size preamble, before any parser
sees the header or the body. Every declared size and count is checked against [`Limits`] (tight ones:
[`Limits.for_receiver`]) before the memory it guards is allocated, every number against its range, and every
failure is an [`ExchangeError`] with a short machine-readable `reason`, so a receiver can skip and count a bad peer
with one `except` clause. The byte layout is documented in `docs/wire-format.md`.

This module depends on the standard library and numpy only (no torch, no transformers); Ed25519 keys need the
`cryptography` package, imported on first use ([`trl_ftis.exchange.keys`]).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..rules import PEER_ID_MAX_CHARS, peer_id_problem
from . import keys as _keys
from .checks import (  # noqa: F401 - _MAX_CREATED: tests read it through this module
    _ID_DTYPES,
    _LOGP_DTYPES,
    _MAX_CREATED,
    _MAX_JSON_DEPTH,
    _NO_TEXT,
    _SURROGATE_RE,
    _TEXT_FLAG_EOS,
    REASONS,
    ExchangeError,
    _body_size,
    _check_columns,
    _check_header,
    _check_sender,
    _check_text_columns,
    _Columns,
    _decode_texts,
    _fail,
    _Header,
    _is_int,
)
from .fingerprint import tokenizer_fingerprint
from .limits import Limits

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "COMPACT_LOGP_ABS_ERROR",
    "COMPACT_LOGP_REL_ERROR",
    "ED25519_SIGNATURE_SIZE",
    "MAGIC",
    "PREAMBLE_SIZE",
    "REASONS",
    "SCHEMA_VERSION",
    "SIGNATURE_SIZE",
    "ExchangeError",
    "Limits",
    "Message",
    "WireCompletion",
    "WireGroup",
    "decode_message",
    "encode_message",
    "peek_header",
    "tokenizer_fingerprint",
]

SCHEMA_VERSION = 1
"""Version of the layout below; a receiver rejects messages with a newer version (reason `"version"`)."""

MAGIC = b"FTIS"
# magic, schema version (u16), flags (u16), header length (u32), body length (u64); all little-endian.
_PREAMBLE = struct.Struct("<4sHHIQ")
PREAMBLE_SIZE = _PREAMBLE.size  # 20 bytes
SIGNATURE_SIZE = 32  # HMAC-SHA256 digest
ED25519_SIGNATURE_SIZE = _keys.SIGNATURE_SIZE  # 64

FLAG_SIGNED = 1 << 0  # an HMAC-SHA256 (swarm secret) trailer
FLAG_COMPACT = 1 << 1
FLAG_COMPRESSED = 1 << 2
FLAG_ED25519 = 1 << 3  # an Ed25519 (per-peer key) block: signer id length (u8), signer id, 64-byte signature
_KNOWN_FLAGS = FLAG_SIGNED | FLAG_COMPACT | FLAG_COMPRESSED | FLAG_ED25519
_MAX_TRAILER_BYTES = 1 + PEER_ID_MAX_CHARS + ED25519_SIGNATURE_SIZE + SIGNATURE_SIZE

COMPACT_LOGP_REL_ERROR = 2.0**-11
"""Compact mode sends log-probs as float16: round-to-nearest with a 10-bit mantissa, so the relative error of a
log-prob is at most 2^-11 (about 4.9e-4), e.g. at most 0.0098 nats at -20 nats."""
COMPACT_LOGP_ABS_ERROR = 2.0**-25
"""Below float16's smallest normal (6.1e-5 in magnitude) the error is absolute instead: at most 2^-25 (3e-8)."""
_FLOAT16_MIN = float(np.finfo(np.float16).min)  # -65504: compact mode clamps lower log-probs to this

# Level 1: on ids + float16 log-probs, levels 3-9 gain < 1% in size and cost up to 5x the time (measured).
_ZLIB_LEVEL = 1


@dataclass
class WireGroup:
    """One prompt; several completions may point at it (`WireCompletion.group`)."""

    prompt: Any
    """A string, or a list of chat messages: dicts with string keys and string (or null) values."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The dataset row's other JSON-able columns, e.g. `{"answer": "47"}` (reward functions may read them)."""


@dataclass(eq=False)  # eq=False: comparing numpy arrays with == is elementwise, a generated __eq__ would raise
class WireCompletion:
    """One sampled completion."""

    group: int
    """Index into [`Message.groups`]."""
    completion_ids: np.ndarray
    """Token ids, int32 or int64, shape `(L,)` with `L >= 1`; decoded messages hold int32."""
    generator_logps: np.ndarray
    """The generator's full-softmax log-prob of each token at the shared temperature: float32, `(L,)`, finite,
    `<= 0` (up to [`MAX_LOGP`] of rounding slack)."""
    reward: float
    """Total reward, finite; it travels as float32."""
    rewards_per_func: np.ndarray
    """float32, shape `(K,)` with `K = len(Message.reward_names)`; NaN where a reward function returned None."""
    text: str | None = None
    """The completion as text, decoded with the sender's tokenizer, without the end-of-sequence token; None: not
    sent. Lets peers with another tokenizer re-tokenise it (`docs/wire-format.md`, "The text section")."""
    ends_with_eos: bool = False
    """The completion ended with the sender's end-of-sequence token (not part of `text`); receivers with another
    tokenizer append their own. Sent only with `text` (ignored when `text` is None)."""


@dataclass(eq=False)
class Message:
    """Everything one peer shares for one training step."""

    sender: str
    """Peer id, by the rule of [`trl_ftis.rules.peer_id_problem`] (transports use it in file names and keys)."""
    round: int
    """The sender's training step, `>= 0`."""
    tokenizer_fingerprint: str
    """Hex SHA-256 from [`tokenizer_fingerprint`]; receivers compare it with their own."""
    tokenizer_name: str
    """Human-readable name of the tokenizer (e.g. its `name_or_path`), only for error messages."""
    temperature: float
    """Sampling temperature of the generator log-probs, `> 0`."""
    reward_names: list[str]
    groups: list[WireGroup]
    completions: list[WireCompletion]
    created: float = field(default_factory=time.time)
    """Unix seconds, set by the sender (for staleness checks)."""
    model: str = ""
    """The sender's model (name or path), for logs, summaries and model cards; optional (empty: not sent)."""
    compact: bool = False
    """How the message was (or is to be) encoded; [`decode_message`] sets it."""

    def num_tokens(self) -> int:
        """Total number of completion tokens."""
        return sum(len(c.completion_ids) for c in self.completions)


# --------------------------------------------------------------------------------------------------------------
# Encode


def _to_json(value: Any, path: str, depth: int = 0) -> Any:
    """Plain JSON values from dataset values: numpy scalars/arrays and tuples become Python ints/floats/lists."""
    if depth > _MAX_JSON_DEPTH:
        raise ExchangeError("header", f"{path} is nested deeper than {_MAX_JSON_DEPTH} levels (or is cyclic)")
    if isinstance(value, str):
        if _SURROGATE_RE.search(value):
            raise ExchangeError("header", f"{path} holds a lone surrogate, which is not valid Unicode")
        return str(value)  # np.str_ -> str
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if _is_int(value):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ExchangeError("header", f"{path} is {float(value)!r}, which JSON cannot carry")
        return float(value)
    if isinstance(value, np.ndarray):
        return _to_json(value.tolist(), path, depth)
    if isinstance(value, (list, tuple)):
        return [_to_json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or _SURROGATE_RE.search(key):
                raise ExchangeError("header", f"{path} has a key {key!r:.40} that is not a valid string")
            out[str(key)] = _to_json(item, f"{path}[{key!r}]", depth + 1)
        return out
    raise ExchangeError("header", f"{path} is a {type(value).__name__}, which is not JSON-able")


def _secret_key(secret: bytes | str) -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("the exchange secret is empty; pass None to disable signing")
    return key


def _completion_arrays(message: Message, k: int, sender: str):
    """Validated per-completion inputs, concatenated (ids as int64, log-probs as float32)."""
    n = len(message.completions)
    group = np.zeros(n, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    reward = np.zeros(n, dtype=np.float64)
    rewards_per_func = np.zeros((n, k), dtype=np.float32)
    ids, logps = [], []
    for i, c in enumerate(message.completions):
        if not isinstance(c, WireCompletion):
            raise ExchangeError("shape", f"completions[{i}] is a {type(c).__name__}, not a WireCompletion")
        if not _is_int(c.group) or c.group < 0:
            raise _fail("shape", f"completions[{i}].group must be a non-negative int, got {c.group!r}", sender)
        group[i] = min(int(c.group), 2**32 - 1)  # out-of-range indices are reported by _check_columns
        cid, clp = np.asarray(c.completion_ids), np.asarray(c.generator_logps)
        if cid.ndim != 1 or cid.size < 1 or clp.shape != cid.shape:
            raise _fail(
                "shape",
                f"completions[{i}]: ids {cid.shape} and log-probs {clp.shape} must be equal 1-d shapes, length >= 1",
                sender,
            )
        if cid.dtype.kind not in "iu":
            raise _fail("ids", f"completions[{i}].completion_ids must be integers, got {cid.dtype}", sender)
        if cid.min() < 0 or cid.max() > np.iinfo(np.int32).max:
            raise _fail("ids", f"completions[{i}] has a token id outside [0, 2^31)", sender)
        if clp.dtype.kind not in "fiu":
            raise _fail("logps", f"completions[{i}].generator_logps must be floats, got {clp.dtype}", sender)
        try:
            reward[i] = float(c.reward)
        except (TypeError, ValueError, OverflowError):
            raise _fail("rewards", f"completions[{i}].reward {c.reward!r} is not a number", sender) from None
        rpf = np.asarray([] if c.rewards_per_func is None else c.rewards_per_func)
        if rpf.shape != (k,) or rpf.dtype.kind not in "fiu":
            raise _fail(
                "shape", f"completions[{i}].rewards_per_func has shape {rpf.shape}, expected ({k},) numbers", sender
            )
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, reported by _check_columns
            rewards_per_func[i] = rpf
        length[i] = cid.size
        ids.append(cid.astype(np.int64, copy=False))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> -inf, reported by _check_columns
            logps.append(clp.astype(np.float32, copy=False))
    ids_all = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    logps_all = np.concatenate(logps) if logps else np.zeros(0, dtype=np.float32)
    with np.errstate(over="ignore"):  # an overflowing reward becomes inf and is reported as such
        reward32 = reward.astype(np.float32)
    return group, length, reward32, rewards_per_func, ids_all, logps_all


def _completion_texts(message: Message, limits: Limits, sender: str) -> tuple[np.ndarray, np.ndarray, bytes] | None:
    """The text section (lengths, flags, concatenated UTF-8 bytes), validated as a receiver will check it; None when
    no completion has a text (the message then has no section, and `ends_with_eos` is not sent)."""
    completions = message.completions
    if all(c.text is None for c in completions):
        return None
    lengths = np.full(len(completions), _NO_TEXT, dtype=np.int64)
    flags = np.zeros(len(completions), dtype=np.uint8)
    encoded = []
    for i, c in enumerate(completions):
        if c.text is None:
            continue  # flags 0: ends_with_eos travels only with a text
        if not isinstance(c.text, str):
            raise _fail("text", f"completions[{i}].text must be a string or None, not {type(c.text).__name__}", sender)
        try:
            data = c.text.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("text", f"completions[{i}].text holds a lone surrogate (not valid Unicode)", sender) from None
        limit = limits.max_completion_text_bytes
        if len(data) > limit or len(data) >= _NO_TEXT:
            raise _fail("limits", f"completions[{i}].text has {len(data)} UTF-8 bytes, more than {limit}", sender)
        if not isinstance(c.ends_with_eos, (bool, np.bool_)):
            problem = f"completions[{i}].ends_with_eos must be a bool, got {c.ends_with_eos!r:.40}"
            raise _fail("text", problem, sender)
        lengths[i] = len(data)
        flags[i] = _TEXT_FLAG_EOS if c.ends_with_eos else 0
        encoded.append(data)
    return lengths, flags, b"".join(encoded)


def encode_message(
    message: Message,
    *,
    secret: bytes | str | None = None,
    private_key: Ed25519PrivateKey | None = None,
    compact: bool | None = None,
    compress: bool | None = None,
    limits: Limits = Limits(),  # noqa: B008 - a frozen dataclass
) -> bytes:
    """The bytes of `message` (layout: `docs/wire-format.md`).

    Args:
        message: what to send. It is validated with the checks a receiver runs (raises [`ExchangeError`], a
            [`ValueError`], naming the problem), and numpy values in prompts/extra become plain JSON.
        secret: the swarm secret (bytes, or str as UTF-8); when set, an HMAC-SHA256 signature is appended.
        private_key: this peer's Ed25519 private key ([`trl_ftis.exchange.keys`]); when set, a block naming
            `message.sender` as the signer and its Ed25519 signature are appended (before the HMAC, if any).
        compact: ids as uint16 (when every id < 65536, else int32) and log-probs as float16 (relative error
            <= [`COMPACT_LOGP_REL_ERROR`]). Default: `message.compact`. Exact mode (`False`) sends int32 ids
            and float32 log-probs, exactly 8 bytes per completion token.
        compress: zlib-compress the body; default: on in compact mode, off in exact mode.
        limits: the encoder refuses messages a receiver with these limits would reject.
    """
    if private_key is not None:
        _keys.check_private_key(private_key)
    if not isinstance(message, Message):
        raise TypeError(f"encode_message expects a Message, got {type(message).__name__}")
    compact = bool(message.compact if compact is None else compact)
    compress = compact if compress is None else bool(compress)
    sender = _check_sender(message.sender)
    if not isinstance(message.reward_names, (list, tuple)) or not isinstance(message.groups, (list, tuple)):
        raise _fail("header", "reward_names and groups must be lists", sender)
    if not isinstance(message.completions, (list, tuple)):
        raise _fail("header", "completions must be a list", sender)
    k = len(message.reward_names)
    group, length, reward, rewards_per_func, ids, logps = _completion_arrays(message, k, sender)
    texts = _completion_texts(message, limits, sender)

    if compact:
        ids_dtype = "<u2" if ids.size == 0 or int(ids.max()) < 2**16 else "<i4"
        logps_dtype = "<f2"
    else:
        ids_dtype, logps_dtype = "<i4", "<f4"

    groups = []
    for i, g in enumerate(message.groups):
        if not isinstance(g, WireGroup):
            raise _fail("header", f"groups[{i}] is a {type(g).__name__}, not a WireGroup", sender)
        groups.append(
            {
                "prompt": _to_json(g.prompt, f"groups[{i}].prompt"),
                "extra": _to_json({} if g.extra is None else g.extra, f"groups[{i}].extra"),
            }
        )
    header = {
        "sender": sender,
        "round": _to_json(message.round, "round"),
        "created": _to_json(message.created, "created"),
        "tokenizer_fingerprint": message.tokenizer_fingerprint,
        "tokenizer_name": message.tokenizer_name,
        "temperature": _to_json(message.temperature, "temperature"),
        "reward_names": _to_json(list(message.reward_names), "reward_names"),
        "groups": groups,
        "counts": {"completions": len(message.completions), "tokens": int(ids.size)},
        "dtypes": {"ids": ids_dtype, "logps": logps_dtype},
    }
    if message.model:
        header["model"] = message.model
    if texts is not None:
        header["text_bytes"] = len(texts[2])
    parsed = _check_header(header, compact, limits)
    # The receiver's checks, on the values as given (so a -inf log-prob is an error, not clamped away).
    columns = _Columns(
        group=group.astype(np.uint32),
        length=length.astype(np.uint32),
        reward=reward,
        rewards_per_func=rewards_per_func,
        ids=ids,
        logps=logps,
    )
    _check_columns(columns, parsed, vocab_limit=None, limits=limits)
    if texts is not None:
        _check_text_columns(texts[0], texts[1], parsed, limits)
    if compact:
        # float16 holds [-65504, 65504]: a lower log-prob would become -inf. Such a token is astronomically
        # unlikely and its weight min(exp(lθ - lgen), C) is capped at C either way, so clamp rather than fail;
        # the <= MAX_LOGP rounding slack above 0 becomes 0, so float16 rounding cannot push it past MAX_LOGP,
        # and the lowest float16 >= min_logp is the floor, so rounding cannot push a value below min_logp either.
        floor = np.float16(max(limits.min_logp, _FLOAT16_MIN))
        if float(floor) < limits.min_logp:
            floor = np.nextafter(floor, np.float16(0))
        logps_wire = np.maximum(np.clip(logps, _FLOAT16_MIN, 0.0).astype("<f2"), floor)
    else:
        logps_wire = logps.astype("<f4")

    header_bytes = json.dumps(header, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    text_section = []  # after the log-probs: lengths (no text: 0xFFFFFFFF), flags, the concatenated UTF-8 bytes
    if texts is not None:
        text_section = [texts[0].astype("<u4").tobytes(), texts[1].astype("u1").tobytes(), texts[2]]
    body = b"".join(
        [
            group.astype("<u4").tobytes(),
            length.astype("<u4").tobytes(),
            reward.astype("<f4").tobytes(),
            rewards_per_func.astype("<f4").tobytes(),  # row-major: completion 0's K values, then completion 1's
            ids.astype(ids_dtype).tobytes(),
            logps_wire.tobytes(),
            *text_section,
        ]
    )
    if len(body) > limits.max_message_bytes:  # the receiver bounds the decompressed body the same way
        raise _fail("too_large", f"the body has {len(body)} bytes, more than {limits.max_message_bytes}", sender)
    if compress:
        body = zlib.compress(body, _ZLIB_LEVEL)
    flags = (FLAG_SIGNED if secret is not None else 0) | (FLAG_COMPACT if compact else 0)
    flags |= FLAG_COMPRESSED if compress else 0
    if len(header_bytes) > limits.max_header_bytes:
        raise _fail(
            "too_large", f"the header has {len(header_bytes)} bytes, more than {limits.max_header_bytes}", sender
        )
    flags |= FLAG_ED25519 if private_key is not None else 0
    data = _PREAMBLE.pack(MAGIC, SCHEMA_VERSION, flags, len(header_bytes), len(body)) + header_bytes + body
    if private_key is not None:  # the signer's id, then its signature of everything before the signature
        data += bytes([len(sender)]) + sender.encode("ascii")
        data += _keys.sign(private_key, data)
    if secret is not None:  # the HMAC of everything before it (the Ed25519 block included)
        data += hmac.new(_secret_key(secret), data, hashlib.sha256).digest()
    if len(data) > limits.max_message_bytes:
        raise _fail("too_large", f"the message has {len(data)} bytes, more than {limits.max_message_bytes}", sender)
    return data


# --------------------------------------------------------------------------------------------------------------
# Decode


@dataclass
class _Frame:
    """The preamble's fields and the signature trailers, checked against the limits and the bytes present."""

    view: memoryview
    version: int
    flags: int
    header_length: int
    body_length: int
    total_length: int
    signer: str | None = None
    """The peer id in the Ed25519 block (unverified until [`_verify`] checked it); None without the block or when
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


def _as_view(data: Any) -> memoryview:
    if isinstance(data, (bytes, bytearray)):
        return memoryview(data)
    if isinstance(data, memoryview):
        try:
            return data.cast("B")
        except (TypeError, ValueError):
            raise ExchangeError("header", "message: the buffer is not a contiguous byte buffer") from None
    raise ExchangeError("header", f"message: expected bytes, got {type(data).__name__}")


def _read_frame(data: Any, limits: Limits, *, need_body: bool, required_flags: int = 0) -> _Frame:
    """Parses and checks the preamble (magic, version, flags, declared lengths vs limits and vs the byte count) and,
    with `need_body`, the Ed25519 block's signer id. Only fixed-size fields are read: no parser runs here."""
    view = _as_view(data)
    size = len(view)
    if size > limits.max_message_bytes:
        raise ExchangeError("too_large", f"message: {size} bytes, more than {limits.max_message_bytes}")
    head = bytes(view[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise ExchangeError("magic", f"message: not a trl-ftis message (starts with {head!r}, expected {MAGIC!r})")
    if size < PREAMBLE_SIZE:
        raise ExchangeError("truncated", f"message: {size} bytes, shorter than the {PREAMBLE_SIZE}-byte preamble")
    _, version, flags, header_length, body_length = _PREAMBLE.unpack(view[:PREAMBLE_SIZE])
    if version != SCHEMA_VERSION:
        newer = " (newer than this trl-ftis; upgrade it)" if version > SCHEMA_VERSION else ""
        raise ExchangeError(
            "version", f"message: schema version {version}{newer}, this receiver reads version {SCHEMA_VERSION}"
        )
    if flags & ~_KNOWN_FLAGS:
        raise ExchangeError("header", f"message: unknown flag bits {flags & ~_KNOWN_FLAGS:#x}")
    if required_flags & ~flags:  # from the flags alone: an unsigned message costs 20 bytes of reading
        which = "HMAC" if required_flags & ~flags & FLAG_SIGNED else "Ed25519"
        raise ExchangeError("unsigned", f"message: no {which} signature, but this receiver requires one")
    if header_length > limits.max_header_bytes:
        raise ExchangeError(
            "too_large", f"message: header of {header_length} bytes, more than {limits.max_header_bytes}"
        )
    frame = _Frame(view, version, flags, header_length, body_length, 0)
    total = frame.body_end + (SIGNATURE_SIZE if frame.signed else 0)  # Python ints: a 2**64 claim cannot wrap
    total += 1 + ED25519_SIGNATURE_SIZE if flags & FLAG_ED25519 else 0  # + the signer id, read below
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


def _verify(frame: _Frame, key: bytes | None, public_keys: Mapping[str, Ed25519PublicKey] | None) -> None:
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
        if not _keys.verify(public_key, view[start : start + ED25519_SIGNATURE_SIZE], view[:start]):
            problem = f"the Ed25519 signature does not match peer {signer!r}'s key (forged or tampered)"
            raise ExchangeError("signature", f"message: {problem}")


def _reject_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return out


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _parse_header(frame: _Frame, limits: Limits) -> _Header:
    raw = bytes(frame.view[PREAMBLE_SIZE : PREAMBLE_SIZE + frame.header_length])
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)
    except RecursionError:  # hostile nesting; json's C scanner guards its own recursion
        raise ExchangeError("header", "message: the JSON header is nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ExchangeError("header", f"message: the header is not valid UTF-8 JSON ({error})") from None
    return _check_header(header, frame.compact, limits)


def _inflate(payload: memoryview, expected: int, sender: str) -> bytes:
    """zlib-decompresses at most `expected` bytes (+1 to detect more): a zip bomb never gets its memory."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(payload, expected + 1)  # max_length 0 would mean "unlimited"; +1 avoids it
    except zlib.error as error:
        raise _fail("body", f"the compressed body is corrupt ({error})", sender) from None
    if len(out) > expected or inflater.unconsumed_tail:
        raise _fail("too_large", f"the body decompresses to more than the {expected} bytes declared", sender)
    if not inflater.eof:
        raise _fail("truncated", "the compressed body ends early", sender)
    if inflater.unused_data:
        raise _fail("body", f"{len(inflater.unused_data)} bytes after the end of the compressed body", sender)
    if len(out) != expected:
        raise _fail("shape", f"the body decompresses to {len(out)} bytes, the header declares {expected}", sender)
    return out


def _open(data: Any, secret, public_keys, limits: Limits, *, need_body: bool) -> tuple[_Frame, _Header]:
    """Frame, signatures, then (and only then) the header: what decode_message and peek_header share."""
    key = None if secret is None else _secret_key(secret)
    required = (FLAG_SIGNED if key is not None else 0) | (FLAG_ED25519 if public_keys is not None else 0)
    frame = _read_frame(data, limits, need_body=need_body or bool(required), required_flags=required)
    _verify(frame, key, public_keys)
    header = _parse_header(frame, limits)
    if public_keys is not None and header.sender != frame.signer:  # identity: the key's owner is the sender
        raise _fail("identity", f"signed with peer {frame.signer!r}'s key, but names {header.sender!r}", header.sender)
    return frame, header


def decode_message(
    data: bytes,
    *,
    secret: bytes | str | None = None,
    public_keys: Mapping[str, Ed25519PublicKey] | None = None,
    vocab_limit: int | None = None,
    limits: Limits = Limits(),  # noqa: B008 - a frozen dataclass
) -> Message:
    """Validates and decodes bytes from a peer; raises [`ExchangeError`] (and nothing else) for bad input.

    Args:
        data: the message (bytes, bytearray or memoryview).
        secret: the swarm secret. When set, the message must carry an HMAC (else reason `"unsigned"`, decided from
            the preamble's flags alone) made with this secret (else `"signature"`).
        public_keys: peer id -> Ed25519 public key ([`trl_ftis.exchange.keys.load_public_keys`]). When given (even
            empty), the message must carry an Ed25519 block (else `"unsigned"`) whose signer has a key here (else
            `"unknown_peer"`), a valid signature by that key (else `"signature"`), and a header naming that signer
            as its sender (else `"identity"`). Can be combined with `secret` (membership and identity).
        vocab_limit: when given, every token id must be in `[0, vocab_limit)` (reason `"ids"`); pass the
            receiver's embedding size.
        limits: sizes, counts and number ranges ([`Limits.for_receiver`] derives tight ones), each size checked
            before the memory it guards is allocated.

    Signatures are verified on the exact signed bytes before the header or the body is parsed: a stranger's
    message costs one pass of HMAC/Ed25519 hashing over bytes already in memory, nothing more. Without `secret`
    and `public_keys` no signature is checked. The returned arrays are fresh, writable copies (ids int32,
    log-probs and rewards float32). Completions carry their `text` (strict UTF-8) and `ends_with_eos` when the
    message has a text section, else None and False.
    """
    frame, header = _open(data, secret, public_keys, limits, need_body=True)
    view = frame.view
    sender = header.sender

    expected_size = _body_size(header)
    body_start = PREAMBLE_SIZE + frame.header_length
    payload = view[body_start : frame.body_end]
    if frame.compressed:
        if expected_size > limits.max_message_bytes:
            raise _fail(
                "too_large", f"the body would decompress to {expected_size} bytes, more than the limit", sender
            )
        body: bytes | memoryview = _inflate(payload, expected_size, sender)
    else:
        if frame.body_length != expected_size:
            raise _fail(
                "shape", f"the body has {frame.body_length} bytes, the header's counts imply {expected_size}", sender
            )
        body = payload

    n, t, k = header.num_completions, header.num_tokens, len(header.reward_names)
    id_dtype, logp_dtype = _ID_DTYPES[header.ids_dtype], _LOGP_DTYPES[header.logps_dtype]
    offset = 0

    def take(dtype: np.dtype, count: int) -> np.ndarray:
        nonlocal offset
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
        offset += count * dtype.itemsize
        return array

    columns = _Columns(
        group=take(np.dtype("<u4"), n).astype(np.uint32),
        length=take(np.dtype("<u4"), n).astype(np.uint32),
        reward=take(np.dtype("<f4"), n).astype(np.float32),
        rewards_per_func=take(np.dtype("<f4"), n * k).astype(np.float32).reshape(n, k),
        ids=take(id_dtype, t).astype(np.int32),
        logps=take(logp_dtype, t).astype(np.float32),
    )
    starts = _check_columns(columns, header, vocab_limit=vocab_limit, limits=limits)
    texts: list[str | None] = [None] * n
    eos = [False] * n
    if header.text_bytes is not None:  # the text section: lengths and flags checked before a text byte is read
        text_lengths, text_flags = take(np.dtype("<u4"), n), take(np.dtype("u1"), n)
        has_text = _check_text_columns(text_lengths, text_flags, header, limits)
        texts = _decode_texts(memoryview(body)[offset:], text_lengths, has_text, sender)  # no copy of all texts
        eos = ((text_flags & _TEXT_FLAG_EOS) != 0).tolist()

    completions = []
    for i in range(n):
        start, stop = int(starts[i]), int(starts[i]) + int(columns.length[i])
        completions.append(
            WireCompletion(
                group=int(columns.group[i]),
                completion_ids=columns.ids[start:stop],
                generator_logps=columns.logps[start:stop],
                reward=float(columns.reward[i]),
                rewards_per_func=columns.rewards_per_func[i],
                text=texts[i],
                ends_with_eos=eos[i],
            )
        )
    return Message(
        sender=sender,
        round=header.round,
        tokenizer_fingerprint=header.tokenizer_fingerprint,
        tokenizer_name=header.tokenizer_name,
        temperature=header.temperature,
        reward_names=header.reward_names,
        groups=[WireGroup(prompt=g["prompt"], extra=g["extra"]) for g in header.groups],
        completions=completions,
        created=header.created,
        compact=frame.compact,
        model=header.model,
    )


def peek_header(
    data: bytes,
    *,
    secret: bytes | str | None = None,
    public_keys: Mapping[str, Ed25519PublicKey] | None = None,
    limits: Limits = Limits(),  # noqa: B008 - a frozen dataclass
) -> dict:
    """The header's small fields, without reading the arrays.

    With `secret` and/or `public_keys`, the signatures are verified first, exactly as [`decode_message`] does
    (the whole message is then needed, and the values are authenticated: `verified` is True). Without them,
    `data` may be just the first `PREAMBLE_SIZE + header_length` bytes and the values are *unauthenticated*:
    use them only to skip a message early, never to trust one. Raises [`ExchangeError`] like [`decode_message`].

    Returns a dict with ``schema_version, signed, ed25519, verified, signer, compact, compressed, sender, round,
    created, tokenizer_fingerprint, tokenizer_name, temperature, reward_names, model, num_groups, num_completions,
    num_tokens, text_bytes, header_bytes, body_bytes, message_bytes`` (`signer`: the Ed25519 signer when `public_keys`
    verified it, else None; `text_bytes`: UTF-8 bytes of the completions' texts, 0 when the message carries none;
    `message_bytes`: the size the frame declares).
    """
    frame, header = _open(data, secret, public_keys, limits, need_body=False)
    return {
        "schema_version": frame.version,
        "signed": frame.signed,
        "ed25519": bool(frame.flags & FLAG_ED25519),
        "verified": secret is not None or public_keys is not None,
        "signer": frame.signer if public_keys is not None else None,
        "compact": frame.compact,
        "compressed": frame.compressed,
        "sender": header.sender,
        "round": header.round,
        "created": header.created,
        "tokenizer_fingerprint": header.tokenizer_fingerprint,
        "tokenizer_name": header.tokenizer_name,
        "temperature": header.temperature,
        "reward_names": header.reward_names,
        "model": header.model,
        "num_groups": len(header.groups),
        "num_completions": header.num_completions,
        "num_tokens": header.num_tokens,
        "text_bytes": header.text_bytes or 0,
        "header_bytes": frame.header_length,
        "body_bytes": frame.body_length,
        "message_bytes": frame.total_length,
    }
