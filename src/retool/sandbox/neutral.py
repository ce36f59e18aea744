"""Neutral paths: what the server and its calls see instead of the trainer's paths.

The server's own mount namespace (never the trainer's) shows the calls'
output directory at ``/mnt`` (``neutral_calls_dir``), and the interpreter,
the runtime copy and each site-packages directory below ``/opt``
(``neutral_layout``), each a read-only overlay with its relocated layer
(``relocate.py``) above it where there is one. The server then re-executes
itself from there, so no path it imports, maps or runs from, and so nothing
a call inherits (``sys.path``, ``__file__``, code objects, ``/proc/self/exe``,
``maps``, ``mountinfo``, ``/proc/self/fd``), names a directory of the
trainer's machine, and with the layers no file's contents do either.
Trees of the OS (``/usr``...) are the same on every machine and stay as they
are.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from typing import Any

from . import linux, relocate

# Where the server finds the interpreter, its runtime copy and site-packages once it
# has re-executed itself in its own mount namespace (see neutral_layout): what a call
# sees in sys.path, __file__, /proc/self/exe, /proc/self/maps and its mountinfo.
NEUTRAL_ROOT = "/opt"
NEUTRAL_PYTHON = NEUTRAL_ROOT + "/python"
NEUTRAL_RUNTIME = NEUTRAL_ROOT + "/runtime"
NEUTRAL_SITE = NEUTRAL_ROOT + "/site"  # then /opt/site1, /opt/site2, ...
NEUTRAL_WORK = NEUTRAL_ROOT + "/work"  # the server's --dir (never bound into a call)
NEUTRAL_CGROUP = NEUTRAL_ROOT + "/cgroup"  # the instance's cgroups (never bound into a call)
_SOURCES = NEUTRAL_ROOT + "/.src"  # plain binds of the host trees (the server's namespace)
_LAYERS = NEUTRAL_ROOT + "/.layer"  # binds of their relocated layers (see relocate.py)
_EMPTY = NEUTRAL_ROOT + "/.empty"  # the second lower layer of an overlay without one
NEUTRAL_CALLS_DIR = "/mnt"  # where the output files are opened (see neutral_calls_dir)


def neutral_calls_dir(workdir: str) -> str | None:
    """Give the server a mount namespace of its own in which the calls' directory also
    appears at ``/mnt``, and return that path (``None`` if it cannot).

    A call's stdout and stderr are files the zygote opens; ``/proc/self/fd/1``
    shows the path they were opened by, which would be the trainer's work
    directory. Opened through ``/mnt`` they show ``/mnt/h1-2.out``. The files
    stay on the host filesystem (not a tmpfs the call's memory would be
    charged for), and the trainer, whose mounts are untouched, never reads them.
    """
    if not os.path.isdir(NEUTRAL_CALLS_DIR):
        return None
    try:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
        linux.mount(os.path.join(workdir, "calls"), NEUTRAL_CALLS_DIR, None, linux.MS_BIND)
    except OSError:
        return None
    return NEUTRAL_CALLS_DIR


def _neutral_mount(source_fd: int, target: str, layer_fd: int | None, userxattr: bool) -> None:
    """Show the directory ``source_fd`` at ``target`` as a read-only overlay, with
    its relocated layer (``layer_fd``) stacked above it where there is one.

    The server and its calls see the same overlay: the server imports, maps and
    runs the relocated files, so nothing a call inherits in memory names a host
    path either. Why an overlay even without a layer: a bind's mountinfo line
    names its source directory (the "root" field, the path inside the
    filesystem: the checkout, a home directory); an overlay's root is its own
    ("/") and its options name only the neutral binds below ``/opt/.src`` and
    ``/opt/.layer``, which exist in the server's namespace only. ``userxattr``: a
    server in a user namespace of its own (a non-root trainer) reads the layer's
    opaque marks from ``user.overlay.*``, the only ones it may set.
    """
    flags = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    name = target[len(NEUTRAL_ROOT) + 1 :]
    lowers = []
    for fd, below in ((layer_fd, _LAYERS), (source_fd, _SOURCES)):
        if fd is None:
            continue
        path = f"{below}/{name}"
        os.makedirs(path)
        linux.mount(f"/proc/self/fd/{fd}", path, None, linux.MS_BIND)
        linux.mount(None, path, None, linux.MS_BIND | linux.MS_REMOUNT | flags)
        lowers.append(path)
    if len(lowers) == 1:
        lowers.append(_EMPTY)  # a read-only overlay needs two lower layers, no upper one
    os.makedirs(target, exist_ok=True)
    options = "lowerdir=" + ":".join(lowers) + (",userxattr" if userxattr else "")
    linux.mount("overlay", target, "overlay", flags, options)


# Trees of the OS, the same on every machine: what they contain names no trainer, and
# rewriting "/usr" inside them would change what they mean (os.defpath, shebangs).
_SHARED_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")


def _shared(path: str) -> bool:
    real = os.path.realpath(path)
    return real == "/" or any(real == t or real.startswith(t + "/") for t in _SHARED_TREES)


def hidden_site_packages(base: str) -> list[str]:
    """The interpreter's own site-packages (relative to ``base``), which its layer hides:
    site trees are mounted on their own, and what else is installed there is no call's."""
    packages = glob.glob(os.path.join(base, "lib*", "python*", "*-packages"))
    return [os.path.relpath(p, base) for p in packages]


def _opaque_marks_hold(base: str, hidden: list[str]) -> bool:
    """Whether the mounted interpreter shows its hidden site-packages empty (where the
    host's is not): the overlay reads the layer's opaque marks."""
    for rel in hidden:
        with contextlib.suppress(OSError):
            if os.listdir(os.path.join(base, rel)):
                return not os.listdir(os.path.join(NEUTRAL_PYTHON, rel))
    return True


def relocated_layers(
    base: str,
    sites: list[tuple[str, str]],
    mapping: dict[str, str],
    cache: str | None = None,
    opaque: str = relocate.OPAQUE_XATTRS[0],
) -> tuple[dict[str, str], dict[str, Any]]:
    """Refresh the relocated layers (see relocate.py) of the interpreter at ``base``
    and of each ``(site directory, neutral path)``; returns {source: layer tree} and
    their summed facts. Raises ``OSError``."""
    moved = relocate.Relocation({h: t for h, t in mapping.items() if not _shared(h)})
    hidden = hidden_site_packages(base)
    relocate.prune(cache)  # an old clone's or an older format's layers
    trees: dict[str, str] = {}
    facts = {"rewritten": 0, "kept": 0, "dropped": 0, "files": 0}
    jobs = [(base, NEUTRAL_PYTHON, True, hidden), *((s, t, False, []) for s, t in sites)]
    for source, target, scrub, hide in jobs:
        if _shared(source):
            continue  # the OS's own tree (a system Python): its paths name no trainer
        done = relocate.refresh(
            source, target, moved, scrub=scrub, hide=hide, root=cache, opaque=opaque
        )
        trees[source] = done.pop("tree")
        for key, value in done.items():
            facts[key] += value
    return trees, facts


def neutral_layout(
    workdir: str,
    boot_path: str,
    *,
    userxattr: bool = False,
    relocated: bool = True,
    cache: str | None = None,
    cgroup_dirs: dict[str, str] | None = None,
) -> tuple[str, str, str, str, dict[str, Any]]:
    """In the server's own mount namespace, mount the interpreter at ``/opt/python``,
    the runtime copy at ``/opt/runtime`` and each site-packages directory at
    ``/opt/site``, ``/opt/site1``...; returns (the interpreter there, the import
    path there, what it needs in ``LD_LIBRARY_PATH``, the work directory there:
    ``/opt/work``, so that no path the server holds, and so no string in a
    call's memory, names it; the relocated layers' facts, with ``error`` if they
    could not be used). Each of ``cgroup_dirs`` (the instance's cgroup in each
    hierarchy) is bound at ``/opt/cgroup/<hierarchy>``: its host path names the
    trainer's cgroup (a container's id) and the server's pid. Raises ``OSError``.

    The server then re-executes itself from there (same pid, same descriptors),
    so every path it imports, maps or runs from, and so every path its calls
    inherit (``sys.path``, modules' ``__file__``, code objects' file names,
    ``sys.prefix``, ``sys.executable``, ``/proc/self/exe`` and ``maps``) names
    no directory of the trainer's machine, and (with the relocated layers) no
    file's contents do either: compiled files, build configuration, ``RUNPATH``.
    ``/opt`` of the host is covered by a tmpfs in the server's namespace only
    (sources below it are opened first).
    """
    base = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(sys.executable)
    relative = os.path.relpath(executable, base)
    if relative.startswith(".."):
        raise OSError(0, f"the interpreter {executable} is not below {base}")
    real_workdir = os.path.realpath(workdir)
    if real_workdir == NEUTRAL_ROOT or real_workdir.startswith(NEUTRAL_ROOT + "/"):
        raise OSError(0, f"the work directory is below {NEUTRAL_ROOT}")
    if not os.path.isdir(NEUTRAL_ROOT):
        raise OSError(0, f"no {NEUTRAL_ROOT} to mount on")
    runtime, *sites = boot_path.split(":")
    sources = [base, runtime, *(s for s in sites if os.path.isdir(s))]
    targets = [NEUTRAL_PYTHON, NEUTRAL_RUNTIME]
    targets += [NEUTRAL_SITE + (str(i) if i else "") for i in range(len(sources) - 2)]
    facts: dict[str, Any] = {}
    trees: dict[str, str] = {}
    if relocated:
        mapping = dict(zip(sources, targets, strict=True))
        mapping[real_workdir] = NEUTRAL_WORK
        opaque = relocate.OPAQUE_XATTRS[1 if userxattr else 0]
        try:
            site_trees = list(zip(sources[2:], targets[2:], strict=True))
            trees, facts = relocated_layers(base, site_trees, mapping, cache, opaque)
        except Exception as exc:  # no layer is a missing layer, not a failed start
            facts = {"error": f"{getattr(exc, 'strerror', None) or exc}"}
    else:
        facts = {"error": "disabled"}
    fds = [os.open(s, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for s in [workdir, *sources]]
    cgroup_fds = {
        key: os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        for key, path in (cgroup_dirs or {}).items()
    }
    layer_fds = [
        os.open(trees[s], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if s in trees else None
        for s in sources
    ]

    def mount_all(layers: list[int | None]) -> None:
        linux.mount(
            "tmpfs",
            NEUTRAL_ROOT,
            "tmpfs",
            linux.MS_NOSUID | linux.MS_NODEV,
            "size=64k,nr_inodes=256,mode=0755",
        )
        os.makedirs(_EMPTY)
        os.makedirs(NEUTRAL_WORK)
        linux.mount(f"/proc/self/fd/{fds[0]}", NEUTRAL_WORK, None, linux.MS_BIND)
        for fd, layer_fd, target in zip(fds[1:], layers, targets, strict=True):
            _neutral_mount(fd, target, layer_fd, userxattr)
        for key, fd in cgroup_fds.items():
            os.makedirs(f"{NEUTRAL_CGROUP}/{key}")
            linux.mount(f"/proc/self/fd/{fd}", f"{NEUTRAL_CGROUP}/{key}", None, linux.MS_BIND)

    try:
        mount_all(layer_fds)
        if trees and not _opaque_marks_hold(base, hidden_site_packages(base)):
            # The overlay did not read the layer's marks (a file system or user
            # namespace that hides them): the host's files would show through.
            linux.umount2(NEUTRAL_ROOT, linux.MNT_DETACH)
            facts = {"error": "the overlay ignored the layer's opaque marks"}
            mount_all([None] * len(layer_fds))
    except OSError:
        # No overlays here (an old kernel, a container refusing them): the host's /opt,
        # which may hold the interpreter (/opt/conda), comes back with everything on it.
        with contextlib.suppress(OSError):
            linux.umount2(NEUTRAL_ROOT, linux.MNT_DETACH)
        raise
    finally:
        for fd in [*fds, *cgroup_fds.values(), *(f for f in layer_fds if f is not None)]:
            os.close(fd)
    # An interpreter built with an absolute RUNPATH (pyenv's, under a home) would
    # load libpython from the host path; the loader looks here first.
    return (
        os.path.join(NEUTRAL_PYTHON, relative),
        ":".join(targets[1:]),
        NEUTRAL_PYTHON + "/lib",
        NEUTRAL_WORK,
        facts,
    )
