"""What one execution returns, and how it is shown to the model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class ErrorKind(StrEnum):
    """Why a call did not succeed (``None`` on ``ExecResult`` when it did)."""

    ERROR = "error"
    """The code raised or exited non-zero, or was refused unrun (larger than
    ``MAX_CODE_BYTES``, or not UTF-8 text)."""
    TIMEOUT = "timeout"
    """The wall-clock limit was hit; the whole process tree was killed."""
    MEMORY = "memory"
    """The memory cap was hit (MemoryError or killed allocating)."""
    OUTPUT = "output"
    """The output file limit was hit (the process was stopped writing)."""
    CRASH = "crash"
    """The interpreter died from a signal (segfault, abort...)."""
    SANDBOX = "sandbox"
    """The sandbox itself failed; the code may not have run."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed execution."""

    ok: bool  # exited 0 within the limits
    stdout: str  # tail of what it printed, sanitized, at most the output cap
    stderr: str  # tail of its stderr (tracebacks), sanitized
    returncode: int | None  # exit status; negative = killed by that signal; None if unknown
    timed_out: bool  # killed at the wall-clock limit
    latency_s: float  # from sending the code to having the result, seconds
    truncated: bool  # stdout or stderr was cut to its tail
    error_kind: ErrorKind | None = None  # why it failed, None when ok
    isolation: str = ""  # the level this call ran at ("full" or "basic")
    degraded: bool = False  # True when that is below full isolation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_tool_content(result: ExecResult, timeout: float | None = None) -> str:
    """The observation text for the model.

    stdout on success (empty string when nothing was printed), the traceback on
    an error, and a plain sentence for timeouts, memory and crashes.
    """
    note = "[output truncated: showing the end]\n" if result.truncated else ""
    if result.ok:
        return note + result.stdout
    if result.error_kind == ErrorKind.TIMEOUT:
        limit = f" of {timeout:g} seconds" if timeout else ""
        partial = f"\nOutput before the timeout:\n{result.stdout}" if result.stdout.strip() else ""
        return f"TimeoutError: execution exceeded the time limit{limit} and was stopped.{partial}"
    if result.error_kind == ErrorKind.MEMORY:
        return "MemoryError: execution exceeded the memory limit and was stopped."
    if result.error_kind == ErrorKind.OUTPUT:
        return note + result.stdout + "\nError: output exceeded the size limit."
    if result.error_kind == ErrorKind.CRASH:
        return (
            note + result.stdout + f"\nError: the interpreter crashed "
            f"(signal {-(result.returncode or 0)})."
        ).lstrip()
    if result.error_kind == ErrorKind.SANDBOX:
        return f"Error: the sandbox could not run this code ({result.stderr.strip()})."
    text = result.stderr.strip() or f"Error: exit status {result.returncode}"
    return (note + (result.stdout + "\n" if result.stdout.strip() else "") + text).strip()
