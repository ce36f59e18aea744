"""The boot lines that start an interpreter in the server's runtime copy.

The server never runs from the checkout: the trainer copies its modules into a
package of their own (``runtime_copy.py``) and starts ``python -I -S -c LINE
PATH ...``, where ``PATH`` is the copy plus the site-packages directories. The
same lines start the server again at its neutral paths (``server.py``) and the
interpreter a call executes in fresh mode (``call.py``), so each lives here
once, named with the copy's package, which ``runtime_copy.py`` creates under
this name.

Standard library only (nothing at all), and copied with the server.
"""

from __future__ import annotations

RUNTIME_PACKAGE = "retool_sandbox_rt"


def _boot(module: str, entry: str) -> str:
    """``-c`` source: take the import path from ``argv[1]``, then run ``module.entry()``."""
    return (
        "import sys; sys.path += sys.argv.pop(1).split(':'); "
        f"from {RUNTIME_PACKAGE}.{module} import {entry}; {entry}()"
    )


SERVER_BOOT = _boot("server", "main")  # the fork server (``server.main``)
FRESH_BOOT = _boot("call", "run_file")  # fresh mode: the interpreter C executes
