"""``python -m retool.launch``: PyTorch's own ``torchrun``, with a shell's exit status.

``torchrun`` itself exits 1 on Ctrl-C: its elastic agent turns SIGINT into a
``SignalException``, stops the ranks with the same signal, and re-raises it, so
its ``main`` ends in a traceback and status 1, whatever the ranks did. A
script or a scheduler then cannot tell "interrupted, continue with --resume"
from a crash. This module runs the very same launcher
(``torch.distributed.run.main``, same arguments, same rendezvous, same
elastic agent: no runtime of ours) and only changes how it ends:

* SIGINT, SIGTERM, SIGHUP or SIGQUIT on the launcher: exit ``128 + signal``
  (130 for Ctrl-C), no traceback. The ranks got the signal from the agent;
  rank 0 stops as ``retool train`` does in one process (a step being
  committed finishes, the last completed step is saved) and prints the one
  line, so the launcher adds none;
* a rank that failed: ``128 + signal`` when a rank was killed by a signal
  (137 for ``kill -9`` or the OOM killer), else rank 0's status (2 when it
  says why in its one line), no traceback: the ranks have printed their line
  (:func:`failure_status`);
* otherwise the launcher's own status (0, or 2 for a usage error).

torchrun's own warning lines (its ``OMP_NUM_THREADS`` banner, "Received
SIGINT death signal", "Sending process ... closing signal") are hidden so that
the ranks' one line stands alone; a ``LOGLEVEL`` set in the environment (the
variable torchrun reads) wins, ``LOGLEVEL=WARNING`` shows them again.

Usage: ``python -m retool.launch --nproc-per-node 2 -m retool train --config
...``, with any torchrun argument.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence

LAUNCHER_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.run",
    "torch.distributed.launcher",
)


def status_of_signal(signum: int) -> int:
    """A shell's status for a process ended by ``signum``."""
    return 128 + int(signum)


def failure_status(failures: Mapping[int, object]) -> int:
    """The job's status from torchrun's failures by global rank (``ProcessFailure``).

    A rank killed by a signal (``kill -9``, the OOM killer) is the cause, the
    others' failures its consequences: ``128 + signal`` of the lowest such rank.
    Otherwise rank 0's status when it failed (its one line says why), else the
    lowest failing rank's. Which consequences torchrun saw before it stopped the
    job is a race; the signal, when there is one, is always among them.
    """
    codes = {rank: int(getattr(failure, "exitcode", 1)) for rank, failure in failures.items()}
    killed = sorted(rank for rank, code in codes.items() if code < 0)
    if killed:
        return status_of_signal(-codes[killed[0]])
    if not codes:
        return 1
    return codes[0 if 0 in codes else min(codes)] or 1


def _quiet_launcher() -> None:
    if os.environ.get("LOGLEVEL", "").strip():
        return
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(LAUNCHER_LOGGERS):
            logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun's ``main`` on ``argv``; see the module docstring for the status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun_main
    except KeyboardInterrupt:  # Ctrl-C while torch loads
        return status_of_signal(signal.SIGINT)
    _quiet_launcher()
    try:
        torchrun_main(args)
    except SignalException as exc:  # the agent stopped the ranks with this signal
        return status_of_signal(exc.sigval)
    except ChildFailedError as exc:
        return failure_status(exc.failures)
    except KeyboardInterrupt:  # before the agent installed its handlers (rendezvous)
        return status_of_signal(signal.SIGINT)
    except SystemExit as exc:  # torchrun's own usage errors (argparse)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
