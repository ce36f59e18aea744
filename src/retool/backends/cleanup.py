"""Closing samplers, services, sandboxes and bars at the end of a command, safely.

Two failures seen against a real remote service, fixed here once for every
caller's ``finally``:

* a sampler without ``close`` (the SDK's own object, or an older adapter)
  ended a successful ``retool eval`` in ``AttributeError: ... 'close'``:
  :func:`close_all` closes what has a ``close`` and skips what has none;
* a ``close`` that fails (a service answering 404 to its session-finish
  call) replaced the real error, so ``retool sft`` printed only "close
  failed": a failing ``close`` is one warning line on stderr and never
  replaces the exception in flight, nor fails a command whose work is done.

Ctrl-C during a ``close`` still interrupts (only ``Exception`` is caught).
"""

from __future__ import annotations

import sys
from typing import Any


def close_quietly(thing: Any, what: str = "") -> str | None:
    """``thing.close()`` if it has one; a failure is a warning line (returned and printed)."""
    if thing is None:
        return None
    close = getattr(thing, "close", None)
    if not callable(close):
        return None
    try:
        close()
    except Exception as exc:  # the real error, if any, is the one in flight
        name = what or type(thing).__name__
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        line = f"retool: warning: closing the {name} failed ({type(exc).__name__}: {why})"
        print(line, file=sys.stderr)
        return line
    return None


def close_all(*things: Any) -> list[str]:
    """Close each of ``things`` in order (``None`` and objects without ``close`` skipped);
    the warning lines of those that failed."""
    return [line for thing in things if (line := close_quietly(thing)) is not None]
