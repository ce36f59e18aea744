"""Shared helpers for the adversarial sandbox tests."""

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from retool.sandbox.runtime_copy import RUNTIME_MODULES

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
RETOOL = os.path.join(os.path.dirname(sys.executable), "retool")  # the CLI of this venv
# What shows the sandbox's own code in an observation: its package, every file of the
# server's runtime copy, its set-up failure.
INTERNALS = (
    "retool_sandbox_rt",
    "sandbox setup failed",
    *(f"{name}.py" for name in RUNTIME_MODULES),
)


def procs_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def procs_in(directory: str) -> list[int]:
    """Pids whose working directory is ``directory`` or below it (a server's is its --dir,
    which its command line no longer shows)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == directory or cwd.startswith(directory.rstrip("/") + "/"):
                found.append(int(entry))
    return found


def wait_for(predicate, within: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds (liveness, not a timing assert)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def gone(marker: str, within: float = 5.0) -> bool:
    return wait_for(lambda: not procs_with(marker), within)


def appeared(marker: str, within: float = 10.0) -> bool:
    return wait_for(lambda: bool(procs_with(marker)), within)


def kill_all(marker: str) -> None:
    for pid in procs_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def daemon_code(marker: str, then: str = "") -> str:
    """Snippet: a setsid double-forked `sleep <marker>` daemon, then ``then``."""
    return (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n" + then
    )


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def handler_of(call_pid: int, server_pid: int) -> int:
    """The handler serving the call that ``call_pid`` belongs to."""
    pid = call_pid
    while parent(pid) != server_pid:
        pid = parent(pid)
        assert pid > 1, "not a process of this server"
    zygote = pid
    zygote_ns = os.readlink(f"/proc/{zygote}/ns/mnt")
    for child in children(zygote):
        if os.readlink(f"/proc/{child}/ns/mnt") == zygote_ns:
            return child
    raise AssertionError("no handler found")


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found
