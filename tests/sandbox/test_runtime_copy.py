"""The server's runtime copy: every module the server runs, and nothing else of ours.

The trainer starts the server from a copy of its modules (``runtime_copy.RUNTIME_MODULES``,
package ``retool_sandbox_rt``) under ``-I -S``, never from the checkout: a module
the server imports but the list lacks fails every start (or only fresh mode, whose
boot imports ``call``), and a module listed for nothing puts more of ours within a
call's reach. The import graph is read from the source, so a new module of the
server is caught here before a sandbox has to start.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from retool.sandbox import boot, call, runtime_copy, server, server_process

HERE = Path(runtime_copy.__file__).resolve().parent
PACKAGE = boot.RUNTIME_PACKAGE
BOOTS = {  # each as the module that starts the interpreter sees it
    "the trainer's server start": server_process.SERVER_BOOT,
    "the server's neutral re-exec": server.SERVER_BOOT,
    "fresh mode": call.FRESH_BOOT,
}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports_of(name: str) -> tuple[set[str], list[str]]:
    """(sibling modules ``name`` imports, imports of ours from outside the package)."""
    tree = ast.parse((HERE / f"{name}.py").read_text(encoding="utf-8"))
    siblings: set[str] = set()
    outside: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.ImportFrom) and child.level == 1:
                if child.module:
                    siblings.add(child.module.split(".")[0])
                else:
                    siblings.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level > 1:
                outside.append(f"{name}: from {'.' * child.level}{child.module or ''}")
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("retool"):
                outside.append(f"{name}: from {child.module}")
            elif isinstance(child, ast.Import):
                ours = [alias.name for alias in child.names if "retool" in alias.name]
                outside.extend(f"{name}: import {module}" for module in ours)
            elif (  # importlib.import_module(__package__ + ".autoprint")
                isinstance(child, ast.BinOp)
                and isinstance(child.left, ast.Name)
                and child.left.id == "__package__"
                and isinstance(child.right, ast.Constant)
            ):
                siblings.add(str(child.right.value).lstrip("."))
            visit(child)

    visit(tree)
    return siblings, outside


def _boot_modules() -> set[str]:
    found = set()
    for where, line in BOOTS.items():
        named = re.findall(rf"from {PACKAGE}\.(\w+) import", line)
        assert named, f"{where}: no module of {PACKAGE} in its boot line {line!r}"
        found.update(named)
    return found


def test_the_copy_lists_exactly_the_modules_the_server_runs():
    needed: set[str] = set()
    outside: list[str] = []
    todo = sorted(_boot_modules())
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        siblings, foreign = _imports_of(name)
        outside += foreign
        todo += sorted(siblings - needed)
    listed = set(runtime_copy.RUNTIME_MODULES)
    assert len(listed) == len(runtime_copy.RUNTIME_MODULES), "a module listed twice"
    assert not needed - listed, f"imported by the server but not copied: {needed - listed}"
    assert not listed - needed, f"copied but never imported by the server: {listed - needed}"
    assert not outside, f"the server's modules import ours from outside the copy: {outside}"


def _runtime(tmp_path: Path) -> str:
    """The explicit import path a server gets: the copy, then the site directories."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    return runtime_copy.install_runtime(str(workdir))


def _isolated(
    *args: str, cwd: Path, keep: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-B", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
        pass_fds=keep,
        timeout=60,
        check=False,
    )


def test_the_server_starts_from_the_copy_alone(tmp_path):
    """Its boot line, as the trainer runs it, finds ``main`` in the copy (``--help``:
    argparse answers before anything is set up), and the copy imports nothing of ours."""
    boot_path = _runtime(tmp_path)
    started = _isolated("-c", server_process.SERVER_BOOT, boot_path, "--help", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert "--dir" in started.stdout and "retool.sandbox.server" in started.stdout
    probe = (
        "import importlib.util, sys; sys.path += sys.argv[1].split(':'); "
        f"import {PACKAGE}.server, {PACKAGE}.call; "
        "print(importlib.util.find_spec('retool'), "
        "sorted(m for m in sys.modules if m.split('.')[0] == 'retool'))"
    )
    found = _isolated("-c", probe, boot_path, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["None", "[]"], found.stdout


def test_fresh_mode_runs_a_file_from_the_copy(tmp_path):
    """The interpreter C executes in fresh mode boots from the copy, says set-up is done
    on the descriptor it is given, removes the file and runs it."""
    boot_path = _runtime(tmp_path)
    code = tmp_path / "code.py"
    code.write_text("print(6 * 7)\n")
    ready_r, ready_w = os.pipe()
    try:
        ran = _isolated(
            "-c",
            call.FRESH_BOOT,
            boot_path,
            str(code),
            str(ready_w),
            cwd=tmp_path,
            keep=(ready_w,),
        )
    finally:
        os.close(ready_w)
    with os.fdopen(ready_r, "rb") as handle:
        ready = handle.read()
    assert (ran.returncode, ran.stdout, ran.stderr, ready) == (0, "42\n", "", b"1"), ran
    assert not code.exists()


def test_a_module_left_out_of_the_copy_fails_the_start(tmp_path, monkeypatch):
    """The check above has teeth: a copy without one of the server's modules cannot
    start it."""
    monkeypatch.setattr(
        runtime_copy,
        "RUNTIME_MODULES",
        tuple(m for m in runtime_copy.RUNTIME_MODULES if m != "wire"),
    )
    boot_path = _runtime(tmp_path)
    assert not os.path.exists(os.path.join(boot_path.split(":")[0], PACKAGE, "wire.py"))
    started = _isolated("-c", server_process.SERVER_BOOT, boot_path, "--help", cwd=tmp_path)
    assert started.returncode != 0
    assert "ModuleNotFoundError" in started.stderr and "wire" in started.stderr
