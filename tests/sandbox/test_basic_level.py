"""The `basic` level (no namespaces): Landlock narrows what a call reaches on
the host filesystem and network, and what it can signal."""

import os
import socket
import tempfile

import pytest

from retool.sandbox import LocalSandbox
from retool.sandbox.landlock import abi_version

from .helpers import REPO

ABI = abi_version()
pytestmark = pytest.mark.skipif(ABI < 1, reason="no Landlock on this kernel")


@pytest.fixture(scope="module")
def basic():
    with LocalSandbox(max_workers=1, timeout=10, isolation="none") as sb:
        assert sb.isolation_level == "basic" and sb.degraded
        yield sb


def test_host_files_outside_the_allowlist_are_unreadable(basic):
    where = tempfile.mkdtemp(prefix="retool-basic-")
    os.chmod(where, 0o755)
    secret = os.path.join(where, "secret.txt")
    with open(secret, "w") as handle:
        handle.write("world-readable-secret")
    os.chmod(secret, 0o644)
    try:
        result = basic.run(f"print(open({secret!r}).read())")
        assert "world-readable-secret" not in result.stdout and "PermissionError" in result.stderr
        listing = basic.run(f"import os\nprint(os.listdir({str(REPO)!r}))")
        assert not listing.ok and "PermissionError" in listing.stderr
    finally:
        os.unlink(secret)
        os.rmdir(where)


def test_writes_go_only_to_the_scratch_directory(basic):
    target = f"/tmp/retool-basic-write-{os.getpid()}"
    result = basic.run(f"open({target!r}, 'w').write('x')")
    assert not result.ok and not os.path.exists(target)
    ok = basic.run(
        "import tempfile\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')\n"
        "open('here.txt', 'w').write('fine')\nprint(open('here.txt').read())"
    )
    assert ok.ok and ok.stdout == "fine\n"


def test_the_os_and_libraries_stay_usable(basic):
    result = basic.run("import sympy, numpy\nprint(sympy.isprime(97), int(numpy.ones(3).sum()))")
    assert result.ok and result.stdout == "True 3\n"


@pytest.mark.skipif(ABI < 6, reason="signal scoping needs Landlock ABI 6")
def test_the_call_cannot_signal_processes_outside_it(basic):
    result = basic.run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)")
    assert not result.ok and "PermissionError" in result.stderr


@pytest.mark.skipif(ABI < 4, reason="TCP rules need Landlock ABI 4")
def test_tcp_to_the_host_is_refused(basic):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        result = basic.run(
            f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('in')"
        )
        assert "in" not in result.stdout and not result.ok
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
