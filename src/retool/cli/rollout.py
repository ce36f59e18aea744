"""``retool rollout``: roll out a few questions and show every trajectory.

A look inside one batch without training: which trajectories called the
tool, why each ended, its tokens, reward and advantage, and the batch
metrics the training loop would log. ``--output`` writes one JSON line per
trajectory (the same record the run directory keeps).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from retool.cli.common import add_config_options
from retool.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="roll out a few questions and print every trajectory",
        description="Sample group_size trajectories for a few questions with the sandbox, "
        "score them, and print a per-trajectory table and the batch metrics.",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="alias (smollm2-135m-instruct, tiny-random), HF directory or saved sampler "
        "weights (default: model.base_model of the config)",
    )
    parser.add_argument(
        "--dataset",
        default="demo:train",
        help="demo[:train|dev|test] or a .jsonl/.parquet file (default demo:train)",
    )
    parser.add_argument("--questions", type=int, default=2, help="questions (default 2)")
    parser.add_argument("--group-size", type=int, default=None, help="overrides rollout.group_size")
    parser.add_argument("--step", type=int, default=0, help="training step for the seeds")
    parser.add_argument("--no-tools", action="store_true", help="disable the code interpreter")
    parser.add_argument("--output", help="write one JSON line per trajectory here")
    add_config_options(parser)
    parser.set_defaults(handler=run)


def _progress_bar(total: int):
    from tqdm import tqdm

    bar = tqdm(total=total, unit="traj", desc="rollout", file=sys.stderr, disable=None)

    def update(event) -> None:
        bar.update(event.count)
        bar.set_postfix_str(str(event.stop_reason))

    return bar, update


def format_table(result) -> str:
    """One row per trajectory."""
    header = ("question", "group", "stop", "turns", "calls", "tokens", "reward", "advantage")
    rows = [
        (
            str(t.question_index),
            str(t.group_index),
            str(t.stop_reason),
            str(len(t.turns)),
            str(t.code_calls),
            str(t.total_tokens),
            f"{t.reward:+.0f}",
            f"{t.advantage:+.3f}",
        )
        for t in result.trajectories
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from retool.backends import open_sampling_client, open_sandbox, service_client
    from retool.config import load_config
    from retool.data import load_dataset
    from retool.rollout import rollout_batch

    overrides = list(args.overrides)
    if args.group_size is not None:
        overrides.append(f"rollout.group_size={args.group_size}")
    config = load_config(args.config, overrides)
    if args.questions < 1:
        raise ConfigError(f"--questions must be >= 1, got {args.questions}")
    if args.step < 0:
        raise ConfigError(f"--step must be >= 0, got {args.step}")
    output = Path(args.output) if args.output else None
    if output is not None and output.is_dir():
        raise ConfigError(f"--output {output}: is a directory")
    examples = load_dataset(args.dataset)[: args.questions]
    model = args.model or config.model.base_model
    service = service_client(config.model, checkpoint_root=config.train.run_dir)
    sampler = open_sampling_client(service, model)
    tokenizer = sampler.get_tokenizer()
    bar, update = _progress_bar(len(examples) * config.rollout.group_size)
    sandbox = None
    try:
        if not args.no_tools:
            sandbox = open_sandbox(config.sandbox)
        result = rollout_batch(
            sampler,
            tokenizer,
            sandbox,
            examples,
            config.rollout,
            step=args.step,
            progress=update,
            reward_timeout=config.reward.timeout,
        )
    finally:
        bar.close()
        if sandbox is not None:
            sandbox.close()
        sampler.close()
    print(f"{model} on {args.dataset}: {len(examples)} questions x {config.rollout.group_size}")
    print(format_table(result))
    print()
    for name, value in result.metrics().items():
        print(f"{name:36s} {value:.4g}")
    if output is not None:
        lines = "".join(json.dumps(t.to_record()) + "\n" for t in result.trajectories)
        tmp = output.with_name(output.name + ".tmp")
        try:
            tmp.write_text(lines, encoding="utf-8")
            tmp.replace(output)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ConfigError(f"--output {output}: cannot write ({exc.strerror})") from None
        print(f"wrote {len(result.trajectories)} trajectories to {output}")
    return 0
