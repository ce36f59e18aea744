"""Loss aggregation over a training step, realised as a scaling of each datum.

Backends reduce every loss by **sum** over the loss tokens of the datums of one
call, and accumulate gradients across calls until ``optim_step``
(``retool.types``). Any other aggregation is therefore a per-datum scale on the
advantages (``weights`` for supervised ``cross_entropy`` datums), applied
before packing. Modes (``train.loss_aggregation``):

* ``seq_mean``   (default, the reference) each trajectory of the rollout batch
  weighs ``1/N``; within a trajectory every loss token weighs the same.
* ``token_mean`` (DAPO) every loss token of the step weighs the same.
* ``token_sum``  the backend's raw sum, no scaling.

Derivation
----------
A step's rollout batch has ``N`` trajectories, of which the datums
``i = 1..D`` train (``D <= N``: zero-advantage, excluded and empty ones are
filtered). Datum ``i`` has ``T_i`` loss tokens with per-token losses
``l_it(A)``. Every RL loss is positively homogeneous in the advantage: for
``c > 0``, ``ppo`` gives ``-min(r*cA, clip(r)*cA) = -c*min(r*A, clip(r)*A)``
(the clip branch chosen does not change), and ``importance_sampling`` /
``cispo`` / ``cross_entropy`` are linear in ``A`` (or ``w``). So scaling the
advantages of datum ``i`` by ``c_i > 0`` scales its loss and its gradient by
``c_i``. One backend call on a micro-batch ``B`` contributes
``sum_{i in B} c_i * grad L_i`` with ``L_i = sum_t l_it``; accumulated over any
partition ``B_1..B_K`` of the datums that is ``sum_i c_i * grad L_i``: the split
only reorders a sum. A mode is a choice of ``c_i``, and invariance to
micro-batching holds by construction (up to float rounding).

``seq_mean``. The reference computes, for micro-batch ``k`` of ``n_k`` datums,
the per-sequence mean ``m_i = L_i / T_i``, their mean over the micro-batch,
and scales it by ``n_k / N`` (chapter 7.11, invariant 8)::

    sum_k (n_k/N) * (1/n_k) * sum_{i in B_k} m_i  =  (1/N) * sum_i L_i / T_i

``n_k`` cancels, so the weight of datum ``i`` is ``c_i = 1 / (N * T_i)``,
independent of the packing. ``N`` counts *all* trajectories of the rollout
batch, the filtered ones too (they add ``m_i = 0``): the objective stays the
mean over every sampled trajectory, so a step where many groups were
degenerate moves the weights less, as in the reference. With
``rollout.dynamic_sampling`` the loop passes the trajectories of the groups
that train instead (DAPO: filtered groups are not part of the batch's mean),
and with ``rollout.drop_void`` it leaves the void ones out (SimpleTIR's mask). (The chapter notes
that the reference's remote trainer reported ``loss_sum / token_count`` per
call; had it normalised gradients by each call's token count, its objective
would have depended on how the step was packed. The per-sequence reading is
the one that makes the chapter's identity hold, and is what we implement.)

``token_mean``. ``c_i = 1 / sum_j T_j``: every loss token of the step has the
weight ``1 / total loss tokens``, so a trajectory weighs in proportion to its
length (DAPO's token-level loss). Filtered trajectories have no loss tokens,
so the denominator counts the trained tokens (DAPO's dynamic sampling likewise
drops zero-advantage groups).

``token_sum``. ``c_i = 1``: the sum over all loss tokens; the update grows with
the batch and the lengths, so the learning rate has to absorb the scale.

Because the scale is folded into the data, the backend's ``loss:sum`` of the
micro-batches adds up to the step's objective in the chosen mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from retool.errors import ConfigError
from retool.training.datum import LOSS_KEYS, TrainingDatum
from retool.types import Datum, TensorData

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_AGGREGATION",
    "aggregation_scales",
    "rescale",
    "scale_advantages",
]

AGGREGATIONS = ("seq_mean", "token_mean", "token_sum")
DEFAULT_AGGREGATION = "seq_mean"


def aggregation_scales(loss_tokens: Sequence[int], mode: str, num_trajectories: int) -> list[float]:
    """The factor ``c_i`` of each datum, given its loss-token count (module docstring).

    ``num_trajectories`` is ``N``, every trajectory of the rollout batch
    (filtered ones included); it must be at least the number of datums. A
    datum without loss tokens gets the factor 1 (it contributes nothing anyway).
    """
    if mode not in AGGREGATIONS:
        raise ConfigError(
            f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}"
        )
    counts = [int(t) for t in loss_tokens]
    if any(t < 0 for t in counts):
        raise ValueError(f"loss-token counts must be >= 0, got {counts}")
    if num_trajectories < len(counts):
        raise ValueError(
            f"num_trajectories ({num_trajectories}) is smaller than the number of datums "
            f"({len(counts)}); pass every trajectory of the rollout batch"
        )
    if mode == "seq_mean":
        return [1.0 / (num_trajectories * t) if t else 1.0 for t in counts]
    if mode == "token_mean":
        total = sum(counts)
        return [1.0 / total if total else 1.0 for _ in counts]
    return [1.0 for _ in counts]


def _scaled(datum: Datum, factor: float) -> Datum:
    inputs = dict(datum.loss_fn_inputs)
    for key in LOSS_KEYS:
        if key in inputs:
            values = inputs[key].to_numpy().astype(np.float64) * factor
            inputs[key] = TensorData.from_numpy(values.astype(np.float32))
    return Datum(datum.model_input, inputs)


def scale_advantages(
    datums: Sequence[TrainingDatum], mode: str, num_trajectories: int
) -> list[TrainingDatum]:
    """New datums whose ``advantages`` (and ``weights``, if present) carry the mode's scale.

    The scale of a datum depends only on the whole step (``N`` and the loss
    tokens of all datums), never on the micro-batch it lands in, so any packing
    of the result accumulates the same gradient. Inputs are not modified.
    """
    scales = aggregation_scales([d.loss_tokens for d in datums], mode, num_trajectories)
    return [
        d if c == 1.0 else dataclasses.replace(d, datum=_scaled(d.datum, c))
        for d, c in zip(datums, scales, strict=True)
    ]


def rescale(datums: Sequence[TrainingDatum], factor: float) -> list[TrainingDatum]:
    """New datums with ``advantages`` (and ``weights``) multiplied by ``factor`` > 0."""
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    if factor == 1.0:
        return list(datums)
    return [dataclasses.replace(d, datum=_scaled(d.datum, factor)) for d in datums]
