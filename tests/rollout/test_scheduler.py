"""The rollout state machine against a scripted sampler and sandbox.

Each test pins one invariant of the method (docs/architecture.md, "Where each
rule of the method lives") or one defect of the reference rollout that this
one fixes (README, "Fixed defects of the reference"), with the real SmolLM2
tokenizer and the ``markdown`` dialect.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.errors import ConfigError
from retool.protocol import get_protocol
from retool.rollout import (
    ProgressEvent,
    StopReason,
    rollout_batch,
    rollout_batch_async,
    sample_seed,
)
from retool.sandbox import ErrorKind, ExecResult
from tests.builders import scripted_rollout
from tests.rollout.fakes import (
    FakeSandbox,
    ScriptedSampler,
    answer_text,
    call_text,
    sandbox_failure,
    seeded_choice,
)

Q1 = MathExample("q1", "What is 2^10?", "1024")
Q2 = MathExample("q2", "What is 3^5?", "243")
OUTPUTS = {"print(2**10)": "1024\n", "print(3**5)": "243\n"}


def config(**overrides) -> RolloutConfig:
    base = dict(
        group_size=2,
        max_trajectory_tokens=2048,
        max_assistant_tokens=256,
        max_tool_response_tokens=128,
        protocol="markdown",
    )
    return scripted_rollout(**{**base, **overrides})


def code_then_answer(call) -> str:
    """Turn 0: call the tool with the question's code; turn 1: box the output."""
    two = "2^10" in call.prompt_text
    if call.turn == 0:
        return call_text("print(2**10)" if two else "print(3**5)")
    return answer_text("1024" if two else "243")


def lookup(code: str) -> str:
    return OUTPUTS.get(code, "")


def run(sampler, sandbox, examples, cfg, **kwargs):
    return rollout_batch(sampler, sampler.tokenizer, sandbox, examples, cfg, **kwargs)


def test_two_turn_trajectory_continues_token_exactly(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    sandbox = FakeSandbox(lookup)
    result = run(sampler, sandbox, [Q1], config())
    assert len(result.trajectories) == 2
    for trajectory in result.trajectories:
        t1, t2 = trajectory.turns
        assert trajectory.stop_reason == StopReason.ANSWER
        assert trajectory.code_calls == 1 and trajectory.correct and trajectory.reward == 1.0
        # P2 == P1 + C1 + D1: the next prompt extends the real tokens.
        assert t2.prompt_tokens[: len(t1.prompt_tokens) + len(t1.completion_tokens)] == (
            t1.prompt_tokens + t1.completion_tokens
        )
        dialect = get_protocol("markdown")
        messages = dialect.initial_messages(Q1.question, smol_tokenizer)
        delta = dialect.continuation_delta(
            smol_tokenizer,
            messages,
            t1.completion_tokens,
            dialect.tool_message("code-0-0-1", "1024\n"),
        )
        assert t2.prompt_tokens == t1.prompt_tokens + t1.completion_tokens + delta
        assert trajectory.next_prompt_tokens == t2.prompt_tokens
        assert [len(t.completion_tokens) == len(t.logprobs) for t in (t1, t2)] == [True, True]
        assert trajectory.final_text == t2.text
        assert [m["role"] for m in trajectory.messages] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        assert trajectory.observations[0].content == "1024\n"
        assert trajectory.observations[0].call_id == f"code-0-{trajectory.group_index}-1"
    # Both correct: a degenerate group, advantage 0.
    assert [t.advantage for t in result.trajectories] == [0.0, 0.0]


def test_first_request_samples_the_group_later_requests_one(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    result = run(sampler, FakeSandbox(lookup), [Q1, Q2], config(group_size=3))
    assert len(result.trajectories) == 6
    firsts = [r for r in sampler.requests if r.num_samples == 3]
    later = [r for r in sampler.requests if r.num_samples == 1]
    assert len(firsts) == 2 and len(later) == 6
    assert len(sampler.requests) == 8
    # (question, group) order whatever finished first.
    assert [(t.question_index, t.group_index) for t in result.trajectories] == [
        (q, g) for q in range(2) for g in range(3)
    ]


def test_invalid_turn_is_recorded_before_parsing(smol_tokenizer):
    sampler = ScriptedSampler(
        smol_tokenizer, lambda call: "Let me try\n```python\nprint(1)\n```\nand more text"
    )
    sandbox = FakeSandbox(lookup)
    result = run(sampler, sandbox, [Q1], config())
    for trajectory in result.trajectories:
        assert trajectory.stop_reason == StopReason.INVALID
        assert len(trajectory.turns) == 1 and trajectory.turns[0].parse_kind == "invalid"
        assert trajectory.turns[0].completion_tokens and trajectory.reward == -1.0
    assert sandbox.calls == []


def test_turn_limit_with_a_pending_call_does_not_execute_it(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, lambda call: call_text("print(2**10)"))
    sandbox = FakeSandbox(lookup)
    result = run(sampler, sandbox, [Q1], config(max_assistant_turns=2, group_size=1))
    (trajectory,) = result.trajectories
    assert trajectory.stop_reason == StopReason.MAX_TURNS
    assert len(trajectory.turns) == 2 and trajectory.code_calls == 1
    assert len(sandbox.calls) == 1  # the second turn's call was never run
    assert trajectory.final_text == trajectory.turns[-1].text


def test_call_after_code_calls_are_exhausted(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, lambda call: call_text("print(2**10)"))
    sandbox = FakeSandbox(lookup)
    result = run(sampler, sandbox, [Q1], config(max_code_calls=2, group_size=1))
    (trajectory,) = result.trajectories
    assert trajectory.stop_reason == StopReason.MAX_CODE_CALLS
    assert len(trajectory.turns) == 3 and trajectory.code_calls == 2
    assert len(sandbox.calls) == 2


def test_tools_disabled_ends_a_call_as_max_code_calls(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    result = run(sampler, None, [Q1], config(group_size=1))
    (trajectory,) = result.trajectories
    assert trajectory.stop_reason == StopReason.MAX_CODE_CALLS
    assert len(trajectory.turns) == 1


@pytest.mark.parametrize("group, correct", [(4, 1), (4, 3), (8, 2), (5, 0), (6, 6)])
def test_group_advantages_follow_the_closed_form(smol_tokenizer, group, correct):
    def script(call):
        return answer_text("1024" if call.index < correct else "7")

    result = run(
        ScriptedSampler(smol_tokenizer, script), FakeSandbox(lookup), [Q1], config(group_size=group)
    )
    for trajectory in result.trajectories:
        if trajectory.correct:
            assert trajectory.advantage == pytest.approx(2 * (group - correct) / group)
        else:
            assert trajectory.advantage == pytest.approx(-2 * correct / group)
    assert sum(t.correct for t in result.trajectories) == correct


def test_mean_std_advantages_are_normalised(smol_tokenizer):
    def script(call):
        return answer_text("1024" if call.index < 1 else "7")

    result = run(
        ScriptedSampler(smol_tokenizer, script),
        FakeSandbox(lookup),
        [Q1],
        config(group_size=4, advantage="mean_std"),
    )
    advantages = [t.advantage for t in result.trajectories]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-9)
    assert sum(a * a for a in advantages) / 4 == pytest.approx(1.0, rel=1e-5)


def test_advantages_group_by_slot_not_by_question_id(smol_tokenizer):
    # The same question twice in one batch forms two groups.
    def script(call):
        return answer_text("1024" if call.seed % 2 == 0 or call.index == 0 else "5")

    result = run(
        ScriptedSampler(smol_tokenizer, script), FakeSandbox(lookup), [Q1, Q1], config(group_size=2)
    )
    for members in result.groups():
        assert sum(t.advantage for t in members) == pytest.approx(0.0)
        assert len({t.question_index for t in members}) == 1


def test_sampler_failing_once_is_retried(smol_tokenizer):
    sampler = ScriptedSampler(
        smol_tokenizer,
        code_then_answer,
        fail=lambda n: ConnectionError("service unavailable") if n == 1 else None,
    )
    result = run(sampler, FakeSandbox(lookup), [Q1], config())
    assert all(t.stop_reason == StopReason.ANSWER for t in result.trajectories)
    assert result.counters.sample_retries == 1
    assert result.metrics()["rollout/sample_retries"] == 1


def test_sampler_always_failing_ends_trajectories_as_sampler_error(smol_tokenizer):
    # Question 2's requests always fail; question 1 goes on.
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)

    original = sampler.sample_async

    async def flaky(prompt, num_samples, params):
        if "3^5" in smol_tokenizer.decode(prompt.to_ints()):
            raise RuntimeError("the sampler process died")
        return await original(prompt, num_samples, params)

    sampler.sample_async = flaky
    result = run(sampler, FakeSandbox(lookup), [Q1, Q2], config(sample_retries=2))
    first, second = result.groups()
    assert all(t.stop_reason == StopReason.ANSWER and t.reward == 1 for t in first)
    assert all(t.stop_reason == StopReason.SAMPLER_ERROR for t in second)
    assert all(t.excluded and t.reward == 0 and t.advantage == 0 for t in second)
    assert "died" in second[0].error
    metrics = result.metrics()
    assert metrics["stop/sampler_error"] == 0.5
    assert metrics["rollout/excluded"] == 2
    assert metrics["reward/mean"] == 1.0  # over the included trajectories only


def test_later_turn_sampler_failure_ends_only_that_trajectory(smol_tokenizer):
    def fail(n):
        return RuntimeError("boom") if n >= 2 else None  # every later request fails

    sampler = ScriptedSampler(smol_tokenizer, code_then_answer, fail=fail)
    result = run(sampler, FakeSandbox(lookup), [Q1], config(sample_retries=1))
    assert [t.stop_reason for t in result.trajectories] == [StopReason.SAMPLER_ERROR] * 2
    assert all(len(t.turns) == 1 and t.code_calls == 1 for t in result.trajectories)
    assert result.counters.sampler_failures == 2


def test_results_do_not_depend_on_completion_order(smol_tokenizer):
    def script(call):
        if call.turn == 0:
            return seeded_choice(
                call, [call_text("print(2**10)"), call_text("print(3**5)"), answer_text("12")]
            )
        return seeded_choice(call, [answer_text("1024"), answer_text("243"), "no idea"])

    def snapshot(result):
        return [
            (t.question_index, t.group_index, t.stop_reason, [x.completion_tokens for x in t.turns])
            for t in result.trajectories
        ]

    cfg = config(group_size=4)
    plain = run(ScriptedSampler(smol_tokenizer, script), FakeSandbox(lookup), [Q1, Q2], cfg)
    for delays in (lambda c: 0.02 * (c.seed % 5), lambda c: 0.02 * (4 - c.seed % 5)):
        shuffled = run(
            ScriptedSampler(smol_tokenizer, script, delay=delays),
            FakeSandbox(lookup, delay=lambda code: 0.03 if "3" in code else 0.0),
            [Q1, Q2],
            cfg,
        )
        assert snapshot(shuffled) == snapshot(plain)
        assert [t.advantage for t in shuffled.trajectories] == [
            t.advantage for t in plain.trajectories
        ]


def test_no_round_barrier_a_slow_tool_call_holds_no_one_else(smol_tokenizer):
    # Question 2's tool call is held until question 1's trajectories have
    # ended after three tool calls each. With a round barrier this deadlocks.
    q1_done = asyncio.Event()
    ended = []

    def script(call):
        if "2^10" in call.prompt_text:
            return call_text("print(2**10)") if call.turn < 3 else answer_text("1024")
        return call_text("print(3**5)") if call.turn == 0 else answer_text("243")

    def progress(event: ProgressEvent):
        ended.append(event.trajectory.question_index)
        if ended.count(0) == 2:
            q1_done.set()

    sandbox = FakeSandbox(lookup, gate=lambda code: q1_done if "3" in code else None)
    sampler = ScriptedSampler(smol_tokenizer, script)

    async def main():
        return await asyncio.wait_for(
            rollout_batch_async(
                sampler, smol_tokenizer, sandbox, [Q1, Q2], config(), progress=progress
            ),
            timeout=30,
        )

    result = asyncio.run(main())
    assert ended[:2] == [0, 0]
    assert [t.code_calls for t in result.trajectories] == [3, 3, 1, 1]
    assert all(t.correct for t in result.trajectories)


def test_truncated_observation_keeps_head_and_tail_within_both_budgets(smol_tokenizer):
    long_output = "".join(f"line {i}: value {i * i}\n" for i in range(400)) + "FINAL 42\n"

    def script(call):
        return call_text("print(big)") if call.turn == 0 else answer_text("42")

    cfg = config(group_size=1, max_tool_response_tokens=100, min_observation_tokens=16)
    result = run(
        ScriptedSampler(smol_tokenizer, script), FakeSandbox(lambda c: long_output), [Q1], cfg
    )
    (trajectory,) = result.trajectories
    observation = trajectory.observations[0]
    assert observation.truncated and observation.appended
    assert observation.content_tokens <= 100
    assert len(smol_tokenizer.encode(observation.content, add_special_tokens=False)) <= 100
    assert observation.content.startswith("line 0")
    assert "FINAL 42" in observation.content and "tokens cut ..." in observation.content
    assert trajectory.stop_reason == StopReason.ANSWER


@pytest.mark.parametrize("budget", [300, 330, 360, 400, 480])
def test_observation_fits_the_remaining_trajectory_budget_exactly(smol_tokenizer, budget):
    long_output = "x = " + "9" * 3000 + "\n"

    def script(call):
        return call_text("print(big)") if call.turn == 0 else answer_text("42")

    cfg = config(
        group_size=1,
        max_trajectory_tokens=budget,
        max_assistant_tokens=64,
        max_tool_response_tokens=budget,
        min_observation_tokens=8,
    )
    result = run(
        ScriptedSampler(smol_tokenizer, script), FakeSandbox(lambda c: long_output), [Q1], cfg
    )
    (trajectory,) = result.trajectories
    for turn in trajectory.turns:
        assert len(turn.prompt_tokens) + len(turn.completion_tokens) <= budget
    if trajectory.code_calls:
        assert len(trajectory.turns[1].prompt_tokens) <= budget - 1
    assert trajectory.stop_reason is not None


def test_prompt_too_long_question_is_kept_as_an_excluded_group(smol_tokenizer):
    long = MathExample("long", "What is " + "very " * 400 + "big?", "1")
    events = []
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    result = run(
        sampler,
        FakeSandbox(lookup),
        [Q1, long],
        config(max_trajectory_tokens=512),
        progress=events.append,
    )
    assert len(result.trajectories) == 4
    skipped = result.groups()[1]
    assert [t.stop_reason for t in skipped] == [StopReason.PROMPT_TOO_LONG] * 2
    assert all(t.reward == 0 and t.advantage == 0 and t.excluded for t in skipped)
    assert [t.group_index for t in skipped] == [0, 1]
    assert sum(e.count for e in events) == 4 and events[-1].finished == 4
    assert any(e.trajectory is None and e.count == 2 for e in events)
    assert result.metrics()["stop/prompt_too_long"] == 0.5
    assert result.metrics()["rollout/skipped_questions"] == 1
    assert all(r.prompt != [] for r in sampler.requests)
    assert len(sampler.requests) == 3  # only question 1 was sampled


def test_budget_end_keeps_the_last_assistant_text(smol_tokenizer):
    # The observation fits but leaves no room to sample: final_text is the call's text.
    def script(call):
        return call_text("print(2**10)", lead="I think it is \\boxed{1024} but let me check.")

    sampler = ScriptedSampler(smol_tokenizer, script)
    prompt_len = len(
        get_protocol("markdown").render_prompt(
            smol_tokenizer, get_protocol("markdown").initial_messages(Q1.question, smol_tokenizer)
        )
    )
    completion = len(smol_tokenizer.encode(script(None), add_special_tokens=False))
    cfg = config(
        group_size=1,
        max_trajectory_tokens=prompt_len + completion + 14,
        max_assistant_tokens=64,
        max_tool_response_tokens=8,
        min_observation_tokens=1,
    )
    result = run(sampler, FakeSandbox(lookup), [Q1], cfg)
    (trajectory,) = result.trajectories
    assert trajectory.stop_reason in (
        StopReason.BUDGET_EXHAUSTED,
        StopReason.OBSERVATION_TOO_LONG,
    )
    assert trajectory.final_text == trajectory.turns[-1].text != ""
    assert trajectory.correct  # the boxed answer in the last text is scored


def test_room_is_reserved_so_a_call_can_be_answered(smol_tokenizer):
    # A turn that could call the tool samples at most budget - reserve tokens.
    dialect = get_protocol("markdown")
    messages = dialect.initial_messages(Q1.question, smol_tokenizer)
    prompt_len = len(dialect.render_prompt(smol_tokenizer, messages))
    wrapper = len(
        dialect.continuation_delta(smol_tokenizer, messages, [], dialect.tool_message("c", ""))
    )

    def script(call):
        if call.turn == 0:  # a long call that would use every token it is given
            return call_text("print(2**10)  # " + "pad " * 400)
        return answer_text("1024")

    cfg = config(
        group_size=1,
        max_trajectory_tokens=prompt_len + 200,
        max_assistant_tokens=200,
        max_tool_response_tokens=32,
        min_observation_tokens=20,
    )
    sampler = ScriptedSampler(smol_tokenizer, script)
    result = run(sampler, FakeSandbox(lookup), [Q1], cfg)
    assert sampler.requests[0].params.max_tokens == 200 - wrapper - 20
    (trajectory,) = result.trajectories
    # The call was cut by its budget (invalid: unclosed block), but had it closed it
    # would have been answerable; the reserve is what the plan shows.
    assert trajectory.turns[0].max_tokens == 200 - wrapper - 20


def test_reserved_room_lets_a_maximal_call_be_answered(smol_tokenizer):
    dialect = get_protocol("markdown")
    messages = dialect.initial_messages(Q1.question, smol_tokenizer)
    prompt_len = len(dialect.render_prompt(smol_tokenizer, messages))
    call = call_text("print(2**10)")
    call_len = len(smol_tokenizer.encode(call, add_special_tokens=False))
    wrapper = len(
        dialect.continuation_delta(smol_tokenizer, messages, [], dialect.tool_message("c", ""))
    )
    reserve = wrapper + 8
    cfg = config(
        group_size=1,
        max_trajectory_tokens=prompt_len + call_len + reserve,  # the call uses all it may
        max_assistant_tokens=call_len + reserve,
        max_tool_response_tokens=8,
        min_observation_tokens=8,
    )
    result = run(ScriptedSampler(smol_tokenizer, code_then_answer), FakeSandbox(lookup), [Q1], cfg)
    (trajectory,) = result.trajectories
    assert trajectory.turns[0].max_tokens == call_len
    assert trajectory.code_calls == 1  # the observation entered the prompt
    assert trajectory.observations[0].appended


def test_context_limit_of_the_backend_is_checked_up_front(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer, max_context_tokens=1024)
    with pytest.raises(ConfigError, match="context limit of the sampler"):
        run(sampler, FakeSandbox(lookup), [Q1], config(max_trajectory_tokens=2048))
    with pytest.raises(ConfigError, match="context limit of the trainer"):
        run(
            ScriptedSampler(smol_tokenizer, code_then_answer),
            FakeSandbox(lookup),
            [Q1],
            config(max_trajectory_tokens=2048),
            context_limit=1000,
        )
    assert sampler.requests == []


def test_tokens_win_when_the_sampler_text_disagrees(smol_tokenizer):
    sampler = ScriptedSampler(
        smol_tokenizer, code_then_answer, text=lambda decoded: "\\boxed{999999}"
    )
    result = run(sampler, FakeSandbox(lookup), [Q1], config())
    assert all(t.correct and t.code_calls == 1 for t in result.trajectories)
    assert result.counters.text_mismatches == len(sampler.requests) + 1  # 2 + 1 + 1 sequences
    missing = ScriptedSampler(smol_tokenizer, code_then_answer, text=lambda decoded: None)
    result = run(missing, FakeSandbox(lookup), [Q1], config())
    assert all(t.correct for t in result.trajectories)
    assert result.counters.text_missing == 4


def test_sandbox_failure_is_retried_then_excluded(smol_tokenizer):
    attempts = {"n": 0}

    def flaky(code):
        attempts["n"] += 1
        return sandbox_failure() if attempts["n"] == 1 else OUTPUTS[code]

    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer), FakeSandbox(flaky), [Q1], config()
    )
    assert all(t.stop_reason == StopReason.ANSWER for t in result.trajectories)
    assert result.counters.sandbox_retries == 1

    broken = FakeSandbox(lambda code: OSError("connection refused"))
    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer),
        broken,
        [Q1, Q2],
        config(sandbox_retries=2),
    )
    assert all(t.stop_reason == StopReason.SANDBOX_ERROR for t in result.trajectories)
    assert all(t.excluded and t.advantage == 0 for t in result.trajectories)
    assert len(broken.calls) == 4 * 3
    assert "connection refused" in result.trajectories[0].error


def test_the_models_own_bad_code_is_an_observation(smol_tokenizer):
    traceback = ExecResult(
        False,
        "",
        "Traceback ...\nZeroDivisionError: division by zero",
        1,
        False,
        0.01,
        False,
        ErrorKind.ERROR,
    )
    timeout = ExecResult(False, "", "", -9, True, 5.0, False, ErrorKind.TIMEOUT)
    for exec_result, expected in ((traceback, "ZeroDivisionError"), (timeout, "TimeoutError")):
        result = run(
            ScriptedSampler(smol_tokenizer, code_then_answer),
            FakeSandbox(lambda code, r=exec_result: r),
            [Q1],
            config(),
        )
        for trajectory in result.trajectories:
            assert trajectory.stop_reason == StopReason.ANSWER and trajectory.code_calls == 1
            assert expected in trajectory.observations[0].content
            assert not trajectory.observations[0].ok
        assert result.counters.sandbox_retries == 0


def test_empty_input_returns_an_empty_result(smol_tokenizer):
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    result = run(sampler, FakeSandbox(lookup), [], config())
    assert result.trajectories == [] and sampler.requests == []
    assert result.metrics()["rollout/trajectories"] == 0


def test_seeds_differ_across_steps_and_positions(smol_tokenizer):
    seeds = {
        sample_seed(42, step, q, g, turn)
        for step in range(5)
        for q in range(4)
        for g in (-1, 0, 1, 2)
        for turn in range(3)
    }
    assert len(seeds) == 5 * 4 * 4 * 3
    assert sample_seed(42, 1, 0, 0, 1) == sample_seed(42, 1, 0, 0, 1)
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    run(sampler, FakeSandbox(lookup), [Q1], config(), step=0)
    first = [r.params.seed for r in sampler.requests]
    run(sampler, FakeSandbox(lookup), [Q1], config(), step=1)
    second = [r.params.seed for r in sampler.requests[len(first) :]]
    assert not set(first) & set(second)
    assert first[0] == sample_seed(42, 0, 0, -1, 0)
    assert set(first[1:]) == {sample_seed(42, 0, 0, g, 1) for g in (0, 1)}


def test_identical_code_in_a_group_runs_once_when_shared(smol_tokenizer):
    sandbox = FakeSandbox(lookup, delay=lambda code: 0.05)
    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer),
        sandbox,
        [Q1, Q2],
        config(group_size=4, share_identical_code=True),
    )
    assert len(sandbox.calls) == 2  # one per question group
    assert result.counters.shared_code_hits == 6
    assert sum(o.shared for t in result.trajectories for o in t.observations) == 6
    assert all(t.correct for t in result.trajectories)
    plain = FakeSandbox(lookup)
    run(ScriptedSampler(smol_tokenizer, code_then_answer), plain, [Q1, Q2], config(group_size=4))
    assert len(plain.calls) == 8


def test_progress_gets_one_event_per_ended_trajectory(smol_tokenizer):
    events: list[ProgressEvent] = []
    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer),
        FakeSandbox(lookup),
        [Q1, Q2],
        config(group_size=3),
        progress=events.append,
    )
    assert [e.finished for e in events] == list(range(1, 7))
    assert {id(e.trajectory) for e in events} == {id(t) for t in result.trajectories}
    assert all(e.total == 6 for e in events)

    def broken(event):
        raise RuntimeError("display crashed")

    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer),
        FakeSandbox(lookup),
        [Q1],
        config(),
        progress=broken,
    )
    assert all(t.correct for t in result.trajectories)  # the display did not end the rollout


def test_metrics_cover_the_reference_and_the_batch_window(smol_tokenizer):
    sandbox = FakeSandbox(lookup)
    sandbox.stats.record(dataclasses.replace(sandbox_failure(), error_kind=ErrorKind.TIMEOUT))
    result = run(ScriptedSampler(smol_tokenizer, code_then_answer), sandbox, [Q1, Q2], config())
    metrics = result.metrics()
    for key in (
        "reward/mean",
        "reward/correct",
        "reward/format",
        "rollout/turns",
        "rollout/code_calls",
        "rollout/trajectory_tokens",
        "rollout/valid_tool_call_rate",
        "rollout/degenerate_group_rate",
        "rollout/sampled_tokens",
        "rollout/tokens_per_s",
        "rollout/sample_retries",
    ):
        assert key in metrics
    assert sum(v for k, v in metrics.items() if k.startswith("stop/")) == pytest.approx(1.0)
    assert metrics["rollout/turns"] == 2 and metrics["rollout/code_calls"] == 1
    assert metrics["rollout/valid_tool_call_rate"] == 1.0
    assert metrics["rollout/degenerate_group_rate"] == 1.0
    # The timeout recorded before the batch is not part of its window.
    assert metrics["sandbox/calls"] == 4 and metrics["sandbox/timeouts"] == 0
    assert metrics["rollout/sampled_tokens"] == sum(
        len(t.completion_tokens) for tr in result.trajectories for t in tr.turns
    )
    # every trajectory called the tool once; the entropy estimate is the sampled tokens'
    # mean -logprob, recomputed here from the turns
    assert metrics["rollout/tool_use_rate"] == 1.0
    logprobs = [lp for tr in result.trajectories for t in tr.turns for lp in t.logprobs]
    assert metrics["rollout/sampled_nll"] == pytest.approx(-sum(logprobs) / len(logprobs))
    assert metrics["rollout/sampled_nll"] > 0


def test_sync_entry_refuses_a_running_loop(smol_tokenizer):
    async def inside():
        run(ScriptedSampler(smol_tokenizer, code_then_answer), FakeSandbox(lookup), [Q1], config())

    with pytest.raises(RuntimeError, match="rollout_batch_async"):
        asyncio.run(inside())


def test_trajectories_round_trip_through_json(smol_tokenizer):
    import json

    from retool.rollout import Trajectory

    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer), FakeSandbox(lookup), [Q1], config()
    )
    for trajectory in result.trajectories:
        restored = Trajectory.from_json(json.loads(json.dumps(trajectory.to_json())))
        assert restored == trajectory
        assert restored.stop_reason is StopReason.ANSWER


def test_reused_groups_are_not_sampled_again(smol_tokenizer):
    def script(call):
        if "2^10" in call.prompt_text:
            return answer_text("1024" if call.index == 0 else "1")
        return code_then_answer(call)

    cfg = config(group_size=2)
    first = run(ScriptedSampler(smol_tokenizer, script), FakeSandbox(lookup), [Q1, Q2], cfg)
    events = []
    sampler = ScriptedSampler(smol_tokenizer, script)
    again = run(
        sampler,
        FakeSandbox(lookup),
        [Q1, Q2],
        cfg,
        reuse={0: first.groups()[0]},
        progress=events.append,
    )
    assert all("2^10" not in smol_tokenizer.decode(r.prompt) for r in sampler.requests)

    def facts(result):
        return [
            (t.stop_reason, t.reward, t.advantage, [x.completion_tokens for x in t.turns])
            for t in result.trajectories
        ]

    assert facts(again) == facts(first)
    assert again.trajectories[0] is first.trajectories[0]
    assert sum(e.reused for e in events) == 2 and events[-1].finished == 4
    with pytest.raises(ValueError, match="complete group"):
        run(sampler, FakeSandbox(lookup), [Q1], cfg, reuse={0: first.groups()[0][:1]})


def test_a_custom_scorer_replaces_the_boxed_answer_reward(smol_tokenizer):
    from retool.reward import RewardResult

    def scorer(text, reference):
        return RewardResult(0.5, correct=False, valid_format=True, answer=reference)

    result = run(
        ScriptedSampler(smol_tokenizer, code_then_answer),
        FakeSandbox(lookup),
        [Q1],
        config(),
        scorer=scorer,
    )
    assert [t.reward for t in result.trajectories] == [0.5, 0.5]
    assert all(t.answer == "1024" for t in result.trajectories)


def test_a_scorer_that_raises_fails_the_batch_even_once_every_task_is_done(smol_tokenizer):
    # Q1 answers at once and its scorer raises; Q2's sampler fails later, so Q2 ends
    # excluded and unscored. By the time the question tasks are all done, every
    # scoring task is done too: the failure must still reach the caller, not be
    # logged as "never retrieved" while the step trains on what is left.
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)
    original = sampler.sample_async

    async def late_failure(prompt, num_samples, params):
        if "3^5" in smol_tokenizer.decode(prompt.to_ints()):
            await asyncio.sleep(0.2)
            raise RuntimeError("the sampler process died")
        return await original(prompt, num_samples, params)

    sampler.sample_async = late_failure

    def scorer(text, reference):
        raise RuntimeError("the reward service went away")

    with pytest.raises(RuntimeError, match="went away"):
        run(sampler, FakeSandbox(lookup), [Q1, Q2], config(sample_retries=0), scorer=scorer)


def test_a_service_that_fails_every_call_alike_warns_once_per_batch(smol_tokenizer, caplog):
    # A dead server fails every trajectory's every attempt with the same text: one warning,
    # the repeats at debug level, so the run's last line is not buried.
    sampler = ScriptedSampler(smol_tokenizer, code_then_answer)

    async def dead(prompt, num_samples, params):
        raise ConnectionRefusedError("http://127.0.0.1:9: connection refused")

    sampler.sample_async = dead
    with caplog.at_level("DEBUG", logger="retool.rollout.retry"):
        result = run(sampler, FakeSandbox(lookup), [Q1, Q2], config(sample_retries=2))
    assert all(t.stop_reason == StopReason.SAMPLER_ERROR for t in result.trajectories)
    records = [r for r in caplog.records if r.name == "retool.rollout.retry"]
    warnings = [r for r in records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "connection refused" in warnings[0].getMessage()
    assert len(records) == 2 * 3  # two questions' group requests, three attempts each
