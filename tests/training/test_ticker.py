"""Bars that keep moving while the last trajectory decodes (:mod:`retool.training.ticker`)."""

from __future__ import annotations

import io
import time

from tqdm import tqdm

from retool.training import ticker
from retool.training.display import Display


def _bar(out: io.StringIO, total: int = 4) -> tqdm:
    return tqdm(
        total=total, file=out, disable=False, mininterval=0, bar_format="{n}/{total} {postfix}"
    )


def _wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_a_bar_with_no_update_is_redrawn_and_says_it_waits(monkeypatch):
    monkeypatch.setattr(ticker, "WAITING_AFTER_S", 0.0)
    out = io.StringIO()
    bar = _bar(out)
    bar.update(3)  # three ended; the last one decodes
    drawn = out.getvalue().count("\r")
    thread = ticker.keep_ticking(bar, interval=0.01, say_waiting=True)
    assert _wait_for(lambda: out.getvalue().count("\r") >= drawn + 3)  # redrawn, no update
    assert _wait_for(lambda: "1 still decoding" in out.getvalue())
    bar.close()
    thread.join(timeout=20)
    assert not thread.is_alive()  # ends with its bars, nobody stops it


def test_disabled_bars_start_no_thread():
    bar = tqdm(total=3, disable=True)
    assert not ticker.keep_ticking(bar).is_alive()
    display = Display(total_steps=2, first_step=0, per_step=4, enabled=False, unit="traj")
    display.close()
