"""The trainer's weights, in the form a vLLM engine loads them.

Two ways the policy reaches the engine after an optimizer step (``sampler.sync``):

* ``lora``: the trainer saves its PEFT adapter directory
  (``save_weights_for_sampler``); the engine loads it as a new ``LoRARequest``
  named ``policy-step-N`` and drops the previous one. Only the adapter moves
  (a few MB), but on CPU vLLM runs LoRA without graph capture and with extra
  kernels per layer (ENGINES-NOTES.md: 64-76 tok/s against 247 without).
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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LORA_MARK = ".lora_"  # PEFT adapter parameters: never sent to the engine


def causal_lm(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _lora_layers(lm: Any) -> dict[str, Any]:
    """``{module name: PEFT LoRA layer}`` for every adapted linear layer."""
    return {name: m for name, m in lm.named_modules() if hasattr(m, "lora_A")}


def iter_weights(model: Any, merged: bool, dtype: Any = None) -> Iterator[tuple[str, Any]]:
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


def export_model(model: Any, tokenizer: Any, target: Path, merged: bool, dtype: Any = None) -> Path:
    """Write an HF model directory vLLM can start from (config, tokenizer, safetensors)."""
    from safetensors.torch import save_file

    lm = causal_lm(model)
    target.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.cpu() for name, tensor in iter_weights(model, merged, dtype)}
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = lm.config.to_dict()
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    config.pop("quantization_config", None)
    (target / "config.json").write_text(json.dumps(config, indent=2, default=str))
    generation = getattr(lm, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    return rank
