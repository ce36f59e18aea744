"""Run sandbox scenarios as a root trainer and as a non-root trainer.

Some escapes exist only when the trainer is not root (the call and its init
then share a uid), so the sandbox's adversarial tests run under both. As root,
the "non-root trainer" is a child process under a dedicated uid (``nobody``),
running the system Python on a copy of the package (the checkout and its
virtual environment may sit below a private home); it gets the sandbox such a
trainer gets here: a user namespace where the kernel allows one, no writable
cgroups. Under a non-root test run the non-root variant runs in-process and
the root variant is skipped.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .helpers import ROOT, SRC

TRAINERS = ("root", "nonroot")
_NOBODY = 65534
_SYSTEM_PYTHON = "/usr/bin/python3"


def _system_python() -> str | None:
    if not os.path.exists(_SYSTEM_PYTHON):
        return None
    check = subprocess.run(
        [_SYSTEM_PYTHON, "-c", "import enum; enum.StrEnum"], capture_output=True, check=False
    )
    return _SYSTEM_PYTHON if check.returncode == 0 else None


def _readable_copy(where: str, module: str) -> str:
    """A copy of the package and of ``module`` that the unprivileged uid can read."""
    source = os.path.join(where, "src")
    shutil.copytree(
        SRC / "retool", os.path.join(source, "retool"), ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copyfile(Path(__file__).with_name(f"{module}.py"), os.path.join(source, f"{module}.py"))
    for root, _dirs, files in os.walk(where):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return source


def _drop() -> None:
    os.setgroups([])
    os.setgid(_NOBODY)
    os.setuid(_NOBODY)


@functools.cache
def scenario_results(trainer: str, module: str) -> dict:
    """``module.run_all()`` as ``trainer`` (cached: one run per trainer and module)."""
    if trainer == "root":
        if not ROOT:
            pytest.skip("the root trainer needs a root test run")
        return importlib.import_module(f"tests.sandbox.{module}").run_all()
    if not ROOT:
        return importlib.import_module(f"tests.sandbox.{module}").run_all()
    python = _system_python()
    if python is None:
        pytest.skip("no system Python >= 3.11 for the unprivileged trainer")
    where = tempfile.mkdtemp(prefix="retool-nonroot-")
    try:
        source = _readable_copy(where, module)
        out = subprocess.run(
            [
                python,
                "-c",
                f"import sys; sys.path.insert(0, {source!r}); import runpy; "
                f"runpy.run_module({module!r}, run_name='__main__')",
            ],
            capture_output=True,
            text=True,
            cwd="/tmp",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            preexec_fn=_drop,
            timeout=240,
            check=False,
        )
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results["uid"] == _NOBODY
    return results
