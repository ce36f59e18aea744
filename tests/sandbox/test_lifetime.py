"""No call outlives its supervisor, on any exit path.

Each test leaves a `sleep <marker>` daemon (setsid, double fork) or a sleeping
snippet behind and then ends the sandbox in a different way.
"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from retool.errors import SandboxError
from retool.sandbox import ErrorKind, LocalSandbox

from .helpers import (
    REPO,
    RETOOL,
    appeared,
    daemon_code,
    gone,
    handler_of,
    kill_all,
    procs_with,
    wait_for,
)


def _marker() -> str:
    return f"{7000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"


def test_close_kills_a_call_in_flight_and_its_daemons():
    marker = _marker()
    sb = LocalSandbox(max_workers=2, timeout=60)
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = sb.run(daemon_code(marker, "import time\ntime.sleep(60)"))
        except SandboxError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert appeared(marker)
        sb.close()
        assert gone(marker), "close() left the call's daemon alive"
        thread.join(10)
        assert not thread.is_alive()
        assert "error" in outcome and "closed" in str(outcome["error"])
    finally:
        kill_all(marker)
        sb.close()


def test_run_after_close_is_a_clear_sandbox_error():
    sb = LocalSandbox(max_workers=1, timeout=5)
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sb.run("print(1)")
    sb.close()  # idempotent


async def test_arun_after_close_is_a_clear_sandbox_error():
    sb = LocalSandbox(max_workers=1, timeout=5)
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        await sb.arun("print(1)")


def _trainer_script(marker: str, isolation: str = "auto") -> str:
    code = daemon_code(marker, "import time\ntime.sleep(120)")
    return textwrap.dedent(
        f"""
        import sys
        from retool.sandbox import LocalSandbox
        sb = LocalSandbox(max_workers=1, timeout=120, isolation={isolation!r})
        print("started", sb._dir, flush=True)
        sb.run({code!r})
        """
    )


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_trainer_sigkill_mid_call_kills_the_call(isolation):
    marker = _marker()
    trainer = subprocess.Popen(
        [sys.executable, "-c", _trainer_script(marker, isolation)],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        started, workdir = trainer.stdout.readline().decode().split()
        assert started == "started"
        assert appeared(marker)
        trainer.kill()  # SIGKILL: no cleanup code of ours runs in the trainer
        trainer.wait()
        assert gone(marker), "the call's daemon outlived a SIGKILLed trainer"
        assert wait_for(lambda: not os.path.exists(workdir))  # the reaper cleaned up
    finally:
        trainer.kill()
        kill_all(marker)


def test_trainer_sigkill_kills_the_call_even_if_a_forked_child_holds_the_lifeline(tmp_path):
    marker = _marker()
    snippet = tmp_path / "snippet.py"  # not on the trainer's command line: its child
    snippet.write_text(daemon_code(marker, "import time\ntime.sleep(120)"))  # lives on
    script = textwrap.dedent(
        f"""
        import os, time
        from retool.sandbox import LocalSandbox
        sb = LocalSandbox(max_workers=1, timeout=120)
        child = os.fork()  # inherits every descriptor, the server's stdin pipe included
        if child == 0:
            time.sleep(60)
            os._exit(0)
        print("started", child, flush=True)
        sb.run(open({str(snippet)!r}).read())
        """
    )
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=REPO)
    child = None
    try:
        started, child_text = trainer.stdout.readline().decode().split()
        child = int(child_text)
        assert started == "started"
        assert appeared(marker)
        trainer.kill()
        trainer.wait()
        assert gone(marker), "a forked child of the trainer kept the call alive"
    finally:
        trainer.kill()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        kill_all(marker)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_exec_stopped_by_a_signal_leaves_nothing(sig, tmp_path):
    marker = _marker()
    snippet = tmp_path / "snippet.py"
    snippet.write_text(daemon_code(marker, "import time\ntime.sleep(120)"))
    cli = subprocess.Popen(
        [RETOOL, "sandbox", "exec", "--timeout", "120", str(snippet)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert appeared(marker)
        cli.send_signal(sig)
        cli.wait(30)
        assert gone(marker), f"the snippet survived {sig.name} to `retool sandbox exec`"
    finally:
        cli.kill()
        kill_all(marker)


def test_a_dead_handler_fails_only_its_own_call_and_is_not_rerun():
    marker = _marker()
    with LocalSandbox(max_workers=2, timeout=60) as sb:
        assert sb.run("print(0)").ok
        generation = sb._generation
        outcome: dict = {}

        def victim():
            outcome["victim"] = sb.run(
                f"import os\nos.execv('/bin/sleep', ['sleep', '{marker}'])", timeout=60
            )

        thread = threading.Thread(target=victim)
        thread.start()
        assert appeared(marker)
        other = threading.Thread(
            target=lambda: outcome.update(other=sb.run("import time\ntime.sleep(1)\nprint(2)"))
        )
        other.start()
        os.kill(handler_of(procs_with(marker)[0], sb._server.pid), signal.SIGKILL)
        thread.join(30)
        other.join(30)
        assert outcome["victim"].error_kind == ErrorKind.SANDBOX
        assert outcome["other"].stdout == "2\n"  # the concurrent call is unaffected
        assert gone(marker), "the call of a dead handler kept running"
        assert sb._generation == generation  # the server was not restarted
        assert sb.run("print(1)").stdout == "1\n"
        # The code was delivered once: nothing runs it again.
        assert not procs_with(marker)


def test_timeout_kills_a_daemon_that_ignores_sigterm():
    marker = _marker()
    code = "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + daemon_code(
        marker, "while True:\n    time.sleep(1)"
    )
    with LocalSandbox(max_workers=1, timeout=60) as sb:
        result = sb.run(code, timeout=1.5)
        assert result.error_kind == ErrorKind.TIMEOUT
        assert gone(marker)


def test_basic_level_kills_setsid_daemons_too():
    marker = _marker()
    with LocalSandbox(max_workers=1, timeout=10, isolation="none") as sb:
        result = sb.run(daemon_code(marker, "print('parent done')"))
        assert result.ok and result.stdout == "parent done\n"
        assert gone(marker)


def test_a_trainer_holding_many_descriptors_still_reuses_connections():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip("cannot open more than 1024 descriptors here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        with LocalSandbox(max_workers=1, timeout=10) as sb:
            assert [sb.run(f"print({i})").stdout for i in range(3)] == ["0\n", "1\n", "2\n"]
            assert sb.connections_opened == 1
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
