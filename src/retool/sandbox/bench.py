"""Latency and throughput of the sandbox against the reference approach.

The reference ran every snippet with a fresh ``python -c`` (CPU rlimit, the
parent's environment). We time the same snippets both ways in one run and
print medians, p95 and the ratio, then the cost of each isolation layer (the
same sandbox with that layer switched off). Used by ``retool sandbox bench``
and ``bench/sandbox.py``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from retool.sandbox.local import LocalSandbox

SNIPPETS = {
    "print": "print(2**100)",
    "sympy": "import sympy; print(sympy.factorint(2**64-1))",
    "numpy": "import numpy as np; a = np.arange(10000.0); print(float(a @ a))",
}


@dataclass(frozen=True)
class Timing:
    """Latencies of one snippet under one approach, in milliseconds."""

    p50_ms: float
    p95_ms: float


def fresh_python(code: str, timeout: float = 30.0) -> None:
    """The reference approach: a new interpreter per call, the parent's environment."""
    subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=timeout,
        env=dict(os.environ),
        check=False,
    )


def _time(fn: Callable[[], object], n: int) -> Timing:
    fn()  # warm-up, not counted
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return _summary(samples)


def _time_alternating(
    first: Callable[[], object], second: Callable[[], object], n: int
) -> tuple[Timing, Timing]:
    """Timings of ``first`` and ``second``, their calls interleaved."""
    first(), second()  # warm-up, not counted
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for fn, out in ((first, samples[0]), (second, samples[1])):
            started = time.perf_counter()
            fn()
            out.append((time.perf_counter() - started) * 1000)
    return _summary(samples[0]), _summary(samples[1])


def _summary(samples: list[float]) -> Timing:
    ordered = sorted(samples)
    return Timing(
        statistics.median(samples), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    )


def _throughput(fn: Callable[[], object], workers: int, n: int) -> float:
    pool = ThreadPoolExecutor(workers)
    try:
        started = time.perf_counter()
        list(pool.map(lambda _: fn(), range(n)))
        return n / (time.perf_counter() - started)
    finally:  # interrupted: the queued calls are dropped, only running ones finish
        pool.shutdown(wait=True, cancel_futures=True)


# Layers that can be switched off one at a time (``--disable`` of the server): the
# seccomp filter and the cgroups, the per-call network and cgroup namespaces, the
# minimal /etc and the /proc masks; the cpu cgroup alone ("cpu") and the
# address-space pin ("pin"); the neutral paths of the interpreter, runtime and
# site-packages ("neutral"), the time namespace per call ("timens") and the relocated
# layers' rewritten files ("relocate").
LAYERS = (
    "seccomp",
    "cgroups",
    "netns",
    "cgroupns",
    "etc",
    "procmask",
    "cpu",
    "pin",
    "neutral",
    "timens",
    "relocate",
)


def _without(*layers: str) -> type[LocalSandbox]:
    return type("LocalSandboxWithout", (LocalSandbox,), {"_disable_layers": layers})


def run_bench(n: int = 30, workers: int = 2, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure and print the tables; returns the figures."""
    results: dict[str, Any] = {}
    w = max(workers, 1)
    with (
        LocalSandbox(max_workers=w) as ours,
        LocalSandbox(max_workers=w, isolation="none") as bare,
    ):
        log(f"isolation level: {ours.isolation_level}; n={n} calls per cell, median / p95 in ms")
        log(
            f"{'snippet':<8} {'fresh python -c':>18} {'ours (basic)':>16} "
            f"{'ours (full)':>16} {'speed-up':>9} {'full - basic':>13}"
        )
        for name, code in SNIPPETS.items():
            ref = _time(partial(fresh_python, code), n)
            plain = _time(partial(bare.run, code), n)
            full = _time(partial(ours.run, code), n)
            ratio = ref.p50_ms / full.p50_ms
            results[name] = {
                "fresh": ref,
                "ours_no_isolation": plain,
                "ours": full,
                "speedup": ratio,
            }
            log(
                f"{name:<8} {ref.p50_ms:>8.1f} / {ref.p95_ms:>6.1f} {plain.p50_ms:>6.1f} / "
                f"{plain.p95_ms:>6.1f} {full.p50_ms:>7.1f} / {full.p95_ms:>6.1f} "
                f"{ratio:>8.1f}x {full.p50_ms - plain.p50_ms:>+10.1f} ms"
            )
        code = SNIPPETS["sympy"]
        for k in sorted({1, workers}):
            ref_tp = _throughput(lambda: fresh_python(code), k, n)
            our_tp = _throughput(lambda: ours.run(code), k, n)
            results[f"throughput_{k}"] = {"fresh": ref_tp, "ours": our_tp}
            log(
                f"throughput (sympy snippet, {k} worker{'s' if k > 1 else ''}): fresh "
                f"{ref_tp:.1f} req/s, ours {our_tp:.1f} req/s ({our_tp / ref_tp:.1f}x)"
            )
        log("cost of each layer on `print` (full minus full-without-it, p50 ms; the two")
        log("sandboxes' calls alternate, so both see the same load):")
        for layer in LAYERS:
            with _without(layer)(max_workers=w) as reduced:
                full_print, less = _time_alternating(
                    partial(ours.run, SNIPPETS["print"]), partial(reduced.run, SNIPPETS["print"]), n
                )
            results[f"layer_{layer}"] = full_print.p50_ms - less.p50_ms
            log(
                f"  {layer:<9} full {full_print.p50_ms:.1f}, without {less.p50_ms:.1f}: "
                f"{full_print.p50_ms - less.p50_ms:+.1f} ms"
            )
    results["start"] = start_times(w, log)
    return results


def _start_s(cls: type[LocalSandbox], workers: int) -> float:
    """Seconds from nothing to a sandbox that has answered one call."""
    started = time.perf_counter()
    with cls(max_workers=workers) as sandbox:
        sandbox.run("print(1)")
        return time.perf_counter() - started


def start_times(workers: int, log: Callable[[str], None] = print) -> dict[str, float]:
    """The relocated layers' cost where it is paid, at start-up: the first start on
    an empty layer cache (the one-off rewrite), a start on the warm cache, and a
    start without the layers, which the warm one must be compared with."""
    saved = os.environ.get("XDG_CACHE_HOME")
    with tempfile.TemporaryDirectory(prefix="retool-bench-layers-") as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        try:
            cold = _start_s(LocalSandbox, workers)
            warm = statistics.median(_start_s(LocalSandbox, workers) for _ in range(3))
            bare = statistics.median(_start_s(_without("relocate"), workers) for _ in range(3))
        finally:
            if saved is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = saved
    log(
        f"start-up to a first answer (median of 3): {warm:.2f} s with the relocated layers "
        f"(warm cache), {bare:.2f} s without ({warm - bare:+.2f} s); the first start on an "
        f"empty cache {cold:.1f} s (the one-off rewrite)"
    )
    return {"cold_s": cold, "warm_s": warm, "without_s": bare}
