"""How the trainer and the server talk: length-prefixed JSON over a Unix socket.

Wire format: 4-byte big-endian length + JSON, both directions, one frame per
request and one per reply, so neither side guesses where a message ends.
``unix_socket_path`` makes a socket path of any length usable (an address
holds 107 bytes); ``write_all`` writes a whole buffer to a descriptor (a pipe
takes it in pieces).

Used by the client (``local.py``) and by the server's processes: standard
library only, and copied with the server into its runtime package.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any


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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
