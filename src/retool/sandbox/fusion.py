"""``FusionSandbox``: model code run by a SandboxFusion service over HTTP.

Same interface and results as :class:`~retool.sandbox.LocalSandbox` (``run``,
``arun``, ``close``, ``stats``, ``timeout``...), so ``sandbox.backend =
"sandboxfusion"`` changes nothing else in a run. One ``POST /run_code`` per
call, with the request and response shape of SandboxFusion's ``RunCodeRequest``
/ ``RunCodeResponse`` (``sandbox_fusion/models.py`` of the ``sandbox-fusion``
0.3.7 client, and ``sandbox/server/sandbox_api.py`` of the service).

One module a job:

- ``fusion_endpoint.py``: ``sandbox.url``, checked (:func:`parse_endpoint`).
- ``fusion_program.py``: what is sent: the snippet wrapped in the local fork
  server's own runtime and auto-print, so the same code gives the same output.
- ``fusion_http.py``: how it is sent: plain ``http.client``, a pool of
  keep-alive connections, retries on transport failures only, and the
  evidence of whether the request left this client whole.
- ``fusion_results.py``: what the reply (or its absence) means: the
  ``ExecResult``, classified like the local sandbox's, and which failures let
  the rollout exclude a trajectory (only this client's own evidence).

This one checks the settings (the shared ranges of
:mod:`retool.sandbox.limits`, as for ``LocalSandbox``), refuses code over
``MAX_CODE_BYTES`` or not UTF-8 text before anything is sent
(:mod:`retool.sandbox.client`, shared with ``LocalSandbox``), runs one test
snippet at construction so a wrong ``sandbox.url`` fails before the first
step, and ties the parts together for each call.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from retool.checks import check_number
from retool.errors import SandboxError
from retool.sandbox.client import SandboxClient
from retool.sandbox.fusion_endpoint import parse_endpoint
from retool.sandbox.fusion_http import Final, FusionTransport, NoReply, TooLarge
from retool.sandbox.fusion_program import run_code_request
from retool.sandbox.fusion_results import ISOLATION, failure, timed_out, to_result, too_large
from retool.sandbox.limits import (
    MAX_OUTPUT_BYTES,
    MAX_REQUEST_RETRIES,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MEMORY_MB_RANGE,
)
from retool.sandbox.result import ErrorKind, ExecResult
from retool.sandbox.stats import SandboxStats


class FusionSandbox(SandboxClient):
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

    _label = "FusionSandbox"

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
        self._http = FusionTransport(
            self.endpoint,
            max_workers=self.max_workers,
            keep=self.max_output_bytes,
            retries=self.request_retries,
            backoff=self.request_backoff,
            connect_timeout=self.connect_timeout,
        )
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

    @property
    def connections_opened(self) -> int:
        """TCP connections made (at most ``max_workers`` live)."""
        return self._http.connections_opened

    @property
    def attempts(self) -> int:
        """HTTP requests sent, retries included."""
        return self._http.attempts

    # -- running code ---------------------------------------------------------
    def _isolation(self) -> tuple[str, bool]:
        return self.isolation_level, self.degraded

    def _check_open(self) -> None:
        self._http.check_open()

    def _execute(self, code: str, limit: float) -> ExecResult:
        """One call on the service. Infrastructure failures come back as
        ``ErrorKind.SANDBOX`` results, after the transport's retries."""
        body = run_code_request(code, limit, self.memory_mb)
        started = time.monotonic()
        try:
            reply = self._http.post(body, limit + self.request_slack)
        except NoReply as exc:  # our own timer: the code may still be running there
            return timed_out(str(exc), time.monotonic() - started)
        except Final as exc:
            return failure(str(exc), time.monotonic() - started, delivered=exc.sent)
        except TooLarge:
            return too_large(time.monotonic() - started)
        return to_result(reply, time.monotonic() - started, self.max_output_bytes)

    # -- lifecycle --------------------------------------------------------------
    def close(self) -> None:
        """Abort every call in flight (their ``run`` raises ``SandboxError``) and drop
        the pool; returns at once. What already runs on the service runs to its end."""
        if self._http.closed:
            return
        self._http.close()
        self._executor.shutdown(wait=False)
