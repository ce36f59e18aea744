"""The sandbox's input limits, and the checks of its public arguments.

One place for each bound, shared by every client (``LocalSandbox``, the
SandboxFusion client, ``retool sandbox``), so a snippet or a setting that one
accepts the others accept too:

- ``MAX_CODE_BYTES``: the largest snippet, in bytes of UTF-8. Real tool calls
  are a few kilobytes; a larger one is refused without being sent, so a
  runaway caller (or a gigabyte on stdin) costs nothing.
- Code must be a ``str`` that encodes as UTF-8 (no lone surrogates, which a
  ``surrogateescape`` read of Latin-1 bytes produces). Code that is too large
  or not text is *refused*, not raised: the result is an ``ErrorKind.ERROR``
  whose message the model reads like a ``SyntaxError``, because in a rollout
  it is the model's code, not an infrastructure failure to retry.
- Numbers (timeouts, memory, workers, output caps) are finite and within
  these ranges, checked once at construction with the project's one numeric
  check (:func:`retool.checks.check_number`): ``nan`` passes a ``<= 0`` test,
  and ``inf`` or ``1e12`` seconds would only fail at the first call
  (``socket.settimeout``, a ``time_t`` overflow in ``select``). The ranges
  are defined in :mod:`retool.limits`, where the ``[sandbox]`` config section
  reads them too, and re-exported here under the sandbox's names.
"""

from __future__ import annotations

import re

from retool.errors import ConfigError
from retool.limits import SANDBOX_MAX_OUTPUT_BYTES as MAX_OUTPUT_BYTES
from retool.limits import SANDBOX_MAX_REQUEST_RETRIES as MAX_REQUEST_RETRIES
from retool.limits import SANDBOX_MAX_TIMEOUT_S as MAX_TIMEOUT_S
from retool.limits import SANDBOX_MAX_WORKERS as MAX_WORKERS
from retool.limits import SANDBOX_MEMORY_MB_RANGE as MEMORY_MB_RANGE
from retool.sandbox.result import ErrorKind, ExecResult

__all__ = [
    "MAX_CODE_BYTES",
    "MAX_OUTPUT_BYTES",
    "MAX_REQUEST_RETRIES",
    "MAX_TIMEOUT_S",
    "MAX_WORKERS",
    "MEMORY_MB_RANGE",
    "check_module_names",
    "code_problem",
    "screen_code",
]

MAX_CODE_BYTES = 1 << 20  # largest snippet, bytes of UTF-8; larger code is refused, never run
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def check_module_names(name: str, value: object) -> tuple[str, ...]:
    """A sequence of dotted module names (``"numpy"`` alone is a str, not a sequence)."""
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise ConfigError(
            f"{name} must be a sequence of module names such as ('numpy', 'sympy'), "
            f"got {type(value).__name__} {value!r}"
        )
    names = tuple(value)  # type: ignore[arg-type]  # checked iterable above
    for item in names:
        if not isinstance(item, str) or not _MODULE_RE.match(item):
            raise ConfigError(f"{name}: {item!r} is not a module name")
    return names


def code_problem(code: object, name: str = "code") -> str | None:
    """Why ``code`` cannot be run (too large, not UTF-8 text), or ``None``.

    Raises :class:`ConfigError` when ``code`` is not a ``str`` at all: that is
    the caller's bug (``bytes`` must be decoded first), not the model's.
    """
    if not isinstance(code, str):
        hint = " (decode it first: code.decode('utf-8'))" if isinstance(code, bytes) else ""
        raise ConfigError(f"{name} must be a str of Python source, got {type(code).__name__}{hint}")
    if len(code) > MAX_CODE_BYTES:  # every character is at least one byte: no need to encode
        return _too_large(f"{len(code)} characters")
    try:
        size = len(code.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = code[exc.start]
        return (
            f"Error: the code is not valid UTF-8 text (an unpaired surrogate {bad!a} at "
            f"character {exc.start}, as left by decoding non-UTF-8 bytes); it was not run."
        )
    return _too_large(f"{size} bytes") if size > MAX_CODE_BYTES else None


def _too_large(size: str) -> str:
    return (
        f"Error: the code is {size}, over the sandbox's limit of {MAX_CODE_BYTES} bytes "
        "of UTF-8; it was not run."
    )


def screen_code(code: object, isolation: str = "", degraded: bool = False) -> ExecResult | None:
    """The refusal of code that must not reach the sandbox, or ``None`` to run it.

    Every sandbox client calls this before sending anything, so the model gets
    the same observation for the same code whichever sandbox runs it.
    """
    problem = code_problem(code)
    if problem is None:
        return None
    return ExecResult(
        ok=False,
        stdout="",
        stderr=problem,
        returncode=None,
        timed_out=False,
        latency_s=0.0,
        truncated=False,
        error_kind=ErrorKind.ERROR,
        isolation=isolation,
        degraded=degraded,
    )
