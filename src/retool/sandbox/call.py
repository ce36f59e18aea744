"""B and C: a call's trusted init and the call itself (``server.py`` draws the tree).

The zygote forks B with a :class:`CallSpec` (what it decided: uid, cgroup, root,
filter; never request data) before any code arrives, so namespace, cgroup and
mount set-up are off the critical path. B (``child_b``) makes itself unreachable
from its call, enters the call's namespaces, cgroup, keyring and root
(``rootfs.py``), and forks C. C (``_child_c``) takes a uid of its own or drops
every capability, lowers its priority, sets no_new_privs, Landlock (basic level)
and seccomp, reads the request from a pipe, sets its rlimits, sends B one
"set-up done" byte and closes that pipe, then runs the code. B reports that byte
and C's wait status on a pipe C never holds: the only facts the handler takes
from a call. ``run_file`` is the entry point of fresh mode, in the interpreter C
executes instead of running the code itself.

Also here: the isolation levels and the per-call limits every other module
of the server reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import cgroups, landlock, linux, seccomp
from .autoprint import add_autoprint
from .boot import FRESH_BOOT
from .rootfs import DEV_NODES, HOSTNAME, build_root
from .runtime import exit_now, run_code, write_text

FULL, BASIC = "full", "basic"
MAX_PROCS = 64  # processes per call (fork bombs stop here)
MAX_FILE_BYTES = 8 << 20  # largest file a call may write (stdout/stderr included)
MAX_OPEN_FILES = 64
SANDBOX_STATUS = 70  # C's exit status when its set-up failed (a fact only with ready=0)
CALL_NICE = 10  # a call's nice value above the trainer's (at most 19): never ahead of it
PIN = True  # the address-space pin (the server clears it for --disable pin: benchmarks)


def _vm_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _apply_limits(request: dict[str, Any], own_uid: bool) -> None:
    headroom = int(request["memory_mb"]) << 20
    vm = _vm_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = int(request["timeout"]) + 2 + int(resource.getrusage(resource.RUSAGE_SELF).ru_utime)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if own_uid:  # RLIMIT_NPROC is ignored for uid 0; our uid is unprivileged by now
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCS, MAX_PROCS))


def _lower_priority(nice: int) -> None:
    """Make the call never more important than the trainer, for good.

    SCHED_OTHER whatever policy the trainer (and so the server) runs under, a
    nice value ``nice`` (the trainer's plus ``CALL_NICE``), RLIMIT_NICE and
    RLIMIT_RTPRIO 0 so that neither can be raised back by an unprivileged uid
    (or root without capabilities). Against the trainer, what counts is the
    entity the call is scheduled in: its cpu cgroup (see :mod:`.cgroups`) or,
    without one, the server's session autogroup, which all calls share and
    which weighs one nice-0 process like the trainer's own session (a nice-19
    autogroup starved calls into 270 ms for ``print`` on a loaded machine).
    Off the critical path: runs while the call is prepared.
    """
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    for limit in (resource.RLIMIT_NICE, resource.RLIMIT_RTPRIO):
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(limit, (0, 0))


def _reseed() -> None:
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


@dataclass(frozen=True)
class CallSpec:
    """What the zygote decided for one call (no request data in here)."""

    level: str
    uid: int | None  # the call's own uid (root server only)
    new_root: str
    scratch: str | None
    fresh: bool
    group: cgroups.Group | None
    binds: tuple[str, ...]
    masks: tuple[str, ...]
    boot_path: str  # import path for fresh-interpreter mode
    seccomp: bytes | None = None  # the BPF program, built once per zygote
    landlock_abi: int = 0  # basic level: confine the call with Landlock (0: off)
    off: frozenset[str] = frozenset()  # layers left out (benchmarks only)
    nice: int = 19  # the call's nice value (the trainer's plus CALL_NICE)


def _child_c(spec: CallSpec, code_r: int, ready_w: int, out_fd: int, err_fd: int) -> None:
    """C: drop privileges, wait for the request, limit, tell B, run. Never returns."""
    status = SANDBOX_STATUS
    parent = os.getppid()
    try:
        # A process group of its own, away from B's; but the server's session: without
        # a cpu cgroup a session is a scheduler autogroup, as heavy as the trainer's,
        # so all calls of a sandbox share one (new sessions are a no-op for the code).
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # B has SIG_DFL
        _lower_priority(spec.nice)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        close_all_except(code_r, ready_w, 0, 1, 2)
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")  # under the memory limit, the call dies before its init
        if spec.uid is not None:
            os.setgroups([])
            os.setresgid(spec.uid, spec.uid, spec.uid)
            os.setresuid(spec.uid, spec.uid, spec.uid)
        elif os.geteuid() == 0:  # a non-root trainer: root of the server's user namespace
            linux.drop_all_capabilities()
        # After the uid change, which clears it; then make sure B is still there.
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(status)
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        if spec.landlock_abi:
            landlock.restrict(
                [*spec.binds, "/proc"],
                [os.getcwd()],
                [f"/dev/{node}" for node in DEV_NODES],
                spec.landlock_abi,
            )
        if spec.seccomp is not None:
            seccomp.install(spec.seccomp)
        with os.fdopen(code_r, "rb") as handle:
            raw = handle.read()
        if not raw:
            os._exit(0)  # the handler went away before sending code
        request = json.loads(raw)
        os.environ["HOME"] = os.environ["TMPDIR"] = os.getcwd()
        _apply_limits(request, own_uid=spec.uid is not None)
        if spec.fresh:  # a new interpreter reports "ready" itself, then runs the file
            path = os.path.join(os.getcwd(), ".retool_code.py")
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as handle:
                handle.write(request["code"])  # the client refuses surrogates: as-is
            os.set_inheritable(ready_w, True)
            os.execv(
                sys.executable,
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    FRESH_BOOT,
                    spec.boot_path,
                    path,
                    str(ready_w),
                ],
            )
        os.write(ready_w, b"1")  # set-up done: from here on, only the code runs
        os.close(ready_w)
        if PIN and not spec.fresh and (spec.level == FULL or spec.group is not None):
            # The pin shares our memory, so the code can steer it: it is created only
            # now, with every limit, the seccomp filter and uid of the call already in
            # force and no descriptor but stdio (code_r and ready_w are closed), so it
            # can do nothing the call itself could not. Something kills it (cgroup,
            # PID namespace).
            with contextlib.suppress(OSError):
                linux.pin_address_space()
        _reseed()
        status = run_code(request["code"], add_autoprint) & 0xFF
    except BaseException:
        with contextlib.suppress(BaseException):
            write_text(2, "sandbox setup failed: " + traceback.format_exc())
    exit_now(status & 0xFF)


def run_file() -> None:
    """Entry point of fresh-interpreter mode: run the file ``argv[1]`` after telling
    B on fd ``argv[2]`` that set-up is done (and closing that fd)."""
    path, ready_w = sys.argv[1], int(sys.argv[2])
    with contextlib.suppress(OSError):  # its arguments name the work directory
        linux.hide_command_line("retool-sandbox")
    with open(path, encoding="utf-8", errors="surrogatepass") as handle:
        code = handle.read()
    os.unlink(path)
    os.write(ready_w, b"1")
    os.close(ready_w)
    exit_now(run_code(code, add_autoprint) & 0xFF)


def _unshare_call_namespaces(off: frozenset[str]) -> None:
    """B's own namespaces: mount, IPC, UTS with a host name of the sandbox's, and a
    network namespace per call, so calls share no socket name space: no abstract
    Unix names, socketpair hand-overs or port collisions between two calls, and
    ``/proc/net`` lists only the call's own sockets (empty, down loopback)."""
    flags = linux.CLONE_NEWNS | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS
    if "netns" not in off:
        flags |= linux.CLONE_NEWNET
    linux.unshare(flags)
    linux.sethostname(HOSTNAME)
    if "timens" not in off:
        _fresh_clocks()


def _fresh_clocks() -> None:
    """A time namespace for B's children (the call): CLOCK_MONOTONIC and
    CLOCK_BOOTTIME, and so ``sysinfo``'s uptime, start again near 0, so the call
    learns neither how long the host has been up nor, from two calls' clocks,
    anything that a fresh start per call would not show. Offsets must be written
    before a process enters the namespace: C is forked after this."""
    linux.unshare(linux.CLONE_NEWTIME)
    lines = [
        f"{name} {-int(time.clock_gettime(clock))} 0"
        for name, clock in (("monotonic", time.CLOCK_MONOTONIC), ("boottime", time.CLOCK_BOOTTIME))
    ]
    with open("/proc/self/timens_offsets", "w") as handle:
        handle.write("\n".join(lines) + "\n")


def _out_of_reach() -> None:
    """Put B (the call's init) out of its call's reach, on every trainer.

    Under a non-root trainer B and C share a uid, so by uid alone C could open
    ``/proc/<B>/fd`` (drain the set-up byte: "the code did not run"), write
    ``/proc/<B>/mem`` or signal B. Non-dumpable, B's ``/proc`` entries and
    memory need ``CAP_SYS_PTRACE``, which the call never has (C inherits the flag;
    the call's own processes are no one else's way in). Every signal is at its
    default disposition: as PID 1 of its namespace (full level) B then receives
    no signal from inside the namespace at all, not even SIGKILL; Python's SIGINT
    handler would otherwise let the call stop B with a KeyboardInterrupt. At the
    basic level B is out of reach by uid when the trainer is root, and by
    Landlock's signal scope (ABI 6) otherwise, which ``missing`` reports.
    """
    linux.prctl(linux.PR_SET_DUMPABLE, 0)
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):  # SIG_IGN stays: C relies on it
                signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it; B waits for C


def child_b(
    spec: CallSpec, code_r: int, done_w: int, out_fd: int, err_fd: int
) -> None:  # pragma: no cover - runs in a forked child
    """B: trusted init of the call. Never returns.

    Reports ``"<ready> <wait status of C>"`` on ``done_w``, a pipe C never
    holds, as soon as C exits: waiting for the kernel to tear down a PID
    namespace takes tens of milliseconds, which would otherwise sit on every
    call's critical path.
    """
    try:
        close_all_except(code_r, done_w, out_fd, err_fd, 0, 1, 2)
        _out_of_reach()
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if spec.level == FULL:  # PID 1 already; the rest of the namespaces now
            _unshare_call_namespaces(spec.off)
        # A trainer under a real-time policy passes it to the server and so to B:
        # never to a call (and a cpu cgroup without real-time runtime refuses it).
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if spec.group is not None:
            spec.group.enter()
        if spec.level == FULL and "cgroupns" not in spec.off:
            # After joining the call's cgroup: it becomes this namespace's root, so
            # /proc/self/cgroup shows "/" (no host path, server pid or call counter).
            linux.unshare(linux.CLONE_NEWCGROUP)
        with contextlib.suppress(OSError):
            linux.join_new_session_keyring()
        if spec.level == FULL:
            uid = 0 if spec.uid is None else spec.uid
            build_root(spec.new_root, list(spec.binds), list(spec.masks), uid, spec.off)
            os.chdir("/tmp")
        else:
            assert spec.scratch is not None
            os.chdir(spec.scratch)
        ready_r, ready_w = os.pipe()
        pid_c = os.fork()
        if pid_c == 0:
            os.close(ready_r)
            os.close(done_w)
            _child_c(spec, code_r, ready_w, out_fd, err_fd)
        os.close(ready_w)
        for fd in (code_r, out_fd, err_fd):
            os.close(fd)
        _, status = os.waitpid(pid_c, 0)
        # Read after the exit (no wake-up mid-call), without blocking: an empty
        # pipe means set-up never finished.
        os.set_blocking(ready_r, False)
        try:
            ready = os.read(ready_r, 1) == b"1"
        except BlockingIOError:
            ready = False
        os.close(ready_r)
        os.write(done_w, f"{int(ready)} {status}\n".encode())
    except BaseException:
        with contextlib.suppress(OSError):
            os.write(err_fd, ("sandbox setup failed: " + traceback.format_exc()).encode())
    os._exit(0)


def close_all_except(*keep: int) -> None:
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:  # closerange(n, n) would close everything from n on
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
