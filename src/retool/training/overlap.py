"""Overlapped steps: step s's rollout samples while the steps before it train, with a fixed lag.

``train.max_off_policy_steps = k`` (0, the default, is rollout then training,
in series: the loop never builds a pipeline). With ``k >= 1`` the rollout of
step ``s`` samples with the policy after :func:`sampling_version` ``(s, k) =
max(0, s - 1 - k)`` steps. The pipeline is fixed, not "whatever weights are
newest": after the loop commits step ``t`` it takes the sampling client of the
weights after ``t`` steps (on the loop's thread, between that commit and the
next update, so no update is half applied) and hands it to the rollout of step
``t + 1 + k``. Which policy sampled each trajectory therefore never depends on
timing, and every trajectory records it (``Trajectory.policy_version``).

One worker thread rolls out the queued steps in order, one at a time (a
rollout keeps the sampler and the sandbox busy by itself); the loop waits for
step ``s``'s result only when it is ready to train step ``s``. At the start,
steps ``1 .. k + 1`` all sample with the initial policy.

**Resume is exact.** A resume from the checkpoint of step ``c`` holds the
weights after ``c`` steps only, but steps ``c + 1 .. c + k`` were sampled by
older policies. So, with a lag:

* a step's journal outlives its commit until a checkpoint of that step or a
  later one is listed (:class:`~retool.training.run_dir.RunDirectory`, ``lag``);
* a checkpoint's manifest line (its commit point) is written only once the
  rollouts of steps ``c + 1 .. c + k`` have ended, i.e. are journaled whole
  (:meth:`RolloutPipeline.finished_through`); until then a kill resumes from
  the checkpoint before, as a kill between a step's metrics line and its
  manifest line always has;
* on resume those steps are rolled out from their journals (every group
  reused, none sampled); a step that would need a policy this resume does not
  hold and whose journal is not whole is refused in one line
  (:class:`MissingPolicy`), as is a journaled trajectory of another version.

Emergency checkpoints (an interrupt, an error) are saved only when the
rollouts they would need are journaled; otherwise the run says so and a resume
starts from the last listed checkpoint.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from retool.backends.cleanup import close_quietly
from retool.rollout.result import RolloutResult
from retool.types import SamplingClient


def sampling_version(step: int, lag: int) -> int:
    """The training steps taken by the policy that samples step ``step`` (1-based)."""
    return max(0, step - 1 - lag)


@dataclass(frozen=True)
class Rolled:
    """One step's rollout as the loop receives it."""

    result: RolloutResult
    reused_groups: int  # groups taken from the step's journal
    seconds: float  # the rollout's own wall time (the loop may have waited less)


# the loop's rollout of one step: (step, sampler or None when the policy is not held,
# the version it samples with, a cancellation setter) -> its result
RollOut = Callable[[int, SamplingClient | None, int, Callable[[Callable[[], None]], None]], Rolled]


class MissingPolicy:
    """The sampler of a step whose policy this process does not hold (a resume after it).

    Every group of such a step must come from its journal; a request for a sample
    means one did not, and raises the stale-policy error (never retried).
    """

    def __init__(self, step: int, version: int, journal: str, tokenizer: Any = None) -> None:
        self.step, self.version, self.journal = step, version, journal
        self.policy_version = f"missing-policy-{version}"
        self._tokenizer = tokenizer

    def message(self) -> str:
        return (
            f"step {self.step} samples with the policy after step {self.version} "
            f"(train.max_off_policy_steps), which this resume does not hold, and its journal "
            f"{self.journal} is not whole (a finished run cannot be extended under a lag: "
            "start a new run with --init-from its last checkpoint)"
        )

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        from retool.errors import StalePolicyError

        raise StalePolicyError(self.message())

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.sample()

    def compute_logprobs(self, *args: Any, **kwargs: Any) -> Any:
        return self.sample()

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context_tokens(self) -> None:
        return None

    def close(self) -> None:
        """Nothing to release."""


class RolloutPipeline:
    """The queued rollouts of an overlapped run, rolled out in order by one worker thread.

    ``snapshot()`` is the run's sampling client for the trainer's current weights
    (:meth:`~retool.training.session.Session.sampler`); it is only called on the
    loop's thread, in :meth:`start` and :meth:`committed`.
    """

    def __init__(
        self,
        lag: int,
        last_step: int,
        roll_out: RollOut,
        snapshot: Callable[[], SamplingClient],
    ) -> None:
        if lag < 1:
            raise ValueError(f"a rollout pipeline needs a lag of at least 1, got {lag}")
        self.lag, self.last_step = lag, last_step
        self._roll_out, self._snapshot = roll_out, snapshot
        self._futures: dict[int, Future[Rolled]] = {}
        self._queue: list[tuple[int, SamplingClient | None, int]] = []
        self._users: dict[int, int] = {}  # version -> queued or running steps using it
        self._clients: dict[int, SamplingClient] = {}
        self._lock = threading.Condition()
        self._cancel: Callable[[], None] | None = None
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="retool-rollouts", daemon=True)
        self._worker.start()

    # -- the loop's side -------------------------------------------------------------
    def start(self, completed: int) -> None:
        """Queue the first ``k + 1`` steps after ``completed`` (the steps a fresh run or a
        resume from the checkpoint of step ``completed`` starts with)."""
        first = completed + 1
        for step in range(first, min(first + self.lag, self.last_step) + 1):
            version = sampling_version(step, self.lag)
            self._submit(step, version, held=version == completed)

    def committed(self, step: int) -> None:
        """Step ``step`` is committed: its weights sample step ``step + 1 + k`` (if any)."""
        later = step + 1 + self.lag
        if later <= self.last_step:
            self._submit(later, step, held=True)

    def result(self, step: int) -> Rolled:
        """Step ``step``'s rollout (blocks until it ended; raises what it raised)."""
        with self._lock:
            future = self._futures.get(step)
        if future is None:
            raise RuntimeError(f"the rollout of step {step} was never queued")
        return future.result()

    def finished_through(self, step: int) -> bool:
        """Whether every queued rollout of a step up to ``step`` (capped at the run's last)
        ended without an error: the journals a resume from an earlier checkpoint needs."""
        with self._lock:
            futures = [f for s, f in self._futures.items() if s <= step]
            expected = min(step, self.last_step)
            queued = [s for s in self._futures if s <= step]
        if queued and max(queued) < expected:
            return False
        return all(f.done() and f.exception() is None for f in futures)

    def wait_through(self, step: int) -> None:
        """Block until the queued rollouts of steps up to ``step`` ended (errors are left
        to :meth:`result`)."""
        with self._lock:
            futures = [f for s, f in self._futures.items() if s <= step]
        wait(futures)

    def close(self) -> None:
        """Cancel the running rollout, drop the queued ones, close every sampling client."""
        with self._lock:
            self._closed = True
            queued, self._queue = self._queue, []
            cancel = self._cancel
            self._lock.notify_all()
        for step, _, _ in queued:
            self._futures[step].cancel()
        if cancel is not None:
            cancel()
        self._worker.join(timeout=60)
        with self._lock:
            clients, self._clients = self._clients, {}
        for client in clients.values():
            close_quietly(client, "sampler")

    # -- internals ------------------------------------------------------------------
    def _submit(self, step: int, version: int, held: bool) -> None:
        client = None
        if held:
            client = self._clients.get(version)
            if client is None:
                client = self._clients[version] = self._snapshot()
        with self._lock:
            if self._closed:
                raise RuntimeError("the rollout pipeline is closed")
            self._futures[step] = Future()
            if held:
                self._users[version] = self._users.get(version, 0) + 1
            self._queue.append((step, client, version))
            self._lock.notify_all()

    def _release(self, version: int, held: bool) -> None:
        if not held:
            return
        with self._lock:
            self._users[version] -= 1
            client = None
            if not self._users[version]:
                del self._users[version]
                client = self._clients.pop(version, None)
        if client is not None:
            close_quietly(client, "sampler")

    def _set_cancel(self, cancel: Callable[[], None]) -> None:
        with self._lock:
            self._cancel = cancel
            closed = self._closed
        if closed:
            cancel()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                step, client, version = self._queue.pop(0)
                future = self._futures[step]
            if not future.set_running_or_notify_cancel():
                self._release(version, client is not None)
                continue
            started = time.monotonic()
            try:
                rolled = self._roll_out(step, client, version, self._set_cancel)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(
                    Rolled(rolled.result, rolled.reused_groups, time.monotonic() - started)
                )
            finally:
                with self._lock:
                    self._cancel = None
                self._release(version, client is not None)


def run_cancellable(coroutine: Any, set_cancel: Callable[[Callable[[], None]], None]) -> Any:
    """Run ``coroutine`` in a new event loop on this thread; ``set_cancel`` receives a
    callable that cancels it from another thread (:meth:`RolloutPipeline.close`)."""
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(coroutine)

        def cancel() -> None:
            loop.call_soon_threadsafe(task.cancel)

        set_cancel(cancel)
        return loop.run_until_complete(task)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
