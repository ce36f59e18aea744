"""How a command is asked to stop: SIGINT, SIGTERM and SIGHUP as exceptions (one module).

Every stop is a :class:`Stopped`, a ``KeyboardInterrupt`` (not an
``Exception``) on purpose: it can arrive anywhere, including inside the
``except Exception`` of a retry loop or a progress callback, and must never
be swallowed or retried there; asyncio also propagates it out of the event
loop as it does Ctrl-C. Three ways to raise it, one per kind of command:

* :func:`stop_on_signals`, the CLI's for every command: Ctrl-C raises
  ``KeyboardInterrupt`` (Python's own), SIGTERM and SIGHUP raise
  :class:`Stopped`, at once, where the main thread is;
* :class:`InterruptGuard`, the training loop's: the same three signals raise
  :class:`Interrupted` (which says "continue with --resume"), deferred inside
  :meth:`InterruptGuard.critical` while the weights and the run directory
  disagree;
* :class:`StopOnce`, the sandbox commands': the first SIGINT or SIGTERM
  raises, later ones are only recorded, so the clean-up the first one starts
  cannot itself be cut short.

:func:`exit_status` turns any of them into the CLI's one line and
``128 + signal`` (130, 143, 129). :func:`quiet_leftover_interrupts` is
called once, by the CLI's entry point, so that an interrupt already reported
does not print tracebacks from asyncio tasks collected after it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (or SIGINT), raised where the main thread is, like Ctrl-C's."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class Interrupted(Stopped):
    """A stop signal reached the training loop: it stopped after saving what it had."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(signum, f"stopped by {name}; continue with --resume")


def exit_status(exc: KeyboardInterrupt) -> int:
    """Print the one line for an interrupt and return ``128 + signal``."""
    signum = getattr(exc, "signum", signal.SIGINT)
    text = str(exc) if getattr(exc, "signum", None) else ""
    name = signal.Signals(signum).name
    print(f"retool: {text or f'interrupted ({name})'}", file=sys.stderr)
    return 128 + int(signum)


Handler = Callable[[int, Any], None]


@contextlib.contextmanager
def handlers(table: Mapping[int, Handler]) -> Iterator[None]:
    """Install ``table`` (signal: handler) for the block, restoring the previous ones after.

    Off the main thread this does nothing: signals reach the main thread only.
    """
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum, handler in table.items():
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C, SIGTERM and SIGHUP unwind the command at once (``finally`` blocks run).

    Ctrl-C gets a handler of our own, doing what Python's default does, because
    ``asyncio.run`` replaces only the *default* one, with a handler that cancels
    the main task and raises on the second Ctrl-C; a rollout still unwinding its
    tasks then keeps sampling after the first (seen: still running 60 s later).
    """
    return handlers(
        {
            signal.SIGINT: _raise_interrupt,
            signal.SIGTERM: _raise_stopped,
            signal.SIGHUP: _raise_stopped,
        }
    )


class InterruptGuard:
    """Turns SIGINT/SIGTERM/SIGHUP into :class:`Interrupted`, deferred inside ``critical()``.

    SIGHUP (the terminal closed) is one more way to be asked to stop: without
    it here, the CLI's own handler would raise in the middle of a checkpoint.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self.fired: int | None = None  # the last signal, even if something swallowed it
        self._depth = 0

    def _handle(self, signum: int, frame: object) -> None:
        self.fired = signum
        if self._depth:
            self.pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[InterruptGuard]:
        with handlers(dict.fromkeys(STOP_SIGNALS, self._handle)):
            yield self

    def check(self) -> None:
        """Raise a signal that arrived but was lost (caught by third-party code)."""
        if self.fired is not None:
            raise Interrupted(self.fired)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Defer a stop signal to the end of the block (nested blocks: the outermost)."""
        self._depth += 1
        try:
            yield
        finally:
            self._leave()

    def _leave(self) -> None:
        """End one critical block: the outermost raises a signal deferred inside it."""
        self._depth -= 1
        if not self._depth and self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred_from(self) -> Iterator[Callable[[], None]]:
        """A block whose critical part starts when it calls the ``hold`` it is given.

        Before ``hold()`` a stop signal raises at once, as outside :meth:`critical`;
        from ``hold()`` (idempotent) to the end of the block it is deferred. The
        training step passes ``hold`` to the trainer calls, which call it just
        before the first ``optim_step`` is submitted: the ``forward_backward``
        calls before it stay interruptible, the weights' change and the step's
        commit do not.
        """
        held = False

        def hold() -> None:
            nonlocal held
            if not held:
                held = True
                self._depth += 1

        try:
            yield hold
        finally:
            if held:
                self._leave()


class StopOnce:
    """SIGINT/SIGTERM raise :class:`Stopped` once; later ones are only recorded.

    Raising once means the clean-up that the first interrupt starts (closing
    the sandbox) cannot itself be interrupted and left half done; it is
    bounded, so a second Ctrl-C only has to wait a moment. The block ends
    normally after the one it raised (``signum`` says which signal); any other
    exception, a SIGHUP's :class:`Stopped` included, propagates.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._raised: Stopped | None = None
        self._deferred = False
        self._installed: contextlib.AbstractContextManager[None] | None = None

    def defer(self) -> None:
        """From now on, record signals without raising."""
        self._deferred = True

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        if not self._deferred:
            self._deferred = True
            self._raised = Stopped(signum)
            raise self._raised

    def __enter__(self) -> StopOnce:
        self._installed = handlers({signal.SIGINT: self._handle, signal.SIGTERM: self._handle})
        self._installed.__enter__()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if self._installed is not None:
            self._installed.__exit__(None, None, None)
        return exc is not None and exc is self._raised


def _not_interrupted(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, Interrupted)


_QUIETED = False


def quiet_leftover_interrupts() -> None:
    """Keep a training interrupt from printing tracebacks after it has been handled.

    The interrupted rollout leaves asyncio tasks holding the exception; when
    they are collected (often after the run has returned) asyncio logs "Task
    exception was never retrieved" with a traceback, and a signal that lands in
    a finalizer is printed as "Exception ignored". The interrupt is reported
    once, by the CLI, so both are dropped for the rest of the process; every
    other record and unraisable exception passes through unchanged. Called
    once, at the CLI's entry; calling it again does nothing.
    """
    global _QUIETED
    if _QUIETED:
        return
    _QUIETED = True
    logging.getLogger("asyncio").addFilter(_not_interrupted)
    previous = sys.unraisablehook

    def hook(info: Any) -> None:
        if not isinstance(info.exc_value, Interrupted):
            previous(info)

    sys.unraisablehook = hook
