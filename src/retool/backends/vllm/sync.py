"""The trainer's weights, in the form a vLLM engine loads them.

Two ways the policy reaches the engine after an optimizer step (``sampler.sync``):

* ``lora``: the trainer saves its PEFT adapter directory
  (``save_weights_for_sampler``); the engine loads it as a new ``LoRARequest``
  named ``policy-step-N`` and drops the previous one. Only the adapter moves
  (a few MB), but on CPU vLLM runs LoRA without graph capture and with extra
  kernels per layer (64-76 tok/s against 247 without an adapter on SmolLM2:
  docs/measurements.md, "Facts the code cites").
* ``merged``: the merged weights ``W + scale * B @ A`` (PEFT's own
  ``get_delta_weight``) replace the engine's in place through vLLM's
  ``reload_weights`` (the same ``load_weights`` a checkpoint load runs, so
  stacked ``qkv_proj``/``gate_up_proj`` are filled from our HF names). The
  whole model moves every step, but sampling runs at the base model's speed.

The engine starts from a directory :func:`export_model` writes: the causal
LM's config, tokenizer and safetensors, the adapters left out (``lora``) or
merged in (``merged``). That is also what makes ``tiny-random`` (weights drawn
from a seed, never on disk) and GGUF models (dequantised by transformers)
loadable by vLLM, which reads neither.

Nothing this module writes is ever half there: :func:`export_model` writes
into a temporary sibling and renames it into place (a failure, a full disk or
an interrupt removes it), and :func:`remove_adapter` deletes a published
adapter together with the ``checkpoints/sampler`` directory when that is left
empty, so a run that fails before its first step leaves only the skeleton the
CLI removes (``run_dir_rollback``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from retool.data.files import write_failure
from retool.errors import BackendError

if TYPE_CHECKING:  # torch and transformers load when a sampler starts, not on import
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel

    from retool.types import Tokenizer

LORA_MARK = ".lora_"  # PEFT adapter parameters: never sent to the engine


def causal_lm(model: PeftModel | PreTrainedModel) -> PreTrainedModel:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    get_base_model = getattr(model, "get_base_model", None)
    lm = get_base_model() if get_base_model is not None else model
    return cast("PreTrainedModel", lm)  # PeftModel.get_base_model(): the model it wraps


def _lora_layers(lm: torch.nn.Module) -> dict[str, Any]:
    """``{module name: PEFT LoRA layer}`` for every adapted linear layer."""
    return {name: m for name, m in lm.named_modules() if hasattr(m, "lora_A")}


def iter_weights(
    model: PeftModel | PreTrainedModel, merged: bool, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, tensor)`` of every weight of the causal LM, detached (views where possible).

    ``merged`` adds each LoRA layer's delta to its base weight (in float32,
    rounded once to ``dtype``); otherwise the base weight is sent as it is.
    A tied output head is left out: the engine ties it to the embeddings itself.
    """
    import torch

    lm = causal_lm(model)
    layers = _lora_layers(lm)
    tied = bool(getattr(lm.config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if LORA_MARK in name or (tied and name == "lm_head.weight"):
                continue
            module_name, _, leaf = name.rpartition(".")
            if module_name.endswith(".base_layer"):
                owner = module_name[: -len(".base_layer")]
                layer = layers.get(owner)
                value = param.detach()
                if merged and layer is not None and leaf == "weight":
                    adapter = layer.active_adapters[0]
                    value = value.float() + layer.get_delta_weight(adapter).float()
                name = f"{owner}.{leaf}"
            else:
                value = param.detach()
            if dtype is not None and value.dtype != dtype:
                value = value.to(dtype)
            yield name, value.contiguous()


def export_model(
    model: PeftModel | PreTrainedModel,
    tokenizer: Tokenizer,
    target: Path,
    merged: bool,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an HF model directory vLLM can start from (config, tokenizer, safetensors).

    All or nothing: the files go to a temporary sibling renamed to ``target``
    at the end (replacing a previous export); a failure removes it and raises
    :class:`BackendError` naming ``target`` when the disk refused a write.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    lm = causal_lm(model)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    except OSError as exc:
        raise BackendError(write_failure(target, "vLLM's model export", exc)) from None
    try:
        state = {name: tensor.cpu() for name, tensor in iter_weights(model, merged, dtype)}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del state
        config = lm.config.to_dict()
        if dtype is not None:
            config["torch_dtype"] = str(dtype).removeprefix("torch.")
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        generation = getattr(lm, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BackendError(write_failure(target, "vLLM's model export", exc)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def remove_empty_dir(path: Path) -> None:
    """Remove ``path`` if it is an empty directory (a run's ``checkpoints/vllm``)."""
    with contextlib.suppress(OSError):
        path.rmdir()


def remove_adapter(path: Path) -> None:
    """Delete an adapter directory saved for a sampler, and its parent if left empty.

    The parent is the trainer's ``checkpoints/sampler``: kept while it holds a
    sampler checkpoint (or the next adapter), removed when this was the last
    entry, so a run that stops before its first step holds only its skeleton.
    """
    shutil.rmtree(path, ignore_errors=True)
    remove_empty_dir(path.parent)


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    return rank
