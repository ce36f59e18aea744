"""The rollout engine: code-interlaced trajectories, sampled, executed and scored.

``rollout_batch(sampling_client, tokenizer, sandbox, examples, config)``
returns ``len(examples) * config.group_size`` :class:`Trajectory` objects in
(question, group) order, each with its turns (real tokens and logprobs), its
observations, a ``stop_reason``, a reward and a group-centred advantage.

Modules: ``types`` (the values), ``scheduler`` (the state machine and its
barrier-free scheduler), ``sampling`` (sampler requests: bounded, checked,
retried), ``tools`` (sandbox calls: bounded, retried, shared, judged on
evidence), ``retry`` (the one retry loop both use), ``scoring`` (the reward of
a final text, and its failures), ``dynamic_sampling`` (which reserve questions
run), ``budget`` (turn budgets and exact observation fitting), ``seeds``
(per-request sampling seeds), ``advantages`` (group centring), ``result`` (the
batch result and its metrics), ``sync`` (the synchronous twins).
"""

from retool.config import RolloutConfig
from retool.rollout.advantages import EPS, assign_group_advantages, group_advantages
from retool.rollout.budget import FittedObservation, TurnPlan, fit_observation, plan_turn
from retool.rollout.result import RolloutCounters, RolloutResult
from retool.rollout.scheduler import check_context_limit, rollout_batch, rollout_batch_async
from retool.rollout.seeds import sample_seed
from retool.rollout.types import (
    EXCLUDED_STOPS,
    AssistantTurn,
    Observation,
    ProgressCallback,
    ProgressEvent,
    StopReason,
    Trajectory,
)

__all__ = [
    "EPS",
    "EXCLUDED_STOPS",
    "AssistantTurn",
    "FittedObservation",
    "Observation",
    "ProgressCallback",
    "ProgressEvent",
    "RolloutConfig",
    "RolloutCounters",
    "RolloutResult",
    "StopReason",
    "Trajectory",
    "TurnPlan",
    "assign_group_advantages",
    "check_context_limit",
    "fit_observation",
    "group_advantages",
    "plan_turn",
    "rollout_batch",
    "rollout_batch_async",
    "sample_seed",
]
