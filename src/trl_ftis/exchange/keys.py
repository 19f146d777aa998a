"""Per-peer Ed25519 keys: a message proves *who* wrote it, not only that a swarm member did.

The swarm secret (HMAC) proves membership: every member holds it, so any member can sign as any other. With keys,
each peer signs its messages with its own private key ([`encode_message`]`(..., private_key=...)`), and receivers
hold one file mapping peer ids to public keys ([`load_public_keys`]); [`decode_message`]`(..., public_keys=...)`
then accepts a message only when it is signed by the key registered for the sender it names. Both can be required
at once (membership and identity).

Files:

* a private key: PEM (PKCS #8, unencrypted), written with mode 0600 by [`save_private_key`], read by
  [`load_private_key`] (also what `openssl genpkey -algorithm ed25519` writes);
* the public keys: a JSON or YAML mapping of peer id to the base64 of the raw 32-byte public key (what
  [`public_key_text`] prints), e.g. `{"peer-a": "kQ2l...=", "peer-b": "..."}`, written with mode 0644 by
  [`save_public_keys`] and [`write_public_file`] whatever the umask.

Whoever can write a key file, or replace it in its folder, can sign as that peer (a private key) or register keys
of their own (the public keys): loading logs a warning for a file or a folder that its group or others can write
([`key_file_problems`]). It is a warning, not a refusal: shared folders are common on clusters, and the file may be
read-only in practice; fix the permissions it names.

The `cryptography` package is imported on first use (the optional extra `trl-ftis[keys]`): importing this module,
and the wire format without keys, need only the standard library.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..peer_ids import check_peer_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "PUBLIC_KEY_SIZE",
    "ED25519_SIGNATURE_SIZE",
    "KeyFileError",
    "check_key_pair",
    "check_private_key",
    "generate_keypair",
    "key_file_problems",
    "load_private_key",
    "load_public_keys",
    "public_key_from_text",
    "public_key_of",
    "public_key_text",
    "save_private_key",
    "save_public_keys",
    "write_public_file",
]

logger = logging.getLogger(__name__)

PUBLIC_KEY_SIZE = 32
"""Bytes of a raw Ed25519 public key."""
ED25519_SIGNATURE_SIZE = 64
"""Bytes of an Ed25519 signature."""
_MAX_KEY_FILE_BYTES = 16 * 2**20  # a public-key file of 100 000 peers is about 6 MiB


class KeyFileError(ValueError):
    """A key file is missing, unreadable or malformed; the message names the file and the entry."""


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as error:  # pragma: no cover - the extra is installed in the test environment
        raise ImportError(
            "Per-peer keys need the `cryptography` package: pip install 'trl-ftis[keys]' (or `cryptography`)."
        ) from error
    return ed25519


def generate_keypair() -> tuple[Ed25519PrivateKey, Ed25519PublicKey]:
    """A fresh Ed25519 key pair `(private_key, public_key)`."""
    private_key = _ed25519().Ed25519PrivateKey.generate()
    return private_key, private_key.public_key()


def public_key_of(key: Any, what: str = "key") -> Ed25519PublicKey:
    """The public key of `key`: itself when it is an Ed25519 public key, its public half when it is a private key;
    `TypeError` naming `what` for anything else."""
    ed25519 = _ed25519()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.public_key()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    raise TypeError(f"{what} must be an Ed25519 private or public key, got {type(key).__name__}")


def check_private_key(key: Any, what: str = "private_key") -> Ed25519PrivateKey:
    """`key` if it is an Ed25519 private key, else `TypeError` naming `what`."""
    if not isinstance(key, _ed25519().Ed25519PrivateKey):
        raise TypeError(f"{what} must be an Ed25519 private key, got {type(key).__name__}")
    return key


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The base64 of the raw 32-byte public key (of a public key, or of a private key's public half): the form
    [`load_public_keys`] reads, 44 characters."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key_of(key).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def public_key_from_text(text: str, what: str = "public key") -> Ed25519PublicKey:
    """The public key from its [`public_key_text`] form; `ValueError` naming `what` when it is not one."""
    if not isinstance(text, str):
        raise TypeError(f"{what}: expected a base64 string, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what}: {text[:60]!r} is not valid base64") from None
    if len(raw) != PUBLIC_KEY_SIZE:
        raise ValueError(f"{what}: decodes to {len(raw)} bytes, but an Ed25519 public key has {PUBLIC_KEY_SIZE}")
    try:
        return _ed25519().Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as error:
        raise ValueError(f"{what}: not a valid Ed25519 public key ({error})") from None


def check_key_pair(
    private_key: Ed25519PrivateKey | None, public_keys: Mapping[str, Any] | None, peer_id: str, *, where: str = ""
) -> None:
    """`ValueError` when `public_keys` registers another key for `peer_id` than `private_key`'s public half: peers
    would refuse every message of this peer (`signature`). `where` names the files in the message."""
    if private_key is None or public_keys is None:
        return
    mine = public_keys.get(peer_id)
    if mine is not None and public_key_text(mine) != public_key_text(private_key):
        raise ValueError(
            f"The public keys{' ' + where if where else ''} register another key for this peer ({peer_id!r}) than "
            "its private key: peers would refuse its messages (signature). Use the pair `trl-ftis keygen` wrote."
        )


def save_private_key(path: str | os.PathLike, key: Ed25519PrivateKey, *, overwrite: bool = False) -> Path:
    """Write `key` as unencrypted PEM (PKCS #8) to `path`, readable by its owner only (mode 0600).

    Refuses to replace an existing file (`FileExistsError`) unless `overwrite`; a replacement is atomic (a
    temporary file, then a rename), so a crash never leaves a half-written key. Returns the path.
    """
    from cryptography.hazmat.primitives import serialization

    check_private_key(key, "key")
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = Path(path)
    if not overwrite:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never through an existing file
        target = None
    else:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
        target = temporary
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        if target is not None:
            os.replace(target, path)
    except BaseException:
        Path(target if target is not None else path).unlink(missing_ok=True)
        raise
    return path


def key_file_problems(path: str | os.PathLike) -> list[str]:
    """Why others than its owner could change the key file `path`: the file, or the folder holding it (where anyone
    who can write may replace it), writable by its group or by others; a file owned by another user. One sentence
    each, naming the path and the mode; empty when none (or when `path` cannot be looked at: reading it will say)."""
    path = Path(path)
    problems = []
    try:
        info = os.stat(path)
        folder = path.parent
        folder_mode = os.stat(folder).st_mode
    except OSError:
        return []
    if info.st_mode & 0o022:
        problems.append(
            f"{str(path)!r} is writable by its group or others (mode {info.st_mode & 0o777:o}): chmod go-w it"
        )
    if hasattr(os, "geteuid") and info.st_uid not in (os.geteuid(), 0):
        problems.append(f"{str(path)!r} belongs to another user (uid {info.st_uid})")
    if folder_mode & 0o022:
        problems.append(
            f"its folder {str(folder)!r} is writable by its group or others (mode {folder_mode & 0o777:o}): they can "
            "replace the file; keep key files in a folder only you can write"
        )
    return problems


def _warn_if_exposed(path: str | os.PathLike, what: str) -> None:
    for problem in key_file_problems(path):
        logger.warning("%s: %s.", what, problem)


def write_public_file(path: str | os.PathLike, text: str, *, exclusive: bool = False) -> Path:
    """Write `text` to the public-key file `path`, mode 0644 whatever the umask (anyone may read public keys; only
    the owner may change them). `exclusive`: never through an existing file or a symbolic link (a staging file in a
    folder others may write)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(text)
    return Path(path)


def _read(path: str | os.PathLike, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise KeyFileError(f"{what} {str(path)!r}: cannot read it ({error.strerror or error})") from error
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{what} {str(path)!r}: larger than {_MAX_KEY_FILE_BYTES} bytes")
    return data


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file `path` (as [`save_private_key`] or `openssl genpkey` write it).

    Raises [`KeyFileError`] naming the file when it cannot be read, is not PEM, is encrypted, or holds another
    kind of key; logs a warning when the file is readable by others than its owner, and when others could change it
    ([`key_file_problems`]).
    """
    from cryptography.hazmat.primitives import serialization

    data = _read(path, "private key file")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:  # not PEM / unsupported / encrypted (TypeError: needs a password)
        raise KeyFileError(f"private key file {str(path)!r}: not an unencrypted PEM private key ({error})") from None
    if not isinstance(key, _ed25519().Ed25519PrivateKey):
        raise KeyFileError(
            f"private key file {str(path)!r}: holds a key of type {type(key).__name__}, not an Ed25519 key"
        )
    try:
        mode = os.stat(path).st_mode
    except OSError:  # pragma: no cover - it was just read
        mode = 0
    if mode & 0o077:
        logger.warning("Private key file %r is readable by others (mode %o); chmod 600 it.", str(path), mode & 0o777)
    _warn_if_exposed(path, "Private key file")
    return key


def _first_duplicate(keys: list) -> Any:
    seen = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return None


class _UniqueKeyLoader:
    """A yaml SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently), built on first use."""

    loader = None

    @classmethod
    def get(cls):
        if cls.loader is None:
            import yaml

            class Loader(yaml.SafeLoader):
                def construct_mapping(self, node, deep=False):
                    mapping = super().construct_mapping(node, deep=deep)
                    if len(mapping) != len(node.value):
                        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
                        duplicate = _first_duplicate(keys)
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {duplicate!r}", node.start_mark
                        )
                    return mapping

            cls.loader = Loader
        return cls.loader


def _parse_mapping(data: bytes, path: str | os.PathLike) -> Any:
    name = str(path)
    if Path(name).suffix.lower() == ".json":

        def unique(pairs: list) -> dict:
            out = dict(pairs)
            if len(out) != len(pairs):
                raise ValueError(f"duplicate key {_first_duplicate([key for key, _ in pairs])!r}")
            return out

        try:
            return json.loads(data.decode("utf-8"), object_pairs_hook=unique)
        except ValueError as error:
            raise KeyFileError(f"public key file {name!r}: not valid JSON ({error})") from None
    import yaml  # YAML (a superset of JSON) for any other suffix

    try:
        return yaml.load(data.decode("utf-8"), Loader=_UniqueKeyLoader.get())  # a SafeLoader
    except (ValueError, yaml.YAMLError) as error:
        raise KeyFileError(f"public key file {name!r}: not valid YAML ({error})") from None


def load_public_keys(path: str | os.PathLike) -> dict[str, Ed25519PublicKey]:
    """The peers' public keys from `path`: a JSON (`.json`) or YAML (any other suffix) mapping of peer id to the
    base64 of the raw 32-byte public key, as [`public_key_text`] prints it.

    Every id must follow the peer-id rule ([`trl_ftis.peer_ids.check_peer_id`]), every key must be base64 of 32 bytes,
    and no key may be registered for two peers (its holder could then write as both). Raises [`KeyFileError`]
    naming the file and the entry. Logs a warning when others than its owner could change the file
    ([`key_file_problems`]): they could register a key of their own for any peer.
    """
    name = str(path)
    mapping = _parse_mapping(_read(path, "public key file"), path)
    _warn_if_exposed(path, "Public key file")
    if not isinstance(mapping, dict):
        raise KeyFileError(
            f"public key file {name!r}: expected a mapping of peer id to base64 Ed25519 public key, "
            f"got {type(mapping).__name__}"
        )
    if not mapping:
        raise KeyFileError(f"public key file {name!r}: holds no keys")
    keys: dict[str, Ed25519PublicKey] = {}
    owners: dict[str, str] = {}
    for peer_id, text in mapping.items():
        try:
            check_peer_id(peer_id, what=f"public key file {name!r}: peer id {str(peer_id)[:80]!r}")
            if not isinstance(text, str):  # a malformed file, not a wrong argument: KeyFileError (a ValueError)
                problem = f"entry {peer_id!r}: expected a base64 string, got {type(text).__name__}"
                raise ValueError(f"public key file {name!r}: {problem}")  # noqa: TRY004
            key = public_key_from_text(text, what=f"public key file {name!r}: entry {peer_id!r}")
        except ValueError as error:
            raise KeyFileError(str(error)) from None
        canonical = public_key_text(key)
        if canonical in owners:
            raise KeyFileError(
                f"public key file {name!r}: entries {owners[canonical]!r} and {peer_id!r} have the same key "
                "(each peer needs its own key pair)"
            )
        owners[canonical] = peer_id
        keys[peer_id] = key
    return keys


def save_public_keys(path: str | os.PathLike, keys: Mapping[str, Any]) -> Path:
    """Write a public-key file (JSON, mode 0644 whatever the umask) that [`load_public_keys`] reads: peer id -> key
    (a public or private key, of which only the public half is written, or its [`public_key_text`])."""
    out = {}
    for peer_id, key in keys.items():
        check_peer_id(peer_id, what=f"public keys: peer id {str(peer_id)[:80]!r}")
        out[peer_id] = public_key_text(public_key_from_text(key) if isinstance(key, str) else public_key_of(key))
    return write_public_file(path, json.dumps(out, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------------------------
# Signing and verifying (used by the wire format)


def sign(private_key: Ed25519PrivateKey, data: bytes | memoryview) -> bytes:
    """The 64-byte Ed25519 signature of `data`."""
    return check_private_key(private_key).sign(data)


def verify(public_key: Ed25519PublicKey, signature: bytes | memoryview, data: bytes | memoryview) -> bool:
    """Whether `signature` is `public_key`'s signature of `data` (reads `data` in place, without copying it)."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(public_key, _ed25519().Ed25519PublicKey):
        raise TypeError(f"public_keys must map peer ids to Ed25519 public keys, got a {type(public_key).__name__}")
    try:
        public_key.verify(bytes(signature), data)
    except InvalidSignature:
        return False
    return True
