"""The one generation loop of the task evaluations: stop tokens, truncation, prompt order, sampling, restored state."""

import torch

from trl_ftis.demo.tiny import PRINTABLE_ALPHABET, SYSTEM_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama
from trl_ftis.tasks.generation import Completion, default_stop_ids, generate_completions, render_prompt


def test_completions_stop_at_the_first_stop_token_and_keep_prompt_order(scripted_lm):
    tokenizer = build_char_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    eos, plus = tokenizer.eos_token_id, ids("+")
    replies = {
        "1": [ids("4"), ids("2"), eos],  # "42" then EOS
        "2": [ids("7"), plus, ids("9")],  # "+" is a stop id here
        "3": [ids("5")] * 10,  # never stops
    }
    model = scripted_lm(tokenizer, lambda prompt: replies[prompt[-1]])
    tokenizer.padding_side = "right"
    prompts = ["1", "22", "333", "1"]
    completions = generate_completions(
        model, tokenizer, prompts, max_new_tokens=6, batch_size=2, stop_ids=[eos, plus], sort_by_length=True
    )
    assert completions == [
        Completion("42", 3, False),
        Completion("7", 2, False),
        Completion("555555", 6, True),
        Completion("42", 3, False),
    ]
    assert model.calls == [["333", "22"], ["1", "1"]]  # longest first, results in prompt order
    assert tokenizer.padding_side == "right" and model.training  # both restored


def test_default_stop_ids_join_the_tokenizer_and_the_model(scripted_lm):
    tokenizer = build_char_tokenizer()
    model = scripted_lm(tokenizer, reply=None)
    model.generation_config.eos_token_id = [7, tokenizer.eos_token_id]
    assert default_stop_ids(tokenizer, model) == [tokenizer.eos_token_id, 7]
    assert default_stop_ids(tokenizer) == [tokenizer.eos_token_id]


def test_conversations_go_through_the_chat_template():
    tokenizer = build_char_tokenizer(SYSTEM_CHAT_TEMPLATE, alphabet=PRINTABLE_ALPHABET)
    messages = [{"role": "user", "content": "1+1?"}]
    assert render_prompt(tokenizer, messages) == "User: 1+1?\nAssistant: "
    assert render_prompt(tokenizer, "raw text") == "raw text"


def test_sampling_is_seeded_and_gives_num_samples_a_prompt():
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1)
    prompts = ["12+34=", "5+6=", "70+8="]
    state = torch.random.get_rng_state()
    kwargs = {"max_new_tokens": 4, "batch_size": 2, "do_sample": True, "num_samples": 3, "seed": 1}
    first = generate_completions(model, tokenizer, prompts, **kwargs)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    assert len(first) == 9 and all(1 <= c.n_tokens <= 4 for c in first)
    assert generate_completions(model, tokenizer, prompts, **kwargs) == first
    greedy = generate_completions(model, tokenizer, prompts, max_new_tokens=4, batch_size=2)
    assert len(greedy) == 3 and model.training
