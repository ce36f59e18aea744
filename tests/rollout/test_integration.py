"""End to end: ``tiny-random`` through ``LocalServiceClient`` with the real sandbox.

A random model almost never writes a tool call, so the second test opens
every group with a scripted call (its logprobs computed by the same model)
and lets the real sampler write every later turn from the continuation
prompt: the real sandbox, the real continuation and the real sampler meet.
"""

from __future__ import annotations

import pytest

from retool.data.demo import demo_examples
from retool.rollout import StopReason, rollout_batch
from retool.sandbox import LocalSandbox
from retool.types import ModelInput, SampledSequence, SampleResponse, SamplerStop
from tests.builders import scripted_rollout
from tests.rollout.fakes import call_text

CONFIG = scripted_rollout(
    group_size=3,
    max_trajectory_tokens=1024,
    max_assistant_tokens=24,
    max_tool_response_tokens=64,
    max_assistant_turns=3,
    temperature=1.0,
    protocol="markdown",
)


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=5.0, memory_mb=512, max_workers=2) as sb:
        yield sb


def _check_invariants(result, examples):
    assert len(result.trajectories) == len(examples) * CONFIG.group_size
    for trajectory in result.trajectories:
        assert trajectory.stop_reason is not None and not trajectory.excluded
        assert trajectory.reward in (-1.0, 1.0)
        full: list[int] = []
        for turn in trajectory.turns:
            assert len(turn.completion_tokens) == len(turn.logprobs)
            assert turn.prompt_tokens[: len(full)] == full  # P_{i+1} extends the history
            full = turn.prompt_tokens + turn.completion_tokens
            assert len(full) <= CONFIG.max_trajectory_tokens


def test_tiny_random_rolls_out_end_to_end(sampler, sandbox):
    examples = demo_examples("train")[:2]
    tokenizer = sampler.get_tokenizer()
    result = rollout_batch(sampler, tokenizer, sandbox, examples, CONFIG, step=3)
    _check_invariants(result, examples)
    assert all(t.policy_version == 2 for t in result.trajectories)  # weights after 2 steps
    # Sampled logprobs are the policy's own: forward on the same tokens agrees.
    trajectory = result.trajectories[0]
    turn = trajectory.turns[0]
    forward = sampler.compute_logprobs(
        ModelInput.from_ints(turn.prompt_tokens + turn.completion_tokens)
    ).result()
    tail = forward[len(turn.prompt_tokens) :]
    assert tail == pytest.approx(turn.logprobs, abs=1e-4)
    assert result.metrics()["rollout/sampled_tokens"] > 0


class _OpensWithACall:
    """The real sampler, except that each question's first turn is a scripted call."""

    def __init__(self, inner, tokenizer, code):
        self.inner, self.tokenizer, self.code = inner, tokenizer, code
        self.max_context_tokens = inner.max_context_tokens

    async def sample_async(self, prompt, num_samples, params):
        if num_samples == 1:
            return await self.inner.sample_async(prompt, num_samples, params)
        ids = self.tokenizer.encode(call_text(self.code), add_special_tokens=False)
        forward = await self.inner.compute_logprobs(prompt.append(ids))
        logprobs = forward[len(prompt.to_ints()) :]
        sequence = SampledSequence(tuple(ids), tuple(logprobs), None, SamplerStop.STOP)
        return SampleResponse((sequence,) * num_samples)


def test_real_sandbox_and_continuation_with_the_real_sampler(sampler, sandbox):
    examples = demo_examples("train")[:2]
    tokenizer = sampler.get_tokenizer()
    scripted = _OpensWithACall(sampler, tokenizer, "print(sum(range(101)))")
    result = rollout_batch(scripted, tokenizer, sandbox, examples, CONFIG)
    _check_invariants(result, examples)
    for trajectory in result.trajectories:
        assert trajectory.code_calls >= 1
        observation = trajectory.observations[0]
        assert observation.ok and observation.content.strip() == "5050"
        assert len(trajectory.turns) >= 2
        assert "5050" in tokenizer.decode(trajectory.turns[1].prompt_tokens)
        assert trajectory.stop_reason in set(StopReason)
    assert result.metrics()["sandbox/calls"] >= 6
    assert result.counters.text_missing == 6  # the scripted turns carried no text
