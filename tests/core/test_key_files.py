"""Key files keep their modes whatever the umask (private 0600, public 0644), and a key file that others could change
(the file, or the folder it is in, writable by its group or others) is warned about when it is loaded and when
`trl-ftis keygen` writes it; keygen's staging file is never written through a link someone put there."""

from __future__ import annotations

import logging
import os

import pytest

pytest.importorskip("cryptography")

from file_modes import file_mode, umask  # tests/ is on sys.path

from trl_ftis import cli
from trl_ftis.exchange import keys


def test_keygen_under_umask_000_writes_private_0600_and_public_0644(tmp_path, capsys):
    keys_file = tmp_path / "peers.yaml"
    with umask(0):
        assert cli.main(["keygen", "a", "--dir", str(tmp_path / "keys"), "--keys-file", str(keys_file)]) == 0
        assert cli.main(["keygen", "b", "--dir", str(tmp_path / "keys"), "--keys-file", str(keys_file)]) == 0
    assert file_mode(tmp_path / "keys" / "a.key") == 0o600 and file_mode(tmp_path / "keys") == 0o700
    assert file_mode(keys_file) == 0o644
    assert "warning" not in capsys.readouterr().err
    json_file = tmp_path / "peers.json"
    with umask(0):
        keys.save_public_keys(json_file, {"a": keys.generate_keypair()[0]})
    assert file_mode(json_file) == 0o644


def test_keygen_warns_about_a_folder_others_can_write(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert cli.main(["keygen", "a", "--dir", str(shared), "--keys-file", str(shared / "peers.yaml")]) == 0
    err = capsys.readouterr().err
    assert err.count("trl-ftis keygen: warning:") == 2 and "writable by its group or others (mode 777)" in err


def test_keygen_never_writes_its_staging_file_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    keys_file = tmp_path / "peers.yaml"
    (tmp_path / f".peers.yaml.keygen-{os.getpid()}").symlink_to(victim)  # planted by someone who can write here
    assert cli.main(["keygen", "a", "--dir", str(tmp_path / "keys"), "--keys-file", str(keys_file)]) == 2
    assert victim.read_text() == "untouched\n" and not keys_file.exists()
    assert not (tmp_path / "keys" / "a.key").exists()  # nothing was written


def test_loading_key_files_others_can_change_warns(tmp_path, caplog):
    private, _ = keys.generate_keypair()
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    key_path = keys.save_private_key(folder / "a.key", private)
    public_path = keys.save_public_keys(folder / "peers.json", {"a": private})
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        keys.load_private_key(key_path)
        keys.load_public_keys(public_path)
    assert caplog.records == []  # owner-only: no warning
    public_path.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        keys.load_public_keys(public_path)
    assert "Public key file" in caplog.text and "writable by its group or others (mode 666)" in caplog.text
    caplog.clear()
    public_path.chmod(0o644)
    folder.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        keys.load_private_key(key_path)
        keys.load_public_keys(public_path)
    assert caplog.text.count("its folder") == 2 and "can replace the file" in caplog.text
    assert keys.key_file_problems(tmp_path / "missing") == []


def test_a_trainer_loading_a_world_writable_public_key_file_warns_naming_it(tmp_path, caplog):
    """The path a trainer takes (`FTISConfig.swarm_credentials`, before the model is loaded): a 0666 public-key file
    is loaded, with a warning naming the file and its mode."""
    from trl_ftis import FTISConfig

    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    private = keys.generate_keypair()[0]
    keys.save_private_key(folder / "a.key", private)
    public_path = keys.save_public_keys(folder / "peers.yaml", {"a": private.public_key()})
    public_path.chmod(0o666)
    config = FTISConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        report_to=[],
        peer_id="a",
        private_key_file=str(folder / "a.key"),
        peer_keys_file=str(public_path),
    )
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        credentials = config.swarm_credentials()
    assert set(credentials.public_keys) == {"a"}
    assert f"Public key file: '{public_path}' is writable by its group or others (mode 666)" in caplog.text
