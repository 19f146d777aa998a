"""The optional text section of a body: each completion's text (strict UTF-8) and its flags, for peers whose
tokenizers differ (`FTISConfig.cross_tokenizer`); `docs/wire-format.md`, "The text section".

[`encode_texts`] builds the section from a [`Message`] with the checks a receiver runs; [`check_text_columns`] checks
the received lengths and flags against the header and the [`Limits`] before a byte of text is read, and
[`decode_texts`] decodes each text on its own. Every failure is an [`ExchangeError`]. Standard library and numpy only.
"""

from __future__ import annotations

import numpy as np

from .checks import Header
from .errors import refusal
from .layout import NO_TEXT, TEXT_FLAG_EOS, TEXT_FLAGS_UNKNOWN
from .limits import Limits
from .message import Message

__all__ = ["check_text_columns", "decode_texts", "encode_texts"]


def encode_texts(message: Message, limits: Limits, sender: str) -> tuple[np.ndarray, np.ndarray, bytes] | None:
    """The text section (lengths, flags, concatenated UTF-8 bytes), validated as a receiver will check it; None when
    no completion has a text (the message then has no section, and `ends_with_eos` is not sent)."""
    completions = message.completions
    if all(c.text is None for c in completions):
        return None
    lengths = np.full(len(completions), NO_TEXT, dtype=np.int64)
    flags = np.zeros(len(completions), dtype=np.uint8)
    encoded = []
    for i, c in enumerate(completions):
        if c.text is None:
            continue  # flags 0: ends_with_eos travels only with a text
        if not isinstance(c.text, str):
            problem = f"completions[{i}].text must be a string or None, not {type(c.text).__name__}"
            raise refusal("text", problem, sender)
        try:
            data = c.text.encode("utf-8")
        except UnicodeEncodeError:
            problem = f"completions[{i}].text holds a lone surrogate (not valid Unicode)"
            raise refusal("text", problem, sender) from None
        limit = limits.max_completion_text_bytes
        if len(data) > limit or len(data) >= NO_TEXT:
            raise refusal("limits", f"completions[{i}].text has {len(data)} UTF-8 bytes, more than {limit}", sender)
        if not isinstance(c.ends_with_eos, (bool, np.bool_)):
            problem = f"completions[{i}].ends_with_eos must be a bool, got {c.ends_with_eos!r:.40}"
            raise refusal("text", problem, sender)
        lengths[i] = len(data)
        flags[i] = TEXT_FLAG_EOS if c.ends_with_eos else 0
        encoded.append(data)
    return lengths, flags, b"".join(encoded)


def check_text_columns(lengths: np.ndarray, flags: np.ndarray, header: Header, limits: Limits) -> np.ndarray:
    """Checks the text section's lengths (`NO_TEXT`: no text) and flags against the header and the limits, before
    any text byte is read; returns a boolean mask of the completions that have a text."""
    sender = header.sender
    has_text = lengths != NO_TEXT
    sizes = lengths[has_text]
    if sizes.size and int(sizes.max()) > limits.max_completion_text_bytes:
        bad = int(np.flatnonzero(has_text)[int(np.argmax(sizes))])
        limit = limits.max_completion_text_bytes
        raise refusal("limits", f"completion {bad} has {int(lengths[bad])} bytes of text, more than {limit}", sender)
    total = int(sizes.sum(dtype=np.int64))
    if total != header.text_bytes:
        raise refusal("shape", f"the texts' lengths sum to {total}, the header declares {header.text_bytes}", sender)
    unknown = (flags & TEXT_FLAGS_UNKNOWN) != 0
    if unknown.any():
        bad = int(np.argmax(unknown))
        raise refusal("text", f"completion {bad} has unknown text flag bits {int(flags[bad]):#04x}", sender)
    if (flags[~has_text] != 0).any():
        bad = int(np.argmax(~has_text & (flags != 0)))
        raise refusal("text", f"completion {bad} has text flags {int(flags[bad]):#04x} but no text", sender)
    return has_text


def decode_texts(data: bytes | memoryview, lengths: np.ndarray, has_text: np.ndarray, sender: str) -> list:
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
            raise refusal("text", problem, sender) from None
        offset += size
    return texts
