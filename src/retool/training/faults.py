"""Crash points for the kill-and-resume tests.

``RETOOL_KILL_AT=<point>:<step>[:<count>]`` makes the process SIGKILL itself
at that point of that step (for ``journal``, after the ``count``-th
journaled trajectory). A SIGKILL cannot be caught, so this is exactly what
an out-of-memory kill or a lost machine does; the tests then ``--resume`` and
compare with an uninterrupted run. Unset (always, outside tests) it costs one
dictionary lookup.

Points: ``journal`` (mid-rollout), ``state`` (checkpoint state written,
sampler weights not), ``checkpoint`` (both written, step not committed),
``committed`` (metrics line written, manifest line not), ``optim`` (weights
updated, step not committed).
"""

from __future__ import annotations

import os
import signal

_COUNTS: dict[str, int] = {}


def crash_point(point: str, step: int) -> None:
    spec = os.environ.get("RETOOL_KILL_AT")
    if not spec:
        return
    name, _, rest = spec.partition(":")
    at_step, _, count = rest.partition(":")
    if name != point or str(step) != at_step:
        return
    _COUNTS[point] = _COUNTS.get(point, 0) + 1
    if _COUNTS[point] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
