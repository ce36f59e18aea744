"""The training loop's interrupt guard: which part of a step a stop signal may cut."""

from __future__ import annotations

import os
import signal

import pytest

from retool.interrupts import Interrupted, InterruptGuard


def _signal() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_before_hold_a_signal_stops_at_once():
    guard = InterruptGuard()
    reached = []
    with guard.installed(), pytest.raises(Interrupted), guard.deferred_from():
        _signal()  # a forward_backward: nothing changed yet
        reached.append("after")
    assert reached == []


def test_after_hold_a_signal_waits_for_the_end_of_the_block():
    guard = InterruptGuard()
    reached = []
    with guard.installed(), pytest.raises(Interrupted) as stopped, guard.deferred_from() as hold:
        hold()  # the optim_step is submitted
        _signal()
        reached.append("commit")  # the metrics and manifest lines still get written
        hold()  # idempotent: one level, released once
    assert reached == ["commit"]
    assert stopped.value.signum == signal.SIGTERM


def test_a_block_never_held_and_a_held_block_without_signal_end_quietly():
    guard = InterruptGuard()
    with guard.installed():
        with guard.deferred_from():
            pass
        with guard.deferred_from() as hold:
            hold()
    with guard.installed(), pytest.raises(Interrupted):
        _signal()  # the guard is not left deferring after the blocks


def test_inside_an_outer_critical_block_the_outermost_raises():
    guard = InterruptGuard()
    reached = []
    with guard.installed(), pytest.raises(Interrupted), guard.critical():
        with guard.deferred_from() as hold:
            hold()
            _signal()
        reached.append("outer")
    assert reached == ["outer"]
