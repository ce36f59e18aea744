"""The handler: serves one connection, running the calls its zygote prepared.

For each request it takes a prepared call, writes the code to C's pipe, waits
for B's report on its own timer, then kills the call's cgroup (or PID
namespace, or uid) whatever happened: daemons die with the call. The reply is
built only from facts the handler holds, never from what the call wrote: B's
report (set-up byte, C's wait status), the timer, the cgroup's OOM counter,
the output files' allocated size and their tails. ``PREPARE_AHEAD`` calls are
kept prepared, so no request waits on the zygote; a cleaner thread closes,
unlinks and removes finished calls after the reply, off the critical path.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shutil
import signal
import socket
import threading
import time
from typing import Any

from .call import BASIC, MAX_FILE_BYTES
from .uids import kill_uid
from .wire import recv_frame, send_frame, write_all
from .zygote import Prepared, receive_prepared

PREPARE_AHEAD = 3  # calls each handler keeps prepared (or being prepared) ahead


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
            write_all(prepared.code_w, payload)
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
            if item is STOP:
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
                    ready.append(receive_prepared(self.factory, ask=False))
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
            self._finished.put(STOP)
            cleaner.join(5)


STOP: Any = object()


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
