"""Bad input to the sandbox, as an attacker of our own API and CLI would send it.

Code that is not text or too large is refused before it reaches the sandbox
(the CLI: exit 2 and one line naming the source, the line and the byte offset;
the API: a refused ``ExecResult``); snippets that break the interpreter never
show the runtime's own frames; every public number is finite and in range at
construction; Ctrl-C and SIGTERM leave no process and no temporary directory
and exit 130/143.
"""

import contextlib
import math
import os
import pty
import signal
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from retool.errors import ConfigError, SandboxError
from retool.sandbox import ErrorKind, LocalSandbox, format_tool_content
from retool.sandbox.limits import MAX_CODE_BYTES

from .helpers import (
    INTERNALS,
    REPO,
    RETOOL,
    appeared,
    daemon_code,
    kill_all,
    procs_in,
    procs_with,
    wait_for,
)


def _marker() -> str:
    return f"{8000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"


# -- the CLI: one line, exit 2, nothing started ------------------------------------
FILES = {
    "latin1.py": b"x = 1\nprint('caf\xe9')\n",
    "utf16.py": "print(1)\n".encode("utf-16"),
    "big.py": b"#" * (MAX_CODE_BYTES + 1),
}
LATIN1_OFFSET = FILES["latin1.py"].index(b"\xe9")
# name -> (arguments, stdin: bytes or a path to read from, words the line names);
# "{tmp}" is the directory holding FILES.
CASES = {
    "latin1 on stdin": (["-"], b"print('caf\xe9')\n", ["stdin", "line 1", "byte offset 10"]),
    "latin1 file": (
        ["{tmp}/latin1.py"],
        b"",
        ["{tmp}/latin1.py", "line 2", f"byte offset {LATIN1_OFFSET}", "UTF-8"],
    ),
    "utf-16 file": (["{tmp}/utf16.py"], b"", ["{tmp}/utf16.py", "byte offset 0", "UTF-8"]),
    "NUL byte": (["-"], b"print(1)\n\0", ["stdin", "line 2", "byte offset 9", "NUL"]),
    "endless stdin": (["-"], "/dev/zero", ["stdin", f"over {MAX_CODE_BYTES} bytes"]),
    "file over the limit": (["{tmp}/big.py"], b"", ["{tmp}/big.py", f"over {MAX_CODE_BYTES}"]),
    "a directory": (["{tmp}"], b"", ["{tmp}: cannot read"]),
    "a missing file": (["{tmp}/nope.py"], b"", ["{tmp}/nope.py: cannot read"]),
    "timeout nan": (["--timeout", "nan", "-"], b"1", ["--timeout", "nan"]),
    "timeout inf": (["--timeout", "inf", "-"], b"1", ["--timeout", "inf"]),
    "timeout 1e12": (["--timeout", "1e12", "-"], b"1", ["--timeout", "86400"]),
    "timeout 0": (["--timeout", "0", "-"], b"1", ["--timeout", "> 0"]),
    "memory 0": (["--memory-mb", "0", "-"], b"1", ["--memory-mb", ">= 16"]),
    "memory huge": (["--memory-mb", str(1 << 40), "-"], b"1", ["--memory-mb", "2**20"]),
    "bench n 0": (["bench", "--n", "0"], b"", ["--n", ">= 1"]),
    "bench workers huge": (["bench", "--workers", "100000"], b"", ["--workers", "<= 64"]),
}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """Every case at once (the real console script, a TMPDIR of its own); by name."""
    tmp = tmp_path_factory.mktemp("bad-input")
    for name, data in FILES.items():
        (tmp / name).write_bytes(data)
    scratch = tmp_path_factory.mktemp("tmpdir")
    env = dict(os.environ, TMPDIR=str(scratch))
    running = {}
    for name, (args, stdin, _words) in CASES.items():
        args = [a.replace("{tmp}", str(tmp)) for a in args]
        argv = [RETOOL, "sandbox", *(args if args[0] == "bench" else ["exec", *args])]
        source = open(stdin, "rb") if isinstance(stdin, str) else subprocess.PIPE  # noqa: SIM115
        process = subprocess.Popen(
            argv, stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        if isinstance(stdin, str):
            source.close()
        running[name] = process
    results = {}
    for name, process in running.items():
        stdin = CASES[name][1]
        try:
            out, err = process.communicate(stdin or None, timeout=300)  # a loaded CI box
        except BrokenPipeError:  # refused before reading it all: the point
            out, err = process.stdout.read(), process.stderr.read()
            process.wait()
        results[name] = (process.returncode, out.decode(), err.decode())
    return results, tmp, scratch


@pytest.mark.parametrize("name", list(CASES))
def test_cli_refuses_bad_input_in_one_line(cli_results, name):
    results, tmp, scratch = cli_results
    status, out, err = results[name]
    assert status == 2, (name, status, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("retool: error: "), err
    for word in CASES[name][2]:
        word = word.replace("{tmp}", str(tmp))
        assert word in lines[0], (word, lines[0])
    assert not any(p.name.startswith("retool-sandbox-") for p in scratch.iterdir())


def test_cli_runs_a_utf8_file_with_a_bom(tmp_path):
    snippet = tmp_path / "bom.py"
    snippet.write_bytes(b"\xef\xbb\xbfprint('caf\xc3\xa9', 6 * 7)\n")
    done = subprocess.run([RETOOL, "sandbox", "exec", str(snippet)], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "café 42\n"


def test_cli_says_it_reads_a_terminal():
    controller, terminal = pty.openpty()
    try:
        cli = subprocess.Popen(
            [RETOOL, "sandbox", "exec"],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(terminal)
        terminal = -1
        first = cli.stderr.readline().decode()  # before any input: not a silent wait
        assert "reading the code from stdin" in first and "Ctrl-D" in first
        os.write(controller, b"print(6 * 7)\n\x04")
        out, _ = cli.communicate(timeout=60)
        assert cli.returncode == 0
        assert out.decode() == "42\n"
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)


# -- interrupts ----------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_exec_interrupted_kills_everything_then_exits(sig, tmp_path):
    marker = _marker()
    code = daemon_code(marker, "import subprocess\nsubprocess.run(['sleep', '" + marker + "'])")
    cli = subprocess.Popen(
        [RETOOL, "sandbox", "exec", "--timeout", "120", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    try:
        cli.stdin.write(code.encode())
        cli.stdin.close()
        # The daemon and the snippet's own child are both running.
        assert wait_for(lambda: len(procs_with(marker)) == 2, within=30)
        cli.send_signal(sig)
        cli.wait(30)
        out, err = cli.stdout.read(), cli.stderr.read()
        # Checked at once, no polling: the CLI exits only after all is gone.
        assert procs_with(marker) == []
        assert list(tmp_path.iterdir()) == []
        assert cli.returncode == 128 + sig
        assert err.decode().splitlines() == [
            f"retool: stopped by {sig.name}; the sandbox and all it ran are gone"
        ]
        assert out == b""
    finally:
        cli.kill()
        kill_all(marker)


def test_cli_bench_sigterm_is_clean_and_never_calls_full_basic(tmp_path):
    cli = subprocess.Popen(
        [RETOOL, "sandbox", "bench", "--n", "3", "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    try:
        first = cli.stdout.readline().decode()  # both sandboxes are up by now
        assert first.startswith("isolation level: ")
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode == 143
        lines = err.decode().splitlines()
        assert lines == ["retool: stopped by SIGTERM; the sandbox and all it ran are gone"]
        assert list(tmp_path.iterdir()) == []
    finally:
        cli.kill()


def test_an_interrupt_while_the_sandbox_starts_leaves_nothing(tmp_path):
    """KeyboardInterrupt at several moments of LocalSandbox(); nothing may be left."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from retool.sandbox import LocalSandbox

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        for delay in (0.02, 0.2, 0.5):
            signal.setitimer(signal.ITIMER_REAL, delay)
            try:
                sandbox = LocalSandbox(max_workers=1)
                signal.setitimer(signal.ITIMER_REAL, 0)  # started in time: no interrupt
            except KeyboardInterrupt:  # in the constructor, which must clean up itself
                sandbox = None  # (or just after it: dropping the object closes it)
            if sandbox is not None:
                sandbox.close()
            print(sorted(os.listdir(sys.argv[1])), flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        cwd=REPO,
        timeout=120,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["[]"] * 3
    assert procs_in(str(tmp_path)) == []  # no server (its cwd, its --dir, is below tmp_path)


# -- the API: arguments ------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": 1e12}, "timeout"),
        ({"timeout": "10"}, "timeout"),
        ({"memory_mb": math.nan}, "memory_mb"),
        ({"memory_mb": 8}, "memory_mb"),
        ({"memory_mb": 1 << 40}, "memory_mb"),
        ({"memory_mb": 512.5}, "memory_mb"),
        ({"max_workers": True}, "max_workers"),
        ({"max_workers": 10**6}, "max_workers"),
        ({"max_output_bytes": 0}, "max_output_bytes"),
        ({"max_output_bytes": 1 << 40}, "max_output_bytes"),
        ({"preload": "numpy"}, "preload"),
        ({"preload": ["numpy,sympy"]}, "preload"),
        ({"isolation": None}, "isolation"),
    ],
)
def test_constructor_refuses_absurd_numbers_at_once(kwargs, named):
    with pytest.raises(ConfigError, match=named):
        LocalSandbox(**kwargs)


@pytest.mark.parametrize("code", [b"print(1)", None, 42, ["print(1)"]])
def test_run_refuses_code_that_is_not_a_str(sandbox, code):
    with pytest.raises(ConfigError, match=f"code must be a str.*{type(code).__name__}"):
        sandbox.run(code)


async def test_arun_refuses_bytes_in_the_caller(sandbox):
    with pytest.raises(ConfigError, match="decode it first"):
        await sandbox.arun(b"print(1)")


@pytest.mark.parametrize("timeout", [math.nan, math.inf, 1e12, -1, "1"])
def test_run_refuses_absurd_timeouts(sandbox, timeout):
    with pytest.raises(ConfigError, match="timeout"):
        sandbox.run("print(1)", timeout=timeout)


@pytest.mark.parametrize(
    "code, says",
    [
        ("print('caf\udce9')", "not valid UTF-8 text"),
        ("#" * (MAX_CODE_BYTES + 1), f"limit of {MAX_CODE_BYTES} bytes"),
        ("s = '" + "é" * (MAX_CODE_BYTES // 2) + "'", f"limit of {MAX_CODE_BYTES} bytes"),
    ],
)
def test_code_that_is_not_text_or_too_large_is_refused_unrun(sandbox, code, says):
    result = sandbox.run(code)
    assert not result.ok and result.error_kind == ErrorKind.ERROR
    assert result.latency_s == 0.0  # never sent
    text = format_tool_content(result)
    assert says in text and "not run" in text
    assert not any(word in text for word in INTERNALS)


def test_code_of_exactly_the_limit_runs(sandbox):
    tail = "\nprint('ran')\n"
    result = sandbox.run("#" * (MAX_CODE_BYTES - len(tail)) + tail)
    assert result.ok and result.stdout == "ran\n"


# -- the runtime never shows itself ---------------------------------------------------------
@pytest.mark.parametrize(
    "code, last_line",
    [
        ("import sys\nsys.stderr.close()\n1/0", "ZeroDivisionError: division by zero"),
        ("import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 2)\n1/0", None),
        ("import sys\nsys.stdout.close()\nprint(2)", "ValueError: I/O operation on closed file."),
        ("import sys\nsys.modules.clear()\n1/0", "ZeroDivisionError: division by zero"),
        ("import sys\nfor k in list(sys.modules): sys.modules[k] = None\nraise KeyError(5)", "5"),
        ("import os\nos._exit = os.write = None\n1/0", "ZeroDivisionError: division by zero"),
        ("import builtins, sys\nbuiltins.print = None\nsys.exit('bye')", "bye"),
        (
            "import sys\nclass S:\n    def __str__(self):\n        raise ValueError\nsys.exit(S())",
            "<exit message str() failed>",
        ),
        ("import traceback\ntraceback.TracebackException = None\n1/0", "division by zero"),
        ("import linecache\nlinecache.getline = None\n1/0", "ZeroDivisionError"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
        ("class Stop(BaseException):\n    pass\nraise Stop('x')", "Stop: x"),
        ("raise SystemExit(3)", None),
        ("raise ExceptionGroup('g', [ValueError(1)])", "+------------------------------------"),
        ("x = " + "(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
        ("x = " + "+".join(["1"] * 100_000), "RecursionError"),
        ("print(1)\0", "SyntaxError: source code string cannot contain null bytes"),
        ("def f(): return f()\nf()", "RecursionError: maximum recursion depth exceeded"),
        ("import sympy\nsympy.sympify('1+')", None),
    ],
)
def test_runtime_frames_never_reach_the_observation(sandbox, code, last_line):
    result = sandbox.run(code)
    assert result.error_kind == ErrorKind.ERROR, result
    text = format_tool_content(result)
    assert not any(word in text for word in INTERNALS), text
    if last_line is not None:
        assert last_line in text.splitlines()[-1], text


def test_tracebacks_keep_the_codes_frames_and_its_libraries(sandbox):
    text = format_tool_content(sandbox.run("def f():\n    1/0\nf()"))
    assert text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<code>", line 3, in <module>',
        '  File "<code>", line 2, in f',
        "ZeroDivisionError: division by zero",
    ]
    library = format_tool_content(sandbox.run("import fractions\nfractions.Fraction(1, 0)"))
    assert "fractions.py" in library and "ZeroDivisionError" in library


def test_a_failed_call_setup_is_one_clean_sentence(sandbox, caplog):
    """The set-up's own traceback goes to the log, never to the model."""
    reply = {
        "returncode": 70,
        "timed_out": False,
        "ready": False,
        "stdout": "",
        "stderr": 'sandbox setup failed: Traceback (most recent call last):\n  File "/x/'
        'retool_sandbox_rt/call.py", line 1\nOSError: [Errno 28] No space left on device\n',
        "truncated": False,
    }
    result = sandbox._to_result(reply, 0.01)
    assert result.error_kind == ErrorKind.SANDBOX
    text = format_tool_content(result)
    assert not any(word in text for word in INTERNALS) and "Traceback" not in text
    assert "No space left on device" in caplog.text


def test_close_returns_only_when_everything_is_gone():
    marker = _marker()
    sb = LocalSandbox(max_workers=1, timeout=60)
    directory = sb._dir

    def call():
        with contextlib.suppress(SandboxError):  # closed under it: the point
            sb.run(daemon_code(marker, "import time\ntime.sleep(60)"))

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert appeared(marker)
        sb.close()
        assert procs_with(marker) == [] and not os.path.exists(directory)  # no polling
        thread.join(10)
    finally:
        kill_all(marker)


def test_a_long_tmpdir_still_gets_the_fork_server(tmp_path):
    # A Unix socket's address holds 107 bytes; a sandbox lives under TMPDIR, and a
    # deep one (a test runner's per-worker directory was enough) made the server's
    # start fail and every call fall back to a fresh interpreter, then fail.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    done = subprocess.run(
        [RETOOL, "sandbox", "exec", "--json", "-"],
        input=b"print(6 * 7)\n",
        capture_output=True,
        env=dict(os.environ, TMPDIR=str(deep)),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert b"fresh interpreter" not in done.stderr and done.stderr == b"", done.stderr
    assert '"stdout": "42\\n"' in done.stdout.decode()
    assert list(deep.iterdir()) == []
