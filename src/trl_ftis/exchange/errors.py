"""How the wire format fails: one exception type, [`ExchangeError`], with a short machine code from [`REASONS`].

Every check of the format ([`trl_ftis.exchange.checks`], [`trl_ftis.exchange.text`], [`trl_ftis.exchange.frame`],
[`trl_ftis.exchange.wire`]) raises it through [`refusal`], so a receiver skips and counts a bad peer with one `except`
clause. Standard library only.
"""

from __future__ import annotations

__all__ = ["REASONS", "ExchangeError", "refusal"]

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
        "swarm",  # the receiver is bound to a swarm, and the message names another one (or none)
        "run",  # the receiver is bound to a run of its swarm, and the message names another one (or none): a replay
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


def refusal(reason: str, problem: str, sender: str | None = None) -> ExchangeError:
    """The [`ExchangeError`] for `problem`, prefixed with the sender when it is known (`raise refusal(...)`)."""
    prefix = f"message from peer {sender!r}: " if sender else "message: "
    return ExchangeError(reason, prefix + problem)
