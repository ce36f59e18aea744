"""``retool rollout``: roll out a few questions and show every trajectory.

A look inside one batch without training: which trajectories called the
tool, why each ended, its tokens, reward and advantage, and the batch
metrics the training loop would log. ``--output`` writes one JSON line per
trajectory (the same record the run directory keeps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from retool.backends import open_sampling_client, service_client
from retool.backends.cleanup import close_all
from retool.cli.common import (
    PRECEDENCE,
    add_config_options,
    add_number,
    check_saved_weights,
    load_command_config,
    say,
)
from retool.data import load_dataset
from retool.data.files import check_output_file
from retool.errors import ConfigError
from retool.evaluation.models import resolve_model_spec
from retool.reward import default_checker, load_reward_function
from retool.rollout import rollout_batch
from retool.sandbox import open_sandbox


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="roll out a few questions and print every trajectory",
        description="Sample group_size trajectories for a few questions with the sandbox, "
        "score them, and print a per-trajectory table and the batch metrics. "
        f"Settings: {PRECEDENCE}; data.*, train.*, sampler.*, cost.*, demo.* and "
        "rollout.dynamic_sampling/max_oversample are not used (--dataset names the questions; "
        "a --set of one is refused).",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="alias (smollm2-135m-instruct, tiny-random), HF directory, saved sampler "
        "weights, a run directory or RUN_DIR@STEP (default: model.base_model of the config)",
    )
    parser.add_argument(
        "--dataset",
        default="demo:train",
        help="demo:train, demo:dev, demo (the test split, as for eval) or a .jsonl/.parquet file",
    )
    add_number(parser, "--questions", low=1, high=10**5, default=2, help="questions to roll out")
    add_number(
        parser,
        "--group-size",
        low=1,
        high=1024,
        help="trajectories per question (default: rollout.group_size, 8)",
    )
    add_number(
        parser, "--step", low=0, high=10**7, default=0, help="training step the seeds derive from"
    )
    parser.add_argument(
        "--no-tools", action="store_true", help="disable the code interpreter (sandbox.* unused)"
    )
    parser.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="also write one JSON line per trajectory here (default: print only)",
    )
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


_TRAIN_ONLY = "`retool rollout` samples the --questions it is given; it is a `retool train` setting"
UNUSED = {
    "data": "name the questions with --dataset",
    "train": "`retool rollout` does not train",
    "model.lora_rank": "sampling uses the weights as they are",
    "model.loss_reduction": "`retool rollout` trains nothing",
    "rollout.dynamic_sampling": _TRAIN_ONLY,
    "rollout.max_oversample": _TRAIN_ONLY,
    "rollout.drop_void": _TRAIN_ONLY,
    "sampler": "`retool rollout` samples with model.backend's own sampler; [sampler] is the "
    "RL run's engine (`retool train`)",
    "cost": "`retool rollout` keeps no spend ledger; cost.* is read by `retool train`",
}


def _model_path(spec: str, config, flag: str) -> str:
    """What the backend opens for ``--model`` (checked before anything loads)."""
    return resolve_model_spec(spec, flag=flag, backend=config.model.backend).path


ROLLOUT_KEYS = frozenset({"question_index", "group_index", "example_id", "stop_reason", "tokens"})


def check_rollout_output(output: Path, dataset: str) -> None:
    """Refuse to replace an input of this command or a file this command did not write.

    ``--output`` is replaced whole, so it may only name a new file, an empty
    one, or an earlier ``retool rollout --output`` (every line a trajectory
    record), like ``eval --output`` refuses a file that is not a results file.
    """
    if not output.exists():
        return
    source = Path(dataset)
    with contextlib.suppress(OSError):
        if source.exists() and os.path.samefile(source, output):
            raise ConfigError(
                f"--output {output}: is the --dataset this command reads; write to another file"
            )
    if not _is_rollout_file(output):
        raise ConfigError(
            f"--output {output}: exists and is not a rollout file written by "
            "`retool rollout --output` (replacing it would lose it); choose another file "
            "or delete it first"
        )


def _is_rollout_file(path: Path) -> bool:
    """Empty, or every line a trajectory record."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return False
    except OSError as exc:
        raise ConfigError(f"--output {path}: cannot read it ({exc.strerror})") from None
    for line in filter(str.strip, lines):
        try:
            record = json.loads(line)
        except ValueError:
            return False
        if not isinstance(record, dict) or not record.keys() >= ROLLOUT_KEYS:
            return False
    return True


def run(args: argparse.Namespace) -> int:
    unused = dict(UNUSED)
    if args.no_tools:
        unused["sandbox"] = "--no-tools runs no code"
    flags = [f"rollout.group_size={args.group_size}"] if args.group_size is not None else []
    config = load_command_config(args, "rollout", unused=unused, flags=flags)
    output = check_output_file(args.output, flag="--output") if args.output else None
    if output is not None:
        check_rollout_output(output, args.dataset)
    examples = load_dataset(args.dataset)
    if args.questions > len(examples):
        raise ConfigError(
            f"--questions {args.questions}: {args.dataset} has only {len(examples)} questions; "
            f"ask for at most {len(examples)}"
        )
    examples = examples[: args.questions]
    model = args.model or config.model.base_model
    path = _model_path(model, config, "--model" if args.model else "model.base_model")
    scorer = None
    if config.reward.function:
        scorer = load_reward_function(config.reward.function)

    check_saved_weights(config.model.backend, path)
    service = service_client(config.model, checkpoint_root=config.train.run_dir)
    sandbox = None if args.no_tools else open_sandbox(config.sandbox)  # its limits fail fast
    sampler = bar = None
    try:
        say(f"loading {model} ...")
        sampler = open_sampling_client(service, path)
        tokenizer = sampler.get_tokenizer()
        bar, update = _progress_bar(len(examples) * config.rollout.group_size)
        result = rollout_batch(
            sampler,
            tokenizer,
            sandbox,
            examples,
            config.rollout,
            step=args.step,
            progress=update,
            reward_timeout=config.reward.timeout,
            scorer=scorer,
            checker=None if scorer else default_checker(workers=config.reward.workers),
        )
    finally:
        close_all(bar, sampler, sandbox)  # no close or a failing one: never the error shown
    print(f"{model} on {args.dataset}: {len(examples)} questions x {config.rollout.group_size}")
    print(format_table(result))
    print()
    for name, value in result.metrics().items():
        print(f"{name:36s} {value:.4g}")
    if output is not None:
        lines = "".join(json.dumps(t.to_record()) + "\n" for t in result.trajectories)
        existed = output.exists()
        tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(lines, encoding="utf-8")
            tmp.replace(output)
        except OSError as exc:
            raise ConfigError(f"--output {output}: cannot write ({exc.strerror})") from None
        finally:
            tmp.unlink(missing_ok=True)
        replaced = " (replaced the existing file)" if existed else ""
        print(f"wrote {len(result.trajectories)} trajectories to {output}{replaced}")
    return 0
