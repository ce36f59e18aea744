"""The tracker contract, and the failure policy every backend shares.

A tracker is a dashboard sink: the training loop hands it one flat
``{name: float}`` per completed step. The run's own record is ``metrics.jsonl``
in the run directory; a tracker is a view of it, so the two rules here are:

* **A dashboard never kills a run.** Once a tracker has started, an exception
  from its ``log`` or ``close`` is caught, warned about once (later ones only
  counted, so a broken dashboard does not flood the log every step) and counted
  in :attr:`BaseTracker.failures`. ``KeyboardInterrupt`` and other
  ``BaseException`` s still propagate: only the dashboard's own errors are
  swallowed.
* **Values are plain floats.** Metrics arrive as ints, bools, numpy or torch
  scalars; every backend gets ``float(value)``, so no backend has to guess at
  a type (W&B would log a 0-d tensor as a histogram, SwanLab rejects some numpy
  types). A value that has no float is dropped, with one warning per name,
  rather than losing the whole step.

Starting is the opposite: a tracker that cannot start raises before step 1 (see
:func:`retool.tracking.make_tracker`), because a run the user asked to watch
should not run unwatched for hours.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Tracker(Protocol):
    """A metrics sink the training loop calls once per completed step."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` for ``step``; never raises for the sink's own errors."""
        ...

    def close(self) -> None:
        """Flush and release the sink; idempotent, never raises."""
        ...


def plain_floats(metrics: Mapping[str, Any], dropped: set[str] | None = None) -> dict[str, float]:
    """``{str(name): float(value)}``; a value with no float is left out.

    Names left out are added to ``dropped`` (when given), so the caller can
    warn once per name instead of once per step.
    """
    values: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            values[str(name)] = float(value)
        except (TypeError, ValueError):
            if dropped is not None:
                dropped.add(str(name))
    return values


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of ``exc`` on one line, cut to ``limit`` characters."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


class BaseTracker:
    """A started backend plus the shared policy: plain floats, failures counted.

    Subclasses implement :meth:`_write` and :meth:`_finish`; this class makes
    sure neither can raise into the training loop.
    """

    kind: str = "tracker"

    def __init__(self) -> None:
        self._failures = 0
        self._closed = False
        self._dropped: set[str] = set()
        self._warned_dropped: set[str] = set()

    @property
    def failures(self) -> int:
        """How many ``log``/``close`` calls raised inside the backend (and were caught)."""
        return self._failures

    @property
    def closed(self) -> bool:
        return self._closed

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._closed:
            return
        values = plain_floats(metrics, self._dropped)
        new = self._dropped - self._warned_dropped
        if new:
            self._warned_dropped |= new
            log.warning(
                "tracker %s: dropped metric(s) with no float value: %s",
                self.kind,
                ", ".join(sorted(new)),
            )
        try:
            self._write(values, int(step))
        except Exception as exc:
            self._failed("log", exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._finish()
        except Exception as exc:
            self._failed("close", exc)

    def _failed(self, what: str, exc: Exception, who: str | None = None) -> None:
        self._failures += 1
        name = who or self.kind
        if self._failures == 1:
            log.warning(
                "tracker %s: %s failed (%s); training continues, "
                "further tracker failures are only counted",
                name,
                what,
                one_line(exc),
            )
        else:
            log.debug("tracker %s: %s failed again: %s", name, what, one_line(exc))

    def _write(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> BaseTracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class MultiTracker(BaseTracker):
    """Fans each call out to several trackers; one failing does not stop the others.

    The trackers made by :func:`~retool.tracking.make_tracker` already swallow
    their own errors; this wrapper applies the same policy to any other
    :class:`Tracker` it is given. :attr:`failures` counts its own catches plus
    the ``failures`` of the trackers it holds.
    """

    kind = "multi"

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        super().__init__()
        self.trackers: list[Tracker] = list(trackers)

    @property
    def failures(self) -> int:
        inner = sum(int(getattr(t, "failures", 0)) for t in self.trackers)
        return self._failures + inner

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._closed:
            return
        values = plain_floats(metrics)
        for tracker in self.trackers:
            try:
                tracker.log(values, step)
            except Exception as exc:
                self._failed("log", exc, _kind(tracker))

    def _finish(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:
                self._failed("close", exc, _kind(tracker))


def _kind(tracker: Tracker) -> str:
    return str(getattr(tracker, "kind", type(tracker).__name__))
