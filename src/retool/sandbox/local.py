"""``LocalSandbox``: the client side of the fork server.

The trainer never forks model code itself: it starts ``retool.sandbox.server``
as a separate program with an empty environment (forked memory and
``/proc/self/environ`` would otherwise carry the trainer's secrets) and talks
to it over a Unix socket in a private directory. Each connection is served by
its own handler process, so ``max_workers`` connections give ``max_workers``
calls in parallel; a bounded semaphore caps concurrency across threads and
event loops alike. A dead server is restarted and the call retried once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from pathlib import Path

from retool.errors import ConfigError, SandboxError
from retool.protocol.sanitize import sanitize_observation
from retool.sandbox.result import ErrorKind, ExecResult
from retool.sandbox.server import recv_frame, send_frame
from retool.sandbox.stats import SandboxStats

log = logging.getLogger(__name__)

DEFAULT_PRELOAD = ("math", "itertools", "fractions", "numpy", "sympy")
# The only variables model code sees. Thread caps keep one call on one core.
_THREAD_CAPS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


class IsolationLevel(StrEnum):
    """How strongly calls are isolated on this machine."""

    FULL = "full"
    """Mount, PID, IPC, UTS and network namespaces, read-only root, private /tmp,
    unprivileged uid, no_new_privs, rlimits."""
    BASIC = "basic"
    """rlimits, empty environment, scratch cwd, process-group (and uid) kill only."""


def sandbox_env() -> dict[str, str]:
    """The environment of the server and every call: a fixed allowlist."""
    src = str(Path(__file__).resolve().parents[2])
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": "/tmp",
        "PYTHONPATH": src,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
    }
    env.update({name: "1" for name in _THREAD_CAPS})
    return env


class LocalSandbox:
    """Runs untrusted Python snippets, isolated, limited and stateless."""

    def __init__(
        self,
        timeout: float = 30.0,
        memory_mb: int = 1024,
        max_workers: int = 8,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        isolation: str = "auto",
        max_output_bytes: int = 16384,
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"sandbox timeout must be > 0 seconds, got {timeout}")
        if memory_mb <= 0:
            raise ConfigError(f"sandbox memory_mb must be > 0, got {memory_mb}")
        if max_workers <= 0:
            raise ConfigError(f"sandbox max_workers must be >= 1, got {max_workers}")
        if max_output_bytes <= 0:
            raise ConfigError(f"sandbox max_output_bytes must be > 0, got {max_output_bytes}")
        if isolation not in ("auto", "strict", "none"):
            raise ConfigError(f"sandbox isolation must be auto, strict or none, got {isolation!r}")
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.max_workers = int(max_workers)
        self.preload = tuple(preload)
        self.isolation = isolation
        self.max_output_bytes = int(max_output_bytes)
        self.stats = SandboxStats()
        self.missing: list[str] = []  # what keeps this machine from full isolation
        self.preloaded: list[str] = []
        self.isolation_level = IsolationLevel.BASIC
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._idle: queue.SimpleQueue[tuple[int, socket.socket]] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="sandbox")
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._generation = 0
        self.connections_opened = 0  # handler connections made (at most max_workers live)
        self._dir = ""
        self._closed = False
        self._start_server()

    # -- server lifecycle -----------------------------------------------------
    def _start_server(self) -> None:
        """Start the fork server; if it dies while preloading, fall back to fresh mode.

        Fresh-interpreter mode (no preload) runs every call in a new interpreter
        under the same isolation: slower, but it needs nothing from the server's
        memory, so a module that crashes on import cannot take the sandbox down.
        """
        try:
            self._spawn_server(self.preload)
        except SandboxError:
            if not self.preload:
                raise
            log.warning(
                "the sandbox server died while preloading %s; running every call in a "
                "fresh interpreter instead",
                ", ".join(self.preload),
            )
            self.preload = ()
            self._spawn_server(())

    def _spawn_server(self, preload: Sequence[str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="retool-sandbox-")
        os.chmod(self._dir, 0o711)  # sandbox uids must reach the per-call root mount point
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "retool.sandbox.server",
                "--dir",
                self._dir,
                "--preload",
                ",".join(preload),
                "--isolation",
                self.isolation,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=sandbox_env(),
            close_fds=True,
            start_new_session=True,
        )
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line:
            server.kill()
            server.wait()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise SandboxError("the sandbox server failed to start")
        ready = json.loads(line)
        level = IsolationLevel(ready["level"])
        self.missing = list(ready["missing"])
        self.preloaded = list(ready["preloaded"])
        if self.isolation == "strict" and level != IsolationLevel.FULL:
            server.kill()
            server.wait()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise SandboxError(
                "isolation='strict' needs full isolation, but this machine lacks: "
                + "; ".join(self.missing)
            )
        if level != IsolationLevel.FULL and self._generation == 0:
            log.warning(
                "sandbox isolation is %s, not full: missing %s",
                level.value,
                "; ".join(self.missing),
            )
        self.isolation_level = level
        self._server = server
        self._generation += 1

    def _restart(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation or self._closed:
                return  # another thread restarted it already
            self._stop_server()
            self._start_server()

    def _stop_server(self) -> None:
        while True:
            try:
                _, conn = self._idle.get_nowait()
            except queue.Empty:
                break
            conn.close()
        if self._server is not None:
            self._server.kill()
            self._server.wait()
            if self._server.stdout is not None:
                self._server.stdout.close()
            self._server = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def _connect(self) -> tuple[int, socket.socket]:
        try:
            generation, conn = self._idle.get_nowait()
            if generation == self._generation:
                return generation, conn
            conn.close()
        except queue.Empty:
            pass
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(os.path.join(self._dir, "server.sock"))
        self.connections_opened += 1
        return self._generation, conn

    # -- running code ---------------------------------------------------------
    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` and wait for its result (at most the timeout plus set-up)."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        limit = self.timeout if timeout is None else float(timeout)
        if limit <= 0:
            raise ConfigError(f"sandbox timeout must be > 0 seconds, got {limit}")
        request = {
            "code": code,
            "timeout": limit,
            "memory_mb": self.memory_mb,
            "max_output_bytes": self.max_output_bytes,
        }
        with self._slots:
            started = time.monotonic()
            reply = None
            for _attempt in range(2):
                generation, conn = self._connect_or_restart()
                try:
                    conn.settimeout(limit + 60)
                    send_frame(conn, request)
                    reply = recv_frame(conn)
                except OSError:
                    reply = None
                if reply is not None:
                    self._idle.put((generation, conn))
                    break
                conn.close()
                self._restart(generation)  # the server or its handler died
            latency = time.monotonic() - started
        result = self._to_result(reply, latency)
        self.stats.record(result)
        return result

    def _connect_or_restart(self) -> tuple[int, socket.socket]:
        try:
            return self._connect()
        except OSError:
            self._restart(self._generation)
            return self._connect()

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        """``run`` from an event loop, without blocking it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run, code, timeout)

    def _to_result(self, reply: dict | None, latency: float) -> ExecResult:
        if reply is None:
            return ExecResult(
                False,
                "",
                "the sandbox server failed twice",
                None,
                False,
                latency,
                False,
                ErrorKind.SANDBOX,
            )
        stdout = sanitize_observation(reply["stdout"])
        stderr = sanitize_observation(reply["stderr"])
        code, timed_out = reply["returncode"], bool(reply["timed_out"])
        kind: ErrorKind | None = None
        if timed_out:
            kind = ErrorKind.TIMEOUT
        elif code == 0:
            kind = None
        elif code is not None and code < 0:
            kind = {-25: ErrorKind.OUTPUT, -24: ErrorKind.TIMEOUT, -9: ErrorKind.MEMORY}.get(
                code, ErrorKind.CRASH
            )
        elif "MemoryError" in stderr[-2000:]:
            kind = ErrorKind.MEMORY
        elif "[Errno 27] File too large" in stderr[-2000:]:
            kind = ErrorKind.OUTPUT  # Python ignores SIGXFSZ: the write fails with EFBIG
        elif "sandbox setup failed" in stderr:
            kind = ErrorKind.SANDBOX
        else:
            kind = ErrorKind.ERROR
        return ExecResult(
            ok=kind is None,
            stdout=stdout,
            stderr=stderr,
            returncode=code,
            timed_out=timed_out or kind == ErrorKind.TIMEOUT,
            latency_s=latency,
            truncated=bool(reply["truncated"]),
            error_kind=kind,
        )

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._stop_server()
        self._executor.shutdown(wait=False)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
