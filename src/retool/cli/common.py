"""Options and output shared by several commands (one place for each)."""

from __future__ import annotations

import argparse
from typing import Any


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set section.key=value``."""
    parser.add_argument("--config", help="a TOML config file (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options of commands that write a run directory (``train``, ``sft``)."""
    parser.add_argument("--run-dir", help="where the run lives (default: train.run_dir)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its last checkpoint",
    )
    parser.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start from these weights: a checkpoint state directory or a run directory",
    )
    parser.add_argument(
        "--tracker",
        choices=["swanlab", "wandb", "tensorboard"],
        help="also log to this tracker (offline mode; needs the 'track' extra)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (summary lines only)"
    )


def print_run(run: Any, then: str = "") -> None:
    """Where a training run lives and its last checkpoint."""
    print(f"run directory: {run.path}")
    last = run.last_checkpoint()
    if last is not None:
        print(f"last checkpoint: step {last.step}, sampler weights {last.sampler_path}")
        if then:
            print(then.format(run=run.path))
