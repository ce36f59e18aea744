"""An update's trainer calls submitted together: each ``forward_backward``, its ``optim_step``.

Design, and why:

* **One round trip per update, not per call.** A remote service (Tinker,
  PyTRIO) answers each call after a network round trip, and Tinker runs
  requests in clock cycles: waiting on each ``forward_backward`` before the
  next is submitted pays that once per micro-batch, in series, and the
  ``optim_step`` once more. Both SDKs run one training client's calls in the
  order they were submitted (:mod:`retool.backends.remote`), so
  :func:`submit_update` submits all of an update's calls before the first
  result is awaited, and :meth:`PendingUpdate.result` then awaits them in
  order. tinker-cookbook's RL step does the same (``forward_backward`` then
  ``optim_step`` submitted, then awaited), as the Tinker SDK recommends
  (tinker/lib/public_interfaces/training_client.py, the note on
  ``forward_backward_async``).
* **The local backend is unchanged.** Its calls compute as they are
  submitted (the future it returns is already done), so the calls run in the
  same order, on the same data, with the same numbers as when each was
  awaited in turn.
* **A failure known at submission stops the submission.** A call whose
  future has already failed when it returns (a local backend's error, a
  remote adapter's check before any request, an SDK refusing to send) is the
  last one submitted: no later ``forward_backward`` and no ``optim_step``,
  exactly as when each call was awaited before the next.
* **A failure the service reports later** surfaces as the same error, when
  its result is awaited in order; the calls after it, and the update's
  ``optim_step``, are with the service already. The service may then step
  the optimizer over the gradients of the calls that succeeded (a partial
  update), or refuse the rest; nothing here waits to find out. So the caller
  counts the weights as ahead of the run directory from the moment the
  ``optim_step`` is submitted (``on_optim``): the training session then
  writes no emergency checkpoint of them, and ``--resume`` starts again from
  the last checkpoint, whose weights are those of a committed step.
  tinker-cookbook behaves the same way (its awaited ``forward_backward``
  raises with the ``optim_step`` in flight).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from retool.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    Future,
    OptimStepOutput,
    TrainingClient,
)


@dataclass(frozen=True)
class UpdateOutputs:
    """What one update's calls returned, in the order they were submitted."""

    forward: tuple[ForwardBackwardOutput, ...]  # one per micro-batch
    optim: OptimStepOutput | None  # None: no optim_step was submitted


def _failed(future: Future[Any]) -> bool:
    """Whether ``future`` has already failed (never waits)."""
    if not future.done():
        return False
    try:
        future.result()
    except BaseException:
        return True
    return False


class PendingUpdate:
    """An update's submitted calls; :meth:`result` awaits them in submission order."""

    def __init__(
        self,
        forward: Sequence[Future[ForwardBackwardOutput]],
        optim: Future[OptimStepOutput] | None,
    ) -> None:
        self.forward = tuple(forward)
        self.optim = optim

    def result(self) -> UpdateOutputs:
        """Every ``forward_backward``'s output, then the ``optim_step``'s; the first
        failure, in submission order, is raised as the call raised it."""
        forward = tuple(future.result() for future in self.forward)
        return UpdateOutputs(forward, None if self.optim is None else self.optim.result())


def submit_update(
    trainer: TrainingClient,
    batches: Sequence[Sequence[Datum]],
    loss: str,
    loss_config: dict[str, float] | None,
    adam: AdamParams | None = None,
    on_optim: Callable[[], None] | None = None,
) -> PendingUpdate:
    """Submit ``forward_backward`` per batch, then ``optim_step(adam)`` when ``adam`` is
    given, before awaiting any of them.

    ``on_optim`` runs just before the ``optim_step`` is submitted (from then on
    the weights may change). A call that has already failed when it returns
    ends the submission (see the module's docstring).
    """
    forward: list[Future[ForwardBackwardOutput]] = []
    for batch in batches:
        future = trainer.forward_backward(list(batch), loss, loss_config)
        forward.append(future)
        if _failed(future):
            return PendingUpdate(forward, None)
    if adam is None:
        return PendingUpdate(forward, None)
    if on_optim is not None:
        on_optim()
    return PendingUpdate(forward, trainer.optim_step(adam))
