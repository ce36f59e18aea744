"""``SandboxClient``: what both sandbox clients share, written once.

``LocalSandbox`` (the fork server, ``local.py``) and ``FusionSandbox`` (a
SandboxFusion service, ``fusion.py``) give one interface, so that
``sandbox.backend`` changes nothing else in a run. What does not depend on
where the code runs lives here, so the two cannot drift apart:

- ``run`` screens the call first: its ``timeout`` is checked against the shared
  range, and code over ``MAX_CODE_BYTES`` or not UTF-8 text is refused unsent
  with the same result (:func:`retool.sandbox.limits.screen_code`). Refusals
  and results alike are counted in ``stats``.
- ``arun`` checks the arguments in the caller (an error raises there, not in a
  worker thread) and runs ``run`` on the client's own thread pool, so an event
  loop never blocks and never runs more calls than the client's workers.
- The context manager and ``__del__`` close the client.

A subclass gives ``_execute`` (one screened call), ``_isolation``, ``_check_open``
and ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Self

from retool.checks import check_number
from retool.sandbox.limits import MAX_TIMEOUT_S, screen_code
from retool.sandbox.result import ExecResult
from retool.sandbox.stats import SandboxStats


class SandboxClient:
    """The part of a sandbox client that does not depend on where code runs."""

    _label: ClassVar[str]  # the class, as argument errors name it
    timeout: float  # default wall-clock limit of a call, seconds
    stats: SandboxStats
    _executor: ThreadPoolExecutor  # ``arun``'s threads, one per worker

    def _isolation(self) -> tuple[str, bool]:
        """(the isolation a result reports, whether it is degraded)."""
        raise NotImplementedError

    def _check_open(self) -> None:
        """Raise ``SandboxError`` once ``close()`` has begun."""
        raise NotImplementedError

    def _execute(self, code: str, limit: float) -> ExecResult:
        """Run screened ``code`` with the time limit ``limit``; its result."""
        raise NotImplementedError

    def close(self) -> None:
        """Abort every call in flight and release what the client holds."""
        raise NotImplementedError

    def _screen(self, code: object, timeout: object) -> tuple[float, ExecResult | None]:
        """The call's time limit, and the refusal of code that must not be sent."""
        limit = self.timeout
        if timeout is not None:
            check_number(f"{self._label}.run timeout", timeout, 0, MAX_TIMEOUT_S, low_open=True)
            limit = float(timeout)  # type: ignore[arg-type]  # checked: a real number
        return limit, screen_code(code, *self._isolation())

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` and wait for its result (``timeout`` seconds, or the default).

        Code larger than ``MAX_CODE_BYTES`` or not UTF-8 text is refused
        unsent (``ErrorKind.ERROR``); a ``code`` that is not a ``str`` raises
        ``ConfigError``. Failures of the sandbox itself come back as
        ``ErrorKind.SANDBOX`` results (see the client's ``_execute``). Raises
        ``SandboxError`` after (or during) ``close()``.
        """
        self._check_open()
        limit, refused = self._screen(code, timeout)
        if refused is not None:
            self.stats.record(refused)
            return refused
        result = self._execute(code, limit)
        self.stats.record(result)
        return result

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        """``run`` from an event loop, without blocking it."""
        self._check_open()
        self._screen(code, timeout)  # argument errors raise here, in the caller
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run, code, timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
