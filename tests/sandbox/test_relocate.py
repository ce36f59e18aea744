"""The relocated layer (``retool.sandbox.relocate``): contents that name the host.

Unit level: the rewriting rules (whole path components only, same length in
binaries with the tail kept, code objects and constants in compiled files),
the refresh (only what changed is redone, a vanished layer is rebuilt, a
compiled file of another interpreter is left out) and the overlay semantics
the server relies on: an opaque ``__pycache__`` hides the host's copy whole,
for a root server (``trusted.overlay.opaque``) and for a server in a user
namespace of its own (``user.overlay.opaque`` with ``userxattr``). The whole
sandbox is attacked in ``test_neutral_paths.py``.
"""

from __future__ import annotations

import marshal
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from retool.sandbox import relocate
from retool.sandbox.relocate import Relocation, refresh, relocate_pyc

from .helpers import ROOT
from .trainers import _system_python

HOST = "/home/alice/project/.venv/lib/python3.11/site-packages"


def test_only_whole_path_components_move():
    moved = Relocation({"/home/alice/py": "/opt/python"})
    text = b"a=/home/alice/py/lib b=/home/alice/pyx c='/home/alice/py' d=/home/alice/py\n"
    assert (
        moved.text(text) == b"a=/opt/python/lib b=/home/alice/pyx c='/opt/python' d=/opt/python\n"
    )


def test_binaries_keep_their_length_and_the_tail_a_linker_may_have_merged():
    host = "/root/.pyenv/versions/3.11.7"
    moved = Relocation({host: "/opt/python"})
    data = b"\0" + host.encode() + b"\0RUNPATH=" + host.encode() + b"/lib\0"
    new, kept = moved.binary(data)
    assert len(new) == len(data) and kept == 0
    assert host.encode() not in new
    # PY_VERSION may point at the prefix's last bytes: they stay.
    prefix = new[1 : 1 + len(host)]
    assert prefix.endswith(b"/3.11.7") and prefix.startswith(b"/opt/python/")
    assert os.path.normpath(prefix.decode().replace("/3.11.7", "")) == "/opt/python"
    short = Relocation({"/a/b": "/opt/python"})
    same, kept = short.binary(b"x/a/b/c\0")
    assert same == b"x/a/b/c\0" and kept == 1  # no room: left, and counted


def _compile(tmp_path: Path, source_dir: str, body: str) -> tuple[Path, bytes]:
    """A module compiled as if it lived at ``source_dir``; its .pyc bytes."""
    src = tmp_path / "mod.py"
    src.write_text(body)
    pyc = tmp_path / "mod.pyc"
    py_compile.compile(str(src), cfile=str(pyc), dfile=f"{source_dir}/mod.py", doraise=True)
    return pyc, pyc.read_bytes()


def test_a_compiled_file_names_the_neutral_path_in_every_code_object_and_constant(tmp_path):
    body = textwrap.dedent(
        f"""
        WHERE = "{HOST}/pkg/data.json"
        PAIR = ("{HOST}", 1)
        def outer():
            def inner():
                return "{HOST}"
            return inner
        class K:
            def method(self):
                return 1
        """
    )
    _, data = _compile(tmp_path, HOST + "/pkg", body)
    assert HOST.encode() in data
    new = relocate_pyc(data, Relocation({HOST: "/opt/site"}))
    assert new is not None and HOST.encode() not in new
    assert new[:16] == data[:16]  # the importer still validates it against the source
    code = marshal.loads(new[16:])
    names, strings = [], []

    def walk(c):
        names.append(c.co_filename)
        for const in c.co_consts:
            if isinstance(const, type(c)):
                walk(const)
            elif isinstance(const, str):
                strings.append(const)
            elif isinstance(const, tuple):
                strings.extend(x for x in const if isinstance(x, str))

    walk(code)
    assert len(names) >= 4 and set(names) == {"/opt/site/pkg/mod.py"}
    assert "/opt/site/pkg/data.json" in strings and "/opt/site" in strings
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["outer"]()() == "/opt/site"


def test_a_compiled_file_of_another_interpreter_is_left_out(tmp_path):
    _, data = _compile(tmp_path, HOST, "x = 1\n")
    other = bytes([data[0] ^ 1]) + data[1:]
    assert relocate_pyc(other, Relocation({HOST: "/opt/site"})) is None
    assert relocate_pyc(data[:10], Relocation({HOST: "/opt/site"})) is None


def _age(tree: Path) -> None:
    """Every directory changed in the last minute, a minute back (a refresh does not
    trust recent mtimes); the others keep theirs, so a refresh sees what changed."""
    now = time.time()
    for root, _dirs, _files in os.walk(tree):
        if os.stat(root).st_mtime > now - 30:
            os.utime(root, (now - 60, now - 60))


def _tree(tmp_path: Path) -> Path:
    """A site tree with two packages, compiled at its own (host) path."""
    site = tmp_path / "site-packages"
    for package in ("alpha", "beta"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(f"NAME = {package!r}\n")
        py_compile.compile(str(site / package / "__init__.py"), doraise=True)
    _age(site)
    return site


def _opaque(path: Path) -> bool:
    return any(
        _xattr(path, name) == b"y" for name in ("trusted.overlay.opaque", "user.overlay.opaque")
    )


def _xattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name)
    except OSError:
        return None


def test_a_refresh_redoes_only_what_changed(tmp_path):
    site = _tree(tmp_path)
    moved = Relocation({str(site): "/opt/site"})
    cache = tmp_path / "cache"
    first = refresh(str(site), "/opt/site", moved, scrub=False, root=str(cache))
    tree = Path(first["tree"])
    assert first["rewritten"] == 2
    for package in ("alpha", "beta"):
        layer = tree / package / "__pycache__"
        assert _opaque(layer)
        (pyc,) = layer.iterdir()
        assert str(site).encode() not in pyc.read_bytes()
        assert b"/opt/site/" + package.encode() in pyc.read_bytes()
    assert refresh(str(site), "/opt/site", moved, scrub=False, root=str(cache))["rewritten"] == 0
    # A new package: only its compiled file is written.
    (site / "gamma").mkdir()
    (site / "gamma" / "__init__.py").write_text("NAME = 'gamma'\n")
    py_compile.compile(str(site / "gamma" / "__init__.py"), doraise=True)
    _age(site)
    again = refresh(str(site), "/opt/site", moved, scrub=False, root=str(cache))
    assert again["rewritten"] == 1 and _opaque(tree / "gamma" / "__pycache__")
    # A compiled file removed on the host goes from the layer too.
    shutil.rmtree(site / "beta" / "__pycache__")
    _age(site)
    refresh(str(site), "/opt/site", moved, scrub=False, root=str(cache))
    assert list((tree / "beta" / "__pycache__").iterdir()) == []
    # An uninstalled package goes whole: an empty directory left in the layer would
    # import as a namespace package.
    shutil.rmtree(site / "alpha")
    _age(site)
    refresh(str(site), "/opt/site", moved, scrub=False, root=str(cache))
    assert not (tree / "alpha").exists()
    # A layer deleted under its manifest is rebuilt whole, never trusted half-gone.
    shutil.rmtree(tree)
    rebuilt = refresh(str(site), "/opt/site", moved, scrub=False, root=str(cache))
    assert rebuilt["rewritten"] == 1 and _opaque(tree / "gamma" / "__pycache__")
    assert _opaque(tree / "beta" / "__pycache__")  # none on the host: empty, hiding


def test_a_package_compiled_later_is_hidden_until_a_refresh_moves_it(tmp_path):
    """An installer that did not compile (uv): the trainer's first import writes a new
    ``__pycache__``, naming the host, hours into a server's life. The layer gave the
    package an empty opaque one in advance, so the call sees none of it."""
    site = tmp_path / "site-packages"
    (site / "lazy").mkdir(parents=True)
    (site / "lazy" / "__init__.py").write_text("X = 1\n")
    _age(site)
    moved = Relocation({str(site): "/opt/site"})
    facts = refresh(str(site), "/opt/site", moved, scrub=False, root=str(tmp_path / "c"))
    ahead = Path(facts["tree"]) / "lazy" / "__pycache__"
    assert _opaque(ahead) and list(ahead.iterdir()) == []
    py_compile.compile(str(site / "lazy" / "__init__.py"), doraise=True)  # the trainer's
    _age(site)
    later = refresh(str(site), "/opt/site", moved, scrub=False, root=str(tmp_path / "c"))
    (pyc,) = ahead.iterdir()
    assert later["rewritten"] == 1 and str(site).encode() not in pyc.read_bytes()


def test_a_directory_changed_during_the_scan_is_scanned_again(tmp_path):
    """A change in the same clock tick as the scan leaves the mtime as recorded:
    a recent mtime is not trusted, so the next refresh looks again."""
    site = _tree(tmp_path)
    now = time.time()
    os.utime(site / "alpha" / "__pycache__", (now, now))
    moved = Relocation({str(site): "/opt/site"})
    refresh(str(site), "/opt/site", moved, scrub=False, root=str(tmp_path / "c"))
    extra = site / "alpha" / "__pycache__" / "extra.cpython-311.pyc"
    shutil.copyfile(next((site / "beta" / "__pycache__").iterdir()), extra)
    os.utime(site / "alpha" / "__pycache__", (now, now))  # the same mtime as recorded
    facts = refresh(str(site), "/opt/site", moved, scrub=False, root=str(tmp_path / "c"))
    assert (Path(facts["tree"]) / "alpha" / "__pycache__" / extra.name).exists()


def test_an_editable_finder_is_left_out_and_the_layer_is_readable_under_any_umask(tmp_path):
    site = _tree(tmp_path)
    finder = site / "__editable___demo_finder.py"
    finder.write_text(f"MAPPING = {{'demo': '{tmp_path}/checkout/src/demo'}}\n")
    py_compile.compile(str(finder), doraise=True)
    _age(site)
    moved = Relocation({str(site): "/opt/site"})
    saved = os.umask(0o077)
    try:
        facts = refresh(str(site), "/opt/site", moved, scrub=False, root=str(tmp_path / "c"))
    finally:
        os.umask(saved)
    tree = Path(facts["tree"])
    assert list((tree / "__pycache__").iterdir()) == [] and facts["dropped"] == 1
    for root, dirs, files in os.walk(tree):
        for name in dirs:
            assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o755, (root, name)
        for name in files:
            assert os.stat(os.path.join(root, name)).st_mode & 0o444 == 0o444, (root, name)


def test_a_cache_another_user_can_write_is_refused(tmp_path):
    """A root server runs the interpreter it finds in a layer: a cache directory
    anyone can write is someone else's choice of what it runs."""
    site = _tree(tmp_path)
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(OSError, match="not ours alone"):
        refresh(
            str(site),
            "/opt/site",
            Relocation({str(site): "/opt/site"}),
            scrub=False,
            root=str(cache),
        )


def test_the_interpreter_tree_is_scrubbed_and_its_site_packages_hidden(tmp_path):
    prefix = tmp_path / "pyenv" / "3.11.7"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib" / "python3.11" / "site-packages" / "junk").mkdir(parents=True)
    (prefix / "bin" / "pip3").write_text(f"#!{prefix}/bin/python3.11\nimport pip\n")
    (prefix / "lib" / "python3.11" / "_sysconfigdata.py").write_text(f"PREFIX = '{prefix}'\n")
    (prefix / "lib" / "libpython.so").write_bytes(b"\x7fELF\0" + str(prefix).encode() + b"\0")
    (prefix / "lib" / "python3.11" / "plain.py").write_text("x = 1\n")
    moved = Relocation({str(prefix): "/opt/python"})
    hide = ["lib/python3.11/site-packages"]
    facts = refresh(
        str(prefix), "/opt/python", moved, scrub=True, hide=hide, root=str(tmp_path / "c")
    )
    tree = Path(facts["tree"])
    assert facts["files"] == 3
    assert (tree / "bin" / "pip3").read_text().startswith("#!/opt/python/bin/python3.11\n")
    assert "'/opt/python'" in (tree / "lib" / "python3.11" / "_sysconfigdata.py").read_text()
    binary = (tree / "lib" / "libpython.so").read_bytes()
    assert len(binary) == len((prefix / "lib" / "libpython.so").read_bytes())
    assert str(prefix).encode() not in binary
    assert os.readlink(tree / "3.11.7") == "."  # the kept tail names the tree itself
    assert not (tree / "lib" / "python3.11" / "plain.py").exists()  # nothing to move: not copied
    hidden = tree / "lib" / "python3.11" / "site-packages"
    assert _opaque(hidden) and list(hidden.iterdir()) == []


def test_no_cache_directory_is_one_os_error(tmp_path):
    site = _tree(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        refresh(
            str(site),
            "/opt/site",
            Relocation({str(site): "/opt/site"}),
            scrub=False,
            root=str(blocker / "cache"),
        )


_OVERLAY = r"""
import ctypes, os, sys
site, tree, mnt, userns = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
if userns == "1":
    uid, gid = os.geteuid(), os.getegid()
    assert libc.unshare(0x10000000 | 0x00020000) == 0, ctypes.get_errno()
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
else:
    assert libc.unshare(0x00020000) == 0, ctypes.get_errno()
options = f"lowerdir={tree}:{site}" + (",userxattr" if userns == "1" else "")
if libc.mount(b"overlay", mnt.encode(), b"overlay", 1, options.encode()) != 0:
    print("MOUNT-FAILED", ctypes.get_errno()); sys.exit(0)
for package in ("alpha", "beta"):
    cache = os.path.join(mnt, package, "__pycache__")
    for name in sorted(os.listdir(cache)):
        print(package, name, site.encode() in open(os.path.join(cache, name), "rb").read())
"""


def _overlay_listing(site: Path, tree: str, mnt: Path, userns: bool, as_nobody: bool) -> str:
    script = mnt.parent / "overlay.py"
    script.write_text(_OVERLAY)
    os.chmod(script, 0o644)
    python = _system_python() if as_nobody else sys.executable
    argv = [python, str(script), str(site), tree, str(mnt), "1" if userns else "0"]
    kwargs = {}
    if as_nobody:
        kwargs["user"] = kwargs["group"] = 65534
        kwargs["extra_groups"] = []
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.skipif(not ROOT, reason="mounts an overlay in a mount namespace of its own")
def test_an_opaque_cache_directory_hides_every_host_compiled_file_of_a_root_server(tmp_path):
    site = _tree(tmp_path)
    moved = Relocation({str(site): "/opt/site"})
    facts = refresh(str(site), "/opt/site", moved, scrub=False, root=str(tmp_path / "cache"))
    # Written on the host after the refresh: must not show through the opaque directory.
    (site / "alpha" / "__pycache__" / "late.cpython-311.pyc").write_bytes(str(site).encode())
    (tmp_path / "mnt").mkdir()
    out = _overlay_listing(site, facts["tree"], tmp_path / "mnt", userns=False, as_nobody=False)
    if "MOUNT-FAILED" in out:
        pytest.skip(f"no overlay mounts here: {out}")
    assert "late" not in out and "True" not in out
    assert out.count("False") == 2, out


@pytest.fixture
def open_tmp():
    """A directory the uid nobody can reach (pytest's own is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="retool-relocate-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="plays the non-root trainer with the uid nobody")
def test_a_non_root_server_reads_the_marks_it_could_set(open_tmp):
    """Built by an unprivileged user (only ``user.*`` attributes stick) and mounted
    in its own user namespace with ``userxattr``: the host's compiled files stay hidden."""
    tmp_path = open_tmp
    site = _tree(tmp_path)
    for root, dirs, files in os.walk(tmp_path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), 65534, 65534)
    build = tmp_path / "build.py"
    build.write_text(
        "import sys, json\nsys.path.insert(0, sys.argv[1])\nimport relocate\n"
        "r = relocate.Relocation({sys.argv[2]: '/opt/site'})\n"
        "facts = relocate.refresh(sys.argv[2], '/opt/site', r, scrub=False, root=sys.argv[3],\n"
        "                         opaque='user.overlay.opaque')\n"
        "print(facts['tree'])\n"
    )
    shutil.copyfile(relocate.__file__, tmp_path / "relocate.py")
    os.chmod(tmp_path / "relocate.py", 0o644)
    python = _system_python()
    if python is None:
        pytest.skip("no system Python for the unprivileged uid")
    run = subprocess.run(
        [python, str(build), str(tmp_path), str(site), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        user=65534,
        group=65534,
        extra_groups=[],
    )
    if run.returncode != 0 and "Operation not supported" in run.stderr:
        pytest.skip("no user extended attributes on this file system")
    assert run.returncode == 0, run.stderr
    tree = run.stdout.strip()
    layer = Path(tree, "alpha", "__pycache__")
    assert _xattr(layer, "user.overlay.opaque") == b"y"
    assert _xattr(layer, "trusted.overlay.opaque") is None  # nobody could not set it
    (site / "alpha" / "__pycache__" / "late.cpython-311.pyc").write_bytes(str(site).encode())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    os.chown(mnt, 65534, 65534)
    out = _overlay_listing(site, tree, mnt, userns=True, as_nobody=True)
    if "MOUNT-FAILED" in out:
        pytest.skip(f"no overlay in a user namespace here: {out}")
    assert "late" not in out and "True" not in out
    assert out.count("False") == 2, out


def test_an_unusable_cache_is_reported_and_the_sandbox_still_runs(tmp_path, monkeypatch):
    """A cache that cannot be written (here a file where the directory should be;
    a full disk or a file system without extended attributes alike): the server
    runs without the layers, and says so where every other missing layer is said."""
    from retool.sandbox import LocalSandbox

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with LocalSandbox(timeout=10, max_workers=1, preload=("math",)) as sandbox:
        result = sandbox.run("print(6 * 7)")
        missing, layers, level = sandbox.missing, sandbox.layers, sandbox.isolation_level.value
    assert result.ok and result.stdout == "42\n"
    if level != "full":
        pytest.skip("no full isolation here: no layers to relocate")
    assert any(m.startswith("relocated files") for m in missing), missing
    assert not any(x.startswith("relocated files") for x in layers)
    assert not any(blocker.parent.glob("not-a-directory*/**"))


def test_a_tree_reached_through_a_link_is_relocated_whole(tmp_path):
    site = _tree(tmp_path)
    link = tmp_path / "linked-site"
    link.symlink_to(site)
    moved = Relocation({str(link): "/opt/site"})
    facts = refresh(str(link), "/opt/site", moved, scrub=False, root=str(tmp_path / "cache"))
    assert facts["rewritten"] == 2
    assert _opaque(Path(facts["tree"]) / "alpha" / "__pycache__")


def test_the_layer_outlives_the_server_that_built_it(tmp_path):
    """Each server has a work directory of its own, mapped too: the cache key must not
    depend on it, or every start would rebuild the layer from nothing."""
    site = _tree(tmp_path)
    cache = str(tmp_path / "c")
    first = Relocation({str(site): "/opt/site", "/tmp/retool-sandbox-aaa": "/opt/work"})
    second = Relocation({str(site): "/opt/site", "/tmp/retool-sandbox-bbb": "/opt/work"})
    built = refresh(str(site), "/opt/site", first, scrub=False, root=cache)
    again = refresh(str(site), "/opt/site", second, scrub=False, root=cache)
    assert again["tree"] == built["tree"] and again["rewritten"] == 0


def test_layers_of_trees_that_are_gone_are_pruned(tmp_path):
    cache = str(tmp_path / "c")
    kept_site, gone_site = _tree(tmp_path / "kept"), _tree(tmp_path / "gone")
    kept, gone = (
        refresh(str(p), "/opt/site", Relocation({str(p): "/opt/site"}), scrub=False, root=cache)
        for p in (kept_site, gone_site)
    )
    shutil.rmtree(gone_site)
    assert relocate.prune(cache) == 1
    assert os.path.isdir(kept["tree"]) and not os.path.exists(os.path.dirname(gone["tree"]))


def test_a_layer_file_is_written_whole_and_readable_by_others_or_not_at_all(tmp_path, monkeypatch):
    """The runtime copy's own atomic write (it cannot import ``retool.atomic``):
    0o644 under any umask, and a disk that fills mid-write leaves the old file."""
    path = tmp_path / "mod.cpython-311.pyc"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    saved = os.umask(0o077)
    try:
        relocate._write_atomic(str(path), b"new")
    finally:
        os.umask(saved)
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o644
    real_write = os.write

    def full(fd, data):
        if len(data) < 1000:
            raise OSError(28, "No space left on device")
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(relocate.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        relocate._write_atomic(str(path), b"x" * 4096)
    monkeypatch.undo()
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == [path.name]
