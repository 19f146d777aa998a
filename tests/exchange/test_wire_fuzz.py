"""Property tests of the decoder: whatever the bytes, `decode_message` and `peek_header` raise nothing but
`ExchangeError`, and whatever they return satisfies the receiver's invariants.

Five generators: random bytes (bare, or behind a plausible preamble); mutations of valid messages (bit flips, byte
sets, preamble fields, truncations, insertions, deletions, duplications, splices of two messages); and three kinds of
edits made by a swarm *member*, who re-signs what it edits with the secret and its key so the edit reaches the
parsers: header JSON edits (replace, delete or add any field, nested ones included), body edits (special
numbers written into the columns, re-compressed or not) and text section edits (lengths, flags, arbitrary or
near-UTF-8 bytes, `text_bytes` kept consistent or not). Receivers: no signatures required, a secret, keys, both;
default and receiver-derived limits.

The default suite runs a few thousand examples (derandomized, so CI sees the same ones every run); `-m slow` runs
more than 20 000.
"""

from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_wire import KEY_A, KEY_B, KEY_MALLORY, PUBLIC_KEYS, make_message, sign_frame

from trl_ftis.exchange import (
    ExchangeError,
    Limits,
    Message,
    decode_message,
    encode_message,
    layout,
    peek_header,
)
from trl_ftis.exchange.errors import REASONS
from trl_ftis.exchange.layout import PREAMBLE_SIZE
from trl_ftis.peer_ids import peer_id_problem
from trl_ftis.sampling_bounds import MAX_LOGP

SECRET = b"fuzz secret"
VOCAB = 22
KEYS = {"peer-a": KEY_A, "peer-b": KEY_B, "mallory": KEY_MALLORY}
TIGHT = Limits.for_receiver(
    max_completion_length=16, max_rows=8, max_groups=4, max_prompt_chars=64, max_reward_functions=3
)
# name -> (secret, public_keys, limits, vocab_limit)
RECEIVERS = {
    "open": (None, None, Limits(), None),
    "open-tight": (None, None, TIGHT, VOCAB),
    "secret": (SECRET, None, TIGHT, VOCAB),
    "keys": (None, PUBLIC_KEYS, Limits(), VOCAB),
    "both": (SECRET, PUBLIC_KEYS, TIGHT, None),
}
SIGNINGS = ("none", "secret", "key", "both")
# How a member signs its edits: mostly both ways, so that most edits get past every receiver's signature checks.
member_signing = st.sampled_from(("both", "both", "both", "both", *SIGNINGS))


def _encode(signing: str, message: Message, **options) -> bytes:
    secret = SECRET if signing in ("secret", "both") else None
    key = KEYS[message.sender] if signing in ("key", "both") else None
    return encode_message(message, secret=secret, private_key=key, **options)


# (bytes, sender): small valid messages in every mode, so mutations reach every part of the format
BASES = [
    (_encode("none", make_message(n=3, length=5, k=2)), "peer-a"),
    (_encode("secret", make_message(n=3, length=5, k=2, seed=1), compact=True), "peer-a"),
    (
        _encode("key", make_message(n=2, length=4, k=0, seed=2, sender="peer-b"), compact=True, compress=False),
        "peer-b",
    ),
    (_encode("both", make_message(n=4, length=3, k=1, seed=3, sender="mallory")), "mallory"),
    (_encode("both", make_message(n=2, length=6, k=3, seed=4), compact=True), "peer-a"),
    (_encode("key", make_message(n=2, length=4, k=1, seed=5, vocab=151_000), compact=True), "peer-a"),
    (_encode("secret", make_message(n=1, length=16, k=1, seed=6, low_logp=-1e5)), "peer-a"),
    # With the optional text section: texts and no texts mixed, multi-byte characters, an empty text, EOS flags.
    (
        _encode("none", make_message(n=3, length=4, k=1, seed=7, texts=["a\u00e9\u2713", None, ""], eos=[True])),
        "peer-a",
    ),
    (
        _encode(
            "both",
            make_message(n=2, length=3, k=2, seed=8, sender="peer-b", texts=["\U0001f600 x", "yz"], eos=[False, True]),
            compact=True,
        ),
        "peer-b",
    ),
    (_encode("none", make_message(n=0, n_groups=0)), "peer-a"),  # last: body_edits leaves it out
]
INTERESTING_INTS = [0, 1, 2, 3, 7, 255, 2**15, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1]
INTERESTING_FLOATS = [
    0.0,
    -0.0,
    1e-4,
    2e-4,
    -1e5,
    -1.0000001e5,
    1e6,
    1.0000001e6,
    -65504.0,
    -65520.0,
    float(np.finfo(np.float32).max),
    float(np.finfo(np.float32).tiny),
    math.inf,
    -math.inf,
    math.nan,
]


# ---------------------------------------------------------------------------------------------------------------
# The property


def check(data: bytes, receiver: str) -> str:
    """Decode and peek `data` as `receiver`; returns the outcome ("decoded" or the refusal reason)."""
    secret, public_keys, limits, vocab_limit = RECEIVERS[receiver]
    options = {"secret": secret, "public_keys": public_keys, "limits": limits}
    try:
        info = peek_header(data, **options)
    except ExchangeError as error:
        assert error.reason in REASONS, error
        info = None
    else:
        check_peeked(info, public_keys, limits)
    try:
        message = decode_message(data, vocab_limit=vocab_limit, **options)
    except ExchangeError as error:
        assert error.reason in REASONS, error
        return error.reason
    assert info is not None and info["sender"] == message.sender  # peek checks a subset of what decode checks
    check_decoded(message, public_keys, limits, vocab_limit)
    return "decoded"


def check_peeked(info: dict, public_keys, limits: Limits) -> None:
    assert peer_id_problem(info["sender"]) is None
    if public_keys is not None:
        assert info["verified"] and info["signer"] == info["sender"] and info["sender"] in public_keys
    assert 0 <= info["round"] < 2**63 and 0 <= info["created"] <= layout.MAX_CREATED
    assert limits.min_temperature <= info["temperature"] <= limits.max_temperature
    assert info["num_completions"] <= limits.max_completions and info["num_groups"] <= limits.max_groups
    assert info["num_tokens"] <= limits.max_total_tokens
    assert len(info["reward_names"]) <= limits.max_reward_functions
    assert info["header_bytes"] <= limits.max_header_bytes and info["message_bytes"] <= limits.max_message_bytes
    assert 0 <= info["text_bytes"] <= limits.max_text_bytes


def check_decoded(message: Message, public_keys, limits: Limits, vocab_limit: int | None) -> None:
    """What a receiver relies on, for every message decode_message returns."""
    assert peer_id_problem(message.sender) is None
    if public_keys is not None:
        assert message.sender in public_keys
    assert 0 <= message.round < 2**63 and math.isfinite(message.created)
    assert limits.min_temperature <= message.temperature <= limits.max_temperature
    k = len(message.reward_names)
    assert k <= limits.max_reward_functions
    assert len(message.groups) <= limits.max_groups and len(message.completions) <= limits.max_completions
    total = text_bytes = 0
    for c in message.completions:
        assert type(c.group) is int and 0 <= c.group < len(message.groups)
        ids, logps, rpf = c.completion_ids, c.generator_logps, c.rewards_per_func
        assert ids.dtype == np.int32 and logps.dtype == np.float32 and rpf.dtype == np.float32
        assert ids.ndim == 1 and ids.shape == logps.shape and 1 <= ids.size <= limits.max_completion_tokens
        assert ids.min() >= 0 and (vocab_limit is None or ids.max() < vocab_limit)
        assert np.isfinite(logps).all() and logps.min() >= limits.min_logp and logps.max() <= MAX_LOGP
        assert type(c.reward) is float and math.isfinite(c.reward) and abs(c.reward) <= limits.max_abs_reward
        assert rpf.shape == (k,) and (np.isnan(rpf) | (np.abs(rpf) <= limits.max_abs_reward)).all()
        assert type(c.ends_with_eos) is bool and (c.text is not None or not c.ends_with_eos)
        if c.text is not None:
            assert type(c.text) is str and len(c.text.encode("utf-8")) <= limits.max_completion_text_bytes
            text_bytes += len(c.text.encode("utf-8"))
        total += ids.size
    assert total <= limits.max_total_tokens and text_bytes <= limits.max_text_bytes
    # What a receiver accepted, a sender could have sent: it re-encodes within the same limits, identically.
    again = decode_message(
        encode_message(message, compact=message.compact, limits=limits), vocab_limit=vocab_limit, limits=limits
    )
    assert again.num_tokens() == message.num_tokens() and again.sender == message.sender
    assert [(c.text, c.ends_with_eos) for c in again.completions] == [
        (c.text, c.ends_with_eos) for c in message.completions
    ]


# ---------------------------------------------------------------------------------------------------------------
# Generators


def split(data: bytes) -> tuple[int, dict, bytes]:
    """(flags, header, body) of a valid message."""
    _, _, flags, header_length, body_length = struct.unpack_from("<4sHHIQ", data)
    header = json.loads(data[PREAMBLE_SIZE : PREAMBLE_SIZE + header_length])
    body = data[PREAMBLE_SIZE + header_length : PREAMBLE_SIZE + header_length + body_length]
    return flags, header, body


def frame(flags: int, header_bytes: bytes, body: bytes) -> bytes:
    preamble = struct.pack("<4sHHIQ", b"FTIS", layout.SCHEMA_VERSION, flags, len(header_bytes), len(body))
    return preamble + header_bytes + body


def resign(core: bytes, signing: str, signer: str) -> bytes:
    """As a member would: sign the edited bytes with the secret and/or the key of `signer`."""
    secret = SECRET if signing in ("secret", "both") else None
    key = KEYS[signer] if signing in ("key", "both") else None
    return sign_frame(core, secret=secret, private_key=key, signer=signer)


positions = st.integers(min_value=0, max_value=2**16)
mutation = st.one_of(
    st.tuples(st.just("flip"), positions, st.integers(0, 7)),
    st.tuples(st.just("set"), positions, st.integers(0, 255)),
    st.tuples(st.just("field"), st.sampled_from([(4, 2), (6, 2), (8, 4), (12, 8)]), st.integers(-3, 3)),
    st.tuples(st.just("value"), st.sampled_from([(6, 2), (8, 4), (12, 8)]), st.sampled_from(INTERESTING_INTS)),
    st.tuples(st.just("truncate"), positions),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), positions, st.integers(1, 64)),
    st.tuples(st.just("duplicate"), positions, st.integers(1, 64)),
    st.tuples(st.just("splice"), st.integers(0, len(BASES) - 1), positions, positions),
)


def mutate(data: bytes, op: tuple) -> bytes:
    kind, *args = op
    size = len(data)
    if kind in ("flip", "set", "field", "value") and size < PREAMBLE_SIZE:
        return data  # nothing (or too little) left to change in place
    if kind in ("flip", "set"):
        position, value = args[0] % size, args[1]
        out = bytearray(data)
        out[position] = out[position] ^ (1 << value) if kind == "flip" else value
        return bytes(out)
    if kind in ("field", "value"):
        (offset, width), value = args
        fmt = {2: "<H", 4: "<I", 8: "<Q"}[width]
        if kind == "field":  # a small change of the current value: lengths one off, neighbouring flags
            value = struct.unpack_from(fmt, data, offset)[0] + value
        return data[:offset] + struct.pack(fmt, value % 2 ** (8 * width)) + data[offset + width :]
    position = args[0] % (size + 1)
    if kind == "truncate":
        return data[:position]
    if kind == "insert":
        return data[:position] + args[1] + data[position:]
    if kind == "delete":
        return data[:position] + data[position + args[1] :]
    if kind == "duplicate":
        return data[: position + args[1]] + data[position:]
    other = BASES[args[0]][0]  # splice: this message's start, another's end
    return data[:position] + other[args[1] % (len(other) + 1) :]


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(INTERESTING_INTS + [-1, -(2**63), 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(INTERESTING_FLOATS),  # NaN and Infinity are written as such: the parser must refuse them
    st.text(max_size=12),
    st.sampled_from(["", "peer-a", "peer-b", "mallory", "../x", "<i4", "<u2", "<f2", "<f4", "<i8", "a" * 65]),
)
json_value = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def json_paths(node, path=()):
    """Every path into a JSON document (the root included)."""
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from json_paths(value, (*path, index))


def edit_json(header, path, action: str, value):
    if not path:
        return value if action == "replace" else header
    parent = header
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[f"{last}_"] = value
    else:
        parent.append(value)
    return header


@st.composite
def header_edits(draw):
    data, sender = BASES[draw(st.integers(0, len(BASES) - 1))]
    flags, header, body = split(data)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(json_paths(header))
        path = draw(st.sampled_from(paths))
        header = edit_json(header, path, draw(st.sampled_from(["replace", "delete", "add"])), draw(json_value))
    raw = json.dumps(header, allow_nan=True).encode()  # NaN/Infinity too: the parser must refuse them
    signer = draw(st.sampled_from([sender, *KEYS]))
    return resign(frame(flags, raw, body), draw(member_signing), signer)


@st.composite
def body_edits(draw):
    data, sender = BASES[draw(st.integers(0, len(BASES) - 2))]  # the empty message has no body to edit
    flags, header, body = split(data)
    if flags & layout.FLAG_COMPRESSED:
        body = zlib.decompress(body)
    body = bytearray(body)
    for _ in range(draw(st.integers(1, 4))):
        fmt = draw(st.sampled_from(["<f4", "<f2", "<u4", "<i4", "<u2"]))
        number = draw(st.sampled_from(INTERESTING_FLOATS) if "f" in fmt else st.sampled_from(INTERESTING_INTS + [-1]))
        if fmt[1] == "u" and number < 0:
            number %= 2 ** (8 * int(fmt[2]))
        with np.errstate(over="ignore"):
            packed = np.array([number]).astype(fmt).tobytes()
        position = draw(st.integers(0, max(len(body) - len(packed), 0)))
        if draw(st.booleans()):  # aligned to the value's size, as the columns are
            position -= position % len(packed)
        body[position : position + len(packed)] = packed
    body = bytes(body)
    if flags & layout.FLAG_COMPRESSED and draw(st.booleans()):
        body = zlib.compress(body, draw(st.integers(0, 9)))
    elif draw(st.integers(0, 9)) == 0:  # compressed but not flagged, or flagged but not compressed
        flags ^= layout.FLAG_COMPRESSED
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    return resign(frame(flags, header_bytes, body), draw(member_signing), sender)


TEXT_BASES = [i for i, (data, _) in enumerate(BASES) if b'"text_bytes"' in data]
text_lengths = st.integers(0, 12) | st.sampled_from([0xFFFFFFFF, 0xFFFFFFFE, 2**31, 256, 257, 2**20 + 1])
# Bytes near UTF-8: valid characters, encoded surrogates, stray continuation bytes, truncated sequences.
text_pieces = st.sampled_from(
    [
        b"a",
        b"\xc3\xa9",
        b"\xe2\x9c\x93",
        b"\xf0\x9f\x98\x80",
        b"\xed\xa0\x80",
        b"\xed\xbf\xbf",
        b"\x80",
        b"\xc3",
        b"\xe2\x9c",
    ]
    + [b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xff", b"\x00"]
)
text_bytes_strategy = st.lists(text_pieces, max_size=8).map(b"".join) | st.binary(max_size=24)


@st.composite
def text_edits(draw):
    data, sender = BASES[draw(st.sampled_from(TEXT_BASES))]
    flags, header, body = split(data)
    if flags & layout.FLAG_COMPRESSED:
        body = zlib.decompress(body)
    n = header["counts"]["completions"]
    start = len(body) - header["text_bytes"] - 5 * n
    lengths = list(struct.unpack_from(f"<{n}I", body, start))
    text_flags = bytearray(body[start + 4 * n : start + 5 * n])
    text = body[start + 5 * n :]
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["length", "flags", "text", "text_bytes"]))
        index = draw(st.integers(0, n - 1))
        if part == "length":
            lengths[index] = draw(text_lengths)
        elif part == "flags":
            text_flags[index] = draw(st.integers(0, 255) | st.just(1))
        elif part == "text":
            text = draw(text_bytes_strategy)
            if draw(st.booleans()):  # the honest way: the lengths of the new bytes, as texts or sentinels
                cuts = sorted(draw(st.lists(st.integers(0, len(text)), min_size=n - 1, max_size=n - 1)))
                lengths = [b - a for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        else:
            header["text_bytes"] = draw(st.sampled_from([0, 1, len(text) + 1, 2**26, 2**26 + 1]) | st.integers(0, 40))
    if draw(st.integers(0, 3)):  # mostly keep the header consistent with what the section now holds
        header["text_bytes"] = len(text)
    body = body[:start] + struct.pack(f"<{n}I", *lengths) + bytes(text_flags) + text
    if flags & layout.FLAG_COMPRESSED:
        body = zlib.compress(body, 1)
    header_bytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return resign(frame(flags, header_bytes, body), draw(member_signing), sender)


plausible_preamble = st.builds(
    lambda flags, header_length, body_length: struct.pack(
        "<4sHHIQ", b"FTIS", layout.SCHEMA_VERSION, flags, header_length, body_length
    ),
    st.integers(0, 31),
    st.integers(0, 600) | st.sampled_from(INTERESTING_INTS[:12]),
    st.integers(0, 600) | st.sampled_from(INTERESTING_INTS),
)
random_bytes = st.binary(max_size=400) | st.builds(bytes.__add__, plausible_preamble, st.binary(max_size=600))
receivers = st.sampled_from(sorted(RECEIVERS))


# ---------------------------------------------------------------------------------------------------------------
# The tests: a default-suite size and a slow one of more than 20 000 examples in all


def run(examples: int, strategy, property_) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(strategy)
    def test(case):
        property_(*case)

    test()


def budget(default: int, slow: int):
    return pytest.mark.parametrize("examples", [default, pytest.param(slow, marks=pytest.mark.slow)], ids=["", "slow"])


def test_the_base_messages_are_valid():
    for data, sender in BASES:
        outcomes = {name: check(data, name) for name in RECEIVERS}
        assert outcomes["open"] == "decoded" and decode_message(data).sender == sender
    assert {check(BASES[3][0], name) for name in RECEIVERS} == {"decoded"}  # signed both ways, small
    assert {check(BASES[-2][0], name) for name in RECEIVERS} == {"decoded"}  # with texts, signed both ways
    texts = [(c.text, c.ends_with_eos) for c in decode_message(BASES[-2][0]).completions]
    assert texts == [("\U0001f600 x", False), ("yz", True)]
    assert [c.text for c in decode_message(BASES[-3][0]).completions] == ["a\u00e9\u2713", None, ""]


@budget(600, 5000)
def test_random_bytes(examples):
    run(examples, st.tuples(random_bytes, receivers), check)


@budget(1000, 7000)
def test_mutations_of_valid_messages(examples):
    def property_(index, ops, receiver):
        data = BASES[index][0]
        for op in ops:
            data = mutate(data, op)
        check(data, receiver)

    cases = st.tuples(st.integers(0, len(BASES) - 1), st.lists(mutation, min_size=1, max_size=4), receivers)
    run(examples, cases, property_)


@budget(800, 5000)
def test_header_edits_by_a_member(examples):
    run(examples, st.tuples(header_edits(), receivers), check)


@budget(700, 5000)
def test_body_edits_by_a_member(examples):
    run(examples, st.tuples(body_edits(), receivers), check)


@budget(400, 3000)
def test_text_section_edits_by_a_member(examples):
    run(examples, st.tuples(text_edits(), receivers), check)
