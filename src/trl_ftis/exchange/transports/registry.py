"""The transports by URL scheme: what each one is (`TransportKind`) and the one place the rest of trl-ftis asks.

A transport registers itself with `register_transport(TransportKind(...))` in its own module; the built-in ones
(`dir`, `memory`, `redis`, `rediss`) are registered when `trl_ftis.exchange.transports` is imported, and a transport
of one's own is registered the same way, from anywhere, before a URL with its scheme is opened or validated.
`FTISConfig`, the launcher's schema and checks before start, and the swarm client ask this registry what a URL's
transport is (in-process or not, a folder or not, how to reach it, what to hide of its URL): none of them names a
scheme. Standard library only (a transport's own packages are imported when it is opened).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from ...redaction import redact_url

__all__ = [
    "TransportKind",
    "exchange_folder",
    "exchange_scheme",
    "normalise_exchange_url",
    "register_transport",
    "transport_kind",
    "transport_schemes",
    "unregister_transport",
]


@dataclass(frozen=True)
class TransportKind:
    """One URL scheme's transport, as the rest of trl-ftis needs to know it.

    * `scheme`: lower-case, without `://`.
    * `opener`: what `open_transport` calls, `opener(url, max_message_bytes=..., **options)` (a `Transport`
      subclass).
    * `example`: a URL of this scheme for messages (`dir:///shared/ftis`).
    * `in_process`: it only connects trainers inside one process (`memory://`): the launcher, whose peers are
      separate processes, refuses it.
    * `folder`: for a transport whose exchange is a folder (`dir://`), `folder(url)` -> that folder: who may write
      there is the folder's permissions, and the launcher makes it before its peers start. None otherwise.
    * `packages`: `(import name, pip requirement)` of what a peer needs installed to open it.
    * `absolute`: the URL made the same for every process whatever its working directory (`dir://relative` ->
      `dir:///abs/relative`); raises `ValueError` with the reason when the URL names nothing. None: as written.
    * `probe`: `probe(url, timeout)` -> why the exchange cannot be reached from here (one line, password hidden), or
      None when it answers; the launcher asks it before starting peers on an exchange it did not start. None: no
      probe (a folder is made by the peers themselves).
    * `redact`: the URL with its secrets hidden, for every message and log line that shows it.
    """

    scheme: str
    opener: Callable[..., object]
    example: str
    in_process: bool = False
    folder: Callable[[str], str | None] | None = None
    packages: tuple[tuple[str, str], ...] = ()
    absolute: Callable[[str], str] | None = None
    probe: Callable[[str, float], str | None] | None = None
    redact: Callable[[str], str] = redact_url

    @property
    def shares_files(self) -> bool:
        """Whether the exchange is a folder (see `folder`)."""
        return self.folder is not None

    def missing_packages(self) -> list[str]:
        """The pip requirements of `packages` that cannot be imported here."""
        return [pip for name, pip in self.packages if importlib.util.find_spec(name) is None]


_KINDS: dict[str, TransportKind] = {}


def register_transport(kind: TransportKind) -> None:
    """Make `kind.scheme` a scheme of `exchange_url` (a scheme registered again is replaced)."""
    scheme = kind.scheme
    if not scheme or scheme != scheme.lower() or "://" in scheme or not scheme.replace("-", "").isalnum():
        raise ValueError(f"a transport scheme is lower-case letters, digits and '-', without '://', got {scheme!r}")
    _KINDS[scheme] = kind


def unregister_transport(scheme: str) -> None:
    """Forget the transport of `scheme` (a test's own, once the test is done)."""
    _KINDS.pop(scheme, None)


def transport_schemes() -> tuple[str, ...]:
    """The registered schemes, in the order they were registered."""
    return tuple(_KINDS)


def exchange_scheme(url: object) -> str:
    """The lower-cased scheme of an exchange URL (`"DIR:///x"` -> `"dir"`); `ValueError` naming the registered
    schemes (with any password redacted) when `url` is not a string of the form `SCHEME://...` or no transport is
    registered for its scheme."""
    supported = ", ".join(f"{scheme}://" for scheme in _KINDS)
    if not isinstance(url, str):
        raise ValueError(f"exchange_url must be a string such as dir:///shared/swarm, got {type(url).__name__}.")
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"exchange_url must start with one of {supported}, got {redact_url(url)!r}.")
    if scheme.lower() not in _KINDS:
        raise ValueError(f"exchange_url scheme {scheme[:40]!r} is not supported; use one of {supported}.")
    return scheme.lower()


def normalise_exchange_url(url: str) -> str:
    """`url` with its scheme lower-cased (after checking it with [`exchange_scheme`])."""
    scheme = exchange_scheme(url)
    return scheme + url[len(scheme) :]


def transport_kind(url: str) -> TransportKind:
    """The registered transport of `url`'s scheme; `ValueError` as [`exchange_scheme`] raises it."""
    return _KINDS[exchange_scheme(url)]


def exchange_folder(url: str) -> str | None:
    """The folder of an exchange that is one (`TransportKind.folder`), as the URL names it; None for the others."""
    folder = transport_kind(url).folder
    return folder(url) if folder is not None else None
