"""The SandboxFusion client's HTTP: a pool of keep-alive connections, and retries.

**Plain HTTP, not the ``sandbox-fusion`` client.** That package retries every
exception (also a 4xx) up to five times with waits of up to a minute, opens a
new connection (``requests.post``) or a new ``aiohttp`` session per call, so
nothing is pooled, and pulls in ``aiohttp``, ``tenacity`` and pydantic. Its
models lack ``memory_limit_MB``. The standard library's ``http.client`` does
what we need with no new dependency: a pool of keep-alive connections (at most
``max_workers``, one per call in flight), our own retry rules, and a socket we
can shut down from ``close()``.

The service answers HTTP 200 even for ``SandboxError`` (its runner failed, not
the code). **Retries on transport failures only**, with exponential backoff
and jitter: a refused or dropped connection, an HTTP 5xx, or a
``SandboxError`` reply. A reply that says the code ran (``Success``/``Failed``)
is final, a 4xx is final, and a call with no reply within ``timeout +
request_slack`` is not repeated (it already waited its whole budget). A
pooled connection the server closed while idle is replaced at once, without
counting as a retry. Calls are stateless on the service, so running a snippet
again has no effect the model could see.

**What was sent** is this module's evidence, carried by every failure
(``Failure.sent``): the request never left whole (no connection, TLS refused,
sending failed), or it did. Everything after the last byte was sent may be
the code's doing (a 5xx or 4xx, a ``SandboxError``, a dropped connection, a
broken reply: code can crash a runner, and a filter in front of the service
judges the code's text), so the client counts it as delivered
(``fusion_results.py``).
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import socket
import ssl
import threading
from typing import Any

from retool.errors import SandboxError
from retool.sandbox import jsontail
from retool.sandbox.call import MAX_FILE_BYTES
from retool.sandbox.fusion_endpoint import Endpoint
from retool.sandbox.fusion_results import excerpt

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 4 * MAX_FILE_BYTES + (1 << 20)  # both streams at the local cap, JSON-escaped
_MAX_ENVELOPE_BYTES = 1 << 20  # a reply's JSON but the long strings' contents
_MAX_ERROR_BYTES = 1 << 16  # read of a non-200 reply's body
_MAX_BACKOFF_S = 30.0  # longest wait before a retry, whatever request_backoff says


class Failure(Exception):
    """A transport or service failure; ``sent``: the whole request had left this
    client, so the service may have run the code (nothing else proves it did not)."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.sent = sent


class Retry(Failure):
    """A transport failure: the call may be sent again."""


class Final(Failure):
    """An infrastructure failure that another attempt would not fix."""


class NoReply(Final):
    """Sent, and no reply within the call's timeout plus ``request_slack``."""


class TooLarge(Exception):
    """The reply exceeds ``MAX_REPLY_BYTES``: the code printed too much."""


class FusionTransport:
    """``POST /run_code`` to one endpoint: pooled connections, retries, ``close()``.

    ``max_workers`` requests at once (one pooled connection each); ``keep``:
    the characters kept of a reply's long strings (stdout, stderr);
    ``retries`` and ``backoff``: extra attempts after a transport failure and
    the wait before the first (doubling, at most 30 s, with jitter);
    ``connect_timeout``: seconds to open a connection.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        max_workers: int,
        keep: int,
        retries: int,
        backoff: float,
        connect_timeout: float,
    ) -> None:
        self.endpoint = endpoint
        self.url = endpoint.url
        self.keep = keep
        self.retries = retries
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self.connections_opened = 0  # TCP connections made (at most max_workers live)
        self.attempts = 0  # HTTP requests sent, retries included
        self._slots = threading.BoundedSemaphore(max_workers)
        self._idle: list[http.client.HTTPConnection] = []
        self._active: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._jitter = random.Random()
        self._tls = ssl.create_default_context() if endpoint.https else None

    def post(self, body: bytes, read_timeout: float) -> dict[str, Any]:
        """The service's reply to ``body``, after at most ``retries`` retries.

        Raises ``Final`` (``NoReply`` when no reply came in time) or ``TooLarge``
        when there is no reply to return, ``SandboxError`` once ``close()`` began.
        """
        attempts = 1 + self.retries
        why, sent = "", False  # sent: some attempt's request reached the service whole
        for attempt in range(attempts):
            if attempt:
                delay = min(_MAX_BACKOFF_S, self.backoff * 2 ** (attempt - 1))
                if self._closed.wait(delay * (0.5 + 0.5 * self._jitter.random())):
                    self.check_open()
                log.warning("retrying a SandboxFusion call (%d/%d): %s", attempt, attempts - 1, why)
            with self._slots:
                self.check_open()
                try:
                    status, data = self._exchange(body, read_timeout)
                except Retry as exc:
                    why, sent = str(exc), sent or exc.sent
                    continue
                except Final as exc:
                    raise type(exc)(str(exc), sent or exc.sent) from None
            # Any answer comes after the whole request was sent: the service had the
            # code, and what it answers (a 5xx, a 4xx from a filter in front of it, a
            # SandboxError, a broken reply) may be the code's doing.
            sent = True
            if status >= 500:
                why = f"SandboxFusion answered HTTP {status}: {excerpt(data)}"
                continue
            if status != 200:
                hint = " (is sandbox.url the service's address?)" if status in (404, 405) else ""
                raise Final(f"SandboxFusion answered HTTP {status}{hint}: {excerpt(data)}", sent)
            try:
                reply = data
                outcome = reply["status"]
            except (TypeError, KeyError):
                why = f"SandboxFusion sent a malformed reply: {excerpt(data)}"
                raise Final(why, sent) from None
            if outcome == "SandboxError":
                why = f"SandboxFusion reported SandboxError: {excerpt(reply.get('message'))}"
                continue
            return reply
        raise Final(f"{why} (after {attempts} attempt{'s' * (attempts > 1)})", sent)

    def _exchange(self, body: bytes, read_timeout: float) -> tuple[int, Any]:
        """One POST: (HTTP status, the decoded reply for 200, else the body's start).

        Raises ``Retry`` when nothing came back, ``TooLarge`` past
        ``MAX_REPLY_BYTES``, ``Final`` for a reply that is not JSON. A reply
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
                except Failure as exc:  # a first connection may have delivered already
                    raise type(exc)(str(exc), sent) from None
                conn.sock.settimeout(read_timeout)
                with self._lock:
                    self.attempts += 1
                try:
                    # Sending: until its last byte has left, the service cannot parse
                    # the request, let alone run it. A failure here is our evidence.
                    conn.request("POST", self.endpoint.path, body, headers)
                except (OSError, http.client.HTTPException) as exc:
                    self.check_open()
                    if reused and not fresh:
                        self._discard(conn)
                        continue
                    raise Retry(
                        f"sending to SandboxFusion at {self.url} failed: {_reason(exc)}", sent
                    ) from None
                sent = True
                try:
                    response = conn.getresponse()
                    data: Any = self._read_body(response)
                except TimeoutError:
                    raise NoReply(
                        f"no reply from SandboxFusion at {self.url} within {read_timeout:g} s",
                        sent,
                    ) from None
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    self.check_open()
                    if reused and not fresh:  # most likely closed while idle; maybe not
                        self._discard(conn)
                        continue
                    raise Retry(
                        f"SandboxFusion at {self.url} dropped the connection", sent
                    ) from None
                except (OSError, http.client.HTTPException) as exc:
                    self.check_open()
                    raise Retry(
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
                keep=self.keep,
                envelope=_MAX_ENVELOPE_BYTES,
                limit=MAX_REPLY_BYTES,
            )
        except OverflowError:
            raise TooLarge() from None
        except ValueError as exc:  # not JSON (UnicodeDecodeError included)
            raise Final(f"SandboxFusion sent a malformed reply: {exc}", True) from None

    # -- the connection pool ----------------------------------------------------
    def _connect(self, conn: http.client.HTTPConnection) -> None:
        """Open ``conn`` unless it is a pooled one; nothing is sent yet, so a failure retries."""
        if conn.sock is not None:
            return
        try:
            conn.connect()
        except ssl.SSLError as exc:  # a certificate or protocol mismatch does not go away
            why = f"TLS with SandboxFusion at {self.url} failed: {_reason(exc)}"
            raise Final(why, False) from None
        except (OSError, http.client.HTTPException) as exc:
            self.check_open()
            why = f"cannot connect to SandboxFusion at {self.url}: {_reason(exc)}"
            raise Retry(why, False) from None
        with self._lock:
            self.connections_opened += 1

    def _checkout(self, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            self.check_open()
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

    def check_open(self) -> None:
        if self._closed.is_set():
            raise SandboxError("the sandbox is closed")

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has begun."""
        return self._closed.is_set()

    def close(self) -> None:
        """Abort every request in flight (``SandboxError`` in its caller) and drop the pool."""
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


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
