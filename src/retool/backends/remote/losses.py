"""What a ``forward`` / ``forward_backward`` call sends, and the metrics made of its reply.

Design, and why:

* **Checked before it is sent.** A loss we do not know, a datum without the
  loss's inputs, an empty call or a datum longer than the service's
  sequence limit is refused here with an error that says what to change,
  before any request.
* **Loss reduction.** Our contract is a sum over loss tokens
  (:mod:`retool.types`). A service that divides each ``forward_backward``
  call by a token count gets the advantages (or cross-entropy weights)
  multiplied by that same count, which makes its update equal to the sum:
  every built-in loss is positively homogeneous in the advantage. The
  count is computed from the datums exactly as the SDK computes the
  denominators it sends (see :func:`loss_denominator`), and which count, if
  any, is ``model.loss_reduction`` (documented on
  :class:`~retool.config.ModelConfig`; ``auto`` resolved by
  :func:`resolve_loss_reduction`).
* **Masking.** Policy losses send exactly ``target_tokens``, ``logprobs`` and
  ``advantages``; cross-entropy sends ``target_tokens`` and ``weights``. Any
  other key (a ``mask``, ``weights`` on a policy loss) is dropped, as the
  local backend ignores it too: masked positions already carry advantage 0
  and logprob 0.
* **Metrics under the local backend's names** (``training/metrics.py``):
  ``loss:sum`` in our (unscaled) terms, ``loss_tokens``, and the ratio
  metrics recomputed from the current-policy logprobs the service returns.
  A service that reports no loss under the expected name gets it
  recomputed from those logprobs (said once per process).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import numpy as np

from retool.errors import BackendError
from retool.types import Datum, TensorData

POLICY_LOSSES = ("importance_sampling", "ppo", "cispo")
LOSS_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    **{name: ("target_tokens", "logprobs", "advantages") for name in POLICY_LOSSES},
}
CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
IGNORED_TARGET = -100  # label both SDKs skip (pytrio/client/training_batch.py)


def resolve_loss_reduction(setting: str, backend: str) -> str:
    """``model.loss_reduction`` with ``auto`` resolved for ``backend``."""
    if setting != "auto":
        return setting
    return {"pytrio": "active_token_mean"}.get(backend, "sum")


# -- checks -----------------------------------------------------------------------------


def _array(datum: Datum, key: str) -> np.ndarray:
    return datum.loss_fn_inputs[key].to_numpy().reshape(-1)


def check_lengths(data: Sequence[Datum], limit: int | None, backend: str) -> None:
    """Refuse a datum longer than the service's sequence limit (before any request)."""
    if not limit:
        return
    for index, datum in enumerate(data):
        if datum.model_input.length > limit:
            raise BackendError(
                f"{backend}: datum {index} has {datum.model_input.length} tokens, more than "
                f"the model's max_seq_len ({limit}) on this service; lower "
                "train.max_train_tokens and rollout.max_trajectory_tokens"
            )


def check_loss_inputs(data: Sequence[Datum], loss_fn: str, backend: str) -> None:
    if loss_fn not in LOSS_INPUTS:
        raise BackendError(
            f"{backend}: unknown loss_fn {loss_fn!r}; choose one of {', '.join(LOSS_INPUTS)}"
        )
    if not data:
        raise BackendError(f"{backend}: forward_backward needs at least one datum")
    for index, datum in enumerate(data):
        if datum.model_input.length == 0:
            raise BackendError(f"{backend}: datum {index} has no tokens")
        for key in LOSS_INPUTS[loss_fn]:
            if key not in datum.loss_fn_inputs:
                raise BackendError(
                    f"{backend}: datum {index} lacks loss_fn_inputs[{key!r}] needed by {loss_fn}"
                )


# -- what is sent -----------------------------------------------------------------------


def loss_denominator(reduction: str, loss_fn: str, data: Sequence[Datum]) -> int:
    """The count a service divides one call's summed loss by (1 for ``sum``).

    Counted as PyTRIO counts the denominators it sends with every chunk of a
    call (pytrio/client/training_batch.py: ``plan_training_batch``, with
    ``auto_shift=False``): ``total_active_tokens`` is the positions whose
    target is not -100, further restricted to non-zero ``weights`` for
    cross-entropy; ``total_advantage_tokens`` the active positions with a
    non-zero advantage. Cross-entropy has no advantages, so
    ``advantage_token_mean`` counts its active tokens.
    """
    if reduction == "sum":
        return 1
    total = 0
    for datum in data:
        active = _array(datum, "target_tokens") != IGNORED_TARGET
        if loss_fn == "cross_entropy":
            active &= _array(datum, "weights") != 0
        elif reduction == "advantage_token_mean":
            active &= _array(datum, "advantages") != 0
        total += int(active.sum())
    return max(total, 1)


def loss_inputs(datum: Datum, loss_fn: str, scale: float) -> dict[str, np.ndarray]:
    """The arrays the service gets for ``datum``: only the loss's keys, scaled for reduction."""
    target = _array(datum, "target_tokens").astype(np.int64)
    if loss_fn == "cross_entropy":
        weights = _array(datum, "weights").astype(np.float64) * scale
        return {"target_tokens": target, "weights": weights.astype(np.float32)}
    advantages = _array(datum, "advantages").astype(np.float64) * scale
    return {
        "target_tokens": target,
        "logprobs": _array(datum, "logprobs").astype(np.float32),
        "advantages": advantages.astype(np.float32),
    }


def loss_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float] | None:
    """The ``loss_fn_config`` to send: clip thresholds only where the loss clips."""
    if not config:
        return None
    kept = {
        str(k): float(v)
        for k, v in config.items()
        if loss_fn in ("ppo", "cispo") or k not in CLIP_KEYS
    }
    return kept or None


def loss_tokens(datum: Datum, loss_fn: str) -> int:
    """Positions that produce loss, counted as the local backend counts them."""
    key = "weights" if loss_fn == "cross_entropy" else "advantages"
    return int(np.count_nonzero(_array(datum, key)))


# -- what comes back --------------------------------------------------------------------


def ratio_metrics(
    data: Sequence[Datum], logprobs: Sequence[np.ndarray], config: Mapping[str, float] | None
) -> dict[str, float]:
    """``clip_fraction``, ``approx_kl`` and ``ratio_max`` over loss tokens, as the local backend.

    Computed from the current-policy logprobs the service returns with the
    loss (``loss_fn_outputs[i]["logprobs"]``) and the sampler's ones we sent.
    """
    ratios, diffs = [], []
    for datum, current in zip(data, logprobs, strict=True):
        active = _array(datum, "advantages") != 0
        old = _array(datum, "logprobs").astype(np.float64)[active]
        new = np.asarray(current, dtype=np.float64).reshape(-1)[active]
        ratios.append(np.exp(new - old))
        diffs.append(old - new)
    ratio = np.concatenate(ratios) if ratios else np.zeros(0)
    n = ratio.size
    metrics = {
        "approx_kl": float(np.concatenate(diffs).sum()) / max(n, 1),
        "ratio_max": float(ratio.max()) if n else 1.0,
    }
    if config and all(k in config for k in CLIP_KEYS):
        low, high = float(config[CLIP_KEYS[0]]), float(config[CLIP_KEYS[1]])
        metrics["clip_fraction"] = float(((ratio < low) | (ratio > high)).sum()) / max(n, 1)
    return metrics


_SAID: set[str] = set()  # backends already told about a missing loss (said once per process)


def loss_from_outputs(
    data: Sequence[Datum],
    loss_fn: str,
    outputs: Sequence[dict[str, TensorData]],
    config: Mapping[str, float] | None,
) -> float | None:
    """The summed loss recomputed from the per-token ``logprobs`` the service returned.

    For a service that reports no loss metric (or one under another name):
    the same sums the local backend takes, over our own (unscaled) weights
    and advantages. ``None`` where the SDK returned no logprobs or the loss
    is not one this formula covers.
    """
    if not outputs or not all("logprobs" in o for o in outputs):
        return None
    total = 0.0
    for datum, output in zip(data, outputs, strict=True):
        new = np.asarray(output["logprobs"].to_numpy(), dtype=np.float64).reshape(-1)
        if loss_fn == "cross_entropy":
            total += float(-(new * _array(datum, "weights").astype(np.float64)).sum())
            continue
        advantages = _array(datum, "advantages").astype(np.float64)
        ratio = np.exp(new - _array(datum, "logprobs").astype(np.float64))
        if loss_fn == "importance_sampling":
            total += float(-(ratio * advantages).sum())
        elif loss_fn == "ppo" and config and all(k in config for k in CLIP_KEYS):
            low, high = float(config[CLIP_KEYS[0]]), float(config[CLIP_KEYS[1]])
            clipped = np.clip(ratio, low, high) * advantages
            total += float(-np.minimum(ratio * advantages, clipped).sum())
        else:
            return None
    return total


def fallback_loss(
    backend: str,
    data: Sequence[Datum],
    loss_fn: str,
    outputs: Sequence[dict[str, TensorData]],
    config: Mapping[str, float] | None,
    metrics: Sequence[str],
    expected: str,
) -> float:
    """The loss when the service's metrics lack ``expected``: recomputed (said once), or an
    error naming what it did report."""
    loss = loss_from_outputs(data, loss_fn, outputs, config)
    if loss is None:
        raise BackendError(
            f"{backend} returned no {expected} (metrics: {sorted(metrics)}) and no per-token "
            "logprobs to compute it from; check that the service speaks this SDK version"
        )
    if backend not in _SAID:
        _SAID.add(backend)
        print(
            f"retool: note: {backend} reported no {expected} (metrics: {sorted(metrics)}); "
            "computing the loss from its per-token logprobs",
            file=sys.stderr,
        )
    return loss


def trainer_metrics(
    data: Sequence[Datum],
    loss_fn: str,
    loss_sum: float,
    outputs: Sequence[dict[str, TensorData]],
    config: Mapping[str, float] | None,
    service: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """One call's metrics under the local backend's names (see ``training/metrics.py``)."""
    metrics = {
        "loss:sum": float(loss_sum),
        "loss_tokens": float(sum(loss_tokens(d, loss_fn) for d in data)),
    }
    if loss_fn in POLICY_LOSSES and all("logprobs" in o for o in outputs):
        metrics.update(ratio_metrics(data, [o["logprobs"].to_numpy() for o in outputs], config))
    for name, value in (service or {}).items():
        metrics.setdefault(name, float(value))
    return metrics
