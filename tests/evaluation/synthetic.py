"""Results files written by hand: known correctness per problem, every row key."""

from __future__ import annotations

import json
from pathlib import Path

from retool.evaluation.results import header_line, row_line


def make_row(pid: str, index: int, sample: int, correct: bool, **extra) -> dict:
    row = {
        "problem_id": pid,
        "problem_index": index,
        "sample_index": sample,
        "correct": correct,
        "format": True,
        "answer": "1" if correct else "2",
        "reference": "1",
        "final_text": "\\boxed{1}" if correct else "\\boxed{2}",
        "turns": 2,
        "code_calls": 1,
        "tokens": 100,
        "sampled_tokens": 40,
        "stop_reason": "answer",
        "excluded": False,
        "sandbox_calls": 1,
        "sandbox_errors": 0,
        "sandbox_timeouts": 0,
        "error": None,
        "session": 0,
        "elapsed_s": 1.0,
    }
    row.update(extra)
    return row


def write_results(path: Path, correct: dict[str, int], n: int, summary: bool = True) -> Path:
    """``correct[pid]`` of the ``n`` samples of each problem are correct."""
    rows = [
        make_row(pid, i, s, s < c) for i, (pid, c) in enumerate(correct.items()) for s in range(n)
    ]
    lines = [header_line({"n": n, "model": path.stem}), *(row_line(r) for r in rows)]
    if summary:
        lines.append(json.dumps({"summary": {}}) + "\n")
    path.write_text("".join(lines))
    return path
