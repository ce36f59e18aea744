"""The reward API's edges: numeric references are accepted, anything else that is
not text is refused with an error naming the argument."""

import math
import sys
from decimal import Decimal
from fractions import Fraction

import pytest

from retool.errors import ConfigError
from retool.reward import (
    EquivalenceChecker,
    RewardResult,
    extract_boxed,
    load_reward_function,
    score_answer,
    score_many,
)
from retool.reward.arguments import reference_text


@pytest.mark.parametrize(
    "value, text",
    [
        (42, "42"),
        (-7, "-7"),
        (42.0, "42"),
        (0.75, "0.75"),
        (1e-05, "0.00001"),
        (1e20, "100000000000000000000"),
        (Fraction(3, 4), "3/4"),
        (Fraction(8, 2), "4"),
        (Decimal("2.50"), "2.50"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
    ],
)
def test_numeric_references_are_written_as_text(value, text):
    assert reference_text("reference", value) == text


def test_an_integer_reference_scores_like_its_text():
    # Plain integers on both sides are compared in-process: no worker needed.
    assert score_answer("so \\boxed{2}", 2).correct
    assert not score_answer("so \\boxed{3}", 2).correct
    assert score_answer("\\boxed{1024}", 1024.0).reward == 1.0


def test_a_fractional_reference_goes_through_math_verify():
    with EquivalenceChecker(timeout=20.0, workers=1) as checker:
        assert score_answer("\\boxed{\\frac{3}{4}}", 0.75, checker=checker).correct
        results = score_many(["\\boxed{0.5}", "\\boxed{7}"], [Fraction(1, 2), 7], checker=checker)
    assert [r.correct for r in results] == [True, True]


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: score_answer(None, "1"), "score_answer text must be a str"),
        (lambda: score_answer(b"\\boxed{1}", "1"), "score_answer text must be a str"),
        (lambda: score_answer("\\boxed{1}", None), "score_answer reference"),
        (lambda: score_answer("\\boxed{1}", b"1"), "score_answer reference"),
        (lambda: score_answer("\\boxed{1}", True), "score_answer reference"),
        (lambda: score_answer("\\boxed{1}", [1]), "score_answer reference"),
        (
            lambda: score_answer("\\boxed{1}", math.nan),
            "score_answer reference must be a finite number",
        ),
        (
            lambda: score_answer("\\boxed{1}", math.inf),
            "score_answer reference must be a finite number",
        ),
        (lambda: score_answer("\\boxed{1}", "1", timeout=math.nan), "score_answer timeout"),
        (lambda: score_answer("\\boxed{1}", "1", timeout=1e12), "score_answer timeout"),
        (lambda: score_answer("\\boxed{1}", "1", timeout="5"), "score_answer timeout"),
        (lambda: score_many("\\boxed{1}", ["1"]), "score_many texts must be a sequence"),
        (lambda: score_many(["a"], "1"), "score_many references must be a sequence"),
        (lambda: score_many(["a"], ["1", "2"]), "1 texts but 2 references"),
        (lambda: score_many(["a", None], ["1", "2"]), r"score_many texts\[1\]"),
        (lambda: score_many(["a"], [None]), r"score_many references\[0\]"),
        (lambda: score_many(["a"], ["1"], workers=0), "score_many workers"),
        (lambda: score_many(["a"], ["1"], workers=10**6), "score_many workers"),
        (lambda: extract_boxed(None), "extract_boxed text"),
        (lambda: extract_boxed("x", tail_chars=-1), "extract_boxed tail_chars"),
        (lambda: EquivalenceChecker(timeout=math.nan), "EquivalenceChecker timeout"),
        (lambda: EquivalenceChecker(timeout=math.inf), "EquivalenceChecker timeout"),
        (lambda: EquivalenceChecker(workers=2.5), "EquivalenceChecker workers"),
        (lambda: EquivalenceChecker().check(None, "1"), "check answer"),
        (lambda: EquivalenceChecker().check("1", None), "check reference"),
        (lambda: EquivalenceChecker().check("1", "1", timeout=-1), "check timeout"),
        (lambda: load_reward_function(None), "reward.function must be a str"),
    ],
)
def test_bad_arguments_name_themselves(call, named):
    with pytest.raises(ConfigError, match=named):
        call()


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_for_test.py").write_text(
        "def none(text, ref):\n    return None\n"
        "def nan(text, ref):\n    return float('nan')\n"
        "def text(text, ref):\n    return '1'\n"
        "def half(text, ref):\n    return 0.5\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards_for_test"
    sys.modules.pop("my_rewards_for_test", None)


@pytest.mark.parametrize("function", ["none", "nan", "text"])
def test_a_custom_reward_returning_no_number_is_named(reward_module, function):
    score = load_reward_function(f"{reward_module}:{function}")
    with pytest.raises(ConfigError, match=f"reward.function '{reward_module}:{function}'"):
        score("\\boxed{1}", "1")


def test_a_custom_reward_returning_a_number_still_works(reward_module):
    result = load_reward_function(f"{reward_module}:half")("\\boxed{1}", "1")
    assert result == RewardResult(0.5, correct=True, valid_format=True, answer=None)
