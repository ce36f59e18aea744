"""Spend accounting: the tokens each step costs, their price, and the budget stop.

A step is counted from its own data, never estimated:

* **prefill tokens**: prompt tokens sent to the sampler, counted as a remote
  service bills them: each sampling request's full prompt, once per request.
  A question's first request (one prompt, ``group_size`` completions) counts
  its prompt once; every later turn of a trajectory is its own request and
  counts its whole prompt ``P_i = P_1 + C_1 + D_1 + ... + D_{i-1}``, so a
  long multi-turn trajectory pays for its history again at every turn. The
  local sampler's prefix cache computes far fewer positions, but the count
  does not change: it is what the same step costs on a service. Requests that
  failed (retried or abandoned) returned nothing and are not counted.
* **sampled tokens**: completion tokens received, every turn of every
  trajectory (those later excluded or not trained on included).
* **trained tokens**: input tokens of every datum sent to ``forward_backward``
  (after the one-token shift: prompt, observations and completions; padding
  excluded). 0 when the update is skipped.

A step's trajectories include question groups reused from the journal after
a resume: each trajectory is counted once, in the step that commits it.
Steps discarded by a resume (after the last checkpoint) are run again and
counted once, so the totals are those of the run's committed steps; work lost
to a crash is not in them.

The running totals are the sums over ``metrics.jsonl`` (:meth:`SpendLedger.
from_metrics`), which ``--resume`` rewinds together with the weights, so they
survive a resume with nothing stored elsewhere. Money is recorded only when a
price is set (``[cost]``); ``cost.max_tokens`` / ``cost.max_money`` stop the
run before a step whose projected cost (the mean of the steps so far) would
take it past the limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from retool.config import CostConfig
from retool.errors import RetoolError

KINDS = ("prefill", "sampled", "trained")  # metric names: cost/<kind>_tokens


@dataclass(frozen=True)
class StepTokens:
    """Tokens of one step (or a sum of steps), by kind."""

    prefill: int = 0  # prompt tokens of every sampling request, once per request
    sampled: int = 0  # completion tokens received
    trained: int = 0  # input tokens of the datums sent to forward_backward

    @property
    def total(self) -> int:
        return self.prefill + self.sampled + self.trained

    def __add__(self, other: StepTokens) -> StepTokens:
        return StepTokens(
            self.prefill + other.prefill, self.sampled + other.sampled, self.trained + other.trained
        )

    def scaled(self, factor: float) -> StepTokens:
        """Rounded to whole tokens (a projection)."""
        return StepTokens(
            round(self.prefill * factor), round(self.sampled * factor), round(self.trained * factor)
        )

    def money(self, cost: CostConfig) -> float:
        """What these tokens cost at ``cost``'s prices (per million tokens)."""
        return (
            self.prefill * cost.prefill_price
            + self.sampled * cost.sample_price
            + self.trained * cost.train_price
        ) / 1e6


def prefill_split(trajectories: Iterable[Any]) -> tuple[int, int]:
    """Prefill tokens of the questions' first requests and of all later requests.

    The first request of a question is shared by its whole group (the same
    prompt, ``num_samples = group_size``), so it is counted once per question
    slot; each later turn is a request of its own. The split lets a projection
    scale the two with the number of questions and of trajectories.
    """
    first: dict[int, int] = {}
    later = 0
    for trajectory in trajectories:
        turns = trajectory.turns
        if not turns:
            continue  # never sampled (prompt too long) or the first request failed
        first.setdefault(trajectory.question_index, len(turns[0].prompt_tokens))
        later += sum(len(turn.prompt_tokens) for turn in turns[1:])
    return sum(first.values()), later


def prefill_tokens(trajectories: Iterable[Any]) -> int:
    """Prompt tokens of every sampling request the trajectories took, once per request."""
    return sum(prefill_split(trajectories))


def sampled_tokens(trajectories: Iterable[Any]) -> int:
    """Completion tokens of every turn."""
    return sum(len(turn.completion_tokens) for t in trajectories for turn in t.turns)


def trained_tokens(datums: Iterable[Any]) -> int:
    """Input tokens of the training datums (``TrainingDatum.num_tokens``, no padding)."""
    return sum(int(d.num_tokens) for d in datums)


def step_tokens(trajectories: Sequence[Any], trained: int) -> StepTokens:
    """One RL step: prefill and sampled tokens from its trajectories, plus ``trained``."""
    return StepTokens(prefill_tokens(trajectories), sampled_tokens(trajectories), trained)


def _money_text(cost: CostConfig, value: float) -> str:
    return f"{cost.currency} {value:,.4f}"


class SpendLedger:
    """The run's spend so far, one :class:`StepTokens` per committed step.

    Rebuilt from ``metrics.jsonl`` on every (re)start, so it always agrees
    with the steps the run directory holds.
    """

    def __init__(self, cost: CostConfig, steps: Sequence[StepTokens] = ()) -> None:
        self.cost = cost
        self.steps: list[StepTokens] = list(steps)

    @classmethod
    def from_metrics(
        cls, cost: CostConfig, lines: Iterable[Mapping[str, Any]], where: str = "metrics.jsonl"
    ) -> SpendLedger:
        """From the metrics lines of the committed steps (lines without cost keys count 0).

        A count that is not a finite number (a hand-edited line) is a
        :class:`~retool.errors.RetoolError` naming ``where`` (the file), the step and the key.
        """
        steps = []
        for line in lines:
            counts = []
            for kind in KINDS:
                key = f"cost/{kind}_tokens"
                value = line.get(key, 0)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    value = math.nan
                if not math.isfinite(value) or value < 0:
                    raise RetoolError(
                        f"{where}: step {line.get('step')!r:.20}: {key} is "
                        f"{line.get(key)!r:.40}, not a token count; the run directory is "
                        "damaged: repair that line or start a new run"
                    )
                counts.append(int(value))
            steps.append(StepTokens(*counts))
        return cls(cost, steps)

    @property
    def total(self) -> StepTokens:
        out = StepTokens()
        for tokens in self.steps:
            out = out + tokens
        return out

    def metrics(self, tokens: StepTokens, step: int, total_steps: int) -> dict[str, float]:
        """``cost/*`` of committing ``tokens`` as step ``step`` of ``total_steps``.

        Pure: call :meth:`add` once the step is committed. The projected totals
        add the mean step of the run so far for every step left to ``total_steps``.
        """
        after = SpendLedger(self.cost, [*self.steps, tokens])
        total = after.total
        left = max(total_steps - step, 0) / len(after.steps)
        out: dict[str, float] = {}
        for kind in KINDS:
            out[f"cost/{kind}_tokens"] = float(getattr(tokens, kind))
        out["cost/tokens"] = float(tokens.total)
        for kind in KINDS:
            out[f"cost/total_{kind}_tokens"] = float(getattr(total, kind))
        out["cost/total_tokens"] = float(total.total)
        out["cost/projected_total_tokens"] = total.total * (1 + left)
        if self.cost.priced:
            out["cost/money"] = tokens.money(self.cost)
            out["cost/total_money"] = total.money(self.cost)
            out["cost/projected_total_money"] = total.money(self.cost) * (1 + left)
        return out

    def add(self, tokens: StepTokens) -> None:
        self.steps.append(tokens)

    def over_budget(self) -> str | None:
        """Why the next step must not run (its projection passes a limit), else None."""
        if not self.steps:
            return None  # nothing to project from: the first step always runs
        cost, total, count = self.cost, self.total, len(self.steps)
        basis = f"the mean of {count} step{'s' if count != 1 else ''}"
        next_tokens = total.total / count
        if cost.max_tokens and total.total + next_tokens > cost.max_tokens:
            return (
                f"the run has used {total.total:,} tokens and the next step would take about "
                f"{next_tokens:,.0f} more ({basis}), past cost.max_tokens = {cost.max_tokens:,}"
            )
        spent = total.money(cost)
        next_money = spent / count
        if cost.max_money and spent + next_money > cost.max_money:
            return (
                f"the run has spent {_money_text(cost, spent)} and the next step would cost "
                f"about {_money_text(cost, next_money)} more ({basis}), past cost.max_money = "
                f"{cost.max_money:g}"
            )
        return None

    def summary(self, tokens: StepTokens) -> str:
        """A short suffix for the step line: the step's money and the total (when priced)."""
        if not self.cost.priced:
            return ""
        return (
            f"  {_money_text(self.cost, tokens.money(self.cost))} "
            f"(total {_money_text(self.cost, self.total.money(self.cost))})"
        )
