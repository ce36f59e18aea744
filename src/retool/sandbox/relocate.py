"""The relocated layer: files of the interpreter and site-packages as they would be
had they been installed at their neutral paths (``/opt/python``, ``/opt/site``).

Why: the neutral layout (``neutral.neutral_layout``) mounts the interpreter and
site-packages at neutral paths, so every *path* a call sees names no directory
of the trainer's machine. File *contents* still did: every ``.pyc`` records the
source path it was compiled from (``/home/me/project/.venv/lib/.../numpy/x.py``:
the checkout), the interpreter's ``_sysconfigdata``, ``config-*/Makefile``,
``pkgconfig`` files and scripts carry its build prefix (``/home/me/.pyenv/...``),
and its ELF files carry it as ``RUNPATH`` and as the compiled-in ``PREFIX``,
which the server then holds in memory and every call inherits.

What this module builds, once per (source tree, neutral path) and cached under
``$XDG_CACHE_HOME/retool/sandbox-layers`` (``~/.cache`` by default):

* every ``__pycache__`` directory, *opaque* (an overlay hides the host's copy
  whole), holding the host's compiled files with each code object's file name
  and string constants moved from the host path to the neutral one
  (``marshal`` round trip; the 16-byte header, and so the importer's validation
  against the source, is unchanged). A compiled file of another interpreter
  version, or one that does not load, is left out: the importer then compiles
  that source in memory, as for any missing file. A ``.pyc`` the host writes
  later into a directory the layer has not seen is hidden too (the directory is
  opaque) until the next refresh copies it;
* in the interpreter's tree, every other file that names the host prefix: text
  rewritten in place; binaries (``\\0`` in them) rewritten to the *same length*
  (the neutral path padded with ``/`` and ending in the host path's last
  component, which the layer links to ``.``: ``/opt/python//////3.11.7/lib``
  names ``/opt/python/lib``), so no offset in an ELF file moves and no string
  the linker merged into the prefix's tail changes. Where the
  neutral path is longer than the host's, binaries keep it, and the server lists
  the layer as missing in part (an interpreter under ``/usr``, the OS's own, gets
  no layer at all);
* the interpreter's own ``site-packages`` as an empty opaque directory when it
  is not one of the server's import paths (it is then mounted as a site tree of
  its own): what is installed there is no business of a call.

The server stacks the layer above the host tree in one read-only overlay, which
both it and its calls see, so the server itself runs the rewritten interpreter
and holds no host path in memory for a call to inherit.

Freshness: the manifest records every directory's ``mtime`` and the rewritten
files' ``(mtime, size)``. A refresh stats each directory (about 30 ms for
9,000) and redoes only those that changed (a new package changes its parent's
``mtime``; Python replaces ``.pyc`` files atomically, which changes the
directory's). The first build of a 4 GB virtualenv takes tens of seconds and
about as much disk as its compiled files; two servers share one build under a
lock. Standard library only: this file is part of the
server's runtime copy.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import marshal
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

FORMAT = 3  # bump when the layer's contents change meaning: old caches are rebuilt
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
_PYC_HEADER = 16
_MAX_SCAN_BYTES = 256 << 20  # larger files of the interpreter's tree are not read
_RECENT_NS = 2_000_000_000  # mtimes this close to a scan are not trusted (as git does)


def cache_root() -> str:
    """Where layers live: ``$XDG_CACHE_HOME/retool/sandbox-layers`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "retool", "sandbox-layers")


def _boundary_pattern(hosts: list[str]) -> re.Pattern[bytes]:
    """A host prefix as a whole path component: ``/a/b`` in ``/a/b/c``, not ``/a/bc``."""
    alternatives = b"|".join(re.escape(h.encode()) for h in sorted(hosts, key=len, reverse=True))
    return re.compile(b"(" + alternatives + rb")(?![^/\x00:;'\"\s,)\]}])")


class Relocation:
    """The host paths of the mounted trees and where a call sees each."""

    def __init__(self, mapping: dict[str, str]) -> None:
        # Every spelling of a source (as given, and with symlinks resolved) maps
        # to its target; the longest first, so /a/b/site wins over /a/b.
        pairs: dict[str, str] = {}
        for host, target in mapping.items():
            for spelling in (host.rstrip("/") or "/", os.path.realpath(host)):
                if spelling != target and spelling != "/":
                    pairs[spelling] = target
        self.pairs = pairs
        self._pattern = _boundary_pattern(list(pairs)) if pairs else None
        self._needles = tuple(h.encode() for h in pairs)

    def names_host(self, data: bytes) -> bool:
        """Whether ``data`` contains a host prefix at all (a fast pre-check)."""
        return any(needle in data for needle in self._needles)

    def text(self, data: bytes) -> bytes:
        """Every host prefix in ``data`` replaced by its neutral path."""
        if self._pattern is None:
            return data
        return self._pattern.sub(lambda m: self.pairs[m.group(1).decode()].encode(), data)

    def binary(self, data: bytes) -> tuple[bytes, int]:
        """Same-length replacement; returns the new bytes and how many occurrences
        had to stay (the neutral path and the tail do not fit).

        The host path's last component stays at its end (``/opt/python///3.11.7``):
        a linker merges a string that is the suffix of another into it (the
        interpreter's ``PY_VERSION``, ``"3.11.7"``, lives at the end of its
        ``PREFIX``), so those bytes must not change. The layer adds that name as a
        link to ``.`` (see ``tail_links``), so the path still names the directory.
        """
        if self._pattern is None:
            return data, 0
        kept = 0

        def same_length(match: re.Match[bytes]) -> bytes:
            nonlocal kept
            host = match.group(1)
            target = self.pairs[host.decode()].encode()
            tail = os.path.basename(host)
            if len(target) + 1 + len(tail) > len(host):
                if len(target) > len(host):
                    kept += 1
                    return host
                tail = b""  # no room for the tail: the prefix's own bytes, padded
            return target + b"/" * (len(host) - len(target) - len(tail)) + tail

        return self._pattern.sub(same_length, data), kept

    def string(self, value: str) -> str:
        if not any(h in value for h in self.pairs):
            return value
        return self.text(value.encode("utf-8", "surrogateescape")).decode(
            "utf-8", "surrogateescape"
        )


def tail_links(relocation: Relocation, target: str) -> list[str]:
    """The last components of the host paths that move to ``target``: the names the
    layer of ``target`` links to ``.`` (see ``Relocation.binary``)."""
    return sorted({os.path.basename(h) for h, t in relocation.pairs.items() if t == target})


def _relocate_const(value: Any, fix: Callable[[str], str]) -> Any:
    if isinstance(value, CodeType):
        return _relocate_code(value, fix)
    if isinstance(value, str):
        return fix(value)
    if isinstance(value, tuple):
        return tuple(_relocate_const(v, fix) for v in value)
    if isinstance(value, frozenset):
        return frozenset(_relocate_const(v, fix) for v in value)
    return value


def _relocate_code(code: CodeType, fix: Callable[[str], str]) -> CodeType:
    consts = tuple(_relocate_const(c, fix) for c in code.co_consts)
    return code.replace(co_filename=fix(code.co_filename), co_consts=consts)


def relocate_pyc(data: bytes, relocation: Relocation) -> bytes | None:
    """A compiled file with its host paths moved; None if it is not this
    interpreter's (another version's magic number) or does not load."""
    if len(data) < _PYC_HEADER or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    if not relocation.names_host(data):
        return data
    try:
        code = marshal.loads(memoryview(data)[_PYC_HEADER:])
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, CodeType):
        return None
    moved = data[:_PYC_HEADER] + marshal.dumps(_relocate_code(code, relocation.string))
    # A host path in a spelling the rules do not move (not a whole component, in a
    # type of constant they do not visit): left out, so the source compiles instead.
    return None if relocation.names_host(moved) else moved


def _write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``, mode exactly 0o644; a failure leaves no temporary.

    The project's one deliberate copy of ``retool.atomic.write_atomic``: this module
    runs in the server's runtime copy, which imports nothing of ours outside it.
    It differs on purpose: 0o644 under any umask (the sandbox's unprivileged uid
    reads the layer), no fsync (a cache, written by the thousand at its first build),
    and the pid alone names the temporary (one build per layer at a time, under the
    layer's lock).
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written file is left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _make_opaque(path: str, name: str) -> None:
    """Mark ``path`` opaque for overlayfs under ``name``: the one the mount reads
    (``trusted.overlay.opaque`` in the initial user namespace, ``user.overlay.opaque``
    with ``userxattr``). Raises ``OSError`` where it cannot be set."""
    os.setxattr(path, name, b"y")


class _Build:
    """One refresh of one layer (see ``refresh``)."""

    def __init__(self, source: str, tree: str, relocation: Relocation, opaque: str) -> None:
        self.source, self.tree, self.relocation = source, tree, relocation
        self.opaque = opaque  # the extended attribute the mount reads
        self.rewritten = 0
        self.dropped = 0  # compiled files left out (another version's, unloadable, editable)

    def layer_dir(self, rel: str, opaque: bool) -> str:
        """The layer's directory ``rel``; an opaque one appears already marked (built
        under a temporary name), so a server that has the layer mounted never sees
        it unmarked, with the host's files showing through."""
        path = os.path.join(self.tree, rel) if rel else self.tree
        if os.path.isdir(path):
            if opaque:
                _make_opaque(path, self.opaque)
            return path
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if not opaque:
            os.makedirs(path, mode=0o755, exist_ok=True)
            return path
        tmp = f"{path}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o755)
        try:
            _make_opaque(tmp, self.opaque)
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def pycache(self, rel: str) -> None:
        """Rebuild the layer's copy of the ``__pycache__`` directory ``rel``."""
        target = self.layer_dir(rel, opaque=True)
        wanted = set()
        for entry in os.scandir(os.path.join(self.source, rel)):
            if not entry.name.endswith(".pyc") or not entry.is_file(follow_symlinks=False):
                continue
            if entry.name.startswith("__editable__"):  # its finder holds the checkout
                self.dropped += 1
                continue
            try:
                with open(entry.path, "rb") as handle:
                    data = relocate_pyc(handle.read(), self.relocation)
            except OSError:
                data = None
            if data is None:
                self.dropped += 1
                continue
            wanted.add(entry.name)
            _write_atomic(os.path.join(target, entry.name), data)
            self.rewritten += 1
        for name in os.listdir(target):
            if name not in wanted:
                os.unlink(os.path.join(target, name))

    def scrub(self, rel: str, files: dict[str, list[int]]) -> None:
        """Rewrite the files of directory ``rel`` (interpreter tree) that name a host path."""
        for entry in os.scandir(os.path.join(self.source, rel)):
            if entry.name.endswith(".pyc") or not entry.is_file(follow_symlinks=False):
                continue
            self.scrub_file(os.path.join(rel, entry.name) if rel else entry.name, files)

    def scrub_file(self, rel: str, files: dict[str, list[int]]) -> None:
        path = os.path.join(self.source, rel)
        layer = os.path.join(self.tree, rel)
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_SCAN_BYTES:
                raise FileNotFoundError(path)
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            files.pop(rel, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layer)
            return
        if not self.relocation.names_host(data):
            files.pop(rel, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layer)
            return
        if b"\0" in data:
            new, kept = self.relocation.binary(data)
        else:
            new = self.relocation.text(data)
            kept = 0
        if self.relocation.names_host(new):  # a spelling the rules did not move: said
            kept = max(kept, 1)
        self.layer_dir(os.path.dirname(rel), opaque=False)
        _write_atomic(layer, new)
        os.chmod(layer, stat.S_IMODE(info.st_mode))  # no more readable than the host's
        files[rel] = [info.st_mtime_ns, info.st_size, kept]
        self.rewritten += 1


def _key(source: str, target: str, hide: list[str], relocation: Relocation, opaque: str) -> str:
    # The spellings of this tree (a second trainer reaching it through another link
    # gets a layer of its own), not the other pairs: those name per-server directories
    # (the work directory, the runtime copy), and the key must outlive a server.
    pairs = sorted(h for h, t in relocation.pairs.items() if t == target)
    text = json.dumps([FORMAT, os.path.realpath(source), target, sorted(hide), pairs, opaque])
    return hashlib.sha256((text + sys.version).encode()).hexdigest()[:20]


def _private_dir(path: str) -> None:
    """Create ``path`` (0700) or check it: ours, and writable by nobody else. A root
    server runs the interpreter it finds in a layer: a directory another user can
    write would let that user choose what it runs. Raises ``OSError``."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise OSError(errno.EPERM, f"the layer cache {path} is not ours alone (owner or mode)")


def prune(root: str | None = None) -> int:
    """Remove the layers nobody can use again: their tree is gone from the host (an old
    clone's virtualenv) or they are of another format (an older retool). A layer being
    built or refreshed (its lock held) is left alone. Returns how many went."""
    base = root or cache_root()
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    removed = 0
    for name in names:
        home = os.path.join(base, name)
        try:
            with open(os.path.join(home, "manifest.json")) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue  # being built for the first time, or not ours: not touched
        if manifest.get("format") == FORMAT and os.path.isdir(str(manifest.get("source"))):
            continue
        try:
            lock_fd = os.open(os.path.join(home, "lock"), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(home, ignore_errors=True)
            removed += 1
        except OSError:
            pass  # in use
        finally:
            os.close(lock_fd)
    return removed


def refresh(
    source: str,
    target: str,
    relocation: Relocation,
    *,
    scrub: bool,
    hide: list[str] = (),  # type: ignore[assignment]
    root: str | None = None,
    opaque: str = OPAQUE_XATTRS[0],
) -> dict[str, Any]:
    """Bring the layer of ``source`` (seen at ``target``) up to date; returns its
    facts: ``tree`` (the directory to stack above ``source``), ``rewritten`` (files
    written by this refresh), ``kept`` (binaries that keep a host prefix: the neutral
    path is longer), ``dropped`` (compiled files left out by this refresh),
    ``files`` (rewritten non-compiled files in the layer).

    ``scrub``: also rewrite non-compiled files naming a host path (the interpreter's
    tree; site-packages hold wheels built elsewhere, whose install metadata naming
    the checkout is masked separately). ``hide``: relative directories shown empty.
    ``opaque``: the extended attribute the overlay will read (see ``_make_opaque``).
    Raises ``OSError`` (no cache directory, one not ours alone, no such attribute on
    its file system).
    """
    if opaque not in OPAQUE_XATTRS:
        raise ValueError(f"opaque must be one of {OPAQUE_XATTRS}")
    hide = [h.strip("/") for h in hide]
    base = root or cache_root()
    _private_dir(base)
    home = os.path.join(base, _key(source, target, hide, relocation, opaque))
    _private_dir(home)
    tree = os.path.join(home, "tree")
    lock_fd = os.open(os.path.join(home, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    umask = os.umask(0o022)  # calls of other uids read the layer: 0755 and 0644 throughout
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a second server waits for the first build
        manifest_path = os.path.join(home, "manifest.json")
        try:
            with open(manifest_path) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            manifest = {}
        if manifest.get("format") != FORMAT or not os.path.isdir(tree):
            manifest = {}  # a layer deleted under its manifest is rebuilt whole
        old_dirs: dict[str, int] = manifest.get("dirs", {})
        files: dict[str, list[int]] = manifest.get("files", {})
        build = _Build(source, tree, relocation, opaque)
        started_ns = time.time_ns()
        build.layer_dir("", opaque=False)
        if scrub:  # binaries keep the host path's last component: make it name the tree
            for name in tail_links(relocation, target):
                link = os.path.join(tree, name)
                if not os.path.lexists(os.path.join(source, name)) and not os.path.islink(link):
                    os.symlink(".", link)
        children: dict[str, list[str]] = {}
        for rel in old_dirs:
            if rel:
                children.setdefault(os.path.dirname(rel), []).append(rel)
        dirs: dict[str, int] = {}
        stack = [""]
        while stack:
            rel = stack.pop()
            path = os.path.join(source, rel) if rel else source
            try:  # the tree itself may be reached through a link; what is below it, not
                info = os.stat(path) if not rel else os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                continue
            # A directory changed within the clock's resolution of this scan may change
            # again unseen under the same mtime: recorded as unknown, rescanned next time.
            recent = info.st_mtime_ns > started_ns - _RECENT_NS
            dirs[rel] = -1 if recent else info.st_mtime_ns
            if rel in hide:
                build.layer_dir(rel, opaque=True)
                continue
            if old_dirs.get(rel) == info.st_mtime_ns:
                stack.extend(children.get(rel, ()))
                continue
            entries = list(os.scandir(path))  # a changed listing: as it is now
            subdirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
            now = [os.path.join(rel, name) if rel else name for name in subdirs]
            stack.extend(now)
            # Gone from the host: gone from the layer, whole (a directory left there
            # would import as an empty namespace package).
            for gone in set(children.get(rel, ())) - set(now):
                shutil.rmtree(os.path.join(tree, gone), ignore_errors=True)
            if os.path.basename(rel) == "__pycache__":
                build.pycache(rel)
                continue
            if scrub:
                build.scrub(rel, files)
            if "__pycache__" not in subdirs and any(e.name.endswith(".py") for e in entries):
                # Python may compile here later (an installer that did not): the empty
                # opaque directory hides what it writes until a refresh rewrites it.
                build.layer_dir(os.path.join(rel, "__pycache__"), opaque=True)
        if scrub:  # a file rewritten in place keeps its directory's mtime
            for rel, (mtime, size, _kept) in list(files.items()):
                try:
                    info = os.lstat(os.path.join(source, rel))
                    same = (info.st_mtime_ns, info.st_size) == (mtime, size)
                except OSError:
                    same = False
                if not same:
                    build.scrub_file(rel, files)
        if build.rewritten or dirs != old_dirs or not manifest:
            manifest = {"format": FORMAT, "source": source, "target": target}
            manifest.update(dirs=dirs, files=files)
            _write_atomic(manifest_path, json.dumps(manifest).encode())
        return {
            "tree": tree,
            "rewritten": build.rewritten,
            "kept": sum(1 for f in files.values() if f[2]),
            "dropped": build.dropped,
            "files": len(files),
        }
    finally:
        os.umask(umask)
        os.close(lock_fd)
