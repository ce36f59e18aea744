"""Tool mode with a scripted sampler and sandbox: the per-sample sandbox counts and
rates, correctness, and rows appended as samples end (before ``progress`` hears)."""

from __future__ import annotations

import asyncio
import json

import pytest

from retool.data import MathExample
from retool.evaluation import evaluate, load_results, prepare_evaluation
from retool.sandbox import ErrorKind, ExecResult
from tests.builders import scripted_rollout
from tests.rollout.fakes import FakeSandbox, ScriptedSampler, answer_text, call_text

CONFIG = scripted_rollout(
    max_trajectory_tokens=2048,
    max_assistant_tokens=128,
    max_tool_response_tokens=64,
    max_assistant_turns=3,
)
PROBLEMS = [
    MathExample("q1", "What is 3 + 4?", "7"),
    MathExample("q2", "What is 2 * 5?", "10"),
]


def _script(call):
    if call.turn == 0:  # sample 0 computes, sample 1 runs code that times out
        return call_text("print(1)" if call.index == 0 else "while True: pass")
    return answer_text("7")  # right for q1, wrong for q2


def _outputs(code):
    if "while" in code:
        return ExecResult(False, "", "", None, True, 5.0, False, ErrorKind.TIMEOUT)
    return "1\n"


def test_tool_mode_counts_sandbox_calls_per_sample(smol_tokenizer, tmp_path):
    out = tmp_path / "tool.jsonl"
    rows_at_event = []

    def progress(event):
        rows_at_event.append(len(out.read_text().splitlines()) - 1)  # header excluded

    sampler = ScriptedSampler(smol_tokenizer, _script)
    sandbox = FakeSandbox(_outputs)
    evaluation = prepare_evaluation(PROBLEMS, CONFIG, n=2, output=out,
                                    settings={"model": "scripted"}, tools=True)  # fmt: skip
    summary = evaluate(sampler, smol_tokenizer, sandbox, evaluation, progress=progress)
    assert rows_at_event == [1, 2, 3, 4]  # each row is on disk before progress hears of it
    rows = {(r["problem_id"], r["sample_index"]): r for r in load_results(out).rows}
    computed, timed_out = rows[("q1", 0)], rows[("q1", 1)]
    assert computed["correct"] and computed["format"] and computed["answer"] == "7"
    assert (computed["turns"], computed["code_calls"], computed["sandbox_calls"]) == (2, 1, 1)
    assert (computed["sandbox_errors"], computed["sandbox_timeouts"]) == (0, 0)
    assert (timed_out["sandbox_errors"], timed_out["sandbox_timeouts"]) == (1, 1)
    assert not rows[("q2", 0)]["correct"] and rows[("q2", 0)]["reference"] == "10"
    assert summary.average_at_n == pytest.approx(0.5) and summary.pass_at_n == pytest.approx(0.5)
    assert summary.sandbox_calls == 4
    assert summary.sandbox_error_rate == pytest.approx(0.5)
    assert summary.sandbox_timeout_rate == pytest.approx(0.5)
    assert summary.mean_code_calls == pytest.approx(1.0) and summary.format_rate == 1.0
    assert summary.tool_use_rate == 1.0
    header = json.loads(out.read_text().splitlines()[0])
    assert (
        header["settings"]["mode"] == "tool"
        and header["settings"]["rollout"]["max_assistant_turns"] == 3
    )


def test_skipped_problems_still_get_rows(smol_tokenizer, tmp_path):
    """A first prompt longer than the budget sends no trajectory to ``progress``: its
    samples are still written (as excluded ``prompt_too_long``) before the summary."""
    out = tmp_path / "short.jsonl"
    tight = scripted_rollout(
        max_trajectory_tokens=64,
        max_assistant_tokens=16,
        max_tool_response_tokens=16,
        min_observation_tokens=8,
    )
    sampler = ScriptedSampler(smol_tokenizer, _script)
    evaluation = prepare_evaluation(PROBLEMS, tight, n=3, output=out, settings={}, tools=False)
    summary = evaluate(sampler, smol_tokenizer, None, evaluation)
    assert sampler.requests == []
    rows = load_results(out).rows
    assert len(rows) == 6 and all(r["stop_reason"] == "prompt_too_long" for r in rows)
    assert summary.samples == 6 and summary.excluded_rate == 1.0
    assert summary.stop_reasons["prompt_too_long"] == 1.0 and summary.average_at_n == 0.0
    metrics = summary.metrics()
    assert metrics["eval/stop/prompt_too_long"] == 1.0 and "eval/pass_at_3" in metrics


def test_evaluate_refuses_a_running_event_loop_and_the_wrong_mode(smol_tokenizer, tmp_path):
    out = tmp_path / "loop.jsonl"
    sampler = ScriptedSampler(smol_tokenizer, _script)
    text_mode = prepare_evaluation(PROBLEMS, CONFIG, n=1, output=out, settings={}, tools=False)

    async def inside_a_loop():
        evaluate(sampler, smol_tokenizer, None, text_mode)

    with pytest.raises(RuntimeError, match=r"use `await evaluate_async\(\.\.\.\)` there"):
        asyncio.run(inside_a_loop())
    with pytest.raises(ValueError, match="text-mode one sandbox=None"):
        evaluate(sampler, smol_tokenizer, FakeSandbox(_outputs), text_mode)
    assert not out.exists() and sampler.requests == []
