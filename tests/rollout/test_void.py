"""SimpleTIR's filter (``rollout.drop_void``): which trajectories are void, and that
they keep their rewards (in their group's mean too) but do not train."""

from __future__ import annotations

import pytest

from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.rollout import rollout_batch
from retool.rollout.types import StopReason, Trajectory
from retool.rollout.void import is_void
from tests.builders import scripted_rollout
from tests.rollout.fakes import ScriptedSampler, answer_text

# what each member of the group writes, and how it ends (no sandbox: a call is past
# the code-call budget)
MEMBERS = [
    (answer_text("7"), StopReason.ANSWER),  # right: trains
    (answer_text("8"), StopReason.ANSWER),  # wrong but boxed: trains
    ("I think it is seven, or so.", StopReason.ANSWER),  # no box: void
    ("Let me compute.\n```python\nprint(7)\n```\n", StopReason.MAX_CODE_CALLS),  # trains
    ("Let me compute.\n```python\nprint(7", StopReason.INVALID),  # a partial call: void
    ("seven " * 200, StopReason.ANSWER),  # cut at max_assistant_tokens, no box: void
]
VOID = [False, False, True, False, True, True]


def config(**overrides) -> RolloutConfig:
    base = dict(
        group_size=len(MEMBERS),
        max_trajectory_tokens=1024,
        max_assistant_tokens=64,
        max_tool_response_tokens=64,
    )
    return scripted_rollout(**{**base, **overrides})


@pytest.fixture
def run(smol_tokenizer):
    def run(cfg: RolloutConfig):
        sampler = ScriptedSampler(smol_tokenizer, lambda call: MEMBERS[call.index][0])
        question = MathExample("q", "What is 3 + 4?", "7")
        return rollout_batch(sampler, smol_tokenizer, None, [question], cfg, step=1)

    return run


def test_void_trajectories_keep_their_rewards_in_the_mean_but_do_not_train(run):
    kept = run(config())
    dropped = run(config(drop_void=True))
    for result in (kept, dropped):
        ends = [t.stop_reason for t in result.trajectories]
        assert ends == [reason for _, reason in MEMBERS]
        assert [is_void(t) for t in result.trajectories] == VOID
        assert [t.reward for t in result.trajectories] == [1.0, -1, -1, -1, -1, -1]
        assert result.metrics()["rollout/void_rate"] == pytest.approx(3 / 6)
    assert result.trajectories[-1].turns[-1].sampler_stop == "length"
    mean = -4 / 6  # of all six rewards, void ones included
    assert [t.advantage for t in kept.trajectories] == pytest.approx([1 - mean] + [-1 - mean] * 5)
    assert [t.advantage for t in dropped.trajectories] == pytest.approx(
        [1 - mean, -1 - mean, 0, -1 - mean, 0, 0]
    )
    assert kept.training_trajectories() == kept.trajectories
    assert [t.group_index for t in dropped.training_trajectories()] == [0, 1, 3]
    assert "rollout/dropped_void" not in kept.metrics()
    assert dropped.metrics()["rollout/dropped_void"] == 3.0


def test_the_filter_composes_with_dynamic_sampling(run):
    # one informative group: the filter leaves its complete members to train
    result = run(config(drop_void=True, dynamic_sampling=True, max_oversample=0))
    assert result.metrics()["rollout/filtered_groups"] == 0.0
    assert [t.group_index for t in result.training_trajectories()] == [0, 1, 3]


def _ended(reason: StopReason, boxed: bool) -> Trajectory:
    trajectory = Trajectory(MathExample("q", "?", "1"), 0, [])
    trajectory.stop_reason, trajectory.valid_format = reason, boxed
    return trajectory


@pytest.mark.parametrize(
    "reason, boxed, void",
    [
        (StopReason.ANSWER, True, False),
        (StopReason.ANSWER, False, True),
        (StopReason.INVALID, False, True),
        (StopReason.BUDGET_EXHAUSTED, True, True),  # cut by the budget, boxed or not
        (StopReason.OBSERVATION_TOO_LONG, False, True),
        (StopReason.MAX_TURNS, False, False),
        (StopReason.MAX_CODE_CALLS, False, False),
        (StopReason.TEXT_ERROR, False, False),
        (StopReason.SANDBOX_UNREPORTED, False, False),
        (StopReason.SAMPLER_ERROR, False, False),  # excluded: neither trains nor counts
    ],
)
def test_which_ends_are_void(reason, boxed, void):
    assert is_void(_ended(reason, boxed)) is void
