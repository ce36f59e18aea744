"""What a step's summary line says about excluded trajectories and all-alike groups
(:mod:`retool.training.step_notes`), one table row per case."""

from __future__ import annotations

import pytest

from retool.data.examples import MathExample
from retool.rollout.types import StopReason, Trajectory
from retool.training.step_notes import AlikeNote, exclusion_note, infrastructure_stop

S = StopReason
EXAMPLE = MathExample(id="q1", question="2+2?", answer="4")


def ended(reason: StopReason, error: str | None = None) -> Trajectory:
    trajectory = Trajectory(example=EXAMPLE, group_index=0, messages=[])
    trajectory.stop_reason, trajectory.error = reason, error
    return trajectory


BOOM = "BackendError: tinker: sample failed: 404 Not Found\nbody of the page"


@pytest.mark.parametrize(
    ("stops", "note"),
    [
        ([S.ANSWER, S.INVALID], ""),  # nothing excluded: nothing said
        (
            [S.ANSWER, S.SAMPLER_ERROR, S.PROMPT_TOO_LONG],
            "  excluded 2/3: 1 prompt_too_long, 1 sampler_error (last error: "
            "BackendError: tinker: sample failed: 404 Not Found)",
        ),
        ([S.PROMPT_TOO_LONG, S.ANSWER], "  excluded 1/2: 1 prompt_too_long"),  # no error: a setting
        ([S.SANDBOX_UNREPORTED, S.ANSWER], ""),  # the trajectory's own failure, trained
    ],
)
def test_exclusion_note(stops, note):
    trajectories = [
        ended(s, BOOM if s in (S.SAMPLER_ERROR, S.SANDBOX_ERROR) else None) for s in stops
    ]
    assert exclusion_note(trajectories) == note


@pytest.mark.parametrize(
    ("stops", "completed", "expected"),
    [
        (
            [S.SAMPLER_ERROR] * 4,
            2,
            ("all 4 trajectories failed (4 in the sampler after 2", "step 2 is"),
        ),
        (
            [S.SAMPLER_ERROR, S.SANDBOX_ERROR],
            0,
            ("1 in the sampler after 2 retries each, 1 in the sandbox after 3", "no step was"),
        ),
        ([S.SAMPLER_ERROR, S.ANSWER], 1, None),  # one came through: the step trains
        ([S.PROMPT_TOO_LONG, S.SAMPLER_ERROR], 1, None),  # a setting, not only failures
        ([], 1, None),
    ],
)
def test_infrastructure_stop(stops, completed, expected):
    line = infrastructure_stop(
        5, [ended(s, BOOM) for s in stops], sample_retries=2, sandbox_retries=3, completed=completed
    )
    if expected is None:
        assert line is None
        return
    assert line is not None and "\n" not in line and line.startswith("step 5: ")
    for part in expected:
        assert part in line
    assert "last error: BackendError: tinker: sample failed: 404 Not Found)" in line
    # a run with a completed step resumes; a new one has nothing to resume (its directory goes)
    then = "run the same command with --resume" if completed else "run the same command again"
    assert line.endswith(then)


def test_alike_note_says_what_to_do_once():
    note = AlikeNote()
    assert note(trained=True) == ""
    first, second = note(trained=False), note(trained=False)
    assert "retool sft" in first and "retool preflight" in first
    assert second == "  (every group scored alike: nothing to train)"
    assert note(trained=False, excluded_all=True) == ""  # every trajectory excluded: not alike
