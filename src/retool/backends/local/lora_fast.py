"""A leaner forward for PEFT's LoRA linear layers during training.

PEFT computes ``base(x) + lora_B(lora_A(dropout(x))) * scaling``: two extra
full-size temporaries per adapted module (the product and the scaled copy), in
the forward and again in the backward pass. With no dropout and one active
adapter the same value is ``addmm(base(x), x @ A.T, B.T, alpha=scaling)``: one
fused kernel, no temporaries. Only the ``forward`` of each layer instance is
replaced, so PEFT's saving, loading and merging are untouched; any other
configuration falls back to PEFT's own forward.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F


def _lean_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    active = self.active_adapters
    if self.disable_adapters or self.merged or len(active) != 1 or args or kwargs:
        return self._retool_peft_forward(x, *args, **kwargs)
    name = active[0]
    if name not in self.lora_A or not isinstance(self.lora_dropout[name], torch.nn.Identity):
        return self._retool_peft_forward(x, *args, **kwargs)
    a = self.lora_A[name].weight
    b = self.lora_B[name].weight
    base = self.base_layer(x)
    # Under autocast F.linear casts x itself (to bf16): a cast to a's float32 first would
    # only copy the activations twice.
    low = F.linear(x if torch.is_autocast_enabled(x.device.type) else x.to(a.dtype), a)
    flat = torch.addmm(
        base.reshape(-1, base.shape[-1]),
        low.reshape(-1, low.shape[-1]),
        b.T,
        alpha=self.scaling[name],
    )
    return flat.view(base.shape)


def use_lean_lora_forward(model: torch.nn.Module) -> int:
    """Patch every PEFT LoRA ``Linear`` in ``model``; returns how many were patched."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is LoraLinear and not hasattr(module, "_retool_peft_forward"):
            # torch types module attributes as Tensor | Module; these are methods
            module._retool_peft_forward = module.forward  # type: ignore[assignment]
            module.forward = types.MethodType(_lean_forward, module)  # type: ignore[method-assign]
            count += 1
    return count
