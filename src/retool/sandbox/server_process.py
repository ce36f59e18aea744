"""The fork server as a process, from the trainer's side: its start and its end.

``LocalSandbox`` (``local.py``) decides when; this module says how.

- **Start** (:func:`start_server`): ``python -I -S -B -c SERVER_BOOT`` from the
  runtime copy (``runtime_copy.py``), with the fixed environment of
  ``environment.py`` (forked memory and ``/proc/self/environ`` would otherwise
  carry the trainer's secrets), its own directory as cwd, no descriptor of
  ours but the write end of the "gone" pipe, and a session of its own. Its
  stdin is the lifeline: when the trainer's end closes (``close()``, or the
  trainer dies however it dies), the server's reaper kills every process of
  every call.
- **End** (:func:`end_server`, :func:`wait_for_eof`, :func:`kill_cgroup`):
  close the lifeline and kill the server; the reaper does the killing of the
  calls and removes the directory. The "gone" pipe is held only by the server
  and then its reaper, so its EOF says both have exited. Where the instance
  has a v2 cgroup, the trainer empties it too (the server keeps only neutral
  paths; the trainer recorded the real one at the start).
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence

from retool.sandbox import relocate
from retool.sandbox.boot import SERVER_BOOT
from retool.sandbox.environment import sandbox_env


def start_server(
    directory: str,
    boot_path: str,
    gone_w: int,
    *,
    preload: Sequence[str],
    isolation: str,
    memory_mb: int,
    disabled: Sequence[str],
) -> subprocess.Popen[bytes]:
    """Start the fork server in ``directory`` from the runtime copy at ``boot_path``.

    ``gone_w``: the write end of the "gone" pipe, the one descriptor it inherits.
    """
    return subprocess.Popen(
        [
            sys.executable,
            "-I",  # no PYTHON* variables, no cwd or script dir on sys.path
            "-S",  # no site: no .pth file (an editable install) adds our checkout
            "-B",  # no .pyc of the runtime copy: it would record the work directory
            "-c",
            SERVER_BOOT,
            boot_path,
            "--dir",
            directory,
            "--preload",
            ",".join(preload),
            "--isolation",
            isolation,
            "--memory-mb",
            str(memory_mb),
            "--boot-path",
            boot_path,
            "--disable",
            ",".join(disabled),
            "--layer-cache",
            relocate.cache_root(),  # the server's environment is empty: ours decides
            "--gone-fd",
            str(gone_w),
        ],
        pass_fds=(gone_w,),
        stdin=subprocess.PIPE,  # the lifeline: its end kills every call (reaper)
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=directory,
        env=sandbox_env(),
        close_fds=True,
        start_new_session=True,
    )


def end_server(server: subprocess.Popen[bytes]) -> None:
    """Close ``server``'s lifeline (its reaper wakes up and kills), kill it, reap it."""
    if server.stdin is not None:
        server.stdin.close()  # the lifeline: the reaper wakes up and kills
    server.kill()
    server.wait()
    if server.stdout is not None:
        server.stdout.close()


def wait_for_eof(fd: int, within: float) -> None:
    """Wait until every writer of the pipe ``fd`` has exited (at most ``within`` s)."""
    deadline = time.monotonic() + within
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while (left := deadline - time.monotonic()) > 0:
        if poller.poll(int(left * 1000) + 1) and not os.read(fd, 64):
            return


def kill_cgroup(directory: str, within: float) -> None:
    """Kill every process left in a v2 cgroup and wait until it is empty."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(OSError), open(os.path.join(directory, "cgroup.kill"), "w") as f:
            f.write("1")
        try:
            with open(os.path.join(directory, "cgroup.events")) as handle:
                if "populated 0" in handle.read():
                    return
        except OSError:
            return  # removed already: empty
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
