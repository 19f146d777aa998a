"""The tokenizer fingerprint: peers may exchange token ids only when their tokenizers give ids the same meaning.

Standard library only; [`trl_ftis.exchange.wire`] re-exports [`tokenizer_fingerprint`].
"""

from __future__ import annotations

import hashlib
import json
import numbers
from typing import Any

__all__ = ["tokenizer_fingerprint"]


def _token_text(token: Any) -> str:
    return str(getattr(token, "content", token))  # AddedToken -> its text


def tokenizer_fingerprint(tokenizer) -> str:
    """Hex SHA-256 identifying what token ids mean: peers may exchange ids only when their fingerprints match.

    Covers the full vocabulary (token -> id, sorted), the special tokens with their roles and ids, which added
    tokens are special, and `len(tokenizer)`. It is identical for two loads of the same tokenizer and changes if
    any id, token or special token differs. The chat template is deliberately left out: each peer renders
    prompts with its own template, and that does not change what an id means.

    `tokenizer` is any object with `get_vocab()`, `__len__` and (optionally) `special_tokens_map`,
    `all_special_tokens`, `added_tokens_decoder` and `convert_tokens_to_ids`, e.g. a transformers tokenizer.
    """
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)

    def token_id(token: str) -> Any:
        if convert is None:
            return None
        value = convert(token)
        return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None

    roles = {}
    for role, value in sorted((getattr(tokenizer, "special_tokens_map", None) or {}).items()):
        tokens = [_token_text(v) for v in value] if isinstance(value, (list, tuple)) else [_token_text(value)]
        roles[str(role)] = [[token, token_id(token)] for token in tokens]
    specials = sorted({_token_text(t) for t in (getattr(tokenizer, "all_special_tokens", None) or [])})
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    added_flags = sorted([int(i), _token_text(t), bool(getattr(t, "special", False))] for i, t in added.items())
    vocab = sorted((str(token), int(i)) for token, i in tokenizer.get_vocab().items())
    canonical = {
        "format": "trl-ftis tokenizer fingerprint v1",
        "len": len(tokenizer),
        "vocab": vocab,
        "special_roles": roles,
        "special_tokens": [[token, token_id(token)] for token in specials],
        "added_tokens": added_flags,
    }
    # ensure_ascii: one canonical byte string whatever the tokens (lone surrogates included).
    text = json.dumps(canonical, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
