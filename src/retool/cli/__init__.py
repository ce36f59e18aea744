"""The ``retool`` command line.

Each subcommand lives in its own module and registers itself with
``add_parser(subparsers)``. A :class:`~retool.errors.RetoolError` is printed as
one line (``retool: error: ...``) with exit status 2; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from retool import __version__
from retool.cli import demo, doctor, preflight, prepare_data, report, rollout, sandbox, sft, train
from retool.cli import eval as eval_command
from retool.errors import RetoolError

COMMANDS = (
    prepare_data,
    sandbox,
    rollout,
    preflight,
    train,
    sft,
    eval_command,
    report,
    demo,
    doctor,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retool",
        description="Train language models with RL to use a Python interpreter (ReTool).",
    )
    parser.add_argument("--version", action="version", version=f"retool-rl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    from retool.training.loop import Interrupted

    try:
        return int(args.handler(args) or 0)
    except Interrupted as exc:  # SIGINT/SIGTERM during training: saved, then stopped
        print(f"retool: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except RetoolError as exc:
        print(f"retool: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("retool: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
