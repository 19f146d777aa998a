"""Per-peer Ed25519 key files: generation, round trips through files, and clear errors for malformed files."""

import base64
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trl_ftis.exchange import (
    KeyFileError,
    Message,
    WireCompletion,
    WireGroup,
    decode_message,
    encode_message,
    generate_keypair,
    keys,
    load_private_key,
    load_public_keys,
    public_key_text,
    save_private_key,
    save_public_keys,
)


def raw(key) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def test_keys_round_trip_through_files(tmp_path):
    private_key, public_key = generate_keypair()
    path = save_private_key(tmp_path / "peer-a.key", private_key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = load_private_key(path)
    assert raw(loaded.public_key()) == raw(public_key)

    text = public_key_text(private_key)
    assert text == public_key_text(public_key) and len(text) == 44 and base64.b64decode(text) == raw(public_key)
    other_private, other_public = generate_keypair()
    for name in ("keys.json", "keys.yaml"):
        save_public_keys(tmp_path / name, {"peer-a": public_key, "peer-b": other_private})
        if name.endswith(".yaml"):  # the same mapping written as YAML by hand
            (tmp_path / name).write_text(f"peer-a: {text}\n'peer-b': \"{public_key_text(other_public)}\"\n")
        registered = load_public_keys(tmp_path / name)
        assert sorted(registered) == ["peer-a", "peer-b"]
        assert raw(registered["peer-a"]) == raw(public_key) and raw(registered["peer-b"]) == raw(other_public)

    # What the files hold signs and verifies messages.
    message = Message(
        sender="peer-a",
        round=0,
        tokenizer_fingerprint="ab" * 32,
        tokenizer_name="t",
        temperature=1.0,
        reward_names=[],
        groups=[WireGroup(prompt="p")],
        completions=[WireCompletion(0, [1, 2], [-0.5, -1.0], 1.0, [])],
    )
    data = encode_message(message, private_key=load_private_key(path))
    assert decode_message(data, public_keys=load_public_keys(tmp_path / "keys.json")).sender == "peer-a"


def test_save_private_key_never_overwrites_by_accident(tmp_path):
    first, _ = generate_keypair()
    second, _ = generate_keypair()
    path = tmp_path / "peer.key"
    old_umask = os.umask(0)  # the mode does not depend on the umask
    try:
        save_private_key(path, first)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(FileExistsError):
            save_private_key(path, second)
        assert raw(load_private_key(path).public_key()) == raw(first.public_key())
        path.chmod(0o644)
        save_private_key(path, second, overwrite=True)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert raw(load_private_key(path).public_key()) == raw(second.public_key())
    assert [p.name for p in tmp_path.iterdir()] == ["peer.key"]  # no temporary file left behind
    with pytest.raises(TypeError):
        save_private_key(tmp_path / "x.key", second.public_key())


def test_a_private_key_readable_by_others_is_loaded_with_a_warning(tmp_path, caplog):
    key, _ = generate_keypair()
    path = save_private_key(tmp_path / "peer.key", key)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        load_private_key(path)
    assert "readable by others" in caplog.text and str(path) in caplog.text


def test_bad_private_key_files(tmp_path):
    cases = {
        "missing.key": None,
        "garbage.key": b"not a key",
        "public.key": generate_keypair()[1].public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        "ec.key": ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        "encrypted.key": generate_keypair()[0].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"password"),
        ),
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(KeyFileError) as info:
            load_private_key(path)
        assert str(path) in str(info.value), info.value
    with pytest.raises(KeyFileError, match="ec.key': holds a .*PrivateKey, not an Ed25519 key"):
        load_private_key(tmp_path / "ec.key")


GOOD = public_key_text(generate_keypair()[1])


BAD_KEY_FILES = [
    ("keys.json", "[1, 2]", "expected a mapping"),
    ("keys.json", "{}", "holds no keys"),
    ("keys.json", "{not json", "not valid JSON"),
    ("keys.json", json.dumps({"../etc": GOOD}), "peer id '../etc'"),
    ("keys.json", json.dumps({"a b": GOOD}), "peer id 'a b'"),
    ("keys.json", json.dumps({"peer-a": 5}), "entry 'peer-a': expected a base64 string, got int"),
    ("keys.json", json.dumps({"peer-a": "not base64!"}), "entry 'peer-a': 'not base64!' is not valid base64"),
    ("keys.json", json.dumps({"peer-a": base64.b64encode(b"x" * 31).decode()}), "decodes to 31 bytes"),
    ("keys.json", json.dumps({"peer-a": base64.b64encode(b"x" * 64).decode()}), "decodes to 64 bytes"),
    ("keys.json", json.dumps({"peer-a": GOOD, "peer-b": GOOD}), "entries 'peer-a' and 'peer-b' have the same"),
    ("keys.json", '{"peer-a": "GOOD", "peer-a": "GOOD"}'.replace("GOOD", GOOD), "duplicate key 'peer-a'"),
    ("keys.yaml", f"peer-a: {GOOD}\npeer-a: {GOOD}\n", "duplicate key 'peer-a'"),
    ("keys.yaml", "- a\n- b\n", "expected a mapping"),
    ("keys.yaml", "peer-a: [unclosed\n", "not valid YAML"),
    ("keys.yaml", "", "expected a mapping"),
    ("keys.yml", f"7: {GOOD}\n", "a peer id must be a string"),
    ("keys.json", b"\xff\xfe".decode("latin-1"), "not valid JSON"),
]


# The ids name the case, not the random key inside it: every pytest-xdist worker collects the same tests.
@pytest.mark.parametrize("name,content,fragment", BAD_KEY_FILES, ids=[f"{n}:{f}" for n, _, f in BAD_KEY_FILES])
def test_bad_public_key_files_name_the_file_and_the_entry(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_text(content, encoding="latin-1" if "\xff" in content else "utf-8")
    with pytest.raises(KeyFileError) as info:
        load_public_keys(path)
    assert str(path) in str(info.value) and fragment in str(info.value), info.value
    assert isinstance(info.value, ValueError)


def test_a_missing_public_key_file(tmp_path):
    with pytest.raises(KeyFileError, match="cannot read it"):
        load_public_keys(tmp_path / "absent.json")


def test_keys_module_imports_cryptography_only_when_used():
    package_dir = str(Path(keys.__file__).resolve().parents[1])
    code = (
        "import sys, types\n"
        f"package = types.ModuleType('trl_ftis'); package.__path__ = [{package_dir!r}]\n"
        "sys.modules['trl_ftis'] = package\n"
        "import trl_ftis.exchange.wire, trl_ftis.exchange.keys\n"
        "print(sorted(m for m in ('cryptography', 'yaml', 'torch') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
