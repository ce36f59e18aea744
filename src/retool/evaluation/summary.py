"""The summary of a results file: Average@N with its uncertainty, pass@k, behaviour.

:func:`summarize` is a pure function of the sample rows, so a summary can
always be recomputed from a (possibly resumed) file. Definitions, over the
problems that have all ``n`` samples:

* ``average_at_n``: mean correctness over all samples (equal to the mean over
  problems of each problem's fraction correct, as every problem has ``n``),
  with a 95% percentile-bootstrap interval over problems (see
  :mod:`retool.evaluation.stats` for why problems, not samples).
* ``pass_at_n``: fraction of problems with at least one correct sample (with
  its bootstrap interval); ``pass_at_k``: the unbiased estimator for
  ``k = 1, 2, 4, ..., n`` averaged over problems (``pass_at_k[1]`` equals
  ``average_at_n``; ``pass_at_k[n]`` equals ``pass_at_n``).
* ``format_rate`` (with its bootstrap interval over problems, like Average@N),
  ``tool_use_rate`` (samples with at least one code call),
  ``mean_code_calls``, ``mean_turns``, ``mean_tokens``
  (whole-trajectory length), ``mean_sampled_tokens``: means over all samples.
  Excluded samples (an infrastructure failure) count as not correct; their
  share is ``excluded_rate``. ``unscored``: samples whose answer the reward
  could not judge (its check timed out or failed), counted as not correct; 0
  for files written before the field existed.
* ``stop_reasons``: the fraction of samples per stop reason (every reason listed).
* ``sandbox_error_rate`` / ``sandbox_timeout_rate``: failed / timed-out code
  executions over all executions (``sandbox_calls``); 0 in text mode.
* ``wall_s``: per session (one run of the evaluation; a resumed file has
  several), the time from its start to its last kept sample, summed;
  ``tokens_per_s`` is the generated tokens of the kept samples over that.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from retool.checks import check_number
from retool.evaluation.results import complete_problems
from retool.evaluation.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CI_LEVEL,
    bootstrap_ci,
    k_values,
    pass_at_k,
)
from retool.rollout.types import StopReason


@dataclass(frozen=True)
class EvalSummary:
    """The numbers of one evaluation (see the module docstring)."""

    n: int
    problems: int
    samples: int
    average_at_n: float
    average_at_n_ci: tuple[float, float]
    pass_at_n: float
    pass_at_n_ci: tuple[float, float]
    pass_at_k: dict[int, float]
    format_rate: float
    format_rate_ci: tuple[float, float]
    tool_use_rate: float
    mean_code_calls: float
    mean_turns: float
    mean_tokens: float
    mean_sampled_tokens: float
    stop_reasons: dict[str, float]
    excluded_rate: float
    sandbox_calls: int
    sandbox_error_rate: float
    sandbox_timeout_rate: float
    sampled_tokens: int
    wall_s: float
    tokens_per_s: float
    incomplete_problems: int = 0  # problems without all n samples (left out of every number)
    unscored: int = 0  # samples the reward reached no verdict on (counted as not correct)
    ci_level: float = CI_LEVEL
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED
    per_problem: dict[str, int] = field(default_factory=dict)  # problem id -> correct samples

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: intervals as lists, ``pass_at_k`` keys as strings."""
        return {
            "n": self.n,
            "problems": self.problems,
            "samples": self.samples,
            "average_at_n": self.average_at_n,
            "average_at_n_ci": list(self.average_at_n_ci),
            "pass_at_n": self.pass_at_n,
            "pass_at_n_ci": list(self.pass_at_n_ci),
            "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()},
            "format_rate": self.format_rate,
            "format_rate_ci": list(self.format_rate_ci),
            "tool_use_rate": self.tool_use_rate,
            "mean_code_calls": self.mean_code_calls,
            "mean_turns": self.mean_turns,
            "mean_tokens": self.mean_tokens,
            "mean_sampled_tokens": self.mean_sampled_tokens,
            "stop_reasons": dict(self.stop_reasons),
            "excluded_rate": self.excluded_rate,
            "sandbox_calls": self.sandbox_calls,
            "sandbox_error_rate": self.sandbox_error_rate,
            "sandbox_timeout_rate": self.sandbox_timeout_rate,
            "sampled_tokens": self.sampled_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "incomplete_problems": self.incomplete_problems,
            "unscored": self.unscored,
            "ci_level": self.ci_level,
            "bootstrap_resamples": self.bootstrap_resamples,
            "bootstrap_seed": self.bootstrap_seed,
            "per_problem": dict(self.per_problem),
        }

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """A flat ``{name: float}`` for trackers (intervals as ``_low`` / ``_high``)."""
        out = {
            f"{prefix}average_at_n": self.average_at_n,
            f"{prefix}average_at_n_low": self.average_at_n_ci[0],
            f"{prefix}average_at_n_high": self.average_at_n_ci[1],
            f"{prefix}pass_at_n": self.pass_at_n,
            f"{prefix}pass_at_n_low": self.pass_at_n_ci[0],
            f"{prefix}pass_at_n_high": self.pass_at_n_ci[1],
            f"{prefix}format_rate": self.format_rate,
            f"{prefix}tool_use_rate": self.tool_use_rate,
            f"{prefix}mean_code_calls": self.mean_code_calls,
            f"{prefix}mean_turns": self.mean_turns,
            f"{prefix}mean_tokens": self.mean_tokens,
            f"{prefix}excluded_rate": self.excluded_rate,
            f"{prefix}unscored": float(self.unscored),
            f"{prefix}sandbox_error_rate": self.sandbox_error_rate,
            f"{prefix}sandbox_timeout_rate": self.sandbox_timeout_rate,
            f"{prefix}problems": float(self.problems),
            f"{prefix}samples": float(self.samples),
            f"{prefix}wall_s": self.wall_s,
            f"{prefix}tokens_per_s": self.tokens_per_s,
        }
        out.update({f"{prefix}pass_at_{k}": v for k, v in self.pass_at_k.items()})
        out.update({f"{prefix}stop/{r}": v for r, v in self.stop_reasons.items()})
        return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(rows: Iterable[Mapping[str, Any]], n: int) -> EvalSummary:
    """Summarize sample rows of an evaluation with ``n`` samples per problem."""
    check_number("summarize n", n, 1, integer=True)
    rows = list(rows)
    problems = complete_problems(rows, n)
    incomplete = len({str(r["problem_id"]) for r in rows}) - len(problems)
    kept = [row for members in problems.values() for row in members]
    correct_counts = {
        pid: sum(bool(r["correct"]) for r in members) for pid, members in problems.items()
    }
    fractions = [c / n for c in correct_counts.values()]
    solved = [float(c > 0) for c in correct_counts.values()]
    formats = [  # per problem: the fraction of samples with a complete \\boxed{}
        sum(bool(r.get("format")) for r in members) / n for members in problems.values()
    ]
    ks = k_values(n)
    by_k = {k: _mean([pass_at_k(n, c, k) for c in correct_counts.values()]) for k in ks}
    reasons = {str(reason): 0.0 for reason in StopReason}
    for row in kept:
        key = str(row.get("stop_reason"))
        reasons[key] = reasons.get(key, 0.0) + 1.0
    total = len(kept)
    stop_reasons = {k: (v / total if total else 0.0) for k, v in reasons.items()}
    calls = sum(int(r.get("sandbox_calls", 0)) for r in kept)
    errors = sum(int(r.get("sandbox_errors", 0)) for r in kept)
    timeouts = sum(int(r.get("sandbox_timeouts", 0)) for r in kept)
    sampled = sum(int(r.get("sampled_tokens", 0)) for r in kept)
    sessions: dict[int, float] = {}
    for row in kept:
        session = int(row.get("session", 0))
        sessions[session] = max(sessions.get(session, 0.0), float(row.get("elapsed_s", 0.0)))
    wall = sum(sessions.values())
    return EvalSummary(
        n=n,
        problems=len(problems),
        samples=total,
        average_at_n=_mean(fractions),
        average_at_n_ci=bootstrap_ci(fractions),
        pass_at_n=_mean(solved),
        pass_at_n_ci=bootstrap_ci(solved),
        pass_at_k=by_k,
        format_rate=_mean(formats),
        format_rate_ci=bootstrap_ci(formats),
        tool_use_rate=_mean([float(int(r.get("code_calls", 0)) > 0) for r in kept]),
        mean_code_calls=_mean([float(r.get("code_calls", 0)) for r in kept]),
        mean_turns=_mean([float(r.get("turns", 0)) for r in kept]),
        mean_tokens=_mean([float(r.get("tokens", 0)) for r in kept]),
        mean_sampled_tokens=_mean([float(r.get("sampled_tokens", 0)) for r in kept]),
        stop_reasons=stop_reasons,
        excluded_rate=_mean([float(bool(r.get("excluded"))) for r in kept]),
        sandbox_calls=calls,
        sandbox_error_rate=errors / calls if calls else 0.0,
        sandbox_timeout_rate=timeouts / calls if calls else 0.0,
        sampled_tokens=sampled,
        wall_s=wall,
        tokens_per_s=sampled / wall if wall > 0 else 0.0,
        unscored=sum(bool(r.get("unscored")) for r in kept),
        incomplete_problems=incomplete,
        per_problem=correct_counts,
    )
