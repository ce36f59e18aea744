"""One writer at a time: an exclusive lock on a run directory or an output file.

Two ``retool train`` on one ``--run-dir`` (or two ``retool eval`` on one
``--output``) would both append and leave steps ``[1, 1, 2, 2]``; the second
one must refuse at once instead. The lock is ``flock`` on an open file
descriptor of a lock file (``RUN_DIR/lock``, ``FILE.lock`` next to an output):
the kernel releases it when the process ends in any way, ``kill -9`` and a
lost machine's reboot included, so a lock can never outlive its holder on
this host. The file's content (pid, host, start time) is only there for the
messages; it is written after the lock is taken and the file is removed when
the lock is released.

What can still be left behind, each said in one line with what to do:

* a lock *file* whose holder died without removing it (killed): the lock is
  free, so the next run takes it over and says so;
* a lock *held* by a pid that no longer runs on this host (a process it
  started inherited the descriptor) or by a process on another host sharing
  the file system: refused, naming the holder and the file to delete when
  nothing runs there any more.

Within one process the lock is re-entrant (a library caller may open the same
run twice in a row, e.g. after a failure that left the first open): each
path's lock is held once per process and released by :func:`release`, or at
exit.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from retool.errors import RetoolError

RUN_LOCK_NAME = "lock"


class LockedError(RetoolError):
    """Another process holds the lock."""


@dataclass(frozen=True)
class Holder:
    """What a lock file says about who took it."""

    pid: int
    host: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} (since {when})"


_HELD: dict[str, int] = {}  # lock file (absolute) -> open descriptor holding the flock


def _key(path: Path) -> str:
    return os.path.abspath(path)


def _read_holder(fd: int) -> Holder | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        record = json.loads(data.decode("utf-8"))
        return Holder(int(record["pid"]), str(record["host"]), float(record["since"]))
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire(lock_file: Path, what: str) -> str | None:
    """Take the lock or raise :class:`LockedError`; returns a note on a stale lock taken over.

    ``what`` names the locked thing in messages ("run directory runs/x").
    """
    key = _key(lock_file)
    if key in _HELD:
        return None
    while True:
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise RetoolError(
                f"{what}: cannot create the lock file {lock_file}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            break
        # The holder may have removed the file between our open and our flock:
        # then this lock is on a file nobody else will open; open the path again.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_file))
        except FileNotFoundError:
            same = False
        if same:
            return _take(fd, key, what)
        os.close(fd)
    _refuse(fd, lock_file, what)


def _refuse(fd: int, lock_file: Path, what: str) -> NoReturn:
    holder = _read_holder(fd)
    os.close(fd)
    host = socket.gethostname()
    if holder is None:
        raise LockedError(
            f"{what} is in use by another retool process (the lock {lock_file} is held); "
            "wait for it to finish or stop it"
        )
    if holder.host == host and not _alive(holder.pid):
        raise LockedError(
            f"{what} is locked by {holder.describe()}, which no longer runs, but a process "
            f"it started still holds {lock_file} (find it with `fuser {lock_file}`); stop "
            "that process, then retry"
        )
    where = "" if holder.host == host else f"; if nothing runs there any more, delete {lock_file}"
    raise LockedError(
        f"{what} is in use by {holder.describe()}; wait for it to finish or stop it{where}"
    )


def _take(fd: int, key: str, what: str) -> str | None:
    previous = _read_holder(fd)
    note = None
    if previous is not None and previous.pid != os.getpid():
        note = (
            f"took over the lock of {what} left by {previous.describe()}, which ended "
            "without releasing it (killed?)"
        )
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:
        pass  # the lock holds without its description; messages will be vaguer
    _HELD[key] = fd
    return note


def release(lock_file: Path) -> None:
    """Remove the lock file and release the lock (no-op if this process does not hold it)."""
    fd = _HELD.pop(_key(lock_file), None)
    if fd is None:
        return
    # Unlink first, while still holding the lock: a process that opens the path
    # after this gets a new file and a new lock.
    with contextlib.suppress(OSError):
        os.unlink(lock_file)
    os.close(fd)


def holds(lock_file: Path) -> bool:
    return _key(lock_file) in _HELD


def check_free(lock_file: Path, what: str) -> None:
    """Refuse at once when another process holds the lock (without taking it)."""
    if not lock_file.exists() or holds(lock_file):
        return
    note = acquire(lock_file, what)
    release(lock_file)
    if note:
        print(f"retool: note: {note}", file=sys.stderr, flush=True)


def probe(lock_file: Path, what: str) -> str | None:
    """The message :func:`acquire` would refuse with now, or None; changes nothing on disk.

    For ``retool doctor``, which must not take over, rewrite or remove a lock: the
    file is opened read-only (never created) and a shared ``flock`` is tried and
    dropped at once, which fails exactly while a holder has the exclusive one. A
    lock file left by a holder that ended is free (None): the run takes it over.
    """
    if holds(lock_file):
        return None
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{what}: cannot open the lock file {lock_file}: {exc.strerror}"
    try:
        if os.path.isdir(lock_file):  # acquire's O_RDWR open would fail on it
            os.close(fd)
            return f"{what}: cannot create the lock file {lock_file}: it is a directory"
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            _refuse(fd, lock_file, what)  # closes fd
        except LockedError as exc:
            return str(exc)
    except OSError as exc:  # a file system without flock: acquire would fail there too
        os.close(fd)
        return f"{what}: cannot lock {lock_file}: {exc.strerror}"
    os.close(fd)  # drops the shared lock
    return None


@contextlib.contextmanager
def locked(lock_file: Path, what: str) -> Iterator[str | None]:
    note = acquire(lock_file, what)
    try:
        yield note
    finally:
        release(lock_file)


def output_lock_file(output: Path) -> Path:
    return output.with_name(output.name + ".lock")


def lock_output(output: Path, flag: str) -> None:
    """Hold ``FILE.lock`` for the rest of the process (released at exit, or by the kernel)."""
    lock_file = output_lock_file(output)
    note = acquire(lock_file, f"{flag} {output}")
    if note:
        print(f"retool: note: {note}", file=sys.stderr, flush=True)
    atexit.register(release, lock_file)


@atexit.register
def _release_all() -> None:
    for key in list(_HELD):
        release(Path(key))
