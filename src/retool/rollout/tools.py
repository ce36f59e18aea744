"""A batch's sandbox calls: bounded, retried, shared within a group, judged on evidence.

Sandbox calls in flight are bounded by ``rollout.max_in_flight_tools``. A call
that raises or reports a sandbox failure (``ErrorKind.SANDBOX``) is retried
with backoff (:mod:`retool.rollout.retry`). A traceback or timeout of the
model's own code is not a failure here: it is an observation like any other.

Exclusion is a reward channel (an excluded -1 becomes 0), so a call that fails
every attempt excludes its trajectory only on evidence the code cannot
produce: the sandbox saw that the code never ran (``ExecResult.delivered`` is
False: not delivered, or the call's set-up failed before any code, as its init
observed). Then :meth:`CodeRunner.execute` returns no result (the caller ends
the trajectory as ``sandbox_error``) and ``rollout/sandbox_failures`` counts
it. When any attempt's code was delivered and may have run (a handler or
server that died mid-call, which the code could have caused), it returns that
``SANDBOX`` result: the trajectory's own failure (``sandbox_unreported``),
counted in ``rollout/sandbox_unreported``.

With ``rollout.share_identical_code`` the members of a group that run the same
code share one call; a failure is never shared (the member runs its own).
"""

from __future__ import annotations

import asyncio

from retool.config import RolloutConfig
from retool.rollout.result import RolloutCounters
from retool.rollout.retry import RetryPolicy
from retool.rollout.types import Trajectory
from retool.sandbox.result import ErrorKind, ExecResult
from retool.types import Sandbox


def _sandbox_failure(result: ExecResult) -> str | None:
    if result.error_kind != ErrorKind.SANDBOX:
        return None
    return f"sandbox failure: {result.stderr.strip()[:200]}"


class CodeRunner:
    """The batch's sandbox, bounded, retried and shared within a group."""

    def __init__(self, sandbox: Sandbox, config: RolloutConfig, counters: RolloutCounters) -> None:
        self.sandbox = sandbox
        self.config = config
        self.counters = counters
        self.slots = asyncio.Semaphore(config.max_in_flight_tools)
        self.retry = RetryPolicy("sandbox", config.sandbox_retries, config.retry_backoff)
        self.shared: dict[tuple[int, str], asyncio.Task[tuple[ExecResult | None, int]]] = {}

    async def run(self, code: str, trajectory: Trajectory) -> tuple[ExecResult | None, int]:
        """The result and the attempts made. ``None``: every attempt failed and the
        sandbox saw the code never run (exclude); a ``SANDBOX`` result: every
        attempt failed and one may have run (the trajectory's failure)."""

        async def once() -> ExecResult:
            async with self.slots:
                self.counters.tool_executions += 1
                return await self.sandbox.arun(code)

        def on_retry() -> None:
            self.counters.sandbox_retries += 1
            trajectory.sandbox_retries += 1

        def on_failure(error: str) -> None:
            trajectory.error = error

        retried = await self.retry.call(
            once, on_retry, failure=_sandbox_failure, on_failure=on_failure
        )
        if retried.value is not None:
            return retried.value, retried.attempts
        may_have_run = [result for result in retried.rejected if result.delivered]
        if may_have_run:
            self.counters.sandbox_unreported += 1
            return may_have_run[-1], retried.attempts
        self.counters.sandbox_failures += 1
        return None, retried.attempts

    async def execute(
        self, trajectory: Trajectory, code: str
    ) -> tuple[ExecResult | None, int, bool]:
        """Run ``code`` (or reuse identical code of the same group): result, attempts, shared."""
        if not self.config.share_identical_code:
            result, attempts = await self.run(code, trajectory)
            return result, attempts, False
        key = (trajectory.question_index, code)
        task = self.shared.get(key)
        if task is None:
            task = asyncio.ensure_future(self.run(code, trajectory))
            self.shared[key] = task
            result, attempts = await asyncio.shield(task)
            return result, attempts, False
        result, _ = await asyncio.shield(task)
        if result is None or result.error_kind == ErrorKind.SANDBOX:  # never share a failure
            result, attempts = await self.run(code, trajectory)
            return result, attempts, False
        self.counters.shared_code_hits += 1
        return result, 0, True
