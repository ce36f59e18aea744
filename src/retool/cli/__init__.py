"""The ``retool`` command line.

Each subcommand lives in its own module and registers itself with
``add_parser(subparsers)``; :mod:`retool.cli.common` holds what they share.

How the command ends, for every subcommand:

* success: exit 0 (a command may return another status it documents);
* a mistake the user can fix (:class:`~retool.errors.RetoolError`, a bad
  argument, an ``OSError`` about a path they gave): one line
  ``retool: error: ...`` on stderr that says what is wrong and what to do,
  exit 2, nothing half-written;
* Ctrl-C, SIGTERM or SIGHUP: the command stops where it is, closes its
  sandbox, sampler and worker processes, removes its temporary files, prints
  one line and exits ``128 + signal`` (130, 143, 129); training first saves
  the checkpoint its loop promises (:mod:`retool.interrupts`);
* anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from retool import __version__
from retool.cli import (
    demo,
    doctor,
    guards,
    preflight,
    prepare_data,
    quiet,
    report,
    rollout,
    sandbox,
    sft,
    streams,
    train,
)
from retool.cli import eval as eval_command
from retool.cli.common import Parser
from retool.errors import RetoolError
from retool.interrupts import exit_status, quiet_leftover_interrupts, stop_on_signals

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
    parser = Parser(
        prog="retool",
        description="Train language models with RL to use a Python interpreter (ReTool). "
        "Errors are one line on stderr with exit status 2; an interrupt exits 130 (SIGINT) "
        "or 143 (SIGTERM) after cleaning up.",
    )
    parser.add_argument("--version", action="version", version=f"retool-rl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(subparsers)
    quiet.add_verbose(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    streams.harden_streams()
    parser = build_parser()
    argv = guards.expand_home(sys.argv[1:] if argv is None else argv)
    quiet.quiet_libraries(quiet.verbose_requested(argv))  # before any model library loads
    empty = guards.empty_argument(argv)
    if empty:
        print(f"retool: error: {empty}", file=sys.stderr)
        return 2
    quiet_leftover_interrupts()
    ranks = torchrun_world_size()
    if ranks is None:
        print("retool: error: WORLD_SIZE must be an integer (torchrun sets it)", file=sys.stderr)
        return 2
    if ranks > 1:
        return _under_torchrun(parser, argv)
    return _run(parser, argv)


def torchrun_world_size() -> int | None:
    """``WORLD_SIZE`` as torchrun sets it (1 without torchrun; None if not a number), read
    here so that a command without torchrun never imports torch.distributed."""
    text = os.environ.get("WORLD_SIZE", "").strip()
    return int(text) if text.isdigit() else (1 if not text else None)


def _under_torchrun(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """One rank of ``torchrun --nproc-per-node N -m retool ...``: rank 0 runs the command
    as in one process, the others only serve its trainer's calls (they write, print and
    open nothing), until rank 0's command ends (``backends/local/distributed.py``)."""
    from retool.backends.local.distributed import rank_lost, run_command, world
    from retool.backends.local.service import serve_calls

    def serve() -> int:
        with stop_on_signals():
            try:
                serve_calls()
                return 0
            except KeyboardInterrupt as exc:  # torchrun passes Ctrl-C on to every rank:
                return 128 + int(getattr(exc, "signum", signal.SIGINT))  # rank 0 says it
            except RetoolError as exc:
                rank = world().rank
                print(f"retool: error: rank {rank}: {streams.one_line(str(exc))}", file=sys.stderr)
                return 2

    # Signals stay ours until the rank ends: torchrun's SIGTERM (a rank died) may come
    # after the command, and Python's default would end this rank before its one line.
    with stop_on_signals():
        try:
            return run_command(lambda: _run(parser, argv), serve)
        except RetoolError as exc:  # the group could not form, or a rank was lost
            print(f"retool: error: {streams.one_line(str(exc))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            lost = rank_lost()
            if lost is not None:
                print(f"retool: error: {streams.one_line(str(lost))}", file=sys.stderr)
                return 2
            return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse ``argv`` and run its subcommand: see the module docstring for how it ends."""
    with stop_on_signals():
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, or a one-line argument error
            return exc.code if isinstance(exc.code, int) else 2
        except KeyboardInterrupt as exc:
            return exit_status(exc)
        if not getattr(args, "handler", None):
            parser.print_help()
            return 2
        try:
            status = int(args.handler(args) or 0)
            broken = streams.flush_stdout()
            if broken:
                print(f"retool: error: {broken}", file=sys.stderr)
                return 2
            return status
        except RetoolError as exc:
            print(f"retool: error: {streams.one_line(str(exc))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP; training's Interrupted too
            return exit_status(exc)
        except BrokenPipeError:  # `retool ... | head`: the reader left; not an error of ours
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except OSError as exc:
            if not exc.filename:
                unnamed = streams.unnamed_failure(exc)  # stdout or a full disk
                if unnamed is None:
                    raise  # not about a path: a bug, keep the traceback
                print(f"retool: error: {unnamed}", file=sys.stderr)
                return 2
            # last resort: a path the command did not check itself (each should)
            names = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
            print(
                f"retool: error: {streams.one_line(names)}: {exc.strerror or exc}", file=sys.stderr
            )
            return 2


if __name__ == "__main__":
    sys.exit(main())
