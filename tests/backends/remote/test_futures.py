"""SDK futures bridged into ours, SDK errors translated (no SDK needed)."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from retool.backends.remote import futures
from retool.errors import BackendError


class SdkError(Exception):
    """Stands for an SDK's own exception class."""


def test_bridge_delivers_results_exceptions_and_cancellation_to_result_and_await():
    source: concurrent.futures.Future = concurrent.futures.Future()
    ours = futures.bridge(source, lambda v: v * 2, "svc", "op")  # a bare concurrent future
    assert not ours.done()
    source.set_result(21)
    assert ours.result(timeout=1) == 42

    class PytrioLike:  # keeps its concurrent future as `_future`, no `future()`
        def __init__(self, inner):
            self._future = inner

    failing: concurrent.futures.Future = concurrent.futures.Future()
    ours = futures.bridge(PytrioLike(failing), lambda v: v, "pytrio", "sample")
    failing.set_exception(SdkError("503 after every retry"))
    with pytest.raises(BackendError, match="pytrio: sample failed: SdkError: 503") as caught:
        ours.result(timeout=1)
    assert isinstance(caught.value.__cause__, SdkError)

    async def awaited():
        inner: concurrent.futures.Future = concurrent.futures.Future()
        pending = futures.bridge(PytrioLike(inner), lambda v: v + 1, "pytrio", "sample")
        asyncio.get_running_loop().call_later(0.01, inner.set_result, 1)
        return await pending

    assert asyncio.run(awaited()) == 2

    class ResultOnly:  # neither: waited on by a worker thread
        def result(self, timeout=None):
            return "late"

    assert futures.bridge(ResultOnly(), str.upper, "x", "y").result(timeout=5) == "LATE"

    cancelled: concurrent.futures.Future = concurrent.futures.Future()
    ours = futures.bridge(cancelled, lambda v: v, "x", "y")
    cancelled.cancel()
    assert ours._inner.cancelled()

    broken = futures.submit(lambda: (_ for _ in ()).throw(SdkError("bad token id")), str, "x", "op")
    with pytest.raises(BackendError, match="x: op failed: SdkError: bad token id"):
        broken.result()
    converted_badly = futures.bridge(source, lambda v: 1 / 0, "x", "op")
    with pytest.raises(BackendError, match="ZeroDivisionError"):
        converted_badly.result()


def test_a_long_multiline_sdk_message_becomes_one_bounded_line():
    error = futures.translate(SdkError("first\nsecond " + "x" * 5000), "tinker", "sample")
    assert "\n" not in str(error) and len(str(error)) < 700 and "first second" in str(error)
    kept = BackendError("ours")
    assert futures.translate(kept, "tinker", "sample") is kept
