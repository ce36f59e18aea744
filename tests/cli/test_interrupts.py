"""Ctrl-C and SIGTERM while sampling: one line, exit 128 + signal, nothing left behind.

``retool rollout`` and ``retool eval`` run on tiny-random as a user runs
them (the console script, stderr on a terminal so the progress bar shows);
once the bar shows, sampling has started and the signal is sent. Each must
exit with 130 (SIGINT) or 143 (SIGTERM), end with one ``retool: ...`` line
and no traceback (nor ``terminate called``: a sampler thread still inside
torch at exit), leave no process of its session or environment alive, and
leave nothing in its ``TMPDIR`` (but torch's compile cache, which torch
keeps there across runs on purpose). The four runs share one test and run at once to
keep the cost to one torch import's worth of waiting.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

_SCRIPT = Path(sys.executable).with_name("retool")
RETOOL = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "retool"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TORCH_CACHES = ("torchinductor_",)  # torch's own compile cache, kept on purpose across runs


def _survivors(session: int, marker: str) -> list[int]:
    """Pids in ``session`` or whose environment carries ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if int(fields[3]) == session or marker.encode() in environ:  # fields[3]: session id
            found.append(int(entry))
    return found


def _wait_for(predicate, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


class Terminal:
    """A pseudo-terminal whose output is collected in the background."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        # a real terminal has a size; with 0 columns the progress bar renders empty
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.2)
                if ready:
                    data = os.read(self.master, 65536)
                    if not data:
                        return
                    self.chunks.append(data)
            except OSError:  # the other side closed
                return

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")

    def lines(self) -> list[str]:
        cleaned = ANSI.sub("", self.text()).replace("\r\n", "\n")
        return [part.strip() for line in cleaned.split("\n") for part in line.split("\r")]


def _interrupt(kind: str, signum: int, root: Path) -> str | None:
    """Run ``retool KIND`` until it samples, send ``signum``; ``None`` if all went well."""
    work = root / f"{kind}-{signal.Signals(signum).name}"
    work.mkdir()
    # short on purpose: the sandbox's socket path must fit AF_UNIX's 108 bytes
    tmp = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    try:
        return _run(kind, signum, work, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(kind: str, signum: int, work: Path, tmp: Path) -> str | None:
    marker = uuid.uuid4().hex
    argv = {
        "rollout": ["rollout", "--model", "tiny-random", "--questions", "2", "--group-size", "2"],
        "eval": ["eval", "--model", "tiny-random", "--dataset", "demo", "--limit", "2",
                 "--val-n", "2", "--output", "out.jsonl"],
    }[kind]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp), "RETOOL_TEST_MARKER": marker, "COLUMNS": "100"}
    terminal = Terminal()
    proc = subprocess.Popen(
        [*RETOOL, *argv],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal.slave,
        start_new_session=True,
    )
    os.close(terminal.slave)
    label = f"retool {kind} + {signal.Signals(signum).name}"
    try:
        if not _wait_for(lambda: f"{kind}:" in terminal.text() or proc.poll() is not None, 300):
            return f"{label}: no progress bar within 300 s: {terminal.text()[-500:]!r}"
        if proc.poll() is not None:
            return f"{label}: ended before sampling ({proc.returncode}): {terminal.text()[-500:]}"
        time.sleep(1.0)  # well inside sampling
        proc.send_signal(signum)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            return f"{label}: still running 60 s after the signal"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    terminal.reader.join(timeout=5)
    lines = [line for line in terminal.lines() if line]
    text = terminal.text()
    problems = []
    if code != 128 + signum:
        problems.append(f"exit status {code}, expected {128 + signum}")
    for bad in ("Traceback", "terminate called", "Exception ignored"):
        if bad in text:
            problems.append(f"{bad!r} on stderr")
    retool_lines = [line for line in lines if line.startswith("retool:")]
    if len(retool_lines) != 1 or lines[-1] != retool_lines[0]:
        problems.append(f"not one final 'retool: ...' line: {retool_lines}")
    elif signal.Signals(signum).name not in retool_lines[0]:
        problems.append(f"the line does not name the signal: {retool_lines[0]!r}")
    if not _wait_for(lambda: not _survivors(proc.pid, marker), 10):
        problems.append(f"processes left running: {_survivors(proc.pid, marker)}")
        for pid in _survivors(proc.pid, marker):
            os.kill(pid, signal.SIGKILL)
    left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith(TORCH_CACHES))
    if left:
        problems.append(f"left in TMPDIR: {left}")
    if problems:
        return f"{label}: {'; '.join(problems)}\n    stderr: {text[-800:]!r}"
    return None


@pytest.mark.slow  # runs many processes: started first under workers
def test_signals_while_sampling_exit_cleanly(tmp_path):
    runs = [(k, s) for k in ("rollout", "eval") for s in (signal.SIGINT, signal.SIGTERM)]
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        results = list(pool.map(lambda run: _interrupt(*run, tmp_path), runs))
    failures = [r for r in results if r is not None]
    assert not failures, "\n".join(failures)
