import time

import pytest

from retool.reward import EquivalenceChecker, score_answer, score_many


@pytest.fixture(scope="module")
def checker():
    with EquivalenceChecker(timeout=5.0, workers=2) as c:
        yield c


@pytest.mark.parametrize(
    "text, reference, correct",
    [
        ("The answer is \\boxed{1024}.", "1024", True),
        ("\\boxed{1023}", "1024", False),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{\\frac{3}{4}}", "0.75", True),
        ("\\boxed{\\dfrac{1}{3}}", "\\frac{1}{3}", True),
        ("\\boxed{\\{1,2,3\\}}", "\\{3,2,1\\}", True),
        ("\\boxed{(0, 1]}", "(0,1]", True),
        ("\\boxed{[0, 1)}", "(0,1]", False),
        ("\\boxed{5 \\text{ cm}}", "5", True),
        ("\\boxed{12\\%}", "12", True),
        ("\\boxed{2^{10}}", "1024", True),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", True),
    ],
)
def test_equivalence(checker, text, reference, correct):
    result = score_answer(text, reference, checker=checker)
    assert result.correct is correct
    assert result.reward == (1.0 if correct else -1.0)
    assert result.valid_format


def test_missing_box_is_minus_one_and_invalid_format(checker):
    result = score_answer("The answer is 1024.", "1024", checker=checker)
    assert (result.reward, result.correct, result.valid_format, result.answer) == (
        -1.0,
        False,
        False,
        None,
    )


def test_model_text_is_never_evaluated_as_python(checker, tmp_path):
    marker = tmp_path / "pwned"
    text = f"\\boxed{{__import__('os').system('touch {marker}')}}"
    result = score_answer(text, "0", checker=checker)
    assert result.reward == -1.0 and not marker.exists()


def test_hang_is_cut_at_the_timeout():
    with EquivalenceChecker(timeout=1.0) as checker:
        checker.check("1", "1 + 0")  # start the worker outside the measured call
        started = time.monotonic()
        result = score_answer("\\boxed{9^{9^{9^{9}}}}", "1", checker=checker, timeout=1.0)
        elapsed = time.monotonic() - started
        assert result.reward == -1.0 and result.timed_out
        assert checker.timeouts == 1
        assert elapsed < 10  # generous: a hang would take minutes
        # The checker recovers with a fresh worker.
        assert score_answer("\\boxed{\\frac{2}{4}}", "0.5", checker=checker).correct


def test_score_many_keeps_order(checker):
    texts = ["\\boxed{1/2}", "nothing", "\\boxed{3}", "\\boxed{\\sqrt{4}}"]
    refs = ["0.5", "1", "4", "2"]
    results = score_many(texts, refs, checker=checker)
    assert [r.correct for r in results] == [True, False, False, True]
    assert [r.valid_format for r in results] == [True, False, True, True]
    with pytest.raises(ValueError):
        score_many(["a"], [], checker=checker)


def _peak_mib(pid: int) -> float:
    """The most address space the process ever held (VmPeak), MiB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmPeak:"))
    return int(line.split()[1]) / 1024


def test_a_worker_never_holds_more_than_its_memory_limit():
    """A 14-character answer that makes sympy reach gigabytes within seconds: the
    worker's cap stops it there (MemoryError inside, or the worker dies), far before a
    generous deadline, and the answer is simply not equivalent."""
    from retool.reward.verify import _Worker

    worker = _Worker(memory_mb=256)
    try:
        worker.ask("1", "1", timeout=60.0)  # started: the limit is in place
        try:
            reply = worker.ask("(x+1)^{10^{6}}", "1", timeout=60.0)
        except EOFError:
            return  # it died at its cap: the checker answers for it (next test)
        assert reply is not None, "no reply within a minute: the cap did not hold"
        assert reply[1] is not True
        assert _peak_mib(worker.process.pid) <= 256
    finally:
        worker.kill()


def test_a_check_whose_worker_dies_twice_is_answered_not_raised(monkeypatch):
    from retool.reward import verify

    monkeypatch.setattr(verify, "MIN_MEMORY_MB", 1)  # a cap below what the imports need
    with EquivalenceChecker(timeout=5.0, memory_mb=8) as checker:
        verdict = checker.check("\\frac{2}{4}", "0.5")
        assert (verdict.equivalent, verdict.failed, checker.failures) == (False, True, 1)
        assert "died twice" in verdict.error
        result = score_answer("\\boxed{\\frac{2}{4}}", "0.5", checker=checker)
        assert (result.reward, result.failed, result.valid_format) == (-1.0, True, True)
        assert checker.check("2", "2").equivalent  # plain integers need no worker


@pytest.mark.parametrize("memory_mb", [0, 64, -1, 1.5, "512"])
def test_a_memory_limit_too_small_to_import_is_refused(memory_mb):
    from retool.errors import ConfigError

    with pytest.raises(ConfigError, match="memory_mb"):
        EquivalenceChecker(memory_mb=memory_mb)
