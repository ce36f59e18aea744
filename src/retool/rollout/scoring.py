"""How a batch scores a trajectory's final text, and what a failure to score means.

The reward is the built-in boxed-answer check (:func:`retool.reward.score_answer`,
with its ``checker`` and ``timeout``) or a custom ``scorer`` (the user's
``reward.function``). Either runs in a thread, so scoring overlaps the other
trajectories' sampling.

The built-in reward never raises on an answer: when scoring raises (a check
that could not be made because its worker died, a bug the text found) the
answer scores -1 (:data:`FAILED`) and the batch records the exception on the
trajectory and counts it in ``rollout/reward_failures``; its
:class:`~retool.errors.RetoolError` (a setting or a reference answer) still
stops the batch. A custom ``scorer`` is configuration, not model text: an
exception from it (a reward service that went away) stops the batch, so a
function that cannot score some text must return -1 itself.
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
        if self.scorer is not None:  # configuration: its exception stops the batch
            return await asyncio.to_thread(self.scorer, text, reference), None
        try:
            result = await asyncio.to_thread(
                score_answer, text, reference, self.timeout, self.checker
            )
        except RetoolError:
            raise  # a setting or a reference answer, not the model's text
        except Exception as exc:
            return FAILED, exc
        return result, None
