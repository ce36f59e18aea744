"""Paths a user names: one clear error for every way they can be wrong, all-or-nothing output.

A path on the command line or in a config can be missing, a directory, a
FIFO or device that would block or never end, unreadable, not UTF-8, on a
read-only or kernel file system (``/proc``, ``/sys``, ``/dev``), or inside a
file. Each case is one :class:`~retool.errors.RetoolError` naming the path
(and the flag or config key it came from), what is wrong and what to do,
never an ``OSError`` traceback.

Reading: :func:`read_text` reads a small text file (a config) and
:func:`decode_utf8` reports the line and column of the first byte that is not
UTF-8.

Writing is checked *before* the work: :func:`check_output_file` and
:func:`check_output_dir` refuse a destination up front, so a command that
samples for minutes cannot fail at its last line. :func:`staged_output`
makes a command that writes several files all-or-nothing: they are written
into a hidden staging directory inside the target, every destination is
checked, and only then are they renamed into place (renames within one
directory, so a failure between them is practically impossible). Any
failure or interrupt before that removes the staging directory and any
directory the command created, so the previous state is untouched. One file
is replaced through :mod:`retool.atomic` (``write_atomic``, re-exported here).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from retool.atomic import write_atomic as write_atomic  # its callers' old import path
from retool.errors import ConfigError, DataError, RetoolError

PSEUDO_ROOTS = ("/proc", "/sys", "/dev")  # kernel file systems: never a place for output
TEXT_LIMIT = 16 * 2**20  # bytes of a config or other small text file


def as_path(value: object, name: str) -> Path:
    """A path argument of a public function, checked: text or path-like, not empty, no NUL.

    ``name`` says which argument (``"load_examples(path)"``), so a ``None`` or a
    number passed by mistake is a :class:`ConfigError` naming it, not a
    ``TypeError`` from deep inside ``os``.
    """
    if isinstance(value, bytes) or not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{name} must be a path (str or os.PathLike), got {value!r}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{name} must not be empty")
    if "\0" in text:
        raise ConfigError(f"{name} must not contain a NUL character, got {text!r}")
    return Path(text)


def _named(path: Path | str, flag: str | None) -> str:
    return f"{flag} {path}" if flag else str(path)


def reason(exc: OSError) -> str:
    """The operating system's words for ``exc`` ("Permission denied"), without the errno.

    An ``OSError`` raised by library code with a message and no errno keeps its message.
    """
    return exc.strerror or (str(exc).strip() if exc.args else "") or type(exc).__name__


def _space_hint(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "; free disk space (or choose another location)"
    return ""


def write_failure(
    path: str | os.PathLike[str], what: str, exc: BaseException, then: str = ""
) -> str:
    """The one line for a write of ``what`` at ``path`` that failed with ``exc``.

    ``exc`` is an ``OSError`` (``ENOSPC`` on a file already open carries no
    file name, so the caller names it) or a serializer's own error wrapping
    one (safetensors' ``SafetensorError``, torch's ``RuntimeError``).
    """
    if isinstance(exc, OSError):
        why, hint = reason(exc), _space_hint(exc)
    else:
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        hint = "; is the disk full? free disk space (or choose another location)"
    return f"{path}: cannot write the {what} ({why}){hint}{'; ' + then if then else ''}"


@contextlib.contextmanager
def writing(
    path: str | os.PathLike[str],
    what: str,
    *,
    then: str = "",
    error: type[RetoolError] = DataError,
) -> Iterator[None]:
    """Turn an ``OSError`` inside the block into one ``error`` naming ``path`` (see
    :func:`write_failure`); ``then`` says what to do once the cause is fixed."""
    try:
        yield
    except OSError as exc:
        raise error(write_failure(path, what, exc, then)) from None


def decode_utf8(
    data: bytes, where: str, error: type[RetoolError] = DataError, first_line: int = 1
) -> str:
    """``data`` as text; a byte that is not UTF-8 is ``error`` at ``where:line`` with its column.

    ``first_line`` is the line number of ``data``'s first line in its file.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + first_line
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}); "
            "save the file as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")  # a byte-order mark is not content


def read_text(
    path: str | os.PathLike[str],
    *,
    flag: str | None = None,
    what: str = "file",
    error: type[RetoolError] = DataError,
    limit: int = TEXT_LIMIT,
) -> str:
    """The UTF-8 text of a small regular file, or one ``error`` naming ``path``."""
    data = read_bytes(path, flag=flag, what=what, error=error, limit=limit)
    return decode_utf8(data, str(path), error)


def read_bytes(
    path: str | os.PathLike[str],
    *,
    flag: str | None = None,
    what: str = "file",
    error: type[RetoolError] = DataError,
    limit: int = TEXT_LIMIT,
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or one ``error`` naming ``path``.

    A directory, a device or FIFO (which could block or never end) and an
    unreadable file (permission, ``EIO``) are refused by name.
    """
    path = Path(path)
    name = _named(path, flag)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise error(f"{name}: no such file (expected a {what})") from None
    except OSError as exc:
        raise error(f"{name}: cannot read it ({reason(exc)})") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{name}: is a directory; give a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{name}: not a regular file (a device, FIFO or socket); give a {what}")
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{name}: cannot read it ({reason(exc)})") from None
    if len(data) > limit:
        raise error(f"{name}: larger than {limit // 2**20} MiB; is it really a {what}?")
    return data


def resolve(path: Path, name: str, error: type[RetoolError] = ConfigError) -> Path:
    """``path.resolve()``, or one ``error``: a symlink loop raises ``RuntimeError`` (3.11) or
    ``OSError`` (ELOOP) from ``Path.resolve``, neither naming what the user gave."""
    try:
        return path.resolve()
    except RuntimeError:
        raise error(f"{name}: a symlink loop; point it at a real file or directory") from None
    except OSError as exc:
        raise error(f"{name}: cannot resolve it ({reason(exc)})") from None


def _pseudo(path: Path, name: str = "", error: type[RetoolError] = ConfigError) -> str | None:
    resolved = str(resolve(path, name or str(path), error))
    return next((r for r in PSEUDO_ROOTS if resolved == r or resolved.startswith(r + "/")), None)


def _existing_ancestor(path: Path) -> Path:
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _check_writable_dir(directory: Path, name: str, error: type[RetoolError]) -> None:
    if not directory.is_dir():
        raise error(f"{name}: {directory} is a file, not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise error(
            f"{name}: cannot write in {directory} (permission denied or a read-only file "
            "system); choose a writable location"
        )


def check_output_file(
    path: str | os.PathLike[str], *, flag: str | None = None, error: type[RetoolError] = ConfigError
) -> Path:
    """Refuse a file destination that cannot be written, before any work starts.

    The parent directory must exist (creating directories is the user's
    decision for a single file) and be writable; the path must not be a
    directory, a device or under a kernel file system.
    """
    path = Path(path)
    name = _named(path, flag)
    root = _pseudo(path, name, error)
    if root:
        raise error(f"{name}: under {root}, a kernel file system; write to a real file")
    if path.is_dir():
        raise error(f"{name}: is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise error(f"{name}: not a regular file; give a file name")
    parent = path.absolute().parent
    if not parent.exists():
        ancestor = _existing_ancestor(parent)
        if not ancestor.is_dir():
            raise error(f"{name}: {ancestor} is a file, not a directory")
        raise error(f"{name}: the directory {path.parent} does not exist; create it first")
    _check_writable_dir(parent, name, error)
    return path


def check_output_dir(
    path: str | os.PathLike[str], *, flag: str | None = None, error: type[RetoolError] = ConfigError
) -> Path:
    """Refuse a directory destination that cannot be created or written, before any work."""
    path = Path(path)
    name = _named(path, flag)
    root = _pseudo(path, name, error)
    if root:
        raise error(f"{name}: under {root}, a kernel file system; write to a real directory")
    if path.exists() and not path.is_dir():
        raise error(f"{name}: is a file, not a directory; give a directory")
    _check_writable_dir(_existing_ancestor(path), name, error)
    return path


def _make_dirs(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents; the ones created, deepest first."""
    missing = []
    current = path.absolute()
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir()
    return missing


def _remove_dirs(created: Iterable[Path]) -> None:
    for directory in created:  # deepest first; only if still empty
        with contextlib.suppress(OSError):
            directory.rmdir()


@dataclass
class StagedOutput:
    """Where a command writes the files that :func:`staged_output` moves into ``target``."""

    target: Path  # the output directory
    staging: Path  # write every file here (same file system: renames are atomic)
    remove: list[str] = field(default_factory=list)  # files of target to delete on commit
    replaced: list[str] = field(default_factory=list)  # files that existed (after commit)
    written: list[str] = field(default_factory=list)  # every file moved in (after commit)

    def path(self, name: str) -> Path:
        return self.staging / name


def _check_destinations(target: Path, names: Iterable[str], name: str, error: type) -> None:
    for file in names:
        dest = target / file
        if dest.is_dir() and not dest.is_symlink():
            raise error(
                f"{name}: {dest} is a directory; move it away or choose another output directory"
            )


@contextlib.contextmanager
def staged_output(
    target: str | os.PathLike[str],
    *,
    flag: str | None = None,
    names: Iterable[str] = (),
    remove: Iterable[str] = (),
    error: type[RetoolError] = DataError,
) -> Iterator[StagedOutput]:
    """Write several files into ``target`` all at once, or not at all.

    ``names`` are the files the caller will write, checked up front (a
    destination that is a directory is refused before any work); every file
    actually written is checked again before the first rename. ``remove``
    lists files to delete on success (a plot an older report had and this
    one has not; the caller may add to ``StagedOutput.remove`` as it goes).
    An ``OSError`` on the way is one ``error`` naming the target; any
    exception or interrupt leaves ``target`` as it was.
    """
    target = Path(target)
    name = _named(target, flag)
    check_output_dir(target, flag=flag, error=error)
    _check_destinations(target, names, name, error)
    created: list[Path] = []
    staging: Path | None = None
    try:
        created = _make_dirs(target)
        staging = Path(tempfile.mkdtemp(prefix=".retool-staging-", dir=target))
        out = StagedOutput(target, staging, remove=list(remove))
        yield out
        written = sorted(os.listdir(staging))
        _check_destinations(target, written, name, error)
        out.replaced = [file for file in written if (target / file).exists()]
        for file in written:
            os.replace(staging / file, target / file)
        out.written = written
        for file in out.remove:
            if file not in written:
                (target / file).unlink(missing_ok=True)
        staging.rmdir()
    except OSError as exc:
        _abandon(staging, created)
        about = Path(exc.filename).absolute() if exc.filename else target.absolute()
        if not about.is_relative_to(target.absolute()):
            raise  # not about the output: the caller's error, unchanged
        raise error(f"{name}: cannot write the output ({reason(exc)})") from None
    except BaseException:
        _abandon(staging, created)
        raise


def _abandon(staging: Path | None, created: list[Path]) -> None:
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    _remove_dirs(created)
