"""No path of the trainer's machine in a call, as any trainer runs the search.

The attacker searches every string it can reach for the trainer's checkout,
virtual environment, interpreter installation, home directory, the sandbox's
work directory and the host name:
``sys.path``, ``sys.prefix`` & co., ``sys.executable``, ``sys.orig_argv``,
every module's ``__file__``/``__cached__``/``__path__``, every function's code
file name, ``/proc/self`` (mountinfo, mounts, maps, environ, cmdline, exe, cwd,
root, fds) and its init's, ``os.getcwd()``, the environment, tracebacks raised
inside the standard library (and numpy where preloaded), and memory: every
frame above the code and every string in a container the collector tracks;
then the bytes: every readable mapping of the call's memory, for those paths,
the sandbox's work directory and the instance's cgroup directories (what it inherits
from the server, the interpreter and libraries included) and the contents of
the files this machine wrote below ``/opt`` (every compiled file of the site
trees; the interpreter's binaries, scripts, standard library and build
configuration). The needles travel hex-encoded and are skipped by identity (the
memory scan runs first, with patterns whose bytes never lie contiguous), so the
search does not find itself. ``clocks`` reads the host's uptime and process count the way
``sysinfo`` and ``clock_gettime`` would give them. Standard library and
``retool.sandbox`` only:
``trainers.py`` also runs this module as a non-root trainer.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import retool
from retool.sandbox import LocalSandbox

ATTACK = r"""
import gc, os, sys
def raw_memory():  # first, before any needle exists as a string in this process
    import ctypes, re
    # Each needle as a pattern with an empty group between its characters, built
    # from its hex form: the needle's bytes never lie contiguous in memory here.
    def spread(h):
        return "(?:)".join(re.escape(chr(int(h[i:i + 2], 16))) for i in range(0, len(h), 2))
    patterns = [re.compile(spread(h).encode()) for h in FILE_PATHS]
    hits = {}
    with open("/proc/self/maps") as handle:
        regions = handle.read().splitlines()
    for line in regions:
        fields = line.split()
        name = fields[5] if len(fields) > 5 else "anonymous"
        if not fields[1].startswith("r") or name in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        step = 4 << 20  # in slices that overlap by more than a needle: little memory
        for start in range(low, high, step):
            try:
                data = ctypes.string_at(start, min(step + 4096, high - start))
            except Exception:
                break
            for number, pattern in enumerate(patterns):
                found = pattern.search(data)
                if found:
                    key = "raw memory %s (needle %d)" % (name, number)
                    near = repr(data[max(0, found.start() - 60) : found.end() + 60])
                    hits.setdefault(key, near)
            del data
    return hits
RAW_HITS = raw_memory()
def contents():  # the files a call can read that this machine wrote: compiled, configured
    needles = [bytes.fromhex(h) for h in FILE_PATHS]
    hits, read, count = {}, 0, {}
    def scan(path):  # the first few hits of each tree, and how many in all
        nonlocal read
        try:
            with open(path, "rb") as handle:
                data = handle.read(32 << 20)
        except OSError:
            return
        read += len(data)
        for needle in needles:
            at = data.find(needle)
            if at >= 0:
                top = "/".join(path.split("/")[:3])
                count[top] = count.get(top, 0) + 1
                if count[top] <= 5:
                    hits["file " + path] = repr(data[max(0, at - 60) : at + len(needle) + 60])
                hits["files below " + top] = "%d files" % count[top]
                if SCAN_FILES == "first" and count[top] >= 5:
                    raise StopIteration  # enough to show this tree names the host
                return
    sites = sorted(p for p in sys.path if p.startswith("/opt/site"))
    tops = ["/opt/python", "/opt/runtime", *sites]
    for top in tops:
        interpreter = top == "/opt/python"
        everything = top == "/opt/runtime"  # our runtime copy: small, read whole
        for root, dirs, files in os.walk(top):
            if interpreter:  # its own tree; its site-packages are the site trees' business
                dirs[:] = [d for d in dirs if not d.endswith("-packages") and d != "share"]
                if root == top:
                    dirs[:] = [d for d in dirs if d in ("bin", "lib", "include")]
            for name in files:
                path = os.path.join(root, name)
                if os.path.islink(path):
                    continue
                programs = ("python", "libpython", "pip", "pydoc", "idle", "2to3")
                stdlib = root.startswith(top + "/lib/python")
                if interpreter and not (stdlib or name.startswith(programs)):
                    continue
                if interpreter or everything or name.endswith(".pyc"):
                    try:
                        scan(path)
                    except StopIteration:
                        break
            if SCAN_FILES == "first" and count.get(top, 0) >= 5:
                break
    return hits, read
def main():
    paths = [bytes.fromhex(h).decode() for h in PATHS]
    host = bytes.fromhex(HOST).decode()
    hits = {}
    skip = {id(paths), id(hits), id(host)} | {id(p) for p in paths}
    def near(text, needle):  # needle as a whole path or name, not inside a longer one
        start = text.find(needle)
        while start >= 0:
            before = text[start - 1 : start]
            after = text[start + len(needle) : start + len(needle) + 1]
            if not (before.isalnum() or before in "._-") or not before:
                if not after or not (after.isalnum() or after in "._-"):
                    return start
            start = text.find(needle, start + 1)
        return -1
    def look(where, text, with_host=True):
        if not isinstance(text, str) or id(text) in skip or where in hits:
            return
        for needle in paths + ([host] if with_host and host else []):
            at = near(text, needle)
            if at >= 0:
                hits[where] = text[max(0, at - 80) : at + len(needle) + 80]
                return
    def read(path):
        try:
            with open(path, "rb") as handle:
                return handle.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""
    def link(path):
        try:
            return os.readlink(path)
        except OSError:
            return ""
    look("sys.path", repr(sys.path))
    for name in ("prefix", "base_prefix", "exec_prefix", "base_exec_prefix", "executable",
                 "_base_executable", "orig_argv", "argv", "_stdlib_dir", "platlibdir"):
        look("sys." + name, repr(getattr(sys, name, "")))
    for name, module in list(sys.modules.items()):
        for attr in ("__file__", "__cached__", "__path__"):
            look("module %s.%s" % (name, attr), repr(getattr(module, attr, "")))
        spec = getattr(module, "__spec__", None)
        look("module %s spec" % name, repr(getattr(spec, "origin", "")))
        for value in list(getattr(module, "__dict__", {}).values()):
            code = getattr(value, "__code__", None)
            if isinstance(getattr(code, "co_filename", None), str):
                look("code of %s" % name, code.co_filename)
    for pid in ("self", "thread-self", "1"):
        for name in ("mountinfo", "mounts", "mountstats", "maps", "smaps", "environ", "cmdline",
                     "status", "cgroup", "stat"):
            look("/proc/%s/%s" % (pid, name), read("/proc/%s/%s" % (pid, name)))
        for name in ("exe", "cwd", "root"):
            look("/proc/%s/%s" % (pid, name), link("/proc/%s/%s" % (pid, name)))
        for fd in range(64):
            look("/proc/%s/fd/%d" % (pid, fd), link("/proc/%s/fd/%d" % (pid, fd)))
    for entry in sys.path:  # install metadata: an editable install names its checkout
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            if name.endswith((".pth", ".egg-link")) or name.startswith("__editable__"):
                look("%s/%s" % (entry, name), read(os.path.join(entry, name)))
            elif name.endswith(".dist-info"):
                for meta in ("direct_url.json", "RECORD"):
                    path = os.path.join(entry, name, meta)
                    look(path, read(path))
    look("getcwd", os.getcwd())
    look("environ", repr(dict(os.environ)))
    look("uname", repr(os.uname()))
    for name in ("/proc/sys/kernel/hostname", "/etc/hostname", "/etc/hosts", "/etc/passwd"):
        look(name, read(name))
    import fractions, json as json_module, traceback
    for where, fail in (("traceback fractions", lambda: fractions.Fraction(1, 0)),
                        ("traceback json", lambda: json_module.loads("{")),
                        ("traceback numpy", lambda: sys.modules["numpy"].zeros(3).reshape(7))):
        if where.endswith("numpy") and "numpy" not in sys.modules:
            continue
        try:
            fail()
        except Exception:
            look(where, traceback.format_exc())
            frames = traceback.extract_tb(sys.exc_info()[2])
            look(where + " (frames)", repr([f.filename for f in frames]))
    frame, depth = sys._getframe().f_back, 0  # above the search
    while frame is not None:
        look("frame %d" % depth, frame.f_code.co_filename, False)
        for key, value in list(frame.f_locals.items()):
            text = value if isinstance(value, str) else repr(value)[:100000]
            look("frame %d local %s" % (depth, key), text, False)
        frame, depth = frame.f_back, depth + 1
    for obj in gc.get_objects():
        if id(obj) in skip or obj is skip:
            continue
        try:
            values = obj.values() if isinstance(obj, dict) else obj
            if not isinstance(obj, (dict, list, tuple)):
                continue
            for value in list(values):
                look("memory (%s)" % type(obj).__name__, value, False)
        except Exception:
            pass
    file_hits, read = contents() if SCAN_FILES != "none" else ({}, 0)
    hits.update(RAW_HITS)
    hits.update(file_hits)
    return {"hits": hits, "sys_path": sys.path, "executable": sys.executable, "read": read}
import json
print(json.dumps(main()))
"""


def needles() -> tuple[list[str], str]:
    """The trainer's paths (those that are not the OS's own) and its host name."""
    package = Path(retool.__file__).resolve().parent
    candidates = {
        str(package.parents[1]),  # the checkout (or the copy a non-root trainer runs)
        str(package.parent),  # src/, or site-packages for an installed package
        sys.prefix,  # the virtual environment, if any
        os.path.realpath(sys.base_prefix),  # the interpreter's installation
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.expanduser("~"),
        os.getcwd(),
    }
    shared = ("/", "/usr", "/usr/bin", "/usr/local", "/usr/local/bin", "/tmp", "/opt")
    paths = sorted(p.rstrip("/") for p in candidates if p and p.rstrip("/") not in shared)
    return paths, socket.gethostname()


def content_needles() -> list[str]:
    """What file contents must not name: the checkout, the virtual environment and
    the interpreter's installation (not the home directory itself: wheels built
    elsewhere carry their builders' ``/root/...`` paths, which name no trainer)."""
    paths, _host = needles()
    home = os.path.expanduser("~").rstrip("/")
    return [p for p in paths if p != home and not p.startswith(("/usr/", "/bin", "/lib"))]


def attack(sandbox: LocalSandbox, files: str = "all") -> dict[str, Any]:
    """The search, in one call. ``files``: ``all`` (every file of the trees below
    ``/opt``), ``first`` (each tree until it shows a few hits: for the comparisons
    with a layer off, which only need to see that the search finds something) or
    ``none`` (memory and strings only: what differs between fork server and fresh)."""
    paths, host = needles()
    paths.append(sandbox._dir)  # the sandbox's own work directory on the host
    # The instance's cgroup (it names the trainer's cgroup, a container's id, and the
    # server's pid): in no file, and not in the memory a call inherits.
    cgroups = [p for p in (sandbox._cgroup or {}).values() if p]
    out_cgroups = {"cgroups": cgroups}
    in_files = [*content_needles(), sandbox._dir, *cgroups]
    code = ATTACK.replace("FILE_PATHS", repr([p.encode().hex() for p in in_files]))
    code = code.replace("SCAN_FILES", repr(files))
    code = code.replace("PATHS", repr([p.encode().hex() for p in paths]))
    code = code.replace("HOST", repr(host.encode().hex()), 1)
    result = sandbox.run(code)
    out: dict[str, Any] = {
        "level": sandbox.isolation_level.value,
        "missing": list(sandbox.missing),
        "layers": list(sandbox.layers),
        "needles": [*paths, host],
        "needles_in_bytes": in_files,
        "trainer_prefix": os.path.realpath(sys.base_prefix),
        **out_cgroups,
        "ok": result.ok,
        "error": str(result.error_kind),
        "stderr": result.stderr[-2000:],
    }
    if result.ok:
        out.update(json.loads(result.stdout))
    return out


CLOCKS = r"""
import ctypes, errno, json, time
libc = ctypes.CDLL(None, use_errno=True)
info = ctypes.create_string_buffer(256)
status = libc.sysinfo(info)
print(json.dumps({
    "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
    "monotonic": time.clock_gettime(time.CLOCK_MONOTONIC),
    "sysinfo": [status, errno.errorcode.get(ctypes.get_errno(), "")],
    "uptime_from_sysinfo": int.from_bytes(info.raw[:8], "little", signed=True),
}))
"""


def clocks(sandbox: LocalSandbox) -> dict[str, Any]:
    """What a call learns of the host's uptime and process count."""
    with open("/proc/uptime") as handle:
        host_uptime = float(handle.read().split()[0])
    result = sandbox.run(CLOCKS)
    facts: dict[str, Any] = {"host_uptime": host_uptime, "ok": result.ok}
    facts["level"] = sandbox.isolation_level.value
    if result.ok:
        facts.update(json.loads(result.stdout))
    else:
        facts["stderr"] = result.stderr[-2000:]
    return facts


def run_all() -> dict[str, Any]:
    results: dict[str, Any] = {"uid": os.geteuid()}
    # A fork server with the standard library preloaded, and fresh mode (a new
    # interpreter per call, started from the neutral path inside the call's root).
    for name, preload in (("forked", ("math", "fractions")), ("fresh", ())):
        try:
            with LocalSandbox(
                timeout=60, memory_mb=1024, max_workers=1, preload=preload, max_output_bytes=65536
            ) as sandbox:
                # The files below /opt are the same in both modes: searched once.
                results[name] = attack(sandbox, "all" if name == "forked" else "none")
                if name == "forked":
                    results["clocks"] = clocks(sandbox)
        except Exception as exc:  # one broken scenario must not hide the other
            results[name] = {"scenario_error": f"{type(exc).__name__}: {exc}"}
    return results


if __name__ == "__main__":
    print(json.dumps(run_all()))
    sys.stdout.flush()
