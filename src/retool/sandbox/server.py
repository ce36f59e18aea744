"""The fork server: a clean interpreter that forks one isolated child per call.

Process tree, and why each level exists::

    trainer (LocalSandbox)            holds secrets; never forks model code
     └─ server                        started with an empty environment; imports
        │                             ``preload`` once; owns an empty network namespace
        └─ handler (one per connection) serves one client connection at a time
           └─ A: supervisor           new mount/PID/IPC/UTS namespaces; reports B's
              │                       pid and exit status; trusted code only
              └─ B: PID 1 of the call  bubblewrap-style root (read-only binds, private
                                      /tmp, /dev/shm and /proc), unprivileged uid,
                                      no_new_privs, rlimits; then runs the code

B is forked *before* the code arrives and waits on a pipe, so namespace and
mount set-up are off the critical path. When B exits or is killed, the kernel
kills every process left in its PID namespace: daemons, double forks and
``setsid`` children included. stdout/stderr go to files the handler opened, so
no process can hold a pipe open and hang the harness; only the tail is read.

Without namespaces (some containers) the same tree runs with rlimits, an empty
environment, a scratch cwd, a dedicated uid when root, and kill-by-process-group
and kill-by-uid after each call: the ``basic`` level.

Wire format: 4-byte big-endian length + JSON, both directions.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from retool.sandbox import linux

FULL, BASIC = "full", "basic"
UID_BASE = 61000  # sandbox uids when the server runs as root (see Handler.uid_for)
UIDS_PER_HANDLER = 8  # > calls a handler has prepared or running at once (3)
MAX_PROCS = 64  # processes per call (fork bombs stop here)
MAX_FILE_BYTES = 8 << 20  # largest file a call may write (stdout/stderr included)
MAX_OPEN_FILES = 64
TMPFS_MB = 64  # private /tmp of a call
_DEV_NODES = ("null", "zero", "full", "random", "urandom")


# -- framing -------------------------------------------------------------------
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
    """Host paths B sees (read-only): the OS and this interpreter's environment."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    seen: list[str] = []
    for path in sorted(
        {os.path.realpath(p) if not os.path.islink(p) else p for p in paths if os.path.lexists(p)},
        key=len,
    ):
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            seen.append(path)
    return seen


def build_root(new_root: str, binds: list[str]) -> None:
    """Mount a minimal read-only root at ``new_root`` and ``pivot_root`` into it."""
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount("tmpfs", new_root, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m,mode=0755")
    # Private /tmp and /dev/shm first: a bind below /tmp (a checkout or venv living
    # there) must land on top of the private tmpfs, not be hidden by it.
    for sub, size in (("/tmp", TMPFS_MB), ("/dev/shm", 16)):
        os.makedirs(new_root + sub, exist_ok=True)
        linux.mount(
            "tmpfs",
            new_root + sub,
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV,
            f"size={size}m,mode=1777",
        )
    ro = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    for src in binds:
        dst = new_root + src
        if os.path.islink(src) and os.path.dirname(src) == "/":
            os.symlink(os.readlink(src), dst)  # /bin -> usr/bin on merged-/usr systems
            continue
        os.makedirs(dst, exist_ok=True)
        linux.mount(src, dst, None, linux.MS_BIND | linux.MS_REC)
        linux.mount(None, dst, None, ro)
    os.makedirs(new_root + "/dev", exist_ok=True)
    for node in _DEV_NODES:
        dst = f"{new_root}/dev/{node}"
        open(dst, "w").close()
        linux.mount(f"/dev/{node}", dst, None, linux.MS_BIND)
    os.makedirs(new_root + "/proc", exist_ok=True)
    linux.mount(
        "proc", new_root + "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    )
    os.makedirs(new_root + "/.old", exist_ok=True)
    os.chdir(new_root)
    linux.pivot_root(".", ".old")
    os.chdir("/")
    linux.umount2("/.old", linux.MNT_DETACH)
    os.rmdir("/.old")
    linux.mount(
        None,
        "/",
        None,
        linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_BIND,
    )


# -- B: the call ---------------------------------------------------------------
def _vm_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _apply_limits(request: dict[str, Any], root: bool) -> None:
    headroom = int(request["memory_mb"]) << 20
    vm = _vm_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = int(request["timeout"]) + 2 + int(resource.getrusage(resource.RUSAGE_SELF).ru_utime)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if root:  # RLIMIT_NPROC is ignored for uid 0; our uid is unprivileged by now
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCS, MAX_PROCS))


def _reseed() -> None:
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


def _run_code(code: str) -> int:
    from retool.sandbox.autoprint import add_autoprint

    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.argv = ["<code>"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    status = 0
    try:
        exec(compile(add_autoprint(code), "<code>", "exec"), namespace)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        etype, value, tb = sys.exc_info()
        # Drop our own frame so the traceback starts at the user's code.
        traceback.print_exception(etype, value, tb.tb_next if tb else None)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return status


def _child_b(
    level: str,
    code_r: int,
    done_w: int,
    out_fd: int,
    err_fd: int,
    uid: int | None,
    new_root: str,
    scratch: str | None,
    fresh: bool,
) -> None:
    """B: isolate, wait for the request, limit, run, report. Never returns.

    B reports its exit status on ``done_w`` itself: waiting for the kernel to
    tear down a PID namespace takes tens of milliseconds, which would otherwise
    sit on every call's critical path.
    """
    status = 70
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if level == FULL:
            build_root(new_root, readonly_paths())
            os.chdir("/tmp")
        else:
            os.setsid()
            assert scratch is not None
            os.chdir(scratch)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        _close_all_except(code_r, done_w, 0, 1, 2)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        with os.fdopen(code_r, "rb") as handle:
            raw = handle.read()
        if not raw:
            os._exit(0)  # the handler went away before sending code
        request = json.loads(raw)
        os.environ["HOME"] = os.getcwd()
        _apply_limits(request, root=uid is not None)
        if fresh:
            path = os.path.join(os.getcwd(), ".retool_code.py")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(request["code"])
            os.set_inheritable(done_w, True)
            os.execv(
                sys.executable,
                [
                    sys.executable,
                    "-c",
                    "from retool.sandbox.server import run_file; run_file()",
                    path,
                    str(done_w),
                ],
            )
        _reseed()
        status = _run_code(request["code"]) & 0xFF
        _report_done(done_w, status)
    except BaseException:
        with contextlib.suppress(OSError):
            os.write(2, ("sandbox setup failed: " + traceback.format_exc()).encode())
    os._exit(status & 0xFF)


def _report_done(done_w: int, status: int) -> None:
    with contextlib.suppress(OSError):
        os.write(done_w, f"{status}\n".encode())


def run_file() -> None:
    """Entry point of fresh-interpreter mode: run ``argv[1]``, report on fd ``argv[2]``."""
    path, done_w = sys.argv[1], int(sys.argv[2])
    with open(path, encoding="utf-8") as handle:
        code = handle.read()
    os.unlink(path)
    status = _run_code(code) & 0xFF
    _report_done(done_w, status)
    os._exit(status)


# -- the handler's view of one prepared call ------------------------------------
@dataclass
class Prepared:
    """A supervisor A and its child B, waiting for code."""

    pid_a: int
    pid_b: int | None  # read from A's first status line, when first needed
    code_w: int
    status_r: int  # A: B's pid, then B's wait status
    done_r: int  # B: its exit status, when it exits through our code
    out_path: str
    err_path: str
    scratch: str | None
    uid: int | None  # the call's own uid (root server only)


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


def _await_exit(
    prepared: Prepared, deadline: float, wait_only: bool = False
) -> tuple[int | None, bool]:
    """(returncode, reaped-by-A) once B reports or A reports B's wait status.

    ``returncode`` is negative for a signal and ``None`` at the deadline.
    """
    fds = [prepared.status_r] if wait_only else [prepared.status_r, prepared.done_r]
    while fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, False
        ready = select.select(fds, [], [], remaining)[0]
        if not ready:
            return None, False
        for fd in ready:
            data = os.read(fd, 64)
            if not data:
                fds.remove(fd)  # B exited without reporting: A's status will say why
                continue
            value = int(data.split(b"\n")[0])
            if fd == prepared.done_r:
                return value, False
            status = value
            return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)), True
    return None, False


class Handler:
    """Serves one connection: prepares a call, runs it, prepares the next."""

    def __init__(
        self, conn: socket.socket, index: int, level: str, workdir: str, fresh: bool
    ) -> None:
        self.conn = conn
        self.index = index
        self.level = level
        self.workdir = workdir
        self.fresh = fresh
        self.root = os.geteuid() == 0
        self.counter = 0
        self.new_root = os.path.join(workdir, "root")
        self.reap: list[Prepared] = []  # finished calls whose supervisor is not reaped yet

    def _close(self, prepared: Prepared) -> None:
        """Reap A (it exits once B's namespace is gone) and close the pipes."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(prepared.pid_a, 0)
        for fd in (prepared.status_r, prepared.done_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def uid_for(self, counter: int) -> int | None:
        """A uid of its own for each call in flight, so killing one call's leftovers
        by uid never touches the calls prepared after it."""
        if not self.root:
            return None
        return UID_BASE + self.index * UIDS_PER_HANDLER + counter % UIDS_PER_HANDLER

    def prepare(self) -> Prepared:
        self.counter += 1
        uid = self.uid_for(self.counter)
        stem = os.path.join(self.workdir, f"h{self.index}-{self.counter}")
        out_path, err_path = stem + ".out", stem + ".err"
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        out_fd, err_fd = os.open(out_path, flags, 0o600), os.open(err_path, flags, 0o600)
        scratch = None
        if self.level == BASIC:
            scratch = stem + ".scratch"
            os.mkdir(scratch, 0o700)
            if uid is not None:
                os.chown(scratch, uid, uid)
        code_r, code_w = os.pipe()
        status_r, status_w = os.pipe()
        done_r, done_w = os.pipe()
        pid_a = os.fork()
        if pid_a == 0:  # A
            try:
                # Only this call's fds: a sibling call's code pipe left open here
                # would keep that call from ever seeing the end of its request.
                _close_all_except(code_r, status_w, done_w, out_fd, err_fd, 0, 1, 2)
                linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
                if self.level == FULL:
                    linux.unshare(
                        linux.CLONE_NEWNS
                        | linux.CLONE_NEWPID
                        | linux.CLONE_NEWIPC
                        | linux.CLONE_NEWUTS
                    )
                pid_b = os.fork()
                if pid_b == 0:
                    os.close(status_w)
                    _child_b(
                        self.level,
                        code_r,
                        done_w,
                        out_fd,
                        err_fd,
                        uid,
                        self.new_root,
                        scratch,
                        self.fresh,
                    )
                os.close(done_w)
                os.write(status_w, f"{pid_b}\n".encode())
                _, wait_status = os.waitpid(pid_b, 0)
                os.write(status_w, f"{wait_status}\n".encode())
            except BaseException:
                with open(os.path.join(self.workdir, "supervisor-errors.log"), "a") as log:
                    log.write(traceback.format_exc())
            finally:
                os._exit(0)
        os.close(code_r)
        os.close(status_w)
        os.close(done_w)
        os.close(out_fd)
        os.close(err_fd)
        return Prepared(pid_a, None, code_w, status_r, done_r, out_path, err_path, scratch, uid)

    def _started(self, prepared: Prepared) -> None:
        """Read B's pid from A (written right after A forks B)."""
        if prepared.pid_b is not None:
            return
        line = _read_line(prepared.status_r, time.monotonic() + 30)
        if line is None:
            os.kill(prepared.pid_a, signal.SIGKILL)
            os.waitpid(prepared.pid_a, 0)
            raise RuntimeError("sandbox child did not start")
        prepared.pid_b = int(line)

    def run(self, prepared: Prepared, request: dict[str, Any]) -> dict[str, Any]:
        self._started(prepared)
        payload = json.dumps(request).encode()
        with contextlib.suppress(BrokenPipeError):  # B died in set-up; its status says why
            _write_all(prepared.code_w, payload)
        os.close(prepared.code_w)
        deadline = time.monotonic() + float(request["timeout"])
        returncode, waited = _await_exit(prepared, deadline)
        timed_out = returncode is None
        self._kill_tree(prepared)  # whatever B left behind (daemons) dies with it
        if timed_out:
            returncode, waited = _await_exit(prepared, time.monotonic() + 10, wait_only=True)
        if not waited:
            self.reap.append(prepared)  # reaped after the reply: off the critical path
        else:
            self._close(prepared)
        cap = int(request["max_output_bytes"])
        stdout, out_cut = _tail(prepared.out_path, cap)
        stderr, err_cut = _tail(prepared.err_path, cap)
        if prepared.scratch:
            shutil.rmtree(prepared.scratch, ignore_errors=True)
        return {
            "returncode": returncode,
            "timed_out": timed_out,
            "stdout": stdout,
            "stderr": stderr,
            "truncated": out_cut or err_cut,
        }

    def _kill_tree(self, prepared: Prepared) -> None:
        self._started(prepared)
        assert prepared.pid_b is not None
        with contextlib.suppress(ProcessLookupError):  # PID 1 of its namespace: takes all
            os.kill(prepared.pid_b, signal.SIGKILL)
        if self.level == BASIC:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(prepared.pid_b, signal.SIGKILL)
            if prepared.uid is not None:
                kill_uid(prepared.uid)

    def discard(self, prepared: Prepared) -> None:
        os.close(prepared.code_w)
        self._kill_tree(prepared)
        self._close(prepared)
        for path in (prepared.out_path, prepared.err_path):
            _unlink(path)
        if prepared.scratch:
            shutil.rmtree(prepared.scratch, ignore_errors=True)

    def serve(self) -> None:
        # Two calls prepared ahead: the one a request takes has had a whole call's
        # time to finish its namespace and mount set-up.
        ready = [self.prepare(), self.prepare()]
        try:
            while True:
                request = recv_frame(self.conn)
                if request is None:
                    return
                if request.get("op") == "ping":
                    send_frame(self.conn, {"pong": True})
                    continue
                reply = self.run(ready.pop(0), request)
                send_frame(self.conn, reply)
                while self.reap:
                    self._close(self.reap.pop())
                ready.append(self.prepare())
        finally:
            for prepared in ready:
                self.discard(prepared)


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


def _tail(path: str, cap: int) -> tuple[str, bool]:
    """The last ``cap`` bytes of a file, decoded with replacement; deletes the file."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - cap))
            data = handle.read(cap)
    except FileNotFoundError:
        return "", False
    finally:
        _unlink(path)
    return data.decode("utf-8", errors="replace"), size > cap


def kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (the basic level's tree kill)."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return


# -- the server ----------------------------------------------------------------
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


def probe_full(workdir: str) -> str | None:
    """Run one call at the full level; the error text if it does not work."""
    left, right = socket.socketpair()
    handler = Handler(right, 0, FULL, workdir, fresh=False)
    try:
        prepared = handler.prepare()
        reply = handler.run(
            prepared,
            {"code": "print(6 * 7)", "timeout": 20, "memory_mb": 256, "max_output_bytes": 4096},
        )
    except (OSError, RuntimeError) as exc:
        return str(exc)
    finally:
        left.close()
        right.close()
    if reply["stdout"].strip() != "42":
        return (reply["stderr"].strip().splitlines() or ["no output"])[-1]
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="retool.sandbox.server")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--isolation", default="auto", choices=["auto", "strict", "none"])
    args = parser.parse_args(argv)
    workdir = args.dir
    os.makedirs(os.path.join(workdir, "root"), exist_ok=True)
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the trainer
    missing: list[str] = []
    level = BASIC
    if args.isolation == "none":
        missing.append("namespaces (disabled: isolation='none')")
    else:
        missing = enter_server_namespaces()
        if not missing:
            error = probe_full(workdir)
            if error is None:
                level = FULL
            else:
                missing.append(f"per-call mount/PID namespaces ({error})")
    if os.geteuid() != 0 and level == BASIC:
        missing.append("a dedicated uid (the server is not root, so calls share its uid)")
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
    for name in (
        "random",
        "traceback",
        "retool.sandbox.autoprint",
        *(["numpy.random"] if "numpy" in preloaded else []),
    ):
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(workdir, "server.sock"))
    listener.listen(64)
    ready = {"level": level, "missing": missing, "preloaded": preloaded, "pid": os.getpid()}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped automatically
    index = 0
    while True:
        conn, _ = listener.accept()
        index += 1
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            listener.close()
            linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            try:
                Handler(conn, index, level, workdir, fresh).serve()
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    main()
