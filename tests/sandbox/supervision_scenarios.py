"""Attacks on the call's supervision, as any trainer runs them: helpers of the call
with weaker limits, its init within its reach, CPU taken from the trainer, and
verdicts forged by the call.

Every scenario opens its own sandboxes, plays the attacker in the call (and
the trainer's side where the attack is on the trainer), and returns plain
JSON facts; the assertions live in ``test_supervision.py``. The module
imports only the standard library and ``retool.sandbox`` because
``tests/sandbox/trainers.py`` also runs it as a *non-root trainer*: a
dedicated uid, the system Python and a copy of the package, since two of the
attacks exist only when the call and its init share a uid.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

from retool.sandbox import LocalSandbox, format_tool_content

PRELOAD = ("math", "fractions")  # standard library only: a fork server without numpy
LEVELS = ("auto", "none")  # full (where namespaces work) and basic


def _sandbox(isolation: str = "auto", timeout: float = 5.0) -> LocalSandbox:
    return LocalSandbox(
        timeout=timeout,
        memory_mb=256,
        max_workers=2,
        preload=PRELOAD,
        isolation=isolation,
        max_output_bytes=4096,
    )


def _result(result: Any) -> dict[str, Any]:
    facts = result.to_dict()
    facts["error_kind"] = None if result.error_kind is None else str(result.error_kind)
    facts["text"] = format_tool_content(result)
    return facts


def _describe(sandbox: LocalSandbox) -> dict[str, Any]:
    return {"level": sandbox.isolation_level.value, "missing": list(sandbox.missing)}


# -- no helper of the call with weaker limits or more descriptors -------------------
_LIMITS = ("Max cpu time", "Max file size", "Max address space", "Max open files", "Max nice")


def _limits(pid: int) -> dict[str, str]:
    found = {}
    with open(f"/proc/{pid}/limits") as handle:
        for line in handle:
            for name in _LIMITS:
                if line.startswith(name):
                    found[name] = " ".join(line[len(name) :].split()[:2])
    return found


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{entry}/stat") as handle,
            ):
                parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def _processes_writing(server: int, path: str) -> list[int] | None:
    """The server's descendants whose stdout is ``path`` (the running call's); None
    where this trainer may not look (a non-root trainer without a user namespace)."""
    found = []
    for pid in _descendants(server):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == path:
                found.append(pid)
        except FileNotFoundError:
            continue
        except PermissionError:
            return None
    return found


_INSPECT_HELPERS = """
import ctypes, json, os, time
# Our memory is the helper's: making it dumpable opens the helper's /proc to us.
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
def limits(pid):
    keep = ('Max cpu time', 'Max file size', 'Max address space', 'Max open files', 'Max nice')
    with open(f'/proc/{pid}/limits') as handle:
        return {l[:26].strip(): l[26:].split()[:2] for l in handle if l.startswith(keep)}
def parent(pid):
    with open(f'/proc/{pid}/stat') as handle:
        return int(handle.read().rsplit(')', 1)[1].split()[1])
me = os.getpid()
helpers = []
for entry in os.listdir('/proc'):
    if not entry.isdigit() or int(entry) == me:
        continue
    try:
        mine = parent(int(entry)) == me
    except OSError:  # another process of the host, gone meanwhile (basic level)
        continue
    if mine:
        try:
            helpers.append({'fds': sorted(map(int, os.listdir(f'/proc/{entry}/fd'))),
                            'limits': limits(int(entry))})
        except OSError as exc:
            helpers.append({'error': str(exc)})
print(json.dumps({'self': limits(me), 'helpers': helpers}), flush=True)
print('up', flush=True)
time.sleep(1.5)
"""


def helper_processes() -> dict[str, Any]:
    """While a call runs, every process of it as the call sees its helpers (itself
    made dumpable), and as the trainer sees them where it may (``procs``)."""
    out: dict[str, Any] = {}
    code = _INSPECT_HELPERS
    for isolation in LEVELS:
        with _sandbox(isolation, timeout=10.0) as sandbox:
            assert sandbox._server is not None
            server = sandbox._server.pid
            calls = os.path.join(sandbox._dir, "calls")
            box: list[Any] = []
            thread = threading.Thread(target=lambda b=box, s=sandbox: b.append(s.run(code)))
            thread.start()
            procs: list[dict[str, Any]] | None = []
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                outs = [
                    os.path.join(calls, name)
                    for name in os.listdir(calls)
                    if name.endswith(".out") and os.path.getsize(os.path.join(calls, name))
                ]
                if outs:
                    time.sleep(0.2)  # the call is past "up": whatever it holds, it holds now
                    pids = _processes_writing(server, outs[0])
                    if pids is None:
                        procs = None
                    else:
                        procs = []
                        for pid in pids:
                            with contextlib.suppress(FileNotFoundError):
                                procs.append(
                                    {
                                        "pid": pid,
                                        "fds": sorted(map(int, os.listdir(f"/proc/{pid}/fd"))),
                                        "limits": _limits(pid),
                                    }
                                )
                    break
                time.sleep(0.02)
            thread.join()
            out[isolation] = {**_describe(sandbox), "procs": procs, "result": _result(box[0])}
    return out


# -- the call's init is out of its reach --------------------------------------------
_KILL_INIT = """
import os, signal, time
init = os.getppid()
refused = []
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGKILL):
    try:
        os.kill(init, sig)
    except OSError as exc:
        refused.append(sig.name)
time.sleep(0.3)
print('refused', ','.join(refused))
print('ran to the end')
"""
_DRAIN_INIT = """
import os
init = os.getppid()
drained, opened, denied = 0, 0, 0
try:
    fds = os.listdir(f'/proc/{init}/fd')
except OSError:
    fds, denied = [], 1
for fd in fds:
    try:
        handle = os.open(f'/proc/{init}/fd/{fd}', os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        denied += 1
        continue
    opened += 1
    try:
        drained += len(os.read(handle, 4096))
    except OSError:
        pass
for name in ('mem', 'environ'):
    try:
        open(f'/proc/{init}/{name}', 'rb').read(1)
        opened += 1
    except OSError:
        denied += 1
print('opened', opened, 'drained', drained, 'denied', denied)
print('ran to the end')
"""
_KILL_EVERYTHING = """
import os
me, killed = os.getpid(), 0
for entry in os.listdir('/proc'):
    if entry.isdigit() and int(entry) != me:
        try:
            os.kill(int(entry), 9)
            killed += 1
        except OSError:
            pass
print('killed', killed)
print('ran to the end')
"""


def init_reach() -> dict[str, Any]:
    """The call signals its init, reads its descriptors and memory, kills all it can."""
    out: dict[str, Any] = {}
    for isolation in LEVELS:
        with _sandbox(isolation) as sandbox:
            results = {
                name: _result(sandbox.run(code))
                for name, code in (
                    ("kill_init", _KILL_INIT),
                    ("drain_init", _DRAIN_INIT),
                    ("kill_everything", _KILL_EVERYTHING),
                )
            }
            results["after"] = _result(sandbox.run("print(6 * 7)"))
            out[isolation] = {**_describe(sandbox), "results": results}
    return out


# -- CPU ---------------------------------------------------------------------------
_PRIORITY = """
import os, resource
policy = os.sched_getscheduler(0)
nice = os.getpriority(os.PRIO_PROCESS, 0)
try:
    os.setpriority(os.PRIO_PROCESS, 0, nice - 1)
    lowered = True
except OSError:
    lowered = False
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    realtime = True
except OSError:
    realtime = False
cpu = [line.split(':', 2)[2] for line in open('/proc/self/cgroup') if ':cpu:' in line
       or ':cpu,' in line]
print(policy, nice, int(lowered), int(realtime), resource.getrlimit(resource.RLIMIT_NICE)[0],
      (cpu or ['-'])[0].strip() or '-')
"""
_SPIN = """
import os, time
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
for _ in range(24):
    if os.fork() == 0:
        os.setsid()  # a session, and so an autogroup, of its own each (the attack)
        for value in ('0', '-20'):
            try:
                with open('/proc/self/autogroup', 'w') as handle:
                    handle.write(value)
            except OSError:
                pass
        try:
            os.nice(-10)
        except OSError:
            pass
        spin(3.5)
        os._exit(0)
spin(3.5)
print('spun')
"""


def _loop_rate(window: float = 0.3) -> float:
    """Iterations per second of a plain Python loop: the trainer's own speed."""
    n, end = 0, time.perf_counter() + window
    while time.perf_counter() < end:
        n += 1
    return n / window


def cpu_share() -> dict[str, Any]:
    """The trainer's loop speed alone and while a call spins 25 processes."""
    out: dict[str, Any] = {"trainer_nice": os.getpriority(os.PRIO_PROCESS, 0)}
    realtime = False
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        realtime = True
    except OSError:
        pass
    try:
        sandbox = _sandbox("auto", timeout=8.0)  # started by a real-time trainer, if it can
    finally:
        if realtime:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with sandbox:
        out.update(_describe(sandbox))
        out["cpu"] = getattr(sandbox, "cpu_isolation", "")
        out["trainer_realtime"] = realtime
        out["priority"] = _result(sandbox.run(_PRIORITY))
        alone = statistics.median(_loop_rate() for _ in range(3))
        box: list[Any] = []
        thread = threading.Thread(target=lambda: box.append(sandbox.run(_SPIN)))
        thread.start()
        time.sleep(0.8)  # the spinners are up
        during = statistics.median(_loop_rate() for _ in range(3))
        thread.join()
        out["alone"], out["during"] = alone, during
        out["slowdown"] = alone / max(during, 1.0)
        out["spin"] = _result(box[0])
    return out


# -- kinds only from the supervisor's facts ----------------------------------------
_OWN_VERDICTS = {
    "sigkill": "import os\nprint('before', flush=True)\nos.kill(os.getpid(), 9)",
    "sigxcpu": "import os, signal\nsignal.signal(signal.SIGXCPU, signal.SIG_DFL)\n"
    "os.kill(os.getpid(), signal.SIGXCPU)",
    "sigxfsz": "import os, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
    "os.kill(os.getpid(), signal.SIGXFSZ)",
    "sparse_stdout": "import os\nos.lseek(1, 8 * 2**20 - 1, 0)\nos.write(1, b'x')\n"
    "raise SystemExit(3)",
    "sparse_stderr": "import os\nos.lseek(2, 8 * 2**20 - 1, 0)\nos.write(2, b'x')\n"
    "raise SystemExit(3)",
    "exit137": "raise SystemExit(137)",
    "flood": "import sys\nchunk = 'x' * (1 << 20)\n"
    "for _ in range(12):\n    sys.stdout.write(chunk)",
    "sleep": "import time\ntime.sleep(10)",
}


def own_verdicts() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _sandbox("auto", timeout=1.5) as sandbox:
        out.update(_describe(sandbox))
        out["results"] = {name: _result(sandbox.run(code)) for name, code in _OWN_VERDICTS.items()}
    return out


SCENARIOS = {
    "helper_processes": helper_processes,
    "init_reach": init_reach,
    "cpu_share": cpu_share,
    "own_verdicts": own_verdicts,
}


def run_all() -> dict[str, Any]:
    results: dict[str, Any] = {"uid": os.geteuid()}
    for name, scenario in SCENARIOS.items():
        try:
            results[name] = scenario()
        except Exception as exc:  # one broken scenario must not hide the others
            results[name] = {"scenario_error": f"{type(exc).__name__}: {exc}"}
    return results


if __name__ == "__main__":
    print(json.dumps(run_all()))
    sys.stdout.flush()
