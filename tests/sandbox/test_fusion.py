"""FusionSandbox against a small SandboxFusion stand-in on 127.0.0.1.

The stand-in speaks the documented ``POST /run_code`` shape
(``sandbox_fusion/models.py``, whose pydantic models validate every request
and reply when the ``sandbox-fusion`` package is installed) and runs the code
as SandboxFusion's python runner does (``python <file>`` with
``run_timeout``), so tracebacks, auto-print and timeouts are real. Faults
(5xx, dropped connections, ``SandboxError`` replies, canned run results) are
queued per test."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import http.server
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

import pytest

from retool.config import SandboxConfig, load_config
from retool.errors import ConfigError, SandboxError
from retool.sandbox import (
    MAX_CODE_BYTES,
    ErrorKind,
    FusionSandbox,
    format_tool_content,
    fusion_http,
    open_sandbox,
)
from retool.sandbox.fusion_endpoint import parse_endpoint
from retool.sandbox.fusion_program import RUNTIME_SOURCE, remote_program
from retool.sandbox.limits import (
    MAX_OUTPUT_BYTES,
    MAX_REQUEST_RETRIES,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MEMORY_MB_RANGE,
)

try:  # the documented shapes, from the sandbox-fusion client package when it is installed
    from sandbox_fusion.models import RunCodeRequest, RunCodeResponse
except ImportError:  # pragma: no cover - the stand-in then checks the fields by hand
    RunCodeRequest = RunCodeResponse = None


class FakeFusion(http.server.ThreadingHTTPServer):
    """A SandboxFusion stand-in: counts requests, connections and concurrency."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.faults: deque[Any] = deque()  # consumed one per request
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.gather = 0  # hold the first runs until this many are in flight (or 10 s)
        self.cond = threading.Condition()
        self.procs: set[subprocess.Popen[bytes]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.cond:
            self.connections += 1
        super().process_request(request, client_address)

    def execute(self, payload: dict[str, Any]) -> dict[str, Any]:
        """What SandboxFusion's ``run_python`` + ``run_command_bare`` report."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "code.py")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(payload["code"])
            proc = subprocess.Popen(
                [sys.executable, path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=tmp,
            )
            with self.cond:
                self.procs.add(proc)
            started = time.monotonic()
            try:
                out, err = proc.communicate(timeout=payload["run_timeout"])
                run = {"status": "Finished", "return_code": proc.returncode}
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                run = {"status": "TimeLimitExceeded", "return_code": None}
            finally:
                with self.cond:
                    self.procs.discard(proc)
        run.update(
            execution_time=time.monotonic() - started,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
        )
        ok = run["status"] == "Finished" and run["return_code"] == 0
        return reply("Success" if ok else "Failed", run)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        with self.cond:
            for proc in self.procs:
                proc.kill()


def reply(status: str, run: dict[str, Any] | None, message: str = "") -> dict[str, Any]:
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": run,
        "executor_pod_name": None,
        "files": {},
    }


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn
    server: FakeFusion

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any] | str) -> None:
        if RunCodeResponse is not None and isinstance(body, dict) and status == 200:
            RunCodeResponse(**body)  # the stand-in's replies keep to the documented shape
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        server = self.server
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/run_code":
            return self._send(404, {"detail": "Not Found"})
        if not isinstance(payload.get("code"), str) or payload.get("language") != "python":
            return self._send(422, {"detail": "invalid request"})
        if RunCodeRequest is not None:
            RunCodeRequest(**payload)  # raises (and the test fails) on a malformed request
        with server.cond:
            server.requests.append(payload)
            fault = server.faults.popleft() if server.faults else None
        if fault == "hang":  # the code runs on (or the service hangs) past the client's wait
            time.sleep(1.0)
            self.close_connection = True
            return None
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if isinstance(fault, int):
            return self._send(fault, "upstream unavailable")
        if isinstance(fault, dict):
            return self._send(200, fault)
        with server.cond:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            server.cond.notify_all()
            if server.gather:
                server.cond.wait_for(lambda: server.in_flight >= server.gather, timeout=10)
                server.gather = 0
        try:
            self._send(200, server.execute(payload))
        finally:
            with server.cond:
                server.in_flight -= 1


@pytest.fixture
def fusion():
    server = FakeFusion()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.stop()


def client(server: FakeFusion, **kwargs: Any) -> FusionSandbox:
    """A client without the start-up test snippet (one interpreter less per test)."""
    settings = {"timeout": 5.0, "max_workers": 2, "request_backoff": 0.01, "check": False}
    settings.update(kwargs)
    return FusionSandbox(server.url, **settings)


# -- what the model sees ------------------------------------------------------------


def test_success_sends_the_documented_request(fusion):
    with client(fusion, memory_mb=300, check=True) as sb:  # runs the start-up snippet too
        result = sb.run("print('hello')\nprint(6 * 7)")
    assert result.ok and result.error_kind is None
    assert result.stdout == "hello\n42\n" and result.returncode == 0
    assert result.isolation == "remote" and not result.truncated
    payload = fusion.requests[-1]
    assert payload["language"] == "python" and payload["memory_limit_MB"] == 300
    assert payload["run_timeout"] == 5.0
    assert payload["code"] == remote_program("print('hello')\nprint(6 * 7)")


AUTOPRINT_CASES = [
    ("2**10", "1024\n"),
    ("x = 5\nx * 2", "10\n"),
    ("x = 1", ""),
    ("for i in range(2):\n    i", ""),
    ("[].sort()", ""),
    ("print('hi')", "hi\n"),
    ("'ünïcode ✓'", "ünïcode ✓\n"),
]


def test_autoprint_of_the_last_expression(fusion):
    with client(fusion) as sb:
        printed = [sb.run(code).stdout for code, _ in AUTOPRINT_CASES]
    assert printed == [expected for _, expected in AUTOPRINT_CASES]


def test_runtime_error_is_the_traceback_of_the_snippet(fusion):
    with client(fusion) as sb:
        result = sb.run("x = 1\n\nraise ValueError('bad value')")
    assert not result.ok and result.error_kind == ErrorKind.ERROR and result.returncode == 1
    text = format_tool_content(result)
    assert text.startswith("Traceback") and text.endswith("ValueError: bad value")
    assert 'File "<code>", line 3' in text and "code.py" not in text  # no harness frames
    assert len(fusion.requests) == 1  # never retried


# Each snippet runs on both: the local server imports runtime.py, the driver ships its
# source; any difference means the shipped copy does not run as the imported one does.
PARITY_CASES = [
    "import sys\nprint('a')\nsys.exit('bye')",
    "import sys\nsys.exit(3)",
    "def (",
    "import os\nos.environ['OMP_NUM_THREADS'], os.environ['MPLBACKEND']",
    "import sys\nprint('err', file=sys.stderr)\n7",
    "1/0",
    "input()",
    "def f():\n    1/0\nf()",
    "try:\n    1/0\nexcept Exception as e:\n    raise ValueError('v') from e",
    "import fractions\nfractions.Fraction(1, 0)",  # a library's frames stay
    # the code closes or replaces what the epilogue needs
    "import sys\nsys.stderr.close()\n1/0",
    "import sys\nsys.stdout.close()\nprint(2)",
    "import sys\nsys.modules.clear()\n1/0",
    "import sys\nfor k in list(sys.modules): sys.modules[k] = None\nraise KeyError(5)",
    "import os\nos._exit = os.write = None\n1/0",
    "import builtins, sys\nbuiltins.print = None\nsys.exit('bye')",
    "import sys\nclass S:\n    def __str__(self):\n        raise ValueError\nsys.exit(S())",
    "import traceback\ntraceback.TracebackException = None\n1/0",
    "import linecache\nlinecache.getline = None\n1/0",
    "import __main__\n__main__._exit = __main__._describe = None\n1/0",
    # BaseException subclasses
    "raise KeyboardInterrupt",
    "class Stop(BaseException):\n    pass\nraise Stop('x')",
    "raise BaseExceptionGroup('g', [ValueError(1), KeyboardInterrupt()])",
    # compile failures are the code's own error
    "print(1)\0",
    "x = " + "(" * 300 + "1" + ")" * 300,
    "x = " + "+".join(["1"] * 100_000),
    "def f(): return f()\nf()",  # the repeat count depends on the stack below the code
]
RUNTIME_WORDS = ("<retool-runtime>", "<retool-autoprint>", "code.py", "_run_code", "setup failed")


@pytest.mark.parametrize("code", PARITY_CASES, ids=range(len(PARITY_CASES)))
def test_same_results_as_the_local_sandbox(fusion, sandbox, code):
    """The driver reproduces the local fork server's run: compare field by field.

    A failure means runtime.py behaves differently when shipped as source
    (compiled as ``<retool-runtime>`` in a plain interpreter) than imported.
    """
    with client(fusion, max_output_bytes=sandbox.max_output_bytes) as remote:
        here, there = sandbox.run(code), remote.run(code)
    fields = ("ok", "stdout", "stderr", "returncode", "error_kind", "truncated")
    repeats = re.compile(r"repeated \d+ more times")
    # The fake service runs the driver in this interpreter, at its host path; the local
    # calls see the interpreter at its neutral path.
    stdlib = os.path.dirname(os.__file__)
    seen = [
        repeats.sub("repeated N more times", str(getattr(r, f))).replace(stdlib, "<stdlib>")
        for r in (here, there)
        for f in fields
    ]
    neutral = "/opt/python/lib/python{}.{}".format(*sys.version_info[:2])
    seen[: len(fields)] = [s.replace(neutral, "<stdlib>") for s in seen[: len(fields)]]
    assert seen[len(fields) :] == seen[: len(fields)]
    assert not any(word in there.stderr for word in RUNTIME_WORDS), there.stderr


def test_the_driver_is_python_3_8_syntax():
    """The service's interpreter may be older than ours (best effort: ``feature_version``)."""
    for source in (remote_program("print(1)"), RUNTIME_SOURCE):
        ast.parse(source, feature_version=(3, 8))


def test_timeout_keeps_partial_output(fusion):
    with client(fusion) as sb:
        result = sb.run("import time\nprint('partial', flush=True)\ntime.sleep(30)", timeout=1.5)
    assert result.error_kind == ErrorKind.TIMEOUT and result.timed_out and not result.ok
    assert fusion.requests[-1]["run_timeout"] == 1.5
    text = format_tool_content(result, 1.5)
    assert text.startswith("TimeoutError: execution exceeded the time limit of 1.5 seconds")
    assert "partial" in text


def test_output_keeps_the_tail_within_the_cap(fusion):
    with client(fusion, max_output_bytes=64) as sb:
        result = sb.run("print('x' * 1000 + 'END')\nraise SystemExit('é' * 100)")
    assert result.truncated and result.error_kind == ErrorKind.ERROR
    assert result.stdout.endswith("END\n") and len(result.stdout.encode()) <= 64
    assert len(result.stderr) <= 64 and result.stderr.endswith("é\n")
    assert format_tool_content(result).startswith("[output truncated")


@pytest.mark.parametrize(
    "return_code, kind",
    # An exit status is the code's to choose: never memory, timeout or output.
    [
        (137, ErrorKind.ERROR),  # not memory: the code can sys.exit(137)
        (152, ErrorKind.ERROR),  # not timeout (128 + SIGXCPU)
        (153, ErrorKind.ERROR),  # not output (128 + SIGXFSZ)
        (-9, ErrorKind.ERROR),
        (-24, ErrorKind.ERROR),
        (-11, ErrorKind.CRASH),
        (2, ErrorKind.ERROR),
    ],
)
def test_exit_statuses_map_to_error_kinds(fusion, return_code, kind):
    with client(fusion) as sb:
        run = {"status": "Finished", "return_code": return_code, "stdout": "", "stderr": ""}
        fusion.faults.append(reply("Failed", run))
        result = sb.run("print(1)")
    assert result.error_kind == kind and not result.ok
    assert result.returncode == return_code


# -- what is refused before anything is sent ---------------------------------------------


@pytest.mark.parametrize(
    "code, says",
    [
        ("print('caf\udce9')", "not valid UTF-8 text"),
        ("#" * (MAX_CODE_BYTES + 1), f"limit of {MAX_CODE_BYTES} bytes"),
        ("s = '" + "é" * (MAX_CODE_BYTES // 2) + "'", f"limit of {MAX_CODE_BYTES} bytes"),
    ],
    ids=["surrogate", "too-many-characters", "too-many-bytes"],
)
def test_code_that_is_not_text_or_too_large_is_refused_unsent(fusion, sandbox, code, says):
    with client(fusion) as sb:
        result = sb.run(code)
        again = asyncio.run(sb.arun(code))
        window = sb.stats.snapshot_and_reset()
    assert fusion.requests == []
    assert not result.ok and result.error_kind == ErrorKind.ERROR and result.latency_s == 0.0
    assert says in result.stderr and "not run" in result.stderr and again == result
    assert (window["calls"], window["errors"], window["ok"]) == (2, 2, 0)
    local = sandbox.run(code)  # the model reads the same refusal whichever sandbox runs it
    fields = ("ok", "stdout", "stderr", "returncode", "error_kind", "latency_s")
    assert [getattr(result, f) for f in fields] == [getattr(local, f) for f in fields]


def test_code_of_exactly_the_limit_is_sent(fusion):
    tail = "\nprint('ran')\n"
    with client(fusion) as sb:
        result = sb.run("#" * (MAX_CODE_BYTES - len(tail)) + tail)
    assert result.ok and result.stdout == "ran\n" and len(fusion.requests) == 1


@pytest.mark.parametrize("code", [b"print(1)", None, 42], ids=["bytes", "None", "int"])
def test_code_that_is_not_a_str_is_a_config_error_naming_it(fusion, code):
    with client(fusion) as sb:
        with pytest.raises(ConfigError, match="^code must be a str"):
            sb.run(code)
        with pytest.raises(ConfigError, match="^code must be a str"):
            asyncio.run(sb.arun(code))
        assert sb.stats.snapshot_and_reset()["calls"] == 0
    assert fusion.requests == []


@pytest.mark.parametrize("timeout", [math.nan, math.inf, 0, -1, 1e12, "5"])
def test_a_bad_call_timeout_is_a_config_error(fusion, timeout):
    with client(fusion) as sb:
        with pytest.raises(ConfigError, match="FusionSandbox.run timeout"):
            sb.run("print(1)", timeout=timeout)
        with pytest.raises(ConfigError, match="FusionSandbox.run timeout"):
            asyncio.run(sb.arun("print(1)", timeout=timeout))
    assert fusion.requests == []


# Each setting at its bounds (accepted) and one step beyond (refused), by the client and
# by the config alike: the ranges of retool.sandbox.limits, shared with LocalSandbox.
BOUNDS = {
    "timeout": ([MAX_TIMEOUT_S, 1e-3], [0, MAX_TIMEOUT_S * 2, math.nan, math.inf]),
    "memory_mb": (list(MEMORY_MB_RANGE), [MEMORY_MB_RANGE[0] - 1, MEMORY_MB_RANGE[1] + 1, 64.5]),
    "max_workers": ([1, MAX_WORKERS], [0, MAX_WORKERS + 1, True]),
    "max_output_bytes": ([1, MAX_OUTPUT_BYTES], [0, MAX_OUTPUT_BYTES + 1]),
    "request_slack": ([MAX_TIMEOUT_S], [0, math.nan, math.inf]),
    "request_retries": ([0, MAX_REQUEST_RETRIES], [-1, MAX_REQUEST_RETRIES + 1]),
    "request_backoff": ([0, MAX_TIMEOUT_S], [-1, math.nan, math.inf]),
}


@pytest.mark.parametrize("name", list(BOUNDS))
def test_settings_are_checked_at_construction_like_the_config(name):
    url = f"http://127.0.0.1:{_closed_port()}"
    good, bad = BOUNDS[name]
    for value in good:
        FusionSandbox(url, check=False, **{name: value}).close()
        SandboxConfig(**{name: value})
    for value in bad:
        with pytest.raises(ConfigError, match=f"^FusionSandbox {name}"):
            FusionSandbox(url, check=False, **{name: value})
        with pytest.raises(ConfigError, match=f"^sandbox.{name}"):
            SandboxConfig(**{name: value})


def test_connect_timeout_is_checked():
    url = f"http://127.0.0.1:{_closed_port()}"
    for value in (0, math.nan, MAX_TIMEOUT_S * 2):
        with pytest.raises(ConfigError, match="^FusionSandbox connect_timeout"):
            FusionSandbox(url, check=False, connect_timeout=value)


# -- transport: retries, no retries, the pool, the cap ----------------------------------


@pytest.mark.parametrize("fault", [503, "drop", reply("SandboxError", None, "runner crashed")])
def test_transient_failure_is_retried_then_succeeds(fusion, fault):
    with client(fusion) as sb:
        fusion.faults.extend([fault, fault])
        before = len(fusion.requests)
        result = sb.run("print('finally')")
    assert result.ok and result.stdout == "finally\n"
    assert len(fusion.requests) - before == 3


def test_persistent_failure_is_a_sandbox_error_the_rollout_retries(fusion):
    with client(fusion, request_retries=2) as sb:
        fusion.faults.extend([502] * 3)
        before = len(fusion.requests)
        result = sb.run("print(1)")
        assert sb.stats.snapshot_and_reset()["errors"] == 1
    assert result.error_kind == ErrorKind.SANDBOX and not result.ok
    assert "HTTP 502" in result.stderr and "3 attempts" in result.stderr
    assert len(fusion.requests) - before == 3


@pytest.mark.parametrize("fault", [400, reply("Failed", {"status": "Finished", "return_code": 1})])
def test_a_final_answer_is_not_retried(fusion, fault):
    with client(fusion) as sb:
        fusion.faults.append(fault)
        before = len(fusion.requests)
        result = sb.run("print(1)")
    assert len(fusion.requests) - before == 1
    assert result.error_kind == (ErrorKind.SANDBOX if fault == 400 else ErrorKind.ERROR)


# -- exclusion evidence: only a request that never left may exclude ---------------------


def test_no_reply_within_timeout_and_slack_is_the_calls_timeout_not_an_exclusion(fusion):
    with client(fusion, timeout=0.2, request_slack=0.2, request_retries=3) as sb:
        fusion.faults.append("hang")
        before = len(fusion.requests)
        result = sb.run("print(1)")
        assert sb.stats.snapshot_and_reset()["timeouts"] == 1
    assert result.error_kind == ErrorKind.TIMEOUT and result.timed_out and not result.ok
    assert result.delivered  # sent: it may have run (and may run still)
    assert len(fusion.requests) - before == 1  # not repeated: it had its whole budget
    assert "TimeoutError" in format_tool_content(result, 0.2)


@pytest.mark.parametrize(
    "fault",
    [503, 400, "drop", reply("SandboxError", None, "runner crashed"), {"no": "status"}],
    ids=["5xx", "4xx", "dropped", "SandboxError", "malformed"],
)
def test_a_failure_after_the_request_was_sent_is_never_excluded(fusion, fault):
    with client(fusion, request_retries=1) as sb:
        fusion.faults.extend([fault, fault])
        result = sb.run("print(1)")
    assert result.error_kind == ErrorKind.SANDBOX and not result.ok
    assert result.delivered, result.stderr  # the code's doing, as far as anyone can tell


def test_a_refused_connection_is_evidence_the_code_never_ran():
    url = f"http://127.0.0.1:{_closed_port()}"
    with FusionSandbox(url, request_retries=1, request_backoff=0.01, check=False) as sb:
        result = sb.run("print(1)")
    assert result.error_kind == ErrorKind.SANDBOX and "refused" in result.stderr
    assert not result.delivered  # nothing was sent: the rollout may exclude


def test_a_delivery_on_an_earlier_attempt_is_not_forgotten(fusion, monkeypatch):
    """A 503 after sending, then the service unreachable: the first attempt may have run."""
    with client(fusion, request_retries=3) as sb:
        fusion.faults.append(503)
        exchange, attempts = sb._http._exchange, []

        def first_sent_then_unreachable(body: bytes, read_timeout: float) -> Any:
            attempts.append(1)
            if len(attempts) == 1:
                return exchange(body, read_timeout)
            raise fusion_http.Retry("cannot connect to SandboxFusion", False)

        monkeypatch.setattr(sb._http, "_exchange", first_sent_then_unreachable)
        result = sb.run("print(1)")
    assert len(attempts) == 4 and "cannot connect" in result.stderr
    assert result.error_kind == ErrorKind.SANDBOX and result.delivered


def test_connections_are_pooled_and_a_stale_one_is_replaced(fusion):
    with client(fusion, max_workers=1, request_retries=0) as sb:
        for _ in range(3):
            assert sb.run("print(1)").ok
        assert fusion.connections == 1 and sb.connections_opened == 1 and sb.attempts == 3
        fusion.faults.append("drop")  # the pooled connection dies, as an idle timeout does
        assert sb.run("print(2)").stdout == "2\n"  # replaced at once, though retries are 0
    assert fusion.connections == 2


SLOW = "import time\ntime.sleep(0.2)\nprint(1)"


def test_concurrency_cap_across_threads_and_event_loops(fusion):
    with client(fusion, max_workers=2) as sb:
        fusion.gather = 2  # the cap is reached; the runs sleep, so a broken cap lets more in

        async def batch() -> list[Any]:
            return await asyncio.gather(*(sb.arun(SLOW) for _ in range(3)))

        side = threading.Thread(target=lambda: sb.run(SLOW))
        side.start()
        results = asyncio.run(batch())
        side.join()
        window = sb.stats.snapshot_and_reset()
    assert all(r.ok for r in results)
    assert fusion.max_in_flight == 2
    assert window["calls"] == 4 and window["ok"] == 4


def test_stats_window_counts_kinds(fusion):
    with client(fusion) as sb:
        sb.run("1")
        sb.run("1/0")
        sb.run("import time; time.sleep(5)", timeout=0.3)
        first = sb.stats.snapshot_and_reset()
        second = sb.stats.snapshot_and_reset()
    assert (first["calls"], first["ok"], first["errors"], first["timeouts"]) == (3, 1, 1, 1)
    assert second["calls"] == 0
    assert sb.stats.totals() == {"calls": 3, "timeouts": 1}


def test_close_aborts_a_call_in_flight(fusion):
    sb = client(fusion)
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            sb.run("import time; time.sleep(3)")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    fusion.gather = 0
    worker.start()
    with fusion.cond:
        assert fusion.cond.wait_for(lambda: fusion.in_flight == 1, timeout=10)
    sb.close()
    worker.join(10)
    assert isinstance(outcome[0], SandboxError)
    with pytest.raises(SandboxError, match="closed"):
        sb.run("print(1)")


# -- wrong URLs, config and wiring ----------------------------------------------------------


def _closed_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_url_is_one_clear_error():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(SandboxError, match=r"cannot connect to SandboxFusion at .*refused"):
        FusionSandbox(url, request_retries=1, request_backoff=0.01)


def test_tls_against_plain_http_is_not_retried(fusion):
    https = fusion.url.replace("http://", "https://")
    with pytest.raises(SandboxError, match="TLS with SandboxFusion at https://"):
        FusionSandbox(https, request_backoff=0.01)
    assert fusion.requests == []


def test_wrong_path_is_one_clear_error(fusion):
    with pytest.raises(SandboxError, match=r"HTTP 404 \(is sandbox.url the service's address"):
        FusionSandbox(fusion.url + "/v1/api", request_backoff=0.01)
    assert parse_endpoint(fusion.url + "/run_code/").path == "/run_code"


@pytest.mark.parametrize(
    "url, message",
    [
        ("", "sandbox.url is required"),
        ("localhost:8080", "http:// or https://"),
        ("ftp://host/run_code", "http:// or https://"),
        ("http://host:99999", "invalid port"),
        ("http://user:secret@host", "credentials"),
        ("http:///run_code", "must name a host"),
    ],
)
def test_config_validates_the_url(url, message):
    with pytest.raises(ConfigError, match=message):
        SandboxConfig(backend="sandboxfusion", url=url)


def test_config_fields_are_named_in_errors():
    with pytest.raises(ConfigError, match="sandbox.backend"):
        SandboxConfig(backend="docker")
    with pytest.raises(ConfigError, match="sandbox.request_retries"):
        SandboxConfig(request_retries=-1)
    with pytest.raises(ConfigError, match="sandbox.request_slack"):
        SandboxConfig(request_slack=0)
    with pytest.raises(ConfigError, match="sandbox.isolation = 'strict' applies to the local"):
        SandboxConfig(backend="sandboxfusion", url="http://h:8080", isolation="strict")
    assert SandboxConfig(url="http://ignored-by-local").backend == "local"


def test_open_sandbox_returns_the_service_client(fusion):
    config = load_config(
        overrides=[
            "sandbox.backend=sandboxfusion",
            f'sandbox.url="{fusion.url}/run_code"',
            "sandbox.max_workers=3",
            "sandbox.request_backoff=0",
        ]
    ).sandbox
    with open_sandbox(config) as sb:
        assert isinstance(sb, FusionSandbox) and sb.max_workers == 3
        assert sb.run("6 * 7").stdout == "42\n"


def test_remote_program_is_ascii_and_carries_the_code_losslessly():
    code = "s = '\\u00e9\\ud800 ✓'\nprint(len(s))"
    program = remote_program(code)
    assert program.isascii()
    namespace: dict[str, Any] = {}
    exec(program.split("\n", 2)[1], namespace)  # the _CODE = ... line
    assert namespace["_CODE"] == code
