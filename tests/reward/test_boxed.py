import pytest

from retool.reward import extract_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed {7}", "7"),
        ("\\fbox{x+1}", "x+1"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{3} and then \\boxed{4", "3"),  # the last complete box wins
        ("no box here", None),
        ("\\boxed{", None),
    ],
)
def test_extract(text, expected):
    assert extract_boxed(text) == expected


def test_only_the_tail_is_searched():
    text = "\\boxed{5}" + "x" * 400
    assert extract_boxed(text) is None
    assert extract_boxed("x" * 400 + "\\boxed{5}") == "5"
