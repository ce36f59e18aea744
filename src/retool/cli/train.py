"""``retool train``: reinforcement learning with the code interpreter (the ReTool step loop)."""

from __future__ import annotations

import argparse

from retool.cli.common import add_config_options, add_run_options, print_run


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="RL training with the code interpreter",
        description="Roll out questions with the sandbox, score them, and update the policy "
        "with PPO on group-centred advantages; one optimizer step per training step. "
        "The run directory is resumable after a crash or kill (--resume).",
    )
    add_config_options(parser)
    add_run_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from retool.config import load_config
    from retool.training.loop import train

    config = load_config(args.config, args.overrides)
    if args.resume and args.init_from:
        from retool.errors import ConfigError

        raise ConfigError("--resume continues a run from its own checkpoint; drop --init-from")
    run_dir = train(
        config,
        run_dir=args.run_dir,
        resume=args.resume,
        init_from=args.init_from,
        tracker=args.tracker,
        progress=not args.no_progress,
    )
    print_run(run_dir)
    return 0
