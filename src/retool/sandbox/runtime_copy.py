"""The server's runtime copy: its modules, copied out of the package per sandbox.

The trainer never starts the server from the checkout. Each ``LocalSandbox``
copies the server's own modules (``RUNTIME_MODULES``) into a package of their
own (``boot.RUNTIME_PACKAGE``) in its private directory, and the server starts
with ``-I -S`` from an explicit import path: that copy plus the site-packages
directories (the preloaded libraries). The server's modules import nothing
else of ours, so nothing of retool (data, answers) is importable in a call,
and neither the trainer's cwd, ``PYTHONPATH`` nor our source tree is on the
path. ``tests/sandbox/test_runtime_copy.py`` reads the import graph from the
sources and checks that this list is exactly what the server imports.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from retool.sandbox.boot import RUNTIME_PACKAGE

# The server's own code, copied out of the package: the server imports nothing
# else of ours, so nothing of retool (data, answers) is importable in a call.
RUNTIME_MODULES = (
    "server",
    "boot",
    "wire",
    "rootfs",
    "call",
    "zygote",
    "handler",
    "neutral",
    "uids",
    "layers",
    "runtime",
    "linux",
    "seccomp",
    "landlock",
    "cgroups",
    "autoprint",
    "relocate",
)


def install_runtime(workdir: str) -> str:
    """Copy the server's modules into ``workdir``; the server's explicit import path.

    The path is the runtime copy plus the site-packages directories (preloaded
    libraries), never the trainer's cwd, ``PYTHONPATH`` or our source tree.
    """
    runtime = os.path.join(workdir, "rt")
    package = os.path.join(runtime, RUNTIME_PACKAGE)
    os.makedirs(package, mode=0o755)
    here = Path(__file__).resolve().parent
    for name in RUNTIME_MODULES:
        shutil.copyfile(here / f"{name}.py", os.path.join(package, f"{name}.py"))
    Path(package, "__init__.py").write_text('"""retool sandbox runtime (a copy)."""\n')
    for path in [runtime, package, *map(str, Path(package).iterdir())]:
        os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
    sources = {str(here.parents[1]), str(here.parents[2])}
    sites = [
        p
        for p in sys.path
        if p.rstrip("/").endswith(("site-packages", "dist-packages"))
        and os.path.isdir(p)
        and os.path.realpath(p) not in sources
    ]
    return ":".join([runtime, *dict.fromkeys(sites)])
