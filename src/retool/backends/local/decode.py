"""A lean one-token decode step for Llama-family models, used by the sampling engine.

The engine's decode step feeds one token per row through the model. Run as
HF's ``forward``, that step on this 2-core CPU spends most of its time in
places the arithmetic does not need (measured on SmolLM2-135M, 4 rows, cache
of 300 tokens: 114 ms through HF against 64 ms here, see
``bench/local_backend.py --part decode``):

* ``F.linear(x, W)`` with few rows: MKL's kernel for ``x @ W.T`` with a small
  ``x`` streams the weights at 5-8 GB/s. The same product computed as
  ``(W @ x.T).T`` (the weight as the row-major left operand) runs 1.3-2.5x
  faster at every batch size from 2 to 128 rows, here, so every projection and
  the output head use it. The result is a transposed view whose ``.T`` is
  contiguous again, so the next projection reads it without a copy.
* Attention over the right-aligned batch cache is two batched matmuls with the
  query heads grouped per key/value head (``[rows, kv_heads, group, dim]``
  against ``[rows, kv_heads, length, dim]``): keys and values are read once, never
  repeated per query head, and the padding is an additive ``-inf`` bias built
  once per step. SDPA's CPU kernel takes 1.5-2x longer for this shape.
* A prefix every row shares (the system prompt and the tool rules, ~200 of an
  evaluation's 250-700 columns per row) is read once per step, not once per
  row: the batch cache keeps its keys/values apart (``kv.BatchCache``), its
  scores are one product of every row's queries against them, concatenated
  before the rows' own scores for one softmax. At 32-64 rows reading the cache
  costs more than reading the weights, so this is where a full batch's time goes.
* Fewer, fused small operations: one ``F.rms_norm`` per norm, the rotary
  embedding as ``addcmul(x * cos, roll(x), signed_sin)``, the attention scores
  as one ``baddbmm`` (scale and padding bias included); no mask construction,
  cache bookkeeping or keyword plumbing per layer. At 4 rows a step is ~1,000
  small operations, so this matters (1.08-1.13x over the plain version).

The arithmetic is the model's own (the same RMSNorm in float32, rotary
embedding from the model's ``rotary_emb`` module so any RoPE scaling applies,
the model's activation, biases when present), so sampled logprobs agree with
``forward`` on the same tokens as closely as HF's own decode does (measured
on SmolLM2 with real prompts: both within 3.5e-5 of the full forward; the
contract asks 1e-4). Prefill (many tokens of one prompt) still runs through
HF's decoder, where large matrix products are efficient; only its last
position goes through :meth:`LeanDecoder.head`.

A bf16 (or fp16) model on CPU decodes over a float32 batch cache
(:attr:`LeanDecoder.cache_dtype`): the projections run in the model's dtype,
attention in float32, since bf16 batched products at decode shapes were 2-3x
slower than float32 on an AMX host (2026-12-02).

Only plain Llama models are supported (``LlamaForCausalLM`` with ``nn.Linear``
projections: SmolLM2, the ``tiny-random`` test model, Llama 2/3). Anything
else returns ``None`` from :func:`lean_decoder_for` and the engine uses HF's
forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _project(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for ``x`` of shape ``[rows, in]``, computed as ``(W @ x.T).T``."""
    if module.bias is None:
        return torch.mm(module.weight, x.t()).t()
    return torch.addmm(module.bias.unsqueeze(1), module.weight, x.t()).t()


def _rms_norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm`` (float32 statistics) as one fused call."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * hidden.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``signed_sin = [-sin[:h], sin[h:]]``:
    ``rotate_half(x) = [-x[h:], x[:h]]``, so its product with ``sin`` equals
    ``roll(x, h) * signed_sin``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class LeanDecoder:
    """One decode step of a Llama model over the engine's growable batch cache."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        # The batch cache's dtype: float32 for a bf16/fp16 model on CPU, whose batched
        # attention products at decode shapes (a few query rows against hundreds of
        # cached columns per (row, head)) run 2-3x slower in bf16 than in float32 and
        # slower still when the column count changes every step (oneDNN builds a kernel
        # per shape): measured on an AMX host, 16 rows x 500 columns, 1.29 against 0.48
        # ms per layer for the scores. bf16 keys and values are exact in float32, so only
        # the products' rounding changes (it gets finer).
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        reduced = dtype in (torch.bfloat16, torch.float16)
        self.cache_dtype = torch.float32 if reduced and device.type == "cpu" else dtype

    def step(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        layers: Sequence[Any],
        mask: torch.Tensor,
        prefix: tuple[Sequence[tuple[torch.Tensor, torch.Tensor]], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (contiguous) of one new token per row.

        ``ids`` and ``positions`` are ``[rows]``; ``layers`` are the batch cache's
        layers (each ``update(keys, values)`` appends one column and returns the
        whole keys/values); ``mask`` is ``[rows, length + 1]``, True where a cache
        column (and the new token, last) is real. ``prefix``: a shared prefix's
        keys/values per layer (``[1, kv_heads, P, dim]``) that come before every
        row's cache columns, and ``[rows]`` which rows attend to it.
        """
        inner = self.model.model
        rows = ids.shape[0]
        x = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(x, positions.unsqueeze(0))
        cos = cos[0].unsqueeze(1)  # [rows, 1, dim]
        half = sin.shape[-1] // 2
        signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1).unsqueeze(1)
        # The padding bias, one [group, length] block per (row, kv head) for baddbmm.
        # Attention runs in the cache's dtype (float32 for a bf16 model on CPU, see
        # ``cache_dtype``); the projections in the model's.
        dtype = layers[0].keys.dtype if len(layers) else x.dtype
        length = mask.shape[1]
        bias = torch.zeros(mask.shape, dtype=dtype, device=x.device)
        bias = bias.masked_fill_(~mask, float("-inf"))
        bias = bias.view(rows, 1, 1, length).expand(rows, self.kv_heads, self.group, length)
        bias = bias.reshape(rows * self.kv_heads, self.group, length)
        prefix_bias = None
        if prefix is not None:
            attends = prefix[1]
            if not bool(attends.all()):
                prefix_bias = torch.zeros(rows, dtype=dtype, device=x.device)
                prefix_bias = prefix_bias.masked_fill_(~attends, float("-inf"))
                prefix_bias = prefix_bias.view(1, rows, 1, 1).expand(
                    self.kv_heads, rows, self.group, 1
                )
                prefix_bias = prefix_bias.reshape(self.kv_heads, rows * self.group, 1)
        for index, (layer, cache) in enumerate(zip(inner.layers, layers, strict=True)):
            attention = layer.self_attn
            h = _rms_norm(layer.input_layernorm, x)
            q = _project(attention.q_proj, h).reshape(rows, self.heads, -1)
            k = _project(attention.k_proj, h).reshape(rows, self.kv_heads, -1)
            v = _project(attention.v_proj, h).reshape(rows, self.kv_heads, -1)
            q, k = _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)
            keys, values = cache.update(k.unsqueeze(2), v.unsqueeze(2))
            q = q.to(keys.dtype)  # no-op unless the cache is wider than the model
            batch = rows * self.kv_heads  # (row, kv head) pairs, each with its query group
            scores = torch.baddbmm(
                bias,
                q.reshape(batch, self.group, self.head_dim),
                keys.reshape(batch, length, self.head_dim).transpose(1, 2),
                alpha=attention.scaling,
            )
            if prefix is None:
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
                out = torch.bmm(probs, values.reshape(batch, length, self.head_dim))
            else:
                out = self._with_prefix(
                    q, scores, values, prefix[0][index], prefix_bias, scaling=attention.scaling
                )
            out = out.view(rows, self.heads * self.head_dim).to(x.dtype)
            x = x + _project(attention.o_proj, out)
            h = _rms_norm(layer.post_attention_layernorm, x)
            mlp = layer.mlp
            x = x + _project(
                mlp.down_proj, mlp.act_fn(_project(mlp.gate_proj, h)) * _project(mlp.up_proj, h)
            )
        x = _rms_norm(inner.norm, x)
        return self.head(x)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (contiguous) of final hidden states ``[rows, hidden]``.

        Also the engine's prefill head: HF's forward applies the head to a
        ``[1, 1, hidden]`` slice as a batched product, which in bf16 on CPU first
        copies the whole transposed head (49152 x 576 for SmolLM2): 235 of a
        40-token continuation's 366 ms, measured on an AMX host.
        """
        return _project(self.model.lm_head, hidden).contiguous()

    def _with_prefix(
        self,
        q: torch.Tensor,
        scores: torch.Tensor,
        values: torch.Tensor,
        prefix: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        scaling: float,
    ) -> torch.Tensor:
        """Attention over the shared prefix and the rows' own columns, one softmax.

        The prefix's keys/values are read once for all rows: its scores are one
        ``[kv_heads, rows x group, P]`` product (every row's query heads against
        the same keys), placed before the rows' own scores, normalised together,
        and its share of the output is one product with the prefix's values.
        """
        rows, kv_heads, group, dim = q.shape[0], self.kv_heads, self.group, self.head_dim
        keys, vals = prefix
        p = keys.shape[2]
        grouped = (
            q.view(rows, kv_heads, group, dim).transpose(0, 1).reshape(kv_heads, rows * group, dim)
        )
        if bias is None:
            shared = torch.bmm(grouped, keys[0].transpose(1, 2)).mul_(scaling)
        else:
            shared = torch.baddbmm(bias, grouped, keys[0].transpose(1, 2), alpha=scaling)
        shared = (
            shared.view(kv_heads, rows, group, p).transpose(0, 1).reshape(rows * kv_heads, group, p)
        )
        probs = torch.softmax(torch.cat([shared, scores], dim=-1), dim=-1, dtype=torch.float32)
        probs = probs.to(values.dtype)
        length = scores.shape[-1]
        out = torch.bmm(probs[:, :, p:], values.reshape(rows * kv_heads, length, dim))
        head = probs[:, :, :p].reshape(rows, kv_heads, group, p).transpose(0, 1)
        part = torch.bmm(head.reshape(kv_heads, rows * group, p), vals[0])
        return out.add_(part.view(kv_heads, rows, group, dim).transpose(0, 1).reshape(out.shape))


def lean_decoder_for(model: PreTrainedModel) -> LeanDecoder | None:
    """A :class:`LeanDecoder` for ``model`` if it is a plain Llama, else ``None``."""
    try:
        from transformers import LlamaForCausalLM
    except ImportError:  # pragma: no cover - transformers is a dependency of this backend
        return None
    if type(model) is not LlamaForCausalLM:
        return None
    config = model.config
    kv_heads: int = config.num_key_value_heads or 1  # HF types it int | None
    if getattr(config, "pretraining_tp", 1) != 1 or config.num_attention_heads % max(1, kv_heads):
        return None
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = (
            attention.q_proj,
            attention.k_proj,
            attention.v_proj,
            attention.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )
        if any(type(p) is not torch.nn.Linear for p in projections):
            return None
    if type(model.lm_head) is not torch.nn.Linear or model.lm_head.bias is not None:
        return None
    return LeanDecoder(model)


__all__ = ["LeanDecoder", "lean_decoder_for"]
