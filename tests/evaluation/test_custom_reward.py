"""An evaluation with a custom reward.function that some answers break: the sample
it fails on is a wrong row that says why, the rest count; a function that fails on
every sample stops the evaluation without writing their rows, so a rerun samples
them again."""

from __future__ import annotations

import re

import pytest

from retool.data import MathExample
from retool.evaluation import evaluate, load_results, prepare_evaluation
from retool.evaluation.tables import format_summary
from retool.reward import load_reward_function
from tests.builders import scripted_rollout
from tests.rollout.fakes import ScriptedSampler, answer_text

CONFIG = scripted_rollout(max_trajectory_tokens=1024, max_assistant_tokens=64)
PROBLEMS = [
    MathExample("q1", "What is 3 + 4?", "7"),
    MathExample("q2", "What is 2 * 5?", "10"),
]


def _script(call):
    right = "7" if "3 + 4" in call.prompt_text else "10"
    odd = " (odd)" if right == "7" and call.index == 0 else ""
    return answer_text(right) + odd  # every answer right; q1's sample 0 written oddly


def careless(text: str, reference: str) -> float:
    if "odd" in text:
        raise ValueError("unexpected answer format")
    return 1.0 if f"\\boxed{{{reference}}}" in text else -1.0


CARELESS = "tests.evaluation.test_custom_reward:careless"  # as reward.function names it


def _evaluate(tokenizer, out, reward):
    if isinstance(reward, str):
        reward = load_reward_function(reward)
    evaluation = prepare_evaluation(
        PROBLEMS, CONFIG, n=2, output=out, settings={"model": "scripted"}, tools=False
    )
    sampler = ScriptedSampler(tokenizer, _script)
    return evaluate(sampler, tokenizer, None, evaluation, scorer=reward)


def test_a_sample_the_custom_reward_fails_on_is_a_wrong_row(smol_tokenizer, tmp_path):
    out = tmp_path / "eval.jsonl"
    summary = _evaluate(smol_tokenizer, out, CARELESS)
    results = load_results(out)
    rows = {(r["problem_id"], r["sample_index"]): r for r in results.rows}
    odd = rows.pop(("q1", 0))
    assert (odd["correct"], odd["format"], odd["excluded"]) == (False, False, False)
    assert odd["unscored"] is True  # counted: the summary says how many had no verdict
    assert odd["error"].startswith("reward: ValueError: unexpected answer format")
    assert len(rows) == 3 and all(r["correct"] and r["error"] is None for r in rows.values())
    assert not any(r["unscored"] for r in rows.values())
    assert (summary.samples, summary.average_at_n, summary.excluded_rate) == (4, 0.75, 0.0)
    assert summary.unscored == 1 and results.summary is not None
    assert results.summary["unscored"] == 1
    assert re.search(r"unscored \(reward: no verdict\) +1 of 4\n", format_summary(summary))


def test_a_custom_reward_that_fails_on_every_sample_stops_and_a_rerun_resamples(
    smol_tokenizer, tmp_path
):
    out = tmp_path / "eval.jsonl"

    def gone(text: str, reference: str) -> float:
        raise ConnectionError("the reward service went away")

    with pytest.raises(ConnectionError, match="went away"):
        _evaluate(smol_tokenizer, out, gone)
    assert load_results(out).rows == ()  # no -1 rows: nothing a rerun would keep
    summary = _evaluate(smol_tokenizer, out, CARELESS)
    assert (summary.samples, summary.average_at_n) == (4, 0.75)
    assert len(load_results(out).rows) == 4
