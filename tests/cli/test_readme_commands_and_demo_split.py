"""The README's commands and the bare ``demo`` dataset, one table row per case.

* Every ```` ```bash ```` block of the README either runs here or is marked with
  what it needs, on the line just before it, in words the reader sees (italic):
  ``*needs: gpu*``, ``*needs: a service*`` (a training service, a vLLM server, a
  credential) or ``*needs: downloads*`` (a model, a dataset, a package), or several,
  comma-separated (``*needs: gpu, downloads*``).
  An unmarked block holds only commands that run on this machine: ``retool`` (also
  under ``torchrun -m retool``), ``make`` of a target the Makefile has, and
  ``python examples/...``.
* The README's commands parse, every one that samples names its ``--config`` (a
  file of the repository), and in unmarked blocks every file one reads was written by
  an earlier one (or is in the repository); the cheap ones run (``retool prepare-data
  demo``, the examples' ``--help``). In marked blocks they parse and their settings
  load (``--set`` keys included), nothing more: their files are the user's downloads.
* The hand-run pipeline (the block with ``retool sft make-demos``) produces, command
  for command, the settings ``retool demo`` runs: the demo is run with its commands
  recorded instead of executed, and both scripts are compared after their paths are
  replaced by "the output of command k".
* The README is a guide: no dated measurement (those are in docs/measurements.md,
  which its results table links).
* ``--dataset demo`` is the test split for every command; ``make-demos`` and
  the demo refuse it (it is held out) in one line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
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
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
SAMPLING = {("eval",), ("sft",), ("train",), ("rollout",), ("preflight",)}


NEEDS = {"gpu", "a service", "downloads"}
RUNS_HERE = {"retool", "make", "python", "torchrun"}  # what an unmarked block may run


def readme_blocks() -> list[tuple[frozenset[str], list[str]]]:
    """``(what it needs, its lines)`` of every README bash block, continuations joined."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for marker, block in re.findall(
        r"(?:^\*needs: ([^*\n]+)\*\n)?^```bash\n(.*?)^```", text, re.M | re.S
    ):
        needs = frozenset(n.strip() for n in marker.split(",")) if marker else frozenset()
        blocks.append((needs, block.replace("\\\n", " ").splitlines()))
    return blocks


def program(line: str) -> list[str]:
    """The words of a command line from its program on (``VAR=value`` prefixes dropped)."""
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words = words[1:]
    return words


def retool_argv(words: list[str]) -> list[str] | None:
    """The argv after ``retool`` of a ``retool ...`` or ``torchrun ... -m retool ...`` line."""
    if words[:1] == ["retool"]:
        return words[1:]
    if words[:1] == ["torchrun"] and "-m" in words:
        at = words.index("-m")
        if words[at + 1 : at + 2] == ["retool"]:
            return words[at + 2 :]
    return None


def readme_commands(marked: bool = False) -> list[tuple[int, list[str]]]:
    """``(block number, argv without "retool")`` of every README bash line, in order: of
    the unmarked blocks, or with ``marked`` of the blocks marked as needing something.

    Synopsis lines (``[--flag ...]``, pipes) are left out: they are not commands."""
    commands = []
    for number, (needs, lines) in enumerate(readme_blocks()):
        if bool(needs) != marked:
            continue
        for line in lines:
            argv = retool_argv(program(line))
            if argv is not None and not any(w.startswith("[") for w in argv):
                commands.append((number, argv))
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
        case ("prepare-data", _):  # --input: downloaded by the user
            out = os.path.normpath(args.output_dir)
            return [], [out, *(os.path.join(out, f) for f in ("train.jsonl", "dev.jsonl"))]
        case ("demo",) | ("doctor",) | ("preflight",) | ("sandbox", _):
            return [], []  # their config, and what they write under runs/ themselves
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


def test_every_readme_block_runs_here_or_says_what_it_needs():
    for number, (needs, lines) in enumerate(readme_blocks()):
        assert needs <= NEEDS, f"README block {number}: unknown needs {sorted(needs - NEEDS)}"
        if needs:
            continue
        for line in lines:
            words = program(line)
            if not words:
                continue
            name = Path(words[0]).name  # .venv/bin/python is python
            assert name in RUNS_HERE, (
                f"README block {number}: `{line.strip()}` runs {words[0]}; mark the block "
                "*needs: ...* or run it here"
            )
            if name == "make":
                for target in [w for w in words[1:] if "=" not in w]:
                    assert re.search(rf"^{re.escape(target)}:", MAKEFILE, re.M), line
            if name == "python":
                assert (ROOT / words[1]).is_file() and words[1].startswith("examples/"), line


def test_the_readme_commands_parse_sample_with_a_config_and_read_what_was_written():
    commands = [argv for _, argv in readme_commands()]
    assert len(commands) >= 10
    for args, _ in linked(commands, "README"):
        if kind(args) in SAMPLING:
            assert args.config, f"README: `retool {' '.join(kind(args))}` samples without --config"
            assert (ROOT / args.config).is_file(), args.config


def test_the_readme_commands_that_need_a_gpu_or_a_service_parse_and_their_settings_load():
    commands = [argv for _, argv in readme_commands(marked=True)]
    assert commands
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)  # SystemExit (an argument error) fails the test
        if getattr(args, "config", None):
            assert (ROOT / args.config).is_file(), f"README: {shlex.join(argv)}"
        if kind(args) in {("train",), ("sft",), ("preflight",)}:
            load_command_config(args, args.command)  # the --set keys: known, not idle


def test_the_cheap_readme_commands_run(tmp_path, monkeypatch, capsys):
    """``retool prepare-data demo`` as the README says, in a scratch directory; each
    example's ``--help``."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for _, argv in readme_commands():
        if argv[:2] == ["prepare-data", "demo"]:
            assert main(argv) == 0, capsys.readouterr().err
            out = Path(build_parser().parse_args(argv).output_dir)
            assert load_dataset(str(out / "dev.jsonl")) == demo_examples("dev")
            ran += 1
    assert ran
    examples = {
        words[1]
        for needs, lines in readme_blocks()
        for line in lines
        if not needs and (words := program(line)) and Path(words[0]).name == "python"
    }
    assert examples
    for script in sorted(examples):
        done = subprocess.run(
            [sys.executable, str(ROOT / script), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


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


def test_the_readme_is_a_guide_without_dated_measurements():
    """Dated runs live in docs/measurements.md (with their hosts and commits), which the
    README's results table links; the README holds no date that would make it a log."""
    text = README.read_text(encoding="utf-8")
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not dates, f"README: dated entries belong in docs/measurements.md: {dates}"
    assert "(docs/measurements.md)" in text
    assert len(text.splitlines()) <= 320, "the README is a guide: keep it short"
