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

This module is the codec: [`encode_message`], [`decode_message`] and [`peek_header`], built on the modules of the
format below it, one concern each, none importing another's private names (and no import cycle):

* [`trl_ftis.exchange.errors`]: [`ExchangeError`] and its [`REASONS`];
* [`trl_ftis.exchange.layout`]: the byte layout's constants (preamble, flags, dtypes, sizes, fixed bounds);
* [`trl_ftis.exchange.limits`]: [`Limits`], what a receiver accepts;
* [`trl_ftis.exchange.message`]: [`Message`], [`WireGroup`], [`WireCompletion`];
* [`trl_ftis.exchange.checks`]: the header and column checks encode and decode share;
* [`trl_ftis.exchange.text`]: the optional text section;
* [`trl_ftis.exchange.frame`]: the preamble and the signature trailers, sealed and verified;
* [`trl_ftis.exchange.fingerprint`]: [`tokenizer_fingerprint`].

Each name is imported from the module that defines it (or from `trl_ftis.exchange`, the package's front door). It
depends on the standard library and numpy only (no torch, no transformers); Ed25519 keys need the `cryptography`
package, imported on first use ([`trl_ftis.exchange.keys`]).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from . import keys
from .checks import Columns, Header, check_columns, check_header, check_sender, has_lone_surrogate, header_body_size
from .errors import ExchangeError, refusal
from .frame import Frame, read_frame, seal, secret_key, verify
from .layout import (
    FLAG_COMPACT,
    FLAG_COMPRESSED,
    FLAG_ED25519,
    FLAG_SIGNED,
    FLOAT16_MIN,
    ID_DTYPES,
    LOGP_DTYPES,
    MAX_JSON_DEPTH,
    PREAMBLE,
    PREAMBLE_SIZE,
    TEXT_FLAG_EOS,
    ZLIB_LEVEL,
    is_int,
)
from .limits import Limits
from .message import Message, WireCompletion, WireGroup
from .text import check_text_columns, decode_texts, encode_texts

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["decode_message", "encode_message", "is_signed", "peek_header"]

# --------------------------------------------------------------------------------------------------------------
# Encode


def _to_json(value: Any, path: str, depth: int = 0) -> Any:
    """Plain JSON values from dataset values: numpy scalars/arrays and tuples become Python ints/floats/lists."""
    if depth > MAX_JSON_DEPTH:
        raise ExchangeError("header", f"{path} is nested deeper than {MAX_JSON_DEPTH} levels (or is cyclic)")
    if isinstance(value, str):
        if has_lone_surrogate(value):
            raise ExchangeError("header", f"{path} holds a lone surrogate, which is not valid Unicode")
        return str(value)  # np.str_ -> str
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if is_int(value):
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
            if not isinstance(key, str) or has_lone_surrogate(key):
                raise ExchangeError("header", f"{path} has a key {key!r:.40} that is not a valid string")
            out[str(key)] = _to_json(item, f"{path}[{key!r}]", depth + 1)
        return out
    raise ExchangeError("header", f"{path} is a {type(value).__name__}, which is not JSON-able")


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
        if not is_int(c.group) or c.group < 0:
            raise refusal("shape", f"completions[{i}].group must be a non-negative int, got {c.group!r}", sender)
        group[i] = min(int(c.group), 2**32 - 1)  # out-of-range indices are reported by check_columns
        cid, clp = np.asarray(c.completion_ids), np.asarray(c.generator_logps)
        if cid.ndim != 1 or cid.size < 1 or clp.shape != cid.shape:
            raise refusal(
                "shape",
                f"completions[{i}]: ids {cid.shape} and log-probs {clp.shape} must be equal 1-d shapes, length >= 1",
                sender,
            )
        if cid.dtype.kind not in "iu":
            raise refusal("ids", f"completions[{i}].completion_ids must be integers, got {cid.dtype}", sender)
        if cid.min() < 0 or cid.max() > np.iinfo(np.int32).max:
            raise refusal("ids", f"completions[{i}] has a token id outside [0, 2^31)", sender)
        if clp.dtype.kind not in "fiu":
            raise refusal("logps", f"completions[{i}].generator_logps must be floats, got {clp.dtype}", sender)
        try:
            reward[i] = float(c.reward)
        except (TypeError, ValueError, OverflowError):
            raise refusal("rewards", f"completions[{i}].reward {c.reward!r} is not a number", sender) from None
        rpf = np.asarray([] if c.rewards_per_func is None else c.rewards_per_func)
        if rpf.shape != (k,) or rpf.dtype.kind not in "fiu":
            raise refusal(
                "shape", f"completions[{i}].rewards_per_func has shape {rpf.shape}, expected ({k},) numbers", sender
            )
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, reported by check_columns
            rewards_per_func[i] = rpf
        length[i] = cid.size
        ids.append(cid.astype(np.int64, copy=False))
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> -inf, reported by check_columns
            logps.append(clp.astype(np.float32, copy=False))
    ids_all = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    logps_all = np.concatenate(logps) if logps else np.zeros(0, dtype=np.float32)
    with np.errstate(over="ignore"):  # an overflowing reward becomes inf and is reported as such
        reward32 = reward.astype(np.float32)
    return group, length, reward32, rewards_per_func, ids_all, logps_all


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
        keys.check_private_key(private_key)
    if not isinstance(message, Message):
        raise TypeError(f"encode_message expects a Message, got {type(message).__name__}")
    compact = bool(message.compact if compact is None else compact)
    compress = compact if compress is None else bool(compress)
    sender = check_sender(message.sender)
    if not isinstance(message.reward_names, (list, tuple)) or not isinstance(message.groups, (list, tuple)):
        raise refusal("header", "reward_names and groups must be lists", sender)
    if not isinstance(message.completions, (list, tuple)):
        raise refusal("header", "completions must be a list", sender)
    k = len(message.reward_names)
    group, length, reward, rewards_per_func, ids, logps = _completion_arrays(message, k, sender)
    texts = encode_texts(message, limits, sender)

    if compact:
        ids_dtype = "<u2" if ids.size == 0 or int(ids.max()) < 2**16 else "<i4"
        logps_dtype = "<f2"
    else:
        ids_dtype, logps_dtype = "<i4", "<f4"

    groups = []
    for i, g in enumerate(message.groups):
        if not isinstance(g, WireGroup):
            raise refusal("header", f"groups[{i}] is a {type(g).__name__}, not a WireGroup", sender)
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
    if message.final:
        header["final"] = True
    for key in ("swarm", "run"):
        value = getattr(message, key)
        if value:
            header[key] = _to_json(value, key)
    if message.epoch:
        header["epoch"] = _to_json(message.epoch, "epoch")
    if message.sampling:
        header["sampling"] = _to_json(dict(message.sampling), "sampling")
    parsed = check_header(header, compact, limits)
    # The receiver's checks, on the values as given (so a -inf log-prob is an error, not clamped away).
    columns = Columns(
        group=group.astype(np.uint32),
        length=length.astype(np.uint32),
        reward=reward,
        rewards_per_func=rewards_per_func,
        ids=ids,
        logps=logps,
    )
    check_columns(columns, parsed, vocab_limit=None, limits=limits)
    if texts is not None:
        check_text_columns(texts[0], texts[1], parsed, limits)
    if compact:
        # float16 holds [-65504, 65504]: a lower log-prob would become -inf. Such a token is astronomically
        # unlikely and its weight min(exp(lθ - lgen), C) is capped at C either way, so clamp rather than fail;
        # the <= MAX_LOGP rounding slack above 0 becomes 0, so float16 rounding cannot push it past MAX_LOGP,
        # and the lowest float16 >= min_logp is the floor, so rounding cannot push a value below min_logp either.
        floor = np.float16(max(limits.min_logp, FLOAT16_MIN))
        if float(floor) < limits.min_logp:
            floor = np.nextafter(floor, np.float16(0))
        logps_wire = np.maximum(np.clip(logps, FLOAT16_MIN, 0.0).astype("<f2"), floor)
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
        raise refusal("too_large", f"the body has {len(body)} bytes, more than {limits.max_message_bytes}", sender)
    if compress:
        body = zlib.compress(body, ZLIB_LEVEL)
    flags = (FLAG_SIGNED if secret is not None else 0) | (FLAG_COMPACT if compact else 0)
    flags |= FLAG_COMPRESSED if compress else 0
    if len(header_bytes) > limits.max_header_bytes:
        raise refusal(
            "too_large", f"the header has {len(header_bytes)} bytes, more than {limits.max_header_bytes}", sender
        )
    flags |= FLAG_ED25519 if private_key is not None else 0
    data = seal(flags, header_bytes, body, sender=sender, secret=secret, private_key=private_key)
    if len(data) > limits.max_message_bytes:
        raise refusal("too_large", f"the message has {len(data)} bytes, more than {limits.max_message_bytes}", sender)
    return data


# --------------------------------------------------------------------------------------------------------------
# Decode


def _reject_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return out


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _parse_header(frame: Frame, limits: Limits) -> Header:
    raw = bytes(frame.view[PREAMBLE_SIZE : PREAMBLE_SIZE + frame.header_length])
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)
    except RecursionError:  # hostile nesting; json's C scanner guards its own recursion
        raise ExchangeError("header", "message: the JSON header is nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ExchangeError("header", f"message: the header is not valid UTF-8 JSON ({error})") from None
    return check_header(header, frame.compact, limits)


def _inflate(payload: memoryview, expected: int, sender: str) -> bytes:
    """zlib-decompresses at most `expected` bytes (+1 to detect more): a zip bomb never gets its memory."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(payload, expected + 1)  # max_length 0 would mean "unlimited"; +1 avoids it
    except zlib.error as error:
        raise refusal("body", f"the compressed body is corrupt ({error})", sender) from None
    if len(out) > expected or inflater.unconsumed_tail:
        raise refusal("too_large", f"the body decompresses to more than the {expected} bytes declared", sender)
    if not inflater.eof:
        raise refusal("truncated", "the compressed body ends early", sender)
    if inflater.unused_data:
        raise refusal("body", f"{len(inflater.unused_data)} bytes after the end of the compressed body", sender)
    if len(out) != expected:
        raise refusal("shape", f"the body decompresses to {len(out)} bytes, the header declares {expected}", sender)
    return out


def _open(
    data: Any,
    secret,
    public_keys,
    limits: Limits,
    *,
    need_body: bool,
    swarm: str | None = None,
    run: str | None = None,
) -> tuple[Frame, Header]:
    """Frame, signatures, then (and only then) the header and the swarm and run it is bound to: what decode_message and
    peek_header share."""
    key = None if secret is None else secret_key(secret)
    required = (FLAG_SIGNED if key is not None else 0) | (FLAG_ED25519 if public_keys is not None else 0)
    frame = read_frame(data, limits, need_body=need_body or bool(required), required_flags=required)
    verify(frame, key, public_keys)
    header = _parse_header(frame, limits)
    if public_keys is not None and header.sender != frame.signer:  # identity: the key's owner is the sender
        problem = f"signed with peer {frame.signer!r}'s key, but names {header.sender!r}"
        raise refusal("identity", problem, header.sender)
    for reason, expected, theirs in (("swarm", swarm, header.swarm), ("run", run, header.run)):
        if expected and theirs != expected:  # inside what was signed: a replay of another run cannot change it
            named = f"names {reason} {theirs!r}" if theirs else f"names no {reason}"
            raise refusal(reason, f"it {named}, and this peer is bound to {reason} {expected!r}", header.sender)
    return frame, header


def decode_message(
    data: bytes,
    *,
    secret: bytes | str | None = None,
    public_keys: Mapping[str, Ed25519PublicKey] | None = None,
    vocab_limit: int | None = None,
    limits: Limits = Limits(),  # noqa: B008 - a frozen dataclass
    swarm: str | None = None,
    run: str | None = None,
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
        swarm / run: when given (non-empty), the message's header must name this swarm (else `"swarm"`) and this run
            (else `"run"`), checked right after the signatures, before the body is read. They are inside what is
            signed, so a signed message of another swarm or an earlier run cannot be replayed into this one.

    Signatures are verified on the exact signed bytes before the header or the body is parsed: a stranger's
    message costs one pass of HMAC/Ed25519 hashing over bytes already in memory, nothing more. Without `secret`
    and `public_keys` no signature is checked. The returned arrays are fresh, writable copies (ids int32,
    log-probs and rewards float32). Completions carry their `text` (strict UTF-8) and `ends_with_eos` when the
    message has a text section, else None and False.
    """
    frame, header = _open(data, secret, public_keys, limits, need_body=True, swarm=swarm, run=run)
    view = frame.view
    sender = header.sender

    expected_size = header_body_size(header)
    body_start = PREAMBLE_SIZE + frame.header_length
    payload = view[body_start : frame.body_end]
    if frame.compressed:
        if expected_size > limits.max_message_bytes:
            raise refusal(
                "too_large", f"the body would decompress to {expected_size} bytes, more than the limit", sender
            )
        body: bytes | memoryview = _inflate(payload, expected_size, sender)
    else:
        if frame.body_length != expected_size:
            raise refusal(
                "shape", f"the body has {frame.body_length} bytes, the header's counts imply {expected_size}", sender
            )
        body = payload

    n, t, k = header.num_completions, header.num_tokens, len(header.reward_names)
    id_dtype, logp_dtype = ID_DTYPES[header.ids_dtype], LOGP_DTYPES[header.logps_dtype]
    offset = 0

    def take(dtype: np.dtype, count: int) -> np.ndarray:
        nonlocal offset
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
        offset += count * dtype.itemsize
        return array

    columns = Columns(
        group=take(np.dtype("<u4"), n).astype(np.uint32),
        length=take(np.dtype("<u4"), n).astype(np.uint32),
        reward=take(np.dtype("<f4"), n).astype(np.float32),
        rewards_per_func=take(np.dtype("<f4"), n * k).astype(np.float32).reshape(n, k),
        ids=take(id_dtype, t).astype(np.int32),
        logps=take(logp_dtype, t).astype(np.float32),
    )
    starts = check_columns(columns, header, vocab_limit=vocab_limit, limits=limits)
    texts: list[str | None] = [None] * n
    eos = [False] * n
    if header.text_bytes is not None:  # the text section: lengths and flags checked before a text byte is read
        text_lengths, text_flags = take(np.dtype("<u4"), n), take(np.dtype("u1"), n)
        has_text = check_text_columns(text_lengths, text_flags, header, limits)
        texts = decode_texts(memoryview(body)[offset:], text_lengths, has_text, sender)  # no copy of all texts
        eos = ((text_flags & TEXT_FLAG_EOS) != 0).tolist()

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
        final=header.final,
        swarm=header.swarm,
        run=header.run,
        epoch=header.epoch,
        sampling=dict(header.sampling),
    )


def is_signed(data: bytes) -> bool:
    """Whether a message's preamble says it carries a signature (HMAC or Ed25519), without checking anything else:
    for a receiver with no key, to say that it is receiving signed messages it cannot check."""
    if len(data) < PREAMBLE_SIZE:
        return False
    flags = PREAMBLE.unpack(bytes(data[:PREAMBLE_SIZE]))[2]
    return bool(flags & (FLAG_SIGNED | FLAG_ED25519))


def peek_header(
    data: bytes,
    *,
    secret: bytes | str | None = None,
    public_keys: Mapping[str, Ed25519PublicKey] | None = None,
    limits: Limits = Limits(),  # noqa: B008 - a frozen dataclass
    swarm: str | None = None,
    run: str | None = None,
) -> dict:
    """The header's small fields, without reading the arrays.

    With `secret` and/or `public_keys`, the signatures are verified first, exactly as [`decode_message`] does
    (the whole message is then needed, and the values are authenticated: `verified` is True). Without them,
    `data` may be just the first `PREAMBLE_SIZE + header_length` bytes and the values are *unauthenticated*:
    use them only to skip a message early, never to trust one. Raises [`ExchangeError`] like [`decode_message`].

    Returns a dict with ``schema_version, signed, ed25519, verified, signer, compact, compressed, sender, round,
    created, tokenizer_fingerprint, tokenizer_name, temperature, reward_names, model, num_groups, num_completions,
    num_tokens, text_bytes, swarm, run, epoch, sampling, header_bytes, body_bytes, message_bytes`` (`signer`: the
    Ed25519 signer when `public_keys` verified it, else None; `text_bytes`: UTF-8 bytes of the completions' texts, 0
    when the message carries none; `swarm`, `run`: what it is bound to, empty when nothing; `epoch`: the sender's
    start, 0 when not sent; `message_bytes`: the size the frame
    declares).
    """
    frame, header = _open(data, secret, public_keys, limits, need_body=False, swarm=swarm, run=run)
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
        "swarm": header.swarm,
        "run": header.run,
        "epoch": header.epoch,
        "sampling": dict(header.sampling),
        "header_bytes": frame.header_length,
        "body_bytes": frame.body_length,
        "message_bytes": frame.total_length,
    }
