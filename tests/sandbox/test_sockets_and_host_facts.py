"""No channel between two calls, nothing of the host.

Sockets: two calls of one sandbox running at once must share no socket name
space: an abstract Unix name bound by one (through ``socketpair``, which
seccomp cannot refuse as it refuses ``socket(AF_UNIX)``) is unreachable and
invisible (``/proc/net/unix``) from the other, and a port bound by one does not
collide with the other's. Host facts: a call reads nothing of the host that a
namespace or a mask can hide: host name, boot id, kernel command line,
uptime, fork counters, the cgroup path, /etc beyond the minimum, install
metadata naming the checkout, the server's arguments.

Each check runs twice: in this process's sandbox (the trainer as it is, root in
CI) and, when this runs as root, in a sandbox started by an unprivileged
trainer (uid 65534, the system Python, no preload: fresh mode).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from retool.sandbox import LocalSandbox

from .helpers import ROOT, SRC

# Call A of a pair: holds an abstract datagram name and a TCP port for a while.
HOLDER = textwrap.dedent(
    """
    import socket, time
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.bind(b"\\0retool-pair-{tag}")
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    t.bind(("0.0.0.0", {port}))
    t.listen(1)
    a.settimeout(4)
    try:
        print("received", a.recv(100))
    except OSError:
        print("received nothing")
    """
)
# Call B: for as long as A waits, tries to reach A's name and to collide with its port.
SEEKER = textwrap.dedent(
    """
    import socket, time
    found = {{"sent": False, "listed": False, "collided": False}}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not all(found.values()):
        x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            x.sendto(b"hello", b"\\0retool-pair-{tag}")
            found["sent"] = True
        except OSError:
            pass
        with open("/proc/net/unix") as handle:
            found["listed"] = found["listed"] or "retool-pair-{tag}" in handle.read()
        t = socket.socket()
        try:
            t.bind(("0.0.0.0", {port}))
        except OSError:
            found["collided"] = True
        t.close(); x.close(); y.close()
        time.sleep(0.05)
    print(found)
    """
)
# What a call can read of the host, as JSON.
PROBE = textwrap.dedent(
    """
    import glob, json, os, sys
    def read(path):
        try:
            with open(path, "rb") as handle:
                return handle.read(300).decode(errors="replace")  # the reply keeps 4 KiB
        except OSError as exc:
            return "<%s>" % type(exc).__name__
    sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    sites += [p for p in sys.path if p.startswith("/opt/site")]  # their neutral paths
    meta = {}
    for site in filter(os.path.isdir, sites):
        for path in glob.glob(site + "/*.pth") + glob.glob(site + "/*.dist-info/direct_url.json"):
            meta[path] = read(path)
        editable = [n for n in os.listdir(site) if n.startswith("__editable__")]
        meta.update({n: read(os.path.join(site, n)) for n in editable})
    print(json.dumps({
        "nodename": os.uname().nodename,
        "hostname": read("/proc/sys/kernel/hostname"),
        "boot_id": read("/proc/sys/kernel/random/boot_id"),
        "cmdline": read("/proc/cmdline"),
        "uptime": read("/proc/uptime"),
        "stat": read("/proc/stat"),
        "loadavg": read("/proc/loadavg"),
        "vmstat": read("/proc/vmstat"),
        "diskstats": read("/proc/diskstats"),
        "pressure": os.listdir("/proc/pressure") if os.path.isdir("/proc/pressure") else [],
        "cgroup": read("/proc/self/cgroup"),
        "etc": sorted(os.listdir("/etc")),
        "machine_id": read("/etc/machine-id"),
        "init_cmdline": read("/proc/1/cmdline").rstrip("\\0"),
        "own_cmdline": read("/proc/self/cmdline").rstrip("\\0"),
        "fds": [os.readlink("/proc/self/fd/%d" % fd) for fd in (1, 2)],
        "meta": meta,
    }))
    """
)
ETC_ALLOWED = {"group", "hostname", "hosts", "ld.so.cache", "ld.so.conf", "localtime"}
ETC_ALLOWED |= {"nsswitch.conf", "passwd"}


def _host(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def _check_host_facts(facts: dict, workdir: str) -> None:
    host = socket.gethostname()
    assert facts["nodename"] == "sandbox" != host and facts["hostname"].strip() == "sandbox"
    boot_id = _host("/proc/sys/kernel/random/boot_id")
    for name in ("boot_id", "cmdline", "uptime", "stat", "loadavg", "vmstat", "diskstats"):
        assert facts[name] == "", (name, facts[name][:200])
    assert facts["pressure"] == []
    assert boot_id not in json.dumps(facts)
    lines = facts["cgroup"].strip().splitlines()
    assert lines and all(line.endswith(":/") for line in lines), facts["cgroup"]
    assert set(facts["etc"]) <= ETC_ALLOWED, facts["etc"]
    assert "shadow" not in facts["etc"] and facts["machine_id"].startswith("<")
    for name in ("init_cmdline", "own_cmdline"):
        assert workdir not in facts[name] and "--dir" not in facts[name], facts[name]
    assert facts["meta"] and all(text == "" for text in facts["meta"].values()), facts["meta"]
    assert "retool-sandbox-" not in facts["cgroup"]
    assert not any(workdir in path for path in facts["fds"]), facts["fds"]
    # The paths of the interpreter, site-packages and runtime: test_neutral_paths.py.


def _pair(sandbox: LocalSandbox, tag: str) -> tuple[str, str]:
    with socket.socket() as probe:  # a port number that is free here (any will do)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results: dict[str, str] = {}

    def holder() -> None:
        results["a"] = sandbox.run(HOLDER.format(tag=tag, port=port), timeout=10).stdout

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        results["b"] = sandbox.run(SEEKER.format(tag=tag, port=port), timeout=10).stdout
    finally:
        thread.join()
    return results["a"], results["b"]


def test_two_calls_share_no_socket_names_or_ports(sandbox):
    assert sandbox.max_workers >= 2
    holder, seeker = _pair(sandbox, "root")
    assert holder.strip() == "received nothing", holder
    assert seeker.strip() == str({"sent": False, "listed": False, "collided": False}), seeker


def test_a_call_reads_nothing_of_the_host(sandbox):
    result = sandbox.run(PROBE)
    assert result.ok, result.stderr
    _check_host_facts(json.loads(result.stdout), sandbox._dir)


def test_the_layers_are_listed(sandbox):
    listed = " ".join(sandbox.layers)
    for words in ("network namespace per call", "cgroup namespace", "minimal /etc", "masked"):
        assert words in listed, sandbox.layers


_NONROOT = textwrap.dedent(
    """
    import json, sys, threading
    sys.path.insert(0, sys.argv[1])
    from retool.sandbox import LocalSandbox
    holder, seeker, probe = sys.argv[2:5]
    out = {}
    with LocalSandbox(max_workers=2, timeout=10, preload=()) as sb:
        out["level"] = sb.isolation_level.value
        out["dir"] = sb._dir
        r = sb.run(probe)
        out["facts"] = r.stdout if r.ok else r.stderr
        t = threading.Thread(target=lambda: out.__setitem__("a", sb.run(holder).stdout))
        t.start()
        out["b"] = sb.run(seeker).stdout
        t.join()
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not ROOT, reason="needs root to start an unprivileged trainer")
def test_the_same_holds_for_a_non_root_trainer():
    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip("no system python for the unprivileged user")
    where = tempfile.mkdtemp(prefix="retool-nonroot-")
    os.chmod(where, 0o755)
    source = os.path.join(where, "src")
    shutil.copytree(
        SRC / "retool", os.path.join(source, "retool"), ignore=shutil.ignore_patterns("__pycache__")
    )
    for root, _dirs, files in os.walk(where):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)

    def drop() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        done = subprocess.run(
            [
                python,
                "-c",
                _NONROOT,
                source,
                HOLDER.format(tag="nonroot", port=port),
                SEEKER.format(tag="nonroot", port=port),
                PROBE,
            ],
            capture_output=True,
            text=True,
            cwd="/tmp",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            preexec_fn=drop,
            timeout=120,
            check=False,
        )
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["level"] != "full":
        pytest.skip("no user namespaces for an unprivileged user here")
    _check_host_facts(json.loads(out["facts"]), out["dir"])
    assert out["a"].strip() == "received nothing", out
    assert out["b"].strip() == str({"sent": False, "listed": False, "collided": False}), out


def test_sandbox_check_lists_every_layer():
    retool = os.path.join(os.path.dirname(sys.executable), "retool")
    out = subprocess.run(
        [retool, "sandbox", "check"], capture_output=True, text=True, check=False, timeout=120
    )
    layers = [line for line in out.stdout.splitlines() if line.startswith("layer: ")]
    if "isolation level: full" not in out.stdout:
        pytest.skip("full isolation is not available here")
    listed = "\n".join(layers)
    for words in ("network namespace per call", "cgroup namespace", "minimal /etc", "seccomp"):
        assert words in listed, out.stdout
    for words in ("time namespace per call", "neutral paths: ", "sysinfo"):
        assert words in listed, out.stdout
