"""`FTISConfig`'s own decisions: each field has one meaning, defaults and checks are written once
(`trl_ftis.round_window`, `trl_ftis.sampling_bounds`, ...) and shared with `Swarm`, a field with no effect in the
chosen mode is refused or warned about, a `GRPOConfig` is converted by explicit copying, and building a config reads
neither the environment nor a file.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math

import pytest
from swarm_helpers import make_swarm
from trl import GRPOConfig

from trl_ftis import FTISConfig
from trl_ftis.round_window import (
    DEFAULT_MAX_ROUNDS_AHEAD,
    DEFAULT_MAX_STALENESS,
    DEFAULT_PEER_TIMEOUT,
    check_round_window,
)
from trl_ftis.shared_names import SWARM_SECRET_ENV
from trl_ftis.swarm.client import Swarm


def _config(**fields) -> FTISConfig:
    return FTISConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], **fields)


# ---------------------------------------------------------------------------------------------------------------
# expected_peers and num_expected_peers: alternatives


BOTH = (
    "expected_peers and num_expected_peers are alternatives: set expected_peers to name the peers a round waits "
    "for, or num_expected_peers to wait for that many other peers whatever their ids, not both "
    "(got expected_peers=['a', 'b'] and num_expected_peers=2)."
)


def test_expected_peers_and_num_expected_peers_together_are_refused():
    with pytest.raises(ValueError) as error:
        _config(peer_id="a", expected_peers=["a", "b"], num_expected_peers=2)
    assert str(error.value) == BOTH
    with pytest.raises(ValueError, match="are alternatives"):
        _config(expected_peers=["b"], num_expected_peers=0)  # any count, 0 included: two answers to one question


def test_each_of_them_alone_is_accepted_and_keeps_its_meaning():
    assert _config(expected_peers=["a", "b"]).expected_peers == ["a", "b"]
    assert _config(num_expected_peers=3).num_expected_peers == 3
    assert _config(expected_peers=[], num_expected_peers=3).num_expected_peers == 3  # an empty list names nobody
    with pytest.raises(ValueError, match="num_expected_peers must be a whole number of peers >= 0, got -1"):
        _config(num_expected_peers=-1)


def test_the_swarm_refuses_both_as_the_config_does(tokenizer):
    url = "memory://test-config-both"
    with pytest.raises(ValueError) as error:
        make_swarm(url, "a", tokenizer, expected_peers=["a", "b"], num_expected_peers=2)
    assert str(error.value) == BOTH
    named = make_swarm(url, "a", tokenizer, expected_peers=["a", "b"])
    counted = make_swarm(url, "c", tokenizer, num_expected_peers=2)
    assert (named.expected_peers, named.num_expected_peers) == (["b"], None)  # its own id is ignored
    assert (counted.expected_peers, counted.num_expected_peers) == ([], 2) and counted.waits


# ---------------------------------------------------------------------------------------------------------------
# Quantile-only fields in fixed mode: warned about


@pytest.mark.parametrize("name, value", [("filter_target_fraction", 0.3), ("threshold_momentum", 0.5)])
def test_a_quantile_only_field_set_in_fixed_mode_is_warned_about(caplog, name, value):
    with caplog.at_level(logging.WARNING, logger="trl_ftis.config_checks"):
        config = _config(**{name: value})
    assert getattr(config, name) == value  # kept as given: a warning, not an error
    messages = [record.getMessage() for record in caplog.records if record.name == "trl_ftis.config_checks"]
    default = {f.name: f.default for f in dataclasses.fields(FTISConfig)}[name]
    assert messages == [
        f"{name}={value!r} has no effect with kl_threshold_mode='fixed' (only the quantile threshold uses it); set "
        f"kl_threshold_mode='quantile' to use it, or leave it at its default {default!r}."
    ]


def test_quantile_fields_warn_only_when_they_have_no_effect(caplog):
    with caplog.at_level(logging.WARNING, logger="trl_ftis.config_checks"):
        _config()  # fixed mode, defaults
        _config(kl_threshold_mode="quantile", filter_target_fraction=0.3, threshold_momentum=0.5)
    assert [r for r in caplog.records if r.name == "trl_ftis.config_checks"] == []
    for name in ("filter_target_fraction", "threshold_momentum"):
        help_text = FTISConfig.__dataclass_fields__[name].metadata["help"]
        assert "No effect with 'fixed' (a warning when set to another value there)" in help_text
    with pytest.raises(ValueError, match="filter_target_fraction"):
        _config(filter_target_fraction=1.0)  # the ranges are checked in every mode


# ---------------------------------------------------------------------------------------------------------------
# Defaults and checks written once, in the core's rule modules


def test_the_round_defaults_come_from_the_rules():
    config = _config()
    swarm = inspect.signature(Swarm.__init__).parameters
    for name, default in (
        ("peer_timeout", DEFAULT_PEER_TIMEOUT),
        ("max_staleness", DEFAULT_MAX_STALENESS),
        ("max_rounds_ahead", DEFAULT_MAX_ROUNDS_AHEAD),
    ):
        assert getattr(config, name) == swarm[name].default == default, name


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_staleness": -1}, "max_staleness must be a whole number of rounds >= 0, got -1."),
        ({"max_rounds_ahead": -2}, "max_rounds_ahead must be a whole number of rounds >= 0, got -2."),
        ({"temperature": 0.001}, "temperature must be in [0.01, 100.0]"),
        ({"temperature": math.nan}, "temperature must be in [0.01, 100.0]"),
    ],
)
def test_the_config_and_the_swarm_refuse_with_the_same_rule(tokenizer, fields, message):
    with pytest.raises(ValueError) as from_config:
        _config(**fields)
    with pytest.raises(ValueError) as from_swarm:
        make_swarm("memory://test-config-rules", "a", tokenizer, **fields)
    assert str(from_config.value).startswith(message) and str(from_swarm.value).startswith(message)
    assert str(from_config.value) == str(from_swarm.value)


def test_the_round_window_takes_numpy_integers_and_refuses_fractions():
    import numpy as np

    assert check_round_window(np.int64(3), 0) == (3, 0)
    for bad in (1.5, "2", True, None):
        with pytest.raises(ValueError, match="max_staleness"):
            check_round_window(bad, 4)


# ---------------------------------------------------------------------------------------------------------------
# peer_micro_batch_size: a whole number of rows


@pytest.mark.parametrize("value", [0.5, 2.5, 4.0, True, False, "4", math.nan, math.inf, -1, -1.5], ids=repr)
def test_peer_micro_batch_size_must_be_a_whole_number_of_rows(value):
    """A fraction used to be accepted, then failed the chunked loss mid-training with a `TypeError`; a bool, NaN or
    inf was accepted and silently meant something else (True: chunks of 1 row; NaN, inf: no chunks), and a string
    failed with a `TypeError` at `<`. 4.0 is refused too, as the other whole-number fields (`max_staleness`,
    `max_rounds_ahead`, `num_expected_peers`) refuse it."""
    with pytest.raises(ValueError, match=r"^peer_micro_batch_size must be >= 0 \(0: no chunks\) and a whole number"):
        _config(peer_micro_batch_size=value)


def test_peer_micro_batch_size_takes_whole_numbers_zero_and_none():
    import numpy as np

    assert _config().peer_micro_batch_size is None  # per_device_train_batch_size
    assert _config(peer_micro_batch_size=0).peer_micro_batch_size == 0  # no chunks
    assert _config(peer_micro_batch_size=8).peer_micro_batch_size == 8
    assert _config(peer_micro_batch_size=np.int64(8)).peer_micro_batch_size == 8  # as the round window takes them


# ---------------------------------------------------------------------------------------------------------------
# from_grpo_config: an explicit copy, not a class swap


def test_a_grpo_config_is_copied_into_a_new_ftis_config():
    grpo = GRPOConfig(
        output_dir="unused", use_cpu=True, bf16=False, report_to=[], steps_per_generation=2, loss_type="dapo"
    )
    converted = FTISConfig.from_grpo_config(grpo)
    assert type(converted) is FTISConfig and type(grpo) is GRPOConfig and converted is not grpo
    for name, value in vars(grpo).items():  # every attribute, the derived ones and the non-field state included
        assert getattr(converted, name) is value, name
    assert converted.generation_batch_size == grpo.generation_batch_size  # derived by GRPOConfig.__post_init__
    assert converted.loss_type == "dapo" and converted.disable_dropout is False  # GRPOConfig's values
    inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
    for f in dataclasses.fields(FTISConfig):
        if f.name not in inherited and f.name not in ("peer_id", "run_name"):  # peer_id is completed by the checks
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            assert getattr(converted, f.name) == default, f.name
    assert converted.peer_id == "peer"
    converted.variant = "tis"
    assert not hasattr(grpo, "variant")  # a new object: the caller's config is never touched


# ---------------------------------------------------------------------------------------------------------------
# The secret and the key files are read by swarm_credentials(), not when the config is built


def test_building_a_config_reads_neither_the_environment_nor_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv(SWARM_SECRET_ENV, "from-the-environment")
    absent = _config(private_key_file=str(tmp_path / "absent.key"))  # no such file: building it is fine
    with pytest.raises(ValueError, match="absent.key"):
        absent.swarm_credentials()  # the file is looked for when the credentials are read
    config = _config()
    assert config.swarm_secret is None and absent.swarm_secret is None
    assert config.swarm_credentials().secret == "from-the-environment"  # read when asked
    monkeypatch.setenv(SWARM_SECRET_ENV, "rotated")
    assert config.swarm_credentials().secret == "rotated"
    assert _config(swarm_secret="own").swarm_credentials().secret == "own"  # the field wins over the variable
    monkeypatch.setenv(SWARM_SECRET_ENV, "")
    assert _config().swarm_credentials().secret is None  # empty means none


def test_the_secret_help_says_when_the_environment_is_read():
    help_text = FTISConfig.__dataclass_fields__["swarm_secret"].metadata["help"]
    assert "$FTIS_SWARM_SECRET, read when the trainer starts" in help_text


def test_credentials_describe_how_messages_are_authenticated():
    from trl_ftis.credentials import SwarmCredentials

    assert SwarmCredentials(None, None, None).describe().startswith("none: messages are neither signed nor checked")
    assert SwarmCredentials("s", None, None).describe() == "a shared swarm secret (HMAC)"
    keys = SwarmCredentials("s", object(), {"a": object(), "b": object()}).describe()
    assert keys.startswith("per-peer keys (Ed25519; 2 registered") and keys.endswith(
        "and a shared swarm secret (HMAC)"
    )
    assert "none are required" in SwarmCredentials(None, object(), None).describe()


def test_variant_names_are_normalised_on_the_command_line_as_in_python(tmp_path):
    """docs/api.md promises `F_TIS` -> `f-tis`; argparse `choices` used to refuse it before the config saw it."""
    from transformers import HfArgumentParser

    argv = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false", "--variant", "F_TIS"]
    (args,) = HfArgumentParser(FTISConfig).parse_args_into_dataclasses(argv)
    assert args.variant == "f-tis"
    assert FTISConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, variant="F_Nois").variant == "f-nois"
    with pytest.raises(ValueError, match="Unknown F-TIS variant 'ftis'"):
        HfArgumentParser(FTISConfig).parse_args_into_dataclasses([*argv[:-1], "ftis"])
