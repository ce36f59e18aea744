"""``retool eval compare A B``: is B better than A on the same problems, and how sure are we?

Both files are reduced to one number per problem, its fraction of correct
samples ``p_i``. The comparison is *paired* (see
:mod:`retool.evaluation.stats`): the difference ``mean(p_B - p_A)`` (B - A),
a paired bootstrap interval over problems, and a sign-flip permutation
p-value (exact when at most 20 problems differ). The problems solved by one
(any correct sample, the pass@n sense) and not the other are listed by id.

Decisions:

* ``n`` must be equal: Average@N from different N estimate the same number,
  but pass@N does not, and a paired test of unequal precision is muddled.
  A different ``n`` is an error naming the second file.
* Problems are matched by id and compared on the **intersection** of the
  problems that have all ``n`` samples in both files; how many were left out
  of each file (not in the other, or incomplete) is reported and printed, so
  a shorter ``--limit`` or a killed run can still be compared, visibly. No
  common problem is an error.
* The same id with a different reference answer means two different datasets
  (row-index ids of two files, say): an error naming both files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from retool.data.files import as_path
from retool.errors import DataError
from retool.evaluation.results import load_results
from retool.evaluation.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CI_LEVEL,
    paired_bootstrap_ci,
    sign_flip_p_value,
)


@dataclass(frozen=True)
class ProblemPair:
    """One problem in both files."""

    problem_id: str
    correct_a: int  # correct samples of n in A
    correct_b: int  # correct samples of n in B


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of two results files (B - A)."""

    a: str
    b: str
    n: int
    problems: int  # compared (complete in both)
    left_out_a: int  # problems of A not compared (missing or incomplete in B, or in A)
    left_out_b: int
    average_at_n_a: float
    average_at_n_b: float
    difference: float  # Average@N of B minus that of A, on the compared problems
    difference_ci: tuple[float, float]
    p_value: float  # two-sided, sign-flip permutation over problems
    p_value_method: str  # exact | monte_carlo
    pass_at_n_a: float
    pass_at_n_b: float
    solved_only_by_a: tuple[str, ...]
    solved_only_by_b: tuple[str, ...]
    pairs: tuple[ProblemPair, ...] = field(default=())
    ci_level: float = CI_LEVEL
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "n": self.n,
            "problems": self.problems,
            "left_out_a": self.left_out_a,
            "left_out_b": self.left_out_b,
            "average_at_n_a": self.average_at_n_a,
            "average_at_n_b": self.average_at_n_b,
            "difference": self.difference,
            "difference_ci": list(self.difference_ci),
            "p_value": self.p_value,
            "p_value_method": self.p_value_method,
            "pass_at_n_a": self.pass_at_n_a,
            "pass_at_n_b": self.pass_at_n_b,
            "solved_only_by_a": list(self.solved_only_by_a),
            "solved_only_by_b": list(self.solved_only_by_b),
            "per_problem": [
                {"problem_id": p.problem_id, "correct_a": p.correct_a, "correct_b": p.correct_b}
                for p in self.pairs
            ],
            "ci_level": self.ci_level,
            "bootstrap_resamples": self.bootstrap_resamples,
            "bootstrap_seed": self.bootstrap_seed,
        }


def compare(a_path: str | os.PathLike[str], b_path: str | os.PathLike[str]) -> Comparison:
    """Compare two results files (see the module docstring); raises :class:`DataError`."""
    a = load_results(as_path(a_path, "compare(a_path)"))
    b = load_results(as_path(b_path, "compare(b_path)"))
    if a.n != b.n:
        raise DataError(
            f"{b.path}: n = {b.n} samples per problem, but {a.path} has n = {a.n}; "
            "compare evaluations with the same --val-n"
        )
    n = a.n
    problems_a, problems_b = a.complete_problems(), b.complete_problems()
    common = [pid for pid in problems_a if pid in problems_b]
    if not common:
        raise DataError(
            f"{b.path}: no problem with all {n} samples in common with {a.path} "
            f"({len(problems_a)} and {len(problems_b)} complete problems)"
        )
    for pid in common:
        ref_a, ref_b = problems_a[pid][0].get("reference"), problems_b[pid][0].get("reference")
        if ref_a != ref_b:
            raise DataError(
                f"{b.path}: problem {pid!r} has reference answer {ref_b!r}, but {ref_a!r} in "
                f"{a.path}: the files evaluate different datasets"
            )
    all_a = {str(r["problem_id"]) for r in a.rows}
    all_b = {str(r["problem_id"]) for r in b.rows}
    pairs = tuple(
        ProblemPair(
            pid,
            sum(bool(r["correct"]) for r in problems_a[pid]),
            sum(bool(r["correct"]) for r in problems_b[pid]),
        )
        for pid in common
    )
    fa = [p.correct_a / n for p in pairs]
    fb = [p.correct_b / n for p in pairs]
    count = len(pairs)
    p_value, method = sign_flip_p_value([y - x for x, y in zip(fa, fb, strict=True)])
    return Comparison(
        a=str(a.path),
        b=str(b.path),
        n=n,
        problems=count,
        left_out_a=len(all_a) - count,
        left_out_b=len(all_b) - count,
        average_at_n_a=sum(fa) / count,
        average_at_n_b=sum(fb) / count,
        difference=(sum(fb) - sum(fa)) / count,
        difference_ci=paired_bootstrap_ci(fa, fb),
        p_value=p_value,
        p_value_method=method,
        pass_at_n_a=sum(p.correct_a > 0 for p in pairs) / count,
        pass_at_n_b=sum(p.correct_b > 0 for p in pairs) / count,
        solved_only_by_a=tuple(p.problem_id for p in pairs if p.correct_a and not p.correct_b),
        solved_only_by_b=tuple(p.problem_id for p in pairs if p.correct_b and not p.correct_a),
        pairs=pairs,
    )
