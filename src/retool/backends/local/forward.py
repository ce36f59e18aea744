"""The trainer's forward pass: datums right-padded into one batch, target-token logprobs.

Padding (:func:`pad_batch`) goes on the right and no attention mask is passed:
causal attention never lets a real token see a later pad, and without a mask
SDPA keeps its fast causal path. The logprobs of the padded positions are
dropped by the caller with the batch's ``mask``.

Logprobs come from the decoder's final hidden states chunk by chunk
(``losses.chunked_target_logprobs``), so the float32 logits of the whole batch
never exist at once. When the datums share a first stretch of tokens (RL
trajectories all start with the same system prompt), that prefix runs once and
every datum's remainder attends to its keys/values (:func:`shared_prefix_logprobs`):
the same values up to float rounding, for the prefix's cost once instead of
once per datum.

Memory: a fraction of the decoder layers recompute their activations in the
backward pass (:func:`recompute_layers`); the shared-prefix path turns that off
for its call (:func:`without_recompute`), because HF drops the KV cache of a
recomputed layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from retool.backends.local.kv import cache_kwarg
from retool.backends.local.losses import chunked_target_logprobs
from retool.types import Datum

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a second forward call


@dataclass(frozen=True)
class PaddedBatch:
    """The datums of one call as right-padded ``[datums, width]`` tensors on the device."""

    input_ids: torch.Tensor  # token ids, the pad token id after each datum's end
    mask: torch.Tensor  # 1 on a datum's own positions, 0 on padding
    targets: torch.Tensor  # the token each position predicts, 0 on padding
    lengths: tuple[int, ...]  # each datum's token count


def pad_batch(data: Sequence[Datum], pad_id: int, device: torch.device) -> PaddedBatch:
    """``data`` (checked by the caller: non-empty, with ``target_tokens``) right-padded."""
    lengths = tuple(datum.model_input.length for datum in data)
    width = max(lengths)
    input_ids = torch.full((len(data), width), pad_id, dtype=torch.long)
    targets = torch.zeros((len(data), width), dtype=torch.long)
    mask = torch.zeros((len(data), width), dtype=torch.long)
    for i, datum in enumerate(data):
        n = lengths[i]
        input_ids[i, :n] = torch.tensor(datum.model_input.to_ints())
        targets[i, :n] = torch.from_numpy(datum.loss_fn_inputs["target_tokens"].to_numpy())
        mask[i, :n] = 1
    return PaddedBatch(input_ids.to(device), mask.to(device), targets.to(device), lengths)


def flat_input(data: Sequence[Datum], key: str, device: torch.device) -> torch.Tensor:
    """``loss_fn_inputs[key]`` of every datum, concatenated in float32 (no padding)."""
    parts = [torch.from_numpy(d.loss_fn_inputs[key].to_numpy().astype(np.float32)) for d in data]
    return torch.cat(parts).to(device)


def target_logprobs(
    lm: PreTrainedModel,  # a causal LM: its decoder (.model) and its output head
    batch: PaddedBatch,
    chunk_tokens: int,
    share_prefix: bool,
) -> torch.Tensor:
    """``[datums, width]`` logprobs of ``batch.targets`` (padding included, for the mask).

    ``chunk_tokens`` bounds rows x positions per float32 logits chunk;
    ``share_prefix`` computes a common prefix of at least ``MIN_SHARED_PREFIX``
    tokens once.
    """
    input_ids, targets = batch.input_ids, batch.targets
    head = lm.get_output_embeddings().weight
    chunk = max(1, chunk_tokens // input_ids.shape[0])
    prefix = shared_prefix_length(input_ids, batch.lengths) if share_prefix else 0
    if prefix >= MIN_SHARED_PREFIX:
        return shared_prefix_logprobs(lm, head, input_ids, targets, prefix, chunk)
    # No attention mask: padding is on the right (see the module docstring).
    hidden = lm.model(input_ids=input_ids, use_cache=False)
    return chunked_target_logprobs(hidden.last_hidden_state, head, targets, chunk=chunk)


def shared_prefix_logprobs(
    lm: PreTrainedModel,
    head: torch.Tensor,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    prefix: int,
    chunk: int,
) -> torch.Tensor:
    """Target logprobs with the datums' common first ``prefix`` tokens computed once.

    The prefix runs as one row and keeps its keys/values (with their
    gradient); every datum's remainder runs against them, expanded to the
    batch, so the backward pass sums each datum's gradient into the one
    prefix computation. The prefix positions' logprobs are computed once
    too when the datums' targets there agree. Same values as the plain
    path up to float rounding (tested). Layers marked for recomputation
    run without it here: HF drops the KV cache of a recomputed layer.
    """
    from transformers.cache_utils import DynamicCache

    rows, width = input_ids.shape
    kwarg = cache_kwarg(lm.model)
    with without_recompute(lm):
        prefix_cache = DynamicCache(config=lm.config)
        # use_cache=False: the layers fill the cache given to them all the same, and
        # HF's "incompatible with gradient checkpointing" override stays quiet.
        first = lm.model(
            input_ids=input_ids[:1, :prefix], use_cache=False, **{kwarg: prefix_cache}
        ).last_hidden_state
        cache = DynamicCache(config=lm.config)
        for index, layer in enumerate(prefix_cache.layers):
            pair = (layer.keys, layer.values)  # type: ignore[union-attr]  # a full-attention layer
            keys, values = (t.expand(rows, -1, -1, -1) for t in pair)  # type: ignore[union-attr]
            cache.update(keys, values, index)
        positions = torch.arange(prefix, width, device=input_ids.device).unsqueeze(0)
        rest = lm.model(
            input_ids=input_ids[:, prefix:],
            position_ids=positions.expand(rows, -1),
            use_cache=False,
            **{kwarg: cache},
        ).last_hidden_state
    head_targets = targets[:, : prefix - 1]
    if torch.equal(head_targets, head_targets[:1].expand(rows, -1)):
        shared = chunked_target_logprobs(
            first[:, : prefix - 1], head, head_targets[:1], chunk=chunk * rows
        ).expand(rows, -1)
    else:
        shared = chunked_target_logprobs(
            first[:, : prefix - 1].expand(rows, -1, -1), head, head_targets, chunk=chunk
        )
    # Position prefix - 1 predicts each datum's first own token: its hidden state is
    # the prefix's last one.
    tail_hidden = torch.cat([first[:, prefix - 1 :].expand(rows, -1, -1), rest], dim=1)
    tail = chunked_target_logprobs(tail_hidden, head, targets[:, prefix - 1 :], chunk=chunk)
    return torch.cat([shared, tail], dim=1)


def shared_prefix_length(input_ids: torch.Tensor, lengths: Sequence[int]) -> int:
    """Tokens every row of ``input_ids`` starts with, leaving >= 1 token in the widest row.

    0 for a single row (nothing to share).
    """
    rows, width = input_ids.shape
    if rows < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    common = int(same.int().argmin()) if not bool(same.all()) else width
    return max(0, min(common, min(lengths), width - 1))


def recompute_layers(model: PreTrainedModel, fraction: float) -> int:
    """Checkpoint ``fraction`` of the decoder layers, spread evenly; returns how many.

    A checkpointed layer keeps only its input and recomputes the rest in the
    backward pass. On SmolLM2 with 8 x 512 tokens (measured here): recomputing
    none peaks at 6.3 GB, a tenth (the default) at 5.6 GB, a third at 4.8 GB,
    all of them at 1.9 GB for about 30% more time.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"recompute_fraction must be in [0, 1], got {fraction}")
    from transformers.modeling_layers import GradientCheckpointingLayer

    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    chosen = round(fraction * len(layers))
    picked = {int(i * len(layers) / chosen) for i in range(chosen)} if chosen else set()
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index in picked
    return len(picked)


@contextlib.contextmanager
def without_recompute(model: torch.nn.Module) -> Iterator[None]:
    """Turn off per-layer recomputation for one call (restored afterwards)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True
