"""The fork server: a clean interpreter that forks one isolated child per call.

Process tree, and why each level exists::

    trainer (LocalSandbox)        holds secrets; never forks model code; holds the
    │                             only write end of the server's stdin (the lifeline)
    └─ server                     ``python -I -S``, empty environment, its own cwd,
       │                          only explicit import paths; imports ``preload``
       │                          once; owns an empty network namespace
       ├─ reaper                  waits for the lifeline (or the server) to end, then
       │                          kills the instance's cgroup whole and removes it
       └─ zygote (per connection)  forks calls; never receives a request or a result,
          │                        so calls cannot find earlier calls' data in memory
          ├─ handler               serves the connection; runs the calls the zygote
          │                        prepared; the supervisor's timer and facts live here
          └─ B: PID 1 (per call)   cloned into a new PID namespace; trusted init:
             │                     new mount/IPC/UTS namespaces, the call's cgroup, a
             │                     fresh keyring, a bubblewrap-style root; reports C's
             │                     wait status on a pipe only B holds
             └─ C: the call        unprivileged uid (or no capabilities), pdeathsig,
                                   no_new_privs, seccomp, rlimits; then runs the code

B and C are forked *before* the code arrives (two per handler), so
namespace, cgroup and mount set-up are off the critical path. When the call
ends or times out, the handler kills its cgroup (every process, whatever its
parentage) and B's PID namespace goes with B. Nothing the call can write is
read as a fact: the exit status is C's wait status as B saw it, "did the code
start" is one byte C sends B before running any code and then closes, memory
kills come from the cgroup's OOM counter, timeouts from the handler's timer.
stdout/stderr go to files, never pipes, and only the tail is read.

Without namespaces (some containers) the same tree runs with rlimits, seccomp,
Landlock (read-only OS paths, writes only in the scratch dir), an empty
environment, a scratch cwd, a dedicated uid when root, and the call's cgroup
(or process group and uid) killed after each call: the ``basic`` level.

Wire format: 4-byte big-endian length + JSON, both directions.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import importlib
import json
import os
import queue
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import cgroups, landlock, linux, relocate, seccomp
from .autoprint import add_autoprint
from .runtime import exit_now, run_code, write_text

FULL, BASIC = "full", "basic"
UID_BASE = 1_500_000_000  # sandbox uids (root server): one block of UID_BLOCK per instance
UID_BLOCK = 1 << 16
UID_BLOCKS = 4096
UIDS_PER_HANDLER = 8  # > calls a handler has prepared or running at once (3)
MAX_PROCS = 64  # processes per call (fork bombs stop here)
MAX_FILE_BYTES = 8 << 20  # largest file a call may write (stdout/stderr included)
MAX_OPEN_FILES = 64
TMPFS_MB = 64  # private /tmp of a call
TMPFS_INODES = 4096  # files a call may create in its /tmp and /dev/shm
PREPARE_AHEAD = 3  # calls each handler keeps prepared (or being prepared) ahead
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
SANDBOX_STATUS = 70  # C's exit status when its set-up failed (a fact only with ready=0)
CALL_NICE = 10  # a call's nice value above the trainer's (at most 19): never ahead of it
_PIN = True  # the address-space pin (off only to measure what it saves: --disable pin)


# -- framing -------------------------------------------------------------------
@contextlib.contextmanager
def unix_socket_path(path: str) -> Iterator[str]:
    """A path to ``path`` short enough for ``bind``/``connect`` whatever its length.

    A Unix socket's address holds at most 107 bytes, and a sandbox's directory
    lies under ``TMPDIR``, which a user or a test runner may make long (pytest's
    per-worker directories were enough to fail the server's start). The
    directory is opened and named through ``/proc/self/fd/N``, which resolves
    like the real path: the socket is the same inode either way.
    """
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


def send_frame(sock: socket.socket, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    header = _recv_exact(sock, 4)
    if header is None:
        return None
    body = _recv_exact(sock, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body)


# -- the isolated root ---------------------------------------------------------
def readonly_paths() -> list[str]:
    """Host paths B sees (read-only): the OS, the interpreter, the import path.

    The server runs with ``-I -S`` and an explicit ``sys.path`` (the standard
    library, site-packages, our runtime copy), so nothing of the caller's cwd
    or checkout is among them.
    """
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)]
    paths += [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)]
    seen: list[str] = []
    for path in sorted(
        {os.path.realpath(p) if not os.path.islink(p) else p for p in paths if os.path.lexists(p)},
        key=len,
    ):
        if path == "/":
            continue  # never the whole host
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            seen.append(path)
    return seen


def _is_site(entry: str) -> bool:
    """A site-packages directory: by its name, or at its neutral path (/opt/site...)."""
    entry = entry.rstrip("/")
    neutral = entry.startswith(NEUTRAL_SITE) and entry[len(NEUTRAL_SITE) :].isdigit()
    return entry.endswith(("site-packages", "dist-packages")) or entry == NEUTRAL_SITE or neutral


def masked_paths() -> list[str]:
    """Paths hidden from calls (an empty read-only tmpfs over a directory, an empty
    file over a file): our own package, if it is installed (not editable) in
    site-packages, carries data and answers; install metadata names where things
    were installed from (an editable install's ``.pth`` and finder name the
    checkout; ``direct_url.json`` the source directory or URL); our
    distribution's ``dist-info`` lists our files."""
    found = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        candidate = os.path.join(entry, "retool")
        if os.path.isdir(candidate):
            found.append(os.path.realpath(candidate))
        if not _is_site(entry):
            continue
        for name in sorted(os.listdir(entry)):
            path = os.path.join(entry, name)
            editable = name.startswith("__editable__") or name.endswith((".pth", ".egg-link"))
            if editable or name.startswith(("retool_rl-", "retool_rl.")):
                found.append(path)
            elif name.endswith(".dist-info") and os.path.exists(f"{path}/direct_url.json"):
                found.append(f"{path}/direct_url.json")
    return list(dict.fromkeys(found))


# Host facts a call must not read, which no namespace hides: an empty file goes over
# each (as container runtimes do for /proc/kcore & co.). /proc/stat, /proc/loadavg and
# the other counters carry host-wide fork, thread, fault, interrupt, disk and pressure
# figures that reveal what other calls do.
PROC_MASKS = (
    "/proc/cmdline",
    "/proc/sys/kernel/random/boot_id",
    "/proc/uptime",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/kallsyms",
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/sys/kernel/ns_last_pid",
    "/proc/vmstat",
    "/proc/schedstat",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/diskstats",
    "/proc/pressure",  # a directory: an empty tmpfs goes over it
)
HOSTNAME = "sandbox"  # the UTS name every call sees
# The /etc of a call: only what the interpreter and the preloaded libraries read
# (the loader's cache, the time zone), plus a passwd/group naming nobody of the host.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "localtime")
_ETC_WRITTEN = {
    "passwd": "root:x:0:0:root:/tmp:/usr/sbin/nologin\n"
    "sandbox:x:{uid}:{uid}:sandbox:/tmp:/usr/sbin/nologin\n",
    "group": "root:x:0:\nsandbox:x:{uid}:\n",
    "hostname": f"{HOSTNAME}\n",
    "hosts": f"127.0.0.1 localhost {HOSTNAME}\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


def _minimal_etc(etc: str, uid: int) -> None:
    """Fill the empty directory ``etc`` (in the call's root) with the minimal /etc."""
    for name in ETC_FILES:
        src = "/etc/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), f"{etc}/{name}")  # localtime -> /usr/share/...
        elif os.path.isfile(src):
            open(f"{etc}/{name}", "w").close()
            linux.mount(src, f"{etc}/{name}", None, linux.MS_BIND)
    for name, text in _ETC_WRITTEN.items():
        with open(f"{etc}/{name}", "w") as handle:
            handle.write(text.format(uid=uid))


def build_root(
    new_root: str,
    binds: list[str],
    masks: list[str],
    uid: int = 0,
    off: frozenset[str] = frozenset(),
) -> None:
    """Mount a minimal read-only root at ``new_root`` and ``pivot_root`` into it.

    ``off``: layers left out, for measuring their cost only (``etc``: the host's
    /etc instead of the minimal one; ``procmask``: no masks over /proc files).
    """
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount("tmpfs", new_root, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m,mode=0755")
    # Private /tmp and /dev/shm first: a bind below /tmp (a venv living there)
    # must land on top of the private tmpfs, not be hidden by it.
    for sub, size in (("/tmp", TMPFS_MB), ("/dev/shm", 16)):
        os.makedirs(new_root + sub, exist_ok=True)
        linux.mount(
            "tmpfs",
            new_root + sub,
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV,
            f"size={size}m,nr_inodes={TMPFS_INODES},mode=1777",
        )
    ro = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    minimal_etc = "etc" not in off
    if minimal_etc:
        binds = [b for b in binds if b != "/etc"]
        os.makedirs(new_root + "/etc")
        _minimal_etc(new_root + "/etc", uid)
    for src in binds:
        dst = new_root + src
        if os.path.islink(src) and os.path.dirname(src) == "/":
            os.symlink(os.readlink(src), dst)  # /bin -> usr/bin on merged-/usr systems
            continue
        os.makedirs(dst, exist_ok=True)
        linux.mount(src, dst, None, linux.MS_BIND | linux.MS_REC)
        linux.mount(None, dst, None, ro)
    empty = new_root + "/.empty"  # what a masked file shows; gone with the root's umount
    open(empty, "w").close()
    os.chmod(empty, 0o444)
    for path in masks:
        with contextlib.suppress(OSError):
            if os.path.isdir(new_root + path):
                linux.mount(
                    "tmpfs",
                    new_root + path,
                    "tmpfs",
                    linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV,
                    "size=4k,nr_inodes=1",
                )
            else:
                linux.mount(empty, new_root + path, None, linux.MS_BIND)
                linux.mount(None, new_root + path, None, ro)
    os.makedirs(new_root + "/dev", exist_ok=True)
    for node in _DEV_NODES:
        dst = f"{new_root}/dev/{node}"
        open(dst, "w").close()
        linux.mount(f"/dev/{node}", dst, None, linux.MS_BIND)
    os.makedirs(new_root + "/proc", exist_ok=True)
    linux.mount(
        "proc", new_root + "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    )
    if "procmask" not in off:
        for path in PROC_MASKS:
            target = new_root + path
            if os.path.isdir(target):
                flags = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
                linux.mount("tmpfs", target, "tmpfs", flags, "size=4k,nr_inodes=1")
            elif os.path.exists(target):
                linux.mount(empty, target, None, linux.MS_BIND)
                linux.mount(None, target, None, ro)
    os.makedirs(new_root + "/.old", exist_ok=True)
    os.chdir(new_root)
    linux.pivot_root(".", ".old")
    os.chdir("/")
    linux.umount2("/.old", linux.MNT_DETACH)
    os.rmdir("/.old")
    os.unlink("/.empty")  # the bind mounts keep its inode; the name goes
    linux.mount(
        None,
        "/",
        None,
        linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_BIND,
    )


# -- C: the call ---------------------------------------------------------------
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
        _close_all_except(code_r, ready_w, 0, 1, 2)
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
                [f"/dev/{node}" for node in _DEV_NODES],
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
                    _FRESH_BOOT,
                    spec.boot_path,
                    path,
                    str(ready_w),
                ],
            )
        os.write(ready_w, b"1")  # set-up done: from here on, only the code runs
        os.close(ready_w)
        if _PIN and not spec.fresh and (spec.level == FULL or spec.group is not None):
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


_FRESH_BOOT = (
    "import sys; sys.path += sys.argv.pop(1).split(':'); "
    "from retool_sandbox_rt.server import run_file; run_file()"
)


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


def _child_b(
    spec: CallSpec, code_r: int, done_w: int, out_fd: int, err_fd: int
) -> None:  # pragma: no cover - runs in a forked child
    """B: trusted init of the call. Never returns.

    Reports ``"<ready> <wait status of C>"`` on ``done_w``, a pipe C never
    holds, as soon as C exits: waiting for the kernel to tear down a PID
    namespace takes tens of milliseconds, which would otherwise sit on every
    call's critical path.
    """
    try:
        _close_all_except(code_r, done_w, out_fd, err_fd, 0, 1, 2)
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


# -- the zygote: prepares calls, never sees a request ----------------------------
@dataclass
class Prepared:
    """An init B and its call C, waiting for code (the handler's view)."""

    pid_b: int  # B's pid in our PID namespace
    code_w: int
    done_r: int  # B: "<ready> <C's wait status>"
    pidfd: int  # B, safe against pid reuse
    out_path: str
    err_path: str
    scratch: str | None
    uid: int | None
    group: cgroups.Group | None


class Zygote:
    """Forks each call's B (and so C) from a process that never held request data."""

    def __init__(
        self,
        index: int,
        level: str,
        workdir: str,
        fresh: bool,
        real_root: bool,
        uid_base: int,
        group: cgroups.Group | None,
        memory_mb: int,
        boot_path: str,
        use_seccomp: bool = True,
        landlock_abi: int = 0,
        off: frozenset[str] = frozenset(),
        calls_dir: str | None = None,
    ) -> None:
        self.off = off
        self.calls_dir = calls_dir or os.path.join(workdir, "calls")
        self.landlock_abi = landlock_abi
        self.seccomp_program = seccomp.build_program() if use_seccomp else None
        self.index = index
        self.level = level
        self.workdir = workdir
        self.fresh = fresh
        self.real_root = real_root
        self.uid_base = uid_base
        self.group = group
        self.memory_mb = memory_mb
        self.boot_path = boot_path
        self.counter = 0
        self.new_root = os.path.join(workdir, "root")
        self.binds = tuple(readonly_paths())
        self.masks = tuple(masked_paths())
        # The server's nice value is the trainer's (inherited): calls stay below it.
        self.nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + CALL_NICE)

    def uid_for(self, counter: int) -> int | None:
        """A uid of its own for each call in flight, in this instance's block."""
        if not self.real_root:
            return None
        slot = self.index % (UID_BLOCK // UIDS_PER_HANDLER)
        return self.uid_base + slot * UIDS_PER_HANDLER + counter % UIDS_PER_HANDLER

    def prepare(self) -> tuple[dict[str, Any], list[int]]:
        """Fork one call; returns its description and the handler's fds."""
        self.counter += 1
        uid = self.uid_for(self.counter)
        name = f"h{self.index}-{self.counter}"
        stem = os.path.join(self.calls_dir, name)
        out_path, err_path = stem + ".out", stem + ".err"
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        out_fd, err_fd = os.open(out_path, flags, 0o600), os.open(err_path, flags, 0o600)
        scratch = None
        if self.level == BASIC:
            scratch = stem + ".scratch"
            os.mkdir(scratch, 0o700)
            if uid is not None:
                os.chown(scratch, uid, uid)
        group = None
        if self.group is not None:
            group = self.group.child(name, (self.memory_mb + 32) << 20, MAX_PROCS + 2)
        spec = CallSpec(
            self.level,
            uid,
            self.new_root,
            scratch,
            self.fresh,
            group,
            self.binds,
            self.masks,
            self.boot_path,
            self.seccomp_program,
            self.landlock_abi if self.level == BASIC else 0,
            self.off,
            self.nice,
        )
        code_r, code_w = os.pipe()
        done_r, done_w = os.pipe()
        pid_b = linux.fork_into_new_pid_namespace() if self.level == FULL else os.fork()
        if pid_b == 0:  # B
            _child_b(spec, code_r, done_w, out_fd, err_fd)
        pidfd = os.pidfd_open(pid_b)  # B is ours and unreaped: this is B, never a reused pid
        for fd in (code_r, done_w, out_fd, err_fd):
            os.close(fd)
        info = {
            "pid_b": pid_b,
            "out_path": out_path,
            "err_path": err_path,
            "scratch": scratch,
            "uid": uid,
            "group": None if group is None else group.dirs,
        }
        return info, [code_w, done_r, pidfd]

    def serve(self, sock: socket.socket) -> None:
        """Answer each byte from the handler with one prepared call (and its fds)."""
        while True:
            asked = sock.recv(64)
            if not asked:
                return
            for _ in asked:
                info, fds = self.prepare()
                try:
                    socket.send_fds(sock, [json.dumps(info).encode()], fds)
                finally:
                    for fd in fds:
                        os.close(fd)


def _receive_prepared(sock: socket.socket, ask: bool = True) -> Prepared:
    if ask:
        sock.sendall(b"p")
    data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 3)
    if not data or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise RuntimeError("the call factory went away")
    info = json.loads(data)
    group = None if info["group"] is None else cgroups.Group(info["group"])
    return Prepared(
        info["pid_b"],
        fds[0],
        fds[1],
        fds[2],
        info["out_path"],
        info["err_path"],
        info["scratch"],
        info["uid"],
        group,
    )


# -- the handler's view of one prepared call ------------------------------------
def _read_line(fd: int, deadline: float) -> str | None:
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 256)
        if not chunk:
            return None
        data += chunk
    return data.decode().strip()


class Handler:
    """Serves one connection: runs the calls its zygote prepares."""

    def __init__(self, conn: socket.socket, factory: socket.socket, level: str) -> None:
        self.conn = conn
        self.factory = factory
        self.level = level
        self._finished: queue.SimpleQueue[Prepared] = queue.SimpleQueue()

    def run(self, prepared: Prepared, request: dict[str, Any]) -> dict[str, Any]:
        if prepared.group is not None:
            prepared.group.set_memory((int(request["memory_mb"]) + 32) << 20)
        payload = json.dumps(request).encode()
        with contextlib.suppress(BrokenPipeError):  # the call died in set-up
            _write_all(prepared.code_w, payload)
        os.close(prepared.code_w)
        prepared.code_w = -1
        deadline = time.monotonic() + float(request["timeout"])
        line = _read_line(prepared.done_r, deadline)
        timed_out = line is None and time.monotonic() >= deadline
        self._kill(prepared)  # whatever the call left behind (daemons) dies with it
        ready, returncode = True, None
        if line is not None:
            ready_text, status_text = line.split()
            ready = ready_text == "1"
            status = int(status_text)
            returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        elif timed_out:
            returncode = -signal.SIGKILL
        memory = prepared.group is not None and prepared.group.oom_killed()
        cap = int(request["max_output_bytes"])
        stdout, out_cut, out_size = _tail(prepared.out_path, cap)
        stderr, err_cut, err_size = _tail(prepared.err_path, cap)
        self._retire(prepared)
        return {
            "returncode": returncode,
            "timed_out": timed_out,
            "ready": ready,  # False: the call's set-up failed before any code ran
            "reported": line is not None,  # False: its init died (killed) before reporting
            "oom_killed": memory,
            "output_limit": max(out_size, err_size) >= MAX_FILE_BYTES,
            "stdout": stdout,
            "stderr": stderr,
            "truncated": out_cut or err_cut,
        }

    def _kill(self, prepared: Prepared) -> None:
        if prepared.group is not None:
            prepared.group.kill()
        if prepared.pidfd >= 0:  # PID 1 of its namespace: takes all with it
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(prepared.pidfd, signal.SIGKILL)
        if prepared.group is None and self.level == BASIC and prepared.uid is not None:
            kill_uid(prepared.uid)

    def _finish(self, prepared: Prepared) -> bool:
        """Close the call's fds and remove its files and cgroup; False if still busy."""
        for fd in (prepared.code_w, prepared.done_r, prepared.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        prepared.code_w = prepared.done_r = prepared.pidfd = -1
        for path in (prepared.out_path, prepared.err_path):
            _unlink(path)
        if prepared.scratch:
            shutil.rmtree(prepared.scratch, ignore_errors=True)
            prepared.scratch = None
        if prepared.group is not None and not prepared.group.remove():
            prepared.group.kill()
            return False
        return True

    def discard(self, prepared: Prepared) -> None:
        if prepared.code_w >= 0:
            os.close(prepared.code_w)
            prepared.code_w = -1
        self._kill(prepared)
        self._retire(prepared)

    def _retire(self, prepared: Prepared) -> None:
        """Hand a finished call to the cleaner thread (off the critical path)."""
        self._finished.put(prepared)

    def _clean(self) -> None:
        """Cleaner thread: close, unlink and rmdir finished calls, retrying busy ones."""
        busy: list[Prepared] = []
        while True:
            try:
                item = self._finished.get(timeout=0.05 if busy else None)
            except queue.Empty:
                item = None
            if item is _STOP:
                deadline = time.monotonic() + 2.0
                while busy and time.monotonic() < deadline:
                    busy = [p for p in busy if not self._finish(p)]
                    time.sleep(0.01)
                return
            if item is not None:
                busy.append(item)
            busy = [p for p in busy if not self._finish(p)]

    def serve(self) -> None:
        # PREPARE_AHEAD calls are always prepared or being prepared by the zygote:
        # the call a request takes has had whole calls' time for its namespace,
        # cgroup and mount set-up, and no request waits on the zygote.
        cleaner = threading.Thread(target=self._clean, daemon=True)
        cleaner.start()
        ready: list[Prepared] = []
        self.factory.sendall(b"p" * PREPARE_AHEAD)
        outstanding = PREPARE_AHEAD
        try:
            while True:
                request = recv_frame(self.conn)
                if request is None:
                    return
                if request.get("op") == "ping":
                    send_frame(self.conn, {"pong": True})
                    continue
                while outstanding and (not ready or select.select([self.factory], [], [], 0)[0]):
                    ready.append(_receive_prepared(self.factory, ask=False))
                    outstanding -= 1
                prepared = ready.pop(0)
                try:
                    reply = self.run(prepared, request)
                except Exception as exc:  # our bug, not the call's: fail this call only
                    self.discard(prepared)
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                send_frame(self.conn, reply)
                self.factory.sendall(b"p")
                outstanding += 1
        finally:
            for prepared in ready:
                self.discard(prepared)
            self._finished.put(_STOP)
            cleaner.join(5)


_STOP: Any = object()


def _close_all_except(*keep: int) -> None:
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:  # closerange(n, n) would close everything from n on
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _tail(path: str, cap: int) -> tuple[str, bool, int]:
    """(the last ``cap`` bytes of a file decoded with replacement, cut, the bytes
    really written).

    The last is what the file holds on disk, not its length: a call can seek to
    the file cap's last byte and write one byte there, a length at the cap with
    nothing written; the allocated blocks (never more than the length) are what
    it wrote. The cleaner thread deletes the file, after the reply."""
    try:
        with open(path, "rb") as handle:
            facts = os.fstat(handle.fileno())
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - cap))
            data = handle.read(cap)
    except FileNotFoundError:
        return "", False, 0
    return data.decode("utf-8", errors="replace"), size > cap, min(size, facts.st_blocks * 512)


def kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (basic level without cgroups)."""
    kill_uids(uid, uid + 1)


def kill_uids(low: int, high: int) -> None:
    """SIGKILL every process owned by a uid in ``[low, high)``."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if low <= os.stat(f"/proc/{entry}").st_uid < high:
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return


# -- the server ----------------------------------------------------------------
# The per-call layers of round three, by the name ``--disable`` takes (benchmarks).
CALL_LAYERS = {
    "netns": "a network namespace per call (no socket names, pairs or ports shared)",
    "cgroupns": "a cgroup namespace per call (/proc/self/cgroup shows /)",
    "etc": "a minimal /etc (loader cache, time zone, a passwd naming no host user)",
    "timens": "a time namespace per call (monotonic and boot-time clocks, and sysinfo's "
    "uptime, start near 0: no host uptime)",
    "procmask": "host facts in /proc masked (" + ", ".join(p[6:] for p in PROC_MASKS) + ")",
}


def call_layers(
    level: str,
    off: frozenset[str] = frozenset(),
    *,
    real_root: bool = True,
    use_seccomp: bool = True,
    cgroup: bool = True,
    landlock_abi: int = 0,
    neutral: bool = False,
) -> list[str]:
    """What isolates each call at ``level``, one line per layer (``retool sandbox check``)."""
    common = [
        "an empty environment, its own working directory, no trainer module importable",
        "a uid of its own per call" if real_root else "every capability dropped",
        "no_new_privs; rlimits (address space, file size, open files, CPU)",
    ]
    if use_seccomp:
        common.append(
            "seccomp filter (namespaces, mounts, keyrings, bpf, ptrace, non-INET sockets, sysinfo, "
            "fallocate flags)"
        )
    if cgroup:
        common.append("a cgroup per call (memory, processes, killed whole after the call)")
    if level != FULL:
        return common + ([f"Landlock (ABI {landlock_abi})"] if landlock_abi else [])
    layers = [
        *common,
        "PID namespace per call (its init reports the exit status)",
        "mount namespace per call: read-only root of the OS, the interpreter and "
        "site-packages; private /tmp and /dev/shm; fresh /proc; five /dev nodes",
        f"IPC namespace per call; UTS namespace per call (host name {HOSTNAME!r})",
        "install metadata naming the checkout masked (.pth, __editable__, direct_url.json)",
        "the server's arguments hidden from /proc/<pid>/cmdline; output files opened "
        f"through {NEUTRAL_CALLS_DIR} (so /proc/self/fd names no host directory)",
    ]
    layers += [text for name, text in CALL_LAYERS.items() if name not in off]
    return layers + ([NEUTRAL_LAYER] if neutral else [])


RELOCATED_LAYER = (
    "relocated files: compiled files, build configuration and RUNPATHs rewritten for "
    "the neutral paths, the interpreter's own site-packages hidden (contents name no "
    "directory of the trainer's machine)"
)


def relocated_layer(facts: dict[str, Any]) -> str:
    """The layer's line for ``retool sandbox check``, with what the refresh did."""
    line = f"{RELOCATED_LAYER}; {facts['files']} other files rewritten"
    if facts.get("rewritten"):
        line += f"; this start rewrote {facts['rewritten']} (cached for the next)"
    return line


NEUTRAL_CALLS_DIR = "/mnt"  # where the output files are opened (see neutral_calls_dir)
NEUTRAL_LAYER = (
    "neutral paths: the interpreter at /opt/python, the runtime at /opt/runtime, "
    "site-packages at /opt/site (sys.path, __file__, /proc/self/exe, maps and "
    "mountinfo name no directory of the trainer's machine)"
)


def neutral_calls_dir(workdir: str) -> str | None:
    """Give the server a mount namespace of its own in which the calls' directory also
    appears at ``/mnt``, and return that path (``None`` if it cannot).

    A call's stdout and stderr are files the zygote opens; ``/proc/self/fd/1``
    shows the path they were opened by, which would be the trainer's work
    directory. Opened through ``/mnt`` they show ``/mnt/h1-2.out``. The files
    stay on the host filesystem (not a tmpfs the call's memory would be
    charged for), and the trainer, whose mounts are untouched, never reads them.
    """
    if not os.path.isdir(NEUTRAL_CALLS_DIR):
        return None
    try:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
        linux.mount(os.path.join(workdir, "calls"), NEUTRAL_CALLS_DIR, None, linux.MS_BIND)
    except OSError:
        return None
    return NEUTRAL_CALLS_DIR


# Where the server finds the interpreter, its runtime copy and site-packages once it
# has re-executed itself in its own mount namespace (see neutral_layout): what a call
# sees in sys.path, __file__, /proc/self/exe, /proc/self/maps and its mountinfo.
NEUTRAL_ROOT = "/opt"
NEUTRAL_PYTHON = NEUTRAL_ROOT + "/python"
NEUTRAL_RUNTIME = NEUTRAL_ROOT + "/runtime"
NEUTRAL_SITE = NEUTRAL_ROOT + "/site"  # then /opt/site1, /opt/site2, ...
NEUTRAL_WORK = NEUTRAL_ROOT + "/work"  # the server's --dir (never bound into a call)
NEUTRAL_CGROUP = NEUTRAL_ROOT + "/cgroup"  # the instance's cgroups (never bound into a call)
_SOURCES = NEUTRAL_ROOT + "/.src"  # plain binds of the host trees (the server's namespace)
_LAYERS = NEUTRAL_ROOT + "/.layer"  # binds of their relocated layers (see relocate.py)
_EMPTY = NEUTRAL_ROOT + "/.empty"  # the second lower layer of an overlay without one
_SERVER_BOOT = (
    "import sys; sys.path += sys.argv.pop(1).split(':'); "
    "from retool_sandbox_rt.server import main; main()"
)


def _neutral_mount(source_fd: int, target: str, layer_fd: int | None, userxattr: bool) -> None:
    """Show the directory ``source_fd`` at ``target`` as a read-only overlay, with
    its relocated layer (``layer_fd``) stacked above it where there is one.

    The server and its calls see the same overlay: the server imports, maps and
    runs the relocated files, so nothing a call inherits in memory names a host
    path either. Why an overlay even without a layer: a bind's mountinfo line
    names its source directory (the "root" field, the path inside the
    filesystem: the checkout, a home directory); an overlay's root is its own
    ("/") and its options name only the neutral binds below ``/opt/.src`` and
    ``/opt/.layer``, which exist in the server's namespace only. ``userxattr``: a
    server in a user namespace of its own (a non-root trainer) reads the layer's
    opaque marks from ``user.overlay.*``, the only ones it may set.
    """
    flags = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    name = target[len(NEUTRAL_ROOT) + 1 :]
    lowers = []
    for fd, below in ((layer_fd, _LAYERS), (source_fd, _SOURCES)):
        if fd is None:
            continue
        path = f"{below}/{name}"
        os.makedirs(path)
        linux.mount(f"/proc/self/fd/{fd}", path, None, linux.MS_BIND)
        linux.mount(None, path, None, linux.MS_BIND | linux.MS_REMOUNT | flags)
        lowers.append(path)
    if len(lowers) == 1:
        lowers.append(_EMPTY)  # a read-only overlay needs two lower layers, no upper one
    os.makedirs(target, exist_ok=True)
    options = "lowerdir=" + ":".join(lowers) + (",userxattr" if userxattr else "")
    linux.mount("overlay", target, "overlay", flags, options)


# Trees of the OS, the same on every machine: what they contain names no trainer, and
# rewriting "/usr" inside them would change what they mean (os.defpath, shebangs).
_SHARED_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")


def _shared(path: str) -> bool:
    real = os.path.realpath(path)
    return real == "/" or any(real == t or real.startswith(t + "/") for t in _SHARED_TREES)


def hidden_site_packages(base: str) -> list[str]:
    """The interpreter's own site-packages (relative to ``base``), which its layer hides:
    site trees are mounted on their own, and what else is installed there is no call's."""
    packages = glob.glob(os.path.join(base, "lib*", "python*", "*-packages"))
    return [os.path.relpath(p, base) for p in packages]


def _opaque_marks_hold(base: str, hidden: list[str]) -> bool:
    """Whether the mounted interpreter shows its hidden site-packages empty (where the
    host's is not): the overlay reads the layer's opaque marks."""
    for rel in hidden:
        with contextlib.suppress(OSError):
            if os.listdir(os.path.join(base, rel)):
                return not os.listdir(os.path.join(NEUTRAL_PYTHON, rel))
    return True


def relocated_layers(
    base: str,
    sites: list[tuple[str, str]],
    mapping: dict[str, str],
    cache: str | None = None,
    opaque: str = relocate.OPAQUE_XATTRS[0],
) -> tuple[dict[str, str], dict[str, Any]]:
    """Refresh the relocated layers (see relocate.py) of the interpreter at ``base``
    and of each ``(site directory, neutral path)``; returns {source: layer tree} and
    their summed facts. Raises ``OSError``."""
    moved = relocate.Relocation({h: t for h, t in mapping.items() if not _shared(h)})
    hidden = hidden_site_packages(base)
    relocate.prune(cache)  # an old clone's or an older format's layers
    trees: dict[str, str] = {}
    facts = {"rewritten": 0, "kept": 0, "dropped": 0, "files": 0}
    jobs = [(base, NEUTRAL_PYTHON, True, hidden), *((s, t, False, []) for s, t in sites)]
    for source, target, scrub, hide in jobs:
        if _shared(source):
            continue  # the OS's own tree (a system Python): its paths name no trainer
        done = relocate.refresh(
            source, target, moved, scrub=scrub, hide=hide, root=cache, opaque=opaque
        )
        trees[source] = done.pop("tree")
        for key, value in done.items():
            facts[key] += value
    return trees, facts


def neutral_layout(
    workdir: str,
    boot_path: str,
    *,
    userxattr: bool = False,
    relocated: bool = True,
    cache: str | None = None,
    cgroup_dirs: dict[str, str] | None = None,
) -> tuple[str, str, str, str, dict[str, Any]]:
    """In the server's own mount namespace, mount the interpreter at ``/opt/python``,
    the runtime copy at ``/opt/runtime`` and each site-packages directory at
    ``/opt/site``, ``/opt/site1``...; returns (the interpreter there, the import
    path there, what it needs in ``LD_LIBRARY_PATH``, the work directory there:
    ``/opt/work``, so that no path the server holds, and so no string in a
    call's memory, names it; the relocated layers' facts, with ``error`` if they
    could not be used). Each of ``cgroup_dirs`` (the instance's cgroup in each
    hierarchy) is bound at ``/opt/cgroup/<hierarchy>``: its host path names the
    trainer's cgroup (a container's id) and the server's pid. Raises ``OSError``.

    The server then re-executes itself from there (same pid, same descriptors),
    so every path it imports, maps or runs from, and so every path its calls
    inherit (``sys.path``, modules' ``__file__``, code objects' file names,
    ``sys.prefix``, ``sys.executable``, ``/proc/self/exe`` and ``maps``) names
    no directory of the trainer's machine, and (with the relocated layers) no
    file's contents do either: compiled files, build configuration, ``RUNPATH``.
    ``/opt`` of the host is covered by a tmpfs in the server's namespace only
    (sources below it are opened first).
    """
    base = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(sys.executable)
    relative = os.path.relpath(executable, base)
    if relative.startswith(".."):
        raise OSError(0, f"the interpreter {executable} is not below {base}")
    real_workdir = os.path.realpath(workdir)
    if real_workdir == NEUTRAL_ROOT or real_workdir.startswith(NEUTRAL_ROOT + "/"):
        raise OSError(0, f"the work directory is below {NEUTRAL_ROOT}")
    if not os.path.isdir(NEUTRAL_ROOT):
        raise OSError(0, f"no {NEUTRAL_ROOT} to mount on")
    runtime, *sites = boot_path.split(":")
    sources = [base, runtime, *(s for s in sites if os.path.isdir(s))]
    targets = [NEUTRAL_PYTHON, NEUTRAL_RUNTIME]
    targets += [NEUTRAL_SITE + (str(i) if i else "") for i in range(len(sources) - 2)]
    facts: dict[str, Any] = {}
    trees: dict[str, str] = {}
    if relocated:
        mapping = dict(zip(sources, targets, strict=True))
        mapping[real_workdir] = NEUTRAL_WORK
        opaque = relocate.OPAQUE_XATTRS[1 if userxattr else 0]
        try:
            site_trees = list(zip(sources[2:], targets[2:], strict=True))
            trees, facts = relocated_layers(base, site_trees, mapping, cache, opaque)
        except Exception as exc:  # no layer is a missing layer, not a failed start
            facts = {"error": f"{getattr(exc, 'strerror', None) or exc}"}
    else:
        facts = {"error": "disabled"}
    fds = [os.open(s, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for s in [workdir, *sources]]
    cgroup_fds = {
        key: os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        for key, path in (cgroup_dirs or {}).items()
    }
    layer_fds = [
        os.open(trees[s], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if s in trees else None
        for s in sources
    ]

    def mount_all(layers: list[int | None]) -> None:
        linux.mount(
            "tmpfs",
            NEUTRAL_ROOT,
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV,
            "size=64k,nr_inodes=256,mode=0755",
        )
        os.makedirs(_EMPTY)
        os.makedirs(NEUTRAL_WORK)
        linux.mount(f"/proc/self/fd/{fds[0]}", NEUTRAL_WORK, None, linux.MS_BIND)
        for fd, layer_fd, target in zip(fds[1:], layers, targets, strict=True):
            _neutral_mount(fd, target, layer_fd, userxattr)
        for key, fd in cgroup_fds.items():
            os.makedirs(f"{NEUTRAL_CGROUP}/{key}")
            linux.mount(f"/proc/self/fd/{fd}", f"{NEUTRAL_CGROUP}/{key}", None, linux.MS_BIND)

    try:
        mount_all(layer_fds)
        if trees and not _opaque_marks_hold(base, hidden_site_packages(base)):
            # The overlay did not read the layer's marks (a file system or user
            # namespace that hides them): the host's files would show through.
            linux.umount2(NEUTRAL_ROOT, linux.MNT_DETACH)
            facts = {"error": "the overlay ignored the layer's opaque marks"}
            mount_all([None] * len(layer_fds))
    except OSError:
        # No overlays here (an old kernel, a container refusing them): the host's /opt,
        # which may hold the interpreter (/opt/conda), comes back with everything on it.
        with contextlib.suppress(OSError):
            linux.umount2(NEUTRAL_ROOT, linux.MNT_DETACH)
        raise
    finally:
        for fd in [*fds, *cgroup_fds.values(), *(f for f in layer_fds if f is not None)]:
            os.close(fd)
    # An interpreter built with an absolute RUNPATH (pyenv's, under a home) would
    # load libpython from the host path; the loader looks here first.
    return (
        os.path.join(NEUTRAL_PYTHON, relative),
        ":".join(targets[1:]),
        NEUTRAL_PYTHON + "/lib",
        NEUTRAL_WORK,
        facts,
    )


def enter_server_namespaces() -> list[str]:
    """Give the server an empty network namespace; returns what is missing."""
    missing: list[str] = []
    try:
        if os.geteuid() == 0:
            linux.unshare(linux.CLONE_NEWNET)
        else:
            uid, gid = os.geteuid(), os.getegid()
            linux.unshare(linux.CLONE_NEWUSER | linux.CLONE_NEWNET)
            with open("/proc/self/setgroups", "w") as handle:
                handle.write("deny")
            with open("/proc/self/uid_map", "w") as handle:
                handle.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as handle:
                handle.write(f"0 {gid} 1")
    except OSError as exc:
        missing.append(f"user/network namespaces ({exc.strerror})")
    return missing


def _world_reachable(path: str) -> bool:
    """Whether every directory above ``path`` may be searched by any uid."""
    path = os.path.realpath(path)
    while path != "/":
        path = os.path.dirname(path)
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def claim_uid_block(workdir: str) -> tuple[int, int | None]:
    """Reserve a block of uids for this instance (flock held for its lifetime)."""
    lockdir = "/run/retool-sandbox"
    try:
        os.makedirs(lockdir, mode=0o700, exist_ok=True)
    except OSError:
        lockdir = os.path.dirname(workdir)
    for block in range(UID_BLOCKS):
        fd = os.open(os.path.join(lockdir, f"uids-{block}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return UID_BASE + block * UID_BLOCK, fd
    raise RuntimeError("no free sandbox uid block")


def _run_reaper(
    group: cgroups.Group | None,
    server_pid: int,
    alive_r: int,
    workdir: str,
    trainer_pidfd: int | None,
    uids: tuple[int, int] | None = None,
    held: tuple[int, ...] = (),
) -> None:
    """The reaper: once the trainer (lifeline, fd 0) or the server is gone, kill the
    instance's cgroup whole (every call, daemons included), remove it and the
    server's directory. Without a killable cgroup, a root server's calls are
    found by their uids (``uids``: this instance's block, whose lock it keeps
    until then). It keeps the ``held`` descriptors open until it exits: the
    client's "gone" pipe (its proof that all of it is over) and the uid lock."""
    try:
        watched = [0, alive_r] + ([] if trainer_pidfd is None else [trainer_pidfd])
        _close_all_except(*watched, *held)
        with contextlib.suppress(OSError):
            os.setsid()
        while True:
            readable = select.select(watched, [], [])[0]
            if trainer_pidfd in readable:  # the trainer exited (even if a child of
                break  # its own still holds the lifeline's write end)
            if any(not os.read(fd, 4096) for fd in readable):
                break
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server_pid, signal.SIGKILL)
        if group is not None:
            group.kill_and_remove(within=5.0)
        if uids is not None and (group is None or not group.killable):
            kill_uids(*uids)
        shutil.rmtree(workdir, ignore_errors=True)
    finally:
        os._exit(0)


def probe_full(
    workdir: str,
    real_root: bool,
    uid_base: int,
    boot_path: str,
    use_seccomp: bool,
    off: frozenset[str] = frozenset(),
    calls_dir: str | None = None,
) -> str | None:
    """Run one call at the full level; the error text if it does not work."""
    zygote = Zygote(
        0,
        FULL,
        workdir,
        False,
        real_root,
        uid_base,
        None,
        256,
        boot_path,
        use_seccomp,
        off=off,
        calls_dir=calls_dir,
    )
    left, right = socket.socketpair()
    handler = Handler(left, right, FULL)
    try:
        info, fds = zygote.prepare()
        code_w, done_r, pidfd = fds
        prepared = Prepared(
            info["pid_b"],
            code_w,
            done_r,
            pidfd,
            info["out_path"],
            info["err_path"],
            None,
            None,
            None,
        )
        reply = handler.run(
            prepared,
            {"code": "print(6 * 7)", "timeout": 20, "memory_mb": 256, "max_output_bytes": 4096},
        )
        handler._finished.put(_STOP)
        handler._clean()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info["pid_b"], 0)
    except (OSError, RuntimeError) as exc:
        return str(exc)
    finally:
        left.close()
        right.close()
    if reply["stdout"].strip() != "42":
        return (reply["stderr"].strip().splitlines() or ["no output"])[-1]
    return None


def _round3_layers(group: cgroups.Group | None, level: str, real_root: bool) -> list[str]:
    """What holds the call's CPU, init, helpers and verdicts here (for ``check``)."""
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + CALL_NICE)
    if group is not None and group.cpu_bounded:
        cpu = (
            f"cpu: cgroup (all calls weigh one nice-0 process, cpu.shares "
            f"{cgroups.INSTANCE_CPU_SHARES}; each call at most {cgroups.CALL_CPUS} CPU); "
            f"SCHED_OTHER, nice {nice}"
        )
    else:
        cpu = (
            f"cpu: fallback (no cpu cgroup): SCHED_OTHER, nice {nice}, all calls in the "
            "server's session (one autogroup, one nice-0 process's weight), RLIMIT_CPU, "
            "the process cap"
        )
    if level == FULL:
        reach = "PID 1 of its namespace (no signal from the call)"
    elif real_root:
        reach = "another uid than its call"
    else:
        reach = "Landlock's signal scope"
    return [
        cpu,
        f"init: non-dumpable (no /proc/<pid>/fd or mem for the call), {reach}",
        "helpers: the address-space pin starts after every limit, with stdio only",
        "verdicts: timeout, memory and output only from the timer, the OOM counter "
        "and the output's allocated size",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="retool.sandbox.server")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--isolation", default="auto", choices=["auto", "strict", "none"])
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--boot-path", default="")
    parser.add_argument("--disable", default="", help="layers off, for benchmarks only")
    parser.add_argument("--gone-fd", type=int, default=-1, help="held open until all is gone")
    parser.add_argument("--resume", default="", help="state after the neutral re-exec")
    parser.add_argument("--layer-cache", default="", help="where relocated layers are kept")
    args = parser.parse_args(argv)
    disabled = set(filter(None, args.disable.split(",")))
    # Calls are forked from here: none of them may read our arguments (the work
    # directory, the import path) from /proc/<pid>/cmdline.
    linux.hide_command_line("retool-sandbox")
    sys.orig_argv[:] = sys.argv[:] = ["retool-sandbox"]  # Python's own copies too
    state = json.loads(args.resume) if args.resume else _host_side(args, disabled)
    _serve(args, disabled, state)


def _host_side(args: argparse.Namespace, disabled: set[str]) -> dict[str, Any]:
    """Everything done before the server leaves the host's view: the reaper, the
    cgroup, the namespaces; then the re-exec at neutral paths (which does not
    return) where possible. The state the rest of ``main`` needs."""
    workdir = args.dir
    os.makedirs(os.path.join(workdir, "root"), exist_ok=True)
    os.makedirs(os.path.join(workdir, "calls"), mode=0o711, exist_ok=True)
    os.makedirs(os.path.join(workdir, "sock"), mode=0o700, exist_ok=True)
    real_root = os.geteuid() == 0
    missing: list[str] = []
    uid_base, _uid_lock = claim_uid_block(workdir) if real_root else (0, None)
    group, group_missing = cgroups.instance_group(
        f"retool-sandbox-{os.getpid()}", skip=("cpu",) if "cpu" in disabled else ()
    )
    if "cgroups" in disabled and group is not None:
        group.remove()
        group, group_missing = None, ["disabled"]
    if group is None or not group.killable:
        missing.append("a cgroup per call (" + "; ".join(group_missing) + ")")
    elif group_missing:
        missing.extend(group_missing)
    # The trainer's copy of where the instance's cgroup is (to kill it if the server
    # dies), sent now: after the neutral re-exec the server holds only /opt/cgroup paths.
    _write_all(1, (json.dumps({"cgroup": None if group is None else group.dirs}) + "\n").encode())
    trainer_pidfd = None
    with contextlib.suppress(OSError):
        trainer_pidfd = os.pidfd_open(os.getppid())
    alive_r, alive_w = os.pipe()
    server_pid = os.getpid()
    uids = (uid_base, uid_base + UID_BLOCK) if real_root else None
    held = tuple(fd for fd in (args.gone_fd, _uid_lock) if fd is not None and fd >= 0)
    if os.fork() == 0:
        _run_reaper(group, server_pid, alive_r, workdir, trainer_pidfd, uids, held)
    os.close(alive_r)
    if args.gone_fd >= 0:
        os.close(args.gone_fd)  # the reaper's now: EOF for the client once it has exited
    if trainer_pidfd is not None:
        os.close(trainer_pidfd)
    if group is not None:
        with contextlib.suppress(OSError):
            cgroups.Group({k: v for k, v in group.dirs.items() if k == "v2"}).enter()
    state: dict[str, Any] = {
        "real_root": real_root,
        "uid_base": uid_base,
        "group": None if group is None else group.dirs,
        "alive_w": alive_w,
        "missing": missing,
        "namespaces": False,
        "calls_dir": None,
        "boot_path": args.boot_path,
        "neutral": False,
    }
    if args.isolation == "none":
        missing.append("namespaces (disabled: isolation='none')")
        return state
    ns_missing = enter_server_namespaces()
    missing += ns_missing
    if ns_missing:
        return state
    state["namespaces"] = True
    state["calls_dir"] = neutral_calls_dir(args.dir)
    if state["calls_dir"] is None or "neutral" in disabled:
        why = "disabled" if "neutral" in disabled else "no mount namespace for the server"
        missing.append(f"{NEUTRAL_LAYER} ({why})")
        return state
    try:
        executable, boot_path, libs, work, relocated = neutral_layout(
            args.dir,
            args.boot_path,
            userxattr=not (real_root and linux.initial_user_namespace()),
            relocated="relocate" not in disabled,
            cache=args.layer_cache or None,
            cgroup_dirs=None if group is None else group.dirs,
        )
    except OSError as exc:
        missing.append(f"{NEUTRAL_LAYER} ({exc.strerror or exc})")
        return state
    state.update(neutral=True, boot_path=boot_path, relocated=relocated)
    if group is not None:
        state["group"] = {key: f"{NEUTRAL_CGROUP}/{key}" for key in group.dirs}
    os.set_inheritable(alive_w, True)  # the reaper's sign that the server is alive
    argv = [executable, "-I", "-S", "-B", "-c", _SERVER_BOOT, boot_path]
    argv += ["--dir", work, "--preload", args.preload, "--isolation", args.isolation]
    argv += ["--memory-mb", str(args.memory_mb), "--boot-path", boot_path]
    argv += ["--disable", args.disable, "--resume", json.dumps(state)]
    os.execve(executable, argv, {**os.environ, "LD_LIBRARY_PATH": libs})
    raise AssertionError("unreachable")  # pragma: no cover


def _serve(args: argparse.Namespace, disabled: set[str], state: dict[str, Any]) -> None:
    """Probe the level, preload, report ready, and serve connections forever."""
    workdir = args.dir
    real_root, uid_base = bool(state["real_root"]), int(state["uid_base"])
    missing: list[str] = list(state["missing"])
    alive_w = int(state["alive_w"])
    os.set_inheritable(alive_w, False)
    off = frozenset(disabled & set(CALL_LAYERS))
    global _PIN
    _PIN = "pin" not in disabled
    group = None if state["group"] is None else cgroups.Group(state["group"])
    use_seccomp = "seccomp" not in disabled
    try:
        seccomp.build_program()
    except OSError as exc:
        missing.append(f"seccomp ({exc.strerror})")
        use_seccomp = False
    if "seccomp" in disabled:
        missing.append("seccomp (disabled)")
    level = BASIC
    calls_dir: str | None = state["calls_dir"]  # None: the host path
    if state["namespaces"]:
        error = probe_full(
            workdir, real_root, uid_base, state["boot_path"], use_seccomp, off, calls_dir
        )
        if error is None:
            level = FULL
        else:
            calls_dir = None
            missing.append(f"per-call mount/PID namespaces ({error})")
    args.boot_path = state["boot_path"]
    if not real_root and level == BASIC:
        missing.append("a dedicated uid (the server is not root, so calls share its uid)")
    if real_root and level == BASIC and not _world_reachable(sys.base_prefix):
        missing.append(
            f"an interpreter the sandbox uids can reach ({sys.base_prefix} is below a "
            "private directory: fresh mode and lazy standard-library imports fail)"
        )
    landlock_abi = landlock.abi_version() if "landlock" not in disabled else 0
    if level == BASIC and landlock_abi == 0:
        missing.append("Landlock (the call sees the host filesystem as its uid may)")
    if level == BASIC and not real_root and landlock_abi < 6:
        missing.append(
            "the call's init out of its reach (a non-root trainer's call shares its uid "
            "and can signal it without Landlock's signal scope, ABI 6)"
        )
    layers = _round3_layers(group, level, real_root)
    preloaded: list[str] = []
    fresh = True
    for name in filter(None, args.preload.split(",")):
        try:
            importlib.import_module(name)
            preloaded.append(name)
            fresh = False
        except Exception as exc:
            missing.append(f"preload {name} ({type(exc).__name__})")
    # What every call touches: import it once here, not once per call.
    for name in ("random", "traceback", *(["numpy.random"] if "numpy" in preloaded else [])):
        importlib.import_module(name)
    importlib.import_module(__package__ + ".autoprint")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with unix_socket_path(os.path.join(workdir, "sock", "server.sock")) as sock_path:
        listener.bind(sock_path)
        os.chmod(sock_path, 0o600)
    listener.listen(64)
    if level == FULL:
        missing += [f"{CALL_LAYERS[name]} (disabled)" for name in sorted(off)]
    call_layer_list = call_layers(
        level,
        off,
        real_root=real_root,
        use_seccomp=use_seccomp,
        cgroup=group is not None and group.killable,
        landlock_abi=landlock_abi,
        neutral=level == FULL and bool(state["neutral"]),
    )
    relocated = state.get("relocated") or {}
    if level == FULL and state["neutral"]:
        if "error" in relocated:
            missing.append(f"{RELOCATED_LAYER} ({relocated['error']})")
        else:
            call_layer_list.append(relocated_layer(relocated))
            if relocated.get("kept"):
                missing.append(
                    f"{RELOCATED_LAYER}, in part ({relocated['kept']} files still name a host "
                    "path: a prefix shorter than its neutral path, or a spelling not moved)"
                )
    ready = {
        "level": level,
        "layers": [*call_layer_list, *layers],  # and the round-three CPU/init/verdicts
        "missing": missing,
        "preloaded": preloaded,
        "pid": os.getpid(),
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # the reaper holds the lifeline; nobody below needs either
        os.dup2(null, fd)
    os.close(null)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # zygotes are reaped automatically
    index = 0
    while True:
        conn, _ = listener.accept()
        index += 1
        if os.fork() == 0:
            listener.close()
            os.close(alive_w)
            linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            # SEQPACKET: one message per prepared call, never two run together.
            zygote_side, handler_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                if os.fork() == 0:  # the handler
                    zygote_side.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
                    try:
                        Handler(conn, handler_side, level).serve()
                    finally:
                        os._exit(0)
                conn.close()
                handler_side.close()
                Zygote(
                    index,
                    level,
                    workdir,
                    fresh,
                    real_root,
                    uid_base,
                    group,
                    args.memory_mb,
                    args.boot_path,
                    use_seccomp,
                    landlock_abi,
                    off,
                    calls_dir,
                ).serve(zygote_side)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    main()
