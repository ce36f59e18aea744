"""The kernel attack surface (the seccomp deny-list), and a non-root trainer gets a
working sandbox."""

import json
import os
import platform
import shutil
import subprocess
import tempfile
import textwrap

import pytest

from retool.sandbox.seccomp import build_program

from .helpers import ROOT, SRC
from .trainers import BOTH_TRAINERS

X86 = platform.machine() == "x86_64"

# (what, code printing the errno of one raw syscall; 0 would mean it worked)
_RAW = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
)
_SOCKET = (
    "import socket\ntry:\n    socket.socket(socket.{family}, socket.SOCK_RAW)\n    r = 0\n"
    "except OSError as e:\n    r = -1\n    ctypes.set_errno(e.errno)"
)
DENIED = {
    "unshare(CLONE_NEWUSER)": "r = libc.unshare(0x10000000)",
    "unshare(CLONE_NEWNET)": "r = libc.unshare(0x40000000)",
    "clone(CLONE_NEWUSER)": "r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)",
    "setns": "r = libc.syscall(308, 0, 0)",
    "mount tmpfs": "r = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)",
    "umount2": "r = libc.umount2(b'/proc', 2)",
    "keyctl": "r = libc.syscall(250, 0, -3, 0)",
    "add_key": "r = libc.syscall(248, b'user', b'k', b'v', 1, -3)",
    "request_key": "r = libc.syscall(249, b'user', b'k', None, -3)",
    "bpf": "r = libc.syscall(321, 0, None, 0)",
    "perf_event_open": "r = libc.syscall(298, None, 0, -1, -1, 0)",
    "io_uring_setup": "r = libc.syscall(425, 8, (ctypes.c_char * 120)())",
    "userfaultfd": "r = libc.syscall(323, 0)",
    "ptrace(TRACEME)": "r = libc.ptrace(0, 0, None, None)",
    "kexec_load": "r = libc.syscall(246, 0, 0, None, 0)",
    "init_module": "r = libc.syscall(175, None, 0, b'')",
    "finit_module": "r = libc.syscall(313, 0, b'', 0)",
    "pivot_root": "r = libc.syscall(155, b'/tmp', b'/tmp')",
    "chroot": "r = libc.chroot(b'/tmp')",
    "open_tree": "r = libc.syscall(428, -100, b'/', 1)",
    "fsopen": "r = libc.syscall(430, b'tmpfs', 0)",
    "raw socket": _SOCKET.format(family="AF_PACKET"),
    "netlink socket": _SOCKET.format(family="AF_NETLINK"),
}


@pytest.mark.skipif(not X86, reason="syscall numbers in this test are x86_64")
@pytest.mark.parametrize("what", sorted(DENIED))
def test_each_denied_syscall_fails(sandbox, what):
    result = sandbox.run(_RAW + DENIED[what] + "\nprint(r, ctypes.get_errno())")
    assert result.ok, result.stderr
    value, errno = result.stdout.split()
    assert value == "-1" and errno != "0", f"{what} was allowed: {result.stdout}"


@BOTH_TRAINERS
def test_a_new_user_namespace_cannot_be_entered_by_any_route(sandbox):
    code = (
        "import subprocess\nfor cmd in (['unshare', '-Ur', 'true'], ['unshare', '-m', 'true']):\n"
        "    try:\n        print(subprocess.run(cmd, capture_output=True).returncode)\n"
        "    except FileNotFoundError:\n        print(1)"
    )
    result = sandbox.run(code)
    assert result.ok and "0" not in result.stdout.split()


@BOTH_TRAINERS
def test_ordinary_code_still_runs_under_the_filter(sandbox):
    code = textwrap.dedent(
        """
        import subprocess, threading, multiprocessing, tempfile, socket
        import numpy as np, sympy
        out = subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip()
        box = []
        t = threading.Thread(target=lambda: box.append(sympy.factorint(2**32 + 1)))
        t.start(); t.join()
        with multiprocessing.Pool(2) as pool:
            squares = pool.map(abs, [-1, -2, -3])
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"x")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.close()
        print(out, box[0], squares, float(np.linalg.det(np.eye(3))))
        """
    )
    result = sandbox.run(code, timeout=20)
    assert result.ok, result.stderr
    assert result.stdout.strip() == "child {641: 1, 6700417: 1} [1, 2, 3] 1.0"


def test_the_program_refuses_foreign_abis():
    program = build_program("x86_64")
    assert len(program) % 8 == 0 and len(program) // 8 < 4096
    with pytest.raises(OSError):
        build_program("sparc")


# -- a non-root trainer --------------------------------------------------------
_NONROOT_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from retool.sandbox import LocalSandbox
    start = time.monotonic()
    def step(what):  # where the time went, should the test's budget run out
        print(f"{time.monotonic() - start:7.1f} s  {what}", file=sys.stderr, flush=True)
    out = {}
    for isolation in ("auto", "none"):
        with LocalSandbox(max_workers=1, timeout=10, preload=(), isolation=isolation) as sb:
            step(f"{isolation}: started")
            r = sb.run("import os\\nprint(os.getuid(), open('/proc/self/status').read()"
                       ".split('CapEff:')[1].split()[0])")
            step(f"{isolation}: uid and capabilities")
            w = sb.run("open('/etc/pwned', 'w')")
            step(f"{isolation}: write")
            m = sb.run("import ctypes\\nprint(ctypes.CDLL(None).mount("
                       "b'n', b'/tmp', b'tmpfs', 0, None))")
            step(f"{isolation}: mount")
            out[isolation] = {"level": sb.isolation_level.value, "degraded": sb.degraded,
                              "ok": r.ok, "stdout": r.stdout, "stderr": r.stderr,
                              "write_ok": w.ok, "mount": m.stdout.strip()}
    print(json.dumps(out))
    """
)


# Alone the script takes 2-7 s; the budget is for a suite of three workers on two cores.
BUDGET = 300


@pytest.mark.skipif(not ROOT, reason="needs root to switch to an unprivileged user")
def test_a_non_root_trainer_gets_a_working_sandbox():
    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip("no system python for the unprivileged user")
    check = subprocess.run([python, "-c", "import enum; enum.StrEnum"], capture_output=True)
    if check.returncode != 0:
        pytest.skip("the system python is older than 3.11")
    where = tempfile.mkdtemp(prefix="retool-nonroot-")
    os.chmod(where, 0o755)
    script = os.path.join(where, "nonroot.py")
    with open(script, "w") as handle:
        handle.write(_NONROOT_SCRIPT)
    os.chmod(script, 0o644)
    # A copy of the package the unprivileged user can read: the checkout itself may sit
    # under a private directory (a clone in a `mktemp -d` folder is mode 0700).
    source = os.path.join(where, "src")
    shutil.copytree(
        SRC / "retool", os.path.join(source, "retool"), ignore=shutil.ignore_patterns("__pycache__")
    )
    for root, _dirs, files in os.walk(source):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)

    def drop() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    try:
        # Should the budget run out, the failure shows how far the script got, and when.
        out = subprocess.run(
            [python, script, source],
            capture_output=True,
            text=True,
            cwd="/tmp",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            preexec_fn=drop,
            timeout=BUDGET,
            check=False,
        )
    except subprocess.TimeoutExpired as stuck:
        got = stuck.stderr or b""  # bytes even with text=True (what was read so far)
        got = got.decode(errors="replace") if isinstance(got, bytes) else got
        pytest.fail(f"the unprivileged sandbox did not finish in {BUDGET} s:\n{got}")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    full, basic = report["auto"], report["none"]
    assert full["ok"] and basic["ok"], report
    assert full["level"] == "full"
    assert full["stdout"].split()[1] == "0000000000000000"  # no capabilities at all
    assert not full["write_ok"] and not basic["write_ok"]
    assert full["mount"] == "-1" and basic["mount"] == "-1"
    assert basic["degraded"] and basic["level"] == "basic"
