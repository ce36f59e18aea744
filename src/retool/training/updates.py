"""Several optimizer updates per RL step: the step's groups split into PPO mini-batches.

``train.updates_per_step = K`` splits a step's training datums into ``K``
updates, each a ``forward_backward`` per micro-batch followed by one
``optim_step`` (verl's ``ppo_mini_batch_size``, tinker-cookbook's
``num_substeps``). ``K = 1`` (the default) is the reference's one update per
step. The rollout is the step's cost and the training passes over each datum
once either way, so ``K`` buys ``K`` times the updates for the same compute;
from the second update on the policy has moved away from the one that sampled
(π_old), which is what PPO's ratio clip is for.

Rules, chosen so that ``K = 1`` is exactly the single update:

* **Whole groups, in order.** The groups (question slots) that have datums are
  cut into ``min(K, groups)`` contiguous runs of as equal a size as
  :func:`numpy.array_split` gives; a group's trajectories never straddle two
  updates, so each update sees complete group-centred advantages.
* **Each update weighs like the whole step.** The datums arrive scaled for the
  step's loss aggregation (:mod:`retool.training.aggregation`: e.g.
  ``seq_mean``, ``1 / (N T_i)``); an update holding ``D_k`` of the step's
  ``D`` datums scales them by a further ``D / D_k``, so its objective is the
  step's objective restricted to its datums and brought back to the step's
  size (for equal parts, ``K`` times). Without it, ``K`` updates of
  ``1 / K``-sized gradients would only make the gradient-norm clip and AdamW's
  ``eps`` matter more.
* **The mismatch is measured once.** ``train/sampler_kl`` and
  ``train/sampler_clip_fraction`` describe sampler against trainer before the
  step's first update, so they come from the first update's calls only; the
  other trainer metrics (``clip_fraction``, ``approx_kl``, the loss) merge over
  every call, and ``optim/grad_norm`` is the mean over the updates. With
  ``train.old_logprobs = "sampler"`` and a rollout correction, later updates
  measure ρ against the moved policy (TIS then caps π_θ / π_sampler at ``C``,
  a dual clip); with ``recompute`` π_old is the trainer before the first
  update for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retool.training.aggregation import rescale
from retool.training.datum import TrainingDatum
from retool.training.metrics import merge_trainer_metrics

__all__ = ["FIRST_UPDATE_ONLY", "merge_update_metrics", "split_updates"]

# trainer metrics that describe the sampler/trainer mismatch before any update
FIRST_UPDATE_ONLY = ("sampler_kl", "sampler_clip_fraction")
_COUNTS = ("train/datums", "train/micro_batches", "train/tokens", "train/padded_tokens")


def split_updates(
    datums: Sequence[TrainingDatum], updates: int, group_size: int
) -> list[list[TrainingDatum]]:
    """The step's datums as ``min(updates, groups)`` updates of whole groups (module doc).

    ``group_size`` maps a datum's ``trajectory_index`` (its slot in the rollout
    batch) to its group. No datums: one empty update (the step's skipped one).
    """
    if updates < 1 or group_size < 1:
        raise ValueError(f"updates and group_size must be >= 1, got {updates}, {group_size}")
    if updates == 1 or not datums:
        return [list(datums)]
    groups: dict[int, list[TrainingDatum]] = {}
    for item in datums:
        groups.setdefault(item.trajectory_index // group_size, []).append(item)
    order = sorted(groups)
    parts = np.array_split(np.arange(len(order)), min(updates, len(order)))
    total = len(datums)
    out = []
    for part in parts:
        members = [item for g in part for item in groups[order[int(g)]]]
        out.append(rescale(members, total / len(members)))
    return out


def merge_update_metrics(
    per_update: Sequence[Mapping[str, float]], optim: Sequence[Mapping[str, float]]
) -> dict[str, float]:
    """One step's metrics from each update's ``forward_backward`` and ``optim_step`` metrics.

    Counts add up, the trainer's metrics merge over every call except the
    mismatch (first update only), ``optim/*`` are the mean over the updates
    (``optim/step``, the trainer's counter, the last); ``train/updates`` counts
    the updates that ran.
    """
    if not per_update:
        return {}
    merged: dict[str, float] = {key: sum(m.get(key, 0.0) for m in per_update) for key in _COUNTS}
    merged["train/update_skipped"] = float(all(m.get("train/update_skipped") for m in per_update))
    trainer = []
    for index, metrics in enumerate(per_update):
        own = {
            key.removeprefix("train/"): value
            for key, value in metrics.items()
            if key.startswith("train/") and key not in _COUNTS and key != "train/update_skipped"
        }
        if index:
            own = {k: v for k, v in own.items() if k not in FIRST_UPDATE_ONLY}
        trainer.append(own)
    merged.update({f"train/{k}": v for k, v in merge_trainer_metrics(trainer).items()})
    ran = [m for m in optim if m]
    for key in sorted({k for m in ran for k in m}):
        values = [float(m[key]) for m in ran if key in m]
        merged[key] = values[-1] if key == "optim/step" else sum(values) / len(values)
    merged["train/updates"] = float(len(ran))
    return merged
