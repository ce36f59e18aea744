"""What a step's summary line adds about trajectories that did not count, and when
infrastructure failures stop the run.

A trajectory is *excluded* when it never ran to an end of its own: its first
prompt did not fit (``prompt_too_long``) or the sampler or sandbox kept failing
after every retry (``sampler_error``, ``sandbox_error``). Excluded trajectories
carry no reward and train nothing, so a step whose samples all failed used to
look like a step whose groups all scored alike ("update skipped"), with the
failures only in ``metrics.jsonl``. Here:

* :func:`exclusion_note`: every step that excluded any trajectory says on the
  console how many, for which reasons, and the last infrastructure error;
* :func:`infrastructure_stop`: a step whose every trajectory failed in the
  sampler or the sandbox stops the run (the loop raises
  :class:`~retool.errors.ServiceError`: one line, exit 2; the last completed
  step keeps its checkpoint, see ``emergency_checkpoint``). Training on a dead
  service would only burn steps that a ``--resume`` can redo once it is back.
  ``prompt_too_long`` is a setting, not a failure: it never stops the run.
* :class:`AlikeNote`: a step where every group scored alike says once, with
  what to do (a base model that never or always answers right gives no
  signal: ``retool sft`` first, ``retool preflight`` to check); later such
  steps keep a short note.
  A step that trains nothing because ``rollout.drop_void`` dropped what would
  have trained says that instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from retool.rollout.types import StopReason, Trajectory

INFRASTRUCTURE_STOPS = frozenset({StopReason.SAMPLER_ERROR, StopReason.SANDBOX_ERROR})

_ERROR_CHARS = 160  # the last error is one line on the console, cut to this length


def _last_error(trajectories: Sequence[Trajectory]) -> str | None:
    for trajectory in reversed(trajectories):
        if trajectory.error:
            first = trajectory.error.strip().splitlines()[0] if trajectory.error.strip() else ""
            return first[:_ERROR_CHARS] or None
    return None


def exclusion_note(trajectories: Sequence[Trajectory]) -> str:
    """``"  excluded 3/8: 2 sampler_error, 1 prompt_too_long (last error: ...)"``, or ``""``."""
    excluded = [t for t in trajectories if t.excluded]
    if not excluded:
        return ""
    counts = Counter(str(t.stop_reason) for t in excluded)
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    note = f"  excluded {len(excluded)}/{len(trajectories)}: {reasons}"
    failed = [t for t in excluded if t.stop_reason in INFRASTRUCTURE_STOPS]
    if (error := _last_error(failed)) is not None:
        note += f" (last error: {error})"
    return note


def infrastructure_stop(
    step: int,
    trajectories: Sequence[Trajectory],
    *,
    sample_retries: int,
    sandbox_retries: int,
    completed: int,
) -> str | None:
    """The line that stops the run when every trajectory of ``step`` failed in a service."""
    if not trajectories or any(t.stop_reason not in INFRASTRUCTURE_STOPS for t in trajectories):
        return None
    counts = Counter(t.stop_reason for t in trajectories)
    parts = []
    for reason, where, retries in (
        (StopReason.SAMPLER_ERROR, "sampler", sample_retries),
        (StopReason.SANDBOX_ERROR, "sandbox", sandbox_retries),
    ):
        if n := counts[reason]:
            plural = "retry" if retries == 1 else "retries"
            parts.append(f"{n} in the {where} after {retries} {plural} each")
    error = _last_error(trajectories)
    if completed:
        kept = f"step {completed} is the last completed one and keeps its checkpoint"
        then = "run the same command with --resume"
    else:  # a new run's directory holds nothing to resume and is removed on the way out
        kept, then = "no step was completed", "run the same command again"
    return (
        f"step {step}: all {len(trajectories)} trajectories failed ({', '.join(parts)}"
        f"{f'; last error: {error}' if error else ''}); the run stops, {kept}; "
        f"once the service works again, {then}"
    )


class AlikeNote:
    """The note of a step where nothing trains because every group scored alike."""

    def __init__(self) -> None:
        self.said = False

    def __call__(self, trained: bool, excluded_all: bool = False, void: bool = False) -> str:
        """``void``: some group scored differently, but rollout.drop_void dropped
        every trajectory that would have trained."""
        if trained or excluded_all:
            return ""
        if void:
            return (
                "  (nothing to train: the groups that scored differently held only void "
                "trajectories, and rollout.drop_void dropped them)"
            )
        if self.said:
            return "  (every group scored alike: nothing to train)"
        self.said = True
        return (
            "  (every group scored alike: nothing to train; a model that is always wrong, "
            "or always right, gives no signal: train it with `retool sft` first, or see "
            "what it does with `retool preflight`)"
        )
