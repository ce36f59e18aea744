"""``retool train``: reinforcement learning with the code interpreter (the ReTool step loop)."""

from __future__ import annotations

import argparse


def add_common(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``train`` and ``sft``."""
    parser.add_argument("--config", help="a TOML config file (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
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


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="RL training with the code interpreter",
        description="Roll out questions with the sandbox, score them, and update the policy "
        "with PPO on group-centred advantages; one optimizer step per training step. "
        "The run directory is resumable after a crash or kill (--resume).",
    )
    add_common(parser)
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
    print(f"run directory: {run_dir.path}")
    last = run_dir.last_checkpoint()
    if last is not None:
        print(f"last checkpoint: step {last.step}, sampler weights {last.sampler_path}")
    return 0
