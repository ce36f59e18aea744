"""The README's commands and the bare ``demo`` dataset, one table row per case.

* The README's commands parse, every one that samples names its ``--config``,
  every file one reads was written by an earlier one (or is in the
  repository), and the hand-run pipeline (the block with ``retool sft
  make-demos``) produces, command for command, the settings ``retool demo``
  runs: the demo is run with its commands recorded instead of executed, and
  both scripts are compared after their paths are replaced by "the output of
  command k".
* ``--dataset demo`` is the test split for every command; ``make-demos`` and
  the demo refuse it (it is held out) in one line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from retool.cli import build_parser, main
from retool.cli import demo as demo_cli
from retool.cli import eval as eval_cli
from retool.cli import sft as sft_cli
from retool.cli.common import load_command_config
from retool.config import load_config_given
from retool.data import load_dataset
from retool.data.demo import demo_examples
from retool.evaluation.models import ALIASES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SAMPLING = {("eval",), ("sft",), ("train",), ("rollout",), ("preflight",)}


def readme_commands() -> list[tuple[int, list[str]]]:
    """``(block number, argv without "retool")`` of every README bash line, in order.

    Synopsis lines (``[--flag ...]``, pipes) are left out: they are not commands."""
    commands = []
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    for number, block in enumerate(blocks):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["retool"] and not any(w.startswith("[") for w in words):
                commands.append((number, words[1:]))
    return commands


def pipeline() -> list[list[str]]:
    """The README's hand-run demo: the bash block that runs ``retool sft make-demos``."""
    commands = readme_commands()
    (block,) = {n for n, argv in commands if argv[:2] == ["sft", "make-demos"]}
    return [argv for n, argv in commands if n == block]


def kind(args: Any) -> tuple[str, ...]:
    verb = getattr(args, "verb", None) or getattr(args, "kind", None)
    return (args.command, verb) if verb else (args.command,)


def paths(args: Any) -> tuple[list[str], list[str]]:
    """The files and directories ``args`` reads and writes (the config aside)."""

    def local(spec: str | None) -> list[str]:
        if spec is None or spec in ALIASES or spec == "demo" or spec.startswith("demo:"):
            return []
        return [os.path.normpath(spec.partition("@")[0])]

    match kind(args):
        case ("prepare-data", _):
            return [], [os.path.normpath(args.output_dir)]  # --input: downloaded by the user
        case ("sft", "make-demos"):
            return [], local(args.output)
        case ("eval", "compare"):
            return local(args.a) + local(args.b), []
        case ("eval",):
            return local(args.model) + local(args.dataset), local(args.output)
        case ("sft",) | ("train",):
            inputs = local(getattr(args, "data", None)) + local(args.init_from)
            run_dir = local(args.run_dir)
            return (inputs + run_dir, []) if args.resume else (inputs, run_dir)
        case ("rollout",):
            return local(args.model) + local(args.dataset), local(args.output)
        case ("report",):
            inputs = local(args.run_dir) + [p for f in args.eval_files for p in local(f)]
            return inputs, local(args.output)
    raise AssertionError(f"the test does not know what `retool {' '.join(kind(args))}` reads")


def linked(script: list[list[str]], where: str) -> list[tuple[Any, list[int]]]:
    """Each command parsed, with the commands whose outputs it reads (refusing any other)."""
    parser, written, out = build_parser(), {}, []
    for index, argv in enumerate(script):
        args = parser.parse_args(argv)  # SystemExit (an argument error) fails the test
        inputs, outputs = paths(args)
        missing = [p for p in inputs if p not in written]
        assert not missing, (
            f"{where}: `retool {shlex.join(argv)}` reads {missing[0]}, "
            "which no earlier command wrote"
        )
        out.append((args, [written[p] for p in inputs]))
        written.update(dict.fromkeys(outputs, index))
    return out


def settings(args: Any) -> Any:
    """What a command runs with: its effective config and the flags that are not paths."""
    match kind(args):
        case ("eval",):
            config, given = load_config_given(
                args.config, [*args.overrides, *eval_cli._flags(args)]
            )
            config = dataclasses.replace(config, rollout=eval_cli._sampling(config.rollout, given))
            model = args.model if args.model in ALIASES else "a run"
            return config, args.dataset, args.val_n, args.limit, args.mode or "tool", model
        case ("sft", "make-demos"):
            return load_dataset(args.dataset), args.limit, args.seed
        case ("sft",):
            return load_command_config(args, "sft", unused=sft_cli.UNUSED), args.resume
        case ("train",):
            return load_command_config(args, "train"), args.resume
    raise AssertionError(f"no settings for {kind(args)}")


def demo_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands ``retool demo`` runs with configs/demo.toml, recorded, not executed."""
    ran: list[list[str]] = []
    passed = SimpleNamespace(ok=True, correct=7, total=7, tool_calls=7, tokens=0, failures=[])
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(demo_cli, "run_selfcheck", lambda *a, **k: passed)
    monkeypatch.setattr(demo_cli, "_command", ran.append)
    monkeypatch.setattr(demo_cli, "_results", lambda *a, **k: None)  # reads what nothing wrote
    assert main(["demo", "--output", str(tmp_path)]) == 0
    return ran


def test_the_readme_commands_parse_sample_with_a_config_and_read_what_was_written():
    commands = [argv for _, argv in readme_commands()]
    assert len(commands) >= 10
    for args, _ in linked(commands, "README"):
        if kind(args) in SAMPLING:
            assert args.config, f"README: `retool {' '.join(kind(args))}` samples without --config"
            assert (ROOT / args.config).is_file(), args.config


def test_the_readme_pipeline_runs_the_demos_settings(tmp_path, monkeypatch):
    demo = linked(demo_script(tmp_path, monkeypatch), "retool demo")
    readme = linked(pipeline(), "README")[: len(demo)]
    assert [kind(a) for a, _ in readme] == [kind(a) for a, _ in demo]
    for (mine, reads), (theirs, demo_reads) in zip(readme, demo, strict=True):
        assert reads == demo_reads, f"{kind(mine)} reads other commands' outputs than the demo's"
        assert settings(mine) == settings(theirs), f"retool {' '.join(kind(mine))}"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["sft", "make-demos", "--dataset", "demo", "--output", "{tmp}/d.jsonl"], "test split"),
        (["demo", "--check-only", "--set", 'data.train="demo"', "--output", "{tmp}"], "held-out"),
    ],
)
def test_bare_demo_is_the_test_split_and_refused_where_it_is_held_out(
    tmp_path, capsys, monkeypatch, argv, fragment
):
    assert load_dataset("demo") == demo_examples("test")
    monkeypatch.chdir(ROOT)  # the demo reads configs/demo.toml
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["eval"], ["rollout"], ["sft", "make-demos"]])
def test_every_dataset_help_says_which_split_bare_demo_is(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    assert "test split" in " ".join(capsys.readouterr().out.split())


MEASURED = re.compile(
    r"(?<!default )\b\d+(\.\d+)?\s?(s|ms|tok/s|req/s|GB/s|minutes)\b|\b\d+m\d+s\b"
)


def test_every_readme_paragraph_with_a_measured_time_says_when():
    """A time or rate in prose comes from a run: its paragraph gives the date (tables and
    code blocks are dated by the paragraph that introduces them), and the README says
    once that another machine prints other numbers."""
    text = README.read_text(encoding="utf-8")
    assert "Another machine" in text and "prints other numbers" in text
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    undated = [
        paragraph[:120]
        for paragraph in re.split(r"\n\s*\n", text)
        if not paragraph.lstrip().startswith("|")
        and MEASURED.search(paragraph)
        and not re.search(r"\b20\d\d-\d\d-\d\d\b", paragraph)
    ]
    assert not undated, undated
