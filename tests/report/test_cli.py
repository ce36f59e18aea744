"""``retool report``: arguments, the printed path, and one-line errors for bad inputs.

The lead registers :mod:`retool.cli.report` in ``retool.cli``; until then these
tests build the sub-command's parser on their own and call its handler, which
is exactly what ``retool.cli.main`` does (a ``RetoolError`` becomes one line).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from retool.cli import report
from retool.errors import RetoolError


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="retool")
    report.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", *argv])
    return args.handler(args)


def test_report_prints_the_page_path(crafted_run, tmp_path, capsys):
    assert run_cli(str(crafted_run), "--output", str(tmp_path / "out")) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(tmp_path / "out" / "report.html") and Path(printed).is_file()


def test_eval_takes_several_files(crafted_run, tmp_path, capsys):
    files = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            '{"settings": {"model": "x"}}\n{"summary": {"average_at_n": 0.5, "n": 4}}\n'
        )
        files.append(str(path))
    assert run_cli(str(crafted_run), "--eval", *files, "--output", str(tmp_path / "out")) == 0
    page = Path(capsys.readouterr().out.strip()).read_text()
    assert "<th scope=row>a</th>" in page and "<th scope=row>b</th>" in page


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not-a-run-dir", "is not a run directory (no config.toml or metrics.jsonl)"),
        ("missing-run-dir", "no such directory"),
        ("missing-eval", "--eval {tmp}/gone.jsonl: no such file"),
        ("not-an-eval-file", "not a `retool eval` result file (line 1 is not JSON)"),
        ("eval-is-a-directory", "is a directory"),
        ("output-is-a-file", "--output {tmp}/file.txt: is a file"),
    ],
)
def test_bad_inputs_are_one_clear_line(crafted_run, tmp_path, case, message):
    (tmp_path / "file.txt").write_text("not json at all\n")
    args = {
        "not-a-run-dir": [str(tmp_path)],
        "missing-run-dir": [str(tmp_path / "nope")],
        "missing-eval": [str(crafted_run), "--eval", str(tmp_path / "gone.jsonl")],
        "not-an-eval-file": [str(crafted_run), "--eval", str(tmp_path / "file.txt")],
        "eval-is-a-directory": [str(crafted_run), "--eval", str(tmp_path)],
        "output-is-a-file": [str(crafted_run), "--output", str(tmp_path / "file.txt")],
    }[case]
    with pytest.raises(RetoolError) as caught:
        run_cli(*args)
    text = str(caught.value)
    assert message.format(tmp=tmp_path) in text and "\n" not in text
    assert not (tmp_path / "report").exists()
