"""``python -m retool.launch``'s exit status, and a torchrun rank's one line (no group needed).

The launcher is torchrun's own ``main``; what is ours is only how it ends: the
status a shell sees for a signal or a failed rank (the jobs themselves are in
``test_failure.py``, Ctrl-C, and ``test_commands.py``, kill -9). A rank's
:class:`~retool.cli._LastWord` decides its single line: a lost rank's line replaces
the command's, and nothing is said twice.
"""

from __future__ import annotations

import signal
from types import SimpleNamespace

from retool.cli import _LastWord
from retool.errors import BackendError
from retool.launch import failure_status, status_of_signal
from tests.distributed.common import python


def failed(code: int) -> SimpleNamespace:
    return SimpleNamespace(exitcode=code)


def test_the_status_of_a_failed_job_names_its_cause():
    assert status_of_signal(signal.SIGINT) == 130 and status_of_signal(signal.SIGTERM) == 143
    # kill -9 of rank 1: rank 0's own exit (its lost-rank line) may or may not be seen yet.
    assert failure_status({1: failed(-9)}) == 137
    assert failure_status({0: failed(2), 1: failed(-9)}) == 137
    assert failure_status({0: failed(2), 2: failed(1)}) == 2  # rank 0 said why
    assert failure_status({3: failed(1), 2: failed(4)}) == 4
    assert failure_status({}) == 1


def test_a_usage_error_of_torchrun_is_its_status_without_a_traceback():
    ran = python("-m", "retool.launch", "--nproc-per-node", timeout=120)
    assert ran.returncode == 2, ran.stderr[-2000:]  # argparse's: the value is missing
    assert "--nproc-per-node" in ran.stderr and "Traceback" not in ran.stderr


def test_a_rank_says_one_line_and_a_lost_rank_comes_first(capsys):
    quiet = _LastWord(lambda: None)
    assert quiet.end(lambda: print("retool: stopped by SIGTERM") or 143) == 143
    assert quiet.end(lambda: print("retool: error: again") or 2) == 143  # said already
    quiet.handle(signal.SIGTERM, None)  # a signal once said: the rank is ending, no raise
    assert capsys.readouterr().err == "" and "again" not in capsys.readouterr().out

    lost = _LastWord(lambda: BackendError("rank 1 (pid 7) stopped: the job stopped"))
    assert lost.end(lambda: print("retool: stopped by SIGTERM") or 143) == 2
    assert capsys.readouterr().err == "retool: error: rank 1 (pid 7) stopped: the job stopped\n"
    assert lost.end(lambda: 2) == 2 and capsys.readouterr().err == ""


def test_a_signal_before_the_line_stops_the_command():
    word = _LastWord(lambda: None)
    for signum, kind in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, KeyboardInterrupt)):
        try:
            word.handle(signum, None)
        except kind as exc:
            assert getattr(exc, "signum", signal.SIGINT) == signum
        else:
            raise AssertionError("no stop")
