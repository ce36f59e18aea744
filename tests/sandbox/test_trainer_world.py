"""Nothing of the trainer's world is visible from a call."""

import ctypes
import os
import socket
import subprocess
import sys

import pytest

from retool.sandbox import IsolationLevel, LocalSandbox

from .helpers import REPO, ROOT, SRC


def _probe_paths(sb: LocalSandbox, paths: list[str]) -> dict[str, bool]:
    result = sb.run(f"import os\nprint({{p: os.path.exists(p) for p in {paths!r}}})")
    assert result.ok, result.stderr
    return eval(result.stdout)


def test_the_checkout_and_package_are_not_visible_from_the_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    with LocalSandbox(max_workers=1, timeout=10) as sb:
        assert sb.isolation_level == IsolationLevel.FULL
        seen = _probe_paths(
            sb, [str(REPO / ".git"), str(SRC), str(REPO / "README.md"), ".git", "src"]
        )
        assert not any(seen.values()), seen
        result = sb.run("import sys\nprint(sys.path)")
        path = eval(result.stdout)
        assert "" not in path and "." not in path
        assert not [p for p in path if p.startswith(str(REPO)) and ".venv" not in p], path


@pytest.mark.parametrize(
    "module", ["retool", "retool.data", "retool.data.demo", "retool.sandbox", "retool.errors"]
)
def test_no_retool_module_is_importable_in_a_call(sandbox, module):
    result = sandbox.run(f"import importlib\nimportlib.import_module({module!r})")
    assert not result.ok and "ModuleNotFoundError" in result.stderr


def test_site_and_editable_finders_cannot_bring_the_checkout_back(sandbox):
    code = (
        "import site, sys\nfor d in list(sys.path):\n    try:\n        site.addsitedir(d)\n"
        "    except Exception:\n        pass\nimport retool.data.demo"
    )
    result = sandbox.run(code)
    assert not result.ok and "ModuleNotFoundError" in result.stderr


def test_dotenv_and_unix_socket_in_the_run_directory(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-run-dir-secret\n")
    (tmp_path / ".env").chmod(0o644)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock_path = str(tmp_path / "control.sock")
    listener.bind(sock_path)
    os.chmod(sock_path, 0o777)
    listener.listen(1)
    listener.setblocking(False)
    monkeypatch.chdir(tmp_path)
    os.chmod(tmp_path, 0o755)
    try:
        for isolation in ("auto", "none"):
            with LocalSandbox(max_workers=1, timeout=10, isolation=isolation) as sb:
                read = sb.run(
                    f"for p in ('.env', {str(tmp_path / '.env')!r}):\n    try:\n"
                    "        print(open(p).read())\n    except OSError as e:\n        print(e)"
                )
                assert "sk-run-dir-secret" not in read.stdout, isolation
                connect = sb.run(
                    "import socket\ns = socket.socket(socket.AF_UNIX)\n"
                    f"s.connect({sock_path!r})\nprint('connected')"
                )
                assert "connected" not in connect.stdout, isolation
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.parametrize("cwd", ["/", "/tmp"])
def test_started_from_root_or_tmp_with_umask_0_stays_full_and_private(cwd, monkeypatch):
    marker = f"/tmp/retool-host-tmp-{os.getpid()}"
    with open(marker, "w") as handle:
        handle.write("host")
    monkeypatch.chdir(cwd)
    old = os.umask(0)
    try:
        with LocalSandbox(max_workers=1, timeout=10) as sb:
            assert sb.isolation_level == IsolationLevel.FULL, sb.missing
            assert not sb.degraded
            seen = _probe_paths(sb, [marker])
            assert not seen[marker]  # the call's /tmp is its own
            # The server's socket: neither visible nor connectable.
            reach = sb.run(
                "import glob, socket\nfound = glob.glob('/tmp/retool-sandbox-*/**', "
                "recursive=True)\nprint([p for p in found if p.endswith('.sock')])\n"
                "s = socket.socket(socket.AF_UNIX)\nprint('made a unix socket')"
            )
            assert "server.sock" not in reach.stdout
            assert "made a unix socket" not in reach.stdout
    finally:
        os.umask(old)
        os.unlink(marker)


def test_server_socket_is_private_even_with_umask_0(monkeypatch):
    old = os.umask(0)
    try:
        with LocalSandbox(max_workers=1, timeout=10) as sb:
            sock_dir = os.path.join(sb._dir, "sock")
            assert os.stat(sock_dir).st_mode & 0o777 == 0o700
            assert os.stat(os.path.join(sock_dir, "server.sock")).st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_server_is_isolated_from_the_callers_environment(monkeypatch):
    monkeypatch.setenv("PYTHONSTARTUP", "/nonexistent")
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    with LocalSandbox(max_workers=1, timeout=10) as sb:
        argv = sb._server.args  # its /proc cmdline is overwritten
        assert "-I" in argv and "-S" in argv
        assert os.readlink(f"/proc/{sb._server.pid}/cwd") == os.path.realpath(sb._dir)
        with open(f"/proc/{sb._server.pid}/environ", "rb") as handle:
            env = handle.read()
        assert b"PYTHONPATH" not in env and b"PYTHONSTARTUP" not in env


_libc = ctypes.CDLL(None, use_errno=True)
_KEY_SPEC_SESSION_KEYRING = -3


def _add_session_key(description: bytes, payload: bytes) -> int:
    _libc.syscall.restype = ctypes.c_long
    serial = _libc.syscall(
        ctypes.c_long(248 if os.uname().machine == "x86_64" else 217),
        b"user",
        description,
        payload,
        ctypes.c_size_t(len(payload)),
        ctypes.c_int(_KEY_SPEC_SESSION_KEYRING),
    )
    if serial < 0:
        pytest.skip(f"keyrings unavailable here (errno {ctypes.get_errno()})")
    return serial


def test_the_trainers_session_keyring_is_not_shared():
    description = f"retool-test-key-{os.getpid()}".encode()
    _add_session_key(description, b"trainer-key-payload")
    with open("/proc/keys") as handle:  # positive control: the trainer sees its key
        if description.decode() not in handle.read():
            pytest.skip("/proc/keys does not list session keys here")
    with LocalSandbox(max_workers=1, timeout=10) as sb:
        result = sb.run("print(open('/proc/keys').read())")
        assert description.decode() not in result.stdout
        # Keys a call adds are refused outright (seccomp), so none can reach a later call.
        add = sb.run(
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.syscall(248, b'user', b'call-key', b'x', 1, -3)\n"
            "print(r, ctypes.get_errno())"
        )
        assert add.stdout.split()[0] == "-1"


def test_degraded_isolation_is_reported_on_every_result():
    with LocalSandbox(max_workers=1, timeout=10, isolation="none") as sb:
        for _ in range(2):
            result = sb.run("print(1)")
            assert result.ok and result.isolation == "basic" and result.degraded
    with LocalSandbox(max_workers=1, timeout=10) as sb:
        result = sb.run("print(1)")
        assert result.isolation == "full" and result.degraded == bool(sb.missing)


@pytest.mark.skipif(not ROOT, reason="full isolation expected for root here")
def test_sandbox_check_reports_the_level():
    retool = os.path.join(os.path.dirname(sys.executable), "retool")
    out = subprocess.run([retool, "sandbox", "check"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "isolation level: full" in out.stdout
    out = subprocess.run(
        [retool, "sandbox", "check", "--isolation", "none"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1 and "isolation level: basic" in out.stdout
    assert "missing:" in out.stdout
