"""Keeping a sampler on the trainer's policy: one weight sync per optimizer step, each timed.

Both vLLM samplers of a run (the in-process engine's
:class:`~retool.backends.vllm.engine.VllmPolicySampler` and the servers'
:class:`~retool.backends.vllm.server_policy.ServerPolicySampler`) hand out one
sampling client per step; before it, the trainer's weights must have reached
the sampler once since the last optimizer step, never twice. How they get
there differs (a reload, a ``LoRARequest``, an HTTP publish); when, and the
timing the README figures and ``bench/`` read, is this one mixin's.
"""

from __future__ import annotations

import time

from retool.types import TrainingClient


class StepSynced:
    """A sampler that syncs the trainer's weights when its optimizer step moved.

    The class sets ``trainer``, ``synced_step`` (``None``: never synced) and
    ``sync_seconds`` (one entry per sync) and implements :meth:`_sync`.
    """

    trainer: TrainingClient
    synced_step: int | None
    sync_seconds: list[float]

    def trainer_step(self) -> int:
        return int(getattr(self.trainer, "steps", 0))

    def catch_up(self) -> int:
        """The trainer's step, its weights synced first when they moved since the last sync."""
        step = self.trainer_step()
        if self.synced_step != step:
            started = time.monotonic()
            self._sync(step)
            self.sync_seconds.append(time.monotonic() - started)
            self.synced_step = step
        return step

    def _sync(self, step: int) -> None:
        """Bring the trainer's weights after ``step`` optimizer steps to the sampler."""
        raise NotImplementedError
