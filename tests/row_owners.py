"""Helpers for the unit tests of the trainer's owners (ledger, admission, round runner), which build no trainer: the
config they read as a plain namespace, a counting prompt renderer, and the admission wired to them."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from trl_ftis.swarm.admission import DROP_REASONS, STRIP_REASONS, Admission
from trl_ftis.swarm.ledger import PeerRowLedger
from trl_ftis.swarm.scoring import RewardScorer


def config(**overrides):
    """The fields the admission and the round runner read, at FTISConfig's defaults (max_completion_length 6 as the
    tiny config's)."""
    settings = dict(
        cross_tokenizer=False,
        text_level_peer_rows=False,
        require_known_prompts=False,
        trust_peer_rewards=False,
        max_completion_length=6,
        exchange_mode="sync",
        collaboration_mode="vertical",
        max_peer_rows=None,
        max_peer_ratio=None,
        max_staleness=2,
        generation_batch_size=8,
    )
    settings.update(overrides)
    return SimpleNamespace(**settings)


class Renderer:
    """Renders plain prompts as their characters' ids and chat prompts as "Q:<content>A:" (what the tiny chat
    template does), recording each call; a prompt containing "boom" makes the call raise, like a refusing template."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __call__(self, prompts):
        self.calls.append(list(prompts))
        if any("boom" in str(prompt) for prompt in prompts):
            raise ValueError("the template refuses this prompt")
        texts = [p if isinstance(p, str) else "".join(f"Q:{m['content']}" for m in p) + "A:" for p in prompts]
        return [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def digit_reward(completions, answer, **kwargs):
    """1.0 when the completion is the `answer` column."""
    return [1.0 if completion == expected else 0.0 for completion, expected in zip(completions, answer, strict=True)]


def admission(tokenizer, *, reward_funcs=(digit_reward,), dataset=None, context_length=None, **settings):
    """An `Admission` on `tokenizer` with a fresh ledger, a `Renderer` and a scorer of `reward_funcs`."""
    ledger = PeerRowLedger(DROP_REASONS, STRIP_REASONS)
    scorer = RewardScorer(
        tokenizer=tokenizer,
        reward_funcs=list(reward_funcs),
        reward_processing_classes=[None] * len(reward_funcs),
        reward_func_names=[f.__name__ for f in reward_funcs],
        reward_weights=torch.ones(len(reward_funcs)),
    )
    return Admission(
        config=config(**settings),
        tokenizer=tokenizer,
        render=Renderer(tokenizer),
        ledger=ledger,
        vocab_limit=len(tokenizer),
        context_length=context_length,
        has_chat_template=True,
        eos_token_id=tokenizer.eos_token_id,
        scorer=scorer,
        dataset=dataset,
    )
