"""Nothing the call writes is taken as a fact by the supervisor."""

import threading

import pytest

from retool.sandbox import ErrorKind

from .trainers import BOTH_TRAINERS

# Write a forged status line to every descriptor the call might have inherited.
FORGE_ALL_FDS = (
    "import os\nfor fd in range(3, 4096):\n    for line in (b'garbage\\n', b'0\\n', b'1 0\\n'):\n"
    "        try:\n            os.write(fd, line)\n        except OSError:\n            pass\n"
)


@BOTH_TRAINERS
def test_the_call_holds_no_descriptor_but_stdio(sandbox):
    result = sandbox.run("import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))")
    fds = eval(result.stdout)
    assert [fd for fd in fds if fd > 2] in ([], [3])  # 3: the listdir handle itself


@BOTH_TRAINERS
def test_forged_status_lines_do_not_turn_a_failure_into_success(sandbox):
    result = sandbox.run(FORGE_ALL_FDS + "raise SystemExit(3)")
    assert not result.ok and result.returncode == 3 and result.error_kind == ErrorKind.ERROR


@BOTH_TRAINERS
def test_forged_status_lines_do_not_disturb_a_concurrent_call(sandbox):
    generation = sandbox._generation
    results = {}

    def innocent():
        results["innocent"] = sandbox.run("import time\ntime.sleep(0.5)\nprint('innocent')")

    thread = threading.Thread(target=innocent)
    thread.start()
    for _ in range(3):
        attacker = sandbox.run(FORGE_ALL_FDS + "print('attacker')")
        assert attacker.ok and attacker.stdout == "attacker\n"
    thread.join()
    assert results["innocent"].ok and results["innocent"].stdout == "innocent\n"
    assert sandbox._generation == generation  # no restart because of a call


@pytest.mark.parametrize(
    "text",
    [
        "sandbox setup failed: Traceback",
        "MemoryError",
        "OSError: [Errno 27] File too large",
        "TimeoutError: execution exceeded the time limit",
        "Killed",
    ],
)
def test_stderr_text_does_not_choose_the_error_kind(sandbox, text):
    failed = sandbox.run(f"import sys\nprint({text!r}, file=sys.stderr)\nsys.exit(1)")
    assert failed.error_kind == ErrorKind.ERROR and not failed.timed_out
    fine = sandbox.run(f"import sys\nprint({text!r}, file=sys.stderr)")
    assert fine.ok and fine.error_kind is None


@BOTH_TRAINERS
def test_exit_status_70_is_not_a_sandbox_failure(sandbox):
    # 70 is what a call whose set-up failed exits with; here the code chose it.
    result = sandbox.run("import sys\nsys.exit(70)")
    assert result.error_kind == ErrorKind.ERROR and result.returncode == 70


@BOTH_TRAINERS
def test_exit_statuses_and_signals_are_reported_as_the_kernel_saw_them(sandbox):
    assert sandbox.run("import os\nos._exit(5)").returncode == 5
    crash = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)")
    assert crash.returncode == -6 and crash.error_kind == ErrorKind.CRASH


@BOTH_TRAINERS
def test_closing_stdio_and_killing_the_parent_do_not_fake_anything(sandbox):
    code = (
        "import os, signal\nos.close(1)\nos.close(2)\n"
        "for pid in (os.getppid(), 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\nos._exit(4)"
    )
    result = sandbox.run(code)
    assert result.returncode == 4 and result.error_kind == ErrorKind.ERROR
    assert sandbox.run("print(1)").ok
