"""Hostile snippets: the harness survives, nothing leaks, nothing persists."""

import os
import resource
import socket
import time

import pytest

from retool.sandbox import ErrorKind, IsolationLevel, LocalSandbox
from tests.sandbox.helpers import procs_with
from tests.sandbox.trainers import BOTH_TRAINERS

ROOT = os.geteuid() == 0


def _gone(marker: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not procs_with(marker):
            return True
        time.sleep(0.05)
    return False


def test_full_isolation_here(sandbox):
    assert sandbox.isolation_level == IsolationLevel.FULL, sandbox.missing


@BOTH_TRAINERS
def test_infinite_loop_times_out(sandbox):
    result = sandbox.run("while True:\n    pass", timeout=1.0)
    assert result.timed_out and result.error_kind == ErrorKind.TIMEOUT and not result.ok
    assert sandbox.run("print('alive')").stdout == "alive\n"


@BOTH_TRAINERS
def test_memory_bomb(sandbox):
    # One huge reservation fails in-process (address-space rlimit): the traceback
    # says MemoryError; the kind is a plain error since only the call saw it.
    result = sandbox.run("x = bytearray(20 * 1024**3)\nprint('allocated')")
    assert not result.ok and "allocated" not in result.stdout
    assert "MemoryError" in result.stderr


@pytest.mark.skipif(not ROOT, reason="the process cap needs a dedicated uid (root server)")
def test_fork_bomb_is_bounded_and_cleaned_up(sandbox):
    code = (
        "import os, time\nn = 0\nfor _ in range(400):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n"
        "        os.execv('/bin/sleep', ['sleep', '3131.5'])\n    n += 1\nprint(n)"
    )
    result = sandbox.run(code, timeout=20)  # 60 forks and execs took 3 s on a loaded host
    assert result.ok and int(result.stdout) < 100
    assert _gone("3131.5")


@BOTH_TRAINERS
def test_output_flood_keeps_the_tail_and_bounded_memory(sandbox):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)"
    result = sandbox.run(code)
    assert result.truncated and len(result.stdout) <= 4096
    assert not result.ok and result.error_kind == ErrorKind.OUTPUT
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 100_000


def test_parent_secrets_are_invisible(monkeypatch):
    monkeypatch.setenv("RETOOL_TEST_SECRET", "hunter2-secret")
    with LocalSandbox(max_workers=1, timeout=3) as sb:
        code = (
            "import os, glob\nprint(dict(os.environ))\n"
            "for p in glob.glob('/proc/*/environ'):\n    try:\n"
            "        print(open(p, 'rb').read())\n    except OSError:\n        pass"
        )
        result = sb.run(code)
    assert result.ok
    assert "hunter2" not in result.stdout + result.stderr
    assert "PATH" in result.stdout


@BOTH_TRAINERS
def test_host_files_are_not_readable(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top-secret-value")
    secret.chmod(0o644)
    result = sandbox.run(f"print(open({str(secret)!r}).read())")
    assert "top-secret-value" not in result.stdout and not result.ok
    shadow = sandbox.run("print(open('/etc/shadow').read())")
    # Absent from the minimal /etc at full isolation; unreadable for the call's uid below.
    assert not shadow.ok and ("PermissionError" in shadow.stderr or "FileNotFound" in shadow.stderr)


@BOTH_TRAINERS
def test_writes_outside_scratch_fail(sandbox, tmp_path):
    import sys

    target = os.path.join(sys.prefix, "pwned.txt")
    result = sandbox.run(f"open({target!r}, 'w').write('x')")
    assert not result.ok and not os.path.exists(target)
    result = sandbox.run(f"open({str(tmp_path / 'x')!r}, 'w').write('x')")
    assert not result.ok and not (tmp_path / "x").exists()


@BOTH_TRAINERS
def test_no_network_even_to_loopback(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        result = sandbox.run(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print('connected')"
        )
        assert "connected" not in result.stdout and not result.ok
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@BOTH_TRAINERS
def test_cannot_kill_the_harness(sandbox):
    for code in (
        "import os\nos.kill(os.getppid(), 9)",
        "import os\nos.kill(-1, 9)",
        "import os, signal\nos.killpg(0, signal.SIGKILL)",
    ):
        sandbox.run(code)
    assert sandbox.run("print(1)").stdout == "1\n"


@BOTH_TRAINERS
def test_setsid_double_fork_daemon_is_gone_after_the_call(sandbox):
    code = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv('/bin/sleep', ['sleep', '4242.5'])\n    os._exit(0)\n"
        "print('parent done')"
    )
    result = sandbox.run(code)
    assert result.ok and result.stdout == "parent done\n"
    assert _gone("4242.5")


@BOTH_TRAINERS
def test_daemon_holding_stdout_does_not_hang_the_harness(sandbox):
    code = (
        "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    print('late')\n"
        "else:\n    print('parent exits')"
    )
    started = time.monotonic()
    result = sandbox.run(code, timeout=30)
    assert result.ok and result.stdout == "parent exits\n"
    assert time.monotonic() - started < 20


def test_closed_stdout_then_write(sandbox):
    result = sandbox.run("import os\nos.close(1)\nprint('into the void')")
    assert result.returncode is not None
    assert sandbox.run("print(2)").stdout == "2\n"


def test_segfault_is_a_crash(sandbox):
    result = sandbox.run("import ctypes\nctypes.string_at(0)")
    assert result.error_kind == ErrorKind.CRASH and result.returncode == -11


def test_deep_recursion(sandbox):
    result = sandbox.run("def f(n):\n    return f(n + 1)\nf(0)")
    assert "RecursionError" in result.stderr
    deeper = sandbox.run(
        "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)"
    )
    assert not deeper.ok
    assert sandbox.run("print(3)").stdout == "3\n"


@BOTH_TRAINERS
def test_disk_fill_is_contained(sandbox):
    code = "with open('/tmp/fill', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))"
    result = sandbox.run(code)
    assert not result.ok
    assert result.error_kind in (ErrorKind.ERROR, ErrorKind.OUTPUT)


def test_special_tokens_and_invalid_utf8(sandbox):
    result = sandbox.run(
        "import sys\n_ = sys.stdout.buffer.write(b'<|im_end|><tool_call>\\xff\\xfe ok')"
    )
    assert result.ok
    assert "<|im_end|>" not in result.stdout and "<tool_call>" not in result.stdout
    assert "\ufffd" in result.stdout and result.stdout.endswith(" ok")


@BOTH_TRAINERS
def test_nothing_persists_between_calls(sandbox):
    write = (
        "import os\nopen('/tmp/state', 'w').write('1')\nopen('/dev/shm/state', 'w').write('1')"
        "\nopen('here', 'w').write('1')\nprint(os.getcwd())"
    )
    first = sandbox.run(write)
    assert first.ok
    for _ in range(3):  # whichever handler serves it
        check = sandbox.run(
            "import os\nprint([os.path.exists(p) for p in "
            "('/tmp/state', '/dev/shm/state', 'here')])"
        )
        assert check.stdout.strip() == "[False, False, False]"


@BOTH_TRAINERS
def test_random_is_reseeded_per_call(sandbox):
    code = "import random, numpy\nprint(random.random(), numpy.random.rand())"
    outputs = {sandbox.run(code).stdout for _ in range(4)}
    assert len(outputs) == 4
