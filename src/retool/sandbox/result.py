"""What one execution returns, and how it is shown to the model."""

from __future__ import annotations

import signal
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
    """The interpreter died from a fault signal (segfault, abort, bus error,
    illegal instruction...), or its init died before reporting."""
    SANDBOX = "sandbox"
    """The sandbox itself failed; ``ExecResult.delivered`` says whether the code
    may have run."""


# Signals of a faulting program: a crash. Any other signal the supervisor did not
# send (SIGKILL, SIGXCPU, SIGXFSZ, SIGTERM...) is the code's own error.
CRASH_SIGNALS = frozenset({4, 5, 6, 7, 8, 11, 31})  # ILL, TRAP, ABRT, BUS, FPE, SEGV, SYS


def signal_kind(returncode: int) -> ErrorKind:
    """The kind of a non-zero exit status no supervisor fact explains.

    Never ``memory``, ``timeout`` or ``output``: those come only from the
    supervisor's timer, the cgroup's OOM counter and the size of what was
    written, since a call can send itself any signal or exit with any status.
    """
    if returncode < 0 and -returncode in CRASH_SIGNALS:
        return ErrorKind.CRASH
    return ErrorKind.ERROR


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
    # False only when the supervisor itself saw that the code never ran (not
    # delivered, or the call's set-up failed first): only such a SANDBOX result may
    # exclude a trajectory (see retool.rollout.scheduler).
    delivered: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sandbox_failure(
    why: str, latency: float, *, isolation: str, delivered: bool, degraded: bool = False
) -> ExecResult:
    """The result of a call the sandbox itself failed (``ErrorKind.SANDBOX``).

    ``why`` is the one sentence the model reads (``format_tool_content``);
    ``delivered`` says whether the code may have run (only the client's own
    evidence that it did not lets the rollout exclude the trajectory).
    """
    return ExecResult(
        False,
        "",
        why,
        None,
        False,
        latency,
        False,
        ErrorKind.SANDBOX,
        isolation=isolation,
        degraded=degraded,
        delivered=delivered,
    )


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
    code = result.returncode
    if code is not None and code < 0:
        killed = f"Error: the process was killed by {signal_name(-code)} (signal {-code})."
        text = (result.stderr.strip() + "\n" + killed).strip()
    else:
        text = result.stderr.strip() or f"Error: exit status {code}"
    return (note + (result.stdout + "\n" if result.stdout.strip() else "") + text).strip()
