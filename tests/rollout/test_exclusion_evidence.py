"""Exclusion is a reward channel, so only the sandbox's own evidence that the code
never ran may exclude a trajectory.

A call that breaks its handler or server after its code was delivered (it may
have run: ``ExecResult.delivered``) must not turn its trajectory's -1 into an
excluded 0: every attempt failing after delivery ends the trajectory as
``sandbox_unreported``, scored and counted.
"""

from __future__ import annotations

import dataclasses

from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.rollout import StopReason, rollout_batch
from tests.rollout.fakes import (
    FakeSandbox,
    ScriptedSampler,
    answer_text,
    call_text,
    sandbox_failure,
)

Q1 = MathExample("q1", "What is 2^10?", "1024")


def config() -> RolloutConfig:
    return RolloutConfig(
        group_size=2,
        max_trajectory_tokens=2048,
        max_assistant_tokens=256,
        max_tool_response_tokens=128,
        retry_backoff=0.0,
        protocol="markdown",
        sandbox_retries=2,
    )


def wrong_after_code(call) -> str:
    return call_text("print(2**10)") if call.turn == 0 else answer_text("7")


def test_a_failure_after_delivery_is_the_trajectorys_own_not_an_exclusion(smol_tokenizer):
    sandbox = FakeSandbox(lambda code: sandbox_failure())  # delivered: it may have run
    result = rollout_batch(
        ScriptedSampler(smol_tokenizer, wrong_after_code), smol_tokenizer, sandbox, [Q1], config()
    )
    assert all(t.stop_reason == StopReason.SANDBOX_UNREPORTED for t in result.trajectories)
    assert not any(t.excluded for t in result.trajectories)
    assert all(t.reward == -1.0 for t in result.trajectories)  # no answer: the model's -1
    assert result.metrics()["rollout/excluded"] == 0.0
    assert result.counters.sandbox_unreported == 2 and result.counters.sandbox_failures == 0
    assert len(sandbox.calls) == 2 * 3  # still retried: an honest outage gets its chances


def test_only_the_sandboxs_proof_that_nothing_ran_excludes(smol_tokenizer):
    never_ran = dataclasses.replace(sandbox_failure(), delivered=False)
    sandbox = FakeSandbox(lambda code: never_ran)
    result = rollout_batch(
        ScriptedSampler(smol_tokenizer, wrong_after_code), smol_tokenizer, sandbox, [Q1], config()
    )
    assert all(
        t.stop_reason == StopReason.SANDBOX_ERROR and t.excluded for t in result.trajectories
    )
    assert result.counters.sandbox_failures == 2 and result.counters.sandbox_unreported == 0


def test_one_attempt_that_may_have_run_is_enough_to_keep_it(smol_tokenizer):
    attempts = iter(
        [sandbox_failure()] + [dataclasses.replace(sandbox_failure(), delivered=False)] * 9
    )
    sandbox = FakeSandbox(lambda code: next(attempts))
    cfg = dataclasses.replace(config(), group_size=1)
    result = rollout_batch(
        ScriptedSampler(smol_tokenizer, wrong_after_code), smol_tokenizer, sandbox, [Q1], cfg
    )
    (trajectory,) = result.trajectories
    assert trajectory.stop_reason == StopReason.SANDBOX_UNREPORTED and not trajectory.excluded
