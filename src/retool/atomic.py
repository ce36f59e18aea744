"""Atomic file writes: the project's one way to replace a file.

A reader (a resumed run, a second process, the user) sees the old file or the
whole new one, never a prefix, and a failure on the way (a full disk, an
exception in the writer, Ctrl-C) leaves the old file as it was and no partial
temporary file behind.

:func:`atomic_output` is the implementation: a handle on a temporary sibling
of ``path`` (the same directory, so the final ``os.replace`` is one atomic
rename on one file system) that is flushed, fsynced and renamed over ``path``
when the block ends, and removed when it raises. :func:`write_atomic` is the
same for bytes already in memory.

Why these choices:

* The temporary's name is ``.NAME.tmp-PID-RANDOM``, created with ``O_EXCL``:
  two threads or processes writing the same path at once each get their own
  temporary (naming it by pid alone made two threads share, and tear, one), and
  both renames succeed, the last one winning whole. The leading dot and
  ``.tmp-`` keep it out of globs and say what it is if a crash leaves it.
* The new file's permissions are those of a plain ``open`` (``0o666`` less the
  umask), not ``mkstemp``'s ``0o600``, so replacing a file through this helper
  does not change who can read it; ``mode=`` sets exact bits regardless of the
  umask, for a file another user must read.
* Ground floor, standard library only: every floor may use it.

The one deliberate copy is ``retool.sandbox.relocate._write_atomic``: that
module runs inside the sandbox server's runtime copy, which imports nothing of
ours outside the copied package (see ``retool.sandbox.runtime_copy``).

See also, for more than one file: ``retool.data.files.staged_output`` (several
files of one directory, all or none), ``retool.backends.local.checkpoints
.atomic_directory`` (a checkpoint directory), ``retool.backends.local.models
.cached_dir`` (a cache entry built once) and ``retool.backends.remote
.checkpoints.write_pointer``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO, overload

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_NAME_TRIES = 100  # random 32-bit suffixes: a second try is already unheard of


def _create(path: Path, mode: int | None) -> tuple[Path, int]:
    """A new temporary sibling of ``path`` and its descriptor, with ``mode`` exactly
    or else the permissions a plain ``open`` would give."""
    for _ in range(_NAME_TRIES):
        # The name cut short so a long one (up to NAME_MAX, 255) still has a temporary.
        tmp = path.with_name(f".{path.name[:200]}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, _FLAGS, 0o666)
        except FileExistsError:
            continue
        if mode is not None:
            try:
                os.fchmod(fd, mode)  # exact bits: the umask applied at creation is undone
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return tmp, fd
    raise FileExistsError(errno.EEXIST, "no unused temporary file name beside it", str(path))


@overload
def atomic_output(
    path: str | os.PathLike[str], *, encoding: None = None, mode: int | None = None
) -> AbstractContextManager[BinaryIO]: ...


@overload
def atomic_output(
    path: str | os.PathLike[str], *, encoding: str, mode: int | None = None
) -> AbstractContextManager[TextIO]: ...


def atomic_output(
    path: str | os.PathLike[str], *, encoding: str | None = None, mode: int | None = None
) -> AbstractContextManager[IO[Any]]:
    """A handle whose contents replace ``path`` when the block ends without error.

    Binary, or text in ``encoding`` when one is given. ``mode`` sets the new
    file's permission bits exactly (default: a plain ``open``'s). On any
    exception, interrupts included, ``path`` is left as it was, the temporary
    is removed and the exception propagates unchanged. The directory must
    exist; turning an ``OSError`` into a user's error is the caller's job (it
    knows what the file is).
    """
    return _atomic_output(Path(path), encoding, mode)


@contextlib.contextmanager
def _atomic_output(path: Path, encoding: str | None, mode: int | None) -> Iterator[IO[Any]]:
    tmp, fd = _create(path, mode)
    try:
        # On failure (an unknown encoding) fdopen has closed the descriptor itself.
        handle = os.fdopen(fd, "wb" if encoding is None else "w", encoding=encoding)
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` through :func:`atomic_output` (same guarantees)."""
    with atomic_output(path, mode=mode) as handle:
        handle.write(data)
