"""``retool doctor``: can this machine run this config? (see :mod:`retool.diagnostics.doctor`)."""

from __future__ import annotations

import argparse

from retool.cli.common import add_config_options
from retool.diagnostics.doctor import diagnose


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check that this machine can run a config",
        description="Print Python, torch and device, where the model resolves, the sandbox "
        "isolation level, installed extras, credentials for the remote backends (never their "
        "values), whether the run directory would be accepted (an existing run needs --resume) "
        "and its free disk. Exit status 1 when the selected config "
        "cannot run here, with the reasons.",
    )
    add_config_options(parser)
    parser.add_argument("--run-dir", help="the run directory to check (default: train.run_dir)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="check the run directory as `--resume` would (default: as a new run)",
    )
    parser.add_argument(
        "--no-sandbox", action="store_true", help="skip starting the sandbox to read its isolation"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    report = diagnose(
        args.config,
        args.overrides,
        run_dir=args.run_dir,
        sandbox=not args.no_sandbox,
        resume=args.resume,
    )
    print(report.table())
    return 0 if report.ok else 1
