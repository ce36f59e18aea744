"""Attacks on the disk under the output files and on the exit status's epilogue.

``fallocate``: the file-size rlimit (8 MiB) is what bounds a call's output files,
which live on the host filesystem below the sandbox's work directory. The kernel
checks that limit only where a call makes a file longer; ``FALLOC_FL_KEEP_SIZE``
reserves blocks without changing the length, so one call could take every free
block of the trainer's disk for as long as it runs (the file is unlinked only
after the call): without the seccomp rule, 64 MiB reserved on ``/proc/self/fd/1``
(length 0) with the cap at 8 MiB, for a root and a non-root trainer.

Exit statuses: a runtime that reads ``SystemExit.code`` and masks the value with
``&`` after the code has run lets an ``int`` subclass's ``__and__`` or a ``code``
property that raises run in the epilogue and turn the call into the runtime's own
traceback ("sandbox setup failed", our file names) in the observation; and
``sys.exit(2**64)`` must exit 255, as Python does, not 0 (success).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from retool.sandbox import ErrorKind, LocalSandbox, format_tool_content
from retool.sandbox.call import MAX_FILE_BYTES

from .helpers import INTERNALS
from .trainers import BOTH_TRAINERS

FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE = 0x01, 0x10
_FALLOCATE = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
    "r = libc.fallocate(1, {mode}, 0, {size})\n"
    "print(r, ctypes.get_errno(), os.fstat(1).st_blocks * 512)"
)


@BOTH_TRAINERS
@pytest.mark.parametrize("mode", [FALLOC_FL_KEEP_SIZE, FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE])
def test_fallocate_reserves_no_disk_past_the_file_size_cap(sandbox, mode):
    result = sandbox.run(_FALLOCATE.format(mode=mode, size=8 * MAX_FILE_BYTES))
    assert result.ok, result.stderr
    value, _errno, allocated = result.stdout.split()
    assert value == "-1" and int(allocated) <= MAX_FILE_BYTES, result.stdout


def test_fallocate_reserves_no_disk_at_the_basic_level_either():
    # There the call's scratch directory lies on the host filesystem too.
    with LocalSandbox(max_workers=1, timeout=10, isolation="none", preload=("math",)) as basic:
        code = _FALLOCATE.format(mode=FALLOC_FL_KEEP_SIZE, size=8 * MAX_FILE_BYTES)
        code = code.replace("fallocate(1,", "fallocate(os.open('f', os.O_RDWR | os.O_CREAT),")
        code = code.replace("os.fstat(1)", "os.stat('f')")
        result = basic.run(code)
    assert result.ok, result.stderr
    value, _errno, allocated = result.stdout.split()
    assert value == "-1" and int(allocated) <= MAX_FILE_BYTES, result.stdout


@BOTH_TRAINERS
def test_plain_fallocate_still_works_under_the_cap(sandbox):
    # Mode 0 (glibc's posix_fallocate) makes the file longer: the rlimit applies.
    code = (
        "import os\nfd = os.open('/tmp/f', os.O_RDWR | os.O_CREAT)\n"
        "os.posix_fallocate(fd, 0, 1 << 20)\nprint(os.fstat(fd).st_size)\n"
        "try:\n    os.posix_fallocate(fd, 0, 64 << 20)\nexcept OSError as e:\n    print(e.errno)"
    )
    result = sandbox.run(code)
    assert result.ok and result.stdout.split() == [str(1 << 20), "27"], result  # EFBIG


_EXITS = {
    "huge": "import sys\nsys.exit(2**64)",
    "int_subclass": "class E(int):\n    def __and__(self, other):\n        raise ValueError\n"
    "raise SystemExit(E(3))",
    "code_property": "class X(SystemExit):\n    @property\n    def code(self):\n"
    "        raise ValueError\nraise X('bye')",
}


@pytest.mark.parametrize("name", sorted(_EXITS))
def test_exit_statuses_follow_python_whatever_the_exit_object(sandbox, name):
    code = _EXITS[name]
    python = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    result = sandbox.run(code)
    assert result.returncode == python.returncode != 0, (result, python)
    assert result.error_kind == ErrorKind.ERROR
    text = format_tool_content(result)
    assert not any(word in text for word in INTERNALS), text
