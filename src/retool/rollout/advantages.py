"""Group-centred advantages, computed once every trajectory of the batch has ended.

Groups are keyed by ``question_index``, the question's slot in *this* batch:
a question drawn twice forms two groups, and trajectories of different
batches are never mixed (each batch numbers its slots from 0). Excluded
trajectories (``prompt_too_long``, ``sampler_error``, ``sandbox_error``) take
no part: they get advantage 0 and do not shift their group's mean.

``mean`` (the reference, Dr. GRPO style): ``A_i = R_i - mean(R_group)``. With
+1/-1 rewards and k correct of G this is ``2(G-k)/G`` for a correct and
``-2k/G`` for a wrong trajectory.

``mean_std`` (GRPO): ``A_i = (R_i - mean) / (std + EPS)`` with the population
standard deviation (ddof=0) and ``EPS = 1e-6``; the epsilon only matters when
every reward in the group is equal, where the numerator is 0 anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from retool.errors import ConfigError
from retool.rollout.types import Trajectory

EPS = 1e-6
ADVANTAGE_MODES = ("mean", "mean_std")


def group_advantages(rewards_G: Sequence[float], mode: str = "mean") -> list[float]:
    """Advantages of one group's rewards."""
    if mode not in ADVANTAGE_MODES:
        raise ConfigError(f"advantage must be one of {', '.join(ADVANTAGE_MODES)}; got {mode!r}")
    if not rewards_G:
        return []
    mean = sum(rewards_G) / len(rewards_G)
    centred_G = [r - mean for r in rewards_G]
    if mode == "mean":
        return centred_G
    std = math.sqrt(sum(c * c for c in centred_G) / len(centred_G))
    return [c / (std + EPS) for c in centred_G]


def assign_group_advantages(trajectories: Sequence[Trajectory], mode: str = "mean") -> None:
    """Write ``advantage`` on every trajectory of one batch, in place."""
    groups: dict[int, list[Trajectory]] = {}
    for trajectory in trajectories:
        trajectory.advantage = 0.0
        if not trajectory.excluded:
            groups.setdefault(trajectory.question_index, []).append(trajectory)
    for members in groups.values():
        for trajectory, advantage in zip(
            members, group_advantages([t.reward for t in members], mode), strict=True
        ):
            trajectory.advantage = advantage
