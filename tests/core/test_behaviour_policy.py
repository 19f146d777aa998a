"""Which log-probs a row carries: those of the distribution that sampled its tokens (after top-k / top-p / min-p),
from transformers' generate, vLLM or a rollout function; what a message says about them; and what a receiver says
when a sender's log-probs cannot be those."""

import logging
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from swarm_helpers import make_swarm, rows, wire_message  # tests/ is on sys.path
from tiny_trainers import tiny_trainer

from trl_ftis import FTISTrainer
from trl_ftis.exchange import ExchangeError, decode_message, encode_message, peek_header
from trl_ftis.exchange.checks import check_sampling
from trl_ftis.generator_logps import records_raw_logits, sampling_warpers


@pytest.mark.parametrize(
    "settings", [{"top_k": 5}, {"top_p": 0.8}, {"top_k": 5, "top_p": 0.8}, {"min_p": 0.2}], ids=str
)
def test_a_sender_records_the_log_probs_of_the_truncated_distribution_it_sampled(tokenizer, make_args, settings):
    trainer = tiny_trainer(tokenizer, make_args(max_steps=1, temperature=0.7, **settings), hidden_size=32)
    model = trainer.model
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    sent = []
    trainer.add_row_listener(sent.extend)
    trainer.train()
    assert trainer.logps_source == "generation" and sent
    model.load_state_dict(start)  # the rows were sampled by the model before its update
    warpers = sampling_warpers(trainer.generation_config)
    for row in sent[:6]:
        prompt = tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + list(row.completion_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
        sampled = torch.log_softmax(warpers(ids, logits), dim=-1)
        expected = sampled.gather(-1, ids[0, len(prompt) :, None])[:, 0]
        full = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        torch.testing.assert_close(torch.tensor(row.generator_logps), expected, atol=1e-4, rtol=0)
        assert (expected >= full - 1e-6).all()  # a truncated distribution gives its tokens more mass


def test_warpers_the_recorder_cannot_replay_make_the_trainer_score_instead():
    from transformers import GenerationConfig

    assert records_raw_logits(GenerationConfig(do_sample=True, top_k=50, top_p=0.9, min_p=0.1))
    assert not records_raw_logits(GenerationConfig(do_sample=True, typical_p=0.9))
    assert not records_raw_logits(GenerationConfig(do_sample=True, epsilon_cutoff=0.01))
    assert len(sampling_warpers(GenerationConfig(top_k=50, top_p=0.9, min_p=0.1))) == 3
    assert len(sampling_warpers(GenerationConfig(top_k=0, top_p=1.0))) == 0


def test_a_message_says_which_log_probs_it_carries_and_how_its_sender_sampled(tokenizer):
    message = wire_message(tokenizer, "a")
    message.sampling = {"logps": "generation", "top_k": 50, "top_p": 0.9, "min_p": 0.0}
    data = encode_message(message)
    assert decode_message(data).sampling == message.sampling
    assert peek_header(data)["sampling"] == message.sampling
    assert decode_message(encode_message(wire_message(tokenizer, "a"))).sampling == {}  # not sent: earlier versions


@pytest.mark.parametrize(
    "sampling",
    [
        {"logps": "vllm", "top_k": 0, "top_p": 1.0, "min_p": 0.0},
        {"logps": "sampler", "top_k": -1, "top_p": 1.0, "min_p": 0.0},
        {"logps": "sampler", "top_k": 0, "top_p": 0.0, "min_p": 0.0},
        {"logps": "sampler", "top_k": 0, "top_p": 1.0, "min_p": 1.5},
        {"logps": "sampler", "top_k": 0, "top_p": 1.0},
        {"logps": "sampler", "top_k": 0, "top_p": 1.0, "min_p": 0.0, "more": 1},
        {"logps": "sampler", "top_k": True, "top_p": 1.0, "min_p": 0.0},
        ["sampler"],
    ],
    ids=range(8),
)
def test_a_malformed_sampling_header_is_refused(tokenizer, sampling):
    with pytest.raises(ExchangeError) as refused:
        check_sampling(sampling, "a")  # what decoding a received header runs
    assert refused.value.reason == "header"
    if isinstance(sampling, dict):  # and a sender's own encoding refuses it too
        message = wire_message(tokenizer, "a")
        message.sampling = sampling
        with pytest.raises(ExchangeError):
            encode_message(message)


def test_a_receiver_says_when_a_senders_log_probs_are_not_the_distribution_it_sampled(tokenizer, tmp_path, caplog):
    url = f"dir://{tmp_path / 'x'}"
    biased = make_swarm(url, "biased", tokenizer)
    biased.sampling = {"logps": "trainer", "top_k": 50, "top_p": 1.0, "min_p": 0.0}
    fine = make_swarm(url, "fine", tokenizer)
    fine.sampling = {"logps": "generation", "top_k": 50, "top_p": 1.0, "min_p": 0.0}
    me = make_swarm(url, "me", tokenizer, peer_timeout=0.0)
    for round in range(2):
        biased.publish(rows("biased"), round)
        fine.publish(rows("fine"), round)
    with caplog.at_level(logging.WARNING, logger="trl_ftis.swarm.client"):
        taken = [row.sender for round in range(2) for row in me.collect(round).rows]
    assert taken.count("biased") == taken.count("fine") > 0  # kept: said, not dropped
    said = [r.getMessage() for r in caplog.records if "full softmax" in r.getMessage()]
    assert len(said) == 1 and "'biased'" in said[0] and "top_k=50" in said[0]


def test_a_rollout_functions_log_probs_travel_as_the_samplers(tokenizer, make_args, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL's notice that rollout_func is experimental

    def rollout(prompts, trainer):
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = [[8 + k % 3, 9, tokenizer.eos_token_id] for k in range(len(prompts))]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[-0.3, -0.2, -0.1]] * len(prompts),
        }

    trainer = tiny_trainer(tokenizer, make_args(max_steps=1), hidden_size=32, rollout_func=rollout)
    sent = []
    trainer.add_row_listener(sent.extend)
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.logps_source == "sampler"
    assert sent and all(list(row.generator_logps) == pytest.approx([-0.3, -0.2, -0.1]) for row in sent)


def test_trls_rollout_dispatch_works_on_a_trainer_built_without_init():
    # TRL's own TestGRPORolloutDispatch builds trainers with object.__new__ and calls `_generate`.
    trainer = object.__new__(FTISTrainer)
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True, gather=lambda t: t)
    trainer.args = SimpleNamespace(report_to=[])
    trainer.model = SimpleNamespace(training=True)
    trainer.state = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
    trainer._last_loaded_step, trainer.use_vllm, trainer.use_transformers_continuous_batching = 1, False, False
    trainer.processing_class = SimpleNamespace(batch_decode=MagicMock(return_value=["decoded"]))
    trainer._tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    trainer.tools = None
    trainer.rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2]]})
    with pytest.raises(ValueError, match="rollout_func must return keys"):
        trainer._generate(["prompt"])


def test_tools_and_an_exchange_are_refused_together(tokenizer, make_args):
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        return a + b

    with pytest.raises(ValueError, match="exchange_url with tools or environment_factory"):
        tiny_trainer(tokenizer, make_args(exchange_url="memory://tools", peer_id="me"), tools=[add])
