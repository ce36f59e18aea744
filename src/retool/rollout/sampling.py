"""A batch's sampler requests: their concurrency bound, their checks, their retries.

Sampled sequences in flight are bounded by ``rollout.max_in_flight_samples``:
a group request (``num_samples = G``) takes ``G`` units of a
:class:`WeightedSemaphore` at once, and a request larger than the whole cap
runs alone.

A reply is read from its token ids, never from its text: the text is decoded
from the ids, and a sampler text that is missing or disagrees is counted, not
used. A reply of the wrong length, or whose tokens and logprobs disagree, is a
failed call like an exception: retried with backoff (:mod:`retool.rollout.retry`),
and when every attempt failed the request's trajectories end as
``sampler_error`` (the caller's job). A sample from weights other than the
step's policy (a vLLM sampler whose weight sync did not apply) is
:class:`~retool.errors.StalePolicyError`, never retried.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from retool.config import RolloutConfig
from retool.errors import StalePolicyError
from retool.rollout.result import RolloutCounters
from retool.rollout.retry import RetryPolicy
from retool.rollout.types import AssistantTurn, Trajectory
from retool.types import ModelInput, SampledSequence, SamplingClient, SamplingParams


class WeightedSemaphore:
    """An asyncio semaphore whose holders take several units at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._changed = asyncio.Condition()

    async def acquire(self, units: int) -> int:
        units = min(units, self.capacity)  # a request larger than the cap runs alone
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= units)
            self._free -= units
        return units

    async def release(self, units: int) -> None:
        async with self._changed:
            self._free += units
            self._changed.notify_all()


@dataclass(frozen=True)
class Sampled:
    """A sampler reply read and checked: the tokens win over the text."""

    tokens: list[int]
    logprobs: list[float]
    text: str
    stop: str

    def turn(self, prompt: list[int], max_tokens: int, seed: int, seconds: float) -> AssistantTurn:
        """The turn this reply makes, asked with ``prompt``, ``max_tokens`` and ``seed``."""
        return AssistantTurn(
            prompt_tokens=prompt,
            completion_tokens=self.tokens,
            logprobs=self.logprobs,
            text=self.text,
            sampler_stop=self.stop,
            max_tokens=max_tokens,
            seed=seed,
            sample_seconds=seconds,
        )


@dataclass(eq=False)
class Sampler:
    """The batch's sampling client, bounded, checked and retried."""

    client: SamplingClient
    tokenizer: Any
    config: RolloutConfig
    stop: tuple[str | int, ...]  # the dialect's stop sequences
    step: int
    counters: RolloutCounters  # the batch's, counted in place

    def __post_init__(self) -> None:
        # the weights the step must sample with (a vLLM sampler says; None: not checked)
        self.policy_version: str | None = getattr(self.client, "policy_version", None)
        self.slots = WeightedSemaphore(self.config.max_in_flight_samples)
        self.retry = RetryPolicy("sampler", self.config.sample_retries, self.config.retry_backoff)

    def params(self, max_tokens: int, seed: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=seed,
            stop=self.stop,
        )

    def read(self, sequence: SampledSequence) -> Sampled:
        produced = getattr(sequence, "policy_version", None)
        if self.policy_version is not None and produced != self.policy_version:
            raise StalePolicyError(
                f"step {self.step}: a sample came from weights {produced!r}, the step's policy "
                f"is {self.policy_version!r}: the sampler's weight sync did not apply; "
                "nothing of this step was trained (check the [sampler] settings and the log)"
            )
        tokens = [int(t) for t in sequence.tokens]
        logprobs = [float(v) for v in sequence.logprobs]
        if len(tokens) != len(logprobs):
            raise ValueError(f"sampler returned {len(tokens)} tokens but {len(logprobs)} logprobs")
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if sequence.text is None:
            self.counters.text_missing += 1
        elif sequence.text != text:
            self.counters.text_mismatches += 1
        stop = str(getattr(sequence, "stop_reason", "") or "")
        return Sampled(tokens, logprobs, text, stop)

    async def sample(
        self, trajectory: Trajectory | None, prompt: list[int], num_samples: int, seed: int, n: int
    ) -> tuple[list[Sampled] | None, str | None, float]:
        """Sample with retries; ``(None, error, seconds)`` when every attempt failed.
        ``trajectory`` counts its retries (``None``: the group's first request)."""
        started = time.monotonic()

        async def once() -> list[Sampled]:
            units = await self.slots.acquire(num_samples)
            try:
                self.counters.sample_requests += 1
                response = await self.client.sample_async(
                    ModelInput.from_ints(prompt), num_samples, self.params(n, seed)
                )
                sequences = list(response.sequences)
                if len(sequences) != num_samples:
                    raise ValueError(
                        f"asked for {num_samples} samples, the sampler returned {len(sequences)}"
                    )
                return [self.read(s) for s in sequences]
            finally:
                await self.slots.release(units)

        def on_retry() -> None:
            self.counters.sample_retries += 1
            if trajectory is not None:
                trajectory.sample_retries += 1

        # a stale sampler stays stale: retrying would train on the wrong policy
        retried = await self.retry.call(once, on_retry, fatal=(StalePolicyError,))
        if retried.value is None:
            self.counters.sampler_failures += 1
        return retried.value, retried.error, time.monotonic() - started
