"""``retool train``: reinforcement learning with the code interpreter (the ReTool step loop).

Everything that can be checked without a model is checked before one loads
(:func:`preflight`): the config, the run directory, ``--init-from``, the
training and evaluation data, the reward function and the tracker. A failure
after the run directory was created but before the first step removes that
directory again (:func:`~retool.cli.common.run_dir_rollback`), so a retry
starts clean.
"""

from __future__ import annotations

import argparse

from retool.cli.common import (
    PRECEDENCE,
    add_config_options,
    add_run_options,
    check_run_dir,
    check_tracker,
    load_command_config,
    print_run,
    run_dir_rollback,
    set_keys,
)
from retool.config import RunConfig
from retool.errors import ConfigError
from retool.training.run_dir import check_run_dir_free, released, resolve_checkpoint


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="RL training with the code interpreter",
        description="Roll out questions with the sandbox, score them, and update the policy "
        "with PPO on group-centred advantages; one optimizer step per training step. "
        "The run directory is resumable after a crash or kill (--resume); Ctrl-C or SIGTERM "
        "saves a checkpoint of the last completed step and exits 130/143. "
        f"Settings: {PRECEDENCE}.",
    )
    add_config_options(parser)
    add_run_options(parser)
    parser.set_defaults(handler=run)


def preflight(args: argparse.Namespace, config: RunConfig) -> str:
    """Refuse what would fail after the model loads; returns the run directory."""
    if args.resume and args.init_from:
        raise ConfigError("--resume continues a run from its own checkpoint; drop --init-from")
    run_dir = args.run_dir or config.train.run_dir
    check_run_dir(
        run_dir, resume=args.resume, flag="--run-dir" if args.run_dir else "train.run_dir"
    )
    check_run_dir_free(run_dir)  # a second writer is refused before anything loads
    if args.init_from and not args.resume:
        resolve_checkpoint(args.init_from)
    check_tracker(args.tracker)
    return str(run_dir)


EVAL_KEYS = ("train.eval_dataset", "train.eval_n", "train.eval_limit")


def run(args: argparse.Namespace) -> int:
    config = load_command_config(args, "train")
    if not config.train.eval_every:
        idle = [key for key in set_keys(args) if key in EVAL_KEYS]
        if idle:
            raise ConfigError(
                f"--set {idle[0]} has no effect while train.eval_every = 0 (no evaluation "
                "during training); add --set train.eval_every=N"
            )
    run_dir = preflight(args, config)
    # here, once the settings and the run directory passed: the training stack's imports
    from retool.training.loop import RLData, train

    data = RLData.load(config)  # the data, the reward function, the evaluation set: once

    with run_dir_rollback(run_dir), released(run_dir):  # the lock goes first
        run = train(
            config,
            run_dir=run_dir,
            resume=args.resume,
            init_from=args.init_from,
            tracker=args.tracker,
            progress=not args.no_progress,
            data=data,
        )
    print_run(run)
    return 0
