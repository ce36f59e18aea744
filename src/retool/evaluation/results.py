"""The results file: a header, one line per sample, a summary line.

::

    {"settings": {...}, "format": "retool-eval/1", "created": 1764500000.0}
    {"problem_id": "demo-test-0", "problem_index": 0, "sample_index": 0, "correct": true, ...}
    ...
    {"summary": {"average_at_n": 0.42, "average_at_n_ci": [0.31, 0.53], ...}}

* The header's ``settings`` are everything that decides the samples (model,
  dataset, mode, ``n``, seeds, sampling settings, limit, budgets). A rerun with
  the same ``--output`` continues the file only when they are equal.
* Sample rows are appended (and flushed) as trajectories end, in completion
  order, not in problem order; the keys are :data:`ROW_KEYS`.
* The summary line is appended once every problem has all ``n`` samples.
  Readers take the sample rows and recompute anything they need; the summary
  is a convenience for people and plots.

Every line is ASCII: JSON escapes everything else (``\u2028``, C1 controls,
bidi overrides, lone surrogates in sample text), so no character of a model's
answer can split a line for a reader that splits on Unicode line breaks,
reorder a terminal that shows the file, or fail to encode as UTF-8. Readers
split lines on ``"\n"`` only.

Crash safety: a kill can leave a torn last line, which readers drop; any other
unparsable line is a damaged file and an error. A resumed run rewrites the
file first (to a temporary sibling, then renamed over it) with the header and
only the rows of problems that have all ``n`` samples, then appends the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retool.data.files import as_path, decode_utf8, read_bytes, write_atomic
from retool.data.longints import json_loads
from retool.errors import DataError

if TYPE_CHECKING:
    from retool.rollout.types import Trajectory

FORMAT = "retool-eval/1"

ROW_KEYS = (
    "problem_id",  # the dataset id (or row index)
    "problem_index",  # position in the evaluated list (after --limit); decides the seeds
    "sample_index",  # 0..n-1 within the problem
    "correct",  # the boxed answer matched the reference
    "format",  # a complete \boxed{} was found (valid format)
    "answer",  # the boxed answer, or null
    "reference",  # the reference answer
    "final_text",  # the last assistant text (what was scored)
    "turns",  # assistant turns
    "code_calls",  # tool results that entered the history
    "tokens",  # length of the whole trajectory (prompt, completions, observations)
    "sampled_tokens",  # tokens the model generated
    "stop_reason",  # StopReason value
    "excluded",  # ended by an infrastructure failure (counted as not correct)
    "unscored",  # the reward reached no verdict (timed out, failed): counted as not correct
    "sandbox_calls",  # code executions (including ones whose output did not fit)
    "sandbox_errors",  # executions that failed (exception, non-zero exit, timeout, limits)
    "sandbox_timeouts",  # executions stopped at the time limit
    "error",  # the infrastructure error of an excluded sample, or null
    "session",  # which run of the evaluation wrote it (0, 1, ... after resumes)
    "elapsed_s",  # seconds from the start of that session to the end of this sample
)


@dataclass(frozen=True)
class EvalResults:
    """A results file as read back."""

    path: Path
    settings: dict[str, Any]
    rows: tuple[dict[str, Any], ...]  # every sample row, in file order
    summary: dict[str, Any] | None  # the summary line, when the run finished

    @property
    def n(self) -> int:
        return int(self.settings["n"])

    def complete_problems(self) -> dict[str, list[dict[str, Any]]]:
        """Rows of the problems that have all ``n`` samples, by id, in problem order."""
        return complete_problems(self.rows, self.n)


def question_digest(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:12]


def sample_row(
    trajectory: Trajectory, problem_index: int, session: int, elapsed_s: float
) -> dict[str, Any]:
    """The row of one ended :class:`~retool.rollout.Trajectory`."""
    observations = trajectory.observations
    return {
        "problem_id": trajectory.example.id,
        "problem_index": problem_index,
        "sample_index": trajectory.group_index,
        "correct": bool(trajectory.correct),
        "format": bool(trajectory.valid_format),
        "answer": trajectory.answer,
        "reference": trajectory.example.answer,
        "final_text": trajectory.final_text,
        "turns": len(trajectory.turns),
        "code_calls": trajectory.code_calls,
        "tokens": trajectory.total_tokens,
        "sampled_tokens": trajectory.sampled_tokens,
        "stop_reason": str(trajectory.stop_reason) if trajectory.stop_reason else None,
        "excluded": bool(trajectory.excluded),
        "unscored": bool(trajectory.unscored),
        "sandbox_calls": len(observations),
        "sandbox_errors": sum(not o.ok for o in observations),
        "sandbox_timeouts": sum(o.error_kind == "timeout" for o in observations),
        "error": trajectory.error,
        "session": session,
        "elapsed_s": round(elapsed_s, 3),
    }


def _lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Parsed lines with their numbers; a torn last line is dropped."""
    data = read_bytes(path, what="results file", limit=2**31)
    whole = data.rfind(b"\n") + 1  # a torn tail may end inside a UTF-8 character
    text = decode_utf8(data[:whole], str(path)) + data[whole:].decode("utf-8", "replace")
    lines = text.split("\n")
    out = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json_loads(line)
        except json.JSONDecodeError:
            if i == last and not text.endswith("\n"):
                break  # killed mid-write
            raise DataError(
                f"{path}:{i + 1}: not valid JSON; the results file is damaged"
            ) from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{i + 1}: expected a JSON object")
        out.append((i + 1, record))
    return out


def check_row_types(record: Mapping[str, Any], where: str) -> None:
    """A sample row's fields of the types evaluation writes; a ``"correct": "false"`` (a
    string, truthy) would otherwise count as correct."""
    checks = (  # (key, type, in words, required: older files' rows lack the last two)
        ("correct", bool, "true or false", True),
        ("sample_index", int, "an integer", True),
        ("problem_id", (str, int), "a string", True),
        ("problem_index", int, "an integer", False),
        ("session", int, "an integer", False),
        ("unscored", bool, "true or false", False),
    )
    for key, kind, words, required in checks:
        if not required and key not in record:
            continue
        value = record.get(key)
        wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if wrong:
            raise DataError(
                f"{where}: field {key!r} must be {words}, got {value!r:.40}; the results file "
                "is damaged (rerun the evaluation into a new --output)"
            )


def load_results(path: str | os.PathLike[str]) -> EvalResults:
    """Read a results file written by :func:`retool.evaluation.evaluate` (torn tail tolerated)."""
    path = as_path(path, "load_results(path)")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a results .jsonl file")
    lines = _lines(path)
    if not lines or not isinstance(lines[0][1].get("settings"), dict):
        raise DataError(f"{path}: not a retool eval results file (no settings header)")
    settings = lines[0][1]["settings"]
    if not isinstance(settings.get("n"), int) or settings["n"] < 1:
        raise DataError(f"{path}: the settings header has no sample count n")
    rows = []
    summary = None
    for number, record in lines[1:]:
        if "summary" in record:
            summary = record["summary"]
            continue
        if not {"problem_id", "sample_index", "correct"} <= set(record):
            raise DataError(
                f"{path}:{number}: not a sample row (needs problem_id, sample_index, correct)"
            )
        check_row_types(record, f"{path}:{number}")
        rows.append(record)
    return EvalResults(path, settings, tuple(rows), summary)


def complete_problems(rows: Iterable[Mapping[str, Any]], n: int) -> dict[str, list[dict[str, Any]]]:
    """Rows of problems with samples ``0..n-1`` all present (the last row of each wins),
    by problem id, ordered by ``problem_index`` (then id)."""
    by_problem: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_problem.setdefault(str(row["problem_id"]), {})[int(row["sample_index"])] = dict(row)
    complete = {
        pid: [samples[s] for s in range(n)]
        for pid, samples in by_problem.items()
        if set(samples) == set(range(n))
    }
    order = sorted(complete, key=lambda pid: (int(complete[pid][0].get("problem_index", 0)), pid))
    return {pid: complete[pid] for pid in order}


def header_line(settings: Mapping[str, Any]) -> str:
    return json.dumps({"settings": settings, "format": FORMAT, "created": time.time()}) + "\n"


def row_line(row: Mapping[str, Any]) -> str:
    """One sample row as an ASCII JSON line (see the module docstring)."""
    return json.dumps(row, ensure_ascii=True) + "\n"


def write_lines_atomic(path: Path, lines: Sequence[str]) -> None:
    """Replace ``path`` with ``lines`` in UTF-8 (:func:`retool.data.files.write_atomic`)."""
    write_atomic(path, "".join(lines).encode("utf-8"))
