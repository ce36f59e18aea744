"""Progress bars that keep moving while nothing ends.

tqdm redraws a bar only when it is updated, and a rollout or an evaluation
updates its bar once per *ended* trajectory. The last trajectory of a batch
(a long straggler decoding one token after another) can take a minute, and
for that minute the bar showed the same elapsed time: it looked like a hang.
:func:`keep_ticking` starts one daemon thread that redraws the given bars
every ``interval`` seconds, so their elapsed time (and the time since the
last trajectory ended, shown when it grows) keeps moving. The thread ends by
itself once every bar is closed (tqdm disables a bar when it closes), so no
caller has to stop it; a disabled bar (off a TTY, ``--no-progress``) never
starts one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

WAITING_AFTER_S = 5.0  # after this long without an update the bar says how long it waits


def _waiting(bar: Any, since: float) -> str:
    left = (bar.total or 0) - bar.n
    waited = time.monotonic() - since
    if left <= 0 or waited < WAITING_AFTER_S:
        return ""
    return f"{left} still decoding, {waited:.0f}s since the last ended"


def keep_ticking(*bars: Any, interval: float = 1.0, say_waiting: bool = False) -> threading.Thread:
    """Redraw ``bars`` every ``interval`` seconds until all are closed; returns the thread.

    ``say_waiting``: also write ``"N still decoding, Ts since the last ended"`` as
    the postfix of the first bar once it has waited :data:`WAITING_AFTER_S`
    (for a bar whose postfix nobody else writes between updates).
    """
    live = [bar for bar in bars if not bar.disable]

    def tick() -> None:
        seen = {id(bar): (bar.n, time.monotonic()) for bar in live}
        while any(not bar.disable for bar in live):
            time.sleep(interval)
            for bar in live:
                if bar.disable:
                    continue
                n, since = seen[id(bar)]
                if bar.n != n:
                    seen[id(bar)] = (bar.n, time.monotonic())
                elif say_waiting and bar is live[0] and (note := _waiting(bar, since)):
                    bar.set_postfix_str(note, refresh=False)
                bar.refresh()

    thread = threading.Thread(target=tick, name="retool-progress", daemon=True)
    if live:
        thread.start()
    return thread
