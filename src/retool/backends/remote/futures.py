"""SDK futures as ours; SDK errors as one-line :class:`~retool.errors.BackendError` errors.

Design, and why:

* **Bridged, not waited on.** SDK futures (Tinker's ``APIFuture``, PyTRIO's
  ``APIFuture`` without ``result_async``) are bridged into our
  :class:`~retool.types.Future` by a done-callback on the SDK's own
  ``concurrent.futures.Future``: no thread waits per request, ``.result()``
  and ``await`` both work, and a caller can submit many requests before it
  waits on the first (the training session pipelines an update that way).
* **One error type.** An SDK exception, raised at submit time or delivered
  later, comes out of our future as a :class:`~retool.errors.BackendError`
  of one line that names the backend and the call, with the SDK error kept
  as its cause; our own errors pass through unchanged.
* **No retry layer**: both SDKs retry transport errors themselves.

The SDK futures and results are typed ``Any``: they are the SDKs' own
classes, imported only inside the adapters that need them.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from retool.errors import BackendError, RetoolError
from retool.types import Future

T = TypeVar("T")

MESSAGE_LIMIT = 600  # characters of an SDK error kept in our one-line message


def translate(exc: BaseException, backend: str, what: str) -> BaseException:
    """An SDK exception as a one-line :class:`BackendError` (the SDK error kept as cause)."""
    if isinstance(exc, RetoolError) or not isinstance(exc, Exception):
        return exc
    text = " ".join(str(exc).split())
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT] + "..."
    error = BackendError(f"{backend}: {what} failed: {type(exc).__name__}: {text}")
    error.__cause__ = exc
    return error


_waiters: concurrent.futures.ThreadPoolExecutor | None = None
_waiters_lock = threading.Lock()


def _concurrent_future(sdk_future: Any) -> concurrent.futures.Future[Any]:
    """The ``concurrent.futures.Future`` behind an SDK future (``Any``: the SDK's class).

    Tinker exposes it (``APIFuture.future()``, tinker/lib/public_interfaces/
    api_future.py); PyTRIO's ``APIFuture`` keeps it as ``_future`` and awaits
    it the same way (pytrio/types/future/api_future.py: ``APIFuture.__await__``).
    Anything else is waited on by a shared worker thread.
    """
    getter = getattr(sdk_future, "future", None)
    if callable(getter):
        inner = getter()
        if isinstance(inner, concurrent.futures.Future):
            return inner
    if isinstance(sdk_future, concurrent.futures.Future):
        return sdk_future
    inner = getattr(sdk_future, "_future", None)
    if isinstance(inner, concurrent.futures.Future):
        return inner
    global _waiters
    with _waiters_lock:
        if _waiters is None:
            _waiters = concurrent.futures.ThreadPoolExecutor(4, "retool-remote-wait")
    return _waiters.submit(sdk_future.result)


def bridge(sdk_future: Any, convert: Callable[[Any], T], backend: str, what: str) -> Future[T]:
    """Our :class:`Future` of ``convert(result)`` for an SDK future (and its SDK result).

    ``convert`` runs in the SDK's completion callback; an exception from the
    SDK or from ``convert`` fails our future (translated, see :func:`translate`).
    """
    source = _concurrent_future(sdk_future)
    target: concurrent.futures.Future[T] = concurrent.futures.Future()

    def done(finished: concurrent.futures.Future[Any]) -> None:
        if target.done():
            return
        if finished.cancelled():
            target.cancel()
            return
        error = finished.exception()
        if error is not None:
            target.set_exception(translate(error, backend, what))
            return
        try:
            target.set_result(convert(finished.result()))
        except BaseException as exc:
            target.set_exception(translate(exc, backend, what))

    source.add_done_callback(done)
    return Future(target)


def submit(
    start: Callable[[], Any], convert: Callable[[Any], T], backend: str, what: str
) -> Future[T]:
    """``bridge(start(), convert)``; an exception raised by ``start`` fails the future.

    ``start`` returns the SDK's future, ``convert`` takes the SDK's result.
    """
    try:
        sdk_future = start()
    except Exception as exc:
        return Future.failed(translate(exc, backend, what))
    return bridge(sdk_future, convert, backend, what)


def call(start: Callable[[], T], backend: str, what: str) -> T:
    """``start()`` with SDK exceptions translated (for calls that block and return)."""
    try:
        return start()
    except RetoolError:
        raise
    except Exception as exc:
        raise translate(exc, backend, what) from exc
