"""The zygote: prepares a connection's calls ahead of their requests, never sees one.

One per connection, forked by the server (``server.py``). For each byte the
handler sends it forks a call's B (``call.child_b``, which forks C) with a
uid, cgroup and output files of its own, and passes the handler B's pid, its
pidfd and the ends of its two pipes in one SEQPACKET message
(``receive_prepared`` on the handler's side). Why a process of its own: it
never receives a request or a result, so a call forked from it cannot find
an earlier call's code or output in memory. :class:`Prepared` is the
handler's view of a prepared call.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

from . import cgroups, linux, seccomp
from .call import BASIC, CALL_NICE, FULL, MAX_PROCS, CallSpec, child_b
from .rootfs import masked_paths, readonly_paths
from .uids import UID_BLOCK, UIDS_PER_HANDLER


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
            child_b(spec, code_r, done_w, out_fd, err_fd)
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


def receive_prepared(sock: socket.socket, ask: bool = True) -> Prepared:
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
