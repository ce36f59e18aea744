"""docs/architecture.md stays true: every test and file it names exists.

The architecture page says, for each rule of the method, which test holds
it, and traces one RL step file by file. A renamed test or a moved module
would leave the page pointing at nothing; this test fails instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_every_test_the_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert cited, "the page names the tests that hold each rule"
    missing = []
    for file, name in cited:
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
        elif name and name not in _test_names(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_every_source_file_the_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py|[a-z_]+\.py)`", text))
    src = ROOT / "src" / "retool"
    missing = [
        name
        for name in sorted(named)
        if not name.startswith("tests/")
        and not (src / name).is_file()
        and not (ROOT / name).is_file()
    ]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
