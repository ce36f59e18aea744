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
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial

from retool import __version__
from retool.cli import guards, quiet, streams
from retool.cli.common import Parser
from retool.errors import RetoolError
from retool.interrupts import (
    STOP_SIGNALS,
    Stopped,
    exit_status,
    handlers,
    quiet_leftover_interrupts,
    stop_on_signals,
)

# Each command's module (retool.cli.<module>), in the order `retool --help` lists them.
# A command imports only its own module: every test and script starts `retool` in a fresh
# process, and importing all ten commands' dependencies was most of its half-second start.
COMMANDS: dict[str, str] = {
    "prepare-data": "prepare_data",
    "sandbox": "sandbox",
    "rollout": "rollout",
    "preflight": "preflight",
    "train": "train",
    "sft": "sft",
    "eval": "eval",
    "report": "report",
    "demo": "demo",
    "doctor": "doctor",
}


def _named_command(argv: Sequence[str] | None) -> str | None:
    """The command ``argv`` runs (its first word that is not an option), if it is one;
    ``retool``'s own options take no values, so that word is the command."""
    for word in argv or ():
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """``retool``'s parser: with every command, or only the one ``argv`` names (the
    others' modules are not imported; an unknown command or ``--help`` gets them all)."""
    parser = Parser(
        prog="retool",
        description="Train language models with RL to use a Python interpreter (ReTool). "
        "Errors are one line on stderr with exit status 2; an interrupt exits 130 (SIGINT) "
        "or 143 (SIGTERM) after cleaning up.",
    )
    parser.add_argument("--version", action="version", version=f"retool-rl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    named = _named_command(argv)
    for name, module in COMMANDS.items():
        if named is None or name == named:
            importlib.import_module(f"retool.cli.{module}").add_parser(subparsers)
    quiet.add_verbose(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    streams.harden_streams()
    argv = guards.expand_home(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
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
    open nothing), until rank 0's command ends (``backends/local/distributed.py``).

    **One line per job.** Whatever ends it, a rank says at most one line
    (:class:`_LastWord`); when a rank of this host is gone, that line names it,
    even if the command was failing or being stopped for another reason at the time
    (torchrun's SIGTERM to the survivors, a collective that failed, a checkpoint that
    could not be gathered): the lost rank is the cause, the rest its consequences.

    **Signals.** torchrun forwards a signal it gets (Ctrl-C on the launcher) to every
    rank. Rank 0 stops as ``retool train`` does in one process: a step being committed
    finishes first, the last completed step is saved. That needs the other ranks, so a
    serving rank only records a stop signal and keeps serving until rank 0 releases it
    (or is lost); torchrun's shutdown timeout (30 s, ``--shutdown-timeout``) kills any
    rank still running after it. Signals stay ours until the process exits: torchrun's
    SIGTERM (a rank died) may come after the command has returned, even while the
    interpreter exits, and the default would end the rank by that signal (seen: 1 kill
    in 3), so that the launcher would report it instead of the rank's own status.
    """
    from retool.backends.local.distributed import rank_lost, run_command, world
    from retool.backends.local.service import serve_calls

    last = _LastWord(rank_lost)

    def serve() -> int:
        with handlers(dict.fromkeys(STOP_SIGNALS, last.record)):
            try:
                serve_calls()  # until rank 0 says "exit"; a lost rank 0 raises
            except RetoolError as exc:
                return last.end(partial(_error_line, f"rank {world().rank}: {exc}"))
        return 0  # released by rank 0, which decided how the job ends

    for signum in STOP_SIGNALS:  # ours until the process exits: see _LastWord
        signal.signal(signum, last.handle)
    try:
        return run_command(lambda: _run(parser, argv, last.end, last.handlers), serve)
    except RetoolError as exc:  # the group could not form, or a rank was lost
        return last.end(partial(_error_line, str(exc)))
    except KeyboardInterrupt as exc:  # after the command, or while serving
        return last.end(partial(_quiet_stop, exc))
    finally:
        last.said = True  # the rank is ending: a later signal is ignored, not its death,
        for signum in STOP_SIGNALS:  # even while the interpreter exits (which restores
            signal.signal(signum, signal.SIG_IGN)  # the default of a Python handler)


def _quiet_stop(exc: KeyboardInterrupt) -> int:
    """A stop signal after rank 0's command, or on a serving rank: rank 0 has said, or
    says, the line; this rank only ends with ``128 + signal``."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _error_line(text: str) -> int:
    print(f"retool: error: {streams.one_line(text)}", file=sys.stderr)
    return 2


class _LastWord:
    """A torchrun rank's single line: :meth:`end` prints it once (the lost rank first),
    after which stop signals no longer raise (:meth:`handle`): the rank is ending."""

    def __init__(self, lost: Callable[[], RetoolError | None]) -> None:
        self._lost = lost
        self.said = False
        self.status = 1  # if a signal cut the line short
        self.recorded: int | None = None  # a serving rank's last stop signal (not acted on)

    def end(self, say: Callable[[], int]) -> int:
        """``say()`` prints the command's line and returns its status; a lost rank's line
        replaces it (status 2); once said, a later call prints nothing."""
        if self.said:
            return self.status
        self.said = True
        lost = self._lost()
        if lost is not None:
            self.status = 2
            return _error_line(str(lost))
        self.status = say()
        return self.status

    def handle(self, signum: int, frame: object) -> None:
        """Stop the command as ``stop_on_signals`` does, until the line is said."""
        if not self.said:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Stopped(signum)

    def record(self, signum: int, frame: object) -> None:
        """A serving rank's handler: rank 0 decides when the job stops."""
        self.recorded = signum

    def handlers(self) -> contextlib.AbstractContextManager[None]:
        """The command's signal handlers under torchrun (see :meth:`handle`)."""
        return handlers(dict.fromkeys(STOP_SIGNALS, self.handle))


def _plain_end(say: Callable[[], int]) -> int:
    return say()


def _run(
    parser: argparse.ArgumentParser,
    argv: list[str],
    end: Callable[[Callable[[], int]], int] = _plain_end,
    signals: Callable[[], contextlib.AbstractContextManager[None]] = stop_on_signals,
) -> int:
    """Parse ``argv`` and run its subcommand: see the module docstring for how it ends.

    Each failure's line goes through ``end`` (``end(say)`` calls ``say``, which prints
    the line and returns the status): under torchrun a lost rank's line replaces it.
    """
    with signals():
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, or a one-line argument error
            return exc.code if isinstance(exc.code, int) else 2
        except KeyboardInterrupt as exc:
            return end(partial(exit_status, exc))
        if not getattr(args, "handler", None):
            parser.print_help()
            return 2
        try:
            status = int(args.handler(args) or 0)
            broken = streams.flush_stdout()
            if broken:
                return end(partial(_error_line, broken))
            return status
        except RetoolError as exc:
            return end(partial(_error_line, str(exc)))
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP; training's Interrupted too
            return end(partial(exit_status, exc))
        except BrokenPipeError:  # `retool ... | head`: the reader left; not an error of ours
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except OSError as exc:
            if not exc.filename:
                unnamed = streams.unnamed_failure(exc)  # stdout or a full disk
                if unnamed is None:
                    raise  # not about a path: a bug, keep the traceback
                return end(partial(_error_line, unnamed))
            # last resort: a path the command did not check itself (each should)
            names = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
            return end(partial(_error_line, f"{names}: {exc.strerror or exc}"))


if __name__ == "__main__":
    sys.exit(main())
