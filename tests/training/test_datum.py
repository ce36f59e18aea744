"""build_datum: the chapter's worked example token for token, and every check raising."""

import math

import numpy as np
import pytest

from retool.data.examples import MathExample
from retool.rollout.types import AssistantTurn, StopReason, Trajectory
from retool.training.datum import (
    DatumError,
    TrainingDatum,
    build_datum,
    build_training_datums,
    datum_loss_tokens,
)
from retool.types import Datum, ModelInput, TensorData

P1 = [101, 102, 103]
C1 = [201, 202, 90]  # 90: the closing the sampler produced (trained)
LP1 = [-0.1, -0.2, -0.3]
D2 = [91, 301, 302, 303, 104]  # template closing, tool wrapper + observation, next prefix
C2 = [401, 402]
LP2 = [-0.4, -0.5]


def _trajectory(turns, advantage=0.75, *, question=4, branch=2, example="ex-7", stop=None):
    trajectory = Trajectory(
        example=MathExample(id=example, question="1+1?", answer="2"),
        group_index=branch,
        messages=[],
        question_index=question,
    )
    for prompt, completion, logprobs in turns:
        trajectory.turns.append(
            AssistantTurn(list(prompt), list(completion), list(logprobs), text="")
        )
    trajectory.advantage = advantage
    trajectory.stop_reason = stop or StopReason.ANSWER
    return trajectory


def _chapter_example(advantage=0.75):
    return _trajectory([(P1, C1, LP1), (P1 + C1 + D2, C2, LP2)], advantage)


def _arrays(td: TrainingDatum):
    inputs = td.datum.loss_fn_inputs
    return (
        td.datum.model_input.to_ints(),
        inputs["target_tokens"].tolist(),
        inputs["logprobs"].tolist(),
        inputs["advantages"].tolist(),
    )


def test_chapter_worked_example_token_for_token():
    td = build_datum(_chapter_example(), max_context_tokens=8192, index=5)
    tokens, targets, logprobs, advantages = _arrays(td)
    full = [101, 102, 103, 201, 202, 90, 91, 301, 302, 303, 104, 401, 402]
    old = [0.0, 0.0, 0.0, -0.1, -0.2, -0.3, 0.0, 0.0, 0.0, 0.0, 0.0, -0.4, -0.5]
    adv = [0.0, 0.0, 0.0, 0.75, 0.75, 0.75, 0.0, 0.0, 0.0, 0.0, 0.0, 0.75, 0.75]
    assert tokens == full[:-1] == [101, 102, 103, 201, 202, 90, 91, 301, 302, 303, 104, 401]
    assert targets == full[1:] == [102, 103, 201, 202, 90, 91, 301, 302, 303, 104, 401, 402]
    np.testing.assert_allclose(logprobs, old[1:], rtol=0, atol=1e-7)
    assert advantages == adv[1:]
    assert td.datum.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert td.datum.loss_fn_inputs["logprobs"].dtype == "float32"
    # Exactly the five sampled tokens C1 + C2 train, each with its own logprob.
    loss = [i for i, a in enumerate(advantages) if a != 0]
    assert [targets[i] for i in loss] == C1 + C2
    np.testing.assert_allclose([logprobs[i] for i in loss], LP1 + LP2, atol=1e-7)
    assert td.loss_tokens == datum_loss_tokens(td.datum) == 5
    assert td.num_tokens == len(tokens) == 12
    assert td.trajectory_index == 5
    # The template's closing 91 and the observation are context only.
    assert all(advantages[targets.index(t)] == 0 for t in [91, 301, 302, 303, 104])


def test_three_turns_with_an_empty_delta():
    p2 = P1 + C1 + D2
    c3, lp3 = [501, 502, 503, 2], [-1.0, -1.5, -0.25, -0.01]
    d3 = [92, 310, 105]
    p3 = p2 + C2 + d3
    td = build_datum(
        _trajectory([(P1, C1, LP1), (p2, C2, LP2), (p3, c3, lp3)], advantage=-0.5),
        max_context_tokens=19,
    )
    tokens, targets, logprobs, advantages = _arrays(td)
    full = P1 + C1 + D2 + C2 + d3 + c3
    assert tokens == full[:-1] and targets == full[1:]
    assert td.num_tokens == 19 and td.loss_tokens == 9
    sampled = C1 + C2 + c3
    loss = [i for i, a in enumerate(advantages) if a != 0]
    assert [targets[i] for i in loss] == sampled
    assert {advantages[i] for i in loss} == {-0.5}
    np.testing.assert_allclose([logprobs[i] for i in loss], LP1 + LP2 + lp3, atol=1e-7)
    assert all(logprobs[i] == 0 for i in range(len(targets)) if i not in loss)
    # A turn whose prompt adds nothing (D = []) simply continues the sequence.
    td2 = build_datum(_trajectory([(P1, C1, LP1), (P1 + C1, C2, LP2)]), max_context_tokens=100)
    assert [*td2.datum.model_input.to_ints(), C2[-1]] == P1 + C1 + C2
    assert td2.loss_tokens == 5


def test_context_limit_is_on_the_shifted_input():
    trajectory = _chapter_example()
    assert build_datum(trajectory, max_context_tokens=12).num_tokens == 12
    with pytest.raises(DatumError, match=r"12 tokens .*max_context_tokens=11"):
        build_datum(trajectory, max_context_tokens=11)


def _raises(trajectory, *patterns, max_context_tokens=8192):
    with pytest.raises(DatumError) as info:
        build_datum(trajectory, max_context_tokens, index=3)
    message = str(info.value)
    # Every message names the trajectory: batch slot, question, branch, example id.
    assert "trajectory 3 (question 4, branch 2, example 'ex-7')" in message, message
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_no_turns():
    _raises(_trajectory([]), "no assistant turns")


def test_completion_and_logprob_lengths_differ():
    trajectory = _chapter_example()
    trajectory.turns[1].logprobs.append(-0.6)  # AssistantTurn checks only at construction
    _raises(trajectory, "turn 1 has 2 completion tokens but 3 logprobs")


def test_prompt_that_does_not_extend_the_tokens_so_far():
    rewritten = [*P1, 201, 299, 90, *D2]  # history re-encoded: C1 changed at position 4
    _raises(
        _trajectory([(P1, C1, LP1), (rewritten, C2, LP2)]),
        "turn 1's prompt",
        "diverge at position 4",
        "expected 202, found 299",
    )
    shorter = P1 + C1[:2]  # a prompt that drops the end of the history
    _raises(
        _trajectory([(P1, C1, LP1), (shorter, C2, LP2)]),
        "diverge at position 5",
        "the end of the prompt",
    )


def test_no_assistant_token_at_all():
    _raises(_trajectory([(P1, [], []), (P1 + D2, [], [])]), "no assistant token")


def test_context_limit_message_names_the_trajectory():
    _raises(_chapter_example(), "max_context_tokens=4", max_context_tokens=4)


def test_non_finite_values_and_empty_first_prompt():
    _raises(_chapter_example(advantage=math.nan), "advantage is nan")
    _raises(_trajectory([(P1, C1, [-0.1, -math.inf, -0.3])]), "turn 0", "non-finite logprob")
    _raises(_trajectory([([], C1, LP1)]), "turn 0 has an empty prompt")


def test_build_training_datums_keeps_only_what_trains():
    good = _chapter_example()
    negative = _trajectory([(P1, C1, LP1)], advantage=-0.25, branch=3)
    zero = _chapter_example(advantage=0.0)
    excluded = _trajectory([(P1, C1, LP1)], advantage=0.5, stop=StopReason.SAMPLER_ERROR)
    empty = _trajectory([(P1, [], [])], advantage=0.5)
    never_sampled = _trajectory([], advantage=0.5)
    batch = [zero, good, excluded, empty, negative, never_sampled]
    datums = build_training_datums(batch, max_context_tokens=8192)
    assert [d.trajectory_index for d in datums] == [1, 4]
    assert [d.loss_tokens for d in datums] == [5, 3]
    assert "branch 3" in datums[1].id
    assert build_training_datums([zero, excluded], 8192) == []
    broken = _chapter_example()
    broken.turns[1].prompt_tokens[0] = 999
    with pytest.raises(DatumError, match="trajectory 1 .*diverge at position 0"):
        build_training_datums([zero, broken], 8192)


def test_datum_loss_tokens_reads_weights_for_sft():
    datum = Datum(
        ModelInput.from_ints([1, 2, 3, 4]),
        {
            "target_tokens": TensorData.from_list([2, 3, 4, 5], "int64"),
            "weights": TensorData.from_list([0.0, 1.0, 1.0, 0.0]),
        },
    )
    assert datum_loss_tokens(datum) == 2
    with pytest.raises(DatumError, match="neither"):
        datum_loss_tokens(Datum(ModelInput.from_ints([1]), {}))
