"""Void and truncated trajectories (``rollout.drop_void``, SimpleTIR's filter).

SimpleTIR (Xue et al., 2025) traced the gradient spikes of multi-turn
tool-integrated RL to *void turns*: a turn that holds neither a complete tool
call nor a final answer. Such a turn ends in low-probability tokens (a call
cut off, a turn that trails away), and their importance ratios and gradients
are the largest of the batch; masking the trajectories that hold one from the
policy loss kept its training stable. DAPO's overlong filter does the same for
trajectories cut by the length budget: a -1 for running out of room punishes
reasoning that was not wrong.

A trajectory is dropped (:func:`is_void`) when it ended

* ``invalid``: its last turn was a partial, malformed or repeated call;
* ``answer`` without a complete ``\\boxed{}`` (``valid_format`` false): a turn
  that trailed off, or was cut at ``rollout.max_assistant_tokens``, with no answer;
* ``budget_exhausted`` or ``observation_too_long``: cut by the trajectory's
  token budget (a turn cut mid-way, or no room left for the next one).

Every turn but the last was a complete call (anything else ends the
trajectory), so looking at how it ended is enough. Ends that are the
policy's own complete choices still train: a boxed answer, right or wrong,
and a complete call past ``rollout.max_code_calls`` or ``max_assistant_turns``
(the -1 teaches the budget). ``text_error`` trains too: the text handling
raised on the model's own output, which is its failure to own, not a void turn.

What dropping means: the trajectory keeps its reward, is scored and reported
like any other, and its reward stays in its group's mean (the filter masks the
loss; it does not change what the group's other members are compared with). Its
advantage is set to 0, so it makes no datum, and the loss aggregation's ``N``
does not count it (:meth:`~retool.rollout.result.RolloutResult.training_trajectories`).
"""

from __future__ import annotations

from collections.abc import Sequence

from retool.rollout.types import StopReason, Trajectory

# how a trajectory that was cut by its token budget ends
TRUNCATED_STOPS = frozenset({StopReason.BUDGET_EXHAUSTED, StopReason.OBSERVATION_TOO_LONG})


def is_void(trajectory: Trajectory) -> bool:
    """Whether ``trajectory`` ended without a complete call or answer, or was truncated."""
    reason = trajectory.stop_reason
    if reason == StopReason.INVALID or reason in TRUNCATED_STOPS:
        return True
    return reason == StopReason.ANSWER and not trajectory.valid_format


def drop_void(trajectories: Sequence[Trajectory]) -> int:
    """Advantage 0 for every void trajectory (after the groups' advantages are
    assigned, so their rewards stay in the means); returns how many were dropped."""
    dropped = 0
    for trajectory in trajectories:
        if not trajectory.excluded and is_void(trajectory):
            trajectory.advantage = 0.0
            dropped += 1
    return dropped
