"""Crash points for the kill-and-resume and disk-full tests.

``RETOOL_KILL_AT=<point>:<step>[:<count>]`` makes the process SIGKILL itself
at that point of that step (for ``journal``, after the ``count``-th
journaled trajectory). A SIGKILL cannot be caught, so this is exactly what
an out-of-memory kill or a lost machine does; the tests then ``--resume`` and
compare with an uninterrupted run. Unset (always, outside tests) it costs one
dictionary lookup.

``RETOOL_FILL_AT=<point>:<step>[:<count>]`` with ``RETOOL_FILL_FILE=<path>``
instead fills the file system holding ``path`` at that point (a ballast
file, written until the kernel says ENOSPC) and carries on, so the next
write of the run hits a real "No space left on device". The disk-full test
runs it on a small tmpfs in a private mount namespace, deletes the ballast
and resumes.

Points: ``journal`` (mid-rollout), ``state`` (checkpoint state written,
sampler weights not), ``checkpoint`` (both written, step not committed),
``rollouts`` (the step's rollouts file written, its metrics line not),
``committed`` (metrics line written, manifest line not), ``optim`` (weights
updated, step not committed), ``eval`` (a periodic evaluation, before its
results file is first written: on tmpfs a row appended into a page the file
already has needs no new space, so filling mid-evaluation would not fail it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal

_COUNTS: dict[str, int] = {}


def _due(variable: str, point: str, step: int) -> bool:
    spec = os.environ.get(variable)
    if not spec:
        return False
    name, _, rest = spec.partition(":")
    at_step, _, count = rest.partition(":")
    if name != point or str(step) != at_step:
        return False
    key = f"{variable}:{point}"
    _COUNTS[key] = _COUNTS.get(key, 0) + 1
    return _COUNTS[key] == int(count or 1)


def fill_disk(path: str) -> None:
    """Write ``path`` until its file system is full (then leave it there)."""
    with open(path, "ab", buffering=0) as handle:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * size)
        with contextlib.suppress(OSError):
            os.fsync(handle.fileno())


def crash_point(point: str, step: int) -> None:
    if _due("RETOOL_KILL_AT", point, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if _due("RETOOL_FILL_AT", point, step):
        ballast = os.environ.get("RETOOL_FILL_FILE")
        if not ballast:
            raise OSError(errno.EINVAL, "RETOOL_FILL_AT needs RETOOL_FILL_FILE")
        fill_disk(ballast)
