"""Header and column validation: the checks [`encode_message`] (so that what it emits decodes) and
[`decode_message`] (on bytes from an *untrusted* peer) share. The header's keys, types, ranges and counts against the
[`Limits`] ([`check_header`], giving a [`Header`]), the size of the body it implies ([`header_body_size`]), and the
body's columns ([`Columns`], [`check_columns`]). The text section has its own module ([`trl_ftis.exchange.text`]).
Every failure is an [`ExchangeError`] ([`trl_ftis.exchange.errors`]).

Standard library and numpy only.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..message_trust import MAX_BINDING_CHARS
from ..peer_ids import peer_id_problem
from ..sampling_bounds import MAX_LOGP
from .errors import refusal
from .layout import (
    HEADER_KEYS,
    ID_DTYPES,
    LOGP_DTYPES,
    MAX_CREATED,
    MAX_EPOCH,
    MAX_JSON_DEPTH,
    MAX_NAME_CHARS,
    MAX_REWARD_NAME_CHARS,
    MAX_ROUND,
    OPTIONAL_HEADER_KEYS,
    SAMPLING_LOGPS,
    body_size,
    is_int,
)
from .limits import Limits

__all__ = [
    "Columns",
    "Header",
    "check_columns",
    "check_header",
    "check_sender",
    "has_lone_surrogate",
    "header_body_size",
]

_FINGERPRINT_RE = re.compile(r"[0-9a-f]{64}")
# JSON's "\ud800" escapes decode to lone surrogates: not text, and they cannot be re-encoded as UTF-8.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (what JSON's `"\\ud800"` decodes to): not valid Unicode."""
    return _SURROGATE_RE.search(text) is not None


def check_sender(sender: Any) -> str:
    """`sender` when it is a valid peer id; else the `header` refusal naming the rule."""
    # The peer-id rule of the config and the transports: a sender the wire accepts can always publish, and a hostile
    # one can neither escape a directory nor forge log lines.
    problem = peer_id_problem(sender)
    if problem is not None:
        raise refusal("header", f"invalid sender: {problem}")
    return sender


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
        if depth > MAX_JSON_DEPTH:
            raise refusal("header", f"{what} is nested deeper than {MAX_JSON_DEPTH} levels", sender)
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise refusal("header", f"{what} has a non-string key {key!r:.40}", sender)
                if has_lone_surrogate(key):
                    raise refusal("header", f"{what} has a key with a lone surrogate", sender)
                stack.append((item, depth + 1))
        elif isinstance(node, str):
            if has_lone_surrogate(node):
                raise refusal("header", f"{what} holds a string with a lone surrogate (not valid Unicode)", sender)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise refusal("header", f"{what} holds a non-finite number {node!r}", sender)
        elif node is not None and not isinstance(node, (str, int, bool)):
            raise refusal("header", f"{what} holds a {type(node).__name__}, which is not JSON", sender)


def _check_prompt(prompt: Any, index: int, sender: str | None) -> None:
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list):
        raise refusal("header", f"groups[{index}].prompt must be a string or a list of messages", sender)
    for j, turn in enumerate(prompt):
        if not isinstance(turn, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in turn.items()
        ):
            raise refusal("header", f"groups[{index}].prompt[{j}] must be a dict of strings (a chat message)", sender)


def _check_printable(value: Any, what: str, max_chars: int, sender: str | None) -> str:
    if not isinstance(value, str) or len(value) > max_chars or not value.isprintable():
        raise refusal("header", f"{what} must be a printable string of at most {max_chars} characters", sender)
    return value


@dataclass
class Header:
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
    final: bool = False
    """The sender's last message: it is leaving the swarm."""
    swarm: str = ""
    """The swarm the message is bound to; empty: none."""
    run: str = ""
    """The run of that swarm the message is bound to; empty: none."""
    epoch: int = 0
    """The sender's start it was sent in (grows with every start of the sender); 0: not sent."""
    sampling: dict = field(default_factory=dict)
    """How the sender sampled and what its log-probs are ([`check_sampling`]); empty: not sent."""


def check_header(header: Any, compact: bool, limits: Limits) -> Header:
    """Types, shapes and limits of the JSON header (arrays are checked separately)."""
    if not isinstance(header, dict):
        raise refusal("header", f"the header must be a JSON object, got {type(header).__name__}")
    sender = check_sender(header.get("sender"))  # first, so every later error can name the sender
    keys = set(header)
    if not set(HEADER_KEYS) <= keys <= set(HEADER_KEYS) | set(OPTIONAL_HEADER_KEYS):
        missing = sorted(set(HEADER_KEYS) - keys)
        unknown = sorted(keys - set(HEADER_KEYS) - set(OPTIONAL_HEADER_KEYS))
        raise refusal("header", f"header keys differ: missing {missing}, unknown {unknown[:8]}", sender)
    _check_json_tree(header, "the header", sender)

    round_ = header["round"]
    if not is_int(round_) or not 0 <= round_ <= MAX_ROUND:
        raise refusal("header", f"round must be a non-negative integer, got {round_!r:.40}", sender)
    created = _finite_float(header["created"])
    if created is None or not 0 <= created <= MAX_CREATED:
        problem = f"created must be unix seconds in [0, {MAX_CREATED:.0f}], got {header['created']!r:.40}"
        raise refusal("header", problem, sender)
    fingerprint = header["tokenizer_fingerprint"]
    if not isinstance(fingerprint, str) or not _FINGERPRINT_RE.fullmatch(fingerprint):
        raise refusal("header", "tokenizer_fingerprint must be 64 lowercase hex digits (a SHA-256)", sender)
    name = _check_printable(header["tokenizer_name"], "tokenizer_name", MAX_NAME_CHARS, sender)
    model = _check_printable(header.get("model", ""), "model", MAX_NAME_CHARS, sender)
    temperature = _finite_float(header["temperature"])
    if temperature is None or not limits.min_temperature <= temperature <= limits.max_temperature:
        low, high = limits.min_temperature, limits.max_temperature
        problem = f"temperature must be a number in [{low}, {high}], got {header['temperature']!r:.40}"
        raise refusal("header", problem, sender)

    reward_names = header["reward_names"]
    if not isinstance(reward_names, list):
        raise refusal("header", "reward_names must be a list of strings", sender)
    if len(reward_names) > limits.max_reward_functions:
        problem = f"{len(reward_names)} reward functions, more than {limits.max_reward_functions}"
        raise refusal("limits", problem, sender)
    for j, reward_name in enumerate(reward_names):
        _check_printable(reward_name, f"reward_names[{j}]", MAX_REWARD_NAME_CHARS, sender)

    groups = header["groups"]
    if not isinstance(groups, list):
        raise refusal("header", "groups must be a list", sender)
    if len(groups) > limits.max_groups:
        raise refusal("limits", f"{len(groups)} groups, more than {limits.max_groups}", sender)
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or set(group) != {"prompt", "extra"}:
            raise refusal("header", f"groups[{i}] must be an object with exactly 'prompt' and 'extra'", sender)
        _check_prompt(group["prompt"], i, sender)
        if not isinstance(group["extra"], dict):
            raise refusal("header", f"groups[{i}].extra must be an object", sender)

    counts = header["counts"]
    if not isinstance(counts, dict) or set(counts) != {"completions", "tokens"}:
        raise refusal("header", "counts must be an object with exactly 'completions' and 'tokens'", sender)
    n, t = counts["completions"], counts["tokens"]
    if not is_int(n) or not is_int(t) or n < 0 or t < 0:
        raise refusal("header", f"counts must be non-negative integers, got {counts!r:.80}", sender)
    if n > limits.max_completions:
        raise refusal("limits", f"{n} completions, more than {limits.max_completions}", sender)
    if t > limits.max_total_tokens:
        raise refusal("limits", f"{t} tokens, more than {limits.max_total_tokens}", sender)
    text_bytes = header.get("text_bytes")
    if "text_bytes" in header:
        if not is_int(text_bytes) or text_bytes < 0:
            raise refusal("header", f"text_bytes must be a non-negative integer, got {text_bytes!r:.40}", sender)
        if text_bytes > limits.max_text_bytes:
            raise refusal("limits", f"{text_bytes} bytes of text, more than {limits.max_text_bytes}", sender)
        if text_bytes > n * limits.max_completion_text_bytes:  # some completion would exceed its own limit
            problem = f"{text_bytes} bytes of text for {n} completions of at most {limits.max_completion_text_bytes}"
            raise refusal("limits", problem, sender)

    swarm, run = (_check_binding(header, key, sender) if key in header else "" for key in ("swarm", "run"))
    epoch = header.get("epoch", 0)
    if "epoch" in header and not (is_int(epoch) and 1 <= epoch <= MAX_EPOCH):  # present only when set
        raise refusal("header", f"epoch must be an integer in [1, 2**63 - 1] when present, got {epoch!r:.40}", sender)
    if "final" in header and header["final"] is not True:  # present only to say "leaving"
        raise refusal("header", f"final must be true when present, got {header['final']!r:.40}", sender)

    sampling = check_sampling(header["sampling"], sender) if "sampling" in header else {}

    dtypes = header["dtypes"]
    if not isinstance(dtypes, dict) or set(dtypes) != {"ids", "logps"}:
        raise refusal("header", "dtypes must be an object with exactly 'ids' and 'logps'", sender)
    allowed = (("<u2", "<i4"), ("<f2",)) if compact else (("<i4",), ("<f4",))
    # Membership in tuples: an unhashable value (a list) cannot raise TypeError here.
    if dtypes["ids"] not in allowed[0] or dtypes["logps"] not in allowed[1]:
        mode = "compact" if compact else "exact"
        raise refusal("header", f"dtypes {dtypes!r:.80} are not valid in {mode} mode", sender)

    return Header(
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
        final="final" in header,
        swarm=swarm,
        run=run,
        epoch=int(epoch),
        sampling=sampling,
    )


def check_sampling(sampling: Any, sender: str = "") -> dict:
    """A header's `sampling`: an object with exactly `logps` (one of `SAMPLING_LOGPS`), `top_k` (an integer in [0,
    2**31)), `top_p` (a number in (0, 1]) and `min_p` (a number in [0, 1])."""
    if not isinstance(sampling, dict) or set(sampling) != {"logps", "top_k", "top_p", "min_p"}:
        raise refusal("header", "sampling must be an object with exactly logps, top_k, top_p and min_p", sender)
    logps, top_k = sampling["logps"], sampling["top_k"]
    top_p, min_p = _finite_float(sampling["top_p"]), _finite_float(sampling["min_p"])
    if logps not in SAMPLING_LOGPS or not is_int(top_k) or not 0 <= top_k < 2**31:
        raise refusal("header", f"sampling must name logps in {SAMPLING_LOGPS} and an integer top_k >= 0", sender)
    if top_p is None or not 0 < top_p <= 1 or min_p is None or not 0 <= min_p <= 1:
        raise refusal("header", "sampling.top_p must be in (0, 1] and sampling.min_p in [0, 1]", sender)
    return {"logps": logps, "top_k": int(top_k), "top_p": top_p, "min_p": min_p}


def _check_binding(header: dict, key: str, sender: str) -> str:
    """The `swarm` or `run` a header binds its message to: present only when non-empty, printable, bounded."""
    value = _check_printable(header[key], key, MAX_BINDING_CHARS, sender)
    if not value:
        raise refusal("header", f"{key} must not be empty when present", sender)
    return value


def header_body_size(header: Header) -> int:
    """Exact size of the uncompressed body the header declares (Python ints: no overflow)."""
    return body_size(
        completions=header.num_completions,
        tokens=header.num_tokens,
        reward_functions=len(header.reward_names),
        id_size=ID_DTYPES[header.ids_dtype].itemsize,
        logp_size=LOGP_DTYPES[header.logps_dtype].itemsize,
        text_bytes=header.text_bytes,
    )


@dataclass
class Columns:
    """The body's arrays, in native dtypes as the receiver sees them."""

    group: np.ndarray  # uint32 (N,)
    length: np.ndarray  # uint32 (N,)
    reward: np.ndarray  # float32 (N,)
    rewards_per_func: np.ndarray  # float32 (N, K)
    ids: np.ndarray  # int32 (T,)
    logps: np.ndarray  # float32 (T,)


def check_columns(columns: Columns, header: Header, *, vocab_limit: int | None, limits: Limits) -> np.ndarray:
    """Checks every array against the header and the limits; returns the completions' start offsets."""
    sender = header.sender
    if columns.group.size and int(columns.group.max()) >= len(header.groups):
        bad = int(np.argmax(columns.group >= len(header.groups)))
        raise refusal(
            "shape",
            f"completion {bad} points at group {int(columns.group[bad])}, but there are {len(header.groups)}",
            sender,
        )
    if columns.length.size:
        if int(columns.length.min()) < 1:
            raise refusal("shape", f"completion {int(np.argmin(columns.length))} is empty", sender)
        if int(columns.length.max()) > limits.max_completion_tokens:
            bad = int(np.argmax(columns.length))
            raise refusal(
                "limits",
                f"completion {bad} has {int(columns.length[bad])} tokens, more than {limits.max_completion_tokens}",
                sender,
            )
    total = int(columns.length.sum(dtype=np.int64))
    if total != columns.ids.size or total != columns.logps.size:
        problem = f"completion lengths sum to {total}, but {columns.ids.size} token ids were sent"
        raise refusal("shape", problem, sender)
    if columns.ids.size:
        low, high = int(columns.ids.min()), int(columns.ids.max())
        if low < 0:
            raise refusal("ids", f"negative token id {low}", sender)
        if vocab_limit is not None and high >= vocab_limit:
            raise refusal("ids", f"token id {high} is outside this peer's vocabulary of {vocab_limit}", sender)
    finite = np.isfinite(columns.logps)
    if not finite.all():
        bad = columns.logps[~finite][0]
        raise refusal("logps", f"non-finite generator log-prob {float(bad)!r}", sender)
    if columns.logps.size and float(columns.logps.max()) > MAX_LOGP:
        raise refusal("logps", f"positive generator log-prob {float(columns.logps.max())!r}", sender)
    if columns.logps.size and float(columns.logps.min()) < limits.min_logp:  # compared as float64: exact
        raise refusal("logps", f"generator log-prob {float(columns.logps.min())!r} < {limits.min_logp}", sender)
    if not np.isfinite(columns.reward).all():
        bad = int(np.argmin(np.isfinite(columns.reward)))
        raise refusal("rewards", f"completion {bad} has a non-finite reward {float(columns.reward[bad])!r}", sender)
    bound = limits.max_abs_reward
    if columns.reward.size and float(np.abs(columns.reward).max()) > bound:
        bad = int(np.argmax(np.abs(columns.reward)))
        raise refusal("rewards", f"completion {bad} has reward {float(columns.reward[bad])!r}, |r| > {bound}", sender)
    # NaN is allowed (a reward function returned None); fmax skips it. +-inf is above any bound.
    largest = float(np.fmax.reduce(np.abs(columns.rewards_per_func).ravel(), initial=-np.inf))
    if largest > bound:
        raise refusal("rewards", f"a per-function reward of magnitude {largest!r}, more than {bound}", sender)
    starts = np.zeros(columns.length.size, dtype=np.int64)
    np.cumsum(columns.length[:-1], dtype=np.int64, out=starts[1:])
    return starts
