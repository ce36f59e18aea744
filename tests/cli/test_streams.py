"""The terminal's own failures: stdout that cannot be written, a non-UTF-8 path
printed on a strict UTF-8 terminal, a cache directory that is a file, a big integer answer.

Each runs the real console script; the command's work is fast (``prepare-data demo``,
``sandbox exec``) or fails before sampling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retool.cli import guards, streams
from retool.data.examples import load_examples

_SCRIPT = Path(sys.executable).with_name("retool")
RETOOL = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "retool"]


def _retool(args, cwd, stdout=subprocess.PIPE, env=None):
    return subprocess.run(
        [*RETOOL, *args],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "args", [["prepare-data", "demo", "--output-dir", "out"], ["sandbox", "exec", "x.py"]]
)
def test_stdout_that_cannot_be_written_is_one_line(tmp_path, args):
    (tmp_path / "x.py").write_text("print('hello')\n")
    with open("/dev/full", "w") as full:
        done = _retool(args, tmp_path, stdout=full)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("retool: error: cannot write to standard output")


def test_a_non_utf8_path_prints_escaped_on_a_strict_terminal(tmp_path):
    name = os.fsdecode(b"out\xff")
    done = _retool(
        ["prepare-data", "demo", "--output-dir", name],
        tmp_path,
        env={"PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"},
    )
    assert done.returncode == 0, done.stderr.decode()
    assert "out\\udcff/train.jsonl" in done.stdout.decode()
    assert (tmp_path / name / "train.jsonl").is_file()


def test_a_cache_directory_that_is_a_file_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    done = _retool(
        ["rollout", "--model", "tiny-random", "--questions", "1"],
        tmp_path,
        env={"RETOOL_CACHE_DIR": str(tmp_path / "f")},
    )
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("retool: error: RETOOL_CACHE_DIR") and "is a file" in last


def test_an_unquoted_answer_of_thousands_of_digits_is_kept_as_text(tmp_path):
    answer = "7" * 5000
    path = tmp_path / "big.jsonl"
    path.write_text(f'{{"id": 1, "question": "What is 7 * 1?", "answer": {answer}}}\n')
    (example,) = load_examples(path)
    assert example.answer == answer


def test_control_characters_are_escaped_and_home_expanded(monkeypatch, tmp_path):
    assert streams.one_line("a\nb\x1b[2J\tc") == "a\\nb\\x1b[2J\\tc"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert guards.expand_home(["--run-dir=~/r", "~/x", "--set", "train.run_dir=~/y"]) == [
        f"--run-dir={tmp_path}/r",
        f"{tmp_path}/x",
        "--set",
        "train.run_dir=~/y",  # the config expands its own path settings
    ]
    assert guards.empty_argument(["train", "--run-dir", ""]).startswith("--run-dir")
    assert guards.empty_argument(["train", "--run-dir", "x"]) is None


def test_tilde_means_home_in_every_path_setting(monkeypatch, tmp_path):
    from retool.config import load_config

    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config(
        None,
        ["train.run_dir=~/runs/a", "data.train=~/t.jsonl", "data.dev=demo:dev"],
    )
    assert config.train.run_dir == f"{tmp_path}/runs/a"
    assert config.data.train == f"{tmp_path}/t.jsonl" and config.data.dev == "demo:dev"
    assert json.dumps(config.to_dict())  # still a plain config
