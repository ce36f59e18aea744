"""What one rollout batch returns, and its metrics.

``RolloutResult.metrics()`` is a flat ``{name: float}`` for trackers. Rates
over trajectories are over the *included* ones (excluded trajectories have no
reward); ``stop/<reason>`` fractions are over all of them, so they add to 1.
The sandbox numbers are the window of this batch only (the reference logged
cumulative rates as if they were per step).

With ``rollout.dynamic_sampling`` the result also says which groups train:
only the informative ones (:func:`informative`), the others are *filtered*
(their advantages are 0 and :meth:`RolloutResult.training_trajectories`
leaves them out, so a loss aggregation's ``N`` counts only what trains, as
in DAPO). ``rollout/filtered_groups`` and ``rollout/extra_questions`` are
recorded only then.

``rollout/void_rate`` is always recorded: the share of included trajectories
that ended void or truncated (:mod:`retool.rollout.void`). With
``rollout.drop_void`` those do not train either, and ``rollout/dropped_void``
counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from retool.rollout.types import StopReason, Trajectory
from retool.rollout.void import is_void


@dataclass
class RolloutCounters:
    """Events counted while the batch ran."""

    sample_requests: int = 0  # sampler calls made, retries included
    sample_retries: int = 0  # sampler calls repeated after a failure
    sampler_failures: int = 0  # requests that failed every attempt
    sandbox_retries: int = 0  # sandbox calls repeated after an infrastructure failure
    sandbox_failures: int = 0  # calls that failed every attempt
    sandbox_unreported: int = 0  # calls failing every attempt after delivery (not excluded)
    tool_executions: int = 0  # sandbox calls made, retries included
    shared_code_hits: int = 0  # tool calls answered from identical code of the group
    text_mismatches: int = 0  # sampler text differed from the decode of its tokens
    text_missing: int = 0  # sampler returned no text (decoded from the tokens)
    reward_timeouts: int = 0  # equivalence checks cut at their deadline
    reward_failures: int = 0  # answers that could not be scored (worker died, scoring raised): -1
    sampled_tokens: int = 0  # completion tokens received
    skipped_questions: int = 0  # questions whose first prompt did not fit


def informative(members: Sequence[Trajectory]) -> bool:
    """Whether a group gives a learning signal: two included members that scored differently."""
    rewards = {t.reward for t in members if not t.excluded}
    included = sum(not t.excluded for t in members)
    return included >= 2 and len(rewards) > 1


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass
class RolloutResult:
    """``num_questions x group_size`` trajectories in (question, group) order."""

    trajectories: list[Trajectory]
    group_size: int
    num_questions: int
    wall_seconds: float
    counters: RolloutCounters = field(default_factory=RolloutCounters)
    sandbox: dict[str, float] = field(default_factory=dict)  # this batch's window
    filtering: bool = False  # rollout.dynamic_sampling: uninformative groups do not train
    extra_questions: int = 0  # questions drawn beyond the batch to replace filtered groups
    dropping_void: bool = False  # rollout.drop_void: void trajectories do not train

    @property
    def included(self) -> list[Trajectory]:
        return [t for t in self.trajectories if not t.excluded]

    def groups(self) -> list[list[Trajectory]]:
        """The trajectories of each question slot, in order."""
        g = self.group_size
        return [self.trajectories[i * g : (i + 1) * g] for i in range(self.num_questions)]

    def degenerate_groups(self) -> int:
        """Questions that give no learning signal: fewer than two included
        trajectories, or every included reward equal (all right or all wrong)."""
        return sum(not informative(members) for members in self.groups())

    def training_trajectories(self) -> list[Trajectory]:
        """The trajectories that count in the step's loss: all of them, less, with
        filtering, those of uninformative groups and, dropping void, the void ones."""
        kept = self.trajectories
        if self.filtering:
            kept = [t for members in self.groups() if informative(members) for t in members]
        if self.dropping_void:
            kept = [t for t in kept if not is_void(t)]
        return list(kept)

    def metrics(self) -> dict[str, float]:
        trajectories = self.trajectories
        included = self.included
        total = max(len(trajectories), 1)
        turns = [t for tr in included for t in tr.turns]
        call_attempts = sum(t.parse_kind in ("tool", "invalid") for t in turns)
        code_calls = sum(t.code_calls for t in included)
        logprobs = [lp for t in turns for lp in t.logprobs]
        metrics: dict[str, float] = {
            "reward/mean": _mean([t.reward for t in included]),
            "reward/correct": _mean([float(t.correct) for t in included]),
            "reward/format": _mean([float(t.valid_format) for t in included]),
            "rollout/trajectories": float(len(trajectories)),
            "rollout/excluded": float(len(trajectories) - len(included)),
            "rollout/turns": _mean([float(len(t.turns)) for t in included]),
            "rollout/code_calls": _mean([float(t.code_calls) for t in included]),
            "rollout/trajectory_tokens": _mean([float(t.total_tokens) for t in included]),
            "rollout/valid_tool_call_rate": code_calls / call_attempts if call_attempts else 0.0,
            # share of trajectories that ran at least one call (code_calls is the mean count)
            "rollout/tool_use_rate": _mean([float(t.code_calls > 0) for t in included]),
            # mean -logprob of the sampled tokens under the sampler: an unbiased estimate of
            # the sampling policy's per-token entropy (nats), which RL tends to drive down
            "rollout/sampled_nll": -_mean(logprobs) if logprobs else 0.0,
            # ended without a complete call or answer, or cut by the token budget
            "rollout/void_rate": _mean([float(is_void(t)) for t in included]),
            "rollout/degenerate_group_rate": (
                self.degenerate_groups() / self.num_questions if self.num_questions else 0.0
            ),
            "rollout/sampled_tokens": float(self.counters.sampled_tokens),
            "rollout/tokens_per_s": (
                self.counters.sampled_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0
            ),
            "rollout/wall_s": self.wall_seconds,
        }
        if self.filtering:
            metrics["rollout/filtered_groups"] = float(self.degenerate_groups())
            metrics["rollout/extra_questions"] = float(self.extra_questions)
        if self.dropping_void:
            metrics["rollout/dropped_void"] = float(sum(is_void(t) for t in included))
        for name, value in asdict(self.counters).items():
            if name != "sampled_tokens":
                metrics[f"rollout/{name}"] = float(value)
        for reason in StopReason:
            count = sum(t.stop_reason == reason for t in trajectories)
            metrics[f"stop/{reason.value}"] = count / total
        for name, value in self.sandbox.items():
            metrics[f"sandbox/{name}"] = float(value)
        return metrics
