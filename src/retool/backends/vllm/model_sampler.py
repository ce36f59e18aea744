"""vLLM sampling one saved model as it is: what ``retool eval`` and ``train.eval_every`` open.

A training run's engine follows a trainer (:class:`~retool.backends.vllm.engine.VllmPolicySampler`);
an evaluation samples fixed weights, so :func:`open_model_sampler` starts one
in-process :class:`~retool.backends.vllm.engine.VllmEngine` from an HF
directory and hands back a :class:`VllmModelSampler`: the same
:class:`~retool.types.SamplingClient` (token ids in, token ids, logprobs and
stop reason out, per-request ``SamplingParams.seed``) the local sampler is, so
the evaluation runner (its result rows, its resume by problem) does not know
which engine sampled.

vLLM reads HF directories only. What ``--model`` resolves to
(:mod:`retool.evaluation.models`) reaches it so:

* an HF directory, or merged saved sampler weights (``retool_sampler.json``
  with ``merged: true``, an HF directory too): loaded where it is, nothing written;
* saved sampler weights holding a LoRA adapter, an alias (SmolLM2 ships as
  GGUF), a ``.gguf`` file: loaded as the local backend loads them (the
  adapter merged into its base), then written by
  :func:`~retool.backends.vllm.sync.export_model` to a temporary directory
  under ``work_root`` that :meth:`VllmModelSampler.close` deletes.

vLLM's CPU kernels refuse attention heads narrower than 32 (``tiny-random``
has 16) at the first forward, which would kill the engine mid-evaluation:
:func:`check_head_size` refuses such a model before anything starts.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from retool.backends.vllm.engine import EngineOptions, VllmEngine, VllmSamplingClient
from retool.backends.vllm.sync import export_model, remove_empty_dir
from retool.errors import ConfigError
from retool.types import Tokenizer

MIN_CPU_HEAD_DIM = 32  # vLLM 0.32's CPU attention kernels: smaller heads are refused
EVAL_VERSION = "eval"  # the version the client expects; fixed weights never move


def model_config(path: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` of an HF directory, or ``None`` (an alias, a GGUF, unreadable)."""
    try:
        data = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def head_dim(config: dict[str, Any]) -> int | None:
    """Attention head width of an HF config (``head_dim``, else hidden / heads)."""
    width = config.get("head_dim")
    if isinstance(width, int) and width > 0:
        return width
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def check_head_size(name: str, config: dict[str, Any] | None, on_gpu: bool) -> None:
    """Refuse, before an engine starts, a model vLLM's CPU kernels cannot run."""
    width = head_dim(config) if config is not None else None
    if not on_gpu and width is not None and width < MIN_CPU_HEAD_DIM:
        raise ConfigError(
            f"{name}: attention heads of {width} dimensions; vLLM on CPU needs "
            f'{MIN_CPU_HEAD_DIM} or more: sample it with sampler.engine = "local"'
        )


def source_config(model_path: str) -> dict[str, Any] | None:
    """The HF config of what ``model_path`` loads (a sampler checkpoint: its base's)."""
    from retool.backends.local.models import TINY_RANDOM_ALIAS, load_tokenizer, tiny_random_config
    from retool.backends.local.service import read_sampler_info

    root = Path(model_path)
    if (root / "retool_sampler.json").is_file():
        base, merged = read_sampler_info(root)
        return model_config(root) if merged else source_config(base)
    if model_path == TINY_RANDOM_ALIAS:
        return dict(tiny_random_config(len(load_tokenizer(model_path))).to_dict())
    return model_config(root)


class VllmModelSampler(VllmSamplingClient):
    """A :class:`VllmSamplingClient` that owns its engine and its exported directory.

    ``close`` ends the engine and deletes the export (idempotent); the
    evaluation closes it in its ``finally``.
    """

    def __init__(
        self, engine: VllmEngine, tokenizer: Tokenizer, export_dir: Path | None, work_root: Path
    ) -> None:
        super().__init__(engine, tokenizer, EVAL_VERSION)
        self.export_dir = export_dir
        self.work_root = work_root
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.engine.close()
        finally:
            _remove_export(self.export_dir, self.work_root)


def _remove_export(export_dir: Path | None, work_root: Path) -> None:
    if export_dir is not None:
        shutil.rmtree(export_dir, ignore_errors=True)
        remove_empty_dir(work_root)


def _loadable(model_path: str, work_root: Path) -> tuple[Path, Path | None, Tokenizer]:
    """(HF directory vLLM starts from, the export to delete or ``None``, tokenizer)."""
    from retool.backends.local.models import load_model, load_tokenizer
    from retool.backends.local.service import read_sampler_info

    root = Path(model_path)
    if (root / "retool_sampler.json").is_file():
        base, merged = read_sampler_info(root)
        tokenizer = load_tokenizer(base)
        if merged:
            return root, None, tokenizer
        from peft import PeftModel

        model = PeftModel.from_pretrained(load_model(base), str(root)).merge_and_unload()
    else:
        tokenizer = load_tokenizer(model_path)
        if root.is_dir() and (root / "config.json").is_file():
            return root, None, tokenizer
        model = load_model(model_path)  # an alias or a GGUF: dequantised, float32
    work_root.mkdir(parents=True, exist_ok=True)
    export_dir = Path(tempfile.mkdtemp(dir=work_root, prefix="vllm-eval-"))
    try:
        export_model(model, tokenizer, export_dir / "model", merged=True)
    except BaseException:
        _remove_export(export_dir, work_root)
        raise
    return export_dir / "model", export_dir, tokenizer


def open_model_sampler(
    model_path: str, options: EngineOptions, work_root: str | Path
) -> VllmModelSampler:
    """One engine sampling ``model_path`` (an alias, HF directory or saved sampler weights).

    ``options.max_model_len`` is lowered to the model's ``max_position_embeddings``
    (vLLM refuses a longer one). Nothing is left behind when the engine does not start.
    """
    import torch

    config = source_config(model_path)
    check_head_size(model_path, config, bool(torch.cuda.is_available()))
    limit = (config or {}).get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < options.max_model_len:
        options = dataclasses.replace(options, max_model_len=limit)
    root = Path(work_root)
    directory, export_dir, tokenizer = _loadable(model_path, root)
    engine = None
    try:
        engine = VllmEngine(directory, options)
        # every sequence then says which weights sampled it, as the rollout checks
        engine.call(lambda llm: llm.llm_engine.set_weight_version(EVAL_VERSION))
    except BaseException:
        if engine is not None:
            engine.close()
        _remove_export(export_dir, root)
        raise
    return VllmModelSampler(engine, tokenizer, export_dir, root)
