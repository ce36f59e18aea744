"""Dynamic sampling (``rollout.dynamic_sampling``, DAPO's filter): which extra questions run.

The caller passes ``reserve``, extra questions in a fixed order. Each time a
group ends uninformative (every included member scored alike, or fewer than
two included: :func:`~retool.rollout.result.informative`), the next reserve
question starts at once, in the next slot, while the other groups run on: no
round barrier here either. Which extras run does not depend on timing: with
``Q`` batch questions, every uninformative group found starts one extra, so at
the end ``Q + uninformative = slots`` and the last slot is informative; the
slots are therefore the shortest prefix of ``batch + reserve`` that holds ``Q``
informative groups (or all of it), a function of the groups' outcomes, which
their seeds decide. Uninformative groups get advantage 0 and do not train
(``RolloutResult.filtering``). A resumed step reuses journaled groups of
reserve slots like any other, and the same rule gives the same slots.
"""

from __future__ import annotations

from collections.abc import Sequence

from retool.data.examples import MathExample
from retool.rollout.result import informative
from retool.rollout.types import Trajectory


class Refill:
    """One batch's reserve, drawn in order as groups end uninformative."""

    def __init__(self, enabled: bool, reserve: Sequence[MathExample]) -> None:
        self.enabled = enabled
        self.reserve = list(reserve) if enabled else []
        self.drawn = 0  # reserve questions started so far

    def replacement(self, members: Sequence[Trajectory]) -> MathExample | None:
        """The reserve question to start for the ended group ``members``: the next
        one when the group is uninformative and the reserve is not spent."""
        if not self.enabled or informative(members) or self.drawn >= len(self.reserve):
            return None
        self.drawn += 1
        return self.reserve[self.drawn - 1]


def zero_uninformative(groups: Sequence[Sequence[Trajectory]]) -> None:
    """Advantage exactly 0 for every member of an uninformative group: its equal
    rewards can centre to a rounding residue, and a filtered group must not train."""
    for members in groups:
        if not informative(members):
            for trajectory in members:
                trajectory.advantage = 0.0
