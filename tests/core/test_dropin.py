"""A drop-in changes nothing unasked: `FTISConfig` keeps every `GRPOConfig` default as TRL sets it, and
`FTISTrainer` with those defaults and no peers trains bit for bit what stock `GRPOTrainer` trains. The paper's
settings of TRL's options are one named preset (`preset="paper"`), which sets only options still at TRL's default
and logs once what it set."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from trl_ftis import FTISConfig, FTISTrainer, presets
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward

BASIC = {"use_cpu": True, "report_to": []}


@pytest.fixture(autouse=True)
def fresh_start_up_lines(monkeypatch):
    """Each test sees the once-per-process lines as a fresh process would."""
    monkeypatch.setattr(presets, "START_UP_LINES_LOGGED", set())


def test_every_inherited_field_default_is_trls_or_resolves_to_it():
    """The options a preset may set default to `None` ("not given") and resolve to TRL's default without one."""
    trl_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name: f for f in dataclasses.fields(FTISConfig)}
    preset_options = set(presets.PRESETS["paper"])
    for name, theirs in trl_fields.items():
        expected = None if name in preset_options else theirs.default
        assert ours[name].default == expected, name
        assert ours[name].default_factory == theirs.default_factory, name
    resolved = FTISConfig(output_dir="unused", **BASIC)
    assert {name: getattr(resolved, name) for name in preset_options} == {
        name: trl_fields[name].default for name in preset_options
    }


def test_a_default_ftisconfig_holds_every_value_a_default_grpoconfig_holds(tmp_path):
    theirs = GRPOConfig(output_dir=str(tmp_path), **BASIC).to_dict()
    ours = FTISConfig(output_dir=str(tmp_path), **BASIC).to_dict()
    assert {key: ours[key] for key in theirs} == theirs
    assert (ours["loss_type"], ours["disable_dropout"], ours["cast_lm_head_to_fp32"]) == ("dapo", False, False)
    assert ours["preset"] is None


def test_the_paper_preset_sets_its_options_and_says_so_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_ftis.presets"):
        paper = FTISConfig(output_dir=str(tmp_path), preset="paper", bf16=True, **BASIC)
        FTISConfig(output_dir=str(tmp_path), preset="paper", bf16=True, **BASIC)
    assert (paper.loss_type, paper.disable_dropout, paper.cast_lm_head_to_fp32) == ("grpo", True, True)
    lines = [r.getMessage() for r in caplog.records if "preset=" in r.getMessage()]
    expected = (
        "preset='paper' sets loss_type='grpo' (TRL's default: 'dapo'), disable_dropout=True (TRL's default: False), "
        "cast_lm_head_to_fp32=True (TRL's default: False)."
    )
    assert lines == [expected]
    fp32 = FTISConfig(output_dir=str(tmp_path), preset="paper", bf16=False, **BASIC)
    assert fp32.cast_lm_head_to_fp32 is False  # fp32: nothing to cast


def test_a_value_given_wins_over_the_preset_trls_default_included(tmp_path, caplog):
    args = FTISConfig(output_dir=str(tmp_path), preset="paper", loss_type="dr_grpo", bf16=False, **BASIC)
    assert (args.loss_type, args.disable_dropout) == ("dr_grpo", True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_ftis.presets"):
        lora = FTISConfig(output_dir=str(tmp_path), preset="paper", disable_dropout=False, bf16=True, **BASIC)
    assert (lora.loss_type, lora.disable_dropout, lora.cast_lm_head_to_fp32) == ("grpo", False, True)
    assert "disable_dropout" not in caplog.text  # only what the preset set is said
    argv = ["--output_dir", "/tmp/x", "--use_cpu", "true", "--bf16", "false", "--preset", "paper"]
    from transformers import HfArgumentParser

    (parsed,) = HfArgumentParser(FTISConfig).parse_args_into_dataclasses([*argv, "--disable_dropout", "false"])
    assert (parsed.loss_type, parsed.disable_dropout) == ("grpo", False)


def test_an_unknown_preset_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown preset 'papr'; expected one of paper \(or none\)"):
        FTISConfig(output_dir=str(tmp_path), preset="papr", **BASIC)


def test_the_preset_parses_from_the_command_line():
    from transformers import HfArgumentParser

    argv = ["--output_dir", "/tmp/x", "--use_cpu", "true", "--bf16", "false", "--preset", "paper"]
    (args,) = HfArgumentParser(FTISConfig).parse_args_into_dataclasses(argv)
    assert (args.preset, args.loss_type, args.disable_dropout) == ("paper", "grpo", True)


def test_a_half_precision_swarm_peer_without_the_fp32_head_is_warned_once(tmp_path, caplog):
    swarm = {"exchange_url": "memory://dropin", "peer_id": "a", **BASIC}
    with caplog.at_level(logging.WARNING, logger="trl_ftis.config_checks"):
        FTISConfig(output_dir=str(tmp_path), bf16=True, **swarm)
        FTISConfig(output_dir=str(tmp_path), bf16=True, **swarm)
        FTISConfig(output_dir=str(tmp_path), bf16=True, cast_lm_head_to_fp32=True, **swarm)
    warned = [r.getMessage() for r in caplog.records if "cast_lm_head_to_fp32 is off" in r.getMessage()]
    assert len(warned) == 1 and "bf16" in warned[0] and "preset='paper'" in warned[0]


@pytest.mark.parametrize("bf16", [False, True])
def test_with_trls_defaults_and_no_peers_it_trains_exactly_like_stock_grpotrainer(tokenizer, bf16, tmp_path):
    """Stock `GRPOTrainer` with `GRPOConfig`'s own defaults (loss "dapo", dropout on, no fp32 head) and `FTISTrainer`
    with the same flags: the same weights and the same logged losses, bit for bit."""
    dataset = addition_dataset(32, seed=0)
    flags = {
        "max_steps": 3,
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 6,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "bf16": bf16,
        **BASIC,
    }
    model = build_tiny_llama(tokenizer, seed=0)
    runs = {}
    for name, config_class, trainer_class in (("grpo", GRPOConfig, GRPOTrainer), ("ftis", FTISConfig, FTISTrainer)):
        args = config_class(output_dir=str(tmp_path / name), **flags)
        trainer = trainer_class(
            copy.deepcopy(model), digit_match_reward, args=args, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.train()
        runs[name] = trainer
    assert runs["ftis"].args.loss_type == "dapo"
    start = dict(model.named_parameters())
    grpo, ftis = dict(runs["grpo"].model.named_parameters()), dict(runs["ftis"].model.named_parameters())
    assert any(not torch.equal(start[k], grpo[k]) for k in start), "GRPO did not move: the test is vacuous"
    assert all(torch.equal(grpo[k], ftis[k]) for k in grpo)
    losses = {name: [e["loss"] for e in t.state.log_history if "loss" in e] for name, t in runs.items()}
    assert losses["grpo"] == losses["ftis"] and len(losses["grpo"]) == 3
