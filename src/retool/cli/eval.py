"""``retool eval``: a benchmark sampled N times, with its uncertainty; ``eval compare``.

Two forms share one command::

    retool eval --model MODEL --dataset DATASET --output FILE.jsonl [--val-n 12]
                [--limit K] [--mode tool|text] [--temperature T] [--top-p P] [--seed S]
                [--backend local|pytrio|tinker] [--config FILE] [--set SECTION.KEY=VALUE ...]
                [--question-field F] [--answer-field F] [--id-field F]
    retool eval compare A.jsonl B.jsonl [--json]

``compare`` is an optional sub-verb (a non-required sub-parser), as in
``retool sft make-demos``. Sampling settings resolve as: the flag, then
``--set rollout.temperature=...`` / the config file, then the evaluation
defaults ``temperature = 1.0``, ``top_p = 0.7``. ``--seed`` sets ``rollout.seed``.

The sampler is ``sampler.engine``'s: ``local`` (``model.backend``'s own),
``vllm`` (an in-process engine on the model, :mod:`retool.backends.vllm.model_sampler`)
or ``auto`` (:mod:`retool.backends.vllm.choice`). Either feeds the same runner,
so rows, seeds and resume are the same code; the choice is printed, and a
vLLM evaluation's header records ``sampler`` (engine, dtype), so a file
is never resumed with the other engine (its random stream differs). A header
without ``sampler`` was sampled by ours.

Every user mistake (a missing flag, an unknown model or step, a dataset
without the named field, an output written with other settings) is a
:class:`~retool.errors.RetoolError` raised before any model loads or any
file is written, so the CLI prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retool.backends import open_sampling_client, service_client
from retool.backends.cleanup import close_all
from retool.backends.vllm import check_installed, engine_options
from retool.backends.vllm.choice import choose_engine, on_gpu
from retool.cli.common import (
    PRECEDENCE,
    HelpFormatter,
    add_config_options,
    add_number,
    check_saved_weights,
    load_command_config_given,
    say,
)
from retool.config import RolloutConfig
from retool.data.files import check_output_file
from retool.errors import ConfigError
from retool.evaluation import (
    FieldNames,
    compare,
    evaluate,
    format_comparison,
    format_summary,
    load_eval_examples,
    prepare_evaluation,
    resolve_model_spec,
)
from retool.evaluation.engine import engine_settings
from retool.reward import default_checker, load_reward_function
from retool.sandbox import open_sandbox
from retool.training.run_lock import lock_output
from retool.training.ticker import keep_ticking

if TYPE_CHECKING:
    from retool.rollout.types import ProgressCallback, ProgressEvent
    from retool.types import SamplingClient

EVAL_TEMPERATURE = 1.0
EVAL_TOP_P = 0.7
EVAL_N = 12
UNUSED = {
    "rollout.group_size": "samples per problem are --val-n",
    "rollout.dynamic_sampling": "every problem is evaluated; it is a `retool train` setting",
    "rollout.max_oversample": "every problem is evaluated; it is a `retool train` setting",
    "rollout.drop_void": "every sample is scored; it is a `retool train` setting",
    "data": "name the problems with --dataset",
    "train": "`retool eval` does not train",
    "model.base_model": "name the model with --model",
    "model.lora_rank": "evaluation samples the weights as they are",
    "model.loss_reduction": "`retool eval` trains nothing",
    "rollout.advantage": "`retool eval` scores samples; advantages are for training",
    "sampler.sync": "`retool eval` samples fixed weights: nothing syncs",
    "sampler.urls": "`retool eval` samples in this process (sampler.engine = local, vllm or "
    "auto); vllm serve endpoints are `retool train`'s",
    "cost": "`retool eval` keeps no spend ledger; `retool train` and `retool sft` read cost.*",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on a benchmark (N samples per problem), or compare two results",
        formatter_class=HelpFormatter,
        description=(
            "Sample every problem N times with the rollout engine (tool mode: with the\n"
            "sandbox; text mode: no tools), write one JSON line per sample as it finishes and\n"
            "a summary: Average@N with a 95% bootstrap CI over problems, Pass@N, unbiased\n"
            "pass@k, format rate, behaviour and sandbox rates. Rerunning with the same\n"
            "--output continues where it stopped (and refuses other settings).\n"
            f"Settings: {PRECEDENCE}. Not used (refused with --set): rollout.group_size\n"
            "(--val-n), data.* (--dataset), train.*, model.base_model (--model),\n"
            "model.lora_rank, sampler.sync, sampler.urls, cost.*, demo.*, and sandbox.* in text\n"
            "mode. sampler.engine = vllm samples with vLLM in this process (the same rows and\n"
            "resume), auto picks vLLM where it is installed and faster on this host."
        ),
        epilog=(
            "examples:\n"
            "  retool eval --model tiny-random --dataset demo --val-n 4 --output base.jsonl\n"
            "  retool eval --model runs/demo@20 --dataset aime2025/ --mode text --output b.jsonl\n"
            "  retool eval compare base.jsonl b.jsonl\n\n"
            "MODEL: an alias (smollm2-135m-instruct, tiny-random), an HF directory, saved sampler\n"
            "weights, a run directory (its latest checkpoint) or RUN_DIR@STEP.\n"
            "DATASET: demo (test split), demo:dev, demo:train, a .jsonl/.parquet file with\n"
            "question/problem and answer fields, or a datasets save_to_disk directory."
        ),
    )
    parser.add_argument("--model", help="the model to evaluate (required; see below)")
    parser.add_argument(
        "--backend",
        choices=["local", "pytrio", "tinker"],
        help="overrides model.backend (default: model.backend of the config, local)",
    )
    parser.add_argument("--dataset", help="the problems (required; see below)")
    parser.add_argument("--output", metavar="FILE.jsonl", help="the results file (required)")
    add_number(parser, "--val-n", low=1, high=1024, help=f"samples per problem (default: {EVAL_N})")
    add_number(
        parser,
        "--limit",
        low=1,
        high=10**7,
        metavar="K",
        help="only the first K problems (default: all)",
    )
    parser.add_argument(
        "--mode",
        choices=["tool", "text"],
        help="tool: with the code interpreter; text: no tools, the text-only baseline "
        "(default: tool)",
    )
    add_number(
        parser,
        "--temperature",
        low=0,
        high=100,
        integer=False,
        help="sampling temperature (default: rollout.temperature when the config or --set "
        f"gives it, else {EVAL_TEMPERATURE})",
    )
    add_number(
        parser,
        "--top-p",
        low=0,
        high=1,
        low_open=True,
        integer=False,
        help=f"nucleus mass (default: rollout.top_p when given, else {EVAL_TOP_P})",
    )
    add_number(
        parser, "--seed", low=0, high=2**32 - 1, help="sampling seed (default: rollout.seed, 42)"
    )
    add_config_options(parser)
    parser.add_argument("--question-field", help="question field (default: question, problem)")
    parser.add_argument("--answer-field", help="answer field (default: answer)")
    parser.add_argument("--id-field", help="id field (default: id, else the row index)")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (the summary only)"
    )
    parser.set_defaults(handler=run)

    verbs = parser.add_subparsers(dest="verb", metavar="{compare}", required=False)
    comp = verbs.add_parser(
        "compare",
        help="paired comparison of two results files on the same problems",
        description="Compare B against A on the problems complete in both files (same N): "
        "the difference in Average@N (B - A) with a paired bootstrap CI over problems, a "
        "sign-flip permutation p-value (exact up to 20 differing problems), and the problems "
        "solved (any correct sample) by one and not the other.",
    )
    comp.add_argument("a", metavar="A.jsonl", help="the baseline results")
    comp.add_argument("b", metavar="B.jsonl", help="the results compared against it")
    comp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    comp.set_defaults(handler=run_compare)


def _flags(args: argparse.Namespace) -> list[str]:
    """Overrides standing for the flags: applied last, they win."""
    overrides = []
    if args.temperature is not None:
        overrides.append(f"rollout.temperature={args.temperature!r}")
    if args.top_p is not None:
        overrides.append(f"rollout.top_p={args.top_p!r}")
    if args.seed is not None:
        overrides.append(f"rollout.seed={args.seed}")
    if args.backend is not None:
        overrides.append(f'model.backend="{args.backend}"')
    return overrides


def _sampling(rollout: RolloutConfig, given: frozenset[str]) -> RolloutConfig:
    """The evaluation's own sampling defaults, where no file, ``--set`` or flag gave the key."""
    temperature = rollout.temperature if "rollout.temperature" in given else EVAL_TEMPERATURE
    top_p = rollout.top_p if "rollout.top_p" in given else EVAL_TOP_P
    return dataclasses.replace(rollout, temperature=temperature, top_p=top_p)


def _dataset_key(spec: str) -> str:
    if spec == "demo" or spec.startswith("demo:"):
        return spec
    return str(Path(spec).expanduser().resolve())


def _progress_bar(total: int, done: int, disable: bool) -> tuple[Any, ProgressCallback]:
    """A tqdm bar (tqdm's own object: ``Any``) and the progress callback that moves it."""
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        initial=done,
        unit="sample",
        desc="eval",
        file=sys.stderr,
        disable=True if disable else None,
    )
    keep_ticking(bar, say_waiting=True)  # a straggler decoding is not a hang

    def update(event: ProgressEvent) -> None:
        if not event.reused:
            bar.update(event.count)
            bar.set_postfix_str(str(event.stop_reason))

    return bar, update


def run(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--model", args.model),
        ("--dataset", args.dataset),
        ("--output", args.output),
    ):
        if not value:
            raise ConfigError(f"{flag} is required (see `retool eval --help`)")
    n = args.val_n or EVAL_N
    mode = args.mode or "tool"
    tools = mode == "tool"
    unused = dict(UNUSED)
    if not tools:
        unused["sandbox"] = "--mode text runs no code"
    config, given = load_command_config_given(args, "eval", unused=unused, flags=_flags(args))
    output = check_output_file(args.output, flag="--output")
    lock_output(output, "--output")  # a second `retool eval` on this file refuses at once
    fields = FieldNames(args.question_field, args.answer_field, args.id_field)
    examples = load_eval_examples(args.dataset, fields, args.limit)
    model = resolve_model_spec(args.model, backend=config.model.backend)
    named = model.kind in ("alias", "service")
    settings: dict[str, Any] = {
        "model": model.path if named else str(Path(model.path).resolve()),
        "model_kind": model.kind,
        "checkpoint_step": model.step,
        "backend": config.model.backend,
        "dataset": _dataset_key(args.dataset),
        "fields": fields.to_dict(),
        "limit": args.limit,
        "reward": {"function": config.reward.function, "timeout": config.reward.timeout},
    }
    if tools:
        sandbox_config = config.sandbox
        settings["sandbox"] = {
            "timeout": sandbox_config.timeout,
            "memory_mb": sandbox_config.memory_mb,
            "max_output_bytes": sandbox_config.max_output_bytes,
        }
    # the vLLM engine's wrappers (numpy, the token conversions): once the input passed
    from retool.backends.vllm.model_sampler import (
        check_head_size,
        open_model_sampler,
        source_config,
    )

    choice = choose_engine(
        config.sampler.engine,
        backend=config.model.backend,
        model_path=model.path,
        dtype=config.sampler.dtype,
    )
    if choice.engine == "vllm":
        check_installed()
        check_head_size(args.model, source_config(model.path), on_gpu())
    settings.update(engine_settings(choice.engine, config.sampler.dtype))
    rollout = _sampling(config.rollout, given)
    # Refuse other settings before loading anything.
    evaluation = prepare_evaluation(
        examples, rollout, n=n, output=output, settings=settings, tools=tools, seed_step=0
    )

    scorer = load_reward_function(config.reward.function) if config.reward.function else None
    check_saved_weights(config.model.backend, model.path)
    # a service checks its credential here, before "loading" (vLLM needs no service)
    service = (
        service_client(config.model, checkpoint_root=config.train.run_dir)
        if choice.engine == "local"
        else None
    )
    sandbox = open_sandbox(config.sandbox) if tools else None  # its limits fail fast
    sampler: SamplingClient | None = None
    bar = None
    try:
        say(f"loading {args.model} ...")
        if config.sampler.engine != "local":
            say(choice.line())
        if choice.engine == "vllm" and config.sampler.url_list:  # only a file can name them
            say("sampler.urls (vllm serve, `retool train`'s) unused: eval samples in process")
        if service is None:
            sampler = open_model_sampler(
                model.path, engine_options(config), Path(tempfile.gettempdir()) / "retool-vllm"
            )
        else:
            sampler = open_sampling_client(service, model.path)
        resume = evaluation.resume
        done = len(resume.done)
        if done:
            say(
                f"resuming {output}: {done} of {len(examples)} problems done"
                + (f", {resume.discarded} partial samples discarded" if resume.discarded else "")
            )
        bar, update = _progress_bar(len(examples) * n, done * n, args.no_progress)
        summary = evaluate(
            sampler,
            sampler.get_tokenizer(),
            sandbox,
            evaluation,
            progress=update,
            reward_timeout=config.reward.timeout,
            scorer=scorer,
            checker=None if scorer else default_checker(workers=config.reward.workers),
        )
    finally:
        close_all(bar, sampler, sandbox)  # no close or a failing one: never the error shown
    step = f" (step {model.step})" if model.step is not None else ""
    print(f"{args.model}{step} on {args.dataset}, {mode} mode: {len(examples)} problems")
    print(format_summary(summary))
    print(f"wrote {summary.samples} samples and the summary to {output}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    evaluation_flags = {
        "--model": args.model,
        "--backend": args.backend,
        "--dataset": args.dataset,
        "--output": args.output,
        "--limit": args.limit,
        "--temperature": args.temperature,
        "--top-p": args.top_p,
        "--seed": args.seed,
        "--config": args.config,
        "--set": args.overrides,
        "--question-field": args.question_field,
        "--answer-field": args.answer_field,
        "--id-field": args.id_field,
        "--val-n": args.val_n,
        "--mode": args.mode,
    }
    given = [flag for flag, value in evaluation_flags.items() if value not in (None, [])]
    if given:
        raise ConfigError(f"{given[0]} belongs to `retool eval`, not to `retool eval compare`")
    result = compare(args.a, args.b)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_comparison(result))
    return 0
