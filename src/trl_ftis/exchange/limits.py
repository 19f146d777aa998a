"""What a receiver accepts from one message: sizes, counts and the ranges of the numbers ([`Limits`]).

The checks ([`trl_ftis.exchange.checks`], [`trl_ftis.exchange.text`], [`trl_ftis.exchange.frame`]) apply every limit
before the memory it guards is allocated (sizes and counts from the preamble and the header, before the body is
touched or inflated), when decoding and when encoding, so what a sender emits decodes. [`Limits.for_receiver`]
derives its byte budgets from the layout ([`trl_ftis.exchange.layout`]). `docs/wire-format.md` lists every field
with its default and the reasoning behind it. Standard library and numpy only.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any

from ..sampling_bounds import MAX_TEMPERATURE, MIN_TEMPERATURE
from .layout import MAX_TRAILER_BYTES, PREAMBLE_SIZE, body_size, is_int

__all__ = ["Limits"]

_DEFAULT_PROMPT_CHARS = 32_768  # for_receiver's prompt budget when the receiver does not know its own
_JSON_BYTES_PER_CHAR = 6  # the longest JSON form of one character: a \u00XX escape
_FIXED_HEADER_BYTES = 64 * 2**10  # sender, round, fingerprint, tokenizer_name and model (4096 chars each), counts
_REWARD_NAME_BYTES = 1600  # one reward name: 256 characters, escaped, quoted
_GROUP_OVERHEAD_BYTES = 1024  # one group's JSON structure: keys, quotes, chat-message keys and roles


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts: sizes and counts (each checked before the memory it guards is allocated) and the
    ranges of the numbers. [`encode_message`] applies the same limits, so what it emits decodes.

    The defaults accept anything a sane peer sends; [`Limits.for_receiver`] derives much tighter sizes from what
    this receiver will actually use. Raises `ValueError` for a negative count or an empty range.
    """

    max_message_bytes: int = 256 * 2**20
    """Bytes on the wire, and the body after decompression."""
    max_header_bytes: int = 64 * 2**20
    """Bytes of the JSON header (parsing takes memory proportional to it: up to ~25x for hostile JSON)."""
    max_completions: int = 65_536
    """Completions (rows) per message."""
    max_groups: int = 65_536
    """Groups (prompts) per message."""
    max_completion_tokens: int = 131_072
    """Tokens in one completion."""
    max_total_tokens: int = 64 * 2**20
    """Completion tokens per message."""
    max_reward_functions: int = 64
    """Reward functions `K`."""
    max_abs_reward: float = 1e6
    """Bound on `|reward|` and on every non-NaN `|rewards_per_func|`: far above any real reward, and far enough
    below float32's 3.4e38 that squares and sums of rewards (advantage normalisation) cannot overflow."""
    min_logp: float = -1e5
    """Lowest generator log-prob: a real fp32 softmax at temperature >= 0.01 over logits within +-100 never goes
    below about -2e4, and a token that was actually sampled is above about -104 (fp32 probabilities underflow)."""
    min_temperature: float = MIN_TEMPERATURE
    """Lowest sampling temperature: below it sampling is greedy in all but name and log-probs explode."""
    max_temperature: float = MAX_TEMPERATURE
    """Highest sampling temperature: above it sampling is uniform in all but name."""
    max_completion_text_bytes: int = 2**20
    """UTF-8 bytes of one completion's text (the optional text section)."""
    max_text_bytes: int = 64 * 2**20
    """UTF-8 bytes of all texts of one message (the header's `text_bytes`)."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not is_int(value) or value < 0):
                raise ValueError(f"Limits.{f.name} must be a non-negative integer, got {value!r}")
            if f.type == "float" and not (isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ValueError(f"Limits.{f.name} must be a finite number, got {value!r}")
        if not self.max_abs_reward > 0 or not self.min_logp < 0:
            raise ValueError(f"Limits needs max_abs_reward > 0 and min_logp < 0, got {self}")
        if not 0 < self.min_temperature <= self.max_temperature:
            raise ValueError(f"Limits needs 0 < min_temperature <= max_temperature, got {self}")

    @classmethod
    def for_receiver(
        cls,
        *,
        max_completion_length: int,
        max_rows: int,
        max_groups: int | None = None,
        max_prompt_chars: int | None = None,
        max_extra_bytes: int = 16_384,
        max_reward_functions: int = 64,
        max_text_bytes_per_token: int = 16,
        **overrides: Any,
    ) -> Limits:
        """Limits as tight as what this receiver will use of one message, so nothing larger is parsed or inflated.

        Args:
            max_completion_length: tokens per completion (the receiver's own `max_completion_length`).
            max_rows: completions per message this receiver will take from one peer. A message declaring more is
                refused from its header (reason `"limits"`): every peer's own rows per round must fit, so the peers
                of a swarm must be configured consistently.
            max_groups: prompts per message; default `max_rows`. Peers sampling groups of G completions send
                `rows / G` prompts: passing that bound shrinks the header budget, which prompts dominate.
            max_prompt_chars: characters of the longest prompt (all its chat messages' text); default 32 768.
            max_extra_bytes: JSON bytes of one prompt's other dataset columns (`WireGroup.extra`).
            max_reward_functions: the largest `K` a peer may send.
            max_text_bytes_per_token: UTF-8 bytes of a completion's text (the optional text section) per token of
                `max_completion_length`: 16 = a BPE token averages about 4 characters, a character takes at most 4
                bytes in UTF-8.
            overrides: any other [`Limits`] field (`max_abs_reward`, `min_logp`, ...), or a derived one to replace.

        Derived: `max_completions = max_rows`, `max_groups`, `max_completion_tokens = max_completion_length`,
        `max_total_tokens = T = max_rows * max_completion_length`, `max_reward_functions = K`,
        `max_completion_text_bytes = max_text_bytes_per_token * max_completion_length`, `max_text_bytes = X =
        max_rows * max_completion_text_bytes`, the header budget
        `64 KiB + 1600 K + max_groups * (6 * max_prompt_chars + max_extra_bytes + 1024)` (6 bytes: the longest JSON
        form of a character), and `max_message_bytes` = the 20-byte preamble + the header budget + the largest body
        those counts allow, `max_rows * (12 + 4K) + 8 T + 5 max_rows + X`, + 0.1% + 64 bytes (zlib's worst-case
        expansion is smaller) + 161 bytes of signature trailers. Every byte limit is capped at its default (pass it
        in `overrides` to go beyond). The body is inflated only up to the exact size the header's counts imply, so
        decompression is bounded by `max_rows * (17 + 4K) + 8 T + X` whatever the header budget.
        """
        groups = max_rows if max_groups is None else max_groups
        prompt_chars = _DEFAULT_PROMPT_CHARS if max_prompt_chars is None else max_prompt_chars
        for name, value, low in (
            ("max_completion_length", max_completion_length, 1),
            ("max_rows", max_rows, 1),
            ("max_groups", groups, 1),
            ("max_prompt_chars", prompt_chars, 0),
            ("max_extra_bytes", max_extra_bytes, 0),
            ("max_reward_functions", max_reward_functions, 0),
            ("max_text_bytes_per_token", max_text_bytes_per_token, 0),
        ):
            if not is_int(value) or value < low:
                raise ValueError(f"Limits.for_receiver: {name} must be an integer >= {low}, got {value!r}")
        k = max_reward_functions
        group_bytes = _JSON_BYTES_PER_CHAR * prompt_chars + max_extra_bytes + _GROUP_OVERHEAD_BYTES
        header = _FIXED_HEADER_BYTES + _REWARD_NAME_BYTES * k + groups * group_bytes
        tokens = max_rows * max_completion_length
        defaults = cls()  # in bytes, never looser than the defaults
        completion_text = min(max_text_bytes_per_token * max_completion_length, defaults.max_completion_text_bytes)
        text = min(max_rows * completion_text, defaults.max_text_bytes)
        # Exact mode (the larger one), every completion with a text.
        body = body_size(
            completions=max_rows, tokens=tokens, reward_functions=k, id_size=4, logp_size=4, text_bytes=text
        )
        header = min(header, defaults.max_header_bytes)
        message = PREAMBLE_SIZE + header + body + body // 1000 + 64 + MAX_TRAILER_BYTES
        derived = {
            "max_message_bytes": min(message, defaults.max_message_bytes),
            "max_header_bytes": header,
            "max_completions": max_rows,
            "max_groups": groups,
            "max_completion_tokens": max_completion_length,
            "max_total_tokens": tokens,
            "max_reward_functions": k,
            "max_completion_text_bytes": completion_text,
            "max_text_bytes": text,
        }
        derived.update(overrides)
        return cls(**derived)
