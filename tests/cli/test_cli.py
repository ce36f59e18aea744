import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from retool.cli import main


def _retool(*args):
    return subprocess.run(
        [sys.executable, "-m", "retool", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_help_lists_subcommands():
    done = _retool("--help")
    assert done.returncode == 0
    assert "prepare-data" in done.stdout and "demo" in done.stdout
    assert _retool("prepare-data", "--help").returncode == 0
    assert "--dev-size" in _retool("prepare-data", "dapo-math", "--help").stdout


def test_each_command_imports_only_its_own_module_and_the_table_names_every_command():
    from retool.cli import COMMANDS, build_parser

    every = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(every) == list(COMMANDS)  # the table and what the modules register agree
    for name in COMMANDS:
        for argv in ([name, "--help"], ["-v", name], ["--verbose", name, "x"]):
            only = build_parser(argv)._subparsers._group_actions[0].choices  # type: ignore[union-attr]
            assert list(only) == [name], argv
    for argv in ([], ["--help"], ["nosuch", "train"], ["--", "train"]):
        assert list(build_parser(argv)._subparsers._group_actions[0].choices) == list(COMMANDS)
    # in a fresh process, `retool report --help` never imports the sampling commands' stack
    code = (
        "import sys; from retool.cli import main\n"
        "try:\n    main(['report', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m in ('retool.cli.eval', 'retool.cli.train', "
        "'retool.cli.demo', 'torch')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_malformed_parquet_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "raw.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "prompt": [{"role": "user", "content": "Q"}],
                    "reward_model": {"ground_truth": "1"},
                    "extra_info": {"index": None},
                }
            ]
        ),
        bad,
    )
    done = _retool(
        "prepare-data", "dapo-math", "--input", str(bad), "--output-dir", str(tmp_path / "out")
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "raw.parquet:1" in done.stderr and "extra_info.index" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_prepare_demo_writes_splits(tmp_path, capsys):
    assert main(["prepare-data", "demo", "--output-dir", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["dev.jsonl", "paraphrase.jsonl", "test.jsonl", "train.jsonl", "varied.jsonl"]
    assert "wrote 240 train examples" in capsys.readouterr().out


def test_bad_override_is_a_clean_error(capsys):
    assert main(["demo", "--set", "rollout.group_size=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "retool: error: --set rollout.group_size=0: rollout.group_size must be > 0"
    )


def _parsers(parser, prog="retool"):
    """Every (sub)parser of the command line, with its prog."""
    import argparse

    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def _help_problems() -> list[str]:
    import argparse

    from retool.cli import build_parser
    from retool.cli.common import HelpFormatter

    problems = []
    for prog, parser in _parsers(build_parser()):
        if len(prog.split()) < 2:
            continue
        formatter = HelpFormatter(prog)
        for action in parser._actions:
            if not action.option_strings or isinstance(
                action,
                argparse._HelpAction | argparse._VersionAction | argparse._StoreTrueAction,
            ):
                continue
            flag = f"{prog} {action.option_strings[-1]}"
            text = formatter._get_help_string(action) or ""
            if "default" not in text and not action.required and "required" not in text:
                problems.append(f"{flag}: no default in {text!r}")
            kind = getattr(action.type, "__name__", "")
            if kind in ("int", "float"):
                problems.append(f"{flag}: a number whose range is not checked")
            if kind in ("integer", "number") and not any(
                word in text for word in ("in [", "in (", ">=", "<=", "> ")
            ):
                problems.append(f"{flag}: no bound in {text!r}")
    return problems


def test_help_shows_every_default_and_every_numeric_bound():
    problems = _help_problems()
    assert not problems, "\n".join(problems)
