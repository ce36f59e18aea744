"""``LocalSandbox``: the client side of the fork server.

The trainer never forks model code itself: it starts ``retool.sandbox.server``
as a separate program with an empty environment (forked memory and
``/proc/self/environ`` would otherwise carry the trainer's secrets) and talks
to it over a Unix socket in a private directory. Each connection is served by
its own handler process, so ``max_workers`` connections give ``max_workers``
calls in parallel; a bounded semaphore caps concurrency across threads and
event loops alike. A dead server is restarted for later calls; code that was
delivered is never run again. The server's stdin is a lifeline: when this end
closes (``close()``, or the trainer dies however it dies) a reaper kills every
process of every call.

This module decides when the server starts, restarts and stops, holds the
connections, runs calls and classifies their results. How the server process
is started and ended is ``server_process.py``; the copy of its modules it
starts from, ``runtime_copy.py``; its environment, ``environment.py``; what
``LocalSandbox`` shares with ``FusionSandbox`` (screening, ``arun``), ``client.py``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum

from retool.checks import check_number
from retool.errors import ConfigError, SandboxError
from retool.protocol.sanitize import sanitize_observation
from retool.sandbox import relocate
from retool.sandbox.client import SandboxClient
from retool.sandbox.limits import (
    MAX_OUTPUT_BYTES,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MEMORY_MB_RANGE,
    check_module_names,
)
from retool.sandbox.result import ErrorKind, ExecResult, sandbox_failure, signal_kind
from retool.sandbox.runtime_copy import install_runtime
from retool.sandbox.server_process import end_server, kill_cgroup, start_server, wait_for_eof
from retool.sandbox.stats import SandboxStats
from retool.sandbox.wire import recv_frame, send_frame, unix_socket_path

log = logging.getLogger(__name__)

_NOT_DELIVERED = "could not deliver the code to the sandbox"
DEFAULT_PRELOAD = ("math", "itertools", "fractions", "numpy", "sympy")


def _readable(conn: socket.socket) -> bool:
    """Whether ``conn`` has data or EOF waiting (poll: a trainer may hold > 1024 fds)."""
    poller = select.poll()
    poller.register(conn, select.POLLIN | select.POLLHUP)
    return bool(poller.poll(0))


class IsolationLevel(StrEnum):
    """How strongly calls are isolated on this machine."""

    FULL = "full"
    """Mount, PID, IPC, UTS and network namespaces, read-only root, private /tmp,
    unprivileged uid (or no capabilities), no_new_privs, seccomp, a cgroup per
    call, rlimits."""
    BASIC = "basic"
    """No namespaces: seccomp, Landlock where available, a cgroup per call where
    writable, rlimits, empty environment, scratch cwd on the host filesystem."""


def close_all() -> None:
    """Close every ``LocalSandbox`` of this process, also one whose ``close()`` was cut
    short; returns once all their calls, servers and directories are gone.

    For a command stopped by a signal: it cannot know which sandboxes the code it
    interrupted had opened.
    """
    for sandbox in list(_OPEN):
        sandbox.close()


class LocalSandbox(SandboxClient):
    """Runs untrusted Python snippets, isolated, limited and stateless.

    Arguments (each checked at construction, a :class:`ConfigError` naming it
    otherwise; ranges in :mod:`retool.sandbox.limits`):

    - ``timeout``: wall-clock seconds per call, in (0, 86400]; at the limit the
      call and every process it started are killed.
    - ``memory_mb``: MiB a call may allocate *on top of* the preloaded
      interpreter, in [16, 1048576]. Headroom, not a total: the address-space
      limit is the interpreter's size at the start of the call plus this, and
      the call's cgroup (where writable) caps the memory the call itself
      charges (new and copied-on-write pages, tmpfs files) at this plus 32 MiB.
      The preloaded modules are shared with the server and charged to it, so
      every call gets the same room whatever is preloaded (about 140 MiB of
      address space and 55 MiB resident for the default preload).
    - ``max_workers``: calls running at once, in [1, 256].
    - ``preload``: module names imported once by the server (a sequence).
    - ``isolation``: ``auto`` (the best this machine allows), ``strict``
      (refuse anything below full isolation), ``none`` (no namespaces: the
      basic level, for measuring).
    - ``max_output_bytes``: tail kept of stdout and of stderr, in [1, 8 MiB].
    """

    _label = "LocalSandbox"
    # Layers switched off ("seccomp", "cgroups"): only for measuring their cost.
    _disable_layers: tuple[str, ...] = ()

    def __init__(
        self,
        timeout: float = 30.0,
        memory_mb: int = 1024,
        max_workers: int = 8,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        isolation: str = "auto",
        max_output_bytes: int = 16384,
    ) -> None:
        check_number("LocalSandbox timeout (seconds)", timeout, 0, MAX_TIMEOUT_S, low_open=True)
        check_number("LocalSandbox memory_mb", memory_mb, *MEMORY_MB_RANGE, integer=True)
        check_number("LocalSandbox max_workers", max_workers, 1, MAX_WORKERS, integer=True)
        check_number(
            "LocalSandbox max_output_bytes", max_output_bytes, 1, MAX_OUTPUT_BYTES, integer=True
        )
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.max_workers = int(max_workers)
        self.max_output_bytes = int(max_output_bytes)
        self.preload = check_module_names("LocalSandbox preload", preload)
        if not isinstance(isolation, str) or isolation not in ("auto", "strict", "none"):
            raise ConfigError(
                f"LocalSandbox isolation must be auto, strict or none, got {isolation!r}"
            )
        self.isolation = isolation
        self.stats = SandboxStats()
        self.missing: list[str] = []  # what keeps this machine from full isolation
        self.preloaded: list[str] = []
        self.layers: list[str] = []  # what holds here, one line per layer (``check``)
        self.cpu_isolation = ""  # how a call's CPU is bounded: cgroup or fallback
        self.isolation_level = IsolationLevel.BASIC
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._idle: queue.SimpleQueue[tuple[int, socket.socket]] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="sandbox")
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._generation = 0
        self.connections_opened = 0  # handler connections made (at most max_workers live)
        self._dir = ""
        self._cgroup: dict[str, str] | None = None
        self._gone_r = -1  # EOF once the server and its reaper have both exited
        self._closed = False
        _OPEN.add(self)
        try:
            self._start_server()
        except BaseException:  # an interrupt while starting: nothing may be left behind
            self.close()
            raise

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
        if self.isolation != "none" and not os.path.isdir(relocate.cache_root()):
            log.info(
                "the sandbox rewrites the interpreter's and site-packages' compiled files "
                "for its neutral paths once (tens of seconds; kept in %s)",
                relocate.cache_root(),
            )
        self._dir = tempfile.mkdtemp(prefix="retool-sandbox-")
        os.chmod(self._dir, 0o711)  # sandbox uids must reach their scratch dirs (basic)
        boot_path = install_runtime(self._dir)
        self._gone_r, gone_w = os.pipe()
        try:
            self._server = start_server(
                self._dir,
                boot_path,
                gone_w,
                preload=preload,
                isolation=self.isolation,
                memory_mb=self.memory_mb,
                disabled=self._disable_layers,
            )
        finally:
            os.close(gone_w)  # only the server and then its reaper hold it
        # Held in self._server from here on: whatever interrupts the start-up,
        # _stop_server can find and end the server, its reaper and its calls.
        assert self._server is not None and self._server.stdout is not None
        # First where the instance's cgroup is (ours to kill if the server dies; the
        # server itself keeps only neutral paths), then the ready line.
        line = self._server.stdout.readline()
        if line:
            self._cgroup = json.loads(line).get("cgroup")
            line = self._server.stdout.readline()
        if not line:
            self._stop_server()
            raise SandboxError("the sandbox server failed to start")
        ready = json.loads(line)
        level = IsolationLevel(ready["level"])
        self.missing = list(ready["missing"])
        self.layers = list(ready.get("layers", []))  # what isolates each call, one line each
        self.preloaded = list(ready["preloaded"])
        self.cpu_isolation = next((x for x in self.layers if x.startswith("cpu: ")), "")
        if self.isolation == "strict" and level != IsolationLevel.FULL:
            self._stop_server()
            raise SandboxError(
                "isolation='strict' needs full isolation, but this machine lacks: "
                + "; ".join(self.missing)
            )
        # isolation='none' asked for the basic level: no warning for getting it.
        if level != IsolationLevel.FULL and self.isolation == "auto" and self._generation == 0:
            log.warning(
                "sandbox isolation is %s, not full: missing %s",
                level.value,
                "; ".join(self.missing),
            )
        self.isolation_level = level
        self._generation += 1

    def _restart(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation or self._closed:
                return  # another thread restarted it already
            self._stop_server()
            self._start_server()

    def _stop_server(self) -> None:
        """Kill the server and every call it runs; wait until they are all gone.

        Idempotent, so a stop cut short (an interrupt) can be finished by the
        next ``close()``. The reaper does the killing (the instance's cgroup
        whole, or the instance's uids) and removes the directory; waiting for
        it to exit (the "gone" pipe, held only by the server and then the
        reaper, reaches EOF) is what makes "gone" true on return, with or
        without cgroups, rather than a moment later.
        """
        while True:
            try:
                _, conn = self._idle.get_nowait()
            except queue.Empty:
                break
            conn.close()
        if self._server is not None:
            end_server(self._server)
            self._server = None
        if self._gone_r >= 0:
            wait_for_eof(self._gone_r, within=10.0)
            os.close(self._gone_r)
            self._gone_r = -1
        cgroup_dir = (self._cgroup or {}).get("v2")
        if cgroup_dir:
            kill_cgroup(cgroup_dir, within=2.0)
        self._cgroup = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def degraded(self) -> bool:
        """True when calls run with less than every isolation layer (see ``missing``)."""
        return self.isolation_level != IsolationLevel.FULL or any(
            not item.startswith("preload ") for item in self.missing
        )

    def _server_alive(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def _connect(self) -> tuple[int, socket.socket]:
        while True:
            try:
                generation, conn = self._idle.get_nowait()
            except queue.Empty:
                break
            # A handler never speaks first: a readable idle connection is a dead one.
            if generation == self._generation and not _readable(conn):
                return generation, conn
            conn.close()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with unix_socket_path(os.path.join(self._dir, "sock", "server.sock")) as path:
                conn.connect(path)
        except OSError:
            conn.close()
            raise
        self.connections_opened += 1
        return self._generation, conn

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed")

    # -- running code ---------------------------------------------------------
    def _isolation(self) -> tuple[str, bool]:
        return self.isolation_level.value, self.degraded

    def _execute(self, code: str, limit: float) -> ExecResult:
        """One call, delivered at most once (at most the timeout plus set-up).

        If the connection or the server fails after the code was sent, the
        call fails with ``ErrorKind.SANDBOX`` and is never run again behind the
        caller's back.
        """
        request = {
            "code": code,
            "timeout": limit,
            "memory_mb": self.memory_mb,
            "max_output_bytes": self.max_output_bytes,
        }
        with self._slots:
            self._check_open()
            started = time.monotonic()
            reply, failure = None, ""
            for attempt in range(2):
                generation, conn = self._connect_or_restart()
                try:
                    conn.settimeout(limit + 60)
                    send_frame(conn, request)
                except OSError:
                    conn.close()  # not delivered (a dead handler): one more connection
                    if attempt == 0:
                        continue
                    failure = _NOT_DELIVERED
                    break
                try:
                    reply = recv_frame(conn)
                except (OSError, ValueError):
                    reply = None
                if reply is not None:
                    self._idle.put((generation, conn))
                else:
                    conn.close()
                    self._check_open()  # closed while it ran
                    failure = "the sandbox handler died during this call"
                    if not self._server_alive():
                        failure = "the sandbox server died during this call"
                        self._restart(generation)  # for later calls; this one is not re-run
                break
            latency = time.monotonic() - started
        return self._to_result(reply, latency, failure)

    def _connect_or_restart(self) -> tuple[int, socket.socket]:
        if not self._server_alive():  # nothing delivered yet: a new server is safe
            self._check_open()
            self._restart(self._generation)
        try:
            return self._connect()
        except OSError:
            self._check_open()
            if self._server_alive():
                raise SandboxError("cannot connect to the sandbox server") from None
            self._restart(self._generation)
            try:
                return self._connect()
            except OSError as exc:
                self._check_open()
                raise SandboxError(f"cannot connect to the sandbox server: {exc}") from None

    def _to_result(self, reply: dict | None, latency: float, failure: str = "") -> ExecResult:
        """The result, with its kind taken only from facts the supervisor observed:
        the wait status, its own timer, the cgroup's OOM counter, the output
        files' sizes, and whether set-up finished (never from the call's output)."""
        level, degraded = self._isolation()
        if reply is None or "error" in reply:
            why = failure or "the sandbox handler failed"
            if reply is not None:  # our bug: for the log, never for the model
                log.warning("sandbox handler error: %s", reply["error"])
            return sandbox_failure(
                why,
                latency,
                isolation=level,
                degraded=degraded,
                # Sent, the code may have run, and the call may be what broke the
                # handler: only a delivery that failed proves it did not run.
                delivered=failure != _NOT_DELIVERED,
            )
        stdout = sanitize_observation(reply["stdout"])
        stderr = sanitize_observation(reply["stderr"])
        code, timed_out = reply["returncode"], bool(reply["timed_out"])
        delivered = True
        kind: ErrorKind | None
        if timed_out:
            kind = ErrorKind.TIMEOUT
        elif not reply.get("ready", True):
            kind = ErrorKind.SANDBOX
            # The set-up's own traceback: for the log, never for the model.
            detail = (reply["stderr"].strip().splitlines() or ["no detail"])[-1]
            log.warning("sandbox call set-up failed: %s", detail)
            stdout, stderr = "", "the sandbox could not set up this call; the code did not run"
            delivered = False  # the init's own observation, out of the call's reach
        elif reply.get("oom_killed"):
            kind = ErrorKind.MEMORY
        elif code == 0:
            kind = None
        elif reply.get("output_limit"):
            kind = ErrorKind.OUTPUT  # Python ignores SIGXFSZ: the write fails with EFBIG
        elif code is None:
            kind = ErrorKind.CRASH  # its init was killed before it could report
        else:
            # A signal the supervisor did not send is the code's own doing: SIGKILL,
            # SIGXCPU or SIGXFSZ sent to itself are an error naming the signal, never
            # memory, timeout or output (those come from the facts above only).
            kind = signal_kind(code)
        return ExecResult(
            ok=kind is None,
            stdout=stdout,
            stderr=stderr,
            returncode=code,
            timed_out=timed_out,
            latency_s=latency,
            truncated=bool(reply["truncated"]),
            error_kind=kind,
            isolation=level,
            degraded=degraded,
            delivered=delivered,
        )

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Kill every call in flight (their ``run`` raises ``SandboxError``) and the
        server; returns once they and the sandbox's temporary directory are gone.

        Safe to call again, also after a close cut short by an interrupt.
        """
        self._closed = True
        with self._lock:
            self._stop_server()
        self._executor.shutdown(wait=False)


_OPEN: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()  # for close_all()
