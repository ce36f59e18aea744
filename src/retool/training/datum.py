"""One training datum per trajectory, over the real token prefix chain.

A multi-turn trajectory is trained as *one* causal sequence, the one the
sampler actually saw and produced (chapter 7, invariants 2, 6 and 7)::

    F = P1 + C1 + D2 + C2 + D3 + C3 + ...

``P1`` is the first prompt, ``Ci`` the sampler's own completion tokens of turn
``i`` and ``Di`` everything that is not a model action between two turns
(template closings the sampler did not produce, tool wrappers, observations,
the next generation prefix). ``Di`` is found as the part of turn ``i``'s
prompt beyond the tokens built so far; the prompt must extend those tokens
exactly (token ids, not text), otherwise the old logprobs would no longer
describe the tokens they were sampled for, and the build refuses.

Per position the builder records the token, the sampler's logprob and the
advantage: completion positions carry their logprob and the trajectory's
advantage, every other position keeps its token with logprob 0 and advantage 0
(a placeholder for shape, not a claim about the policy). There is no separate
mask: the loss tokens are the positions with a non-zero advantage. A causal LM
predicts position ``j + 1`` from ``F[: j + 1]``, so all four arrays are shifted
together, once::

    model_input  = F[:-1]
    target_tokens, logprobs, advantages = (F, L, A)[1:]

The backends take ``loss_fn_inputs`` already shifted (``retool.types``), so no
one shifts again.

Checks. A trajectory that breaks one of them is a bug in the rollout or a
corrupted journal, not a user error, so :class:`DatumError` is a plain
``ValueError`` (not a :class:`~retool.errors.RetoolError`) whose message names
the trajectory (question slot, branch, example id) and what is wrong: no turns,
completion and logprob lengths that differ at turn ``i``, a non-finite logprob
or advantage, an empty first prompt (the first sampled token would have no
position to be predicted from, and the shift would silently drop it), a prompt
that does not extend the tokens so far (with the first diverging position), no
assistant token at all, and an input longer than ``max_context_tokens``.

:func:`build_training_datums` keeps the reference's filter: only trajectories
with a non-zero advantage and at least one completion token train (and, here,
never an excluded one: those ended by an infrastructure failure carry no
reward). A group whose branches all scored the same has advantage 0 throughout
and sends nothing to the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from retool.rollout.types import Trajectory
from retool.types import Datum, ModelInput, TensorData

__all__ = [
    "LOSS_KEYS",
    "DatumError",
    "TrainingDatum",
    "build_datum",
    "build_training_datums",
    "datum_loss_tokens",
    "describe_trajectory",
    "trains",
]

LOSS_KEYS = ("advantages", "weights")
"""Per-token loss scalars: ``advantages`` for the RL losses, ``weights`` for SFT."""


class DatumError(ValueError):
    """A trajectory cannot be turned into a training datum (a data-integrity bug)."""


@dataclass(frozen=True)
class TrainingDatum:
    """A :class:`~retool.types.Datum` with what packing, scaling and metrics need."""

    datum: Datum  # what the backend receives (already shifted)
    num_tokens: int  # input length after the shift, prompt and observations included
    loss_tokens: int  # positions with a non-zero advantage (or weight)
    trajectory_index: int = 0  # position of the trajectory in its rollout batch
    label: str = ""  # names the trajectory in error messages (question, branch, example)

    @property
    def id(self) -> str:
        """What packing errors print for this item."""
        return self.label or f"trajectory {self.trajectory_index}"


def describe_trajectory(trajectory: Trajectory, index: int | None = None) -> str:
    """``trajectory 3 (question 1, branch 2, example 'gsm-17')`` for error messages."""
    where = f"question {trajectory.question_index}, branch {trajectory.group_index}, "
    where += f"example {trajectory.example.id!r}"
    return f"trajectory {index} ({where})" if index is not None else f"trajectory ({where})"


def datum_loss_tokens(datum: Datum) -> int:
    """Positions of ``datum`` that produce loss: non-zero ``advantages`` (else ``weights``)."""
    for key in LOSS_KEYS:
        if key in datum.loss_fn_inputs:
            return int(np.count_nonzero(datum.loss_fn_inputs[key].to_numpy()))
    raise DatumError(f"datum has neither of {LOSS_KEYS} among its loss_fn_inputs")


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where ``a`` and ``b`` differ (or the shorter length)."""
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position
    return min(len(a), len(b))


def build_datum(trajectory: Trajectory, max_context_tokens: int, index: int = 0) -> TrainingDatum:
    """The shifted PPO datum of ``trajectory`` (see the module docstring).

    ``index`` is the trajectory's position in its batch; it is kept on the
    result and named in errors. Raises :class:`DatumError` on every check.
    """
    label = describe_trajectory(trajectory, index)

    def fail(what: str) -> DatumError:
        return DatumError(f"{label}: {what}")

    if max_context_tokens < 1:
        raise fail(f"max_context_tokens must be >= 1, got {max_context_tokens}")
    if not trajectory.turns:
        raise fail("it has no assistant turns")
    advantage = float(trajectory.advantage)
    if not math.isfinite(advantage):
        raise fail(f"its advantage is {advantage}")

    tokens: list[int] = []
    old_logprobs: list[float] = []
    advantages: list[float] = []
    for i, turn in enumerate(trajectory.turns):
        prompt, completion, logprobs = turn.prompt_tokens, turn.completion_tokens, turn.logprobs
        if len(completion) != len(logprobs):
            raise fail(
                f"turn {i} has {len(completion)} completion tokens but {len(logprobs)} logprobs"
            )
        bad = next((j for j, lp in enumerate(logprobs) if not math.isfinite(lp)), None)
        if bad is not None:
            raise fail(f"turn {i} has a non-finite logprob ({logprobs[bad]}) at completion {bad}")
        if i == 0 and not prompt:
            raise fail("turn 0 has an empty prompt: its first sampled token cannot be trained")
        if len(prompt) < len(tokens) or list(prompt[: len(tokens)]) != tokens:
            at = _first_difference(prompt, tokens)
            found = prompt[at] if at < len(prompt) else "the end of the prompt"
            raise fail(
                f"turn {i}'s prompt ({len(prompt)} tokens) does not extend the {len(tokens)} "
                f"tokens of turns 0..{i - 1}: they diverge at position {at} "
                f"(expected {tokens[at]}, found {found})"
            )
        delta = len(prompt) - len(tokens)
        tokens.extend(prompt[len(tokens) :])
        tokens.extend(completion)
        old_logprobs.extend([0.0] * delta)
        old_logprobs.extend(float(lp) for lp in logprobs)
        advantages.extend([0.0] * delta)
        advantages.extend([advantage] * len(completion))

    if not any(turn.completion_tokens for turn in trajectory.turns):
        raise fail("it has no assistant token at all (every completion is empty)")
    if (
        not len(tokens) == len(old_logprobs) == len(advantages)
    ):  # pragma: no cover - by construction
        raise fail(
            f"internal length mismatch: {len(tokens)} tokens, {len(old_logprobs)} logprobs, "
            f"{len(advantages)} advantages"
        )
    num_tokens = len(tokens) - 1
    if num_tokens > max_context_tokens:
        raise fail(
            f"its training input has {num_tokens} tokens (after the shift), more than "
            f"max_context_tokens={max_context_tokens}; lower the rollout's trajectory budget "
            "or raise the training context limit"
        )

    shifted_advantages = advantages[1:]
    datum = Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "logprobs": TensorData.from_list(old_logprobs[1:], "float32"),
            "advantages": TensorData.from_list(shifted_advantages, "float32"),
        },
    )
    return TrainingDatum(
        datum=datum,
        num_tokens=num_tokens,
        loss_tokens=sum(1 for a in shifted_advantages if a != 0.0),
        trajectory_index=index,
        label=label,
    )


def trains(trajectory: Trajectory) -> bool:
    """Whether ``trajectory`` contributes to the loss (the reference's filter)."""
    return (
        not trajectory.excluded
        and trajectory.advantage != 0
        and any(turn.completion_tokens for turn in trajectory.turns)
    )


def build_training_datums(
    trajectories: Iterable[Trajectory], max_context_tokens: int
) -> list[TrainingDatum]:
    """One datum per training trajectory, in batch order; ``trajectory_index`` is its slot.

    Trajectories that do not train (advantage 0, excluded, or without a single
    completion token) are skipped; the others must pass every check of
    :func:`build_datum`. An empty result means the step has nothing to train.
    """
    return [
        build_datum(trajectory, max_context_tokens, index=index)
        for index, trajectory in enumerate(trajectories)
        if trains(trajectory)
    ]
