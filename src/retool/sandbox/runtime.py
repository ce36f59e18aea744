"""The sandbox runtime: how a call's code runs, on every backend.

One module, two users. The local fork server (``server.py``) imports it; the
SandboxFusion driver (``fusion_program.py``) ships this file's source to the service
and runs it there in a plain interpreter (as it ships ``autoprint.py``). So the
code sees the same thing everywhere: compiled as ``<code>`` after the AST
auto-print, run as ``__main__``, a failure shown with only the code's frames
and its libraries' (never this runtime's), ``SystemExit`` mapped to the exit
status as Python does.

Why the constraints below: the shipped copy runs on the service's interpreter,
which may be older than ours, so this file is standard library only and
Python 3.8 syntax (annotations are never evaluated). Run there, it is
compiled as ``<retool-runtime>`` and executed in a namespace of its own named
``retool_runtime`` (not the program's ``__main__``, which the code can import
and change), and the names ``_AUTOPRINT``, ``_CODE`` and ``_ENV`` are given in
that namespace; the guard at the bottom then runs the code.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the shipped copy imports nothing more
    import ast

# Bound at import: the call's code may replace these in ``os`` and ``traceback``,
# and the epilogue of run_code (after the code) must still work.
_write, _exit = os.write, os._exit
_TracebackException = traceback.TracebackException
_format_exception_only = traceback.format_exception_only
# Our frames: this file's directory when imported (the server's runtime copy,
# autoprint.py included), the names the shipped copy is compiled under otherwise.
_OWN_FILES = ("<retool-runtime>", "<retool-autoprint>")
_RUNTIME_DIR = (
    os.path.dirname(os.path.abspath(globals()["__file__"])) + os.sep
    if "__file__" in globals()
    else None
)


def _ours(filename: str) -> bool:
    """A frame of the sandbox runtime, or of the import machinery (hidden by Python too)."""
    return (
        filename in _OWN_FILES
        or (_RUNTIME_DIR is not None and filename.startswith(_RUNTIME_DIR))
        or filename.startswith("<frozen importlib._")
    )


def _trim(te: Any, seen: set) -> None:
    """Drop our frames from ``te``, its causes, contexts and group members (in place)."""
    if id(te) in seen:
        return
    seen.add(id(te))
    te.stack[:] = [frame for frame in te.stack if not _ours(frame.filename)]
    for other in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        if other is not None:
            _trim(other, seen)


def describe(exc: BaseException) -> str:
    """The code's traceback with only the code's frames (and its libraries')."""
    try:
        te = _TracebackException.from_exception(exc)
        _trim(te, set())
        return "".join(te.format())
    except BaseException:  # the code broke traceback/linecache: the last line only
        try:
            return "".join(_format_exception_only(type(exc), exc))
        except BaseException:
            return "Error: the code raised an exception that cannot be shown\n"


def write_text(fd: int, text: str) -> None:
    """Write all of ``text`` to ``fd`` (UTF-8); silent if the code closed ``fd``."""
    data = memoryview(text.encode("utf-8", "backslashreplace"))
    with contextlib.suppress(OSError):
        while data:
            data = data[_write(fd, data) :]


def exit_now(status: int) -> None:
    """``os._exit`` as bound before the code ran."""
    _exit(status)


def run_code(code: str, add_autoprint: Callable[[str], ast.Module | str]) -> int:
    """Run ``code`` as ``__main__``; its exit status. Never raises.

    What the call sees of a failure is its own: a syntax error, or a
    traceback of its frames and its libraries' frames, never this runtime's.
    The epilogue uses only objects bound before the code ran, so code that
    closes or replaces ``sys.stdout``/``sys.stderr``, empties ``sys.modules``,
    or replaces builtins and ``os`` functions cannot turn it into a traceback
    of ours.
    """
    out = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    err = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdout, sys.stderr = out, err
    sys.argv = ["<code>"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    status, message = 0, ""
    try:
        program = compile(add_autoprint(code), "<code>", "exec")
    except BaseException as exc:  # SyntaxError, NUL bytes, nesting too deep, surrogates
        write_text(2, describe(exc))
        return 1
    try:
        exec(program, namespace)
    except SystemExit as exc:
        status, message = exit_status(exc)
    except BaseException as exc:  # KeyboardInterrupt and other BaseExceptions too
        status, message = 1, describe(exc)
    streams = [sys.stdout, sys.stderr, out, err]  # the code's replacements first
    for stream in [s for i, s in enumerate(streams) if all(s is not t for t in streams[:i])]:
        with contextlib.suppress(BaseException):
            stream.flush()
    if message:
        write_text(2, message)
    return status


def exit_status(exc: SystemExit) -> tuple:
    """``sys.exit(x)`` as Python reports it: int -> status; anything else -> 1 and str(x).

    By Python's rules, with no method of the code's called on an int: a ``code``
    attribute that cannot be read leaves the exception itself as the value, an
    ``int`` subclass counts by its value (never its ``__and__`` & co., which the
    caller's masking would otherwise run after the code, outside its frames), and
    a value a C ``long`` cannot hold is -1 (status 255), never its low byte.
    """
    code: Any
    try:
        code = exc.code
    except BaseException:
        code = exc
    if code is None:
        return 0, ""
    if issubclass(type(code), int):  # type(), not isinstance(): __class__ can lie
        value: int = int.__int__(code)
        return (value if -(1 << 63) <= value < 1 << 63 else -1), ""
    try:
        return 1, f"{code}\n"
    except BaseException:
        return 1, "<exit message str() failed>\n"


def _remote_main(autoprint_source: str, code: str, env: dict) -> None:
    """The shipped copy's entry: the local calls' environment, then the code; exits."""
    os.environ.update(env)  # before the code imports numpy & co., which read them once
    autoprint: dict[str, Any] = {"__name__": "retool_autoprint"}
    exec(compile(autoprint_source, "<retool-autoprint>", "exec"), autoprint)
    _exit(run_code(code, autoprint["add_autoprint"]) & 0xFF)


if __name__ == "retool_runtime":  # shipped: run by fusion.remote_program's driver
    _remote_main(globals()["_AUTOPRINT"], globals()["_CODE"], globals()["_ENV"])
