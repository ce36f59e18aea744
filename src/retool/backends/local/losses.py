"""The built-in token losses of the local backend, and chunked target logprobs.

Every loss takes per-token tensors of one call, flattened over all datums:
``logprobs`` (the current policy's, with gradient), and the caller's
``loss_fn_inputs``: ``weights`` for ``cross_entropy``; ``logprobs`` (old, from
the sampler) and ``advantages`` for the RL losses. Reduction is the **sum**
over loss tokens of all datums in the call (the contract in ``retool.types``);
callers scale advantages for any other aggregation.

* ``cross_entropy``        ``-sum(w * logp)``
* ``importance_sampling``  ``-sum(r * A)``, ``r = exp(logp - logp_old)``
* ``ppo``                  ``-sum(min(r * A, clip(r, lo, hi) * A))``; ``lo``/``hi``
                           are absolute ratio bounds (default 0.8 / 1.2)
* ``cispo``                ``-sum(sg(clip(r, lo, hi)) * A * logp)``: the clipped
                           ratio weights the log-likelihood gradient instead of
                           cutting it off (MiniMax-M1)

Metrics: ``loss:sum``, ``loss_tokens`` (tokens with a non-zero weight or
advantage), ``clip_fraction`` (share of loss tokens whose ratio fell outside
the bounds), ``approx_kl`` (mean of ``logp_old - logp`` over loss tokens),
``ratio_max``.

**Sampler/trainer mismatch and rollout correction** (RL losses). The sampler's
logprobs are ``loss_fn_inputs["sampler_logprobs"]`` when the caller recomputed
π_old with the trainer (``train.old_logprobs = "recompute"``: ``logprobs`` then
holds the trainer's), else ``logprobs`` itself (π_old is the sampler's). The
trainer's logprob of a token before this step's update is π_old in the first
case and the current forward (detached) in the second: with one update per
step every ``forward_backward`` of a step runs before its ``optim_step``. (With
several, ``train.updates_per_step``, a later update's current forward has
moved: ρ then compares the updated policy with the sampler, and TIS caps that
ratio at ``C``, a dual clip; the training loop logs the mismatch from the
first update only.) With
``ρ = π_trainer / π_sampler`` per loss token:

* ``sampler_kl``: mean of ``log π_sampler - log π_trainer``; ``sampler_clip_fraction``:
  share of loss tokens whose ``ρ`` is outside ``[clip_low, clip_high]``;
* ``rollout_correction = 1`` (TIS, ``loss_fn_config``): each token's loss is
  weighted so that its importance weight is ``min(ρ, C)``, ``C =
  rollout_correction_cap``; with sampler logprobs as π_old the PPO ratio
  already carries ``ρ``, so the token's loss is scaled by ``min(1, C / ρ)``;
  with recomputed π_old by ``min(ρ, C)``;
* ``rollout_correction = 2`` (MIS): a datum whose sequence ratio
  ``exp(sum log ρ)`` over its loss tokens leaves ``[1/C, C]`` gets weight 0, the
  others are left as π_old makes them (a rejection, not a reweighting);
* ``correction_fraction``: share of loss tokens truncated (TIS) or masked (MIS).

Weights are detached: they rescale gradients, they have none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from retool.errors import BackendError

LOSS_NAMES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
REQUIRED_INPUTS = {  # the loss_fn_inputs each loss reads (SAMPLER_LOGPROBS is optional)
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
}
DEFAULT_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
SAMPLER_LOGPROBS = "sampler_logprobs"  # optional loss input: the sampler's, when π_old is not
CORRECTIONS = {"none": 0, "tis": 1, "mis": 2}  # loss_fn_config["rollout_correction"] codes


class _FrozenHeadLogprobs(torch.autograd.Function):
    """Target logprobs through a frozen output head, gradient precomputed per chunk.

    A token's logprob is a scalar, so its gradient with respect to the hidden
    state is ``g * (W[target] - softmax @ W)`` for the incoming scalar ``g``.
    The vector in brackets is computed while the chunk's logits exist, and the
    logits are freed at once: no logits are kept for, or recomputed in, the
    backward pass.
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        flat_targets = targets.reshape(-1)
        out = torch.empty(rows.shape[0], dtype=torch.float32, device=hidden.device)
        direction = torch.empty_like(rows, dtype=torch.float32)
        w = weight.float()
        # One logits buffer for every chunk: fresh 200 MB blocks per chunk would each
        # be faulted in and zeroed by the kernel.
        logits = torch.empty(
            min(chunk, rows.shape[0]), w.shape[0], dtype=torch.float32, device=hidden.device
        )
        for start in range(0, rows.shape[0], chunk):
            h = rows[start : start + chunk].float()
            t = flat_targets[start : start + chunk]
            buffer = logits[: h.shape[0]]
            torch.matmul(h, w.T, out=buffer)
            # logsumexp in place: torch.logsumexp allocates two more chunk-sized blocks
            # (the shifted logits and their exp), each faulted in: a third of the head's time.
            target = buffer.gather(1, t.unsqueeze(1)).squeeze(1)
            peak = buffer.amax(dim=-1, keepdim=True)
            probs = buffer.sub_(peak).exp_()
            total = probs.sum(dim=-1, keepdim=True)
            out[start : start + chunk] = target - (peak + total.log()).squeeze(1)
            probs.div_(total)
            if weight.dtype == torch.bfloat16:  # a bf16 trainer: its gradient is bf16 anyway
                expected = (probs.to(torch.bfloat16) @ weight).float()
            else:
                expected = probs @ w
            direction[start : start + chunk] = w[t] - expected
        ctx.save_for_backward(direction)
        ctx.shape, ctx.dtype = hidden.shape, hidden.dtype
        return out.reshape(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (direction,) = ctx.saved_tensors
        grad = (grad_out.reshape(-1, 1).float() * direction).to(ctx.dtype).reshape(ctx.shape)
        return grad, None, None, None


def chunked_target_logprobs(
    hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor, chunk: int = 256
) -> torch.Tensor:
    """``log_softmax(hidden @ head_weight.T)[targets]`` without full-batch fp32 logits.

    ``hidden`` is ``[B, T, H]``, ``targets`` ``[B, T]``; ``chunk`` counts positions
    per row. With a frozen head (LoRA) the gradient is precomputed chunk by chunk
    (:class:`_FrozenHeadLogprobs`); with a trainable head each chunk is
    recomputed in the backward pass (activation checkpointing). Either way at
    most one chunk of float32 logits is alive at a time.
    """
    # Always float32, also under a bf16 autocast: bf16 logits of size ~20 carry
    # rounding errors of ~0.06, as large as the mismatch this is meant to measure.
    with torch.autocast(hidden.device.type, enabled=False):
        return _target_logprobs_fp32(hidden, head_weight, targets, chunk)


def _target_logprobs_fp32(
    hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    if torch.is_grad_enabled() and hidden.requires_grad and not head_weight.requires_grad:
        return _FrozenHeadLogprobs.apply(
            hidden, head_weight, targets, max(1, chunk * hidden.shape[0])
        )

    def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = h.float() @ head_weight.float().T
        return torch.log_softmax(logits, dim=-1).gather(-1, t.unsqueeze(-1)).squeeze(-1)

    outputs = []
    for start in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, start : start + chunk], targets[:, start : start + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or head_weight.requires_grad):
            outputs.append(checkpoint(piece, h, t, use_reentrant=False))
        else:
            outputs.append(piece(h, t))
    return torch.cat(outputs, dim=1)


def _rl_terms(
    logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, config: Mapping[str, float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    low = float(config.get("clip_low_threshold", DEFAULT_CLIP["clip_low_threshold"]))
    high = float(config.get("clip_high_threshold", DEFAULT_CLIP["clip_high_threshold"]))
    if not 0 < low <= 1 <= high:
        raise BackendError(
            f"clip thresholds must satisfy 0 < low <= 1 <= high, got {low} and {high}"
        )
    ratio = torch.exp(logprobs - old)
    active = advantages != 0
    return ratio, active, torch.clamp(ratio, low, high), low, high


def correction_weights(
    log_rho: torch.Tensor,
    active: torch.Tensor,
    segments: torch.Tensor | None,
    mode: int,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the importance weight each token should carry, which tokens were truncated/masked).

    ``log_rho`` = ``log π_trainer - log π_sampler`` per token; ``mode`` 1 is TIS
    (the importance weight ``min(ρ, cap)``), 2 is MIS (a mask: 1 or 0 per segment
    by its sequence ratio, on top of what π_old gives), 0 is the plain ``ρ``.
    Inactive tokens are never counted.
    """
    rho = torch.exp(log_rho)
    if mode == 1:
        cut = (rho > cap) & active
        return torch.clamp(rho, max=cap), cut
    if mode == 2:
        if segments is None:
            segments = torch.zeros_like(log_rho, dtype=torch.long)
        count = int(segments.max()) + 1 if segments.numel() else 0
        seq = torch.zeros(count, dtype=log_rho.dtype, device=log_rho.device)
        seq.index_add_(0, segments, torch.where(active, log_rho, torch.zeros_like(log_rho)))
        keep = seq.abs() <= math.log(cap)
        masked = ~keep[segments] & active
        return (~masked).to(rho.dtype), masked
    return rho, torch.zeros_like(active)


def compute_loss(
    name: str,
    logprobs: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, float] | None = None,
    segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The summed loss and its metrics for flattened per-token tensors.

    ``segments`` gives each token's datum index (needed by MIS; one datum if None).
    """
    config = config or {}
    if name not in LOSS_NAMES:
        raise BackendError(f"unknown loss_fn {name!r}; choose one of {', '.join(LOSS_NAMES)}")
    if name == "cross_entropy":
        weights = inputs["weights"].to(logprobs.dtype)
        loss = -(weights * logprobs).sum()
        tokens = int((weights != 0).sum())
        return loss, {"loss:sum": float(loss.detach()), "loss_tokens": float(tokens)}
    old = inputs["logprobs"].to(logprobs.dtype)
    advantages = inputs["advantages"].to(logprobs.dtype)
    ratio, active, clipped, low, high = _rl_terms(logprobs, old, advantages, config)
    recomputed = SAMPLER_LOGPROBS in inputs
    with torch.no_grad():
        sampler = inputs[SAMPLER_LOGPROBS].to(logprobs.dtype) if recomputed else old
        trainer = old if recomputed else logprobs.detach()
        log_rho = trainer - sampler
        mode = int(config.get("rollout_correction", 0))
        cap = float(config.get("rollout_correction_cap", 2.0))
        if mode not in (0, 1, 2) or not cap > 1:
            raise BackendError(
                f"rollout_correction must be 0, 1 or 2 with a cap > 1, got {mode} and {cap}"
            )
        weight, corrected = correction_weights(log_rho, active, segments, mode, cap)
        # The weight a token's loss is scaled by: its wanted importance weight over the
        # one its ratio already carries (rho with sampler logprobs as pi_old, 1 otherwise).
        wanted = weight if recomputed or mode == 2 else weight / torch.exp(log_rho)
        scale = torch.where(active, wanted, torch.ones_like(wanted)) if mode else None
    per_token: dict[str, Callable[[], torch.Tensor]] = {
        "importance_sampling": lambda: -(ratio * advantages),
        "ppo": lambda: -torch.minimum(ratio * advantages, clipped * advantages),
        "cispo": lambda: -(clipped.detach() * advantages * logprobs),
    }
    terms = per_token[name]()
    loss = (terms * scale).sum() if scale is not None else terms.sum()
    n = int(active.sum())
    with torch.no_grad():
        outside = ((ratio < low) | (ratio > high)) & active
        rho = torch.exp(log_rho)
        mismatch = ((rho < low) | (rho > high)) & active
        metrics = {
            "loss:sum": float(loss.detach()),
            "loss_tokens": float(n),
            "clip_fraction": float(outside.sum()) / max(n, 1),
            "approx_kl": float(((old - logprobs) * active).sum()) / max(n, 1),
            "ratio_max": float(ratio[active].max()) if n else 1.0,
            "sampler_kl": float((-log_rho * active).sum()) / max(n, 1),
            "sampler_clip_fraction": float(mismatch.sum()) / max(n, 1),
        }
        if mode:
            metrics["correction_fraction"] = float(corrected.sum()) / max(n, 1)
    return loss, metrics
