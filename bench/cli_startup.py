"""How long a ``retool`` command takes to start, against an earlier commit, same run.

    .venv/bin/python bench/cli_startup.py [--base 293933d] [--repeat 10]

The suite starts about a thousand ``retool`` processes (the bad-input table alone
196), most of which stop at a config or path check, so a command's start is most
of their cost. This script times commands that end at such a check, each
``--repeat`` times (median), in three trees:

* ``base``: ``--base`` checked out in a temporary git worktree, run as the suite
  ran it there: no bytecode (``PYTHONDONTWRITEBYTECODE``, which these machines
  set, so every process compiled every module it imported);
* ``lazy``: this tree, also without bytecode (the lazy imports alone);
* ``lazy+pyc``: this tree after ``compileall`` (what ``make test`` now runs).

It prints a table of medians and the ratios to ``base``. Run it with nothing else
on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "train, bad config": ["train", "--config", "/nonexistent.toml"],
    "eval, bad config": ["eval", "--config", "/nonexistent.toml", "--model", "m", "--dataset", "d"],
    "sft, no data": ["sft", "--data", "/nonexistent.jsonl"],
    "rollout, bad config": ["rollout", "--config", "/nonexistent.toml"],
    "report, no run": ["report", "/nonexistent"],
    "--help": ["--help"],
}


def _time(src: Path, argv: list[str], repeat: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "retool", *argv],
            env=env,
            capture_output=True,
            check=False,
            cwd=tempfile.gettempdir(),
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _drop_bytecode(src: Path) -> None:
    for cache in src.rglob("__pycache__"):
        shutil.rmtree(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="293933d", help="the commit to compare against")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="retool-startup-"))
    base_tree = work / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base_tree), args.base],
        check=True,
    )
    try:
        ours = work / "ours"  # a copy, so this checkout's own bytecode is left alone
        shutil.copytree(ROOT / "src", ours / "src")
        trees = {"base": base_tree / "src", "lazy": ours / "src"}
        _drop_bytecode(trees["base"])
        _drop_bytecode(trees["lazy"])
        results: dict[str, dict[str, float]] = {name: {} for name in COMMANDS}
        for name, argv in COMMANDS.items():
            results[name]["base"] = _time(trees["base"], argv, args.repeat)
            results[name]["lazy"] = _time(trees["lazy"], argv, args.repeat)
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(trees["lazy"])],
            check=True,
            capture_output=True,
        )
        for name, argv in COMMANDS.items():
            results[name]["lazy+pyc"] = _time(trees["lazy"], argv, args.repeat)
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False
        )
        shutil.rmtree(work, ignore_errors=True)
    print(f"median of {args.repeat} starts, seconds; base = {args.base} without bytecode")
    print(f"{'command':<22}{'base':>8}{'lazy':>8}{'lazy+pyc':>10}{'ratio':>8}")
    for name, row in results.items():
        ratio = row["base"] / row["lazy+pyc"]
        print(
            f"{name:<22}{row['base']:>8.3f}{row['lazy']:>8.3f}{row['lazy+pyc']:>10.3f}"
            f"{ratio:>7.2f}x"
        )


if __name__ == "__main__":
    main()
