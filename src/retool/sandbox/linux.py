"""Thin ctypes wrappers over the Linux calls Python 3.11 does not expose.

``unshare``, ``mount``, ``umount2``, ``pivot_root`` and ``prctl``: enough to
build a bubblewrap-style sandbox without an external binary. Every wrapper
raises :class:`OSError` with the errno on failure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWTIME = 0x00000080
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4

_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(platform.machine())
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {target}",
    )


def sethostname(name: str) -> None:
    """Set the UTS namespace's host name (``os`` has no wrapper)."""
    data = name.encode()
    _check(_libc.sethostname(data, ctypes.c_size_t(len(data))), "sethostname")


def hide_command_line(title: str) -> None:
    """Overwrite this process's argument area, so ``/proc/<pid>/cmdline`` of it and of
    every process it forks from now on shows ``title`` instead of its arguments.

    The setproctitle trick: the kernel reads cmdline from the memory between
    ``arg_start`` and ``arg_end`` (fields 48 and 49 of ``/proc/self/stat``),
    which is ours to write; Python copied ``argv`` at start-up and never reads
    it again. Needs no capability (``PR_SET_MM`` would need CAP_SYS_RESOURCE).
    """
    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # fields 48, 49 (1-based, after comm)
    data = title.encode()[: max(0, end - start - 1)]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, data, len(data))


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    if _PIVOT_ROOT is None:
        raise OSError(38, f"pivot_root: unsupported machine {platform.machine()}")
    _check(
        _libc.syscall(ctypes.c_long(_PIVOT_ROOT), new_root.encode(), put_old.encode()), "pivot_root"
    )


def prctl(option: int, arg: int) -> None:
    _check(
        _libc.prctl(
            ctypes.c_int(option),
            ctypes.c_ulong(arg),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "prctl",
    )


_SYSCALLS = {
    "x86_64": {"keyctl": 250, "capset": 126, "clone": 56},
    "aarch64": {"keyctl": 219, "capset": 91, "clone": 220},
}.get(platform.machine(), {})
KEYCTL_JOIN_SESSION_KEYRING = 1
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off), NO_CAP_AMBIENT_RAISE, each locked.
SECUREBITS_LOCKED_DOWN = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80


def _syscall(name: str, *args: object) -> None:
    if name not in _SYSCALLS:
        raise OSError(38, f"{name}: unsupported machine {platform.machine()}")
    _check(0 if _libc.syscall(ctypes.c_long(_SYSCALLS[name]), *args) >= 0 else -1, name)


def join_new_session_keyring() -> None:
    """Replace the inherited session keyring with a fresh anonymous one."""
    _syscall("keyctl", ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None))


def drop_all_capabilities() -> None:
    """Give up every capability for good (root in a user namespace included)."""
    prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_DOWN)
    for cap in range(64):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError:
            break  # EINVAL past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} sets, zero
    _syscall("capset", header, data)


CLONE_VM = 0x00000100
_PIN_STACK = ctypes.create_string_buffer(1 << 14)


def pin_address_space() -> int:
    """Start a process that shares our memory and sleeps in ``pause()``; its pid.

    While it lives, our own exit does not wait for the kernel to tear down our
    (large, forked) address space, so whoever waits for us learns our exit
    status sooner; the teardown happens when the pin is killed. The pin runs no
    Python, only libc's ``pause``, on a small stack of its own.
    """
    top = (ctypes.addressof(_PIN_STACK) + len(_PIN_STACK) - 64) & ~0xF
    pid = _libc.clone(
        ctypes.cast(_libc.pause, ctypes.c_void_p),
        ctypes.c_void_p(top),
        ctypes.c_int(CLONE_VM | 17),  # SIGCHLD to the parent when it dies
        ctypes.c_void_p(None),
    )
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"clone: {os.strerror(errno)}")
    return pid


def fork_into_new_pid_namespace() -> int:
    """``fork()`` whose child is PID 1 of a new PID namespace; 0 in the child.

    A raw ``clone(CLONE_NEWPID | SIGCHLD)``: unlike ``unshare`` it leaves the
    caller's own namespace for later children alone, so a long-lived process
    can create one namespace per child without a middleman process. The child
    skips libc's and Python's fork handlers: it must be single-threaded trusted
    code that ends in ``os._exit`` (it may ``os.fork`` normally).
    """
    if "clone" not in _SYSCALLS:
        raise OSError(38, f"clone: unsupported machine {platform.machine()}")
    _libc.syscall.restype = ctypes.c_long
    pid = _libc.syscall(
        ctypes.c_long(_SYSCALLS["clone"]),
        ctypes.c_ulong(CLONE_NEWPID | 17),
        ctypes.c_void_p(None),
        ctypes.c_void_p(None),
        ctypes.c_void_p(None),
        ctypes.c_ulong(0),
    )
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"clone: {os.strerror(errno)}")
    return int(pid)


def initial_user_namespace() -> bool:
    """Whether this process is in the initial user namespace (its uid map is the
    identity of every uid): only there does root hold ``trusted.*`` attributes."""
    try:
        with open("/proc/self/uid_map") as handle:
            return handle.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False
