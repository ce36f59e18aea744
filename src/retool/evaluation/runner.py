"""Run an evaluation: ``n`` samples per problem through the rollout engine, journaled.

Two steps: :func:`prepare_evaluation` checks the settings and reads the
results file (before any model loads, so a file that cannot be continued
costs nothing); :func:`evaluate` (or :func:`evaluate_async`) then samples.
It is one rollout batch with ``group_size = n`` (advantages are
computed by the engine but mean nothing here). Each sample's row is appended
to the results file as its trajectory ends (the rollout's progress callback
fires after scoring), so a kill loses at most the samples in flight.

Resuming: the same call with the same ``output`` keeps the problems that
already have all ``n`` samples, discards the rows of partially sampled ones,
and samples only the rest. The kept problems are handed to the rollout as
``reuse`` placeholders, so every remaining problem keeps its position in the
batch and therefore its sampling seeds: a resumed evaluation draws the same
random numbers an uninterrupted one would have. Samples are seeded by the
rollout seed, ``seed_step`` (the ``step`` of the rollout) and the problem's
position, so the same settings give the same samples, up to the sampling
engine's caveat: a row's logits can differ in their last bits when the rows
decoded beside it differ (a resumed problem decodes beside other problems, or
alone), and a draw that lands within about 1e-7 of a token boundary then picks
the neighbouring token.

A file written with different settings is refused (one
:class:`~retool.errors.ConfigError` naming the keys that differ) before
anything is sampled or written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.checks import check_number
from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.data.files import writing
from retool.errors import ConfigError, DataError
from retool.evaluation.results import (
    complete_problems,
    header_line,
    load_results,
    row_line,
    sample_row,
    write_lines_atomic,
)
from retool.evaluation.summary import EvalSummary, summarize
from retool.reward import EquivalenceChecker, Scorer
from retool.rollout import (
    ProgressCallback,
    ProgressEvent,
    StopReason,
    Trajectory,
    check_context_limit,
    rollout_batch_async,
)
from retool.rollout.sync import synchronous
from retool.types import SamplingClient, Sandbox, Tokenizer

# Rollout fields that decide the samples (the rest are concurrency and retry knobs).
SAMPLE_DECIDING = (
    "max_code_calls",
    "max_assistant_turns",
    "max_trajectory_tokens",
    "max_assistant_tokens",
    "max_tool_response_tokens",
    "min_observation_tokens",
    "protocol",
    "share_identical_code",
)


def _problems_digest(examples: Sequence[MathExample]) -> str:
    sha = hashlib.sha256()
    for example in examples:
        sha.update(json.dumps([example.id, example.question, example.answer]).encode())
    return sha.hexdigest()[:16]


def eval_settings(
    settings: Mapping[str, Any],
    config: RolloutConfig,
    *,
    n: int,
    examples: Sequence[MathExample],
    tools: bool,
    seed_step: int = 0,
) -> dict[str, Any]:
    """The header settings: the caller's, plus what the evaluation itself decides."""
    try:
        full = json.loads(json.dumps(dict(settings)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"evaluation settings must be JSON values: {exc}") from None
    full.update(
        {
            "n": n,
            "mode": "tool" if tools else "text",
            "seed": config.seed,
            "seed_step": seed_step,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "rollout": {name: getattr(config, name) for name in SAMPLE_DECIDING},
            "problems": len(examples),
            "problems_sha256": _problems_digest(examples),
        }
    )
    return full


def _differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} ({json.dumps(a)} -> {json.dumps(b)})")
    return out


@dataclass(frozen=True)
class ResumeState:
    """What an existing results file contributes to a run with the same settings."""

    rows: tuple[dict[str, Any], ...]  # rows of the complete problems, kept
    done: frozenset[int]  # their problem positions
    discarded: int  # rows of partially sampled problems, dropped
    session: int  # the number of the session about to run


def check_resumable(output: Path, settings: Mapping[str, Any]) -> ResumeState:
    """Read ``output`` (if any) and refuse it when its settings differ from ``settings``."""
    if output.is_dir():
        raise ConfigError(f"--output {output}: is a directory")
    if not output.exists() or output.stat().st_size == 0:
        return ResumeState((), frozenset(), 0, 0)
    try:
        previous = load_results(output)
    except DataError as exc:
        raise ConfigError(
            f"--output {output} exists but cannot be continued ({exc}); choose another --output"
        ) from None
    differences = _differences(previous.settings, settings)
    if differences:
        raise ConfigError(
            f"--output {output} was written with other settings: {'; '.join(differences)}; "
            "rerun with the same settings to continue it, or choose another --output"
        )
    problems = complete_problems(previous.rows, int(settings["n"]))
    if any("problem_index" not in members[0] for members in problems.values()):
        raise ConfigError(
            f"--output {output}: its rows have no problem_index (an older results file), so "
            "which problems and seeds they cover is unknown; choose another --output"
        )
    kept = tuple(row for members in problems.values() for row in members)
    done = frozenset(int(members[0]["problem_index"]) for members in problems.values())
    session = 1 + max((int(r.get("session", 0)) for r in previous.rows), default=-1)
    return ResumeState(kept, done, len(previous.rows) - len(kept), session)


def _placeholders(example: MathExample, slot: int, n: int) -> list[Trajectory]:
    """Stand-ins for a finished group: the rollout skips the slot and keeps its seeds.

    They are never written or summarized (their rows already are in the file).
    """
    return [
        Trajectory(
            example=example,
            group_index=g,
            messages=[],
            question_index=slot,
            stop_reason=StopReason.ANSWER,
        )
        for g in range(n)
    ]


_RERUN = "rows written so far are kept: rerun the same command to continue"


class _Journal:
    """Appends one row per ended trajectory, flushed at once."""

    def __init__(self, path: Path, session: int, forward: ProgressCallback | None) -> None:
        self.path = path
        self.session = session
        self.forward = forward
        self.started = time.monotonic()
        self.written: set[tuple[int, int]] = set()
        self.rows: list[dict[str, Any]] = []
        self.handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def add(self, trajectory: Trajectory) -> None:
        key = (trajectory.question_index, trajectory.group_index)
        if key in self.written:
            return
        row = sample_row(
            trajectory, trajectory.question_index, self.session, time.monotonic() - self.started
        )
        with writing(self.path, "results row", then=_RERUN):
            self.handle.write(row_line(row))
            self.handle.flush()
        self.written.add(key)
        self.rows.append(row)

    def __call__(self, event: ProgressEvent) -> None:
        if event.trajectory is not None and not event.reused:
            self.add(event.trajectory)
        if self.forward is not None:
            self.forward(event)

    def finish(self, summary: EvalSummary) -> None:
        """The summary line, after every row: the file is complete once it is on disk."""
        with writing(self.path, "results summary", then=_RERUN):
            self.handle.flush()
            self.handle.write(json.dumps({"summary": summary.to_dict()}) + "\n")
            self.handle.flush()
            os.fsync(self.handle.fileno())

    def close(self) -> None:
        # After a failed write (a full disk) the buffer still holds that row: closing
        # retries it and would replace the error being reported with a bare OSError.
        with contextlib.suppress(OSError):
            self.handle.close()


@dataclass(frozen=True)
class PreparedEvaluation:
    """An evaluation checked before any model loads, by :func:`prepare_evaluation`."""

    examples: tuple[MathExample, ...]  # the problems, in slot order
    config: RolloutConfig  # the caller's rollout settings with ``group_size = n``
    output: Path  # the results file
    settings: dict[str, Any]  # the full header settings (:func:`eval_settings`)
    resume: ResumeState  # what ``output`` already holds for these settings
    tools: bool  # tool mode (a sandbox runs the code); text mode otherwise
    seed_step: int  # the rollout ``step`` the sampling seeds derive from

    @property
    def n(self) -> int:
        return self.config.group_size

    def reuse(self) -> dict[int, list[Trajectory]]:
        """Placeholder groups for the complete problems: the rollout skips their slots."""
        return {
            slot: _placeholders(self.examples[slot], slot, self.n)
            for slot in sorted(self.resume.done)
            if 0 <= slot < len(self.examples)
        }


def prepare_evaluation(
    examples: Sequence[MathExample],
    config: RolloutConfig,
    *,
    n: int,
    output: str | os.PathLike[str],
    settings: Mapping[str, Any],
    tools: bool,
    seed_step: int = 0,
) -> PreparedEvaluation:
    """Check an evaluation and read its results file once; load no model, write nothing.

    ``settings`` describe the run for the header (model, dataset, ...); the
    evaluation adds ``n``, the mode, the seeds, the sampling settings and
    budgets of ``config``, and a digest of the problems. A results file written
    with other settings is refused here (:func:`check_resumable`), so a caller
    that prepares first loads nothing for an evaluation it cannot continue.
    """
    check_number("--val-n", n, 1, 1024, integer=True)
    if not isinstance(config, RolloutConfig):
        raise ConfigError(f"config must be a RolloutConfig, got {type(config).__name__}")
    if not examples:
        raise ConfigError("nothing to evaluate: the problem list is empty")
    config = dataclasses.replace(config, group_size=n)
    full = eval_settings(settings, config, n=n, examples=examples, tools=tools, seed_step=seed_step)
    output = Path(output)
    resume = check_resumable(output, full)
    return PreparedEvaluation(tuple(examples), config, output, full, resume, tools, seed_step)


async def evaluate_async(
    sampling_client: SamplingClient,
    tokenizer: Tokenizer,
    sandbox: Sandbox | None,
    evaluation: PreparedEvaluation,
    *,
    progress: ProgressCallback | None = None,
    reward_timeout: float = 5.0,
    scorer: Scorer | None = None,
    checker: EquivalenceChecker | None = None,
) -> EvalSummary:
    """Sample every problem of ``evaluation`` ``n`` times, write its file, return the summary.

    ``sandbox`` is the tool mode's interpreter and ``None`` in text mode (as
    prepared). ``progress`` receives the rollout's events (after each row is
    written). ``reward_timeout``, ``scorer`` and ``checker`` go to the
    rollout's scoring as in training. The header (and the kept rows of a
    resumed file) are written once the sampler's context limit is known to fit.
    """
    if evaluation.tools != (sandbox is not None):
        raise ValueError("a tool-mode evaluation needs a sandbox, a text-mode one sandbox=None")
    config, output = evaluation.config, evaluation.output
    check_context_limit(config, sampling_client.max_context_tokens, "the sampler")
    output.parent.mkdir(parents=True, exist_ok=True)
    kept = evaluation.resume.rows
    with writing(output, "results file", then="nothing was written"):
        write_lines_atomic(output, [header_line(evaluation.settings), *(row_line(r) for r in kept)])
    reuse = evaluation.reuse()
    journal = _Journal(output, evaluation.resume.session, progress)
    try:
        if len(reuse) < len(evaluation.examples):
            result = await rollout_batch_async(
                sampling_client,
                tokenizer,
                sandbox,
                evaluation.examples,
                config,
                step=evaluation.seed_step,
                progress=journal,
                reward_timeout=reward_timeout,
                reuse=reuse,
                scorer=scorer,
                checker=checker,
            )
            # A question whose first prompt is too long sends no event; its rows come from here.
            for trajectory in result.trajectories:
                if trajectory.question_index not in reuse:
                    journal.add(trajectory)
        summary = summarize([*kept, *journal.rows], evaluation.n)
        journal.finish(summary)
        return summary
    finally:
        journal.close()


evaluate = synchronous(evaluate_async)
