"""Per-call statistics, in windows.

The reference only kept cumulative rates since start and logged them as if they
were per step. ``snapshot_and_reset()`` returns the window since the previous
snapshot (one training step, typically); ``totals()`` stays cumulative.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from retool.sandbox.result import ErrorKind, ExecResult


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[rank]


@dataclass
class _Window:
    calls: int = 0
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    oom: int = 0
    latencies: list[float] = field(default_factory=list)


class SandboxStats:
    """Thread-safe counters of sandbox calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window = _Window()
        self._total_calls = 0
        self._total_timeouts = 0

    def record(self, result: ExecResult) -> None:
        with self._lock:
            w = self._window
            w.calls += 1
            w.ok += result.ok
            w.errors += not result.ok and result.error_kind not in (
                ErrorKind.TIMEOUT,
                ErrorKind.MEMORY,
            )
            w.timeouts += result.error_kind == ErrorKind.TIMEOUT
            w.oom += result.error_kind == ErrorKind.MEMORY
            w.latencies.append(result.latency_s)
            self._total_calls += 1
            self._total_timeouts += result.error_kind == ErrorKind.TIMEOUT

    def snapshot_and_reset(self) -> dict[str, float]:
        """Counts, rates and latency percentiles since the previous snapshot."""
        with self._lock:
            w, self._window = self._window, _Window()
        n = max(w.calls, 1)
        return {
            "calls": w.calls,
            "ok": w.ok,
            "errors": w.errors,
            "timeouts": w.timeouts,
            "oom": w.oom,
            "success_rate": w.ok / n,
            "error_rate": w.errors / n,
            "timeout_rate": w.timeouts / n,
            "oom_rate": w.oom / n,
            "latency_p50_s": _percentile(w.latencies, 0.5),
            "latency_p95_s": _percentile(w.latencies, 0.95),
        }

    def totals(self) -> dict[str, int]:
        with self._lock:
            return {"calls": self._total_calls, "timeouts": self._total_timeouts}
