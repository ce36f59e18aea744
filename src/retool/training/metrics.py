"""Trainer metrics merged across micro-batches by what they mean.

The reference averaged every metric over micro-batches, so totals stopped
being totals and rates were weighted by call instead of by token. Here a
metric's name says how it combines:

* ``...:sum`` and ``..._tokens`` are totals: summed.
* ``..._max`` / ``..._min``: the maximum / minimum.
* anything else is a per-token rate: weighted by each call's ``loss_tokens``
  (by call when no call reports tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TOKENS = "loss_tokens"


def merge_trainer_metrics(outputs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One dict of metrics for a whole step's ``forward_backward`` calls."""
    if not outputs:
        return {}
    weights = [float(m.get(TOKENS, 0.0)) for m in outputs]
    if sum(weights) <= 0:
        weights = [1.0] * len(outputs)
    merged: dict[str, float] = {}
    for name in sorted({k for m in outputs for k in m}):
        present = [(float(m[name]), w) for m, w in zip(outputs, weights, strict=True) if name in m]
        values = [v for v, _ in present]
        if name.endswith(":sum") or name.endswith("_tokens") or name == TOKENS:
            merged[name] = sum(values)
        elif name.endswith("_max"):
            merged[name] = max(values)
        elif name.endswith("_min"):
            merged[name] = min(values)
        else:
            total = sum(w for _, w in present)
            merged[name] = (
                sum(v * w for v, w in present) / total if total else sum(values) / len(values)
            )
    return merged
