import subprocess
import sys

import pytest

from retool.data.demo import FAMILIES, SPLIT_SIZES, demo_examples, demo_problems
from retool.errors import ConfigError


def test_splits_are_fixed_sizes_disjoint_and_deterministic():
    splits = {name: demo_problems(name) for name in SPLIT_SIZES}
    for name, problems in splits.items():
        assert len(problems) == SPLIT_SIZES[name]
        assert problems == demo_problems(name)
    questions = [{p.question for p in ps} for ps in splits.values()]
    assert not (
        questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2]
    )
    families = {p.family for p in splits["train"]}
    assert len(families) >= len(FAMILIES)


def test_answers_are_integers_out_of_reach_of_mental_arithmetic():
    for example in demo_examples("dev"):
        assert int(example.answer) == int(example.answer.strip())


def test_reference_solutions_print_the_answers():
    problems = demo_problems("test")[:: len(FAMILIES) - 1][:10]
    problems += [p for p in demo_problems("test") if p.family == "prime_count"][:1]
    script = "\n".join(f"exec({p.solution!r})" for p in problems)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == [str(p.answer) for p in problems]


def test_unknown_split():
    with pytest.raises(ConfigError, match="demo split"):
        demo_problems("validation")
