"""Sandbox uids of a root server: a block per instance, a uid per call in flight.

A root server claims a block of ``UID_BLOCK`` uids for its lifetime (an
flock on a lock file per block), and its zygotes give each call in flight
one of them (``zygote.Zygote.uid_for``): no two instances and no two calls
running at once share a uid, so by uid alone no call can signal, trace or
read another. Without a killable cgroup, a call's processes (daemons
included) are found and killed by their uid (``kill_uid``), and the reaper
kills the whole block (``kill_uids``).
"""

from __future__ import annotations

import fcntl
import os
import signal

UID_BASE = 1_500_000_000  # sandbox uids (root server): one block of UID_BLOCK per instance
UID_BLOCK = 1 << 16
UID_BLOCKS = 4096
UIDS_PER_HANDLER = 8  # > calls a handler has prepared or running at once (3)


def claim_uid_block(workdir: str) -> tuple[int, int | None]:
    """Reserve a block of uids for this instance (flock held for its lifetime)."""
    lockdir = "/run/retool-sandbox"
    try:
        os.makedirs(lockdir, mode=0o700, exist_ok=True)
    except OSError:
        lockdir = os.path.dirname(workdir)
    for block in range(UID_BLOCKS):
        fd = os.open(os.path.join(lockdir, f"uids-{block}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return UID_BASE + block * UID_BLOCK, fd
    raise RuntimeError("no free sandbox uid block")


def kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (basic level without cgroups)."""
    kill_uids(uid, uid + 1)


def kill_uids(low: int, high: int) -> None:
    """SIGKILL every process owned by a uid in ``[low, high)``."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if low <= os.stat(f"/proc/{entry}").st_uid < high:
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
