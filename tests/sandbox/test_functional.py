import ast
import asyncio
import threading

import pytest

from retool.errors import ConfigError
from retool.sandbox import ErrorKind, ExecResult, LocalSandbox, format_tool_content
from retool.sandbox.autoprint import add_autoprint


@pytest.mark.parametrize(
    "code, printed",
    [
        ("2**10", "1024\n"),
        ("x = 5\nx * 2", "10\n"),
        ("x = 1", ""),
        ("for i in range(2):\n    i", ""),
        ("print('hi')", "hi\n"),
        ("[].sort()", ""),
        ("\n\n'text'\n\n", "text\n"),
    ],
)
def test_autoprint(sandbox, code, printed):
    assert sandbox.run(code).stdout == printed


def test_autoprint_leaves_syntax_errors_to_compile():
    assert add_autoprint("def (") == "def ("
    assert isinstance(add_autoprint("1 + 1"), ast.Module)


def test_error_text_is_the_traceback(sandbox):
    result = sandbox.run("x = 1\nraise ValueError('bad value')")
    text = format_tool_content(result)
    assert text.startswith("Traceback") and text.endswith("ValueError: bad value")
    assert "server.py" not in text  # the harness's own frames are not shown


def test_success_text_is_stdout_even_empty(sandbox):
    assert format_tool_content(sandbox.run("x = 1")) == ""
    assert format_tool_content(sandbox.run("print(7)")) == "7\n"


def test_timeout_message(sandbox):
    result = sandbox.run("print('partial', flush=True)\nwhile True: pass", timeout=1.0)
    text = format_tool_content(result, 1.0)
    assert text.startswith("TimeoutError: execution exceeded the time limit of 1 seconds")
    assert "partial" in text


def test_memory_and_crash_messages():
    memory = ExecResult(False, "", "MemoryError", 1, False, 0.1, False, ErrorKind.MEMORY)
    assert format_tool_content(memory).startswith("MemoryError")
    crash = ExecResult(False, "", "", -11, False, 0.1, False, ErrorKind.CRASH)
    assert "signal 11" in format_tool_content(crash)


def test_concurrency_cap_across_two_event_loops():
    with LocalSandbox(max_workers=2, timeout=10) as sb:
        results = []

        def loop_thread():
            async def main():
                return await asyncio.gather(
                    *(sb.arun("import time\ntime.sleep(0.3)\nprint(1)") for _ in range(3))
                )

            results.extend(asyncio.run(main()))

        threads = [threading.Thread(target=loop_thread) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 6 and all(r.ok for r in results)
        assert sb.connections_opened <= 2  # never more than max_workers calls at once


def test_stats_windows(sandbox):
    sandbox.stats.snapshot_and_reset()
    sandbox.run("print(1)")
    sandbox.run("print(2)")
    sandbox.run("1/0")
    sandbox.run("while True: pass", timeout=0.5)
    window = sandbox.stats.snapshot_and_reset()
    assert (window["calls"], window["ok"], window["errors"], window["timeouts"]) == (4, 2, 1, 1)
    assert window["success_rate"] == 0.5 and window["timeout_rate"] == 0.25
    assert window["latency_p95_s"] >= window["latency_p50_s"] > 0
    assert sandbox.stats.snapshot_and_reset()["calls"] == 0
    assert sandbox.stats.totals()["calls"] >= 4


def test_server_crash_is_recovered():
    with LocalSandbox(max_workers=1, timeout=5) as sb:
        assert sb.run("print(1)").ok
        sb._server.kill()
        sb._server.wait()
        assert sb.run("print(2)").stdout == "2\n"


def test_fresh_interpreter_mode():
    with LocalSandbox(max_workers=1, timeout=10, preload=()) as sb:
        assert sb.preloaded == []
        result = sb.run("import math\nmath.factorial(20)")
        assert result.ok and result.stdout == "2432902008176640000\n"


def test_basic_level_still_scrubs_env_and_cleans_up(monkeypatch):
    monkeypatch.setenv("RETOOL_TEST_SECRET", "basic-secret")
    with LocalSandbox(max_workers=1, timeout=5, isolation="none") as sb:
        assert sb.isolation_level == "basic"
        result = sb.run(
            "import os\nprint(os.environ.get('RETOOL_TEST_SECRET'))\n"
            "_ = open('here', 'w').write('x')"
        )
        assert result.stdout == "None\n"
        again = sb.run("import os\nprint(os.path.exists('here'))")
        assert again.stdout == "False\n"


def test_strict_gets_full_isolation_here():
    with LocalSandbox(max_workers=1, isolation="strict") as sb:
        assert sb.isolation_level == "full"


@pytest.mark.parametrize(
    "kwargs", [{"max_workers": 0}, {"timeout": 0}, {"memory_mb": -1}, {"isolation": "paranoid"}]
)
def test_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        LocalSandbox(**kwargs)


def test_server_dying_while_preloading_falls_back_to_fresh_mode(monkeypatch):
    from retool.errors import SandboxError

    real = LocalSandbox._spawn_server

    def flaky(self, preload):
        if preload:
            raise SandboxError("the sandbox server failed to start")
        return real(self, preload)

    monkeypatch.setattr(LocalSandbox, "_spawn_server", flaky)
    with LocalSandbox(max_workers=1, timeout=10) as sb:
        assert sb.preload == () and sb.preloaded == []
        assert sb.run("import sympy\nprint(sympy.isprime(97))").stdout == "True\n"
