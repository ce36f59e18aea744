"""What a SandboxFusion reply (or its absence) means: the call's ``ExecResult``.

The reply has the shape of SandboxFusion's ``RunCodeResponse``
(``sandbox_fusion/models.py`` of the ``sandbox-fusion`` 0.3.7 client, and
``sandbox/server/sandbox_api.py`` of the service)::

    {"status": "Success" | "Failed" | "SandboxError", "message",
     "compile_result": null, "run_result": {"status": "Finished" |
     "TimeLimitExceeded" | "Error", "execution_time", "return_code",
     "stdout", "stderr"}, ...}

``Failed`` means the code exited non-zero or hit ``run_timeout``. Results are
classified like the local sandbox's: output is cut to the tail of
``max_output_bytes`` and sanitized as locally; output past the local file cap
is an ``OUTPUT`` error, as the write would have failed there. The isolation is
reported as ``"remote"``, never checked by us. Memory kills are never
inferred: no cgroup counter is visible from here, and an exit status (137, or
SIGKILL) is the code's to choose, so it is an error naming its status (a crash
for fault signals).

**Only this client's own evidence excludes.** A call that still fails returns
``ErrorKind.SANDBOX``; the rollout retries it and may exclude the trajectory
only if ``delivered`` is False, which this client says only when the request
never left it whole (``fusion_http.py`` decides). Everything after the last
byte was sent may be the code's doing, so it is ``delivered`` and counts as
the trajectory's failure. No reply within ``timeout + request_slack`` (our
timer) is the call's ``TIMEOUT``: the code was sent and may still be running.
"""

from __future__ import annotations

import logging
from typing import Any

from retool.protocol.sanitize import escape_control, sanitize_observation
from retool.sandbox import jsontail
from retool.sandbox.call import MAX_FILE_BYTES
from retool.sandbox.result import ErrorKind, ExecResult, sandbox_failure, signal_kind

log = logging.getLogger(__name__)

ISOLATION = "remote"  # ExecResult.isolation: whatever the service provides


def failure(why: str, latency: float, delivered: bool) -> ExecResult:
    """An infrastructure failure. ``delivered=False`` (which lets the rollout
    exclude the trajectory) only on this client's own evidence that the code
    never reached the service: no connection, or a request not sent whole."""
    return sandbox_failure(why, latency, isolation=ISOLATION, delivered=delivered)


def timed_out(why: str, latency: float) -> ExecResult:
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


def too_large(latency: float) -> ExecResult:
    """A reply past ``MAX_REPLY_BYTES``: the code printed too much."""
    return ExecResult(
        ok=False,
        stdout="",
        stderr="",
        returncode=None,
        timed_out=False,
        latency_s=latency,
        truncated=True,
        error_kind=ErrorKind.OUTPUT,
        isolation=ISOLATION,
    )


def _tail(text: Any, keep: int) -> tuple[str, bool, int]:
    """(the last ``keep`` bytes, sanitized; whether cut; the full size).

    A long string arrives as a :class:`jsontail.Cut` (its last ``keep``
    characters, so at least that many bytes, and the whole string's size)."""
    data = (text if isinstance(text, str) else "").encode("utf-8", errors="replace")
    size = text.size if isinstance(text, jsontail.Cut) else len(data)
    kept = data[-keep:]
    return (
        sanitize_observation(kept.decode("utf-8", errors="replace")),
        len(kept) < size,
        size,
    )


def to_result(reply: dict[str, Any], latency: float, keep: int) -> ExecResult:
    """The result, classified like the local sandbox's from what the service reports;
    ``keep``: the bytes of stdout and of stderr kept (``max_output_bytes``)."""
    run = reply.get("run_result")
    if reply["status"] not in ("Success", "Failed") or not isinstance(run, dict):
        return failure(
            f"SandboxFusion reply without a run result (status {reply['status']!r}): "
            f"{excerpt(reply.get('message'))}",
            latency,
            delivered=True,  # the code may have run
        )
    stdout, out_cut, out_size = _tail(run.get("stdout"), keep)
    stderr, err_cut, err_size = _tail(run.get("stderr"), keep)
    code = run.get("return_code")
    kind: ErrorKind | None
    if run.get("status") == "TimeLimitExceeded":
        kind, code = ErrorKind.TIMEOUT, -9
    elif run.get("status") != "Finished" or not isinstance(code, int):
        return failure(
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


def excerpt(value: Any, limit: int = 300) -> str:
    """``value`` (text or bytes the service sent) as one short, escaped line."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = escape_control(" ".join(str(value if value is not None else "").split()))
    return text if len(text) <= limit else text[:limit] + "..."
