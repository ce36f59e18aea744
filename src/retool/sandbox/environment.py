"""The environment model code sees: a fixed allowlist, never the trainer's.

The fork server starts with exactly this environment (``local.py``), and every
call inherits it, so no secret of the trainer (``*_API_KEY``, tokens, paths)
reaches model code, and the same variables hold on every machine. The thread
caps keep one call on one core; ``MPLBACKEND`` keeps matplotlib headless. The
SandboxFusion client sends the thread caps and the backend with each call
(``fusion_program.py``), so a remote call runs under the same settings.
"""

from __future__ import annotations

# The only variables model code sees. Thread caps keep one call on one core.
_THREAD_CAPS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def sandbox_env() -> dict[str, str]:
    """The environment of the server and every call: a fixed allowlist."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
    }
    env.update({name: "1" for name in _THREAD_CAPS})
    return env
