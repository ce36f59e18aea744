"""The shared policy, without any backend: plain floats, failures warned once and counted."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pytest

from retool.tracking import BaseTracker, MultiTracker, Tracker, plain_floats
from retool.tracking.base import one_line


class Recording(BaseTracker):
    kind = "recording"

    def __init__(self, fail_log: bool = False, fail_close: bool = False) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.fail_log = fail_log
        self.fail_close = fail_close
        self.finished = 0

    def _write(self, values: dict[str, float], step: int) -> None:
        if self.fail_log:
            raise ConnectionError("dashboard\nunreachable")
        self.rows.append((step, values))

    def _finish(self) -> None:
        self.finished += 1
        if self.fail_close:
            raise OSError("disk full")


class Foreign:
    """A third-party Tracker that raises: MultiTracker must contain it."""

    kind = "foreign"

    def __init__(self) -> None:
        self.closed = False

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        raise RuntimeError("boom")

    def close(self) -> None:
        self.closed = True
        raise RuntimeError("boom on close")


def test_plain_floats_converts_scalars_and_drops_what_has_no_float() -> None:
    dropped: set[str] = set()
    values = plain_floats(
        {
            "reward/mean": np.float32(0.25),
            "stop/answer": True,
            "count": np.int64(3),
            "rate": 1,
            "bad/name": "n/a",
            "none": None,
        },
        dropped,
    )
    assert values == {"reward/mean": 0.25, "stop/answer": 1.0, "count": 3.0, "rate": 1.0}
    assert all(type(v) is float for v in values.values())
    assert dropped == {"bad/name", "none"}


def test_log_passes_plain_floats_and_int_steps() -> None:
    tracker = Recording()
    tracker.log({"reward/mean": np.float64(0.5), "stop/answer": 1}, step=np.int64(2))
    assert tracker.rows == [(2, {"reward/mean": 0.5, "stop/answer": 1.0})]
    assert type(tracker.rows[0][0]) is int
    assert all(type(v) is float for v in tracker.rows[0][1].values())


def test_a_dropped_metric_is_warned_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    tracker = Recording()
    with caplog.at_level(logging.WARNING, logger="retool.tracking"):
        for step in range(3):
            tracker.log({"ok": 1.0, "text": "x"}, step)
    warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1 and "text" in warnings[0].getMessage()
    assert [values for _, values in tracker.rows] == [{"ok": 1.0}] * 3


def test_log_failures_warn_once_are_counted_and_never_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = Recording(fail_log=True)
    with caplog.at_level(logging.WARNING, logger="retool.tracking"):
        for step in range(5):
            tracker.log({"reward/mean": 1.0}, step)
    assert tracker.failures == 5
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "recording" in message and "ConnectionError: dashboard unreachable" in message
    assert "\n" not in message


def test_close_is_idempotent_and_a_close_failure_is_counted() -> None:
    tracker = Recording(fail_close=True)
    tracker.close()
    tracker.close()
    assert tracker.finished == 1 and tracker.failures == 1 and tracker.closed
    tracker.log({"a": 1.0}, 1)  # after close: ignored, not an error
    assert tracker.rows == [] and tracker.failures == 1


def test_context_manager_closes() -> None:
    with Recording() as tracker:
        tracker.log({"a": 1.0}, 1)
    assert tracker.closed and tracker.finished == 1


def test_multi_tracker_fans_out_and_contains_a_failing_tracker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good, failing, foreign = Recording(), Recording(fail_log=True), Foreign()
    multi = MultiTracker([good, failing, foreign])
    assert isinstance(multi, Tracker) and isinstance(foreign, Tracker)
    with caplog.at_level(logging.WARNING, logger="retool.tracking"):
        for step in (1, 2, 3):
            multi.log({"reward/mean": step / 2}, step)
        multi.close()
    assert good.rows == [(1, {"reward/mean": 0.5}), (2, {"reward/mean": 1.0}),
                         (3, {"reward/mean": 1.5})]  # fmt: skip
    # failing: 3 own log failures; foreign: 3 log + 1 close caught by the multi tracker
    assert failing.failures == 3
    assert multi.failures == 3 + 4
    assert good.closed and failing.closed and foreign.closed
    assert any("foreign" in r.getMessage() for r in caplog.records)


def test_one_line() -> None:
    assert one_line(ValueError("a\n  b")) == "ValueError: a b"
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line(ValueError("x" * 1000))) == 300
