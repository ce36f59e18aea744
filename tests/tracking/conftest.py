"""Fixtures that keep tracker tests offline and out of the user's home.

* ``no_network`` (autouse): every in-process socket ``connect`` or name lookup
  to anything but loopback or a Unix socket is refused *and recorded*; the test
  fails at teardown if any was attempted. Recording matters because the
  backends swallow their own network errors (W&B's telemetry thread did
  exactly that before ``WANDB_MODE`` was forced process-wide).
* ``isolated_env`` (autouse): ``HOME`` and the W&B/SwanLab config and cache
  directories point into ``tmp_path``, the working directory is an empty
  folder (so a test can check nothing was written outside the run directory),
  and ``os.environ`` is restored afterwards, since the trackers set
  ``WANDB_MODE``/``SWANLAB_MODE`` on purpose.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", None}


def _is_local(address: object) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX path
        return True
    if isinstance(address, tuple) and address:
        host = address[0]
        return host in _LOOPBACK or str(host).startswith("127.")
    return True


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    attempts: list[str] = []
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host, *args, **kwargs):
        if host not in _LOOPBACK and not str(host).startswith("127."):
            attempts.append(f"getaddrinfo({host!r})")
            raise OSError(f"network disabled in tests: lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(self, address):
        if not _is_local(address):
            attempts.append(f"connect({address!r})")
            raise OSError(f"network disabled in tests: connect to {address!r}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not _is_local(address):
            attempts.append(f"connect_ex({address!r})")
            return 101  # ENETUNREACH
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield attempts
    assert attempts == [], f"a tracker tried the network: {attempts}"


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    saved = dict(os.environ)
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    for name in ("WANDB_API_KEY", "SWANLAB_API_KEY", "WANDB_PROJECT", "SWANLAB_PROJECT"):
        os.environ.pop(name, None)
    os.environ.update(
        {
            "HOME": str(home),
            "WANDB_CONFIG_DIR": str(home / "wandb-config"),
            "WANDB_CACHE_DIR": str(home / "wandb-cache"),
            "WANDB_DATA_DIR": str(home / "wandb-data"),
            "SWANLAB_ROOT": str(home / "swanlab-root"),
        }
    )
    monkeypatch.chdir(work)
    try:
        yield work
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None:  # stop wandb-core so no service outlives the test
            wandb.teardown()
        os.environ.clear()
        os.environ.update(saved)
