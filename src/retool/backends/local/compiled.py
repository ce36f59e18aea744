"""``model.compile``: the trainer's element-wise work fused by ``torch.compile``.

Why. Under a bf16 trainer the decoder's products get about 3x faster on an
AMX or AVX-512 BF16 CPU, but the element-wise operators around them do not:
RMSNorm's ``pow``/``mean``/``rsqrt``/``mul``, the MLP's ``silu(gate) * up``,
the residual adds and the casts between the float32 residual stream and the
bf16 products each read and write whole activations, forward and backward,
and cost about as much as in float32 (a profile of one ``forward_backward``
on an AMX host, docs/measurements.md, "From the README: the local
backend": about 2.2 of 5.5 s). Inductor
fuses each module's chain into one loop over the activations and keeps the
intermediates in float32 registers.

What is compiled. In every decoder layer the MLP and the two RMSNorms, and the
final norm: modules whose forward takes only the hidden states. One compiled
function per module class, with dynamic shapes, serves every layer, batch and
length (the parameters are graph inputs), so a process compiles each class a
few times in all (size-1 rows are a graph of their own) and never per step.
Attention is left eager: on the shared-prefix path (``forward.py``) its
forward receives the KV cache, whose per-layer guards recompiled once per
layer until dynamo's limit of 8 (measured 2026-12-03), after which the rest
ran uncompiled anyway.

Measured (2026-12-03, 2-core AMD EPYC, AVX-512 BF16, no AMX, torch 2.13 CPU,
SmolLM2-135M LoRA r=16, 4 datums sharing a 180-token prefix, 8 calls each,
two alternating runs): a bf16 ``forward_backward`` 289-305 tok/s eager
against 404-454 compiled (about 1.45x), float32 246 eager against 272
compiled (1.1x, within the calls' spread). Logprobs against an eager
float32 forward: float32 compiled within 2.3e-5 (the 1e-4 contract holds);
bf16 compiled mean error 0.046 as bf16 eager, and the gradient's relative
error against float32 0.054 against eager bf16's 0.117 (the fused loops
keep float32 intermediates). Compiling costs 5-20 s once per process
(inductor's on-disk cache makes later processes cheaper).

When. ``auto`` (the default): on when the trainer runs bf16 and a compiler
is present (a C++ compiler on CPU, Triton on CUDA); off for float32, where
it buys 1.1x for seconds of compile in every process. ``on``: compile
whatever the dtype (an error at start when no compiler is found). ``off``.

Safety. The compiled functions are built and run once at trainer start
(:func:`prepare`: :func:`warm_up`, forward and backward, under the trainer's
autocast), so a compiler that fails does so before any step: the trainer
then warns, runs those modules eagerly (the same values) and records why. A
later graph (a shape class the warm-up did not meet) that fails to compile in
the forward pass falls back the same way for that call and every later one; a
failure while compiling a backward pass is not caught (none has been seen).
Sampling snapshots (deep copies of the trainer's model) drop the patch
(:func:`strip`): the sampler keeps its own eager decode path.
"""

from __future__ import annotations

import os
import shutil
import types
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

REQUESTS = ("auto", "on", "off")
LAYER_PARTS = ("mlp", "input_layernorm", "post_attention_layernorm")
_COMPILED: dict[type, Any] = {}  # module class -> its compiled forward
_FAILED: list[str] = []  # the first compile failure in this process, if any


@dataclass(frozen=True)
class CompileChoice:
    """Whether the trainer's element-wise modules run compiled, and why."""

    requested: str  # model.compile as configured
    enabled: bool
    reason: str  # one phrase for logs, ``numerics.json`` and ``retool doctor``

    def summary(self) -> str:
        return f"compile {'on' if self.enabled else 'off'} ({self.reason})"


def compiler_missing(device: str) -> str | None:
    """Why ``torch.compile`` cannot build kernels for ``device`` here, or None."""
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python"
    if device.startswith("cuda"):
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed"
    wanted = os.environ.get("CXX") or "g++"
    for name in (wanted, "c++", "clang++"):
        if shutil.which(name):
            return None
    return f"no C++ compiler ({wanted}, c++ or clang++) on PATH"


def resolve_compile(requested: str, trainer_dtype: str, device: str = "cpu") -> CompileChoice:
    """The choice for ``model.compile = requested`` with a trainer in ``trainer_dtype``."""
    if requested not in REQUESTS:
        raise ValueError(f"compile must be one of {', '.join(REQUESTS)}, got {requested!r}")
    if requested == "off":
        return CompileChoice(requested, False, "model.compile = off")
    missing = compiler_missing(device)
    if requested == "on":
        if missing:
            return CompileChoice(requested, False, f"model.compile = on, but {missing}")
        return CompileChoice(requested, True, "model.compile = on")
    if trainer_dtype != "bfloat16":
        return CompileChoice(requested, False, f"auto: trainer {trainer_dtype}")
    if missing:
        return CompileChoice(requested, False, f"auto: {missing}")
    return CompileChoice(requested, True, "auto: bf16 trainer")


def _compiled_forward(cls: type[torch.nn.Module]) -> Any:
    fn = _COMPILED.get(cls)
    if fn is None:
        fn = _COMPILED[cls] = torch.compile(cls.forward, dynamic=True)
    return fn


def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    if _FAILED:
        return type(self).forward(self, *args, **kwargs)
    try:
        return _compiled_forward(type(self))(self, *args, **kwargs)
    except torch._dynamo.exc.TorchDynamoException as exc:
        # A graph the warm-up did not build (a new shape class) failed to compile. The
        # forward has changed nothing yet, so this call and every later one run eagerly.
        _fail(exc)
        return type(self).forward(self, *args, **kwargs)


def _fail(exc: BaseException) -> str:
    """Record the first compile failure and warn once; the reason for the record."""
    text = str(exc).strip()
    message = text.splitlines()[0][:200] if text else type(exc).__name__
    if not _FAILED:
        _FAILED.append(f"compile failed: {message}")
        warnings.warn(
            f"model.compile: torch.compile failed ({message}); the trainer runs eagerly "
            "(the same values, without the fused kernels)",
            RuntimeWarning,
            stacklevel=3,
        )
    return _FAILED[0]


def _parts(model: torch.nn.Module) -> list[Any]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    found: list[Any] = []
    for layer in model.modules():
        if isinstance(layer, GradientCheckpointingLayer):
            found.extend(getattr(layer, name) for name in LAYER_PARTS if hasattr(layer, name))
    decoder = getattr(model, "model", model)
    if isinstance(getattr(decoder, "norm", None), torch.nn.Module):
        found.append(decoder.norm)
    return found


def patch(model: torch.nn.Module) -> int:
    """Route the element-wise modules of ``model`` (a causal LM) through compiled
    forwards; returns how many. Compilation itself happens on first use."""
    count = 0
    for module in _parts(model):
        if not _is_patched(module):
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count


def _is_patched(module: Any) -> bool:
    bound = module.__dict__.get("forward")
    return isinstance(bound, types.MethodType) and bound.__func__ is _forward


def strip(model: torch.nn.Module) -> int:
    """Undo :func:`patch` on ``model`` (a deep copy for sampling); returns how many."""
    count = 0
    for module in model.modules():
        if _is_patched(module):
            del module.forward
            count += 1
    return count


def warm_up(
    model: PreTrainedModel,
    autocast: Callable[[], AbstractContextManager[Any]],
    device: torch.device,
) -> str | None:
    """Compile and run the patched modules once, forward and backward, the way training
    will (under the trainer's ``autocast()``, with gradients, at 2 rows and at 1); None, or
    why it failed (the modules then run eagerly, as :func:`_forward` falls back)."""
    parts = _parts(model)
    if not parts or _FAILED:
        return _FAILED[0] if _FAILED else None
    # the residual stream's width and dtype (bf16 when a LoRA trainer holds its frozen
    # embedding so)
    embedding = cast("torch.Tensor", model.get_input_embeddings().weight)  # an nn.Embedding's
    hidden, dtype = embedding.shape[1], embedding.dtype
    layer_parts = {type(p): p for p in parts}  # one module of each class
    try:
        for rows in (2, 1):
            for module in layer_parts.values():
                x = torch.randn(rows, 17, hidden, device=device, dtype=dtype, requires_grad=True)
                with torch.enable_grad(), autocast():
                    out = module(x)
                out.float().sum().backward()
    except torch._dynamo.exc.TorchDynamoException as exc:
        _fail(exc)
    finally:
        for param in model.parameters():
            param.grad = None
    return _FAILED[0] if _FAILED else None


def prepare(
    model: PreTrainedModel,
    choice: CompileChoice,
    autocast: Callable[[], AbstractContextManager[Any]],
    device: torch.device,
) -> CompileChoice:
    """When ``choice`` is on: :func:`patch` ``model`` (the trainer's causal LM) and
    :func:`warm_up` it; the choice that holds afterwards (off, with the compiler's
    failure as the reason, when the warm-up failed). Run it on a compute thread."""
    if not choice.enabled:
        return choice
    patch(model)
    failed = warm_up(model, autocast, device)
    return replace(choice, enabled=False, reason=failed) if failed else choice
