"""Landlock for the ``basic`` level: the call's view of the host, by explicit paths.

Without namespaces a call runs on the host filesystem. Landlock (unprivileged,
stackable, inherited by children, never removable) narrows it to: read and
execute the OS and interpreter paths, read ``/proc``, use the five ``/dev``
nodes, and write only below the call's scratch directory. Where the kernel's
ABI has them it also refuses TCP bind/connect (ABI 4), abstract Unix sockets
and signals to processes outside the call (ABI 6). UDP is not covered.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

from . import linux

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}.get(platform.machine())
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


def _syscall(index: int, *args: object) -> int:
    if _SYSCALLS is None:
        raise OSError(38, f"landlock: unsupported machine {platform.machine()}")
    linux._libc.syscall.restype = ctypes.c_long
    result = linux._libc.syscall(ctypes.c_long(_SYSCALLS[index]), *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"landlock: {os.strerror(errno)}")
    return int(result)


def abi_version() -> int:
    """The kernel's Landlock ABI (0 when unavailable)."""
    try:
        return _syscall(0, ctypes.c_void_p(None), ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    except OSError:
        return 0


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(
    read_paths: list[str], write_paths: list[str], device_paths: list[str], abi: int
) -> None:
    """Confine the calling process (and its future children) for good."""
    handled_fs = _fs_rights(abi)
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("Q", handled_fs)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _syscall(0, buffer, ctypes.c_size_t(len(attr)), 0)
    try:
        read = (EXECUTE | READ_FILE | READ_DIR) & handled_fs
        rules = [(p, read) for p in read_paths]
        rules += [(p, handled_fs) for p in write_paths]
        rules += [(p, (READ_FILE | WRITE_FILE | IOCTL_DEV) & handled_fs) for p in device_paths]
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    access &= _FILE_ONLY
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                _syscall(1, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), rule, 0)
            finally:
                os.close(fd)
        _syscall(2, ctypes.c_int(ruleset), 0)
    finally:
        os.close(ruleset)
