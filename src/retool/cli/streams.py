"""The terminal's own failures: output that cannot be written or encoded, and unnamed OSErrors.

Three ways a command that did its work could still end in a traceback:

* a path holding bytes that are not UTF-8 (Python keeps them as surrogate
  escapes) printed on a strict UTF-8 terminal raises ``UnicodeEncodeError``
  after the work succeeded: :func:`harden_streams` makes stdout and stderr
  write such characters as ``\\udcXX`` escapes instead;
* stdout that cannot be written (``> /dev/full``, a full disk behind a
  redirect): the ``OSError`` carries no file name, and Python's own flush at
  exit would print "Exception ignored" after our line; :func:`unnamed_failure`
  names standard output and :func:`silence_stdout` drops what is left;
* any other ``OSError`` without a file name that is a full disk or an I/O
  error: one line saying so (the writer that knows the file should have named
  it; this is the last resort).

Anything else keeps its traceback: it is a bug.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from typing import Any

_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


class _Watched(io.FileIO):
    """Standard output's file, remembering that a write failed (the error names no file)."""

    failed = False

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except OSError:
            self.failed = True
            raise


def harden_streams() -> None:
    """stdout and stderr escape what they cannot encode instead of raising; a failed write to
    the process's own stdout is remembered (:func:`stdout_broken`)."""
    out = sys.stdout
    if out is sys.__stdout__ and out is not None and not _watched(out):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            out.flush()
            raw = _Watched(out.fileno(), "w", closefd=False)
            sys.stdout = io.TextIOWrapper(
                io.BufferedWriter(raw),
                encoding=out.encoding,
                errors="backslashreplace",
                line_buffering=out.line_buffering,
                write_through=getattr(out, "write_through", False),
            )
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def _watched(stream: Any) -> _Watched | None:
    raw = getattr(getattr(stream, "buffer", None), "raw", None)
    return raw if isinstance(raw, _Watched) else None


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def stdout_broken() -> bool:
    """Whether a write to standard output failed, or what is buffered cannot be flushed."""
    watched = _watched(sys.stdout)
    if watched is not None and watched.failed:
        return True
    try:
        sys.stdout.flush()
    except OSError:
        return True
    except ValueError:  # closed
        return False
    return False


def unnamed_failure(exc: OSError) -> str | None:
    """The one line for an ``OSError`` without a file name, or ``None`` if it is a bug."""
    if exc.errno not in _DISK:
        return None
    why = exc.strerror or type(exc).__name__
    if stdout_broken():
        silence_stdout()
        return f"cannot write to standard output ({why}); redirect it to a file with free space"
    return (
        f"a write failed ({why}); free disk space, then rerun the command "
        "(train and sft continue with --resume, eval with the same --output)"
    )


def flush_stdout() -> str | None:
    """Flush stdout at the end of a successful command; the error line if it cannot be."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        silence_stdout()
        return f"cannot write to standard output ({exc.strerror or exc}); redirect it elsewhere"
    except ValueError:
        return None
    return None


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def one_line(text: str) -> str:
    """``text`` with control characters escaped: a path holding a newline or an escape
    sequence cannot split an error line in two or repaint the terminal."""
    return str(text).translate(_CONTROL)
