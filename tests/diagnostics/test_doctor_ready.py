"""``retool doctor`` never says ``ready`` for a run the command would refuse."""

from __future__ import annotations

import re

import pytest

from retool.diagnostics.doctor import check_run_dir, diagnose
from retool.errors import RetoolError


@pytest.mark.parametrize(
    ("layout", "resume", "status", "says"),
    [
        ("run", False, "fail", "already holds a run"),
        ("run", True, "ok", "resume"),
        # a config.toml no run wrote: train refuses a new run there, resumes from it
        ("foreign-config", False, "fail", "holds a config.toml that no run wrote"),
        ("foreign-config", True, "ok", "resume"),
        ("file", False, "fail", "is a file"),
        ("loop", False, "fail", "symlink loop"),
        ("missing", True, "fail", "nothing to resume"),
        ("missing", False, "ok", "new run"),
    ],
)
def test_run_directory_is_checked_as_the_command_checks_it(tmp_path, layout, resume, status, says):
    from retool.cli.common import check_run_dir as cli_check

    path = tmp_path / "r"
    if layout == "run":
        path.mkdir()
        for name in ("config.toml", "inputs.json", "metrics.jsonl"):
            (path / name).write_text("")
    elif layout == "foreign-config":
        path.mkdir()
        (path / "config.toml").write_text("")
    elif layout == "file":
        path.write_text("x")
    elif layout == "loop":
        path.symlink_to(path)
    check = check_run_dir(str(path), resume)
    assert check.status == status and says in check.detail
    # the command's own early check says the same
    if status == "ok":
        cli_check(path, resume=resume)
    else:
        with pytest.raises(RetoolError, match=re.escape(says)):
            cli_check(path, resume=resume)


def test_a_missing_dev_split_of_the_periodic_evaluation_is_not_ready(tmp_path):
    report = diagnose(
        None,
        ["train.eval_every=1", f"data.dev={tmp_path / 'nope.jsonl'}"],
        run_dir=str(tmp_path / "new"),
        sandbox=False,
    )
    assert not report.ok
    assert any(c.name == "data.dev" and c.status == "fail" for c in report.checks)
