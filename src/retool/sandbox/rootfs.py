"""The root a call sees at the full level: read-only, minimal, built by its init.

B (the call's init, ``call.py``) mounts it in the call's own mount namespace
and ``pivot_root``s into it, bubblewrap-style, before C is forked: the OS
trees, the interpreter and the import path bound read-only
(``readonly_paths``); our package and the install metadata that names the
checkout masked (``masked_paths``); a minimal ``/etc`` naming no host user;
private ``/tmp`` and ``/dev/shm`` (tmpfs, bounded in bytes and inodes); five
``/dev`` nodes; a fresh ``/proc`` with the host-wide counters masked
(``PROC_MASKS``). Why: a call reads nothing of the trainer or the host that a
namespace or a mask can hide, and writes nowhere but its own tmpfs.
"""

from __future__ import annotations

import contextlib
import os
import sys

from . import linux
from .neutral import NEUTRAL_SITE

TMPFS_MB = 64  # private /tmp of a call
TMPFS_INODES = 4096  # files a call may create in its /tmp and /dev/shm
DEV_NODES = ("null", "zero", "full", "random", "urandom")


def readonly_paths() -> list[str]:
    """Host paths B sees (read-only): the OS, the interpreter, the import path.

    The server runs with ``-I -S`` and an explicit ``sys.path`` (the standard
    library, site-packages, our runtime copy), so nothing of the caller's cwd
    or checkout is among them.
    """
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)]
    paths += [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)]
    seen: list[str] = []
    for path in sorted(
        {os.path.realpath(p) if not os.path.islink(p) else p for p in paths if os.path.lexists(p)},
        key=len,
    ):
        if path == "/":
            continue  # never the whole host
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            seen.append(path)
    return seen


def _is_site(entry: str) -> bool:
    """A site-packages directory: by its name, or at its neutral path (/opt/site...)."""
    entry = entry.rstrip("/")
    neutral = entry.startswith(NEUTRAL_SITE) and entry[len(NEUTRAL_SITE) :].isdigit()
    return entry.endswith(("site-packages", "dist-packages")) or entry == NEUTRAL_SITE or neutral


def masked_paths() -> list[str]:
    """Paths hidden from calls (an empty read-only tmpfs over a directory, an empty
    file over a file): our own package, if it is installed (not editable) in
    site-packages, carries data and answers; install metadata names where things
    were installed from (an editable install's ``.pth`` and finder name the
    checkout; ``direct_url.json`` the source directory or URL); our
    distribution's ``dist-info`` lists our files."""
    found = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        candidate = os.path.join(entry, "retool")
        if os.path.isdir(candidate):
            found.append(os.path.realpath(candidate))
        if not _is_site(entry):
            continue
        for name in sorted(os.listdir(entry)):
            path = os.path.join(entry, name)
            editable = name.startswith("__editable__") or name.endswith((".pth", ".egg-link"))
            if editable or name.startswith(("retool_rl-", "retool_rl.")):
                found.append(path)
            elif name.endswith(".dist-info") and os.path.exists(f"{path}/direct_url.json"):
                found.append(f"{path}/direct_url.json")
    return list(dict.fromkeys(found))


# Host facts a call must not read, which no namespace hides: an empty file goes over
# each (as container runtimes do for /proc/kcore & co.). /proc/stat, /proc/loadavg and
# the other counters carry host-wide fork, thread, fault, interrupt, disk and pressure
# figures that reveal what other calls do.
PROC_MASKS = (
    "/proc/cmdline",
    "/proc/sys/kernel/random/boot_id",
    "/proc/uptime",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/kallsyms",
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/sys/kernel/ns_last_pid",
    "/proc/vmstat",
    "/proc/schedstat",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/diskstats",
    "/proc/pressure",  # a directory: an empty tmpfs goes over it
)
HOSTNAME = "sandbox"  # the UTS name every call sees
# The /etc of a call: only what the interpreter and the preloaded libraries read
# (the loader's cache, the time zone), plus a passwd/group naming nobody of the host.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "localtime")
_ETC_WRITTEN = {
    "passwd": "root:x:0:0:root:/tmp:/usr/sbin/nologin\n"
    "sandbox:x:{uid}:{uid}:sandbox:/tmp:/usr/sbin/nologin\n",
    "group": "root:x:0:\nsandbox:x:{uid}:\n",
    "hostname": f"{HOSTNAME}\n",
    "hosts": f"127.0.0.1 localhost {HOSTNAME}\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


def _minimal_etc(etc: str, uid: int) -> None:
    """Fill the empty directory ``etc`` (in the call's root) with the minimal /etc."""
    for name in ETC_FILES:
        src = "/etc/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), f"{etc}/{name}")  # localtime -> /usr/share/...
        elif os.path.isfile(src):
            open(f"{etc}/{name}", "w").close()
            linux.mount(src, f"{etc}/{name}", None, linux.MS_BIND)
    for name, text in _ETC_WRITTEN.items():
        with open(f"{etc}/{name}", "w") as handle:
            handle.write(text.format(uid=uid))


def build_root(
    new_root: str,
    binds: list[str],
    masks: list[str],
    uid: int = 0,
    off: frozenset[str] = frozenset(),
) -> None:
    """Mount a minimal read-only root at ``new_root`` and ``pivot_root`` into it.

    ``off``: layers left out, for measuring their cost only (``etc``: the host's
    /etc instead of the minimal one; ``procmask``: no masks over /proc files).
    """
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount("tmpfs", new_root, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m,mode=0755")
    # Private /tmp and /dev/shm first: a bind below /tmp (a venv living there)
    # must land on top of the private tmpfs, not be hidden by it.
    for sub, size in (("/tmp", TMPFS_MB), ("/dev/shm", 16)):
        os.makedirs(new_root + sub, exist_ok=True)
        linux.mount(
            "tmpfs",
            new_root + sub,
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV,
            f"size={size}m,nr_inodes={TMPFS_INODES},mode=1777",
        )
    ro = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    minimal_etc = "etc" not in off
    if minimal_etc:
        binds = [b for b in binds if b != "/etc"]
        os.makedirs(new_root + "/etc")
        _minimal_etc(new_root + "/etc", uid)
    for src in binds:
        dst = new_root + src
        if os.path.islink(src) and os.path.dirname(src) == "/":
            os.symlink(os.readlink(src), dst)  # /bin -> usr/bin on merged-/usr systems
            continue
        os.makedirs(dst, exist_ok=True)
        linux.mount(src, dst, None, linux.MS_BIND | linux.MS_REC)
        linux.mount(None, dst, None, ro)
    empty = new_root + "/.empty"  # what a masked file shows; gone with the root's umount
    open(empty, "w").close()
    os.chmod(empty, 0o444)
    for path in masks:
        with contextlib.suppress(OSError):
            if os.path.isdir(new_root + path):
                linux.mount(
                    "tmpfs",
                    new_root + path,
                    "tmpfs",
                    linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV,
                    "size=4k,nr_inodes=1",
                )
            else:
                linux.mount(empty, new_root + path, None, linux.MS_BIND)
                linux.mount(None, new_root + path, None, ro)
    os.makedirs(new_root + "/dev", exist_ok=True)
    for node in DEV_NODES:
        dst = f"{new_root}/dev/{node}"
        open(dst, "w").close()
        linux.mount(f"/dev/{node}", dst, None, linux.MS_BIND)
    os.makedirs(new_root + "/proc", exist_ok=True)
    linux.mount(
        "proc", new_root + "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    )
    if "procmask" not in off:
        for path in PROC_MASKS:
            target = new_root + path
            if os.path.isdir(target):
                flags = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
                linux.mount("tmpfs", target, "tmpfs", flags, "size=4k,nr_inodes=1")
            elif os.path.exists(target):
                linux.mount(empty, target, None, linux.MS_BIND)
                linux.mount(None, target, None, ro)
    os.makedirs(new_root + "/.old", exist_ok=True)
    os.chdir(new_root)
    linux.pivot_root(".", ".old")
    os.chdir("/")
    linux.umount2("/.old", linux.MNT_DETACH)
    os.rmdir("/.old")
    os.unlink("/.empty")  # the bind mounts keep its inode; the name goes
    linux.mount(
        None,
        "/",
        None,
        linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_BIND,
    )
