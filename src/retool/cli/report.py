"""``retool report RUN_DIR [--eval FILES...] [--output DIR]``: plots and an HTML report.

All the work is :func:`retool.report.write_report`; this module only parses
arguments. Every input mistake (not a run directory, a missing eval file, a
file that is not an eval result, an output path that is a file) is a
:class:`~retool.report.ReportError` raised before anything is written, which
the CLI prints as one line with exit status 2. The report's files replace an
older report together or not at all; replacing one is announced.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retool.cli.common import HelpFormatter
from retool.report import write_report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="plots and a self-contained HTML report with a trajectory viewer",
        formatter_class=HelpFormatter,
        description=(
            "Write PNG plots of a run's metrics against step and one self-contained\n"
            "report.html (works offline): the config, the plots, an evaluation table and a\n"
            "trajectory viewer (pick a step and a question; tokens coloured by whether they\n"
            "carry loss). Open a trajectory directly with report.html#step=N&question=Q."
        ),
        epilog=(
            "examples:\n"
            "  retool report runs/demo\n"
            "  retool report runs/demo --eval base.jsonl step100.jsonl --output /tmp/report"
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a `retool train` or `retool sft` run")
    parser.add_argument(
        "--eval",
        dest="eval_files",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE",
        help="`retool eval` result files to tabulate and chart (Average@N, Pass@N, format; "
        "default: none, the run's own eval/step_*.jsonl are always included)",
    )
    parser.add_argument(
        "--output", metavar="DIR", help="where to write the report (default: RUN_DIR/report)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    older = Path(args.output or Path(args.run_dir) / "report") / "report.html"
    existed = older.is_file()
    path = write_report(args.run_dir, args.eval_files, args.output)
    if existed:
        print(f"replaced the older report in {path.parent}")
    print(path)
    return 0
