"""The synchronous twin of an async entry point, without a second copy of it.

``rollout_batch`` and ``evaluate`` are their ``*_async`` functions run in an
event loop of their own: :func:`synchronous` makes that wrapper from the async
function, so the signature and the body exist once. Called from inside a
running loop it refuses (``asyncio.run`` would fail there with a less helpful
message) and names the ``await`` form to use instead.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def synchronous(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """``function`` (named ``NAME_async``) as ``NAME``, for callers outside an event loop."""
    async_name = function.__name__
    name = async_name.removesuffix("_async")

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(function(*args, **kwargs))
        raise RuntimeError(
            f"{name}() was called from a running event loop; use `await {async_name}(...)` there"
        )

    run.__name__ = name
    run.__qualname__ = function.__qualname__.removesuffix("_async")
    run.__doc__ = f":func:`{async_name}` from synchronous code (runs its own event loop)."
    return run
