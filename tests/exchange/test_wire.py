"""The wire format: round trips, byte sizes, signing, and hostile input (which must only ever raise ExchangeError)."""

import hashlib
import hmac
import json
import math
import pickle
import random
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trl_ftis.exchange import (
    SCHEMA_VERSION,
    ExchangeError,
    Limits,
    Message,
    WireCompletion,
    WireGroup,
    decode_message,
    encode_message,
    keys,
    layout,
    peek_header,
    tokenizer_fingerprint,
    wire,
)
from trl_ftis.exchange.errors import REASONS
from trl_ftis.exchange.keys import ED25519_SIGNATURE_SIZE
from trl_ftis.exchange.layout import COMPACT_LOGP_ABS_ERROR, COMPACT_LOGP_REL_ERROR, PREAMBLE_SIZE, SIGNATURE_SIZE

FINGERPRINT = "ab" * 32
VOCAB = 22  # the tiny character tokenizer's size
PREAMBLE = struct.Struct("<4sHHIQ")


def make_message(
    n=8, length=16, k=2, n_groups=2, seed=0, vocab=VOCAB, low_logp=-20.0, texts=None, eos=(False,), **overrides
) -> Message:
    """``n`` completions of ``length`` tokens over ``n_groups`` prompts, ``k`` reward functions; completion ``i`` gets
    ``texts[i % len(texts)]`` as its text (default: none) and ``eos[i % len(eos)]`` as its ``ends_with_eos``."""
    rng = np.random.default_rng(seed)
    completions = []
    for i in range(n):
        rewards = rng.uniform(-1, 1, k).astype(np.float32)
        if k:
            rewards[-1] = np.nan  # a reward function that returned None
        completions.append(
            WireCompletion(
                group=i % max(n_groups, 1),
                completion_ids=rng.integers(0, vocab, length),
                generator_logps=-np.exp(rng.uniform(np.log(1e-3), np.log(-low_logp), length)).astype(np.float32),
                reward=float(rng.uniform(-1, 1)),
                rewards_per_func=rewards,
                text=None if texts is None else texts[i % len(texts)],
                ends_with_eos=eos[i % len(eos)],
            )
        )
    groups = [WireGroup(prompt=f"{10 + g}+{20 + g}=", extra={"answer": str(30 + 2 * g)}) for g in range(n_groups - 1)]
    if n_groups:
        groups.append(WireGroup(prompt=[{"role": "user", "content": "1+2="}], extra={"answer": "3", "id": 7}))
    fields = {
        "sender": "peer-a",
        "round": 3,
        "tokenizer_fingerprint": FINGERPRINT,
        "tokenizer_name": "tiny-char",
        "temperature": 1.0,
        "reward_names": [f"reward_{j}" for j in range(k)],
        "groups": groups,
        "completions": completions,
        "created": 1_700_000_000.5,
    }
    fields.update(overrides)
    return Message(**fields)


def expect(reason, fn, *args, **kwargs):
    """Calls fn, asserts it raises ExchangeError with ``reason``; returns the error."""
    with pytest.raises(ExchangeError) as info:
        fn(*args, **kwargs)
    assert info.value.reason == reason, f"expected {reason!r}, got {info.value.reason!r}: {info.value}"
    assert info.value.reason in REASONS
    return info.value


def split(data: bytes):
    """(flags, header dict, body bytes, signature) of an encoded message."""
    _, _, flags, header_length, body_length = PREAMBLE.unpack(data[:PREAMBLE_SIZE])
    header = json.loads(data[PREAMBLE_SIZE : PREAMBLE_SIZE + header_length])
    body = data[PREAMBLE_SIZE + header_length : PREAMBLE_SIZE + header_length + body_length]
    return flags, header, body, data[PREAMBLE_SIZE + header_length + body_length :]


def assemble(header, body: bytes, *, flags=0, version=SCHEMA_VERSION, raw_header: bytes | None = None) -> bytes:
    """A message built by hand (as a hostile peer would), with consistent lengths."""
    header_bytes = raw_header if raw_header is not None else json.dumps(header).encode()
    return PREAMBLE.pack(b"FTIS", version, flags, len(header_bytes), len(body)) + header_bytes + body


def columns_body(group, length, reward, rpf, ids, logps, ids_dtype="<i4", logps_dtype="<f4") -> bytes:
    return b"".join(
        [
            np.asarray(group, "<u4").tobytes(),
            np.asarray(length, "<u4").tobytes(),
            np.asarray(reward, "<f4").tobytes(),
            np.asarray(rpf, "<f4").tobytes(),
            np.asarray(ids, ids_dtype).tobytes(),
            np.asarray(logps, logps_dtype).tobytes(),
        ]
    )


def small_header(**overrides):
    """A valid header for one group and one completion of 2 tokens, K=1, exact mode."""
    header = {
        "sender": "evil",
        "round": 0,
        "created": 1.0,
        "tokenizer_fingerprint": FINGERPRINT,
        "tokenizer_name": "x",
        "temperature": 1.0,
        "reward_names": ["r"],
        "groups": [{"prompt": "p", "extra": {}}],
        "counts": {"completions": 1, "tokens": 2},
        "dtypes": {"ids": "<i4", "logps": "<f4"},
    }
    header.update(overrides)
    return header


def small_body(**overrides):
    columns = {"group": [0], "length": [2], "reward": [1.0], "rpf": [[0.5]], "ids": [1, 2], "logps": [-0.5, -1.5]}
    columns.update(overrides)
    return columns_body(**columns)


def assert_valid(message: Message):
    """A decoded message is internally consistent and re-encodes (the encoder runs the receiver's checks)."""
    for c in message.completions:
        assert 0 <= c.group < len(message.groups)
        assert c.completion_ids.shape == c.generator_logps.shape and c.completion_ids.size >= 1
        assert np.isfinite(c.generator_logps).all() and math.isfinite(c.reward)
    decode_message(encode_message(message, compact=message.compact))


# ---------------------------------------------------------------------------------------------------------------
# Round trips and sizes


def test_round_trip_exact_is_bit_identical():
    message = make_message()
    decoded = decode_message(encode_message(message), vocab_limit=VOCAB)
    assert decoded.compact is False
    for name in ("sender", "round", "created", "tokenizer_fingerprint", "tokenizer_name", "temperature"):
        assert getattr(decoded, name) == getattr(message, name)
    assert decoded.reward_names == message.reward_names
    assert decoded.groups == message.groups
    assert decoded.num_tokens() == message.num_tokens() == 8 * 16
    for got, sent in zip(decoded.completions, message.completions, strict=True):
        assert got.group == sent.group
        assert got.completion_ids.dtype == np.int32 and np.array_equal(got.completion_ids, sent.completion_ids)
        assert got.generator_logps.dtype == np.float32
        assert got.generator_logps.tobytes() == sent.generator_logps.tobytes()  # bit-identical
        assert got.reward == float(np.float32(sent.reward))  # the reward travels as float32
        np.testing.assert_array_equal(got.rewards_per_func, sent.rewards_per_func)  # NaN == NaN here
        assert np.isnan(got.rewards_per_func[-1])
        got.completion_ids[0] = 0  # decoded arrays are writable copies, not views of the input bytes


def test_round_trip_compact_within_documented_precision():
    message = make_message(n=16, length=64)
    data = encode_message(message, compact=True)
    flags, header, _, _ = split(data)
    assert flags == layout.FLAG_COMPACT | layout.FLAG_COMPRESSED  # compress defaults to on in compact mode
    assert header["dtypes"] == {"ids": "<u2", "logps": "<f2"}
    decoded = decode_message(data, vocab_limit=VOCAB)
    assert decoded.compact is True
    max_abs = 0.0
    for got, sent in zip(decoded.completions, message.completions, strict=True):
        assert np.array_equal(got.completion_ids, sent.completion_ids)
        error = np.abs(got.generator_logps.astype(np.float64) - sent.generator_logps.astype(np.float64))
        bound = np.abs(sent.generator_logps.astype(np.float64)) * COMPACT_LOGP_REL_ERROR + COMPACT_LOGP_ABS_ERROR
        assert (error <= bound).all()
        max_abs = max(max_abs, float(error.max()))
    assert 0 < max_abs <= 20 * COMPACT_LOGP_REL_ERROR  # lossy, but within 0.0098 nats at -20
    assert len(data) < len(encode_message(message))


def test_compact_falls_back_to_int32_ids_for_large_vocabularies():
    message = make_message(vocab=151_000, seed=1)
    assert max(int(c.completion_ids.max()) for c in message.completions) >= 2**16
    for compress in (True, False):
        data = encode_message(message, compact=True, compress=compress)
        assert split(data)[1]["dtypes"]["ids"] == "<i4"
        decoded = decode_message(data)
        for got, sent in zip(decoded.completions, message.completions, strict=True):
            assert np.array_equal(got.completion_ids, sent.completion_ids)


def test_compact_clamps_log_probs_to_float16_range():
    message = make_message(n=1, length=3)
    message.completions[0].generator_logps = np.array([-1e5, 5e-5, -1.0], np.float32)
    got = decode_message(encode_message(message, compact=True)).completions[0].generator_logps
    assert got.tolist() == [-65504.0, 0.0, -1.0]
    exact = decode_message(encode_message(message)).completions[0].generator_logps  # exact keeps them
    assert exact.tolist() == [-1e5, np.float32(5e-5), -1.0]


def test_message_compact_field_selects_the_encoding():
    message = make_message(compact=True)
    assert split(encode_message(message))[0] & layout.FLAG_COMPACT
    assert not split(encode_message(message, compact=False))[0] & layout.FLAG_COMPACT
    assert split(encode_message(make_message(), compact=True, compress=False))[0] == layout.FLAG_COMPACT
    assert split(encode_message(make_message(), compress=True))[0] == layout.FLAG_COMPRESSED


@pytest.mark.parametrize("n,length,k", [(1, 1, 0), (24, 37, 4), (12, 600, 1), (5, 3, 4)])
def test_exact_mode_byte_sizes(n, length, k):
    message = make_message(n=n, length=length, k=k, n_groups=max(n // 4, 1))
    data = encode_message(message)
    info = peek_header(data)
    # Exactly 8 bytes per token (int32 id + float32 log-prob) plus 12 + 4K bytes per completion.
    assert info["body_bytes"] == 8 * n * length + n * (12 + 4 * k)
    assert len(data) == PREAMBLE_SIZE + info["header_bytes"] + info["body_bytes"] == info["message_bytes"]
    # The bound the paper's accounting implies: the per-completion fixed part is at most 64 bytes for K <= 4.
    assert len(data) <= 8 * n * length + 64 * n + PREAMBLE_SIZE + info["header_bytes"]
    assert len(encode_message(message, secret=b"k")) == len(data) + SIGNATURE_SIZE


def test_empty_message_round_trips():
    message = make_message(n=0, n_groups=0)
    for compact in (False, True):
        decoded = decode_message(encode_message(message, compact=compact, secret="s"), secret="s")
        assert decoded.completions == [] and decoded.groups == [] and decoded.num_tokens() == 0


def test_accepts_bytearray_and_memoryview_rejects_other_types():
    data = encode_message(make_message())
    assert decode_message(bytearray(data)).sender == "peer-a"
    assert decode_message(memoryview(data)).sender == "peer-a"
    for bad in (None, "FTIS", 12, [1, 2]):
        expect("header", decode_message, bad)


# ---------------------------------------------------------------------------------------------------------------
# Signing


def test_signed_messages():
    message = make_message()
    signed = encode_message(message, secret="swarm secret")
    assert decode_message(signed, secret=b"swarm secret").sender == "peer-a"  # str and bytes secrets agree
    assert decode_message(signed).sender == "peer-a"  # no secret configured: not checked
    expect("signature", decode_message, signed, secret="another secret")
    unsigned = encode_message(message)
    assert decode_message(unsigned).sender == "peer-a"
    expect("unsigned", decode_message, unsigned, secret="swarm secret")
    # Stripping the signature and clearing the flag does not help: it is then an unsigned message.
    stripped = bytearray(signed[:-SIGNATURE_SIZE])
    stripped[6] &= ~layout.FLAG_SIGNED
    expect("unsigned", decode_message, bytes(stripped), secret="swarm secret")
    with pytest.raises(ValueError):
        decode_message(signed, secret=b"")


def test_signature_is_checked_before_the_header_is_parsed():
    # A signed message whose header is not even JSON: the wrong signature is what a receiver reports.
    forged = assemble(None, b"", flags=layout.FLAG_SIGNED, raw_header=b"{not json") + b"\0" * SIGNATURE_SIZE
    expect("signature", decode_message, forged, secret="s")
    expect("header", decode_message, forged)


def test_tampering_with_any_byte_of_a_signed_message_is_detected():
    data = encode_message(make_message(n=2, length=4, k=1), secret="s")
    for position in range(len(data)):
        for mask in (0x01, 0x80):
            tampered = bytearray(data)
            tampered[position] ^= mask
            with pytest.raises(ExchangeError):
                decode_message(bytes(tampered), secret="s")


# ---------------------------------------------------------------------------------------------------------------
# Hostile and broken input


@pytest.mark.parametrize("options", [{}, {"compact": True}, {"secret": "s"}])
def test_every_truncation_is_reported_as_truncated(options):
    data = encode_message(make_message(n=3, length=5, k=1), **options)
    for end in range(len(data)):
        expect("truncated", decode_message, data[:end], secret=options.get("secret"))
    expect("too_large", decode_message, data + b"\0", secret=options.get("secret"))  # trailing bytes


def test_random_byte_mutations_only_raise_exchange_error():
    rng = random.Random(1234)
    originals = [
        encode_message(make_message(n=3, length=6, k=2)),
        encode_message(make_message(n=3, length=6, k=2), compact=True),
        encode_message(make_message(n=2, length=4, k=0), compact=True, compress=False),
        encode_message(make_message(n=2, length=4, k=1), secret="s"),
    ]
    outcomes = {"decoded": 0}
    for trial in range(3000):
        data = bytearray(originals[trial % len(originals)])
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(data))
            if trial % 7 == 0:  # sometimes aim at the preamble and the body, not only the (larger) header
                position = rng.choice([rng.randrange(PREAMBLE_SIZE), len(data) - 1 - rng.randrange(64)])
            data[position] = rng.randrange(256)
        try:
            message = decode_message(bytes(data))
        except ExchangeError as error:
            assert error.reason in REASONS
            outcomes[error.reason] = outcomes.get(error.reason, 0) + 1
        else:
            outcomes["decoded"] += 1
            assert_valid(message)
    # The mutations reached the deeper checks, not only the JSON parser.
    assert outcomes["decoded"] > 0 and outcomes["header"] > 0
    assert sum(outcomes.get(r, 0) for r in ("ids", "logps", "rewards", "shape", "body", "limits")) > 0, outcomes


def test_random_garbage_only_raises_exchange_error():
    rng = random.Random(99)
    for trial in range(1000):
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        if trial % 2:  # a valid-looking preamble with random lengths and flags, then garbage
            garbage = PREAMBLE.pack(b"FTIS", 1, rng.randrange(8), rng.randrange(300), rng.randrange(300)) + garbage
        with pytest.raises(ExchangeError):
            decode_message(garbage)
        with pytest.raises(ExchangeError):
            peek_header(garbage)


HOSTILE_VALUES = [None, -1, 0, 2**70, 10**400, 1.5, -1e308, "", "x" * 300, [], {}, [[[]]], {"a": 1}, True, "\n"]
HOSTILE_VALUES += ["../x", "\ud800"]  # 10**400: math.isfinite raises OverflowError on it; a lone surrogate


def test_hostile_header_values_only_raise_exchange_error():
    # Byte flips mostly break the JSON syntax; this replaces each field (and nested field) by hostile values.
    paths = [(key,) for key in small_header()] + [
        ("groups", 0),
        ("groups", 0, "prompt"),
        ("groups", 0, "extra"),
        ("counts", "completions"),
        ("counts", "tokens"),
        ("dtypes", "ids"),
        ("dtypes", "logps"),
        ("reward_names", 0),
    ]
    decoded = 0
    for path in paths:
        for value in HOSTILE_VALUES:
            header = small_header()
            target = header
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            data = assemble(header, small_body())
            try:
                message = decode_message(data)
            except ExchangeError as error:
                assert error.reason in ("header", "limits", "shape", "too_large"), error
            else:
                decoded += 1
                assert_valid(message)
    assert decoded > 0  # e.g. round = 0, tokenizer_name = "", extra = {}


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b"{not json", "header"),
        (b"\xff\xfe", "header"),  # not UTF-8
        (b"[1, 2]", "header"),  # not an object
        (b'{"sender": "a", "sender": "b"}', "header"),  # duplicate keys
        (json.dumps(small_header(temperature=1.0)).replace("1.0", "NaN", 1).encode(), "header"),
        (json.dumps(small_header(created=1.0)).replace("1.0", "1e999", 1).encode(), "header"),
        (b"[" * 200_000 + b"]" * 200_000, "header"),  # nesting that would exhaust the recursion limit
    ],
)
def test_malformed_json_headers(raw, reason):
    expect(reason, decode_message, assemble(None, small_body(), raw_header=raw))
    expect(reason, peek_header, assemble(None, small_body(), raw_header=raw))


def test_header_structure_checks():
    body = small_body()
    nested = {"a": None}
    for _ in range(40):
        nested = {"a": nested}
    cases = [
        (small_header(extra_key=1), "header"),
        ({k: v for k, v in small_header().items() if k != "round"}, "header"),
        (small_header(groups=[{"prompt": "p", "extra": nested}]), "header"),  # absurd nesting
        (small_header(groups=[{"prompt": [{"role": "user", "content": 5}], "extra": {}}]), "header"),
        (small_header(groups=[{"prompt": "p"}]), "header"),
        (small_header(temperature=0), "header"),
        (small_header(round=-1), "header"),
        (small_header(round=True), "header"),
        (small_header(tokenizer_fingerprint="ABC"), "header"),
        (small_header(dtypes={"ids": "<u2", "logps": "<f4"}), "header"),  # u2 ids only in compact mode
        (small_header(dtypes={"ids": "<i8", "logps": "<f4"}), "header"),
        (small_header(counts={"completions": 1, "tokens": 3}), "shape"),  # counts disagree with the body size
    ]
    for header, reason in cases:
        expect(reason, decode_message, assemble(header, body))
    expect("header", decode_message, assemble(small_header(), body, flags=0x10))  # unknown flag bit
    data = assemble(small_header(), body)
    assert decode_message(data).completions[0].completion_ids.tolist() == [1, 2]  # the baseline is valid


def test_magic_and_version():
    data = encode_message(make_message())
    expect("magic", decode_message, b"GIF89a" + data[6:])
    expect("magic", decode_message, b"FX")
    error = expect("version", decode_message, data[:4] + struct.pack("<H", SCHEMA_VERSION + 1) + data[6:])
    assert str(SCHEMA_VERSION + 1) in str(error) and str(SCHEMA_VERSION) in str(error)
    expect("version", decode_message, data[:4] + struct.pack("<H", 0) + data[6:])


@pytest.mark.parametrize(
    "header_length,body_length",
    [(2**32 - 1, 0), (100, 2**60), (100, 2**64 - 1), (0, 300 * 2**20)],
)
def test_oversized_declared_lengths_are_rejected_before_allocation(header_length, body_length):
    data = PREAMBLE.pack(b"FTIS", SCHEMA_VERSION, 0, header_length, body_length) + b"{}"
    tracemalloc.start()
    try:
        expect("too_large", decode_message, data)
        expect("too_large", peek_header, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_declared_counts_are_checked_against_limits_and_body_before_allocation():
    expect("limits", decode_message, assemble(small_header(counts={"completions": 1, "tokens": 2**40}), b""))
    expect("limits", decode_message, assemble(small_header(counts={"completions": 2**20, "tokens": 2}), b""))
    expect("limits", decode_message, assemble(small_header(reward_names=["r"] * 65), b""))
    # Within the limits, but the body is far smaller than the counts imply: rejected without reading it.
    big = small_header(counts={"completions": 65_536, "tokens": 10 * 2**20})  # an 81 MiB body
    tracemalloc.start()
    try:
        expect("shape", decode_message, assemble(big, small_body()))
        # Compressed: inflating stops at the stream's real end; the output never grows toward 81 MiB.
        expect("shape", decode_message, assemble(big, zlib.compress(small_body()), flags=layout.FLAG_COMPRESSED))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_zip_bomb_is_rejected_without_inflating_it():
    compressor = zlib.compressobj(9)
    chunk = bytes(2**20)
    bomb = b"".join(compressor.compress(chunk) for _ in range(16)) + compressor.flush()  # 16 MiB of zeros
    assert len(bomb) < 2**15
    header = small_header(dtypes={"ids": "<u2", "logps": "<f2"})
    data = assemble(header, bomb, flags=layout.FLAG_COMPACT | layout.FLAG_COMPRESSED)
    tracemalloc.start()
    try:
        expect("too_large", decode_message, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # the 16 MiB never materialise
    # A body that would decompress beyond max_message_bytes is refused before inflating anything.
    limits = Limits(max_message_bytes=2**20)
    huge = small_header(counts={"completions": 1, "tokens": 2**20}, dtypes={"ids": "<u2", "logps": "<f2"})
    expect("too_large", decode_message, assemble(huge, bomb[:100], flags=6), limits=limits)


def test_corrupt_compressed_bodies():
    header = small_header(dtypes={"ids": "<u2", "logps": "<f2"})
    body = small_body(ids_dtype="<u2", logps_dtype="<f2")
    flags = layout.FLAG_COMPACT | layout.FLAG_COMPRESSED
    assert decode_message(assemble(header, zlib.compress(body), flags=flags)).num_tokens() == 2
    expect("body", decode_message, assemble(header, b"\x00" * 20, flags=flags))
    expect("body", decode_message, assemble(header, zlib.compress(body) + b"junk", flags=flags))
    expect("truncated", decode_message, assemble(header, zlib.compress(body)[:-3], flags=flags))
    expect("shape", decode_message, assemble(header, zlib.compress(body[:-2]), flags=flags))


def test_vocab_limit_and_negative_ids():
    message = make_message()
    top = max(int(c.completion_ids.max()) for c in message.completions)
    data = encode_message(message)
    decode_message(data, vocab_limit=top + 1)
    expect("ids", decode_message, data, vocab_limit=top)
    expect("ids", decode_message, assemble(small_header(), small_body(ids=[1, -5])))  # always, even without a limit
    expect("ids", decode_message, assemble(small_header(), small_body(ids=[1, 2])), vocab_limit=2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 0.5, 2e-4])
def test_bad_log_probs(bad):
    expect("logps", decode_message, assemble(small_header(), small_body(logps=[-1.0, bad])))
    message = make_message(n=1, length=2)
    message.completions[0].generator_logps = np.array([-1.0, bad], np.float32)
    expect("logps", encode_message, message)
    expect("logps", encode_message, message, compact=True)  # not hidden by the float16 clamp


def test_log_prob_rounding_slack_is_accepted():
    decoded = decode_message(assemble(small_header(), small_body(logps=[-1.0, 9e-5])))
    assert decoded.completions[0].generator_logps[1] == np.float32(9e-5)


def test_bad_rewards():
    expect("rewards", decode_message, assemble(small_header(), small_body(reward=[np.nan])))
    expect("rewards", decode_message, assemble(small_header(), small_body(rpf=[[np.inf]])))
    nan_rpf = decode_message(assemble(small_header(), small_body(rpf=[[np.nan]])))  # NaN: a function returned None
    assert np.isnan(nan_rpf.completions[0].rewards_per_func[0])
    for bad in (np.nan, np.inf, 1e300, "high"):  # 1e300 overflows float32
        message = make_message(n=1)
        message.completions[0].reward = bad
        expect("rewards", encode_message, message)


def test_bad_group_index_and_lengths():
    expect("shape", decode_message, assemble(small_header(), small_body(group=[7])))
    expect("shape", decode_message, assemble(small_header(), small_body(length=[1])))  # sum != tokens
    header = small_header(counts={"completions": 2, "tokens": 2})
    body = columns_body([0, 0], [0, 2], [1, 1], [[0], [0]], [1, 2], [-1, -1])
    expect("shape", decode_message, assemble(header, body))  # an empty completion
    message = make_message(n_groups=2)
    message.completions[0].group = 2
    expect("shape", encode_message, message)
    expect("limits", decode_message, encode_message(make_message(length=16)), limits=Limits(max_completion_tokens=15))
    expect("limits", decode_message, encode_message(make_message(n=8)), limits=Limits(max_completions=7))


@pytest.mark.parametrize("sender", ["../x", "", "a" * 129, "a/b", "a\\b", "..", ".", "a\nb", "nul\0"])
def test_bad_senders(sender):
    expect("header", encode_message, make_message(sender=sender))
    expect("header", decode_message, assemble(small_header(sender=sender), small_body()))


def test_good_senders():
    for sender in ("a" * 64, "peer-7", "node_3.rank0", "Qwen2.5-0.5B"):
        assert decode_message(encode_message(make_message(sender=sender))).sender == sender


@pytest.mark.parametrize("sender", ["a" * 65, "peer 7", "node-3:rank0", "pëer", "-x", ".x", "x..y"])
def test_senders_outside_the_peer_id_rule_are_refused_on_both_sides(sender):
    expect("header", encode_message, make_message(sender=sender))
    header = small_header(sender=sender)
    expect("header", decode_message, assemble(header, small_body()))


def test_errors_name_the_sender():
    error = expect("logps", decode_message, assemble(small_header(sender="mallory"), small_body(logps=[0.5, -1])))
    assert "mallory" in str(error)


def test_size_limits_on_encode_and_decode():
    data = encode_message(make_message())
    expect("too_large", decode_message, data, limits=Limits(max_message_bytes=len(data) - 1))
    header_length = PREAMBLE.unpack(data[:PREAMBLE_SIZE])[3]
    expect("too_large", decode_message, data, limits=Limits(max_header_bytes=header_length - 1))
    expect("too_large", encode_message, make_message(), limits=Limits(max_message_bytes=len(data) - 1))


# ---------------------------------------------------------------------------------------------------------------
# Encode-side validation and JSON conversion


def test_numpy_values_in_prompts_and_extra_become_plain_json():
    message = make_message(n=1, n_groups=1)
    message.groups[0] = WireGroup(
        prompt=np.str_("2+2="),
        extra={"answer": np.int64(4), "score": np.float32(0.5), "ok": np.bool_(True), "v": np.arange(3), "t": (1, 2)},
    )
    group = decode_message(encode_message(message)).groups[0]
    expected = {"answer": 4, "score": 0.5, "ok": True, "v": [0, 1, 2], "t": [1, 2]}
    assert group == WireGroup(prompt="2+2=", extra=expected)
    assert type(group.extra["answer"]) is int and type(group.prompt) is str


@pytest.mark.parametrize("bad", [object(), {1, 2}, float("nan"), b"bytes", {1: "int key"}, "\ud800"])
def test_non_json_values_raise_a_clear_error(bad):
    message = make_message(n=1, n_groups=1)
    message.groups[0].extra["column"] = bad
    error = expect("header", encode_message, message)
    assert "column" in str(error)


def test_encode_validates_the_message():
    cases = [
        ({"temperature": 0.0}, "header"),
        ({"temperature": float("nan")}, "header"),
        ({"round": -1}, "header"),
        ({"tokenizer_fingerprint": "not-a-sha"}, "header"),
        ({"reward_names": ["only-one"]}, "shape"),  # K = 2 per completion
    ]
    for overrides, reason in cases:
        expect(reason, encode_message, make_message(**overrides))
    message = make_message(n=1)
    message.completions[0].completion_ids = np.array([], np.int64)
    message.completions[0].generator_logps = np.array([], np.float32)
    expect("shape", encode_message, message)
    message = make_message(n=1)
    message.completions[0].completion_ids = message.completions[0].completion_ids.astype(np.float32)
    expect("ids", encode_message, message)
    message = make_message(n=1)
    message.completions[0].completion_ids[0] = 2**31
    expect("ids", encode_message, message)
    with pytest.raises(TypeError):
        encode_message({"sender": "a"})


# ---------------------------------------------------------------------------------------------------------------
# peek_header, errors, imports


def test_peek_header_reads_without_verifying_or_decoding():
    message = make_message(round=41)
    data = encode_message(message, secret="s", compact=True)
    info = peek_header(data)
    assert info["sender"] == "peer-a" and info["round"] == 41 and info["created"] == message.created
    assert info["signed"] and info["compact"] and info["compressed"]
    assert info["num_completions"] == 8 and info["num_tokens"] == 128 and info["num_groups"] == 2
    assert info["message_bytes"] == len(data) and info["schema_version"] == SCHEMA_VERSION
    # Only the preamble and the header are needed: a transport can read just a file's first bytes.
    assert peek_header(data[: PREAMBLE_SIZE + info["header_bytes"]])["round"] == 41
    expect("truncated", peek_header, data[: PREAMBLE_SIZE + info["header_bytes"] - 1])
    # The signature is not checked (tampering with the body goes unnoticed here, by design).
    tampered = data[:-1] + bytes([data[-1] ^ 1])
    assert peek_header(tampered)["sender"] == "peer-a"
    expect("signature", decode_message, tampered, secret="s")
    expect("magic", peek_header, b"PK\x03\x04" + data[4:])


def test_exchange_error_is_a_picklable_value_error():
    error = ExchangeError("ids", "message from peer 'x': token id 99 is outside ...")
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.reason == "ids" and str(copy) == str(error)


def test_wire_module_imports_neither_torch_nor_transformers():
    # The wire package without the trl_ftis package __init__ (which imports torch for the objective): a bare
    # package object stands in for it, so only exchange/, wire.py and the rules they import are loaded.
    package_dir = str(Path(wire.__file__).resolve().parents[1])
    code = (
        "import sys, types\n"
        f"package = types.ModuleType('trl_ftis'); package.__path__ = [{package_dir!r}]\n"
        "sys.modules['trl_ftis'] = package\n"
        "import trl_ftis.exchange.wire\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer fingerprint


def test_tokenizer_fingerprint():
    from trl_ftis.demo.tiny import build_char_tokenizer

    first = tokenizer_fingerprint(build_char_tokenizer())
    assert len(first) == 64 and int(first, 16) >= 0
    assert tokenizer_fingerprint(build_char_tokenizer()) == first  # two loads
    assert tokenizer_fingerprint(build_char_tokenizer(chat_template=None)) == first  # template excluded

    extended = build_char_tokenizer()
    extended.add_tokens(["<x>"])
    assert tokenizer_fingerprint(extended) != first

    repurposed = build_char_tokenizer()
    repurposed.pad_token = "<eos>"  # same vocabulary, different special-token roles
    assert tokenizer_fingerprint(repurposed) != first
    swapped = build_char_tokenizer()
    swapped.bos_token, swapped.eos_token = "<eos>", "<bos>"  # same set of special tokens, roles swapped
    assert sorted(swapped.all_special_tokens) == sorted(build_char_tokenizer().all_special_tokens)
    assert tokenizer_fingerprint(swapped) != first

    special = build_char_tokenizer()
    special.add_special_tokens({"additional_special_tokens": ["<tool>"]})
    assert tokenizer_fingerprint(special) not in (first, tokenizer_fingerprint(extended))


def test_tokenizer_fingerprint_accepts_any_tokenizer_like_object():
    class Minimal:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return dict(self.vocab)

        def __len__(self):
            return len(self.vocab)

    a = tokenizer_fingerprint(Minimal({"a": 0, "b": 1}))
    assert a == tokenizer_fingerprint(Minimal({"b": 1, "a": 0}))  # dict order does not matter
    assert a != tokenizer_fingerprint(Minimal({"a": 1, "b": 0}))  # swapped ids do


def test_the_optional_model_name_travels_and_is_checked():
    named = make_message(model="Qwen/Qwen2.5-3B (LoRA)")
    data = encode_message(named, secret="s")
    assert decode_message(data, secret="s").model == "Qwen/Qwen2.5-3B (LoRA)"
    assert peek_header(data)["model"] == "Qwen/Qwen2.5-3B (LoRA)"
    unnamed = encode_message(make_message())  # older senders leave it out: still valid
    assert b'"model"' not in unnamed and decode_message(unnamed).model == ""
    body = small_body()
    assert decode_message(assemble(small_header(model="m"), body)).model == "m"
    expect("header", decode_message, assemble(small_header(model="bad\nname"), body))
    expect("header", decode_message, assemble(small_header(model=7), body))
    expect("header", decode_message, assemble(small_header(model="x" * 5000), body))


# ---------------------------------------------------------------------------------------------------------------
# Signatures are verified before anything is parsed

KEY_A = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))  # fixed keys: Ed25519 signatures are deterministic
KEY_B = Ed25519PrivateKey.from_private_bytes(bytes(range(32, 64)))
KEY_MALLORY = Ed25519PrivateKey.from_private_bytes(bytes(range(64, 96)))
PUBLIC_KEYS = {"peer-a": KEY_A.public_key(), "peer-b": KEY_B.public_key(), "mallory": KEY_MALLORY.public_key()}


def sign_frame(core: bytes, *, secret=None, private_key=None, signer: str | None = None) -> bytes:
    """Signs preamble + header + body as a sender holding `secret` / `private_key` would, naming `signer` in the
    Ed25519 block; sets the flags. Lets a test play a swarm member crafting any bytes it likes."""
    flags = struct.unpack_from("<H", core, 6)[0] & ~(layout.FLAG_SIGNED | layout.FLAG_ED25519)
    flags |= layout.FLAG_SIGNED if secret is not None else 0
    flags |= layout.FLAG_ED25519 if private_key is not None else 0
    data = core[:6] + struct.pack("<H", flags) + core[8:]
    if private_key is not None:
        name = signer.encode() if isinstance(signer, str) else signer
        data += bytes([len(name)]) + name
        data += private_key.sign(data)
    if secret is not None:
        data += hmac.new(secret.encode() if isinstance(secret, str) else secret, data, hashlib.sha256).digest()
    return data


@pytest.fixture
def no_parsing(monkeypatch):
    """Fails the test if the header JSON is parsed or the body inflated."""

    def forbidden(*args, **kwargs):
        raise AssertionError("parsed before the signature was verified")

    monkeypatch.setattr(wire.json, "loads", forbidden)
    monkeypatch.setattr(wire.zlib, "decompressobj", forbidden)


def big_message() -> bytes:
    """A 16 MiB message whose header is one big JSON prompt: the costliest thing to parse."""
    header = small_header(groups=[{"prompt": "x" * (16 * 2**20), "extra": {}}])
    return assemble(header, small_body())


@pytest.mark.parametrize(
    "options,reason",
    [
        ({"secret": "s"}, "unsigned"),
        ({"public_keys": PUBLIC_KEYS}, "unsigned"),
        ({"secret": "s", "public_keys": PUBLIC_KEYS}, "unsigned"),
    ],
)
def test_an_unsigned_message_is_refused_from_the_preamble_alone(no_parsing, options, reason):
    data = big_message()
    assert len(data) > 16 * 2**20
    tracemalloc.start()
    try:
        expect(reason, decode_message, data, **options)
        expect(reason, peek_header, data, **options)
        expect(reason, peek_header, data[:PREAMBLE_SIZE], **options)  # the flags are all it needs
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**10


@pytest.mark.parametrize(
    "signing,options,reason",
    [
        ({"secret": "wrong"}, {"secret": "s"}, "signature"),
        ({"private_key": KEY_MALLORY, "signer": "peer-a"}, {"public_keys": PUBLIC_KEYS}, "signature"),
        ({"private_key": KEY_MALLORY, "signer": "stranger"}, {"public_keys": PUBLIC_KEYS}, "unknown_peer"),
        (
            {"secret": "wrong", "private_key": KEY_A, "signer": "peer-a"},
            {"secret": "s", "public_keys": PUBLIC_KEYS},
            "signature",
        ),
    ],
)
def test_a_wrongly_signed_message_costs_one_hash_and_no_parsing(no_parsing, signing, options, reason):
    data = sign_frame(big_message(), **signing)
    tracemalloc.start()
    try:
        expect(reason, decode_message, data, **options)
        expect(reason, peek_header, data, **options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**10  # the 16 MiB are hashed in place, never copied


def test_peek_header_verifies_first_when_given_a_secret_or_keys():
    data = encode_message(make_message(round=41), secret="s", private_key=KEY_A)
    info = peek_header(data, secret="s", public_keys=PUBLIC_KEYS)
    assert info["verified"] and info["signed"] and info["ed25519"] and info["signer"] == "peer-a"
    assert info["round"] == 41 and info["message_bytes"] == len(data)
    assert not peek_header(data)["verified"] and peek_header(data)["signer"] is None
    tampered = data[:30] + bytes([data[30] ^ 1]) + data[31:]
    expect("signature", peek_header, tampered, secret="s")
    expect("signature", peek_header, tampered, public_keys=PUBLIC_KEYS)
    # Verifying needs the signed bytes: a header-only prefix is truncated.
    expect("truncated", peek_header, data[: PREAMBLE_SIZE + info["header_bytes"]], secret="s")


def test_the_hmac_is_checked_before_the_ed25519_signature(monkeypatch):
    calls = []
    monkeypatch.setattr(keys, "verify", lambda *args: calls.append(args) or True)
    data = encode_message(make_message(), secret="wrong", private_key=KEY_A)
    expect("signature", decode_message, data, secret="s", public_keys=PUBLIC_KEYS)
    assert calls == []  # a non-member never reaches Ed25519


# ---------------------------------------------------------------------------------------------------------------
# Per-peer Ed25519 keys: identity, not only membership


def test_ed25519_round_trip_and_layout():
    message = make_message()
    plain = encode_message(message)
    for secret in (None, "s"):
        data = encode_message(message, private_key=KEY_A, secret=secret)
        hmac_size = SIGNATURE_SIZE if secret else 0
        # preamble + header + body unchanged, then the block: signer length, signer, 64-byte signature; then the HMAC
        assert data[8 : len(plain)] == plain[8:]
        assert data[len(plain)] == len("peer-a") and data[len(plain) + 1 : len(plain) + 7] == b"peer-a"
        assert len(data) == len(plain) + 1 + 6 + ED25519_SIGNATURE_SIZE + hmac_size
        signature_start = len(plain) + 7
        KEY_A.public_key().verify(data[signature_start : signature_start + 64], data[:signature_start])
        decoded = decode_message(data, secret=secret, public_keys=PUBLIC_KEYS, vocab_limit=VOCAB)
        assert decoded.sender == "peer-a" and decoded.num_tokens() == message.num_tokens()
        assert decode_message(data).sender == "peer-a"  # a receiver without keys does not check the block
    for compact in (False, True):
        data = encode_message(message, private_key=KEY_A, compact=compact)
        assert decode_message(data, public_keys=PUBLIC_KEYS).compact is compact


def test_a_member_with_the_secret_cannot_write_as_another_peer_when_keys_are_required():
    impersonation = make_message(sender="peer-b")
    core = encode_message(impersonation)
    both = {"secret": "s", "public_keys": PUBLIC_KEYS}
    # With the secret alone, membership is all that is proven: mallory can write as peer-b.
    assert decode_message(encode_message(impersonation, secret="s"), secret="s").sender == "peer-b"
    # With keys required: her own key, naming herself as signer -> the header's sender is not the signer.
    error = expect(
        "identity", decode_message, sign_frame(core, secret="s", private_key=KEY_MALLORY, signer="mallory"), **both
    )
    assert "mallory" in str(error) and "peer-b" in str(error)
    # Her key, naming peer-b as signer -> the signature does not match peer-b's key.
    expect("signature", decode_message, sign_frame(core, secret="s", private_key=KEY_MALLORY, signer="peer-b"), **both)
    expect("signature", decode_message, encode_message(impersonation, secret="s", private_key=KEY_MALLORY), **both)
    # No Ed25519 block at all -> unsigned; a signer nobody registered -> unknown_peer.
    expect("unsigned", decode_message, encode_message(impersonation, secret="s"), **both)
    stranger = sign_frame(core, secret="s", private_key=KEY_MALLORY, signer="stranger")
    expect("unknown_peer", decode_message, stranger, **both)
    # Her own messages are fine.
    assert decode_message(encode_message(make_message(sender="mallory"), secret="s", private_key=KEY_MALLORY), **both)


def test_tampering_with_any_byte_of_an_ed25519_signed_message_is_detected():
    data = encode_message(make_message(n=2, length=4, k=1), private_key=KEY_A)
    for position in range(len(data)):
        for mask in (0x01, 0x80):
            tampered = bytearray(data)
            tampered[position] ^= mask
            with pytest.raises(ExchangeError) as info:
                decode_message(bytes(tampered), public_keys=PUBLIC_KEYS)
            assert info.value.reason in REASONS
    # Stripping the block and clearing the flag makes it unsigned.
    stripped = bytearray(data[: -(1 + 6 + ED25519_SIGNATURE_SIZE)])
    stripped[6] &= ~layout.FLAG_ED25519
    expect("unsigned", decode_message, bytes(stripped), public_keys=PUBLIC_KEYS)
    assert decode_message(bytes(stripped)).sender == "peer-a"


@pytest.mark.parametrize("signer", [b"", b"x" * 65, b"../x", b"p\xc3\xaber", b"a b"])
def test_malformed_ed25519_blocks(signer):
    core = encode_message(make_message())
    data = sign_frame(core, private_key=KEY_A, signer=signer)
    expect("signature", decode_message, data)  # malformed whether or not keys are required
    expect("signature", decode_message, data, public_keys=PUBLIC_KEYS)


def test_every_truncation_of_an_ed25519_signed_message_is_truncated():
    data = encode_message(make_message(n=2, length=3, k=1), secret="s", private_key=KEY_A)
    for end in range(len(data)):
        expect("truncated", decode_message, data[:end], secret="s", public_keys=PUBLIC_KEYS)
        expect("truncated", decode_message, data[:end])
    expect("too_large", decode_message, data + b"\0", secret="s", public_keys=PUBLIC_KEYS)


def test_key_arguments_are_type_checked():
    with pytest.raises(TypeError):
        encode_message(make_message(), private_key=b"\0" * 32)
    data = encode_message(make_message(), private_key=KEY_A)
    with pytest.raises(TypeError):
        decode_message(data, public_keys={"peer-a": KEY_A})  # a private key where a public key belongs
    expect("unknown_peer", decode_message, data, public_keys={})  # no registered peer at all


# ---------------------------------------------------------------------------------------------------------------
# Number ranges

F32_MAX = float(np.finfo(np.float32).max)


def f32_next(value: float, direction: float) -> float:
    return float(np.nextafter(np.float32(value), np.float32(direction)))


def message_with(**fields):
    """A one-completion message (2 tokens, K = 1) with `reward`, `rpf` or `logps` replaced."""
    message = make_message(n=1, length=2, k=1, n_groups=1)
    completion = message.completions[0]
    if "reward" in fields:
        completion.reward = fields["reward"]
    if "rpf" in fields:
        completion.rewards_per_func = np.array([fields["rpf"]], np.float32)
    if "logps" in fields:
        completion.generator_logps = np.array([-0.5, fields["logps"]], np.float32)
    return message


REWARD_CASES = [
    (0.0, True),
    (1e6, True),
    (-1e6, True),
    (f32_next(1e6, np.inf), False),
    (f32_next(-1e6, -np.inf), False),
    (F32_MAX, False),
    (-F32_MAX, False),
    (np.inf, False),
    (-np.inf, False),
    (np.nan, False),
]


@pytest.mark.parametrize("value,ok", REWARD_CASES)
def test_reward_range(value, ok):
    for field_, reason_field in (("reward", "reward"), ("rpf", "rpf")):
        body = small_body(**{reason_field: [value] if field_ == "reward" else [[value]]})
        data = assemble(small_header(), body)
        message = message_with(**{field_: value})
        if ok or (field_ == "rpf" and math.isnan(value)):  # NaN: a reward function returned None
            assert decode_message(data).num_tokens() == 2
            decode_message(encode_message(message))
        else:
            expect("rewards", decode_message, data)
            expect("rewards", encode_message, message)
            expect("rewards", encode_message, message, compact=True)
    # NaN is allowed per function only (a reward function returned None).
    assert np.isnan(decode_message(encode_message(message_with(rpf=np.nan))).completions[0].rewards_per_func[0])
    limits = Limits(max_abs_reward=10)
    expect("rewards", decode_message, assemble(small_header(), small_body(reward=[10.5])), limits=limits)
    expect("rewards", encode_message, message_with(rpf=-10.5), limits=limits)
    decode_message(encode_message(message_with(reward=10.0), limits=limits), limits=limits)


@pytest.mark.parametrize(
    "value,ok",
    [
        (-1e5, True),
        (-65504.0, True),
        (0.0, True),
        (1e-4, True),  # MAX_LOGP, rounding slack
        (f32_next(-1e5, -np.inf), False),
        (-F32_MAX, False),
        (F32_MAX, False),
        (-np.inf, False),
        (np.inf, False),
        (np.nan, False),
    ],
)
def test_log_prob_range(value, ok):
    data = assemble(small_header(), small_body(logps=[-0.5, value]))
    message = message_with(logps=value)
    if ok:
        assert decode_message(data).completions[0].generator_logps[1] == np.float32(value)
        for compact in (False, True):
            decode_message(encode_message(message, compact=compact))
    else:
        expect("logps", decode_message, data)
        expect("logps", encode_message, message)
        expect("logps", encode_message, message, compact=True)


def test_compact_rounding_never_crosses_a_custom_log_prob_floor():
    limits = Limits(min_logp=-1000.3)  # float16 rounds -1000.3 to -1000.5, below the floor
    message = message_with(logps=-1000.3)
    got = decode_message(encode_message(message, compact=True, limits=limits), limits=limits)
    assert got.completions[0].generator_logps[1] == -1000.0  # the lowest float16 >= the floor
    expect("logps", decode_message, assemble(small_header(), small_body(logps=[-0.5, -1000.5])), limits=limits)


@pytest.mark.parametrize(
    "field_,value,ok",
    [
        ("temperature", 0.01, True),
        ("temperature", 100.0, True),
        ("temperature", math.nextafter(0.01, 0), False),
        ("temperature", math.nextafter(100.0, math.inf), False),
        ("temperature", F32_MAX, False),
        ("temperature", -1.0, False),
        ("round", 0, True),
        ("round", 2**63 - 1, True),
        ("round", 2**63, False),
        ("round", -1, False),
        ("created", 0.0, True),
        ("created", 253_402_300_799.0, True),
        ("created", math.nextafter(253_402_300_799.0, math.inf), False),
        ("created", F32_MAX, False),
        ("created", -1e-300, False),
    ],
)
def test_header_number_ranges(field_, value, ok):
    data = assemble(small_header(**{field_: value}), small_body())
    message = make_message(**{field_: value})
    if ok:
        assert getattr(decode_message(data), field_) == value
        assert getattr(decode_message(encode_message(message)), field_) == value
    else:
        expect("header", decode_message, data)
        expect("header", encode_message, message)
    for bad in (math.inf, -math.inf, math.nan):  # not JSON: refused by the parser, and by the encoder
        raw = json.dumps(small_header(**{field_: bad})).encode()
        expect("header", decode_message, assemble(None, small_body(), raw_header=raw))


def test_temperature_range_is_configurable():
    data = encode_message(make_message(temperature=0.005), limits=Limits(min_temperature=0.001))
    expect("header", decode_message, data)
    assert decode_message(data, limits=Limits(min_temperature=0.001)).temperature == 0.005


@pytest.mark.parametrize(
    "limit,inside,outside",
    [
        # (Limits field, message kwargs just at the limit, message kwargs one over): limit values are small here
        ("max_completions", {"n": 4, "n_groups": 1}, {"n": 5, "n_groups": 1}),
        ("max_groups", {"n": 4, "n_groups": 4}, {"n": 5, "n_groups": 5}),
        ("max_completion_tokens", {"n": 1, "length": 4}, {"n": 1, "length": 5}),
        ("max_total_tokens", {"n": 2, "length": 2}, {"n": 1, "length": 5}),
        ("max_reward_functions", {"n": 1, "k": 4}, {"n": 1, "k": 5}),
    ],
)
def test_count_limits_just_inside_and_just_outside(limit, inside, outside):
    limits = Limits(**{limit: 4})
    decode_message(encode_message(make_message(**inside), limits=limits), limits=limits)
    data = encode_message(make_message(**outside))
    expect("limits", decode_message, data, limits=limits)
    expect("limits", encode_message, make_message(**outside), limits=limits)


def test_limits_are_validated():
    for bad in (
        {"max_completions": -1},
        {"max_completions": 1.5},
        {"max_message_bytes": True},
        {"max_text_bytes": -1},
        {"max_completion_text_bytes": 1.0},
        {"max_abs_reward": 0.0},
        {"max_abs_reward": math.inf},
        {"min_logp": 0.0},
        {"min_logp": math.nan},
        {"min_temperature": 0.0},
        {"min_temperature": 2.0, "max_temperature": 1.0},
    ):
        with pytest.raises(ValueError):
            Limits(**bad)
    for bad in (
        {"max_rows": 0},
        {"max_completion_length": -1},
        {"max_rows": 2.0},
        {"max_prompt_chars": -1},
        {"max_text_bytes_per_token": -1},
        {"max_text_bytes_per_token": 1.5},
    ):
        with pytest.raises(ValueError):
            Limits.for_receiver(**{"max_completion_length": 8, "max_rows": 8, **bad})


# ---------------------------------------------------------------------------------------------------------------
# Cost bounded by what the receiver will use (Limits.for_receiver)


def test_for_receiver_derives_tight_limits():
    limits = Limits.for_receiver(max_completion_length=512, max_rows=512, max_groups=64, max_prompt_chars=4096)
    assert limits.max_completions == 512 and limits.max_groups == 64
    assert limits.max_completion_tokens == 512 and limits.max_total_tokens == 512 * 512
    body = 512 * (12 + 4 * 64) + 8 * 512 * 512 + 5 * 512 + 16 * 512 * 512  # the last two: the text section
    assert body < limits.max_message_bytes - limits.max_header_bytes < body * 1.01 + 1024
    assert limits.max_header_bytes == 64 * 2**10 + 1600 * 64 + 64 * (6 * 4096 + 16_384 + 1024)
    assert limits.max_message_bytes < 12 * 2**20  # vs 256 MiB by default
    # In bytes never looser than the defaults: 512 groups of 32 768-character prompts would exceed them.
    loose = Limits.for_receiver(max_completion_length=512, max_rows=512)
    assert loose.max_header_bytes == Limits().max_header_bytes and loose.max_completions == 512
    assert loose.max_message_bytes < Limits().max_message_bytes
    # Number bounds and any derived field can be overridden.
    custom = Limits.for_receiver(max_completion_length=8, max_rows=8, max_abs_reward=5.0, max_message_bytes=10**6)
    assert custom.max_abs_reward == 5.0 and custom.max_message_bytes == 10**6 and custom.max_groups == 8


def test_a_message_at_the_receivers_caps_fits_the_derived_limits():
    # The worst an honest peer sends: every row, every token, K reward functions, prompts of max_prompt_chars of
    # the characters JSON spends the most bytes on, the largest extra columns, 4-byte characters in the names.
    rows, length, k, prompt_chars, extra_bytes = 12, 7, 3, 50, 300
    limits = Limits.for_receiver(
        max_completion_length=length,
        max_rows=rows,
        max_prompt_chars=prompt_chars,
        max_extra_bytes=extra_bytes,
        max_reward_functions=k,
    )
    message = make_message(
        n=rows,
        length=length,
        k=k,
        n_groups=rows,
        vocab=151_000,
        tokenizer_name="\U0001f600" * 4096,
        model="\U0001f600" * 4096,
        reward_names=["\U0001f600" * 256] * k,
    )
    for i, group in enumerate(message.groups):
        prompt = "\x01" * prompt_chars if i % 2 else [{"role": "\x01" * 10, "content": "\x01" * (prompt_chars - 17)}]
        group.prompt, group.extra = prompt, {"a": "x" * (extra_bytes - 12)}
    for compact in (False, True):
        data = encode_message(message, compact=compact, secret="s", private_key=KEY_A, limits=limits)
        decoded = decode_message(data, secret="s", public_keys=PUBLIC_KEYS, limits=limits)
        assert decoded.num_tokens() == rows * length
    # One more row, or one more token, and the receiver refuses it from the header.
    expect("limits", decode_message, encode_message(make_message(n=rows + 1, length=length)), limits=limits)
    expect("limits", decode_message, encode_message(make_message(n=1, length=length + 1)), limits=limits)


def test_a_tiny_message_declaring_many_rows_is_refused_from_its_header(monkeypatch):
    # 65 536 one-token rows in a ~1.4 KiB compressed message (the body is all zeros but for the lengths).
    n = 65_536
    header = small_header(
        reward_names=[],
        groups=[{"prompt": "p", "extra": {}}],
        counts={"completions": n, "tokens": n},
        dtypes={"ids": "<u2", "logps": "<f2"},
    )
    body = columns_body([0] * n, [1] * n, [0.0] * n, np.zeros((n, 0)), [0] * n, [0.0] * n, "<u2", "<f2")
    data = assemble(header, zlib.compress(body, 9), flags=layout.FLAG_COMPACT | layout.FLAG_COMPRESSED)
    assert len(data) < 1600
    assert len(decode_message(data).completions) == n  # the default limits take it: 65 536 row objects
    limits = Limits.for_receiver(max_completion_length=512, max_rows=512)
    created = []
    monkeypatch.setattr(wire, "WireCompletion", lambda **fields: created.append(1))
    monkeypatch.setattr(wire.zlib, "decompressobj", lambda: pytest.fail("inflated a body the header already refuses"))
    tracemalloc.start()
    try:
        error = expect("limits", decode_message, data, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "65536 completions" in str(error) and created == []
    assert peak < 64 * 2**10  # O(header): the 1 MiB body is never inflated


def test_a_zip_bomb_costs_at_most_the_derived_body_size():
    limits = Limits.for_receiver(max_completion_length=512, max_rows=512, max_reward_functions=0)
    header = small_header(
        reward_names=[], counts={"completions": 512, "tokens": 512 * 512}, dtypes={"ids": "<u2", "logps": "<f2"}
    )
    declared = 512 * 12 + 512 * 512 * 4  # what the counts imply: about 1 MiB
    compressor = zlib.compressobj(9)
    bomb = b"".join(compressor.compress(bytes(2**20)) for _ in range(64)) + compressor.flush()  # 64 MiB of zeros
    data = assemble(header, bomb, flags=layout.FLAG_COMPACT | layout.FLAG_COMPRESSED)
    assert len(data) < 128 * 2**10
    tracemalloc.start()
    try:
        expect("too_large", decode_message, data, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # At most (twice, while zlib joins its output blocks) the body the receiver would accept, never the 64 MiB.
    assert peak < 2 * declared + 256 * 2**10
    # Counts beyond the derived limits: refused before inflating anything.
    too_many = small_header(reward_names=[], counts={"completions": 513, "tokens": 513}, dtypes=header["dtypes"])
    expect("limits", decode_message, assemble(too_many, bomb, flags=6), limits=limits)
    # A header larger than the derived budget: refused before it is parsed.
    huge_header = small_header(groups=[{"prompt": "x" * limits.max_header_bytes, "extra": {}}])
    expect("too_large", decode_message, assemble(huge_header, small_body()), limits=limits)


# ---------------------------------------------------------------------------------------------------------------
# The optional text section (header key "text_bytes"), for peers with another tokenizer

NO_TEXT = 0xFFFFFFFF
TEXTS = ["h\u00e9llo \u2713 \U0001f600", None, "", "2+2=4", None, "\u6570\u5b66 ok"]  # 2-, 3-, 4-byte characters
EOS = [True, True, False, True, False, False]  # the None rows' True is not sent


def example_message(**fields) -> Message:
    """The worked example of docs/wire-format.md: one prompt, one completion of 3 tokens, K = 1."""
    completion = WireCompletion(
        group=0,
        completion_ids=np.array([11, 5, 2]),
        generator_logps=np.array([-0.25, -0.5, -0.125], np.float32),
        reward=1.0,
        rewards_per_func=np.array([1.0], np.float32),
        **fields,
    )
    return make_message(
        n=0, k=1, reward_names=["exact"], groups=[WireGroup(prompt="23+48=", extra={"answer": "71"})],
        completions=[completion], created=1_700_000_000.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"compress": True},
        {"compact": True},
        {"compact": True, "compress": False},
        {"secret": "s", "private_key": KEY_A},
        {"compact": True, "secret": "s", "private_key": KEY_A},
    ],
    ids=["exact", "exact-zlib", "compact", "compact-raw", "signed", "compact-signed"],
)
def test_texts_round_trip(options):
    message = make_message(n=6, length=5, texts=TEXTS, eos=EOS)
    data = encode_message(message, **options)
    signatures = {"secret": "s", "public_keys": PUBLIC_KEYS} if "secret" in options else {}
    decoded = decode_message(data, vocab_limit=VOCAB, **signatures)
    assert [c.text for c in decoded.completions] == TEXTS
    assert [c.ends_with_eos for c in decoded.completions] == [True, False, False, True, False, False]
    assert all(type(c.ends_with_eos) is bool for c in decoded.completions)
    assert decoded.completions[2].text == "" and decoded.completions[1].text is None  # empty is not absent
    for got, sent in zip(decoded.completions, message.completions, strict=True):  # the columns are unchanged
        assert np.array_equal(got.completion_ids, sent.completion_ids) and got.group == sent.group
    text_bytes = sum(len(t.encode()) for t in TEXTS if t is not None)
    assert text_bytes > sum(len(t) for t in TEXTS if t is not None)  # non-ASCII: more bytes than characters
    assert peek_header(data, **signatures)["text_bytes"] == text_bytes
    flags, header, body, _ = split(data)
    assert header["text_bytes"] == text_bytes
    if not flags & layout.FLAG_COMPRESSED:  # the section follows the log-probs: 5 bytes per completion + the texts
        assert len(body) == len(split(encode_message(make_message(n=6, length=5), **options))[2]) + 5 * 6 + text_bytes
        section = body[len(body) - text_bytes - 5 * 6 :]
        assert np.frombuffer(section[:24], "<u4").tolist() == [
            NO_TEXT if t is None else len(t.encode()) for t in TEXTS
        ]
        assert list(section[24:30]) == [1, 0, 0, 1, 0, 0]
        assert section[30:] == "".join(t for t in TEXTS if t is not None).encode()


def test_a_message_without_texts_is_byte_identical_to_before():
    # SHA-256 of the worked example as encoded before the text section existed (same bytes, same sizes).
    known = {
        (): (405, "f59675e7c1ed8a4a5a785393deef98a6b352c16f9bf192cc266e216f984da170"),
        (("secret", "swarm secret"),): (437, "3dd1c1b6c0f82a8d485f571921068fc85fe5efe712f7edab01dce4ef056e5fbe"),
        (("compact", True), ("compress", False), ("private_key", KEY_A)): (
            464,
            "0e0eeffdb1fe33ea7b80f25bb5139e4e997ee549652f07ed6fc5d19c6f73160a",
        ),
    }
    for options, (size, digest) in known.items():
        for eos in (False, True):  # ends_with_eos without a text is not sent
            data = encode_message(example_message(ends_with_eos=eos), **dict(options))
            assert (len(data), hashlib.sha256(data).hexdigest()) == (size, digest)
            assert b"text_bytes" not in data and peek_header(data)["text_bytes"] == 0
            decoded = decode_message(data).completions[0]
            assert decoded.text is None and decoded.ends_with_eos is False
    # And any message without texts: no key, and the body is exactly the columns.
    data = encode_message(make_message(n=4, length=3, k=1, eos=[True]))
    _, header, body, _ = split(data)
    assert "text_bytes" not in header and len(body) == 4 * (12 + 4) + 8 * 4 * 3


def text_frame(texts, eos=(False,), *, n_tokens=2, **header_fields):
    """(header, body) of a valid exact-mode message with a text section, to patch by hand: completion i has the
    text texts[i] (None: none), 2 tokens each, K = 1."""
    n = len(texts)
    message = make_message(n=n, length=n_tokens, k=1, n_groups=1, texts=list(texts), eos=list(eos))
    _, header, body, _ = split(encode_message(message))
    header.update(header_fields)
    return header, body


def patch_section(header, body, *, lengths=None, flags=None, text: bytes | None = None) -> bytes:
    """The body with its text section's lengths, flags or bytes replaced (same sizes unless given otherwise)."""
    n = header["counts"]["completions"]
    start = len(body) - header["text_bytes"] - 5 * n
    old_lengths, old_flags = body[start : start + 4 * n], body[start + 4 * n : start + 5 * n]
    old_text = body[start + 5 * n :]
    return (
        body[:start]
        + (old_lengths if lengths is None else np.asarray(lengths, "<u4").tobytes())
        + (old_flags if flags is None else bytes(flags))
        + (old_text if text is None else text)
    )


@pytest.mark.parametrize(
    "bad",
    [
        b"\xed\xa0\x80",  # a lone (high) surrogate, U+D800, in UTF-8 form: not text
        b"\xed\xbf\xbf",  # a low surrogate, U+DFFF
        b"\xff\xfe\x41",  # never valid in UTF-8
        b"\xc0\xaf\x41",  # an overlong "/"
        b"ab\xe2",  # a 3-byte character cut short at the end of the text
        b"\xf4\x90\x80",  # above U+10FFFF (3 of 4 bytes)
    ],
)
def test_invalid_utf8_texts_are_refused(bad):
    header, body = text_frame(["abc", None])
    assert decode_message(assemble(header, patch_section(header, body, text=b"xyz"))).completions[0].text == "xyz"
    error = expect("text", decode_message, assemble(header, patch_section(header, body, text=bad)))
    assert "completion 0" in str(error) and "peer-a" in str(error)  # names the completion and the sender
    # Between two valid texts the boundary matters: a character split across two completions is invalid in each.
    header, body = text_frame(["\u2713", "ok"])  # 3 bytes + 2 bytes
    split_char = patch_section(header, body, lengths=[2, 3])  # e2 9c | 93 6f 6b
    expect("text", decode_message, assemble(header, split_char))


def test_a_member_cannot_smuggle_invalid_text_past_a_signed_receiver():
    header, body = text_frame(["abc", None])
    core = assemble(header, patch_section(header, body, text=b"\xed\xa0\x80"))
    expect("text", decode_message, sign_frame(core, secret="s", private_key=KEY_A, signer="peer-a"),
           secret="s", public_keys=PUBLIC_KEYS)  # fmt: skip
    compressed_body = zlib.compress(patch_section(header, body, text=b"\xed\xa0\x80"))
    expect("text", decode_message, assemble(header, compressed_body, flags=layout.FLAG_COMPRESSED))


def test_text_lengths_must_add_up_to_text_bytes():
    header, body = text_frame(["abc", None, "de"])  # text_bytes 5
    assert header["text_bytes"] == 5
    for lengths in ([4, NO_TEXT, 2], [3, NO_TEXT, 1], [3, 0, 1], [NO_TEXT, NO_TEXT, 5 - 1], [3, 2, 1]):
        error = expect("shape", decode_message, assemble(header, patch_section(header, body, lengths=lengths)))
        assert "declares 5" in str(error)
    # A sentinel turned into a length (and back) with the same total is consistent: the texts move, nothing breaks.
    moved = decode_message(assemble(header, patch_section(header, body, lengths=[3, 1, 1])))
    assert [c.text for c in moved.completions] == ["abc", "d", "e"]
    # A header whose text_bytes disagrees with the body it came with: the body size no longer matches.
    header["text_bytes"] = 6
    expect("shape", decode_message, assemble(header, body))
    expect("shape", decode_message, assemble(header, zlib.compress(body), flags=layout.FLAG_COMPRESSED))


def test_text_bytes_above_the_limit_are_refused_from_the_header(monkeypatch):
    header, body = text_frame(["abc", "de"])
    limits = Limits(max_text_bytes=4)
    expect("limits", decode_message, assemble(header, body), limits=limits)
    assert decode_message(assemble(header, body), limits=Limits(max_text_bytes=5)).completions[1].text == "de"
    # A huge declared size costs the header only: the body (here 0 bytes, compressed or not) is never read.
    huge = dict(header, text_bytes=10**12)
    monkeypatch.setattr(wire.zlib, "decompressobj", lambda: pytest.fail("inflated a body the header refuses"))
    monkeypatch.setattr(wire, "check_text_columns", lambda *args: pytest.fail("read the text section"))
    for flags in (0, layout.FLAG_COMPRESSED):
        error = expect("limits", decode_message, assemble(huge, b"", flags=flags))
        assert "1000000000000 bytes of text" in str(error)
        expect("limits", peek_header, assemble(huge, b"", flags=flags))
    # More than N completions at their per-completion limit could hold, though within max_text_bytes: refused too.
    expect("limits", decode_message, assemble(header, body), limits=Limits(max_completion_text_bytes=2))


def test_one_completions_text_above_its_limit_is_refused():
    header, body = text_frame(["abcde", "", None])  # 5 bytes <= 3 completions x 4, but one text has 5
    limits = Limits(max_completion_text_bytes=4)
    error = expect("limits", decode_message, assemble(header, body), limits=limits)
    assert "completion 0 has 5 bytes of text" in str(error)
    assert decode_message(assemble(header, body), limits=Limits(max_completion_text_bytes=5)).completions[0].text
    # A hostile length far above the limit (but not the sentinel) is refused before any text byte is read.
    hostile = patch_section(header, body, lengths=[NO_TEXT - 1, 0, NO_TEXT])
    expect("limits", decode_message, assemble(header, hostile))
    # The sender finds out first, with the same limits.
    message = make_message(n=3, length=2, k=1, texts=["abcde", "", None])
    expect("limits", encode_message, message, limits=limits)
    expect("limits", encode_message, message, limits=Limits(max_text_bytes=4))
    expect("limits", encode_message, make_message(n=1, texts=["\u00e9\u00e9\u00e9"]), limits=limits)  # 6 bytes


@pytest.mark.parametrize("flags", [[2, 0], [3, 0], [0x80, 0], [1, 0xFE]])
def test_unknown_text_flag_bits_are_refused(flags):
    header, body = text_frame(["abc", "d"])
    flagged = decode_message(assemble(header, patch_section(header, body, flags=[1, 0])))
    assert [c.ends_with_eos for c in flagged.completions] == [True, False]
    error = expect("text", decode_message, assemble(header, patch_section(header, body, flags=flags)))
    assert "unknown text flag bits" in str(error)


def test_text_flags_on_a_completion_without_text_are_refused():
    header, body = text_frame(["abc", None])
    for flags in ([0, 1], [1, 1]):
        error = expect("text", decode_message, assemble(header, patch_section(header, body, flags=flags)))
        assert "completion 1" in str(error) and "no text" in str(error)


@pytest.mark.parametrize("value", [-1, 1.5, "3", True, None, [3], 2**64])
def test_text_bytes_must_be_a_non_negative_integer(value):
    header, body = text_frame(["abc"])
    header["text_bytes"] = value
    expect("limits" if value == 2**64 else "header", decode_message, assemble(header, body))


def test_a_text_section_with_no_text_or_no_completion_is_accepted():
    # Not what encode_message writes (it leaves the section out), but consistent: all sentinels, text_bytes 0.
    header, body = text_frame([None, None], text_bytes=0)
    body += np.full(2, NO_TEXT, "<u4").tobytes() + bytes(2)
    assert [c.text for c in decode_message(assemble(header, body)).completions] == [None, None]
    header, body = text_frame([])
    header["text_bytes"] = 0
    assert decode_message(assemble(header, body)).completions == []


def test_encode_validates_texts():
    for text in (b"bytes", 5, ["a"], np.array(["a"])):
        expect("text", encode_message, make_message(n=2, texts=[text, None]))
    error = expect("text", encode_message, make_message(n=2, texts=["ok", "lone \ud800 surrogate"]))
    assert "completions[1].text" in str(error)
    for eos in ("yes", 1, None, np.int64(1)):
        error = expect("text", encode_message, make_message(n=1, texts=["ok"], eos=[eos]))
        assert "ends_with_eos" in str(error)
    decoded = decode_message(encode_message(make_message(n=1, texts=["ok"], eos=[np.bool_(True)])))
    assert decoded.completions[0].ends_with_eos is True
    # Without a text, ends_with_eos is not sent, so it is not checked either.
    decode_message(encode_message(make_message(n=2, texts=["ok", None], eos=[False, "ignored"])))
    assert decode_message(encode_message(make_message(n=1, texts=[np.str_("np")]))).completions[0].text == "np"


def test_for_receiver_derives_text_limits():
    limits = Limits.for_receiver(max_completion_length=512, max_rows=64, max_groups=8, max_reward_functions=2)
    assert limits.max_completion_text_bytes == 16 * 512 == 8192
    assert limits.max_text_bytes == 64 * 8192 == 524_288
    header = 64 * 2**10 + 1600 * 2 + 8 * (6 * 32_768 + 16_384 + 1024)
    body = 64 * (12 + 4 * 2) + 8 * 64 * 512 + 5 * 64 + 524_288
    assert limits.max_header_bytes == header
    assert limits.max_message_bytes == 20 + header + body + body // 1000 + 64 + 161
    custom = Limits.for_receiver(max_completion_length=100, max_rows=10, max_text_bytes_per_token=6)
    assert (custom.max_completion_text_bytes, custom.max_text_bytes) == (600, 6000)
    none = Limits.for_receiver(max_completion_length=100, max_rows=10, max_text_bytes_per_token=0)
    assert (none.max_completion_text_bytes, none.max_text_bytes) == (0, 0)
    assert custom.max_message_bytes - none.max_message_bytes == 6000 + 6  # the texts + their 0.1% zlib margin
    # Never looser than the defaults, and any derived value can be overridden.
    long = Limits.for_receiver(max_completion_length=131_072, max_rows=1024)
    assert long.max_completion_text_bytes == Limits().max_completion_text_bytes == 2**20  # not 2 MiB
    assert long.max_text_bytes == Limits().max_text_bytes == 64 * 2**20  # not 1 GiB
    override = Limits.for_receiver(max_completion_length=8, max_rows=8, max_text_bytes=7, max_completion_text_bytes=3)
    assert (override.max_completion_text_bytes, override.max_text_bytes) == (3, 7)


def test_texts_at_the_receivers_caps_fit_the_derived_limits():
    # Every row with a text of 16 bytes per token (4-byte characters), on top of every row and token at the caps.
    rows, length, k = 12, 7, 2
    limits = Limits.for_receiver(
        max_completion_length=length, max_rows=rows, max_prompt_chars=8, max_reward_functions=k
    )
    message = make_message(n=rows, length=length, k=k, n_groups=rows, vocab=151_000, texts=["\U0001f600" * 4 * length])
    for compact in (False, True):
        data = encode_message(message, compact=compact, secret="s", private_key=KEY_A, limits=limits)
        decoded = decode_message(data, secret="s", public_keys=PUBLIC_KEYS, limits=limits)
        assert [c.text for c in decoded.completions] == ["\U0001f600" * 4 * length] * rows
        assert peek_header(data)["text_bytes"] == limits.max_text_bytes == rows * 16 * length
    # One byte more in one text, and sender and receiver refuse it.
    message.completions[0].text += "x"
    expect("limits", encode_message, message, limits=limits)
    expect("limits", decode_message, encode_message(message), limits=limits)
