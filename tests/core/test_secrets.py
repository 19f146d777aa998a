"""Secrets in `FTISConfig` and `FTISTrainer`: copies and pickles keep them (a copy must still train and exchange),
only what is shown or saved hides them: `to_dict` / `to_json_string` / `to_sanitized_dict`, `str` / `repr`, and the
`training_args.bin` the trainer writes into output dirs and checkpoints. Also `redact_text` on free text.

(The launcher's side, dry run / `.cmd` / `summary.json`, is tested in tests/launcher/test_launcher_secrets.py.)
"""

import copy
import json
import pickle
import uuid
from pathlib import Path

import pytest
import torch

from trl_ftis import FTISConfig, FTISTrainer
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.redaction import REDACTED, redact_text, redact_url
from trl_ftis.shared_names import SWARM_SECRET_ENV
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

SECRET = "sw4rm-s3cret-value"
PW = "hunter2-pw"
URLS = [
    f"redis://:{PW}@localhost:6379/0",
    f"redis://localhost:6379/0?password={PW}",
    f"rediss://u:{PW}@localhost:6380/0?ssl_cert_reqs=none&password={PW}",
]


def _config(tmp_path, url, **overrides):
    return FTISConfig(str(tmp_path), use_cpu=True, report_to=[], swarm_secret=SECRET, exchange_url=url, **overrides)


def _shown(config) -> dict[str, str]:
    return {
        "to_dict": json.dumps(config.to_dict()),
        "to_json_string": config.to_json_string(),
        "to_sanitized_dict": json.dumps(config.to_sanitized_dict(), default=str),
        "str": str(config),
        "repr": repr(config),
        "f-string": f"{config}",
    }


# ----------------------------------------------------------------------------------------------------------------
# FTISConfig
# ----------------------------------------------------------------------------------------------------------------

COPIES = {
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle": lambda c: pickle.loads(pickle.dumps(c)),
    "pickle protocol 2": lambda c: pickle.loads(pickle.dumps(c, protocol=2)),
}


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("url", URLS)
def test_copies_and_pickles_keep_the_real_secret_and_password(tmp_path, url, how):
    config = _config(tmp_path, url)
    clone = COPIES[how](config)
    assert clone.swarm_secret == SECRET and clone.exchange_url == url
    assert clone == config
    assert config.swarm_secret == SECRET and config.exchange_url == url  # the original is untouched
    for where, text in _shown(clone).items():  # and the copy still hides them when shown
        assert SECRET not in text and PW not in text, where


@pytest.mark.parametrize("url", URLS)
def test_what_is_shown_never_holds_the_secret_or_the_password(tmp_path, url):
    config = _config(tmp_path, url)
    for where, text in _shown(config).items():
        assert SECRET not in text and PW not in text, where
        assert REDACTED in text, where
    assert config.to_dict()["swarm_secret"] == REDACTED
    assert config.to_dict()["exchange_url"] == redact_url(url)
    assert config.swarm_secret == SECRET and config.exchange_url == url  # showing changes nothing


def test_the_config_never_reads_the_secret_from_the_environment(tmp_path, monkeypatch):
    """The config holds only what it was given (the trainer reads the environment: `swarm_credentials()`)."""
    monkeypatch.setenv(SWARM_SECRET_ENV, SECRET)
    config = FTISConfig(str(tmp_path), use_cpu=True, report_to=[])
    assert config.swarm_secret is None and copy.deepcopy(config).swarm_secret is None
    assert all(SECRET not in text for text in _shown(config).values())
    assert config.swarm_credentials().secret == SECRET  # read when asked, never stored in the config


def test_redacted_copy_is_what_gets_saved(tmp_path):
    config = _config(tmp_path, URLS[2])
    saved = config.redacted_copy()
    assert saved.swarm_secret == REDACTED and saved.exchange_url == redact_url(URLS[2])
    assert saved.peer_id == config.peer_id and saved.output_dir == config.output_dir
    assert config.swarm_secret == SECRET and config.exchange_url == URLS[2]
    blob = pickle.dumps(saved)
    assert SECRET.encode() not in blob and PW.encode() not in blob
    plain = FTISConfig(str(tmp_path), use_cpu=True, report_to=[], exchange_url="dir:///tmp/swarm")
    assert plain.redacted_copy().exchange_url == "dir:///tmp/swarm" and plain.redacted_copy().swarm_secret is None


# ----------------------------------------------------------------------------------------------------------------
# redact_text
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, shown",
    [
        (f"redis://:{PW}@h/0", "redis://:<redacted>@h/0"),
        (f"redis://user:{PW}@h:6379/0", "redis://user:<redacted>@h:6379/0"),
        (f"redis://h/0?password={PW}", "redis://h/0?password=<redacted>"),
        (f"redis://h/0?PASSWORD={PW}&db=1", "redis://h/0?PASSWORD=<redacted>&db=1"),
        (
            f"rediss://u:{PW}@h/0?ssl_cert_reqs=none&password={PW}",
            "rediss://u:<redacted>@h/0?ssl_cert_reqs=none&password=<redacted>",
        ),
        (f"exchange 'redis://h/0?password={PW}' ready", "exchange 'redis://h/0?password=<redacted>' ready"),
        (f'{{"url": "redis://h/0?password={PW}"}}', '{"url": "redis://h/0?password=<redacted>"}'),
        (f"a redis://:{PW}@h/0 and http://x:{PW}@y", "a redis://:<redacted>@h/0 and http://x:<redacted>@y"),
        # Nothing to hide: unchanged.
        ("dir:///tmp/swarm", "dir:///tmp/swarm"),
        ("redis://localhost:6379/0?db=1", "redis://localhost:6379/0?db=1"),
        ("http://host:8080/path", "http://host:8080/path"),
        ("redis://h/0?password=", "redis://h/0?password="),
    ],
)
def test_redact_text_hides_every_url_password_in_free_text(text, shown):
    assert redact_text(text) == shown
    assert redact_text(shown) == shown  # idempotent


@pytest.mark.parametrize("url", URLS)
def test_redact_text_agrees_with_redact_url(url):
    assert PW not in redact_text(url) and PW not in redact_url(url)
    assert redact_text(url).count(REDACTED) == redact_url(url).count(REDACTED)


# ----------------------------------------------------------------------------------------------------------------
# FTISTrainer: training_args.bin
# ----------------------------------------------------------------------------------------------------------------


def _saved_args(path: Path):
    raw = path.read_bytes()
    assert SECRET.encode() not in raw and PW.encode() not in raw
    loaded = torch.load(path, weights_only=False)
    assert isinstance(loaded, FTISConfig)
    assert loaded.swarm_secret == REDACTED and PW not in loaded.exchange_url
    return loaded


@pytest.fixture
def secret_trainer(tokenizer, make_args, monkeypatch):
    """A trainer whose config holds a secret and a Redis URL with a password; its swarm runs in memory (no server)."""
    connect = FTISTrainer._connect_swarm

    def in_memory(self, args, credentials):
        local = copy.copy(args)  # keeps the secret: the swarm signs with it
        local.exchange_url = f"memory://secrets-{uuid.uuid4().hex}"
        return connect(self, local, credentials)

    monkeypatch.setattr(FTISTrainer, "_connect_swarm", in_memory)

    def make(**overrides):
        args = make_args(swarm_secret=SECRET, exchange_url=URLS[2], peer_id="p0", **overrides)
        return FTISTrainer(
            build_tiny_llama(tokenizer), digit_match_reward, args=args,
            train_dataset=addition_dataset(32, seed=1), processing_class=tokenizer,
        )  # fmt: skip

    return make


def test_save_model_writes_training_args_without_secrets(secret_trainer, tmp_path):
    trainer = secret_trainer(max_steps=1)
    assert trainer.swarm is not None  # connected with the real secret
    args = trainer.args
    trainer.save_model(str(tmp_path / "model"))
    loaded = _saved_args(tmp_path / "model" / "training_args.bin")
    assert loaded.peer_id == "p0" and loaded.max_steps == 1
    assert trainer.args is args and trainer.args.swarm_secret == SECRET and trainer.args.exchange_url == URLS[2]


def test_checkpoints_write_training_args_without_secrets(secret_trainer):
    trainer = secret_trainer(max_steps=2, save_strategy="steps", save_steps=1)
    trainer.train()
    checkpoints = sorted(Path(trainer.args.output_dir).glob("checkpoint-*"))
    assert [c.name for c in checkpoints] == ["checkpoint-1", "checkpoint-2"]
    for checkpoint in checkpoints:
        _saved_args(checkpoint / "training_args.bin")
    assert trainer.args.swarm_secret == SECRET and trainer.args.exchange_url == URLS[2]
    assert trainer.state.global_step == 2


def test_a_checkpoint_pushed_to_the_hub_holds_no_secret(secret_trainer, monkeypatch):
    """`hub_strategy="every_save"` (the default): each checkpoint also rewrites output_dir/training_args.bin
    (`Trainer._push_from_checkpoint`) and uploads the folder; the Hub is replaced by a recorder reading it at once."""
    from types import SimpleNamespace

    import transformers.trainer

    uploaded = []

    class FakeHub:
        def create_repo(self, repo_id, **kwargs):
            return SimpleNamespace(repo_id=f"someone/{repo_id}")

        def upload_folder(self, repo_id, folder_path, **kwargs):
            path = Path(folder_path) / "training_args.bin"
            uploaded.append(path.read_bytes() if path.exists() else None)
            return SimpleNamespace(commit_url="fake", is_done=lambda: True, done=lambda: True)

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeHub())
    trainer = secret_trainer(max_steps=1, save_strategy="steps", save_steps=1, push_to_hub=True,
                             hub_model_id="tiny-secret")  # fmt: skip
    trainer.train()
    assert uploaded and all(blob is not None for blob in uploaded)
    for blob in uploaded:
        assert SECRET.encode() not in blob and PW.encode() not in blob
    assert trainer.args.swarm_secret == SECRET and trainer.args.exchange_url == URLS[2]


# ----------------------------------------------------------------------------------------------------------------
# FTISTrainer: the credentials, read once before the model, used by the swarm
# ----------------------------------------------------------------------------------------------------------------


def _trainer(tokenizer, args, model=None):
    return FTISTrainer(
        model if model is not None else build_tiny_llama(tokenizer), digit_match_reward, args=args,
        train_dataset=addition_dataset(16, seed=1), processing_class=tokenizer,
    )  # fmt: skip


def test_the_swarm_signs_with_the_secret_from_the_environment(tokenizer, make_args, monkeypatch):
    monkeypatch.setenv(SWARM_SECRET_ENV, SECRET)
    args = make_args(exchange_url=f"memory://secrets-{uuid.uuid4().hex}", peer_id="p0")
    assert args.swarm_secret is None
    trainer = _trainer(tokenizer, args)
    assert trainer.swarm.secret == SECRET and trainer.args.swarm_secret is None


def test_the_swarm_gets_the_key_objects_read_once(tokenizer, make_args, monkeypatch, tmp_path):
    from trl_ftis.exchange.keys import generate_keypair, public_key_text, save_private_key, save_public_keys

    key = generate_keypair()[0]
    private = save_private_key(tmp_path / "p0.key", key)
    public = save_public_keys(tmp_path / "peers.json", {"p0": key})
    calls = []
    read = FTISConfig.swarm_credentials

    def counted(self):
        calls.append(self.peer_id)
        return read(self)

    monkeypatch.setattr(FTISConfig, "swarm_credentials", counted)
    args = make_args(exchange_url=f"memory://keys-{uuid.uuid4().hex}", peer_id="p0", swarm_secret=SECRET,
                     private_key_file=str(private), peer_keys_file=str(public))  # fmt: skip
    trainer = _trainer(tokenizer, args)
    assert calls == ["p0"]  # once, in __init__
    assert trainer.swarm.secret == SECRET
    assert public_key_text(trainer.swarm.private_key) == public_key_text(key)
    assert {peer: public_key_text(k) for peer, k in trainer.swarm.public_keys.items()} == {"p0": public_key_text(key)}
    assert _trainer(tokenizer, make_args(peer_id="p0")).swarm is None and calls == ["p0"]  # no swarm: not read


def test_a_missing_key_file_fails_before_the_model_is_loaded(tokenizer, make_args, tmp_path):
    args = make_args(exchange_url="memory://never", peer_id="p0", private_key_file=str(tmp_path / "absent.key"))
    with pytest.raises(ValueError, match="private_key_file"):  # not the model's OSError: it is never loaded
        _trainer(tokenizer, args, model=str(tmp_path / "no-such-model"))
