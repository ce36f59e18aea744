"""``FusionSandbox``: model code run by a SandboxFusion service over HTTP.

Same interface and results as :class:`~retool.sandbox.LocalSandbox` (``run``,
``arun``, ``close``, ``stats``, ``timeout``...), so ``sandbox.backend =
"sandboxfusion"`` changes nothing else in a run. One ``POST /run_code`` per
call, with the request and response shape of SandboxFusion's ``RunCodeRequest``
/ ``RunCodeResponse`` (``sandbox_fusion/models.py`` of the ``sandbox-fusion``
0.3.7 client, and ``sandbox/server/sandbox_api.py`` of the service)::

    -> {"code", "language": "python", "run_timeout", "compile_timeout",
        "memory_limit_MB", "stdin", "files": {}, "fetch_files": []}
    <- {"status": "Success" | "Failed" | "SandboxError", "message",
        "compile_result": null, "run_result": {"status": "Finished" |
        "TimeLimitExceeded" | "Error", "execution_time", "return_code",
        "stdout", "stderr"}, ...}

The service answers HTTP 200 even for ``SandboxError`` (its runner failed, not
the code); ``Failed`` means the code exited non-zero or hit ``run_timeout``.
``memory_limit_MB`` is only known to newer services; older ones ignore it.

**Plain HTTP, not the ``sandbox-fusion`` client.** That package retries every
exception (also a 4xx) up to five times with waits of up to a minute, opens a
new connection (``requests.post``) or a new ``aiohttp`` session per call, so
nothing is pooled, and pulls in ``aiohttp``, ``tenacity`` and pydantic. Its
models lack ``memory_limit_MB``. The standard library's ``http.client`` does
what we need with no new dependency: a pool of keep-alive connections (at most
``max_workers``, one per call in flight), our own retry rules, and a socket we
can shut down from ``close()``.

**Same code, same output.** Code over ``MAX_CODE_BYTES`` or not UTF-8 text
is refused before anything is sent, with the local sandbox's result
(:func:`retool.sandbox.limits.screen_code`); the settings are checked against
the same ranges. The snippet is sent wrapped in a small driver
(:func:`remote_program`) that runs it exactly as the local fork server does:
compiled as ``<code>`` after the same AST auto-print
(:mod:`retool.sandbox.autoprint`, shipped as source), by the fork server's own
runtime (:mod:`retool.sandbox.runtime`, shipped as source too), so a failure
shows only the code's frames and its libraries' (never the driver's, also
when the code closes stderr, empties ``sys.modules`` or replaces ``os._exit``
or ``traceback``), compile failures as the code's own error, the same
``SystemExit`` handling and exit status, and
the local calls' thread caps and matplotlib backend in ``os.environ``. Output
is cut to the tail of ``max_output_bytes`` and sanitized as locally. What
differs is the service's: its interpreter and packages (nothing is
preloaded, so ``import sympy`` counts against the timeout), its isolation
(reported as ``"remote"``, never checked by us), what ``memory_limit_MB``
bounds there, and memory kills, which are never inferred: no cgroup counter
is visible from here, and an exit status (137, or SIGKILL) is the code's to
choose, so it is an error naming its status (a crash for fault signals).

**Retries on transport failures only**, with exponential backoff and jitter:
a refused or dropped connection, an HTTP 5xx, or a ``SandboxError`` reply.
A reply that says the code ran (``Success``/``Failed``) is final, a 4xx is
final, and a call with no reply within ``timeout + request_slack`` is not
repeated (it already waited its whole budget).

**Only this client's own evidence excludes.** A call that still fails returns
``ErrorKind.SANDBOX``; the rollout retries it and may exclude the trajectory
only if ``delivered`` is False, which this client says only when the request
never left it whole (no connection, TLS refused, sending failed). Everything
after the last byte was sent may be the code's doing (a 5xx or 4xx, a
``SandboxError``, a dropped connection, a broken reply: code can crash a
runner, and a filter in front of the service judges the code's text), so it
is ``delivered`` and counts as the trajectory's failure. No reply within
``timeout + request_slack`` (our timer) is the call's ``TIMEOUT``: the code
was sent and may still be running. A pooled connection the server closed while idle is
replaced at once, without counting as a retry. Calls are stateless on the
service, so running a snippet again has no effect the model could see.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import random
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from retool.checks import check_number
from retool.errors import ConfigError, SandboxError
from retool.protocol.sanitize import escape_control, sanitize_observation
from retool.sandbox import jsontail
from retool.sandbox.call import MAX_FILE_BYTES
from retool.sandbox.limits import (
    MAX_OUTPUT_BYTES,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MEMORY_MB_RANGE,
    screen_code,
)
from retool.sandbox.local import sandbox_env
from retool.sandbox.result import ErrorKind, ExecResult, signal_kind
from retool.sandbox.stats import SandboxStats

log = logging.getLogger(__name__)

ISOLATION = "remote"  # ExecResult.isolation: whatever the service provides
MAX_REPLY_BYTES = 4 * MAX_FILE_BYTES + (1 << 20)  # both streams at the local cap, JSON-escaped
_MAX_ENVELOPE_BYTES = 1 << 20  # a reply's JSON but the long strings' contents
_MAX_ERROR_BYTES = 1 << 16  # read of a non-200 reply's body
MAX_REQUEST_RETRIES = 100  # retries of one call (more against a down service is a hang)
_MAX_BACKOFF_S = 30.0  # longest wait before a retry, whatever request_backoff says

# What the local sandbox sets for every call that matters on another machine too: one
# thread per numeric library, a headless matplotlib.
_CALL_ENV = {
    k: v for k, v in sandbox_env().items() if k.endswith("_NUM_THREADS") or k == "MPLBACKEND"
}
# Shipped as source to the service: the auto-print and the runtime the local fork
# server imports (one module, runtime.py, for both), so the code runs the same way.
_HERE = Path(__file__).resolve().parent
_AUTOPRINT_SOURCE = (_HERE / "autoprint.py").read_text(encoding="utf-8")
_RUNTIME_SOURCE = (_HERE / "runtime.py").read_text(encoding="utf-8")


def remote_program(code: str) -> str:
    """The Python file sent for ``code``: :mod:`retool.sandbox.runtime`, run on the code.

    Every part is an ASCII literal, so the service's file encoding cannot
    matter (``ascii()`` is lossless). The runtime runs in a namespace of its
    own named ``retool_runtime`` (its guard then runs the code), not in the
    file's ``__main__``, which the code can import.
    """
    return (
        f"_AUTOPRINT = {_AUTOPRINT_SOURCE!a}\n_CODE = {code!a}\n_ENV = {_CALL_ENV!a}\n"
        f"_RUNTIME = {_RUNTIME_SOURCE!a}\n"
        'exec(compile(_RUNTIME, "<retool-runtime>", "exec"), {"__name__": "retool_runtime", '
        '"_AUTOPRINT": _AUTOPRINT, "_CODE": _CODE, "_ENV": _ENV})\n'
    )


@dataclass(frozen=True)
class Endpoint:
    """Where ``POST /run_code`` goes."""

    url: str  # as configured, for messages
    https: bool  # TLS (certificates checked against the system store)
    host: str  # host name or address
    port: int  # TCP port
    path: str  # request target: ".../run_code" plus the query, if any


def parse_endpoint(url: str, field: str = "sandbox.url") -> Endpoint:
    """``url`` (the service's base URL or its ``/run_code`` endpoint), checked.

    Raises ``ConfigError`` naming ``field``: http(s) only, a host, a valid port,
    no credentials (they would show up in every error message).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(
            f'{field} is required with sandbox.backend = "sandboxfusion" '
            "(for example http://localhost:8080)"
        )
    url = url.strip()
    try:  # urlsplit raises on http://[::1/ or http://[zz]:80, .port on a bad port
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 - checks a [bracketed] host
    except ValueError as exc:
        raise ConfigError(f"{field} is not a valid URL ({exc}): {url!r}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{field} must be an http:// or https:// URL, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{field} has an invalid port: {url!r}") from None
    if port == 0:
        raise ConfigError(f"{field} has an invalid port: {url!r}")
    if not parts.hostname:
        raise ConfigError(f"{field} must name a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{field} must not contain credentials (user:password@)")
    if parts.fragment:
        raise ConfigError(f"{field} must not have a #fragment, got {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/run_code"):
        path += "/run_code"
    if parts.query:
        path += "?" + parts.query
    https = parts.scheme == "https"
    return Endpoint(url, https, parts.hostname, port or (443 if https else 80), path)


class _Failure(Exception):
    """A transport or service failure; ``sent``: the whole request had left this
    client, so the service may have run the code (nothing else proves it did not)."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.sent = sent


class _Retry(_Failure):
    """A transport failure: the call may be sent again."""


class _Final(_Failure):
    """An infrastructure failure that another attempt would not fix."""


class _NoReply(_Final):
    """Sent, and no reply within the call's timeout plus ``request_slack``."""


class _TooLarge(Exception):
    """The reply exceeds ``MAX_REPLY_BYTES``: the code printed too much."""


class FusionSandbox:
    """Runs snippets on a SandboxFusion service; the interface of ``LocalSandbox``.

    Arguments (each checked at construction, a :class:`ConfigError` naming it
    otherwise; the shared ranges are :mod:`retool.sandbox.limits`'s, as for
    ``LocalSandbox``):

    - ``url``: the service's http(s) base URL or its ``/run_code`` endpoint.
    - ``timeout``: wall-clock seconds per call (``run_timeout``), in (0, 86400].
    - ``memory_mb``: sent as ``memory_limit_MB``, in [16, 1048576]; the service
      applies it as it is deployed (older services ignore it).
    - ``max_workers``: calls in flight at once (pooled connections), in [1, 256].
    - ``max_output_bytes``: tail kept of stdout and of stderr, in [1, 8 MiB].
    - ``request_slack``: seconds a reply may take beyond the call's timeout, in
      (0, 86400]; ``connect_timeout`` likewise for opening a connection.
    - ``request_retries``: extra attempts after a transport failure, in [0, 100];
      ``request_backoff``: seconds before the first (doubling, at most 30 per
      wait), in [0, 86400].
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        memory_mb: int = 1024,
        max_workers: int = 8,
        max_output_bytes: int = 16384,
        request_slack: float = 60.0,
        request_retries: int = 3,
        request_backoff: float = 0.5,
        connect_timeout: float = 10.0,
        check: bool = True,
    ) -> None:
        """Connect to ``url`` and, with ``check``, run one test snippet there.

        Raises ``ConfigError`` for a bad setting and ``SandboxError`` when the
        service cannot be reached or cannot run the test snippet (wrong URL,
        service down), so a misconfigured run fails before its first step.
        """
        check_number("FusionSandbox timeout (seconds)", timeout, 0, MAX_TIMEOUT_S, low_open=True)
        check_number("FusionSandbox memory_mb", memory_mb, *MEMORY_MB_RANGE, integer=True)
        check_number("FusionSandbox max_workers", max_workers, 1, MAX_WORKERS, integer=True)
        check_number(
            "FusionSandbox max_output_bytes", max_output_bytes, 1, MAX_OUTPUT_BYTES, integer=True
        )
        for name, seconds in (
            ("request_slack", request_slack),
            ("connect_timeout", connect_timeout),
        ):
            check_number(
                f"FusionSandbox {name} (seconds)", seconds, 0, MAX_TIMEOUT_S, low_open=True
            )
        check_number(
            "FusionSandbox request_retries", request_retries, 0, MAX_REQUEST_RETRIES, integer=True
        )
        check_number("FusionSandbox request_backoff (seconds)", request_backoff, 0, MAX_TIMEOUT_S)
        self.endpoint = parse_endpoint(url)
        self.url = self.endpoint.url
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.max_workers = int(max_workers)
        self.max_output_bytes = int(max_output_bytes)
        self.request_slack = float(request_slack)
        self.request_retries = int(request_retries)
        self.request_backoff = float(request_backoff)
        self.connect_timeout = float(connect_timeout)
        self.stats = SandboxStats()
        # What LocalSandbox reports about its isolation; here the service's business.
        self.isolation_level = ISOLATION
        self.degraded = False
        self.missing: list[str] = []
        self.layers: list[str] = []
        self.preloaded: list[str] = []
        self.connections_opened = 0  # TCP connections made (at most max_workers live)
        self.attempts = 0  # HTTP requests sent, retries included
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._idle: list[http.client.HTTPConnection] = []
        self._active: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._jitter = random.Random()
        self._tls = ssl.create_default_context() if self.endpoint.https else None
        self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="sandboxfusion")
        if check:
            try:
                self._check()
            except BaseException:
                self.close()
                raise

    def _check(self) -> None:
        probe = self._execute("print(6 * 7)", self.timeout)
        if probe.error_kind == ErrorKind.SANDBOX:
            raise SandboxError(f"cannot use sandbox.url: {probe.stderr}")
        if not probe.ok or probe.stdout != "42\n":
            detail = (probe.stderr or probe.stdout).strip()[-300:]
            raise SandboxError(
                f"SandboxFusion at {self.url} could not run a test snippet "
                f"({probe.error_kind or 'wrong output'}): {detail}"
            )

    # -- running code ---------------------------------------------------------
    def _screen(self, code: object, timeout: object) -> tuple[float, ExecResult | None]:
        """The call's time limit, and the refusal of code that must not be sent."""
        limit = self.timeout
        if timeout is not None:
            check_number("FusionSandbox.run timeout", timeout, 0, MAX_TIMEOUT_S, low_open=True)
            limit = float(timeout)  # type: ignore[arg-type]  # checked: a real number
        return limit, screen_code(code, self.isolation_level, self.degraded)

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` on the service and wait for its result.

        Infrastructure failures come back as ``ErrorKind.SANDBOX`` results
        (after this client's transport retries). Code larger than
        ``MAX_CODE_BYTES`` or not UTF-8 text is refused unsent
        (``ErrorKind.ERROR``, as by ``LocalSandbox``); a ``code`` that is not a
        ``str`` raises ``ConfigError``. Raises ``SandboxError`` after (or
        during) ``close()``.
        """
        self._check_open()
        limit, refused = self._screen(code, timeout)
        if refused is not None:
            self.stats.record(refused)
            return refused
        result = self._execute(code, limit)
        self.stats.record(result)
        return result

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        """``run`` from an event loop, without blocking it."""
        self._check_open()
        self._screen(code, timeout)  # argument errors raise here, in the caller
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run, code, timeout)

    def _execute(self, code: str, limit: float) -> ExecResult:
        payload = {
            "code": remote_program(code),
            "language": "python",
            "run_timeout": limit,
            "compile_timeout": limit,
            "memory_limit_MB": self.memory_mb,
            "stdin": None,
            "files": {},
            "fetch_files": [],
        }
        body = json.dumps(payload).encode()
        started = time.monotonic()
        try:
            reply = self._call(body, limit + self.request_slack)
        except _NoReply as exc:  # our own timer: the code may still be running there
            return self._timed_out(str(exc), time.monotonic() - started)
        except _Final as exc:
            return self._failure(str(exc), time.monotonic() - started, delivered=exc.sent)
        except _TooLarge:
            return ExecResult(
                ok=False,
                stdout="",
                stderr="",
                returncode=None,
                timed_out=False,
                latency_s=time.monotonic() - started,
                truncated=True,
                error_kind=ErrorKind.OUTPUT,
                isolation=ISOLATION,
            )
        return self._to_result(reply, time.monotonic() - started)

    def _call(self, body: bytes, read_timeout: float) -> dict[str, Any]:
        """The service's reply to ``body``, after at most ``request_retries`` retries."""
        attempts = 1 + self.request_retries
        why, sent = "", False  # sent: some attempt's request reached the service whole
        for attempt in range(attempts):
            if attempt:
                delay = min(_MAX_BACKOFF_S, self.request_backoff * 2 ** (attempt - 1))
                if self._closed.wait(delay * (0.5 + 0.5 * self._jitter.random())):
                    self._check_open()
                log.warning("retrying a SandboxFusion call (%d/%d): %s", attempt, attempts - 1, why)
            with self._slots:
                self._check_open()
                try:
                    status, data = self._exchange(body, read_timeout)
                except _Retry as exc:
                    why, sent = str(exc), sent or exc.sent
                    continue
                except _Final as exc:
                    raise type(exc)(str(exc), sent or exc.sent) from None
            # Any answer comes after the whole request was sent: the service had the
            # code, and what it answers (a 5xx, a 4xx from a filter in front of it, a
            # SandboxError, a broken reply) may be the code's doing.
            sent = True
            if status >= 500:
                why = f"SandboxFusion answered HTTP {status}: {_excerpt(data)}"
                continue
            if status != 200:
                hint = " (is sandbox.url the service's address?)" if status in (404, 405) else ""
                raise _Final(f"SandboxFusion answered HTTP {status}{hint}: {_excerpt(data)}", sent)
            try:
                reply = data
                outcome = reply["status"]
            except (TypeError, KeyError):
                why = f"SandboxFusion sent a malformed reply: {_excerpt(data)}"
                raise _Final(why, sent) from None
            if outcome == "SandboxError":
                why = f"SandboxFusion reported SandboxError: {_excerpt(reply.get('message'))}"
                continue
            return reply
        raise _Final(f"{why} (after {attempts} attempt{'s' * (attempts > 1)})", sent)

    def _exchange(self, body: bytes, read_timeout: float) -> tuple[int, Any]:
        """One POST: (HTTP status, the decoded reply for 200, else the body's start).

        Raises ``_Retry`` when nothing came back, ``_TooLarge`` past
        ``MAX_REPLY_BYTES``, ``_Final`` for a reply that is not JSON. A reply
        is read in pieces and only the tails this client keeps of its long
        strings (stdout, stderr) are held (:mod:`retool.sandbox.jsontail`), so
        memory per call does not grow with what the code printed.

        A pooled connection that fails before the reply's first byte was most
        likely closed by the server while idle: one fresh connection follows
        at once, not counted as a retry.
        """
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        sent = False  # the whole request left this client, on either connection
        for fresh in (False, True):
            conn, reused = self._checkout(fresh)
            try:
                try:
                    self._connect(conn)
                except _Failure as exc:  # a first connection may have delivered already
                    raise type(exc)(str(exc), sent) from None
                conn.sock.settimeout(read_timeout)
                with self._lock:
                    self.attempts += 1
                try:
                    # Sending: until its last byte has left, the service cannot parse
                    # the request, let alone run it. A failure here is our evidence.
                    conn.request("POST", self.endpoint.path, body, headers)
                except (OSError, http.client.HTTPException) as exc:
                    self._check_open()
                    if reused and not fresh:
                        self._discard(conn)
                        continue
                    raise _Retry(
                        f"sending to SandboxFusion at {self.url} failed: {_reason(exc)}", sent
                    ) from None
                sent = True
                try:
                    response = conn.getresponse()
                    data: Any = self._read_body(response)
                except TimeoutError:
                    raise _NoReply(
                        f"no reply from SandboxFusion at {self.url} within {read_timeout:g} s",
                        sent,
                    ) from None
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    self._check_open()
                    if reused and not fresh:  # most likely closed while idle; maybe not
                        self._discard(conn)
                        continue
                    raise _Retry(
                        f"SandboxFusion at {self.url} dropped the connection", sent
                    ) from None
                except (OSError, http.client.HTTPException) as exc:
                    self._check_open()
                    raise _Retry(
                        f"the exchange with SandboxFusion failed: {_reason(exc)}", sent
                    ) from None
            except BaseException:
                self._discard(conn)
                raise
            if response.will_close or not response.isclosed():  # an error page left unread
                self._discard(conn)
            else:
                self._checkin(conn)
            return response.status, data
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_body(self, response: http.client.HTTPResponse) -> Any:
        if response.status != 200:  # an error page: its start is all a message shows
            return response.read(_MAX_ERROR_BYTES)
        try:
            return jsontail.read(
                response.read,
                keep=self.max_output_bytes,
                envelope=_MAX_ENVELOPE_BYTES,
                limit=MAX_REPLY_BYTES,
            )
        except OverflowError:
            raise _TooLarge() from None
        except ValueError as exc:  # not JSON (UnicodeDecodeError included)
            raise _Final(f"SandboxFusion sent a malformed reply: {exc}", True) from None

    # -- the connection pool ----------------------------------------------------
    def _connect(self, conn: http.client.HTTPConnection) -> None:
        """Open ``conn`` unless it is a pooled one; nothing is sent yet, so a failure retries."""
        if conn.sock is not None:
            return
        try:
            conn.connect()
        except ssl.SSLError as exc:  # a certificate or protocol mismatch does not go away
            why = f"TLS with SandboxFusion at {self.url} failed: {_reason(exc)}"
            raise _Final(why, False) from None
        except (OSError, http.client.HTTPException) as exc:
            self._check_open()
            why = f"cannot connect to SandboxFusion at {self.url}: {_reason(exc)}"
            raise _Retry(why, False) from None
        with self._lock:
            self.connections_opened += 1

    def _checkout(self, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            self._check_open()
            conn = None if fresh or not self._idle else self._idle.pop()
            if conn is None:
                ep = self.endpoint
                if self._tls is not None:
                    conn = http.client.HTTPSConnection(
                        ep.host, ep.port, timeout=self.connect_timeout, context=self._tls
                    )
                else:
                    conn = http.client.HTTPConnection(
                        ep.host, ep.port, timeout=self.connect_timeout
                    )
                reused = False
            else:
                reused = True
            self._active.add(conn)
            return conn, reused

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._active.discard(conn)
            if self._closed.is_set():
                conn.close()
            else:
                self._idle.append(conn)

    def _discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._active.discard(conn)
        conn.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise SandboxError("the sandbox is closed")

    # -- results ----------------------------------------------------------------
    def _failure(self, why: str, latency: float, delivered: bool) -> ExecResult:
        """An infrastructure failure. ``delivered=False`` (which lets the rollout
        exclude the trajectory) only on this client's own evidence that the code
        never reached the service: no connection, or a request not sent whole."""
        return ExecResult(
            False,
            "",
            why,
            None,
            False,
            latency,
            False,
            ErrorKind.SANDBOX,
            isolation=ISOLATION,
            delivered=delivered,
        )

    def _timed_out(self, why: str, latency: float) -> ExecResult:
        """No reply within the timeout plus slack, by this client's own timer: the
        code was sent and may be running still, so it is the call's timeout (the
        trajectory's failure, as a local call past its limit), never an exclusion."""
        log.warning("%s: counted as the call's timeout", why)
        return ExecResult(
            False,
            "",
            "",
            None,
            True,
            latency,
            False,
            ErrorKind.TIMEOUT,
            isolation=ISOLATION,
            delivered=True,
        )

    def _tail(self, text: Any) -> tuple[str, bool, int]:
        """(the last ``max_output_bytes`` bytes, sanitized; whether cut; the full size).

        A long string arrives as a :class:`jsontail.Cut` (its last
        ``max_output_bytes`` characters, so at least that many bytes, and the
        whole string's size)."""
        data = (text if isinstance(text, str) else "").encode("utf-8", errors="replace")
        size = text.size if isinstance(text, jsontail.Cut) else len(data)
        kept = data[-self.max_output_bytes :]
        return (
            sanitize_observation(kept.decode("utf-8", errors="replace")),
            len(kept) < size,
            size,
        )

    def _to_result(self, reply: dict[str, Any], latency: float) -> ExecResult:
        """The result, classified like the local sandbox's from what the service reports."""
        run = reply.get("run_result")
        if reply["status"] not in ("Success", "Failed") or not isinstance(run, dict):
            return self._failure(
                f"SandboxFusion reply without a run result (status {reply['status']!r}): "
                f"{_excerpt(reply.get('message'))}",
                latency,
                delivered=True,  # the code may have run
            )
        stdout, out_cut, out_size = self._tail(run.get("stdout"))
        stderr, err_cut, err_size = self._tail(run.get("stderr"))
        code = run.get("return_code")
        kind: ErrorKind | None
        if run.get("status") == "TimeLimitExceeded":
            kind, code = ErrorKind.TIMEOUT, -9
        elif run.get("status") != "Finished" or not isinstance(code, int):
            return self._failure(
                f"SandboxFusion run status {run.get('status')!r}, return code {code!r}",
                latency,
                delivered=True,  # the code may have run
            )
        elif max(out_size, err_size) >= MAX_FILE_BYTES:
            kind = ErrorKind.OUTPUT  # past the local file cap; there the write would have failed
        elif code == 0:
            kind = None
        else:
            # The service's exit status is the code's to choose (``sys.exit(137)``,
            # a signal sent to itself): an error (a crash for fault signals), never
            # memory or timeout, which only the service's own status may say.
            kind = signal_kind(code)
        return ExecResult(
            ok=kind is None,
            stdout=stdout,
            stderr=stderr,
            returncode=code,
            timed_out=kind == ErrorKind.TIMEOUT,
            latency_s=latency,
            truncated=out_cut or err_cut,
            error_kind=kind,
            isolation=ISOLATION,
            degraded=False,
        )

    # -- lifecycle --------------------------------------------------------------
    def close(self) -> None:
        """Abort every call in flight (their ``run`` raises ``SandboxError``) and drop
        the pool; returns at once. What already runs on the service runs to its end."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            idle, self._idle = self._idle, []
            active = list(self._active)
        for conn in idle:
            conn.close()
        for conn in active:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._executor.shutdown(wait=False)

    def __enter__(self) -> FusionSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _excerpt(value: Any, limit: int = 300) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = escape_control(" ".join(str(value if value is not None else "").split()))
    return text if len(text) <= limit else text[:limit] + "..."


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
