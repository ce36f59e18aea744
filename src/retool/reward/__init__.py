"""Outcome reward: the last ``\\boxed{}`` answer, math-equivalent to the reference.

``score_answer`` returns +1 for a correct boxed answer and -1 for anything else
(a wrong answer, no box at all, or an equivalence check that ran out of time or
memory, or whose worker died: see :mod:`retool.reward.verify`). It never raises
on the model's text.
The reward never looks at how the answer was reached: tool use is learned only
through its effect on the final answer.

Arguments are checked on entry (:mod:`retool.reward.arguments`): texts must be
``str``, a reference may also be a number (``2``, ``0.75``), timeouts and
worker counts are finite and in range; anything else is a ``ConfigError``
naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retool.errors import ConfigError
from retool.reward.arguments import check_text, check_timeout, check_workers, reference_text
from retool.reward.boxed import TAIL_CHARS, extract_boxed
from retool.reward.verify import EquivalenceChecker, Verdict, default_checker

CORRECT_REWARD = 1.0
WRONG_REWARD = -1.0


@dataclass(frozen=True)
class RewardResult:
    """Score of one final answer."""

    reward: float  # +1.0 correct, -1.0 otherwise
    correct: bool  # the boxed answer is equivalent to the reference
    valid_format: bool  # a complete \boxed{} was found in the tail of the text
    answer: str | None  # content of that box, None when there was none
    timed_out: bool = False  # the equivalence check hit its deadline (counted as wrong)
    failed: bool = False  # the check could not be made: its worker died twice (counted as wrong)


def _result(answer: str | None, verdict: Verdict | None) -> RewardResult:
    if answer is None or verdict is None:
        return RewardResult(WRONG_REWARD, correct=False, valid_format=False, answer=answer)
    return RewardResult(
        CORRECT_REWARD if verdict.equivalent else WRONG_REWARD,
        correct=verdict.equivalent,
        valid_format=True,
        answer=answer,
        timed_out=verdict.timed_out,
        failed=verdict.failed,
    )


def score_answer(
    text: str,
    reference: str | float,
    timeout: float = 5.0,
    checker: EquivalenceChecker | None = None,
) -> RewardResult:
    """Score ``text`` against ``reference`` (text, or a number such as ``42``); never
    runs longer than ``timeout`` seconds per check."""
    check_text("score_answer text", text, "the model's final text")
    reference = reference_text("score_answer reference", reference)
    timeout = check_timeout("score_answer timeout (seconds)", timeout)
    answer = extract_boxed(text)
    if answer is None:
        return _result(None, None)
    checker = checker or default_checker()
    return _result(answer, checker.check(answer, reference, timeout))


def score_many(
    texts: Sequence[str],
    references: Sequence[str],
    timeout: float = 5.0,
    workers: int = 2,
    checker: EquivalenceChecker | None = None,
) -> list[RewardResult]:
    """Score many answers using ``workers`` processes in parallel; order is preserved.

    ``references`` may hold numbers as well as text, as in :func:`score_answer`.
    """
    for name, value in (("texts", texts), ("references", references)):
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ConfigError(
                f"score_many {name} must be a sequence (a list), got {type(value).__name__}"
            )
    if len(texts) != len(references):
        raise ConfigError(
            f"score_many got {len(texts)} texts but {len(references)} references; "
            "pass one reference per text"
        )
    texts = [check_text(f"score_many texts[{i}]", t, "a final text") for i, t in enumerate(texts)]
    references = [
        reference_text(f"score_many references[{i}]", ref) for i, ref in enumerate(references)
    ]
    timeout = check_timeout("score_many timeout (seconds)", timeout)
    workers = check_workers("score_many workers", workers)
    answers = [extract_boxed(t) for t in texts]
    checker = checker or default_checker(workers=workers)
    todo = [(i, a) for i, a in enumerate(answers) if a is not None]
    verdicts = checker.check_many([(a, references[i]) for i, a in todo], timeout)
    by_index: dict[int, Verdict] = {i: v for (i, _), v in zip(todo, verdicts, strict=True)}
    return [_result(a, by_index.get(i)) for i, a in enumerate(answers)]


__all__ = [
    "CORRECT_REWARD",
    "TAIL_CHARS",
    "WRONG_REWARD",
    "EquivalenceChecker",
    "RewardResult",
    "Scorer",
    "Verdict",
    "extract_boxed",
    "load_reward_function",
    "score_answer",
    "score_many",
]


Scorer = Callable[[str, str], RewardResult]


def load_reward_function(spec: str) -> Scorer:
    """Import a custom reward ``"package.module:function"``.

    The function takes ``(final_text, reference)`` and returns a
    :class:`RewardResult` or a number (a number ``> 0`` counts as correct).
    It runs in the trainer's process: it is configuration, never model output.
    A value that is neither (``None``, ``nan``, a string) is a ``ConfigError``
    naming the function, not a reward.
    """
    import importlib
    import math
    import numbers

    check_text("reward.function", spec, "'package.module:function'")
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"reward.function must look like 'package.module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"reward.function {spec!r}: cannot import {module_name!r} ({exc})"
        ) from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"reward.function {spec!r}: {module_name} has no function {attribute!r}")

    def score(text: str, reference: str) -> RewardResult:
        value = function(text, reference)
        if isinstance(value, RewardResult):
            return value
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ConfigError(
                f"reward.function {spec!r} returned {value!r}; it must return a RewardResult "
                "or a finite number"
            )
        reward = float(value)
        return RewardResult(reward, correct=reward > 0, valid_format=True, answer=None)

    return score
