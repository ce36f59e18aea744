"""The one atomic write (``retool.atomic``): old file or whole new one, never a trace.

Attacked as a full disk (a real ``EFBIG`` from ``RLIMIT_FSIZE`` in a child
process, and ``ENOSPC`` at ``fsync``), a writer that raises or is interrupted
half way, two threads replacing one path while a third reads it, a careless
caller (text into a binary handle, a directory or a missing one as the path)
and a umask that would hide the file from another user.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from retool import atomic
from retool.atomic import atomic_output, write_atomic


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_new_contents_appear_only_when_the_block_ends(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with atomic_output(path, encoding="utf-8") as handle:
        handle.write("né\n" * 1000)
        handle.flush()
        assert path.read_text() == "old\n"
        [tmp] = [name for name in _names(tmp_path) if name != "out.jsonl"]
        assert tmp.startswith(".out.jsonl.tmp-")  # hidden, and says what it is
    assert path.read_text(encoding="utf-8") == "né\n" * 1000
    assert _names(tmp_path) == ["out.jsonl"]


@pytest.mark.parametrize("failure", [RuntimeError("bad row"), KeyboardInterrupt()])
def test_a_writer_that_fails_half_way_leaves_the_old_file_and_no_temporary(tmp_path, failure):
    path = tmp_path / "data.bin"
    path.write_bytes(b"old contents")
    with pytest.raises(type(failure)), atomic_output(path) as handle:
        handle.write(b"x" * 100_000)
        raise failure
    assert path.read_bytes() == b"old contents"
    assert _names(tmp_path) == ["data.bin"]


def test_a_first_write_that_fails_creates_nothing(tmp_path):
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "new.bin", "text, not bytes")  # type: ignore[arg-type]
    assert _names(tmp_path) == []


def test_a_full_disk_at_fsync_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(OSError) as caught:
        write_atomic(path, b"new" * 1000)
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old" and _names(tmp_path) == ["metrics.jsonl"]


def test_a_file_size_limit_hit_mid_write_leaves_the_old_file(tmp_path):
    """A real kernel refusal part way through the data (``EFBIG`` past RLIMIT_FSIZE),
    in a child so the limit binds nothing else."""
    path = tmp_path / "big.bin"
    path.write_bytes(b"old")
    script = (
        "import errno, resource, signal, sys\n"
        "from retool.atomic import write_atomic\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "try:\n"
        "    write_atomic(sys.argv[1], b'n' * 1_000_000)\n"
        "except OSError as exc:\n"
        "    sys.exit(0 if exc.errno == errno.EFBIG else 3)\n"
        "sys.exit(4)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert path.read_bytes() == b"old" and _names(tmp_path) == ["big.bin"]


def test_two_threads_replacing_one_path_both_succeed_and_a_reader_sees_only_whole_files(
    tmp_path,
):
    path = tmp_path / "shared.bin"
    contents = [b"a" * 200_000, b"b" * 300_000]
    path.write_bytes(b"initial")
    start = threading.Barrier(3)
    errors: list[BaseException] = []
    seen: set[bytes] = set()
    writers_done = threading.Event()

    def writer(data: bytes) -> None:
        start.wait()
        try:
            for _ in range(40):
                write_atomic(path, data)
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        start.wait()
        while not writers_done.is_set():
            seen.add(path.read_bytes())

    threads = [threading.Thread(target=writer, args=(data,)) for data in contents]
    watcher = threading.Thread(target=reader)
    for thread in [*threads, watcher]:
        thread.start()
    for thread in threads:
        thread.join()
    writers_done.set()
    watcher.join()
    assert errors == []
    assert path.read_bytes() in contents
    assert seen <= {b"initial", *contents}  # never a torn or mixed file
    assert _names(tmp_path) == ["shared.bin"]


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def umask():
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def test_a_mode_asked_for_is_set_exactly_under_any_umask(tmp_path, umask):
    path = tmp_path / "layer.pyc"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    umask(0o077)
    write_atomic(path, b"new", mode=0o644)  # another uid must read it
    assert _mode(path) == 0o644
    umask(0)
    write_atomic(path, b"newer", mode=0o600)
    assert _mode(path) == 0o600 and path.read_bytes() == b"newer"


def test_without_a_mode_the_file_gets_what_a_plain_open_gives(tmp_path, umask):
    umask(0o027)
    (tmp_path / "plain").write_bytes(b"x")
    write_atomic(tmp_path / "atomic", b"x")
    assert _mode(tmp_path / "atomic") == _mode(tmp_path / "plain") == 0o640


def test_a_directory_or_a_missing_one_is_refused_and_nothing_is_left(tmp_path):
    target = tmp_path / "results"
    target.mkdir()
    (target / "inside").write_text("kept")
    with pytest.raises(IsADirectoryError):
        write_atomic(target, b"data")
    assert _names(tmp_path) == ["results"] and _names(target) == ["inside"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "out.bin", b"data")
    assert _names(tmp_path) == ["results"]


@pytest.mark.parametrize("encoding", ["no-such-codec", ""])
def test_an_unknown_encoding_leaves_nothing_not_even_an_open_descriptor(tmp_path, encoding):
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(LookupError), atomic_output(tmp_path / "x.txt", encoding=encoding):
        pass
    assert _names(tmp_path) == []
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_name_as_long_as_the_file_system_allows_is_still_replaced(tmp_path):
    path = tmp_path / ("n" * 255)
    path.write_bytes(b"old")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and _names(tmp_path) == [path.name]
