"""The tiny local models: one character tokenizer, several decoder families."""

import pytest
import torch

from trl_ftis.demo.tiny import TINY_ARCHITECTURES, build_char_tokenizer, build_tiny_causal_lm, build_tiny_llama


@pytest.mark.parametrize("architecture", TINY_ARCHITECTURES)
def test_each_architecture_builds_for_the_shared_tokenizer_and_generates(architecture):
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(tokenizer, architecture, hidden_size=32, seed=3)
    assert model.config.model_type == architecture
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer("12+34=", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= ids["input_ids"].shape[1] + 4 and int(out.max()) < len(tokenizer)
    again = build_tiny_causal_lm(tokenizer, architecture, hidden_size=32, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))  # seeded


def test_llama_is_the_same_model_as_build_tiny_llama():
    tokenizer = build_char_tokenizer()
    a, b = build_tiny_causal_lm(tokenizer, "llama", seed=1), build_tiny_llama(tokenizer, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(ValueError, match="Unknown architecture 'gpt9'.*llama, qwen2, mistral, gemma2"):
        build_tiny_causal_lm(build_char_tokenizer(), "gpt9")
