"""Limits hold per call, kernel memory included; calls cannot see or reach each
other, nor another sandbox instance."""

import hashlib
import secrets
import threading

import pytest

from retool.sandbox import ErrorKind, LocalSandbox

from .helpers import ROOT


@pytest.fixture(scope="module")
def small():
    with LocalSandbox(timeout=20, memory_mb=256, max_workers=1, max_output_bytes=4096) as sb:
        yield sb


def _cgroups(sb: LocalSandbox) -> bool:
    return not any(item.startswith("a cgroup per call") for item in sb.missing)


def test_memory_is_capped_across_processes(small):
    if not _cgroups(small):
        pytest.skip("no writable cgroups here")
    code = (
        "import os, time\npids = []\nfor _ in range(4):\n    pid = os.fork()\n"
        "    if pid == 0:\n        x = b'x' * (150 << 20)\n        time.sleep(5)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\nfor pid in pids:\n    os.waitpid(pid, 0)\nprint('all resident')"
    )
    result = small.run(code)
    # The kernel kills the children (the memory limit is the call's, not each
    # process's); the supervisor learns it from the cgroup, not from the output.
    assert not result.ok and result.error_kind == ErrorKind.MEMORY


def test_memfd_memory_counts(small):
    if not _cgroups(small):
        pytest.skip("no writable cgroups here")
    # Many memfds, each under the file-size rlimit and none mapped (so the
    # address-space rlimit does not see them): only the cgroup counts them.
    code = (
        "import os\nchunk = b'y' * (1 << 20)\nfds = []\nfor _ in range(55):\n"
        "    fd = os.memfd_create('x')\n    for _ in range(7):\n        os.write(fd, chunk)\n"
        "    fds.append(fd)\nprint('385 MiB in memfds')"
    )
    result = small.run(code)
    assert not result.ok and "385 MiB in memfds" not in result.stdout
    assert result.error_kind == ErrorKind.MEMORY


def test_tmpfs_memory_counts(small):
    code = (
        "import os\nchunk = b'z' * (1 << 20)\nn = 0\ntry:\n"
        "    for d in ('/tmp', '/dev/shm'):\n        with open(d + '/big', 'wb') as f:\n"
        "            for _ in range(1024):\n                f.write(chunk)\n"
        "                n += 1\nexcept OSError as e:\n    print('stopped', e.errno)\nprint(n)"
    )
    result = small.run(code)
    assert "stopped" in result.stdout or result.error_kind in (ErrorKind.MEMORY, ErrorKind.OUTPUT)


def test_file_count_is_bounded_and_the_next_call_is_clean(small):
    code = (
        "import os\nn = 0\ntry:\n    for i in range(10**6):\n"
        "        open(f'/tmp/f{i}', 'w').close()\n        n += 1\n"
        "except OSError as e:\n    print('stopped', e.errno)\nprint(n)"
    )
    result = small.run(code)
    assert "stopped 28" in result.stdout  # ENOSPC: out of inodes
    assert int(result.stdout.split()[-1]) < 10_000
    after = small.run("import os\nprint(len([f for f in os.listdir('/tmp') if f[0] == 'f']))")
    assert after.ok and after.stdout == "0\n"


def test_thread_bomb_is_bounded(small):
    if not _cgroups(small):
        pytest.skip("no writable cgroups here (the process cap is the pids cgroup)")
    code = (
        "import threading, time\nn = 0\ntry:\n    for _ in range(2000):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError:\n    pass\nprint(n, flush=True)\n"
        "import os\nos._exit(0)"
    )
    result = small.run(code)
    assert result.ok and int(result.stdout) < 200


def test_fork_bomb_without_sleep_is_bounded(small):
    if not _cgroups(small):
        pytest.skip("no writable cgroups here (the process cap is the pids cgroup)")
    code = (
        "import os\nn = 0\nwhile n < 5000:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        import time\n"
        "        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)"
    )
    result = small.run(code)
    assert result.ok and int(result.stdout) < 200
    assert small.run("print('next')").stdout == "next\n"


# -- neighbours: other calls, other instances --------------------------------------
def test_a_call_cannot_find_an_earlier_calls_data_in_its_memory(small):
    secret = secrets.token_hex(16)
    # The canary travels in the request and in the result (small and large).
    first = small.run(f"print('leak-canary-' + {secret!r})\nx = 'leak-canary-{secret}'")
    assert first.ok
    big = small.run(f"print(('leak-canary-' + {secret!r} + ' ') * 150)")
    assert big.ok
    digest = hashlib.sha256(secret.encode()).hexdigest()
    # Read our whole writable memory in place (/proc/self/mem is closed to a
    # non-dumpable process); count canaries whose suffix hashes to the secret.
    scan = (
        "import ctypes, hashlib, re\nprefix = b'leak-canary-'\nfound = 0\n"
        "for line in open('/proc/self/maps').read().splitlines():\n    parts = line.split()\n"
        "    if not parts[1].startswith('rw') or (len(parts) > 5 and parts[5].startswith('[v')):\n"
        "        continue\n    lo, hi = (int(v, 16) for v in parts[0].split('-'))\n"
        "    if hi - lo > (256 << 20):\n        continue\n"
        "    data = ctypes.string_at(lo, hi - lo)\n"
        "    for m in re.finditer(re.escape(prefix) + b'([0-9a-f]{32})', data):\n"
        f"        if hashlib.sha256(m.group(1)).hexdigest() == {digest!r}:\n"
        "            found += 1\nprint('found', found)"
    )
    # Positive control: the scan finds a canary that is in the call's own memory.
    own = small.run(f"x = b'leak-canary-' + bytes.fromhex({secret.encode().hex()!r})\n" + scan)
    assert own.ok and own.stdout.strip() != "found 0", own.stdout + own.stderr
    for _ in range(5):  # calls prepared before and after the canary went through
        result = small.run(scan)
        assert result.ok, result.stderr
        assert result.stdout.strip() == "found 0"


def test_concurrent_calls_cannot_talk_over_unix_sockets(sandbox):
    listener_code = (
        "import socket, time\ntry:\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.bind('\\0retool-rendezvous')\n    s.listen(1)\n    s.settimeout(2)\n"
        "    c, _ = s.accept()\n    print('got', c.recv(100))\nexcept OSError as e:\n"
        "    print('listener failed', type(e).__name__)"
    )
    talker_code = (
        "import socket, time\ntime.sleep(0.3)\ntry:\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect('\\0retool-rendezvous')\n    s.sendall(b'secret')\n    print('sent')\n"
        "except OSError as e:\n    print('talker failed', type(e).__name__)"
    )
    results = {}
    thread = threading.Thread(target=lambda: results.update(listener=sandbox.run(listener_code)))
    thread.start()
    results["talker"] = sandbox.run(talker_code)
    thread.join()
    assert "listener failed PermissionError" in results["listener"].stdout
    assert "talker failed PermissionError" in results["talker"].stdout


def test_concurrent_calls_cannot_talk_over_loopback(sandbox):
    listener_code = (
        "import socket\ntry:\n    s = socket.socket()\n    s.bind(('127.0.0.1', 45454))\n"
        "    s.listen(1)\n    s.settimeout(2)\n    c, _ = s.accept()\n    print('got', c.recv(9))\n"
        "except OSError as e:\n    print('listener failed', type(e).__name__)"
    )
    talker_code = (
        "import socket, time\ntime.sleep(0.3)\ntry:\n"
        "    s = socket.create_connection(('127.0.0.1', 45454), timeout=1)\n"
        "    s.sendall(b'secret')\n    print('sent')\nexcept OSError as e:\n"
        "    print('talker failed', type(e).__name__)\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n"
        "    u.sendto(b'x', ('127.0.0.1', 45455))\n    print('udp sent')\n"
        "except OSError as e:\n    print('udp failed', type(e).__name__)"
    )
    results = {}
    thread = threading.Thread(target=lambda: results.update(listener=sandbox.run(listener_code)))
    thread.start()
    results["talker"] = sandbox.run(talker_code)
    thread.join()
    assert "got" not in results["listener"].stdout
    assert "talker failed" in results["talker"].stdout
    assert "udp failed" in results["talker"].stdout


def test_datagram_and_pathname_unix_sockets_are_refused_too(sandbox):
    code = (
        "import socket\nfor kind in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):\n    try:\n"
        "        socket.socket(socket.AF_UNIX, kind)\n        print('made')\n"
        "    except PermissionError:\n        print('refused')\n"
        "a, b = socket.socketpair()\na.sendall(b'ok')\nprint(b.recv(2))"
    )
    result = sandbox.run(code)
    assert result.stdout.split("\n")[:3] == ["refused", "refused", "b'ok'"]


@pytest.mark.skipif(not ROOT, reason="per-call uids need a root server")
def test_two_instances_use_disjoint_uids():
    with (
        LocalSandbox(max_workers=1, timeout=10) as one,
        LocalSandbox(max_workers=1, timeout=10, isolation="none") as two,
    ):
        uid_one = int(one.run("import os\nprint(os.getuid())").stdout)
        uid_two = int(two.run("import os\nprint(os.getuid())").stdout)
        assert uid_one != 0 and uid_two != 0
        assert uid_one >> 16 != uid_two >> 16  # different per-instance blocks


@pytest.mark.skipif(not ROOT, reason="per-call uids need a root server")
def test_a_basic_instance_cannot_kill_a_call_of_another_instance():
    with (
        LocalSandbox(max_workers=1, timeout=20) as full,
        LocalSandbox(max_workers=1, timeout=10, isolation="none") as basic,
    ):
        results = {}
        victim = threading.Thread(
            target=lambda: results.update(
                victim=full.run("import time\ntime.sleep(2)\nprint('survived')")
            )
        )
        victim.start()
        for _ in range(5):
            basic.run(
                "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
                "except OSError:\n    pass"
            )
        victim.join()
        assert results["victim"].ok and results["victim"].stdout == "survived\n"
