"""How a batch scores a trajectory's final text, and what a failure to score means.

The reward is the built-in boxed-answer check (:func:`retool.reward.score_answer`,
with its ``checker`` and ``timeout``) or a custom ``scorer`` (the user's
``reward.function``). Either runs in a thread, so scoring overlaps the other
trajectories' sampling.

The final text is the model's, and one answer must never stop a run, so
neither reward stops the batch for one answer. When scoring raises (a check
that could not be made because its worker died, a bug the text found, a custom
function that raises or returns no number on an odd answer) the answer scores
-1 (:data:`FAILED`: not correct, no valid format) and the batch records the
exception on the trajectory and counts it in ``rollout/reward_failures``. Two
errors are not the answer's and still stop the batch: the built-in reward's
:class:`~retool.errors.RetoolError` (a setting or a reference answer), and a
custom scorer that failed on *every* trajectory the batch scored (a reward
service that went away, a function that is broken), which the batch re-raises
once it has ended (see :mod:`retool.rollout.scheduler`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from retool.errors import RetoolError
from retool.reward import WRONG_REWARD, EquivalenceChecker, RewardResult, Scorer, score_answer

FAILED = RewardResult(WRONG_REWARD, correct=False, valid_format=False, answer=None, failed=True)


@dataclass(frozen=True)
class Scoring:
    """How to score: a custom ``scorer``, or the boxed-answer reward with ``checker``."""

    scorer: Scorer | None = None
    checker: EquivalenceChecker | None = None
    timeout: float = 5.0  # seconds per equivalence check of the built-in reward

    async def score(self, text: str, reference: str) -> tuple[RewardResult, Exception | None]:
        """The reward of ``text``, and the exception scoring raised (then :data:`FAILED`)."""
        try:
            if self.scorer is not None:
                result = await asyncio.to_thread(self.scorer, text, reference)
            else:
                result = await asyncio.to_thread(
                    score_answer, text, reference, self.timeout, self.checker
                )
        except Exception as exc:
            if isinstance(exc, RetoolError) and self.scorer is None:
                raise  # a setting or a reference answer, not the model's text
            return FAILED, exc
        return result, None
