"""Scripted stand-ins for a sampler and a sandbox, for rollout tests.

``ScriptedSampler`` answers each request by calling ``script(call)`` with the
decoded prompt, the sample index, the seed and the turn number (observations
already in the prompt), encodes the returned text with the real tokenizer
and honours ``max_tokens`` and the stop rules like a real sampler. Every
request is logged. ``FakeSandbox`` runs nothing: ``outputs(code)`` decides
what a call prints.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from retool.sandbox import ErrorKind, ExecResult, SandboxStats
from retool.types import SampledSequence, SampleResponse, SamplerStop, SamplingParams


def call_text(code: str, lead: str = "Let me compute.") -> str:
    """A markdown-dialect tool call."""
    return f"{lead}\n```python\n{code}\n```\n"


def answer_text(answer: str) -> str:
    return f"The answer is \\boxed{{{answer}}}."


@dataclass(frozen=True)
class Call:
    prompt: list[int]
    prompt_text: str
    index: int  # sample index within the request
    seed: int | None
    turn: int  # assistant turns already in the prompt
    max_tokens: int


@dataclass
class Request:
    prompt: list[int]
    num_samples: int
    params: SamplingParams


@dataclass
class ScriptedSampler:
    tokenizer: object
    script: Callable[[Call], str]
    delay: Callable[[Call], float] | None = None  # seconds before the reply
    fail: Callable[[int], BaseException | None] | None = None  # by request number
    text: Callable[[str], str | None] | None = None  # what to report as text
    max_context_tokens: int | None = None
    requests: list[Request] = field(default_factory=list)

    async def sample_async(self, prompt, num_samples, params):
        tokens = prompt.to_ints()
        self.requests.append(Request(tokens, num_samples, params))
        number = len(self.requests)
        if self.fail is not None:
            exc = self.fail(number)
            if exc is not None:
                raise exc
        prompt_text = self.tokenizer.decode(tokens)
        turn = prompt_text.count("<|im_start|>assistant") - 1
        sequences = []
        wait = 0.0
        for index in range(num_samples):
            call = Call(tokens, prompt_text, index, params.seed, turn, params.max_tokens)
            if self.delay is not None:
                wait = max(wait, self.delay(call))
            sequences.append(self._sequence(self.script(call), params))
        await asyncio.sleep(wait)
        return SampleResponse(tuple(sequences))

    def _sequence(self, text: str, params: SamplingParams) -> SampledSequence:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not text.endswith("```\n"):
            ids.append(self.tokenizer.eos_token_id)  # an answer ends with <|im_end|>
        stop = SamplerStop.STOP
        if len(ids) > params.max_tokens:
            ids, stop = ids[: params.max_tokens], SamplerStop.LENGTH
        logprobs = [-0.5 - 0.001 * i for i in range(len(ids))]
        decoded = self.tokenizer.decode(ids, skip_special_tokens=True)
        reported = self.text(decoded) if self.text is not None else decoded
        return SampledSequence(tuple(ids), tuple(logprobs), reported, stop)


def ok_result(stdout: str, latency: float = 0.001) -> ExecResult:
    return ExecResult(True, stdout, "", 0, False, latency, False)


@dataclass
class FakeSandbox:
    outputs: Callable[[str], ExecResult | BaseException | str]
    delay: Callable[[str], float] | None = None
    gate: Callable[[str], asyncio.Event | None] | None = None  # wait for it before replying
    timeout: float = 5.0
    calls: list[str] = field(default_factory=list)
    stats: SandboxStats = field(default_factory=SandboxStats)

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        self.calls.append(code)
        if self.gate is not None:
            event = self.gate(code)
            if event is not None:
                await event.wait()
        if self.delay is not None:
            await asyncio.sleep(self.delay(code))
        out = self.outputs(code)
        if isinstance(out, BaseException):
            raise out
        result = ok_result(out) if isinstance(out, str) else out
        self.stats.record(result)
        return result


def sandbox_failure() -> ExecResult:
    return ExecResult(False, "", "server died", None, False, 0.0, False, ErrorKind.SANDBOX)


def seeded_choice(call: Call, options: list[str]) -> str:
    rng = random.Random((call.seed or 0) * 1000 + call.index)
    return rng.choice(options)
