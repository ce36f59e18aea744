"""Library noise hidden unless ``-v`` (:mod:`retool.cli.quiet`), one row per case."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

from retool.cli import build_parser, quiet

CASES = [  # argv, whether -v was asked for
    (["eval", "--model", "m"], False),
    (["-v", "eval", "--model", "m"], True),
    (["eval", "--model", "m", "-v"], True),
    (["sft", "make-demos", "--output", "o", "--verbose"], True),
    (["eval", "compare", "a", "b", "-v"], True),
    (["rollout", "--", "-v"], False),
]


@pytest.mark.parametrize(("argv", "verbose"), CASES)
def test_minus_v_is_read_before_or_after_the_command(argv, verbose):
    assert quiet.verbose_requested(argv) is verbose
    if "--" not in argv:
        assert bool(getattr(build_parser().parse_args(argv), "verbose", False)) is verbose


def test_library_warnings_and_logs_are_hidden_and_ours_are_not(monkeypatch):
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    for name in quiet.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own setting wins
    levels = {name: logging.getLogger(name).level for name in quiet.LIBRARIES}
    try:
        quiet.quiet_libraries(verbose=False)
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
        assert logging.getLogger("tinker.lib.retry_handler").getEffectiveLevel() == logging.CRITICAL
        assert logging.getLogger("retool.rollout").getEffectiveLevel() < logging.CRITICAL
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet.quiet_libraries(verbose=False)  # catch_warnings reset the filters
            warnings.warn_explicit("noise", FutureWarning, "x.py", 1, module="transformers.x")
            warnings.warn_explicit("ours", UserWarning, "y.py", 1, module="retool.cli")
        assert [str(w.message) for w in caught] == ["ours"]
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_verbose_changes_nothing(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    before = list(warnings.filters)
    quiet.quiet_libraries(verbose=True)
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and warnings.filters == before


@pytest.mark.parametrize(("flag", "bars"), [([], False), (["-v"], True)])
def test_the_loading_bar_of_transformers_shows_only_with_minus_v(flag, bars):
    """In a fresh interpreter: what `retool` sets before transformers is imported."""
    code = (
        "import sys; from retool.cli import quiet; quiet.quiet_libraries("
        "quiet.verbose_requested(sys.argv[1:])); "
        "from transformers.utils import logging; print(logging.is_progress_bar_enabled())"
    )
    env = {k: v for k, v in os.environ.items() if k not in quiet.ENVIRONMENT}
    done = subprocess.run(
        [sys.executable, "-c", code, *flag], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == str(bars)
