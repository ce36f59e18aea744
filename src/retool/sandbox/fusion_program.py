"""What the SandboxFusion client sends: the ``run_code`` request and its program.

**Same code, same output.** The snippet is sent wrapped in a small driver
(:func:`remote_program`) that runs it exactly as the local fork server does:
compiled as ``<code>`` after the same AST auto-print
(:mod:`retool.sandbox.autoprint`, shipped as source), by the fork server's own
runtime (:mod:`retool.sandbox.runtime`, shipped as source too), so a failure
shows only the code's frames and its libraries' (never the driver's, also
when the code closes stderr, empties ``sys.modules`` or replaces ``os._exit``
or ``traceback``), compile failures as the code's own error, the same
``SystemExit`` handling and exit status, and the local calls' thread caps and
matplotlib backend in ``os.environ``. What differs is the service's: its
interpreter and packages (nothing is preloaded, so ``import sympy`` counts
against the timeout), its isolation, and what ``memory_limit_MB`` bounds there.

The request has the shape of SandboxFusion's ``RunCodeRequest``
(``sandbox_fusion/models.py`` of the ``sandbox-fusion`` 0.3.7 client)::

    {"code", "language": "python", "run_timeout", "compile_timeout",
     "memory_limit_MB", "stdin", "files": {}, "fetch_files": []}

``memory_limit_MB`` is only known to newer services; older ones ignore it.
"""

from __future__ import annotations

import json
from pathlib import Path

from retool.sandbox.environment import sandbox_env

# What the local sandbox sets for every call that matters on another machine too: one
# thread per numeric library, a headless matplotlib.
_CALL_ENV = {
    k: v for k, v in sandbox_env().items() if k.endswith("_NUM_THREADS") or k == "MPLBACKEND"
}
# Shipped as source to the service: the auto-print and the runtime the local fork
# server imports (one module, runtime.py, for both), so the code runs the same way.
_HERE = Path(__file__).resolve().parent
_AUTOPRINT_SOURCE = (_HERE / "autoprint.py").read_text(encoding="utf-8")
RUNTIME_SOURCE = (_HERE / "runtime.py").read_text(encoding="utf-8")


def remote_program(code: str) -> str:
    """The Python file sent for ``code``: :mod:`retool.sandbox.runtime`, run on the code.

    Every part is an ASCII literal, so the service's file encoding cannot
    matter (``ascii()`` is lossless). The runtime runs in a namespace of its
    own named ``retool_runtime`` (its guard then runs the code), not in the
    file's ``__main__``, which the code can import.
    """
    return (
        f"_AUTOPRINT = {_AUTOPRINT_SOURCE!a}\n_CODE = {code!a}\n_ENV = {_CALL_ENV!a}\n"
        f"_RUNTIME = {RUNTIME_SOURCE!a}\n"
        'exec(compile(_RUNTIME, "<retool-runtime>", "exec"), {"__name__": "retool_runtime", '
        '"_AUTOPRINT": _AUTOPRINT, "_CODE": _CODE, "_ENV": _ENV})\n'
    )


def run_code_request(code: str, limit: float, memory_mb: int) -> bytes:
    """The body of ``POST /run_code`` for ``code`` with the time limit ``limit``."""
    payload = {
        "code": remote_program(code),
        "language": "python",
        "run_timeout": limit,
        "compile_timeout": limit,
        "memory_limit_MB": memory_mb,
        "stdin": None,
        "files": {},
        "fetch_files": [],
    }
    return json.dumps(payload).encode()
