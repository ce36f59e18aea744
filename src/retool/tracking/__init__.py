"""Metrics sinks: dashboards for a run, all offline.

``metrics.jsonl`` in the run directory is the run's record and is always
written (by the training loop, which alone knows which steps a resumed run has
already logged). A *tracker* is an optional dashboard on top, chosen with
``--tracker swanlab|wandb|tensorboard`` and installed with the ``track`` extra:

>>> tracker = make_tracker("tensorboard", run_dir, run_name, config)  # doctest: +SKIP
>>> tracker.log({"reward/mean": 0.4, "stop/answer": 0.9}, step=1)   # doctest: +SKIP
>>> tracker.close()                                                  # doctest: +SKIP

Two rules shape the package (details in :mod:`retool.tracking.base` and
:mod:`retool.tracking.backends`):

* starting fails loudly -- before step 1, as one clear :class:`~retool.errors.RetoolError`
  line -- while logging never fails: a dashboard must not kill a run;
* nothing touches the network: every backend runs in its offline mode and
  writes only under the run directory (sync later with ``wandb sync`` /
  ``swanlab sync``, or point ``tensorboard --logdir`` at it).

Backend packages are imported only when their tracker is asked for, so
importing this package costs nothing.
"""

from __future__ import annotations

from retool.tracking.base import BaseTracker, MultiTracker, Tracker, plain_floats
from retool.tracking.factory import TRACKERS, make_tracker, require_backend

__all__ = [
    "TRACKERS",
    "BaseTracker",
    "MultiTracker",
    "Tracker",
    "make_tracker",
    "plain_floats",
    "require_backend",
]
