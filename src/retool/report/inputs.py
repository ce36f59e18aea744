"""What a report reads: a run directory and ``retool eval`` result files.

Everything here is read-only and forgiving about *content* (a metric that a run
never wrote, a torn last line, an eval file without a summary yet) but strict
about *identity*: a directory that is not a run directory, or a file that is
not an eval result, is a :class:`ReportError` with one line that says what was
expected, raised before anything is written.

Eval files (written by ``retool eval``, built separately) are read by these
names only, each looked up defensively (a missing key is shown as "-")::

    {"settings": {"model": ..., ...}}                  first line
    {"problem_id": ..., "sample_index": ..., "correct": ..., "format": ...,
     "turns": ..., "code_calls": ..., "tokens": ..., "stop_reason": ...}   one per sample
    {"summary": {"average_at_n": ..., "average_at_n_ci": [low, high],
                 "pass_at_n": ..., "format_rate": ..., "n": ...}}        last line

Rates are fractions in [0, 1]; ``pass_at_n_ci`` and ``format_rate_ci`` are
shown when present. A file with a settings line and sample rows but no usable
summary (an evaluation still running, or killed) is accepted: its summary is
recomputed from the rows (with ``retool.evaluation``'s ``summarize`` when
available, else plainly and without intervals), and the page says so. A file
with neither a settings nor a summary line is not an eval file.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retool.data.files import read_bytes
from retool.data.longints import json_loads, toml_loads
from retool.errors import ConfigError, DataError, RetoolError
from retool.evaluation.results import check_row_types
from retool.evaluation.summary import summarize
from retool.training.run_dir import RunDirectory


class ReportError(RetoolError, ValueError):
    """A report input is not what it should be (not a run directory, not an eval file...)."""


@dataclass
class RunInputs:
    """One run directory's files, parsed."""

    path: Path
    config_text: str  # config.toml verbatim ("" when absent)
    config: dict[str, Any]  # config.toml parsed ({} when absent or unparsable)
    metrics: list[dict[str, Any]]  # metrics.jsonl, one dict per completed step
    rollout_steps: list[int]  # steps that have a rollouts/step_*.jsonl.gz file
    notes: list[str] = field(default_factory=list)  # problems worth showing on the page

    @property
    def base_model(self) -> str | None:
        model = self.config.get("model", {})
        value = model.get("base_model") if isinstance(model, dict) else None
        return value if isinstance(value, str) and value else None

    @property
    def protocol(self) -> str | None:
        rollout = self.config.get("rollout", {})
        value = rollout.get("protocol") if isinstance(rollout, dict) else None
        return value if isinstance(value, str) and value else None


def load_run(path: str | os.PathLike[str]) -> RunInputs:
    """Read a run directory; raises :class:`ReportError` if ``path`` is not one."""
    root = Path(path)
    if not root.exists():
        raise ReportError(f"run directory {root}: no such directory")
    if not root.is_dir():
        raise ReportError(f"run directory {root}: is a file, not a run directory")
    run = RunDirectory(root)
    notes: list[str] = []
    config_text, config = "", {}
    if run.config_path.is_file():
        try:
            config_text = run.config_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ReportError(f"{run.config_path}: cannot read it ({exc.strerror})") from None
        try:
            config = toml_loads(config_text, str(run.config_path))
        except (tomllib.TOMLDecodeError, ConfigError) as exc:  # ConfigError: a 5000-digit int
            notes.append(f"config.toml could not be parsed ({exc}); shown verbatim")
    # A run directory has a metrics file, rollouts or a manifest once a step or checkpoint
    # is done, and from the start a config.toml with every section (a lone config.toml of
    # some other program is not enough).
    started = isinstance(config.get("model"), dict) and isinstance(config.get("train"), dict)
    if not (
        run.metrics_path.is_file()
        or run.rollouts_dir.is_dir()
        or run.manifest_path.is_file()
        or started
    ):
        raise ReportError(
            f"{root} is not a run directory (no config.toml or metrics.jsonl); "
            "pass the --run-dir of a `retool train` or `retool sft` run"
        )
    if not config_text:
        notes.append("the run directory has no config.toml")
    try:
        metrics = [m for m in run.metrics() if isinstance(m, dict) and _is_number(m.get("step"))]
    except RetoolError as exc:  # a damaged line in the middle of metrics.jsonl
        raise ReportError(str(exc)) from None
    metrics.sort(key=lambda m: m["step"])
    steps = []
    if run.rollouts_dir.is_dir():
        for file in run.rollouts_dir.glob("step_*.jsonl.gz"):
            number = file.name[len("step_") : -len(".jsonl.gz")]
            if number.isdigit():
                steps.append(int(number))
    return RunInputs(root, config_text, config, metrics, sorted(steps), notes)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class EvalResult:
    """The numbers of one eval file that the report shows."""

    path: Path
    label: str  # shown in the table and the chart
    model: str | None  # settings.model
    average: float | None  # Average@N, a fraction
    average_ci: tuple[float, float] | None  # 95% interval of Average@N
    pass_at_n: float | None
    pass_ci: tuple[float, float] | None
    format_rate: float | None
    format_ci: tuple[float, float] | None
    n: int | None  # samples per problem
    problems: int | None
    samples: int  # sample rows in the file
    summary: dict[str, Any]  # the summary line as written (or as computed)
    complete: bool  # False: no summary line, numbers computed from the rows


def _count(value: Any) -> int | None:
    return int(value) if _is_number(value) else None


def _fraction(value: Any) -> float | None:
    return float(value) if _is_number(value) else None


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, list | tuple) and len(value) == 2 and all(map(_is_number, value)):
        low, high = float(value[0]), float(value[1])
        return (min(low, high), max(low, high))
    return None


def _not_eval(path: Path, why: str) -> ReportError:
    return ReportError(
        f"--eval {path}: not a `retool eval` result file ({why}); "
        "expected a settings line, one line per sample and a summary line"
    )


def load_eval_file(path: str | Path, label: str | None = None) -> EvalResult:
    """Read one ``retool eval`` output; raises :class:`ReportError` if it is not one."""
    file = Path(path)
    if not file.exists():
        raise ReportError(f"--eval {file}: no such file")
    if file.is_dir():
        raise ReportError(f"--eval {file}: is a directory, expected a .jsonl result file")

    data = read_bytes(file, flag="--eval", what="result file", error=ReportError, limit=2**31)
    try:
        # "\n" only: str.splitlines would also split a row inside a string at U+2028,
        # U+0085 or a form feed (files written before rows were ASCII-escaped hold them raw)
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        bad = data.count(b"\n", 0, exc.start) + 1
        raise _not_eval(file, f"line {bad} is not UTF-8 text") from None
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    settings: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json_loads(line)
        except (json.JSONDecodeError, RecursionError):
            if number == last and (settings is not None or rows):
                break  # a torn last line: the evaluation was killed mid-write
            raise _not_eval(file, f"line {number} is not JSON") from None
        if not isinstance(record, dict):
            raise _not_eval(file, f"line {number} is not a JSON object")
        if isinstance(record.get("settings"), dict) and settings is None:
            settings = record["settings"]
        elif isinstance(record.get("summary"), dict):
            summary = record["summary"]
        elif "correct" in record:
            try:
                check_row_types(record, f"line {number}")
            except DataError as exc:
                raise _not_eval(file, str(exc)) from None
            rows.append(record)
    if settings is None and summary is None:
        raise _not_eval(file, "no settings or summary line")
    model = (settings or {}).get("model")
    model = str(model) if model is not None else None
    complete = summary is not None and _is_number(summary.get("average_at_n"))
    if not complete and rows:
        summary = _summary_from_rows(rows, (settings or {}).get("n"))
    summary = summary or {}
    if not rows and summary.get("n") is None:
        raise _not_eval(file, "no samples and no summary")
    n = summary.get("n")
    problems = summary.get("problems", summary.get("num_problems"))
    if problems is None and rows:
        problems = len({str(r.get("problem_id")) for r in rows})
    return EvalResult(
        path=file,
        label=label or file.stem,
        model=model,
        average=_fraction(summary.get("average_at_n")),
        average_ci=_interval(summary.get("average_at_n_ci")),
        pass_at_n=_fraction(summary.get("pass_at_n")),
        pass_ci=_interval(summary.get("pass_at_n_ci")),
        format_rate=_fraction(summary.get("format_rate")),
        format_ci=_interval(summary.get("format_rate_ci")),
        n=_count(n),
        problems=_count(problems),
        samples=len(rows),
        summary=summary,
        complete=complete,
    )


def _summary_from_rows(rows: Sequence[dict[str, Any]], n: Any) -> dict[str, Any]:
    """The summary of an unfinished file, recomputed from its rows.

    ``retool eval``'s own ``summarize`` (problems with all ``n`` samples, with
    bootstrap intervals) when it is importable and accepts the rows; otherwise
    a plain computation over every row, without intervals.
    """
    if _is_number(n) and n >= 1:
        try:
            return dict(summarize(rows, int(n)).to_dict())
        except Exception:  # another version's format: fall back to the plain numbers
            pass
    return _plain_summary(rows)


def _plain_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Average@N, Pass@N and format rate over every row (no intervals)."""
    by_problem: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_problem[str(row.get("problem_id"))].append(row)
    if not by_problem:
        return {}
    problems = list(by_problem.values())
    correct = [[bool(r.get("correct")) for r in p] for p in problems]
    formats = [bool(r.get("format")) for p in problems for r in p]
    return {
        "average_at_n": sum(sum(c) / len(c) for c in correct) / len(correct),
        "pass_at_n": sum(any(c) for c in correct) / len(correct),
        "format_rate": sum(formats) / len(formats),
        "n": max(len(p) for p in problems),
        "problems": len(problems),
    }


def unique_labels(paths: Sequence[Path]) -> list[str]:
    """File stems, made unique with the parent directory's name where two collide."""
    stems = [p.stem for p in paths]
    labels = []
    for path, stem in zip(paths, stems, strict=True):
        labels.append(f"{path.parent.name}/{stem}" if stems.count(stem) > 1 else stem)
    seen: dict[str, int] = {}
    out = []
    for label in labels:  # still equal (same parent name): number them
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
