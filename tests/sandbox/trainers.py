"""Run sandbox scenarios as a root trainer and as a non-root trainer.

Some escapes exist only when the trainer is not root (the call and its init
then share a uid), so the sandbox's adversarial tests run under both. As root,
the "non-root trainer" is a child process under a dedicated uid (``nobody``),
running the system Python on a copy of the package (the checkout and its
virtual environment may sit below a private home); it gets the sandbox such a
trainer gets here: a user namespace where the kernel allows one, no writable
cgroups. Under a non-root test run the non-root variant runs in-process and
the root variant is skipped.

Two ways in: ``scenario_results`` runs a whole scenario module as the trainer
(stdlib-only scenarios, the system Python, a copy of the package); tests marked
``BOTH_TRAINERS`` get the ``sandbox`` fixture twice, the second time a
:class:`NonRootSandbox`: a ``LocalSandbox`` held by a ``nobody`` process with
numpy and sympy preloaded, driven call by call from the test.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from retool.sandbox import ErrorKind, ExecResult, IsolationLevel

from .helpers import ROOT, SRC

TRAINERS = ("root", "nonroot")
# For the attacks that matter to both: the test runs against the sandbox of a root
# trainer and of a non-root one (the ``sandbox`` fixture, indirectly: NonRootSandbox).
BOTH_TRAINERS = pytest.mark.parametrize("sandbox", TRAINERS, indirect=True)
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


# -- a LocalSandbox of a non-root trainer, driven from this (root) test process --------
_PROXY = r"""
import json, os, sys, threading
sys.path[:0] = sys.argv[1].split(os.pathsep)
from retool.sandbox import LocalSandbox
lock = threading.Lock()
def say(message):
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
with LocalSandbox(**json.loads(sys.argv[2])) as sb:
    say({"uid": os.geteuid(), "isolation_level": sb.isolation_level.value,
         "missing": sb.missing, "layers": sb.layers, "degraded": sb.degraded,
         "preloaded": sb.preloaded, "_dir": sb._dir})
    def serve(request):
        try:
            result = sb.run(request["code"], timeout=request["timeout"]).to_dict()
            say({"id": request["id"], "result": result})
        except Exception as exc:
            say({"id": request["id"], "error": "%s: %s" % (type(exc).__name__, exc)})
    for line in sys.stdin:
        threading.Thread(target=serve, args=(json.loads(line),), daemon=True).start()
"""


def _nobody_can_import(python: str, path: list[str]) -> bool:
    probe = "import sys; sys.path[:0] = sys.argv[1].split(':'); import retool.sandbox, numpy, sympy"
    try:
        done = subprocess.run(
            [python, "-c", probe, ":".join(path)],
            capture_output=True,
            cwd="/tmp",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            preexec_fn=_drop,
            timeout=120,
            check=False,
        )
    except OSError:  # nobody may not even execute it (an interpreter below /root)
        return False
    return done.returncode == 0


class NonRootSandbox:
    """A ``LocalSandbox`` opened by an unprivileged trainer (uid ``nobody``), with the
    ``run`` of a ``LocalSandbox`` and the attributes the tests read.

    The trainer is this interpreter if ``nobody`` can run it, else the system Python
    of the same version, importing this checkout's package and this environment's
    site-packages (compiled for that version), so it preloads numpy and sympy as a
    root trainer does. Calls may run concurrently (one thread each in the trainer).
    Skips the test when ``nobody`` can reach no such interpreter and packages.
    """

    def __init__(self, **settings: object) -> None:
        sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
        path = [str(SRC), *sites]
        for python in dict.fromkeys([sys.executable, _SYSTEM_PYTHON]):
            same = subprocess.run(
                [python, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip() == str(sys.version_info[:2])
            if same and _nobody_can_import(python, path):
                break
        else:
            pytest.skip("uid nobody can reach no interpreter with this checkout's packages")
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._ids = 0
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115  # closed by close()
        self._proc = subprocess.Popen(
            [python, "-c", _PROXY, ":".join(path), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            cwd="/tmp",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            preexec_fn=_drop,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._errors.seek(0)
            raise AssertionError(self._errors.read()[-3000:].decode(errors="replace"))
        ready = json.loads(line)
        assert ready.pop("uid") == _NOBODY
        self.isolation_level = IsolationLevel(ready.pop("isolation_level"))
        self.__dict__.update(ready)
        self.__dict__.update(settings)
        self._generation = 1
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            reply = json.loads(line)
            with self._lock:
                future = self._futures.pop(reply["id"])
            future.set_result(reply)
        with self._lock:  # the trainer is gone: every call waiting fails
            for future in self._futures.values():
                future.set_result({"error": "the non-root trainer exited"})

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        future: Future = Future()
        with self._lock:
            self._ids += 1
            self._futures[self._ids] = future
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"id": self._ids, "code": code, "timeout": timeout}))
            self._proc.stdin.write("\n")
            self._proc.stdin.flush()
        reply = future.result(timeout=(timeout or 30.0) + 120)
        if "error" in reply:
            raise AssertionError(f"the non-root trainer's run failed: {reply['error']}")
        fields = reply["result"]
        kind = fields["error_kind"]
        fields["error_kind"] = None if kind is None else ErrorKind(kind)
        return ExecResult(**fields)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._errors.close()
