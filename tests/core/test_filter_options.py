"""The filter's options in a real trainer: `filter_mode="remove"` and `kl_threshold_mode="quantile"`."""

import pytest
from tiny_trainers import tiny_trainer  # tests/ is on sys.path
from transformers import TrainerCallback

from trl_ftis import PeerRow


class ConfidentPeer(TrainerCallback):
    """Adds, before every step, two groups of 8 rows from a "peer" that was sure of every token (log-prob -0.01):
    rewards 0..7 in each group, so half of them have a negative advantage, and far from this learner."""

    def __init__(self, tokenizer):
        self.tokenizer, self.trainer = tokenizer, None

    def on_step_begin(self, args, state, control, **kwargs):
        rows = []
        for group, prompt in enumerate(("12+34=", "51+27=")):
            for k in range(8):
                ids = self.tokenizer(str(40 + k), add_special_tokens=False)["input_ids"] + [
                    self.tokenizer.eos_token_id
                ]
                rows.append(PeerRow(prompt, ids, [-0.01] * len(ids), float(k), (state.global_step, group), "peer"))
        self.trainer.add_peer_rows(rows)


def run(tokenizer, make_args, **overrides):
    args = make_args(max_steps=3, variant="f-tis", trust_peer_rewards=True, logging_steps=1, seed=3, **overrides)
    trainer = tiny_trainer(tokenizer, args)
    peer = ConfidentPeer(tokenizer)
    peer.trainer = trainer
    trainer.add_callback(peer)
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def test_remove_mode_changes_the_update_only_when_rows_are_filtered(tokenizer, make_args):
    zero, remove = (run(tokenizer, make_args, kl_threshold=1e-6, filter_mode=mode) for mode in ("zero", "remove"))
    assert zero[0]["ftis/peer/filtered_frac"] == remove[0]["ftis/peer/filtered_frac"] > 0
    # Same batch, same filtered rows: the survivors weigh more when the filtered ones leave the normaliser.
    assert remove[0]["grad_norm"] > zero[0]["grad_norm"]
    unfiltered = [run(tokenizer, make_args, kl_threshold=1e9, filter_mode=m)[0] for m in ("zero", "remove")]
    assert unfiltered[0]["ftis/peer/filtered_frac"] == 0 and unfiltered[0]["grad_norm"] == unfiltered[1]["grad_norm"]


def test_quantile_mode_moves_the_threshold_to_filter_the_target_share(tokenizer, make_args):
    logs = run(tokenizer, make_args, kl_threshold_mode="quantile", filter_target_fraction=0.5, kl_threshold=1e9)
    thresholds = [entry["ftis/kl_threshold"] for entry in logs]
    assert thresholds[0] == 1e9  # the starting value, until peer rows were seen
    assert thresholds[-1] < 1e3  # then the running quantile of what the peer rows look like
    # Half of the peer's negative rows (a quarter of its rows) filtered, give or take the running average's lag.
    assert 0.05 <= logs[-1]["ftis/peer/filtered_frac"] <= 0.5


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"filter_mode": "drop"}, "filter_mode"),
        ({"kl_threshold_mode": "auto"}, "kl_threshold_mode"),
        ({"filter_target_fraction": 1.0}, "filter_target_fraction"),
        ({"threshold_momentum": 1.0}, "threshold_momentum"),
    ],
)
def test_config_refuses_bad_filter_options(make_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_args(**overrides)
