"""``retool sft``: cold-start supervised fine-tuning, and writing its demonstrations.

Two forms share one command::

    retool sft make-demos --dataset demo[:split] --output FILE [--limit N] [--seed S]
    retool sft [--config FILE] --data FILE.jsonl [--set SECTION.KEY=VALUE ...]
               [--run-dir DIR] [--resume] [--init-from CHECKPOINT] [--tracker NAME]

``make-demos`` is an optional sub-verb (a non-required sub-parser), so
``retool sft --help`` documents training and lists the verb, and
``retool sft make-demos --help`` documents the verb alone. The training form
hands the resolved config and the data path to
:func:`retool.training.sft.run_sft`, which writes the same run directory and
checkpoints as ``retool train`` and resumes the same way.

Every user mistake (missing ``--data``, an output that is a directory, an
unknown split, ``--limit 0``, a ``--set`` of a key SFT does not read) is a
:class:`~retool.errors.RetoolError` checked before any work starts, so the CLI
prints one line, exits 2 and writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retool.cli.common import (
    PRECEDENCE,
    HelpFormatter,
    add_config_options,
    add_number,
    add_run_options,
    load_command_config,
    print_run,
    run_dir_rollback,
)
from retool.cli.train import preflight
from retool.config import load_config
from retool.data.demo import HELD_OUT_SPLITS, demo_problems
from retool.data.files import check_output_file
from retool.errors import ConfigError, DataError
from retool.sandbox import open_sandbox
from retool.training.run_dir import released
from retool.training.sft_data import (
    FAILURE_SHARE,
    TRAIN_FAILED_CALLS,
    load_conversations,
    make_demonstrations,
    write_conversations,
)

_RL_ONLY = "`retool sft` trains on demonstrations; this is an RL setting (`retool train`)"
UNUSED = {
    "sandbox": "`retool sft` runs no code (`retool sft make-demos` does, with defaults)",
    "reward": "`retool sft` scores nothing",
    "sampler": "`retool sft` samples nothing; [sampler] is the RL run's engine (`retool train`)",
    "data.train": "the conversations are --data",
    "data.dev": _RL_ONLY,
    **{f"train.{key}": _RL_ONLY for key in ("loss", "clip_low", "clip_high", "updates_per_step")},
    **{f"train.{k}": _RL_ONLY for k in ("old_logprobs", "rollout_correction_cap")},
    "train.rollout_correction": _RL_ONLY,
    **{f"train.{key}": _RL_ONLY for key in ("eval_every", "eval_dataset", "eval_n")},
    **{f"train.{key}": _RL_ONLY for key in ("eval_limit", "eval_at_start")},
    **{
        f"rollout.{key}": "SFT samples nothing; only rollout.protocol (the dialect) and "
        "rollout.max_trajectory_tokens (<= train.max_train_tokens) are read"
        for key in (
            "group_size",
            "max_code_calls",
            "max_assistant_turns",
            "max_assistant_tokens",
            "max_tool_response_tokens",
            "temperature",
            "top_p",
            "seed",
            "min_observation_tokens",
            "max_in_flight_samples",
            "max_in_flight_tools",
            "sample_retries",
            "sandbox_retries",
            "retry_backoff",
            "advantage",
            "share_identical_code",
            "dynamic_sampling",
            "max_oversample",
            "drop_void",
        )
    },
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sft",
        help="cold-start SFT on code-interlaced conversations (or make demonstrations)",
        formatter_class=HelpFormatter,
        description=(
            "Supervised fine-tuning with cross_entropy on code-interlaced conversations\n"
            "(JSONL, see retool.training.sft_data), weight 1 on assistant tokens only,\n"
            "rendered through the tool-call dialect exactly as RL samples them. Reads the\n"
            "config of `retool train`: train.steps, train.learning_rate, train.save_every,\n"
            "train.run_dir, and train.questions_per_batch as conversations per step.\n"
            f"Settings: {PRECEDENCE}. A --set of what SFT does not read (sandbox.*,\n"
            "reward.*, sampler.*, demo.*, data.train, RL-only train.* and rollout.* keys)\n"
            "is refused."
        ),
        epilog=(
            "examples:\n"
            "  retool sft make-demos --dataset demo:train --output demos.jsonl\n"
            "  retool sft --config configs/demo.toml --data demos.jsonl --run-dir runs/sft\n"
            "  retool train --config configs/demo.toml --init-from CHECKPOINT\n\n"
            "`retool sft make-demos --help` describes the demonstration writer."
        ),
    )
    add_config_options(parser)
    parser.add_argument(
        "--data", metavar="FILE.jsonl", help="the conversations to train on (required; no default)"
    )
    add_run_options(parser)
    parser.set_defaults(handler=run_train)

    verbs = parser.add_subparsers(dest="verb", metavar="{make-demos}", required=False)
    demos = verbs.add_parser(
        "make-demos",
        help="write demonstrations from the demo dataset's reference solutions",
        description="Write one conversation per demo problem: a short varied reasoning "
        "sentence, the reference solution as a tool call, the real sandbox output, and the "
        "\\boxed{} answer. Problems whose sandbox output does not match the reference "
        "answer are skipped. The file is written atomically.",
    )
    demos.add_argument(
        "--dataset",
        default="demo:train",
        help="demo:train, demo:varied (train's problems asked more ways) or demo:dev: only "
        "the bundled demo set carries reference solutions (bare demo is the test split, "
        "held out)",
    )
    demos.add_argument("--output", required=True, metavar="FILE", help="the JSONL file to write")
    add_number(demos, "--limit", low=1, high=10**7, help="at most N problems (default: all)")
    add_number(demos, "--seed", low=0, high=2**32 - 1, default=0, help="phrasing seed")
    add_number(
        demos,
        "--failure-share",
        low=0.0,
        high=1.0,
        integer=False,
        default=FAILURE_SHARE,
        help="share of demonstrations that open with a failed call, its traceback and the fix",
    )
    demos.add_argument(
        "--failed-calls",
        choices=("train", "context"),
        default="train" if TRAIN_FAILED_CALLS else "context",
        help="train: SFT learns to write the failed first call too; context: it is shown "
        '(marked "train": false) and only the repair and the answer are learned',
    )
    demos.set_defaults(handler=run_make_demos)


def _demo_split(spec: str) -> str:
    name, _, split = spec.partition(":")
    if name != "demo":
        raise ConfigError(
            f"--dataset {spec}: make-demos needs reference solutions, which only the bundled "
            "demo dataset has (demo:train, demo:varied or demo:dev)"
        )
    if not split:
        # bare `demo` is the test split for every command (eval, rollout, data.train)
        raise ConfigError(
            "--dataset demo: bare `demo` is the demo's test split everywhere, held out for "
            "evaluation; write demonstrations from demo:train (or demo:varied, demo:dev)"
        )
    if split in ("test", *HELD_OUT_SPLITS):
        raise ConfigError(f"--dataset demo:{split}: the {split} split is held out for evaluation")
    return split


def run_make_demos(args: argparse.Namespace) -> int:
    training = {
        "--config": args.config,
        "--data": args.data,
        "--set": args.overrides,
        "--run-dir": args.run_dir,
        "--resume": args.resume,
        "--init-from": args.init_from,
        "--tracker": args.tracker,
    }
    given = [flag for flag, value in training.items() if value]
    if given:
        raise ConfigError(f"{given[0]} belongs to `retool sft` training, not to make-demos")
    output = check_output_file(args.output, flag="--output")
    split = _demo_split(args.dataset)
    problems = demo_problems(split)
    if args.limit is not None and args.limit > len(problems):
        raise ConfigError(
            f"--limit {args.limit}: demo:{split} has only {len(problems)} problems; "
            f"ask for at most {len(problems)}"
        )
    problems = problems[: args.limit]
    with open_sandbox(load_config().sandbox) as sandbox:
        conversations = make_demonstrations(
            problems,
            sandbox,
            seed=args.seed,
            failure_share=args.failure_share,
            train_failed_calls=args.failed_calls == "train",
        )
    kept = {c.id for c in conversations}
    skipped = [p.id for p in problems if p.id not in kept]
    if not conversations:
        raise DataError(
            f"no demonstration could be made: the sandbox output of all {len(problems)} "
            "reference solutions differed from the answer; check `retool sandbox check`"
        )
    existed = output.exists()
    written = write_conversations(output, conversations)
    note = f", first: {', '.join(skipped[:5])}" if skipped else ""
    repaired = sum(1 for c in conversations if c.code_calls > 1)
    print(
        f"wrote {written} conversations to {output} from demo:{split}, {repaired} of them "
        f"a failed first call and its fix "
        f"({len(skipped)} skipped: sandbox output did not match the answer{note})"
        + ("; replaced the existing file" if existed else "")
    )
    return 0


def run_train(args: argparse.Namespace) -> int:
    if args.data is None:
        raise ConfigError("--data FILE.jsonl is required (write one with `retool sft make-demos`)")
    data = Path(args.data)
    if data.is_dir():
        raise ConfigError(f"--data {data}: is a directory, expected a .jsonl file")
    if not data.exists():
        raise ConfigError(f"--data {data}: no such file")
    if not data.is_file():  # /dev/stdin on a terminal would wait silently
        raise ConfigError(f"--data {data}: not a regular file; give a .jsonl file")
    config = load_command_config(args, "sft", unused=UNUSED)
    run_dir = preflight(args, config)
    load_conversations(data)  # every line checked before a model loads
    from retool.training.sft import run_sft  # here, once the input passed: the training stack

    with run_dir_rollback(run_dir), released(run_dir):  # the lock goes first
        run = run_sft(
            config,
            data,
            run_dir=run_dir,
            resume=args.resume,
            init_from=args.init_from,
            tracker=args.tracker,
            progress=not args.no_progress,
        )
    print_run(run, then="start RL from it: retool train --init-from {run} ...")
    return 0
