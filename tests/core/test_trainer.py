"""FTISTrainer on tiny local models: drop-in equivalence, the loss it optimises, peer rows, PEFT, saving."""

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from swarm_helpers import a_row  # tests/ is on sys.path
from tiny_trainers import without_control_tokens
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_ftis import FTISConfig, FTISTrainer, PeerRow, ftis_loss
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.exchange_step import ExchangeStep
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward


@pytest.fixture(scope="module")
def dataset():
    return addition_dataset(64, seed=1)


def make_trainer(tokenizer, args, dataset, *, hidden_size=64, seed=0, model=None, **kwargs):
    model = model if model is not None else build_tiny_llama(tokenizer, hidden_size=hidden_size, seed=seed)
    return FTISTrainer(
        model, digit_match_reward, args=args, train_dataset=dataset, processing_class=tokenizer, **kwargs
    )


def record_rows(trainer, steps):
    """Run `steps` training steps of `trainer` and return the own rows it published at each generation."""
    published = []
    trainer.add_row_listener(published.append)
    trainer.args.max_steps = steps
    trainer.train()
    return published


def params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def last_metrics(trainer):
    return [entry for entry in trainer.state.log_history if "loss" in entry]


# --------------------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------------------
def test_the_tiny_settings_use_the_paper_preset(make_args):
    """`make_args` (the tiny CPU settings) starts from `preset="paper"`; TRL's own defaults:
    tests/core/test_dropin.py."""
    args = make_args()
    assert args.preset == "paper"
    assert (args.variant, args.is_cap, args.kl_threshold, args.kl_reduction) == ("f-tis", 2.0, 50.0, "group_max_len")
    assert (args.loss_type, args.beta, args.disable_dropout, args.epsilon) == ("grpo", 0.0, True, 0.2)
    assert args.cast_lm_head_to_fp32 is False  # fp32 training: nothing to cast
    assert make_args(bf16=True).cast_lm_head_to_fp32 is True


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"variant": "ftis2"}, "Unknown F-TIS variant"),
        ({"is_cap": 0.5}, "is_cap"),
        ({"is_cap": float("nan")}, "is_cap"),
        ({"kl_threshold": -1.0}, "kl_threshold"),
        ({"kl_reduction": "max"}, "kl_reduction"),
        ({"loss_type": "ppo"}, "Unknown loss_type"),
        ({"importance_sampling_level": "per-token"}, "importance_sampling_level"),
    ],
)
def test_config_rejects_invalid_values(make_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_args(**overrides)


def test_config_variant_names_are_normalised(make_args):
    assert make_args(variant="F_TIS").variant == "f-tis"


def test_every_ftis_field_is_documented_and_parsable():
    from transformers import HfArgumentParser

    own = set(FTISConfig.__dataclass_fields__) - set(GRPOConfig.__dataclass_fields__)
    assert {"variant", "is_cap", "kl_threshold", "kl_reduction", "exchange_url", "peer_id"} <= own
    for name in own:
        field = FTISConfig.__dataclass_fields__[name]
        assert field.metadata.get("help"), name
        assert f"\n        {name} (`" in FTISConfig.__doc__, name  # documented under Parameters
    assert FTISConfig.__doc__.count("Parameters:") == 1
    from trl_ftis.presets import PRESETS

    for name in PRESETS["paper"]:  # the preset's options, each explained in the class's note
        assert f"> - `{name}=" in FTISConfig.__doc__, name
    (args,) = HfArgumentParser(FTISConfig).parse_args_into_dataclasses(
        ["--output_dir", "/tmp/x", "--bf16", "false", "--use_cpu", "true", "--variant", "tis", "--is_cap", "3"]
    )
    assert (args.variant, args.is_cap) == ("tis", 3.0)


def test_the_constructor_takes_exactly_grpotrainers_parameters():
    """Same names, order, kinds and defaults as GRPOTrainer.__init__: a positional call written for GRPOTrainer means
    the same for FTISTrainer, and `reward_funcs` is optional as there."""
    import inspect

    def shape(cls):
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls.__init__).parameters.values()]

    assert shape(FTISTrainer) == shape(GRPOTrainer)


def test_positional_arguments_and_no_reward_funcs_work_as_for_grpotrainer(tokenizer, dataset, make_args):
    # model, reward_funcs, args, train_dataset, eval_dataset, processing_class: positionally, as GRPOTrainer takes them
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer, seed=0), digit_match_reward, make_args(), dataset, None, tokenizer
    )
    assert trainer.train_dataset is dataset and trainer.processing_class is tokenizer
    # Without reward functions GRPOTrainer needs rewards from elsewhere (an environment); both refuse the same way.
    errors = []
    for cls, config in ((GRPOTrainer, GRPOConfig), (FTISTrainer, FTISConfig)):
        with pytest.raises(Exception) as info:
            cls(
                build_tiny_llama(tokenizer, seed=0),
                args=make_args(config),
                train_dataset=dataset,
                processing_class=tokenizer,
            )
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_a_trainer_config_that_is_not_a_grpo_config_is_refused(tokenizer, dataset, make_args, tmp_path):
    from transformers import TrainingArguments

    with pytest.raises(TypeError, match="FTISConfig"):
        make_trainer(tokenizer, TrainingArguments(str(tmp_path / "out")), dataset)


def test_a_grpo_config_is_converted_keeping_every_value(make_args):
    grpo = make_args(GRPOConfig, loss_type="dapo", learning_rate=3e-4, steps_per_generation=2, temperature=0.7)
    before = copy.deepcopy(grpo.to_dict())
    converted = FTISConfig.from_grpo_config(grpo)
    assert isinstance(converted, FTISConfig) and type(grpo) is GRPOConfig
    assert grpo.to_dict() == before  # the caller's config is untouched
    theirs = grpo.to_dict()
    ours = converted.to_dict()
    assert {key: ours[key] for key in theirs} == theirs  # every GRPOConfig value, TRL's defaults included
    assert converted.loss_type == "dapo" and converted.disable_dropout is False  # GRPOConfig's, not FTISConfig's
    assert (converted.variant, converted.is_cap, converted.kl_threshold) == ("f-tis", 2.0, 50.0)
    assert converted.cross_tokenizer is False and converted.exchange_url is None and converted.peer_id
    with pytest.raises(TypeError, match="GRPOConfig"):
        FTISConfig.from_grpo_config(object())


def test_with_a_grpo_config_it_trains_exactly_like_grpotrainer(tokenizer, dataset, make_args):
    """A drop-in replacement: the same GRPOConfig (TRL's default loss, dapo) in both trainers, the same weights."""
    grpo = make_args(GRPOConfig, loss_type="dapo")
    reference = GRPOTrainer(
        build_tiny_llama(tokenizer, seed=0),
        digit_match_reward,
        args=copy.deepcopy(grpo),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    reference.train()
    ours = make_trainer(tokenizer, grpo, dataset)
    assert isinstance(ours.args, FTISConfig)
    ours.train()
    expected, got = params(reference.model), params(ours.model)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


# --------------------------------------------------------------------------------------------------------------------
# Drop-in equivalence and the loss
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bf16", [False, True])
def test_without_peers_it_trains_exactly_like_grpo(tokenizer, dataset, make_args, bf16):
    model = build_tiny_llama(tokenizer, seed=0)
    common = {
        "max_steps": 3,
        "loss_type": "grpo",
        "beta": 0.0,
        "disable_dropout": True,
        "cast_lm_head_to_fp32": True,
        "bf16": bf16,
    }
    grpo = GRPOTrainer(
        copy.deepcopy(model),
        digit_match_reward,
        args=make_args(GRPOConfig, **common),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    grpo.train()
    ftis = make_trainer(tokenizer, make_args(**common), dataset, model=copy.deepcopy(model))
    ftis.train()

    start, after_grpo, after_ftis = params(model), params(grpo.model), params(ftis.model)
    assert any(not torch.equal(start[k], after_grpo[k]) for k in start), "GRPO did not move: the test is vacuous"
    for name in start:
        assert torch.equal(after_grpo[name], after_ftis[name]), name
    grpo_losses = [e["loss"] for e in last_metrics(grpo)]
    ftis_losses = [e["loss"] for e in last_metrics(ftis)]
    assert grpo_losses == ftis_losses


def peer_rows_from(tokenizer, dataset, make_args, *, steps=1, hidden_size=32, seed=7, **overrides):
    peer = make_trainer(tokenizer, make_args(**overrides), dataset, hidden_size=hidden_size, seed=seed)
    published = record_rows(peer, steps)
    for rows in published:
        for row in rows:
            row.sender = "small"
    return without_control_tokens([row for rows in published for row in rows], tokenizer)


TRL_CONTRACT = (
    "The TRL contract FTISTrainer relies on changed (TRL {version}): GRPOTrainer._compute_loss must call "
    "self._get_per_token_logps_and_entropies first, getting ℓθ with gradient, and read inputs['advantages'] and "
    "inputs['old_per_token_logps'] only after that call, from the dict it was given. Check _compute_loss in "
    "trl/trainer/grpo_trainer.py and move the F-TIS substitution (trl_ftis.loss_hook.FTISLossHook.apply, called "
    "from FTISTrainer._get_per_token_logps_and_entropies) to where TRL now reads them. {detail}"
)


def contract_message(detail):
    import trl

    return TRL_CONTRACT.format(version=trl.__version__, detail=detail)


def test_trl_loss_contract_advantages_and_reference_are_read_after_the_logps_call(
    tokenizer, dataset, make_args, monkeypatch
):
    """The F-TIS hook replaces `advantages` and `old_per_token_logps` inside the first
    `_get_per_token_logps_and_entropies` call of TRL's `_compute_loss`: TRL's loss must be built from the replaced
    values. Here the hook sets A = 1 on every token and ℓref = ℓθ + 1, so every ratio is e^-1 (below 1 - ε: the
    unclipped branch is the min) and TRL's `grpo` loss must be exactly -e^-1. Had TRL read the batch's advantages
    earlier the loss would mix their signs; had it read `old_per_token_logps` earlier (None: ℓold = ℓθ) it would be
    -1."""
    trainer = make_trainer(tokenizer, make_args(), dataset)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop during train()
    generator = torch.Generator().manual_seed(0)
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    batch = {
        "prompt_ids": torch.randint(3, trainer.vocab_limit, (4, 3), generator=generator),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.randint(3, trainer.vocab_limit, (4, 5), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "num_items_in_batch": completion_mask.sum(),
    }
    hook_calls = []

    def substitute(inputs, per_token_logps):
        hook_calls.append(per_token_logps.requires_grad)
        inputs["advantages"] = torch.ones_like(per_token_logps.detach())
        inputs["old_per_token_logps"] = per_token_logps.detach() + 1.0

    monkeypatch.setattr(trainer._loss_hook, "apply", substitute)
    loss = trainer._compute_loss(trainer.model, batch)

    assert hook_calls == [True], contract_message(
        f"The hook ran {len(hook_calls)} times (expected once) or not on log-probs with gradient: {hook_calls}."
    )
    assert loss.requires_grad
    assert loss.item() == pytest.approx(-math.exp(-1.0), abs=1e-6), contract_message(
        f"TRL's loss is {loss.item():.6f}; built from the hook's advantages and reference it is -e^-1 = "
        f"{-math.exp(-1.0):.6f} (-1: old_per_token_logps was read before the call; anything else: advantages were)."
    )
    assert batch["advantages"].tolist() == [1.0, -1.0, 0.5, -0.5] and "old_per_token_logps" not in batch, (
        "the caller's batch must stay untouched (it is reused across num_iterations)"
    )


@pytest.mark.parametrize("variant", ["tis", "vis", "f-tis", "f-nois"])
def test_trl_loss_contract_trainer_loss_is_the_ftis_loss(tokenizer, dataset, make_args, variant):
    """End to end, on a batch with peer rows: the loss TRL's `_compute_loss` returns is `ftis_loss` of the same
    tensors, for each kind of variant (truncated weight, ratio against the generator, filter)."""
    rows = peer_rows_from(tokenizer, dataset, make_args)
    # A low threshold so that the filter acts on some peer rows.
    trainer = make_trainer(tokenizer, make_args(variant=variant, kl_threshold=0.01), dataset)
    trainer.add_peer_rows(rows)
    batch_inputs = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    batch = trainer._generate_and_score_completions(batch_inputs)
    assert batch["ftis_gen_valid"].sum() == len(rows)

    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop during train()
    loss = trainer.compute_loss(trainer.model, batch)

    # Recompute ℓθ without F-TIS and call the pure function on the same tensors.
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, trainer.model, input_ids, attention, batch["completion_ids"].shape[1]
    )
    gen = torch.where(batch["ftis_gen_valid"].unsqueeze(-1), batch["ftis_gen_logps"], logps.detach())
    expected = ftis_loss(
        logps,
        None,
        gen,
        batch["advantages"],
        batch["completion_mask"],
        num_generations=8,
        variant=variant,
        kl_threshold=0.01,
        group_max_lengths=batch["ftis_group_max_len"],
    )
    torch.testing.assert_close(
        loss,
        expected,
        rtol=1e-5,
        atol=1e-7,
        msg=lambda detail: contract_message(f"The trainer's loss is not ftis_loss on the same batch: {detail}"),
    )
    if variant.startswith("f-"):
        assert trainer._metrics["train"]["ftis/peer/filtered_frac"][-1] > 0


# --------------------------------------------------------------------------------------------------------------------
# Generator log-probs of the trainer's own rows
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_published_generator_logps_match_a_teacher_forced_forward(tokenizer, dataset, make_args, temperature):
    trainer = make_trainer(tokenizer, make_args(temperature=temperature), dataset, hidden_size=32, seed=3)
    start = build_tiny_llama(tokenizer, hidden_size=32, seed=3)  # the weights that generated the rows
    published = record_rows(trainer, 1)
    (rows,) = published
    assert trainer._recorded_logps is not None, "the generation pass should have recorded the log-probs"
    assert len(rows) == 16 and all(len(r.completion_ids) == len(r.generator_logps) for r in rows)

    for row in rows[:4]:
        prompt = tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + list(row.completion_ids)])
        with torch.no_grad():
            logits = start(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(row.completion_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(row.generator_logps), expected, atol=2e-4, rtol=1e-4)
    assert {r.group for r in rows} == {(0, 0), (0, 1)}
    assert all(set(r.rewards_per_func) == {"digit_match_reward"} for r in rows)


def test_no_listener_means_no_generator_logps_work(tokenizer, dataset, make_args):
    trainer = make_trainer(tokenizer, make_args(max_steps=1), dataset)
    trainer.train()
    assert trainer._recorded_logps is None


def test_listener_rows_carry_rewards_and_dataset_columns(tokenizer, dataset, make_args):
    trainer = make_trainer(tokenizer, make_args(), dataset)
    (rows,) = record_rows(trainer, 1)
    answers = {example["prompt"]: example["answer"] for example in dataset}
    for row in rows:
        assert row.extra == {"answer": answers[row.prompt]}
        text = tokenizer.decode(row.completion_ids, skip_special_tokens=True)
        assert row.reward == pytest.approx(digit_match_reward([text], [answers[row.prompt]])[0])


# --------------------------------------------------------------------------------------------------------------------
# Peer rows
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"completion_ids": [8, 999, 2]}, ValueError, "vocabulary"),
        ({"completion_ids": [8, -1, 2]}, ValueError, "vocabulary"),
        ({"generator_logps": [-0.5, 0.5, -0.1]}, ValueError, "<= 0"),
        ({"generator_logps": [-0.5, float("nan"), -0.1]}, ValueError, "finite"),
        ({"generator_logps": [-0.5, float("-inf"), -0.1]}, ValueError, "finite"),
    ],
)
def test_bad_peer_rows_are_refused_whole(tokenizer, dataset, make_args, overrides, error, message):
    trainer = make_trainer(tokenizer, make_args(), dataset)
    with pytest.raises(error, match=message):
        trainer.add_peer_rows([a_row(), a_row(**overrides)])
    assert trainer.num_pending_peer_rows == 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"completion_ids": []}, "empty"),
        ({"generator_logps": [-0.5]}, "3 completion ids but 1"),
        ({"reward": float("inf")}, "non-finite reward"),
    ],
)
def test_malformed_peer_rows_cannot_be_built(overrides, message):
    with pytest.raises(ValueError, match=message):
        a_row(**overrides)


def test_overlong_peer_rows_are_dropped_and_counted(tokenizer, dataset, make_args):
    trainer = make_trainer(tokenizer, make_args(max_steps=1), dataset)
    long = a_row(completion_ids=[8] * 7, generator_logps=[-0.1] * 7)
    assert trainer.add_peer_rows([a_row(), a_row(reward=0.0), long]) == 2
    trainer.train()
    (entry,) = last_metrics(trainer)
    assert entry["ftis/peer_rows"] == 2 and entry["ftis/peer_rows_dropped"] == 1


def test_heterogeneous_peer_rows_reach_the_loss_and_change_the_update(tokenizer, dataset, make_args):
    """A hidden-64 learner trains on rows sampled by a hidden-32 model that shares its tokenizer."""
    rows = peer_rows_from(tokenizer, dataset, make_args, steps=2)
    assert len(rows) == 32

    alone = make_trainer(tokenizer, make_args(max_steps=2), dataset)
    alone.train()
    helped = make_trainer(tokenizer, make_args(max_steps=2), dataset)
    helped.add_peer_rows(rows[:16])
    helped.add_row_listener(lambda _: helped.add_peer_rows(rows[16:]) if helped.state.global_step == 1 else None)
    start = params(build_tiny_llama(tokenizer, seed=0))
    helped.train()

    entries = last_metrics(helped)
    assert [e["ftis/peer_rows"] for e in entries] == [16, 16]
    for entry in entries:
        assert 0 < entry["ftis/peer/is_weight_mean"] <= 2.0
        assert entry["ftis/peer/kl_mean"] > 0  # a different model: the filter statistic is positive
        assert entry["ftis/own/kl_mean"] == pytest.approx(0.0, abs=1e-6)  # own rows are on-policy
        assert entry["ftis/own/is_weight_mean"] == pytest.approx(1.0)
    after_alone, after_helped = params(alone.model), params(helped.model)
    assert any(not torch.equal(start[k], after_helped[k]) for k in start)
    assert any(not torch.equal(after_alone[k], after_helped[k]) for k in start), "peer rows had no effect"


def test_peer_rows_with_accumulation_and_several_iterations(tokenizer, dataset, make_args):
    """num_iterations > 1 needs old log-probs for peer rows too; steps_per_generation needs equal micro-batches."""
    rows = peer_rows_from(tokenizer, dataset, make_args)
    args = make_args(max_steps=2, num_iterations=2, gradient_accumulation_steps=2, per_device_train_batch_size=8)
    trainer = make_trainer(tokenizer, args, dataset)
    trainer.add_peer_rows(rows[:15])  # an odd count: one row is dropped to split into 2 micro-batches
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    assert batch["completion_ids"].shape[0] == 16 + 14
    old = batch["old_per_token_logps"][16:]
    mask = batch["completion_mask"][16:].bool()
    assert torch.isfinite(old[mask]).all() and (old[mask] < 0).all()
    # The peers' old log-probs are the learner's, not the generator's.
    assert not torch.allclose(old[mask], batch["ftis_gen_logps"][16:][mask])
    trainer.add_peer_rows(rows[:16])
    trainer.train()
    assert math.isfinite(last_metrics(trainer)[-1]["loss"])


def test_merged_batch_is_padded_like_trl(tokenizer, dataset, make_args):
    trainer = make_trainer(tokenizer, make_args(), dataset)
    trainer.add_peer_rows(
        [
            a_row(prompt="1234+5678=", group="x"),
            a_row(prompt="1+2=", completion_ids=[5, 2], generator_logps=[-1, -2], group="x"),
        ]
    )
    trainer.model.train()
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    peer_prompt_mask, peer_completion_mask = batch["prompt_mask"][16:], batch["completion_mask"][16:]
    assert peer_prompt_mask[:, -1].all(), "prompts are left-padded: every completion starts at the same column"
    assert peer_completion_mask[:, 0].all() and peer_completion_mask.sum(-1).tolist() == [3, 2]
    assert batch["prompt_ids"][16, -10:].tolist() == tokenizer("1234+5678=", add_special_tokens=False)["input_ids"]
    # One group of two rewards (1, 1): advantages 0. Longest completion of the group: 3.
    assert batch["advantages"][16:].tolist() == [0.0, 0.0]
    assert batch["ftis_group_max_len"][16:].tolist() == [3, 3]
    assert batch["num_items_in_batch"] == batch["completion_mask"].sum()


# --------------------------------------------------------------------------------------------------------------------
# TRL features that must keep working
# --------------------------------------------------------------------------------------------------------------------
def test_lora_peer_trains_on_peer_rows_and_saves_an_adapter(tokenizer, dataset, make_args, tmp_path):
    from peft import LoraConfig, PeftModel

    rows = peer_rows_from(tokenizer, dataset, make_args)
    trainer = make_trainer(
        tokenizer,
        make_args(max_steps=1),
        dataset,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.1),
    )
    lora_before = {k: v for k, v in params(trainer.model).items() if "lora_B" in k}
    trainer.add_peer_rows(rows)
    trainer.train()
    lora_after = {k: v for k, v in params(trainer.model).items() if "lora_B" in k}
    assert lora_before and any(not torch.equal(lora_before[k], lora_after[k]) for k in lora_before)
    assert last_metrics(trainer)[-1]["ftis/peer_rows"] == 16

    trainer.save_model(str(tmp_path / "adapter"))
    base = build_tiny_llama(tokenizer, seed=0)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    for name, value in lora_after.items():
        torch.testing.assert_close(dict(loaded.named_parameters())[name], value)


def test_full_model_saves_a_checkpoint_that_from_pretrained_loads(tokenizer, dataset, make_args, tmp_path):
    trainer = make_trainer(tokenizer, make_args(max_steps=1), dataset)
    trainer.train()
    trainer.save_model(str(tmp_path / "model"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    for name, value in params(trainer.model).items():
        torch.testing.assert_close(dict(loaded.named_parameters())[name], value)


def test_model_card_names_ftis_and_the_paper(tokenizer, dataset, make_args):
    trainer = make_trainer(tokenizer, make_args(), dataset)
    trainer.create_model_card(model_name="tiny-ftis")
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    assert "F-TIS" in card and "2605.22537" in card and "ftis" in card
    # The Quick start loads this run's model: from where it is saved, without a Hub id (TRL wrote model="None").
    assert 'model="None"' not in card and f'model="{trainer.args.output_dir}"' in card


def test_the_quick_start_names_the_hub_id_else_the_output_directory():
    from types import SimpleNamespace

    from trl_ftis.model_card import with_quick_start_model

    text = 'generator = pipeline("text-generation", model="None", device_map="auto")'
    local = with_quick_start_model(text, SimpleNamespace(hub_model_id=None, output_dir="runs/big"))
    assert local == 'generator = pipeline("text-generation", model="runs/big", device_map="auto")'
    hub = with_quick_start_model(text, SimpleNamespace(hub_model_id="me/tiny-ftis", output_dir="runs/big"))
    assert 'model="me/tiny-ftis"' in hub
    named = text.replace("None", "me/tiny-ftis")
    assert with_quick_start_model(named, SimpleNamespace(hub_model_id=None, output_dir="o")) == named  # TRL's own


def test_a_run_that_saves_no_checkpoint_writes_its_model_card_at_the_end(tokenizer, dataset, make_args):
    """TRL writes the card with each checkpoint only: with save_strategy="no" it is written when training ends."""
    trainer = make_trainer(tokenizer, make_args(max_steps=1, save_strategy="no"), dataset, hidden_size=32)
    card = Path(trainer.args.output_dir) / "README.md"
    assert not card.exists()
    trainer.train()
    text = card.read_text()
    assert "F-TIS" in text and "2605.22537" in text and f"model_name: {Path(trainer.args.output_dir).name}" in text


def test_without_raw_logits_the_generator_logps_come_from_a_forward(tokenizer, dataset, make_args):
    """With a repetition penalty, generate's processors alter the logits: the recorder stands aside and the published
    log-probs are the teacher-forced full-softmax ones, not the penalised scores."""
    trainer = make_trainer(tokenizer, make_args(repetition_penalty=1.5), dataset, hidden_size=32, seed=3)
    start = build_tiny_llama(tokenizer, hidden_size=32, seed=3)
    (rows,) = record_rows(trainer, 1)
    assert trainer._recorded_logps is None
    for row in rows[:4]:
        prompt = tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = start(input_ids=torch.tensor([prompt + list(row.completion_ids)])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(row.completion_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(row.generator_logps), expected, atol=2e-4, rtol=1e-4)


def test_kl_to_reference_and_evaluation_work_with_peer_rows(tokenizer, dataset, make_args, tmp_path):
    rows = peer_rows_from(tokenizer, dataset, make_args)
    build_tiny_llama(tokenizer, seed=0).save_pretrained(tmp_path / "tiny")  # beta > 0 loads the reference by path
    args = make_args(max_steps=1, beta=0.1, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=16)
    trainer = make_trainer(
        tokenizer, args, dataset, model=str(tmp_path / "tiny"), eval_dataset=addition_dataset(16, seed=5)
    )
    trainer.add_peer_rows(rows)
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    ref = batch["ref_per_token_logps"][16:]
    mask = batch["completion_mask"][16:].bool()
    assert torch.isfinite(ref[mask]).all() and (ref[mask] < 0).all()
    trainer.add_peer_rows(rows)
    trainer.train()
    history = trainer.state.log_history
    assert any("eval_loss" in entry and math.isfinite(entry["eval_loss"]) for entry in history)
    assert any("kl" in entry for entry in history if "loss" in entry)


def test_peer_prompts_are_rendered_with_the_receivers_chat_template(make_args):
    """Peers may use different chat templates: a conversational prompt travels as messages and the receiver renders
    it with its own template."""
    from datasets import Dataset

    from trl_ftis.demo.tiny import build_char_tokenizer

    receiver_template = (
        "{% for m in messages %}Q{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}A{% endif %}"
    )
    tokenizer = build_char_tokenizer(chat_template=receiver_template)
    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+2="}], "answer": "3"}] * 16)
    trainer = FTISTrainer(
        build_tiny_llama(tokenizer),
        digit_match_reward,
        args=make_args(),
        train_dataset=chat,
        processing_class=tokenizer,
    )
    message = [{"role": "user", "content": "12+34="}]
    trainer.add_peer_rows([a_row(prompt=message), a_row(prompt=message, reward=0.0)])
    trainer.model.train()
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    rendered = tokenizer("Q12+34=A", add_special_tokens=False)["input_ids"]
    assert batch["prompt_ids"][16, -len(rendered) :].tolist() == rendered
    assert batch["prompt_mask"][16].sum() == len(rendered)


def test_lora_on_a_model_with_tied_embeddings_works_with_fp32_head_requested(tokenizer, dataset, make_args, caplog):
    """TRL cannot cast a tied LM head to fp32 under a PEFT wrapper; the trainer turns the cast off with a warning."""
    from peft import LoraConfig

    model = build_tiny_llama(tokenizer)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    trainer = make_trainer(
        tokenizer,
        make_args(max_steps=1, cast_lm_head_to_fp32=True),
        dataset,
        model=model,
        peft_config=LoraConfig(r=4, target_modules=["q_proj"]),
    )
    assert trainer.args.cast_lm_head_to_fp32 is False and "tied embeddings" in caplog.text
    trainer.train()
    assert math.isfinite(last_metrics(trainer)[-1]["loss"])


def test_without_peer_rows_trls_token_count_is_kept(tokenizer, dataset, make_args):
    """TRL counts loss tokens with the tool mask; merging no rows must leave its count alone."""
    trainer = make_trainer(tokenizer, make_args(), dataset)
    output = {
        "completion_mask": torch.ones(2, 4, dtype=torch.long),
        "tool_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]),
        "num_items_in_batch": torch.tensor(6),
    }
    assert trainer._merge_peer_rows(dict(output), [])["num_items_in_batch"] == 6


def test_a_step_tokenises_each_peer_prompt_once(tokenizer, dataset, make_args, monkeypatch):
    """The prompt of a peer row is rendered and tokenised once, at admission, and its ids reach the merged batch: the
    merge does not tokenise it again (it did, before the admitted row carried them)."""
    trainer = make_trainer(tokenizer, make_args(), dataset)
    peer_prompt = "7+8="  # not a prompt of the training set, so only the peer rows bring it
    rows = [
        PeerRow(
            prompt=peer_prompt,
            completion_ids=tokenizer.encode(text, add_special_tokens=False),
            generator_logps=[-0.5] * len(text),
            reward=reward,
            group="g",
            sender="peer",
        )
        for text, reward in (("15", 1.0), ("14", 0.0), ("51", 0.0), ("15", 1.0))
    ]
    calls = []
    tokenize = trainer._tokenize_prompts

    def counting(prompts, *args, **kwargs):
        calls.append(list(prompts))
        return tokenize(prompts, *args, **kwargs)

    monkeypatch.setattr(trainer, "_tokenize_prompts", counting)
    assert trainer.add_peer_rows(rows) == 4
    batch = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))

    assert sum(prompts.count(peer_prompt) for prompts in calls) == 1, calls
    expected_ids = tokenize([peer_prompt])[0][0]
    peer = batch["ftis_gen_valid"].nonzero().flatten().tolist()
    assert len(peer) == 4
    for index in peer:
        ids = batch["prompt_ids"][index][batch["prompt_mask"][index].bool()].tolist()
        assert ids == list(expected_ids)


def test_the_model_card_of_a_local_model_names_it_and_holds_the_runs_results(tokenizer, dataset, make_args):
    """A model built in code (or read from a local folder) has no Hub id: TRL's card linked it as
    huggingface.co/None; the card names it instead, with its size, and holds the last reward and the dataset."""
    trainer = make_trainer(tokenizer, make_args(max_steps=1, save_strategy="no"), dataset, hidden_size=32)
    trainer.train()
    trainer.create_model_card(model_name="tiny-ftis", dataset_name="addition")
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    assert "huggingface.co/None" not in card and "[None]" not in card
    assert "a local model (a LlamaForCausalLM built locally (" in card and "M parameters))" in card
    results = card[card.index("### Results") :]
    assert "| dataset | addition |" in results and "| training reward (last logged) |" in results


def test_the_collaboration_sentence_is_never_cut_mid_number():
    from trl_ftis.model_card import card_results, ftis_model_card_section

    sentence = "Peer rows were worth 1234.5678 own rows " * 5 + "and the final number is 98765.4321."
    collaboration = {
        "time_seconds": dict.fromkeys(("step", "generation", "scoring", "exchange", "training", "other"), 1.0),
        "generation_share": 0.5,
        "peer_value": {"rows_in_loss": 0, "peers": {}},
        "collaboration": sentence,
    }
    args = FTISConfig(output_dir="o", use_cpu=True, report_to=[], peer_id="me")
    section = ftis_model_card_section(
        args=args,
        temperature=1.0,
        num_generations=8,
        global_step=3,
        paper={"title": "F-TIS", "id": "2605.22537"},
        model_name="m",
        peers=[],
        accepted_by_peer={},
        peer_models={},
        collaboration=collaboration,
        results=card_results([{"reward": 0.25}, {"eval_accuracy": 0.5, "epoch": 1}]),
    )
    assert "final number is 98765.4321." in section
    assert "| training reward (last logged) | 0.25 |" in section and "| eval_accuracy | 0.5 |" in section


def test_the_exchange_step_runs_the_round_on_the_main_process_and_hands_back_this_process_share():
    """`ExchangeStep` without a trainer: the round gets this job's own rows and step, the swarm the sampling settings;
    the round's metrics are logged, horizontal statistics rewrite the own rows, and this process keeps its share."""
    rounds_seen, rewritten, logged = [], [], []
    swarm = SimpleNamespace(sampling=None)

    class Rounds:
        def __init__(self, own_statistics):
            self.swarm, self.own_statistics = swarm, own_statistics

        def round(self, rows, step):
            rounds_seen.append((list(rows), step))
            return ["a1", "a2", "b1"], self.own_statistics, {"ftis/exchange/bytes_sent": 10.0}

    class Merge:
        def own_statistics(self, output, statistics, count):
            rewritten.append((output, statistics, count))

        def equal_share(self, rows):
            return rows[:2]

    def step_with(own_statistics):
        return ExchangeStep(
            accelerator=SimpleNamespace(num_processes=1, is_main_process=True),
            rounds=Rounds(own_statistics),
            merge=Merge(),
            log=lambda name, value: logged.append((name, value)),
            sampling=lambda: {"logps": "trainer"},
        )

    assert step_with(None).run(["own1", "own2"], {"batch": 1}, 7) == ["a1", "a2"]
    assert rounds_seen == [(["own1", "own2"], 7)] and swarm.sampling == {"logps": "trainer"}
    assert logged == [("ftis/exchange/bytes_sent", 10.0)] and rewritten == []
    step_with({"mean": 0.5}).run(["own1"], {"batch": 2}, 8)
    assert rewritten == [({"batch": 2}, {"mean": 0.5}, 1)]
