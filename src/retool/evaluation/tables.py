"""Plain-text tables of a summary and of a comparison, for the terminal."""

from __future__ import annotations

from retool.evaluation.compare import Comparison
from retool.evaluation.summary import EvalSummary


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _ci(interval: tuple[float, float], level: float) -> str:
    return f"[{_pct(interval[0])}, {_pct(interval[1])}] ({100 * level:.0f}% CI)"


def format_summary(summary: EvalSummary) -> str:
    """Every number of the summary, one per line."""
    n = summary.n
    rows = [
        ("problems x samples", f"{summary.problems} x {n} = {summary.samples}"),
        (
            f"Average@{n}",
            f"{_pct(summary.average_at_n)}  {_ci(summary.average_at_n_ci, summary.ci_level)}",
        ),
        (f"Pass@{n}", f"{_pct(summary.pass_at_n)}  {_ci(summary.pass_at_n_ci, summary.ci_level)}"),
    ]
    rows += [(f"pass@{k} (unbiased)", _pct(v)) for k, v in summary.pass_at_k.items()]
    rows += [
        (
            "format rate",
            f"{_pct(summary.format_rate)}  {_ci(summary.format_rate_ci, summary.ci_level)}",
        ),
        ("tool used", f"{_pct(summary.tool_use_rate)} of samples"),
        ("mean code calls", f"{summary.mean_code_calls:.2f}"),
        ("mean turns", f"{summary.mean_turns:.2f}"),
        ("mean tokens", f"{summary.mean_tokens:.1f} (generated {summary.mean_sampled_tokens:.1f})"),
    ]
    rows += [
        (f"stop: {reason}", _pct(share))
        for reason, share in summary.stop_reasons.items()
        if share > 0
    ]
    rows += [
        ("excluded (infrastructure)", _pct(summary.excluded_rate)),
        ("unscored (reward: no verdict)", f"{summary.unscored} of {summary.samples}"),
        ("sandbox calls", str(summary.sandbox_calls)),
        ("sandbox error rate", _pct(summary.sandbox_error_rate)),
        ("sandbox timeout rate", _pct(summary.sandbox_timeout_rate)),
        ("wall time", f"{summary.wall_s:.1f} s"),
        ("tokens/s (generated)", f"{summary.tokens_per_s:.1f}"),
    ]
    if summary.incomplete_problems:
        rows.append(("incomplete problems (left out)", str(summary.incomplete_problems)))
    return _table(rows)


def _ids(ids: tuple[str, ...], limit: int = 12) -> str:
    if not ids:
        return "-"
    shown = ", ".join(ids[:limit])
    return f"{len(ids)}: {shown}" + (f", ... ({len(ids) - limit} more)" if len(ids) > limit else "")


def format_comparison(result: Comparison) -> str:
    """The paired comparison, B - A."""
    n = result.n
    sign = "+" if result.difference >= 0 else ""
    lo, hi = result.difference_ci
    rows = [
        ("A", result.a),
        ("B", result.b),
        ("problems compared", f"{result.problems} (n = {n} samples each)"),
        (f"Average@{n} A / B", f"{_pct(result.average_at_n_a)} / {_pct(result.average_at_n_b)}"),
        (
            "difference B - A",
            f"{sign}{100 * result.difference:.1f} points  "
            f"[{100 * lo:+.1f}, {100 * hi:+.1f}] "
            f"({100 * result.ci_level:.0f}% paired bootstrap CI)",
        ),
        ("p-value (sign-flip)", f"{result.p_value:.4g} ({result.p_value_method}, two-sided)"),
        (f"Pass@{n} A / B", f"{_pct(result.pass_at_n_a)} / {_pct(result.pass_at_n_b)}"),
        ("solved only by A", _ids(result.solved_only_by_a)),
        ("solved only by B", _ids(result.solved_only_by_b)),
    ]
    if result.left_out_a or result.left_out_b:
        rows.append(
            (
                "NOTE",
                f"compared on the {result.problems} problems complete in both files; left out: "
                f"{result.left_out_a} of A, {result.left_out_b} of B",
            )
        )
    return _table(rows)
