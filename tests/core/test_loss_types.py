"""F-TIS under every TRL loss type and both importance-sampling levels, against hand-computed gradients.

Each TRL loss is linear in the advantage, so F-TIS acts on all of them by replacing `Â_i` with the per-token
`w_{i,t} · Ã_i` (the truncated weight times the filtered advantage). With one update per batch (`ℓold = sg ℓθ`, every
ratio 1), every loss type's gradient with respect to the learner's log-prob of token t of completion i is then

    ∂L/∂ℓθ_{i,t} = -c · w_{i,t} · Ã_i / N_i

the paper's F-TIS gradient with that loss's normaliser `N_i` (`docs/objective.md`, "Every TRL loss"): c = 1 except
for `cispo`, whose clipped weight is `min(1, ε_high)`. With `importance_sampling_level="sequence"` (GSPO) the weight is
one per completion, `w_i = min(exp(mean_t(ℓθ - ℓgen)), C)`, and the filter statistic is k3 of that mean log-ratio.

Here the learner's log-probs are a leaf tensor we choose (TRL's log-prob computation is replaced), so every value
below is computed by hand from the numbers in the batch.
"""

import math

import pytest
import torch
from tiny_trainers import tiny_trainer, without_control_tokens  # tests/ is on sys.path
from trl import GRPOTrainer

from trl_ftis.objective import (
    LOSS_TYPES,
    sequence_filter_statistic,
    sequence_log_ratio,
    sequence_truncated_weights,
)

# Two completions: an own row (Â = +1, three tokens) and a peer row (Â = -0.5, two tokens, one padding).
LEARNER = [[-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0]]
GENERATOR = [[-1.0, -3.0, -0.2], [-0.5, -1.0, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADVANTAGES = [1.0, -0.5]
MAX_COMPLETION_LENGTH = 4

# Token level, by hand: w = min(exp(ℓθ - ℓgen), 2).
#   row 0: exp(0) = 1, exp(1) = 2.718 -> 2 (capped), exp(-0.3) = 0.740818
#   row 1: exp(-1) = 0.367879, exp(0) = 1
# Filter statistic of row 1 (group_max_len = 2): k3 = e^x - x - 1 with x = ℓgen - ℓθ = (1, 0): (e - 2 + 0) / 2 =
# 0.359141
TOKEN_WEIGHTS = [[1.0, 2.0, math.exp(-0.3)], [math.exp(-1.0), 1.0, 0.0]]
TOKEN_STATISTIC = (math.e - 2.0) / 2

# Sequence level, by hand: s_i = mean_t(ℓθ - ℓgen) = (0 + 1 - 0.3) / 3 = 0.233333 and (-1 + 0) / 2 = -0.5;
# w_i = exp(s_i) (both below C = 2); statistic of row 1: e^0.5 - 0.5 - 1 = 0.148721
SEQUENCE_WEIGHTS = [[math.exp(0.7 / 3)] * 3, [math.exp(-0.5)] * 2 + [0.0]]
SEQUENCE_STATISTIC = math.exp(0.5) - 1.5


def normalisers(loss_type):
    """N_i of each completion for `loss_type`, by hand: B = 2 completions, 5 tokens, max_completion_length 4."""
    lengths = [3, 2]
    if loss_type in ("grpo", "sapo"):  # mean over completions of each completion's token mean
        return [2 * n for n in lengths]
    if loss_type in ("bnpo", "dapo", "cispo", "vespo"):  # tokens (dapo/cispo/vespo: of the generation batch)
        return [5, 5]
    if loss_type == "dr_grpo":  # B x max_completion_length
        return [2 * MAX_COMPLETION_LENGTH] * 2
    if loss_type == "luspo":  # sum over tokens, mean over completions
        return [2, 2]
    raise AssertionError(loss_type)


def test_every_trl_loss_type_is_covered():
    """The loss types TRL's GRPOConfig lists ("Supported values are ...") are exactly those F-TIS handles."""
    import re

    from trl import GRPOConfig

    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    listed = help_text.split("Supported values are", 1)[1].split(".", 1)[0]
    assert set(re.findall(r"'([a-z_]+)'", listed)) == set(LOSS_TYPES)


@pytest.fixture
def trainer_for(tokenizer, make_args, monkeypatch):
    """A trainer whose learner log-probs are the leaf tensor `ℓθ` (LEARNER), returned with it."""

    def make(**overrides):
        args = make_args(
            max_completion_length=MAX_COMPLETION_LENGTH,
            gradient_accumulation_steps=1,
            per_device_train_batch_size=8,
            num_generations=8,
            **overrides,
        )
        trainer = tiny_trainer(tokenizer, args, train_size=16)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop during train()
        learner = torch.tensor(LEARNER, requires_grad=True)

        def fake_logps(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            return learner, torch.zeros_like(learner), None

        monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", fake_logps)
        return trainer, learner

    return make


def loss_gradient(trainer, learner):
    mask = torch.tensor(MASK)
    batch = {
        "prompt_ids": torch.full((2, 2), 5),
        "prompt_mask": torch.ones(2, 2, dtype=torch.long),
        "completion_ids": torch.full((2, 3), 6),
        "completion_mask": mask,
        "advantages": torch.tensor(ADVANTAGES),
        "num_items_in_batch": mask.sum(),
        "ftis_gen_logps": torch.tensor(GENERATOR),
        "ftis_gen_valid": torch.tensor([False, True]),  # row 0 is the learner's own (ℓgen = ℓold)
        "ftis_group_max_len": torch.tensor([3, 2]),
        "ftis_source": torch.tensor([0, 1]),
    }
    trainer._ledger.add_sources(["peer"])
    loss = trainer._compute_loss(trainer.model, batch)
    (gradient,) = torch.autograd.grad(loss, learner)
    return gradient


def expected_gradient(loss_type, weights, keep, *, c=1.0):
    # The own row is on-policy: weight 1 on every token whatever the level (ℓθ = ℓold = ℓgen).
    weights = [[1.0, 1.0, 1.0], weights[1]]
    advantages = [ADVANTAGES[0], ADVANTAGES[1] if keep else 0.0]
    norm = normalisers(loss_type)
    return torch.tensor(
        [[-c * weights[i][t] * advantages[i] / norm[i] * MASK[i][t] for t in range(3)] for i in range(2)]
    )


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("filtered", [False, True])
def test_ftis_gradient_for_every_loss_type_and_level(trainer_for, loss_type, level, filtered):
    weights, statistic = (
        (TOKEN_WEIGHTS, TOKEN_STATISTIC) if level == "token" else (SEQUENCE_WEIGHTS, SEQUENCE_STATISTIC)
    )
    # A threshold just below or just above the peer row's statistic: filtered (negative advantage) or kept.
    threshold = statistic * (0.9 if filtered else 1.1)
    overrides = {"loss_type": loss_type, "importance_sampling_level": level, "kl_threshold": threshold}
    if loss_type == "cispo":
        overrides["epsilon_high"] = 5.0  # CISPO's ε_max (ScaleRL); with TRL's default ε_high = 0.2 c would be 0.2
    trainer, learner = trainer_for(**overrides)

    gradient = loss_gradient(trainer, learner)

    torch.testing.assert_close(
        gradient, expected_gradient(loss_type, weights, keep=not filtered), rtol=1e-5, atol=1e-7
    )
    assert trainer._metrics["train"]["ftis/peer/filtered_frac"][-1] == (1.0 if filtered else 0.0)


def test_cispo_keeps_trls_clipped_weight(trainer_for):
    """CISPO multiplies by sg(min(R, ε_high)): with TRL's default ε_high (= ε = 0.2) every token's gradient is 0.2
    times the F-TIS one, exactly as without F-TIS."""
    trainer, learner = trainer_for(loss_type="cispo", kl_threshold=1e9)
    gradient = loss_gradient(trainer, learner)
    torch.testing.assert_close(
        gradient, expected_gradient("cispo", TOKEN_WEIGHTS, keep=True, c=0.2), rtol=1e-5, atol=1e-7
    )


def test_filter_mode_remove_rescales_for_every_normaliser(trainer_for):
    """`filter_mode="remove"`: the filtered peer row leaves the normaliser too. Per completion (grpo, sapo, luspo,
    dr_grpo) the kept row's gradient doubles (2 rows -> 1); per token (bnpo, dapo, cispo, vespo) it grows by 5/3."""
    for loss_type in LOSS_TYPES:
        overrides = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
        trainer, learner = trainer_for(loss_type=loss_type, kl_threshold=0.1, filter_mode="remove", **overrides)
        gradient = loss_gradient(trainer, learner)
        scale = 5 / 3 if loss_type in ("bnpo", "dapo", "cispo", "vespo") else 2.0
        expected = expected_gradient(loss_type, TOKEN_WEIGHTS, keep=False) * scale
        torch.testing.assert_close(gradient, expected, rtol=1e-5, atol=1e-7, msg=loss_type)


# --------------------------------------------------------------------------------------------------------------------
# The sequence-level pure functions
# --------------------------------------------------------------------------------------------------------------------
def test_sequence_level_weight_and_statistic_by_hand():
    learner, generator, mask = torch.tensor(LEARNER), torch.tensor(GENERATOR), torch.tensor(MASK)
    torch.testing.assert_close(sequence_log_ratio(learner, generator, mask), torch.tensor([0.7 / 3, -0.5]))
    torch.testing.assert_close(sequence_truncated_weights(learner, generator, mask), torch.tensor(SEQUENCE_WEIGHTS))
    statistic = sequence_filter_statistic(learner, generator, mask)
    torch.testing.assert_close(statistic, torch.tensor([math.exp(-0.7 / 3) + 0.7 / 3 - 1, SEQUENCE_STATISTIC]))
    # The cap: a completion 1 nat a token more likely under the learner gets min(e, 2) = 2 on every token.
    capped = sequence_truncated_weights(torch.tensor([[-1.0, -1.0]]), torch.tensor([[-2.0, -2.0]]), torch.ones(1, 2))
    torch.testing.assert_close(capped, torch.tensor([[2.0, 2.0]]))


def test_sequence_level_extremes_are_finite_or_filtered():
    mask = torch.ones(1, 2)
    # The learner finds the completion impossible: weight 0, statistic +inf (filtered at any threshold).
    weight = sequence_truncated_weights(torch.tensor([[-math.inf, -1.0]]), torch.tensor([[-1.0, -1.0]]), mask)
    assert weight.tolist() == [[0.0, 0.0]]
    statistic = sequence_filter_statistic(torch.tensor([[-math.inf, -1.0]]), torch.tensor([[-1.0, -1.0]]), mask)
    assert statistic.item() == math.inf
    # An unscorable token (NaN): weight 0 and a NaN statistic, which the filter treats as too far.
    nan = torch.tensor([[math.nan, -1.0]])
    assert sequence_truncated_weights(nan, torch.tensor([[-1.0, -1.0]]), mask).tolist() == [[0.0, 0.0]]
    assert math.isnan(sequence_filter_statistic(nan, torch.tensor([[-1.0, -1.0]]), mask).item())


# --------------------------------------------------------------------------------------------------------------------
# End to end: real peer rows, every loss type, both levels
# --------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_peer_rows(tokenizer, tmp_path_factory):
    """16 rows sampled by a hidden-32 model sharing the learner's tokenizer (a different model: weights != 1)."""
    from trl_ftis.demo.tiny import tiny_grpo_config

    args = tiny_grpo_config(str(tmp_path_factory.mktemp("peer")), max_steps=1, per_device_train_batch_size=16)
    peer = tiny_trainer(tokenizer, args, hidden_size=32, seed=7, train_size=16)
    published = []
    peer.add_row_listener(published.append)
    peer.train()
    rows = [row for batch in published for row in batch]
    for row in rows:
        row.sender = "small"
    return without_control_tokens(rows, tokenizer)  # as a trained model writes them (tiny_trainers.py)


@pytest.mark.parametrize(
    "loss_type, level", [(t, "token") for t in LOSS_TYPES] + [("grpo", "sequence"), ("luspo", "sequence")]
)
def test_training_on_peer_rows_works_with_every_loss_type(tokenizer, make_args, real_peer_rows, loss_type, level):
    """Two updates per batch (`num_iterations=2`, so the second sees ratios != 1) on own and peer rows: finite losses,
    the weights and the filter statistic logged, the model changed."""
    args = make_args(
        max_steps=1,
        num_iterations=2,
        loss_type=loss_type,
        importance_sampling_level=level,
        epsilon_high=5.0 if loss_type == "cispo" else None,
    )
    trainer = tiny_trainer(tokenizer, args, train_size=16)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.add_peer_rows(real_peer_rows)
    trainer.train()
    entries = [e for e in trainer.state.log_history if "loss" in e]
    assert entries and all(math.isfinite(e["loss"]) for e in entries)
    assert entries[-1]["ftis/peer_rows"] == len(real_peer_rows)
    assert 0 < entries[-1]["ftis/peer/is_weight_mean"] <= 2.0 and entries[-1]["ftis/peer/kl_mean"] > 0
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
