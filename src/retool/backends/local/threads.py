"""Run the local backend's torch work off the caller's thread, in a short-lived worker.

PyTorch's CPU build parallelises with GNU OpenMP, which keeps one pool of
worker threads per thread that ever ran a parallel region, for that thread's
whole life. Idle pool threads spin for a few milliseconds between regions so
the next region starts at once, but only while the process has no more pool
threads than CPUs; beyond that every region waits for its workers to be woken
(libgomp's "throttled" spin count). The sampling engine decodes in its own
thread, so if the caller's thread (usually the main thread, which loaded the
model and ran the training step) also holds a pool, the engine's ~1,000
parallel regions per decode step all pay that wake-up: measured on this 2-core
machine, SmolLM2, 4 rows, one decode step 96-98 ms with a pool in the main
thread against 62-73 ms without (``bench/local_backend.py --part decode``
measures the engine as used).

So every call of the local backend that runs heavy torch work (model loading,
``forward_backward``, ``optim_step``, snapshots, checkpoints,
``compute_logprobs``) runs in a fresh worker thread that exits afterwards and
takes its pool with it; the caller's thread never gets one. A call made from
a worker (or from an engine thread) runs inline. Starting a thread costs about
0.1 ms, nothing next to these calls.

The caller waits for the whole call: an interrupt (Ctrl-C, or the CLI's
SIGTERM exception) that arrives meanwhile is raised when the call has
finished, so a call is all-or-nothing (an optimizer step is never half
applied when the training loop saves its interrupt checkpoint). That is no
later than before: a signal never interrupted a torch operation running in
the main thread either.

The wait is on a lock the worker releases, never ``Thread.join``: on
Python 3.11, a ``KeyboardInterrupt`` raised inside ``join`` while the thread
still runs marks the thread as stopped (the bpo-45274 clean-up in
``_wait_for_tstate_lock`` sees the running thread's lock held and releases
it), so the next ``join`` returned at once. The interrupt then unwound the
command and the interpreter exited with a worker inside torch:
"terminate called without an active exception" and SIGABRT (134) or SIGSEGV
(139). Seen on ``retool sft`` on SmolLM2, whose first seconds are
almost all such calls (model loading, the first ``forward_backward``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")
_local = threading.local()


def mark_compute_thread() -> None:
    """Declare the current thread a compute thread: calls made from it run inline."""
    _local.compute = True


def in_compute_thread() -> bool:
    return bool(getattr(_local, "compute", False))


def run_in_worker(fn: Callable[[], T]) -> T:
    """``fn()`` in a fresh worker thread (inline on a compute thread); its value or error."""
    if in_compute_thread():
        return fn()
    threads = torch.get_num_threads()
    box: dict[str, Any] = {}
    finished = threading.Lock()
    finished.acquire()

    def target() -> None:
        try:
            mark_compute_thread()
            if torch.get_num_threads() != threads:  # the caller's setting, not OpenMP's default
                torch.set_num_threads(threads)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller as is
            box["error"] = exc
        finally:
            box["done"] = True
            finished.release()

    # Not a daemon: should anything still let the interpreter exit during a
    # call, it waits for the call instead of killing a thread inside torch.
    worker = threading.Thread(target=target, name="retool-compute", daemon=False)
    worker.start()
    interrupt: BaseException | None = None
    while True:
        try:
            # ``box["done"]`` covers an interrupt landing after a successful
            # acquire; the timeout keeps that case from waiting forever.
            if finished.acquire(timeout=0.5) or box.get("done"):
                break
        except KeyboardInterrupt as exc:  # finish the call first (see the module docstring)
            interrupt = exc
    if interrupt is not None:
        raise interrupt
    if "error" in box:
        raise box["error"]
    return box["value"]
