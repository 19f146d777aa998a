"""Secrets in text: one placeholder, [`REDACTED`], and the redaction of URL passwords wherever a URL is shown (log
lines, command lines, summaries, error messages). Standard library only."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["REDACTED", "redact_text", "redact_url"]

REDACTED = "<redacted>"
"""What a secret (a swarm secret, a password in a URL, a token) is replaced with wherever it would be shown."""

# scheme://user:PASSWORD@ and scheme://:PASSWORD@ anywhere in free text (log lines, command lines, environment
# values, JSON).
_URL_PASSWORD_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)@")
# A `password=` query value (`?password=PW`, `&password=PW`, any case) anywhere in free text: up to the next `&`, `#`,
# whitespace or quote (shell quoting, JSON), the characters that end it in a URL written out in text.
_QUERY_PASSWORD_RE = re.compile(r"([?&]password=)([^&#\s'\"]+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its password (in the user info or a `password=` query value) replaced by [`REDACTED`].

    A URL without a password comes back unchanged (`dir:///path` stays `dir:///path`)."""
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if has_password:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:{REDACTED}@{hostport}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True) if query else []
    has_query_password = any(key.lower() == "password" for key, _ in pairs)
    if has_query_password:
        query = urlencode([(k, REDACTED if k.lower() == "password" else v) for k, v in pairs], safe="<>")
    if not has_password and not has_query_password:
        return url  # unchanged (urlunsplit would turn dir:///path into dir:/path)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(text: str) -> str:
    """`text` with every URL password in it replaced by [`REDACTED`]: the user info password of each
    `scheme://[user]:password@host` and each `?password=` / `&password=` query value, as [`redact_url`] hides them in
    a single URL. Text without a URL password comes back unchanged."""
    text = _URL_PASSWORD_RE.sub(lambda match: match.group(1) + REDACTED + "@", text)
    return _QUERY_PASSWORD_RE.sub(lambda match: match.group(1) + REDACTED, text)
