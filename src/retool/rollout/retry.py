"""One retry loop for the rollout's infrastructure calls: the sampler and the sandbox.

A call that raises, or whose result says the service failed (``failure``
returns a description), is tried again after ``backoff * 2 ** (attempt - 1)``
seconds, up to ``1 + retries`` attempts. A failure is logged as one warning
the first time its description is seen by a policy (one batch's sampler or
sandbox), and at debug level after that: a service that went away fails every
trajectory's every attempt the same way, and a screen of identical warnings
would bury the one line the run ends with. Cancellation and the caller's
``fatal`` errors are re-raised at once: retrying cannot fix them (a stale
sampler stays stale).

:meth:`RetryPolicy.call` knows nothing of trajectories or counters. What a retry counts, where
a failure is recorded and what every attempt failing means (an excluded
trajectory, or the trajectory's own failure) belong to each call site, which
says so through ``on_retry`` and ``on_failure`` and reads the :class:`Retried`
it gets back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Retried(Generic[T]):
    """How a call with retries went."""

    value: T | None  # the first result that did not fail; None when every attempt failed
    attempts: int  # attempts made, the successful one included
    error: str | None  # the last failure's description, when every attempt failed
    rejected: tuple[T, ...]  # results that reported a failure (``failure``), in order


def _no_failure(value: object) -> str | None:
    return None


def _ignore(error: str) -> None:
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """How one kind of call is retried: ``what`` names it in the log."""

    what: str  # "sampler", "sandbox"
    retries: int  # attempts after the first
    backoff: float  # seconds before the first retry; doubled for each next one
    warned: set[str] = field(default_factory=set, compare=False)  # failures logged as warnings

    async def call(
        self,
        call: Callable[[], Awaitable[T]],
        on_retry: Callable[[], None],
        *,
        failure: Callable[[T], str | None] = _no_failure,
        on_failure: Callable[[str], None] = _ignore,
        fatal: tuple[type[Exception], ...] = (),
    ) -> Retried[T]:
        """Await ``call()`` until it succeeds, at most ``1 + retries`` times.

        ``on_retry`` runs before each repeat (before its backoff), ``on_failure``
        with each failed attempt's description (``"Type: message"`` for an
        exception, ``failure(result)`` for a result that reports one).
        """
        attempts = 1 + self.retries
        error: str | None = None
        rejected: list[T] = []
        final: tuple[type[BaseException], ...] = (asyncio.CancelledError, *fatal)
        for attempt in range(attempts):
            if attempt:
                on_retry()
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                value = await call()
            except final:
                raise
            except Exception as exc:  # infrastructure: retry, then fail this trajectory only
                error = f"{type(exc).__name__}: {exc}"
            else:
                error = failure(value)
                if error is None:
                    return Retried(value, attempt + 1, None, tuple(rejected))
                rejected.append(value)
            on_failure(error)
            level = logging.DEBUG if error in self.warned else logging.WARNING
            self.warned.add(error)
            log.log(
                level,
                "%s call failed (attempt %d/%d): %s%s",
                self.what,
                attempt + 1,
                attempts,
                error,
                "" if level == logging.DEBUG else " (the same failure again: debug level only)",
            )
        return Retried(None, attempts, error, tuple(rejected))
