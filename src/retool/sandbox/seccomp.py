"""A hand-built seccomp deny-list for calls (no libseccomp needed).

Denied with ``EPERM`` unless noted: namespace creation and joining (``unshare``,
``setns``, ``clone`` with any ``CLONE_NEW*`` flag; ``clone3`` returns ``ENOSYS``
so libc falls back to ``clone``, whose flags we can inspect), the ``mount``
family and ``pivot_root``/``chroot``, keyrings (``keyctl``, ``add_key``,
``request_key``), ``bpf``, ``perf_event_open``, ``io_uring_*``,
``userfaultfd``, ``ptrace`` and ``process_vm_*``, ``kexec*``, module loading,
``pidfd_getfd``, ``open_by_handle_at``, a few host-wide knobs (clock,
swap, reboot, hostname), and ``sysinfo``, whose process count, load averages and
free memory are the host's (what ``/proc/stat`` and ``/proc/loadavg``, masked,
would say; glibc's ``sysconf(_SC_PHYS_PAGES)`` then reads no figure, which
``qsort`` tolerates). ``socket`` is allowed for ``AF_INET``/``AF_INET6``
only (``socketpair`` stays allowed): no Unix socket, abstract or on disk, so a
call can reach neither the fork server nor another call, and no netlink or
packet socket. Syscalls of a foreign ABI (x32, i386 on x86_64) are refused.

``fallocate`` with any flag in its mode gets ``EOPNOTSUPP``: the kernel checks
the file-size rlimit only where a file grows, so ``FALLOC_FL_KEEP_SIZE`` would
reserve blocks past it, and a call's output files lie on the host filesystem
(one call could take the trainer's whole disk while it runs). Mode 0, what
``posix_fallocate`` asks for, grows the file and so stays under the rlimit.

``setsid`` succeeds without doing anything (it returns 0, the caller stays in
the server's session): wherever no cpu cgroup holds the call, each new session
is a scheduler autogroup of its own, as heavy as the trainer's whole session,
so 25 processes each in a session of its own took 25/26 of the machine. Nothing
a call does needs a real new session (it has no terminal; its processes are
killed by cgroup, PID namespace or uid, not by session).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

from . import linux

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_JGE_K = 0x35
_RET_K = 0x06

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
NS_FLAGS |= 0x40000000 | 0x00000080
AF_INET, AF_INET6 = 2, 10

_DENIED_NAMES = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "pidfd_getfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "clock_adjtime",
    "acct",
    "quotactl",
    "syslog",
    "fanotify_init",
    "lookup_dcookie",
    "vhangup",
    "sysinfo",
)

# fmt: off
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "clone": 56, "clone3": 435, "socket": 41,
            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
            "chroot": 161, "move_mount": 429, "open_tree": 428, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
            "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
            "perf_event_open": 298, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "userfaultfd": 323, "ptrace": 101,
            "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246,
            "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
            "delete_module": 176, "pidfd_getfd": 438, "open_by_handle_at": 304,
            "name_to_handle_at": 303, "swapon": 167, "swapoff": 168, "reboot": 169,
            "sethostname": 170, "setdomainname": 171, "settimeofday": 164,
            "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "acct": 163,
            "quotactl": 179, "syslog": 103, "fanotify_init": 300, "lookup_dcookie": 212,
            "vhangup": 153, "setsid": 112, "sysinfo": 99, "fallocate": 285,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220, "clone3": 435, "socket": 198,
            "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
            "chroot": 51, "move_mount": 429, "open_tree": 428, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
            "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
            "perf_event_open": 241, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "userfaultfd": 282, "ptrace": 117,
            "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104,
            "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
            "delete_module": 106, "pidfd_getfd": 438, "open_by_handle_at": 265,
            "name_to_handle_at": 264, "swapon": 224, "swapoff": 225, "reboot": 142,
            "sethostname": 161, "setdomainname": 162, "settimeofday": 170,
            "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "acct": 89,
            "quotactl": 60, "syslog": 116, "fanotify_init": 262, "lookup_dcookie": 18,
            "vhangup": 58, "setsid": 157, "sysinfo": 179, "fallocate": 47,
        },
    ),
}
# fmt: on


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def build_program(machine: str | None = None) -> bytes:
    """The BPF program for this machine (raises OSError where we have no table)."""
    machine = machine or platform.machine()
    if machine not in _TABLES:
        raise OSError(errno.ENOSYS, f"no seccomp table for {machine}")
    arch, numbers = _TABLES[machine]
    eperm, enosys, eaccess = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS, RET_ERRNO
    eaccess |= errno.EACCES
    prog: list[bytes] = []
    # Load-arch: a foreign ABI gets EPERM for everything.
    prog.append(_insn(_LD_W_ABS, 0, 0, 4))
    prog.append(_insn(_JEQ_K, 1, 0, arch))
    prog.append(_insn(_RET_K, 0, 0, eperm))
    prog.append(_insn(_LD_W_ABS, 0, 0, 0))  # syscall number
    if machine == "x86_64":  # x32 syscalls have bit 30 set
        prog.append(_insn(_JGE_K, 0, 1, 0x40000000))
        prog.append(_insn(_RET_K, 0, 0, eperm))
    denied = sorted({numbers[name] for name in _DENIED_NAMES})
    for number in denied:
        prog.append(_insn(_JEQ_K, 0, 1, number))
        prog.append(_insn(_RET_K, 0, 0, eperm))
    prog.append(_insn(_JEQ_K, 0, 1, numbers["setsid"]))
    prog.append(_insn(_RET_K, 0, 0, RET_ERRNO))  # errno 0: "success", nothing done
    prog.append(_insn(_JEQ_K, 0, 1, numbers["clone3"]))
    prog.append(_insn(_RET_K, 0, 0, enosys))
    # fallocate: mode 0 only (its second argument, low 32 bits).
    prog.append(_insn(_JEQ_K, 0, 4, numbers["fallocate"]))
    prog.append(_insn(_LD_W_ABS, 0, 0, 24))
    prog.append(_insn(_JEQ_K, 0, 1, 0))
    prog.append(_insn(_RET_K, 0, 0, RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, RET_ERRNO | errno.EOPNOTSUPP))
    # clone: refuse any namespace flag in its first argument (low 32 bits).
    prog.append(_insn(_JEQ_K, 0, 4, numbers["clone"]))
    prog.append(_insn(_LD_W_ABS, 0, 0, 16))
    prog.append(_insn(_JSET_K, 0, 1, NS_FLAGS))
    prog.append(_insn(_RET_K, 0, 0, eperm))
    prog.append(_insn(_RET_K, 0, 0, RET_ALLOW))
    # socket: AF_INET and AF_INET6 only.
    prog.append(_insn(_JEQ_K, 0, 5, numbers["socket"]))
    prog.append(_insn(_LD_W_ABS, 0, 0, 16))
    prog.append(_insn(_JEQ_K, 2, 0, AF_INET))
    prog.append(_insn(_JEQ_K, 1, 0, AF_INET6))
    prog.append(_insn(_RET_K, 0, 0, eaccess))
    prog.append(_insn(_RET_K, 0, 0, RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, RET_ALLOW))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes) -> None:
    """Install ``program`` on the calling thread (needs ``no_new_privs``); its
    children inherit it and it can never be removed."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    result = linux._libc.prctl(
        ctypes.c_int(PR_SET_SECCOMP),
        ctypes.c_ulong(SECCOMP_MODE_FILTER),
        ctypes.c_void_p(ctypes.addressof(fprog)),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"seccomp: {errno.errorcode.get(code, code)}")
