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
        "values) and free disk for the run directory. Exit status 1 when the selected config "
        "cannot run here, with the reasons.",
    )
    add_config_options(parser)
    parser.add_argument(
        "--run-dir", help="the run directory to check free disk for (default: train.run_dir)"
    )
    parser.add_argument(
        "--no-sandbox", action="store_true", help="skip starting the sandbox to read its isolation"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    report = diagnose(
        args.config, args.overrides, run_dir=args.run_dir, sandbox=not args.no_sandbox
    )
    print(report.table())
    return 0 if report.ok else 1
