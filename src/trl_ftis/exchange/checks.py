"""The checks the wire format runs on every message, shared by [`encode_message`] (so that what it emits decodes) and
[`decode_message`] (on bytes from an *untrusted* peer): the header's types, ranges and limits, the body's arrays and
the optional text section. Every failure is an [`ExchangeError`] with a `reason` from [`REASONS`].

Split from `wire.py` (which frames, signs, encodes and decodes); standard library and numpy only.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..rules import MAX_LOGP, peer_id_problem
from .limits import Limits

_MAX_JSON_DEPTH = 32  # a chat prompt reaches depth 6 in the header; anything near 32 is hostile
_MAX_ROUND = 2**63 - 1  # fits int64 wherever a round is stored
_MAX_CREATED = 253_402_300_799.0  # 9999-12-31T23:59:59Z: datetime.fromtimestamp works on every accepted value
_MAX_NAME_CHARS = 4096  # tokenizer_name (a name_or_path can be a long local path)
_MAX_REWARD_NAME_CHARS = 256
_FINGERPRINT_RE = re.compile(r"[0-9a-f]{64}")
# JSON's "\ud800" escapes decode to lone surrogates: not text, and they cannot be re-encoded as UTF-8.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")

_ID_DTYPES = {"<i4": np.dtype("<i4"), "<u2": np.dtype("<u2")}
_LOGP_DTYPES = {"<f4": np.dtype("<f4"), "<f2": np.dtype("<f2")}
# Fixed part of the body per completion: group index (u32), length (u32), reward (f32); then K f32 per completion.
_FIXED_PER_COMPLETION = 12
_HEADER_KEYS = ("sender", "round", "created", "tokenizer_fingerprint", "tokenizer_name", "temperature")
_HEADER_KEYS += ("reward_names", "groups", "counts", "dtypes")
# Keys a header may carry or leave out (added after schema version 1 without breaking it).
_OPTIONAL_HEADER_KEYS = ("model", "text_bytes")
# The optional text section (header key "text_bytes"): N x <u4 byte lengths, N x u8 flags, then the UTF-8 bytes.
_NO_TEXT = 0xFFFFFFFF  # the length of a completion without text
_TEXT_FLAG_EOS = 1 << 0  # the completion ended with the sender's end-of-sequence token
_TEXT_FLAGS_UNKNOWN = 0xFF & ~_TEXT_FLAG_EOS  # must be 0
_TEXT_PER_COMPLETION = 5  # its length (u4) and flags (u8)

REASONS = frozenset(
    {
        "truncated",  # fewer bytes than the preamble/header declare, or a compressed body that ends early
        "magic",  # not a trl-ftis message
        "version",  # a schema version this code does not read
        "too_large",  # a byte size above Limits, extra bytes after the message, or a zip bomb
        "unsigned",  # a required signature (HMAC and/or Ed25519) is absent: refused from the preamble's flags alone
        "signature",  # an HMAC or Ed25519 signature does not match (or its block is malformed)
        "unknown_peer",  # public keys are required and the signer named in the Ed25519 block has none registered
        "identity",  # validly signed by peer X's key, but the header names another sender
        "header",  # the JSON header is malformed, has wrong types/values/ranges, or a bad sender
        "body",  # the compressed body is not a valid zlib stream
        "shape",  # array sizes/indices inconsistent (body size, lengths, group index, rewards_per_func)
        "ids",  # a token id outside [0, vocab_limit) (or not an integer on encode)
        "logps",  # a log-prob that is not finite, is > MAX_LOGP or < Limits.min_logp
        "rewards",  # a reward not finite or above Limits.max_abs_reward in magnitude (rewards_per_func: NaN allowed)
        "limits",  # a declared count or size above Limits (completions, groups, tokens, reward functions, texts)
        "text",  # a completion's text is not strict UTF-8 (lone surrogates included), or its flags are invalid
    }
)


class ExchangeError(ValueError):
    """The one exception [`decode_message`] and [`peek_header`] raise for bad input.

    `reason` is a short machine code (one of [`REASONS`]), meant for counters such as
    `skipped_messages[reason] += 1`; the message says what was wrong and names the sender when it is known.
    It subclasses [`ValueError`], which is also what [`encode_message`] raises for a bad [`Message`].
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self):  # keep it picklable (multiprocessing), despite the two-argument constructor
        return (type(self), (self.reason, self.message))


# --------------------------------------------------------------------------------------------------------------
# Validation shared by encode and decode: encode runs the same checks a receiver will, so what it emits decodes.


def _fail(reason: str, problem: str, sender: str | None = None) -> ExchangeError:
    prefix = f"message from peer {sender!r}: " if sender else "message: "
    return ExchangeError(reason, prefix + problem)


def _check_sender(sender: Any) -> str:
    # The peer-id rule of the config and the transports: a sender the wire accepts can always publish, and a hostile
    # one can neither escape a directory nor forge log lines.
    problem = peer_id_problem(sender)
    if problem is not None:
        raise _fail("header", f"invalid sender: {problem}")
    return sender


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _finite_float(value: Any) -> float | None:
    """`value` as a finite float, or None when it is not a number, not finite, or an int too large for a float
    (JSON allows 10**400, on which math.isfinite raises OverflowError)."""
    if not _is_number(value):
        return None
    try:
        result = float(value)
    except OverflowError:
        return None
    return result if math.isfinite(result) else None


def _check_json_tree(value: Any, what: str, sender: str | None) -> None:
    """Plain JSON only (dict with str keys, list, str, int, finite float, bool, None), nesting <= the limit,
    strings without lone surrogates.

    Iterative, so hostile nesting cannot exhaust the Python stack.
    """
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_JSON_DEPTH:
            raise _fail("header", f"{what} is nested deeper than {_MAX_JSON_DEPTH} levels", sender)
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise _fail("header", f"{what} has a non-string key {key!r:.40}", sender)
                if _SURROGATE_RE.search(key):
                    raise _fail("header", f"{what} has a key with a lone surrogate", sender)
                stack.append((item, depth + 1))
        elif isinstance(node, str):
            if _SURROGATE_RE.search(node):
                raise _fail("header", f"{what} holds a string with a lone surrogate (not valid Unicode)", sender)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise _fail("header", f"{what} holds a non-finite number {node!r}", sender)
        elif node is not None and not isinstance(node, (str, int, bool)):
            raise _fail("header", f"{what} holds a {type(node).__name__}, which is not JSON", sender)


def _check_prompt(prompt: Any, index: int, sender: str | None) -> None:
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list):
        raise _fail("header", f"groups[{index}].prompt must be a string or a list of messages", sender)
    for j, turn in enumerate(prompt):
        if not isinstance(turn, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in turn.items()
        ):
            raise _fail("header", f"groups[{index}].prompt[{j}] must be a dict of strings (a chat message)", sender)


def _check_printable(value: Any, what: str, max_chars: int, sender: str | None) -> str:
    if not isinstance(value, str) or len(value) > max_chars or not value.isprintable():
        raise _fail("header", f"{what} must be a printable string of at most {max_chars} characters", sender)
    return value


@dataclass
class _Header:
    """The validated JSON header."""

    sender: str
    round: int
    created: float
    tokenizer_fingerprint: str
    tokenizer_name: str
    temperature: float
    reward_names: list[str]
    groups: list[dict]
    num_completions: int
    num_tokens: int
    ids_dtype: str
    logps_dtype: str
    model: str = ""
    text_bytes: int | None = None
    """Total UTF-8 bytes of the texts; None: the message has no text section."""


def _check_header(header: Any, compact: bool, limits: Limits) -> _Header:
    """Types, shapes and limits of the JSON header (arrays are checked separately)."""
    if not isinstance(header, dict):
        raise _fail("header", f"the header must be a JSON object, got {type(header).__name__}")
    sender = _check_sender(header.get("sender"))  # first, so every later error can name the sender
    keys = set(header)
    if not set(_HEADER_KEYS) <= keys <= set(_HEADER_KEYS) | set(_OPTIONAL_HEADER_KEYS):
        missing = sorted(set(_HEADER_KEYS) - keys)
        unknown = sorted(keys - set(_HEADER_KEYS) - set(_OPTIONAL_HEADER_KEYS))
        raise _fail("header", f"header keys differ: missing {missing}, unknown {unknown[:8]}", sender)
    _check_json_tree(header, "the header", sender)

    round_ = header["round"]
    if not _is_int(round_) or not 0 <= round_ <= _MAX_ROUND:
        raise _fail("header", f"round must be a non-negative integer, got {round_!r:.40}", sender)
    created = _finite_float(header["created"])
    if created is None or not 0 <= created <= _MAX_CREATED:
        problem = f"created must be unix seconds in [0, {_MAX_CREATED:.0f}], got {header['created']!r:.40}"
        raise _fail("header", problem, sender)
    fingerprint = header["tokenizer_fingerprint"]
    if not isinstance(fingerprint, str) or not _FINGERPRINT_RE.fullmatch(fingerprint):
        raise _fail("header", "tokenizer_fingerprint must be 64 lowercase hex digits (a SHA-256)", sender)
    name = _check_printable(header["tokenizer_name"], "tokenizer_name", _MAX_NAME_CHARS, sender)
    model = _check_printable(header.get("model", ""), "model", _MAX_NAME_CHARS, sender)
    temperature = _finite_float(header["temperature"])
    if temperature is None or not limits.min_temperature <= temperature <= limits.max_temperature:
        low, high = limits.min_temperature, limits.max_temperature
        problem = f"temperature must be a number in [{low}, {high}], got {header['temperature']!r:.40}"
        raise _fail("header", problem, sender)

    reward_names = header["reward_names"]
    if not isinstance(reward_names, list):
        raise _fail("header", "reward_names must be a list of strings", sender)
    if len(reward_names) > limits.max_reward_functions:
        raise _fail("limits", f"{len(reward_names)} reward functions, more than {limits.max_reward_functions}", sender)
    for j, reward_name in enumerate(reward_names):
        _check_printable(reward_name, f"reward_names[{j}]", _MAX_REWARD_NAME_CHARS, sender)

    groups = header["groups"]
    if not isinstance(groups, list):
        raise _fail("header", "groups must be a list", sender)
    if len(groups) > limits.max_groups:
        raise _fail("limits", f"{len(groups)} groups, more than {limits.max_groups}", sender)
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or set(group) != {"prompt", "extra"}:
            raise _fail("header", f"groups[{i}] must be an object with exactly 'prompt' and 'extra'", sender)
        _check_prompt(group["prompt"], i, sender)
        if not isinstance(group["extra"], dict):
            raise _fail("header", f"groups[{i}].extra must be an object", sender)

    counts = header["counts"]
    if not isinstance(counts, dict) or set(counts) != {"completions", "tokens"}:
        raise _fail("header", "counts must be an object with exactly 'completions' and 'tokens'", sender)
    n, t = counts["completions"], counts["tokens"]
    if not _is_int(n) or not _is_int(t) or n < 0 or t < 0:
        raise _fail("header", f"counts must be non-negative integers, got {counts!r:.80}", sender)
    if n > limits.max_completions:
        raise _fail("limits", f"{n} completions, more than {limits.max_completions}", sender)
    if t > limits.max_total_tokens:
        raise _fail("limits", f"{t} tokens, more than {limits.max_total_tokens}", sender)
    text_bytes = header.get("text_bytes")
    if "text_bytes" in header:
        if not _is_int(text_bytes) or text_bytes < 0:
            raise _fail("header", f"text_bytes must be a non-negative integer, got {text_bytes!r:.40}", sender)
        if text_bytes > limits.max_text_bytes:
            raise _fail("limits", f"{text_bytes} bytes of text, more than {limits.max_text_bytes}", sender)
        if text_bytes > n * limits.max_completion_text_bytes:  # some completion would exceed its own limit
            problem = f"{text_bytes} bytes of text for {n} completions of at most {limits.max_completion_text_bytes}"
            raise _fail("limits", problem, sender)

    dtypes = header["dtypes"]
    if not isinstance(dtypes, dict) or set(dtypes) != {"ids", "logps"}:
        raise _fail("header", "dtypes must be an object with exactly 'ids' and 'logps'", sender)
    allowed = (("<u2", "<i4"), ("<f2",)) if compact else (("<i4",), ("<f4",))
    # Membership in tuples: an unhashable value (a list) cannot raise TypeError here.
    if dtypes["ids"] not in allowed[0] or dtypes["logps"] not in allowed[1]:
        mode = "compact" if compact else "exact"
        raise _fail("header", f"dtypes {dtypes!r:.80} are not valid in {mode} mode", sender)

    return _Header(
        sender=sender,
        round=int(round_),
        created=created,
        tokenizer_fingerprint=fingerprint,
        tokenizer_name=name,
        temperature=temperature,
        reward_names=list(reward_names),
        groups=groups,
        num_completions=n,
        num_tokens=t,
        ids_dtype=dtypes["ids"],
        logps_dtype=dtypes["logps"],
        model=model,
        text_bytes=None if text_bytes is None else int(text_bytes),
    )


def _body_size(header: _Header) -> int:
    """Exact size of the uncompressed body the header declares (Python ints: no overflow)."""
    k = len(header.reward_names)
    id_size = _ID_DTYPES[header.ids_dtype].itemsize
    logp_size = _LOGP_DTYPES[header.logps_dtype].itemsize
    size = header.num_completions * (_FIXED_PER_COMPLETION + 4 * k) + header.num_tokens * (id_size + logp_size)
    if header.text_bytes is not None:
        size += _TEXT_PER_COMPLETION * header.num_completions + header.text_bytes
    return size


@dataclass
class _Columns:
    """The body's arrays, in native dtypes as the receiver sees them."""

    group: np.ndarray  # uint32 (N,)
    length: np.ndarray  # uint32 (N,)
    reward: np.ndarray  # float32 (N,)
    rewards_per_func: np.ndarray  # float32 (N, K)
    ids: np.ndarray  # int32 (T,)
    logps: np.ndarray  # float32 (T,)


def _check_columns(columns: _Columns, header: _Header, *, vocab_limit: int | None, limits: Limits) -> np.ndarray:
    """Checks every array against the header and the limits; returns the completions' start offsets."""
    sender = header.sender
    if columns.group.size and int(columns.group.max()) >= len(header.groups):
        bad = int(np.argmax(columns.group >= len(header.groups)))
        raise _fail(
            "shape",
            f"completion {bad} points at group {int(columns.group[bad])}, but there are {len(header.groups)}",
            sender,
        )
    if columns.length.size:
        if int(columns.length.min()) < 1:
            raise _fail("shape", f"completion {int(np.argmin(columns.length))} is empty", sender)
        if int(columns.length.max()) > limits.max_completion_tokens:
            bad = int(np.argmax(columns.length))
            raise _fail(
                "limits",
                f"completion {bad} has {int(columns.length[bad])} tokens, more than {limits.max_completion_tokens}",
                sender,
            )
    total = int(columns.length.sum(dtype=np.int64))
    if total != columns.ids.size or total != columns.logps.size:
        raise _fail("shape", f"completion lengths sum to {total}, but {columns.ids.size} token ids were sent", sender)
    if columns.ids.size:
        low, high = int(columns.ids.min()), int(columns.ids.max())
        if low < 0:
            raise _fail("ids", f"negative token id {low}", sender)
        if vocab_limit is not None and high >= vocab_limit:
            raise _fail("ids", f"token id {high} is outside this peer's vocabulary of {vocab_limit}", sender)
    finite = np.isfinite(columns.logps)
    if not finite.all():
        bad = columns.logps[~finite][0]
        raise _fail("logps", f"non-finite generator log-prob {float(bad)!r}", sender)
    if columns.logps.size and float(columns.logps.max()) > MAX_LOGP:
        raise _fail("logps", f"positive generator log-prob {float(columns.logps.max())!r}", sender)
    if columns.logps.size and float(columns.logps.min()) < limits.min_logp:  # compared as float64: exact
        raise _fail("logps", f"generator log-prob {float(columns.logps.min())!r} < {limits.min_logp}", sender)
    if not np.isfinite(columns.reward).all():
        bad = int(np.argmin(np.isfinite(columns.reward)))
        raise _fail("rewards", f"completion {bad} has a non-finite reward {float(columns.reward[bad])!r}", sender)
    bound = limits.max_abs_reward
    if columns.reward.size and float(np.abs(columns.reward).max()) > bound:
        bad = int(np.argmax(np.abs(columns.reward)))
        raise _fail("rewards", f"completion {bad} has reward {float(columns.reward[bad])!r}, |r| > {bound}", sender)
    # NaN is allowed (a reward function returned None); fmax skips it. +-inf is above any bound.
    largest = float(np.fmax.reduce(np.abs(columns.rewards_per_func).ravel(), initial=-np.inf))
    if largest > bound:
        raise _fail("rewards", f"a per-function reward of magnitude {largest!r}, more than {bound}", sender)
    starts = np.zeros(columns.length.size, dtype=np.int64)
    np.cumsum(columns.length[:-1], dtype=np.int64, out=starts[1:])
    return starts


def _check_text_columns(lengths: np.ndarray, flags: np.ndarray, header: _Header, limits: Limits) -> np.ndarray:
    """Checks the text section's lengths (`_NO_TEXT`: no text) and flags against the header and the limits, before
    any text byte is read; returns a boolean mask of the completions that have a text."""
    sender = header.sender
    has_text = lengths != _NO_TEXT
    sizes = lengths[has_text]
    if sizes.size and int(sizes.max()) > limits.max_completion_text_bytes:
        bad = int(np.flatnonzero(has_text)[int(np.argmax(sizes))])
        limit = limits.max_completion_text_bytes
        raise _fail("limits", f"completion {bad} has {int(lengths[bad])} bytes of text, more than {limit}", sender)
    total = int(sizes.sum(dtype=np.int64))
    if total != header.text_bytes:
        raise _fail("shape", f"the texts' lengths sum to {total}, the header declares {header.text_bytes}", sender)
    unknown = (flags & _TEXT_FLAGS_UNKNOWN) != 0
    if unknown.any():
        bad = int(np.argmax(unknown))
        raise _fail("text", f"completion {bad} has unknown text flag bits {int(flags[bad]):#04x}", sender)
    if (flags[~has_text] != 0).any():
        bad = int(np.argmax(~has_text & (flags != 0)))
        raise _fail("text", f"completion {bad} has text flags {int(flags[bad]):#04x} but no text", sender)
    return has_text


def _decode_texts(data: bytes | memoryview, lengths: np.ndarray, has_text: np.ndarray, sender: str) -> list:
    """Each completion's text (strict UTF-8: invalid bytes and encoded surrogates are refused), or None."""
    texts: list[str | None] = []
    offset = 0
    for i, (size, present) in enumerate(zip(lengths.tolist(), has_text.tolist(), strict=True)):
        if not present:
            texts.append(None)
            continue
        try:
            texts.append(bytes(data[offset : offset + size]).decode("utf-8"))
        except UnicodeDecodeError as error:
            problem = f"completion {i}'s text is not valid UTF-8 ({error.reason} at byte {error.start})"
            raise _fail("text", problem, sender) from None
        offset += size
    return texts
