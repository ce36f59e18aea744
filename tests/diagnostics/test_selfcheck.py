"""The pipeline self-check: reference solutions through every stage, per dialect."""

import dataclasses

import pytest

from retool.config import load_config
from retool.data.demo import demo_problems
from retool.diagnostics.selfcheck import run_selfcheck


def _one_per_family():
    seen = {}
    for problem in demo_problems("dev"):
        seen.setdefault(problem.family, problem)
    return list(seen.values())


@pytest.mark.parametrize("protocol", ["markdown", "hermes_json", "qwen3_xml"])
def test_reference_trajectories_score_plus_one(protocol):
    config = load_config(None, [f"rollout.protocol={protocol}"])
    problems = _one_per_family()
    lines = []
    report = run_selfcheck(config, problems, log=lines.append)
    assert report.total == len(problems) == report.tool_calls
    assert report.correct == report.total and report.ok, report.failures
    assert any("next prompt = P1 + C1 +" in line for line in lines)


def test_a_wrong_reference_is_named_with_its_stage():
    config = load_config(None, [])
    good, *_ = _one_per_family()
    wrong_answer = dataclasses.replace(good, id="wrong", answer=good.answer + 1)
    broken_code = dataclasses.replace(good, id="broken", solution="print(undefined_name)")
    report = run_selfcheck(config, [good, wrong_answer, broken_code])
    assert report.correct == 1 and not report.ok
    assert sorted(f.split(":")[:2] for f in report.failures) == [
        ["broken", " sandbox"],
        ["wrong", " reward"],
    ]
