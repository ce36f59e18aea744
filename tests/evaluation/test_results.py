"""Summaries from rows, the results file's crash tolerance, and paired comparisons."""

from __future__ import annotations

import re

import pytest

from retool.errors import DataError
from retool.evaluation import compare, format_comparison, format_summary, load_results, summarize
from retool.evaluation.stats import pass_at_k
from retool.rollout import StopReason
from tests.evaluation.synthetic import make_row, write_results

SUMMARY_KEYS = {
    "n",
    "problems",
    "samples",
    "average_at_n",
    "average_at_n_ci",
    "pass_at_n",
    "pass_at_n_ci",
    "pass_at_k",
    "format_rate",
    "format_rate_ci",
    "tool_use_rate",
    "mean_code_calls",
    "mean_turns",
    "mean_tokens",
    "mean_sampled_tokens",
    "stop_reasons",
    "excluded_rate",
    "sandbox_calls",
    "sandbox_error_rate",
    "sandbox_timeout_rate",
    "sampled_tokens",
    "wall_s",
    "tokens_per_s",
    "incomplete_problems",
    "unscored",
    "ci_level",
    "bootstrap_resamples",
    "bootstrap_seed",
    "per_problem",
}


def test_summarize_known_rows():
    n = 4
    rows = [make_row("a", 0, s, s < 3) for s in range(n)]  # 3 of 4
    rows += [make_row("b", 1, s, False, stop_reason="max_turns", format=False) for s in range(n)]
    rows += [
        make_row("c", 2, s, s == 0, sandbox_calls=2, sandbox_errors=1, sandbox_timeouts=s % 2)
        for s in range(n)
    ]
    rows += [make_row("d", 3, 0, True)]  # incomplete: left out
    rows[0]["session"], rows[0]["elapsed_s"] = 1, 4.0  # a resumed session
    summary = summarize(rows, n)
    data = summary.to_dict()
    assert set(data) == SUMMARY_KEYS
    assert (summary.problems, summary.samples, summary.incomplete_problems) == (3, 12, 1)
    assert summary.average_at_n == pytest.approx(4 / 12)
    low, high = summary.average_at_n_ci
    assert low <= summary.average_at_n <= high
    assert summary.pass_at_n == pytest.approx(2 / 3)
    assert set(summary.pass_at_k) == {1, 2, 4}
    assert summary.pass_at_k[1] == pytest.approx(summary.average_at_n)
    assert summary.pass_at_k[2] == pytest.approx((pass_at_k(4, 3, 2) + 0 + pass_at_k(4, 1, 2)) / 3)
    assert summary.pass_at_k[4] == pytest.approx(summary.pass_at_n)
    assert summary.format_rate == pytest.approx(8 / 12)
    assert summary.format_rate_ci[0] <= summary.format_rate <= summary.format_rate_ci[1]
    assert summary.stop_reasons["max_turns"] == pytest.approx(4 / 12)
    assert set(summary.stop_reasons) >= {str(r) for r in StopReason}
    assert sum(summary.stop_reasons.values()) == pytest.approx(1.0)
    assert summary.sandbox_calls == 4 + 4 + 8
    assert summary.sandbox_error_rate == pytest.approx(4 / 16)
    assert summary.sandbox_timeout_rate == pytest.approx(2 / 16)
    assert summary.wall_s == pytest.approx(1.0 + 4.0)  # session 0 + session 1
    assert summary.tokens_per_s == pytest.approx(12 * 40 / 5.0)
    assert data["pass_at_k"] == {
        "1": summary.pass_at_k[1],
        "2": summary.pass_at_k[2],
        "4": pytest.approx(2 / 3),
    }
    assert summary.per_problem == {"a": 3, "b": 0, "c": 1}
    assert summarize(rows, n) == summary  # seeded
    table = format_summary(summary)
    assert "Average@4" in table and "pass@2 (unbiased)" in table and "stop: max_turns" in table


def test_summarize_empty():
    summary = summarize([], 3)
    assert summary.problems == 0 and summary.average_at_n == 0.0 and summary.wall_s == 0.0


def test_torn_last_line_is_dropped_and_a_damaged_line_is_an_error(tmp_path):
    path = write_results(tmp_path / "r.jsonl", {"p0": 1, "p1": 2}, n=2, summary=False)
    text = path.read_text()
    path.write_text(text + '{"problem_id": "p2", "sam')
    results = load_results(path)
    assert len(results.rows) == 4 and results.summary is None
    assert list(results.complete_problems()) == ["p0", "p1"]
    lines = text.splitlines(keepends=True)
    path.write_text(lines[0] + "{oops\n" + "".join(lines[1:]))
    with pytest.raises(DataError, match=r"r.jsonl:2: not valid JSON"):
        load_results(path)
    path.write_text('{"problem_id": "x"}\n')
    with pytest.raises(DataError, match="not a retool eval results file"):
        load_results(path)


def test_compare_b_always_better(tmp_path):
    problems = [f"p{i}" for i in range(10)]
    a = write_results(tmp_path / "a.jsonl", {p: 1 for p in problems}, n=4)
    b = write_results(tmp_path / "b.jsonl", {p: 3 for p in problems}, n=4)
    result = compare(a, b)
    assert result.problems == 10 and result.n == 4
    assert result.difference == pytest.approx(0.5)
    assert result.difference_ci == (pytest.approx(0.5), pytest.approx(0.5))
    assert result.p_value == pytest.approx(2 / 2**10) and result.p_value_method == "exact"
    assert result.solved_only_by_a == () and result.solved_only_by_b == ()
    assert compare(a, b) == result  # seeded
    reverse = compare(b, a)
    assert reverse.difference == pytest.approx(-0.5) and reverse.p_value == result.p_value


def test_compare_identical_and_solved_sets(tmp_path):
    correct = {"p0": 0, "p1": 2, "p2": 4, "p3": 1}
    a = write_results(tmp_path / "a.jsonl", correct, n=4)
    same = compare(a, write_results(tmp_path / "same.jsonl", correct, n=4))
    assert same.difference == 0.0 and same.p_value == 1.0 and same.difference_ci == (0.0, 0.0)
    other = write_results(tmp_path / "b.jsonl", {"p0": 2, "p1": 0, "p2": 4, "p3": 1}, n=4)
    result = compare(a, other)
    assert result.solved_only_by_a == ("p1",) and result.solved_only_by_b == ("p0",)
    assert result.difference == pytest.approx(0.0) and result.p_value == pytest.approx(1.0)
    low, high = result.difference_ci
    assert low < 0 < high
    table = format_comparison(result)
    assert re.search(r"solved only by A +1: p1", table) and "difference B - A" in table
    assert set(result.to_dict()) >= {"difference", "difference_ci", "p_value", "per_problem"}


def test_compare_on_the_intersection_and_its_errors(tmp_path):
    a = write_results(tmp_path / "a.jsonl", {"p0": 1, "p1": 2, "p2": 0}, n=2)
    b = write_results(tmp_path / "b.jsonl", {"p0": 2, "p1": 2}, n=2)
    result = compare(a, b)
    assert result.problems == 2 and (result.left_out_a, result.left_out_b) == (1, 0)
    assert "left out: 1 of A, 0 of B" in format_comparison(result)
    n3 = write_results(tmp_path / "n3.jsonl", {"p0": 1}, n=3)
    with pytest.raises(DataError, match=r"n3.jsonl: n = 3 .*a.jsonl has n = 2"):
        compare(a, n3)
    disjoint = write_results(tmp_path / "d.jsonl", {"q0": 1}, n=2)
    with pytest.raises(DataError, match="no problem with all 2 samples in common"):
        compare(a, disjoint)
    rows = [make_row("p0", 0, s, True, reference="99") for s in range(2)]
    from retool.evaluation.results import header_line, row_line

    other = tmp_path / "other.jsonl"
    other.write_text(header_line({"n": 2}) + "".join(row_line(r) for r in rows))
    with pytest.raises(DataError, match=r"problem 'p0' has reference answer '99'"):
        compare(a, other)


def test_rows_are_ascii_lines_whatever_the_model_wrote(tmp_path):
    """Line and paragraph separators, NEL, C1 and bidi controls and lone surrogates in a
    model's text: each row stays one ASCII line (nothing for a Unicode-aware line
    splitter to split, nothing raw for a terminal), and reads back unchanged."""
    from retool.evaluation.results import header_line, row_line

    odd = "x\u2028y\u2029z\x85\x9b[2J\u202e\u2066\ud800-\udfff\x00\u00e9\u6570"
    rows = [make_row("p0", 0, s, s == 0, final_text=odd, answer=odd) for s in range(2)]
    lines = [header_line({"n": 2}), *(row_line(r) for r in rows)]
    assert all(line.isascii() and line.count("\n") == 1 for line in lines)
    path = tmp_path / "r.jsonl"
    path.write_bytes("".join(lines).encode("utf-8"))
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3
    assert [r["final_text"] for r in load_results(path).rows] == [odd, odd]
