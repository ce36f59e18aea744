import pytest

from retool.config import load_config
from retool.data.demo import demo_problems
from retool.demo_pipeline import reference_walkthrough


@pytest.mark.parametrize("protocol", ["markdown", "hermes_json", "qwen3_xml"])
def test_reference_trajectories_score_plus_one(protocol):
    config = load_config(None, [f"rollout.protocol={protocol}"])
    problems = demo_problems("dev")[:7]  # one per family
    report = reference_walkthrough(config, problems)
    assert report.total == 7 and report.tool_calls == 7
    assert report.correct == 7
