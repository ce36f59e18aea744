"""``retool preflight``: a go/no-go rollout before paying for a run.

The library is :mod:`retool.diagnostics.preflight`; this prints its report.
Exit status 0 for ``GO``, 1 for ``NO-GO`` or ``SFT recommended``.
"""

from __future__ import annotations

import argparse
import sys

from retool.cli.common import add_config_options, add_number, load_command_config
from retool.diagnostics.preflight import run_preflight


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="go/no-go check of a config before a run",
        description="Roll out a few data.train questions with the configured policy, sandbox "
        "and reward, and report tool use, groups that would train, sandbox and budget stops, "
        "tokens per trajectory and the projected tokens (and money, with [cost] prices) per "
        "step and per run. Ends with a verdict: GO (exit 0), NO-GO or SFT recommended (exit 1).",
    )
    add_config_options(parser)
    add_number(parser, "--questions", low=1, high=4096, default=4, help="questions rolled out")
    add_number(
        parser,
        "--group-size",
        low=1,
        high=1024,
        help="trajectories per question (default: rollout.group_size); the projection "
        "still uses the config's",
    )
    parser.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="sample with these weights, as `retool train --init-from` would start: "
        "a checkpoint state directory or a run directory (default: model.base_model)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    config = load_command_config(args, "preflight")  # a --set it never reads is refused
    group = args.group_size or config.rollout.group_size
    bar = tqdm(
        total=args.questions * group,
        unit="traj",
        desc="preflight",
        file=sys.stderr,
        disable=True if args.no_progress else None,
    )
    try:
        report = run_preflight(
            config,
            questions=args.questions,
            group_size=args.group_size,
            init_from=args.init_from,
            progress=lambda event: bar.update(event.count),
        )
    finally:
        bar.close()
    print("\n".join(report.lines()))
    return 0 if report.go else 1
