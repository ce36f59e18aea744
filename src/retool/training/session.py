"""What the RL loop and SFT share: the run directory, the trainer and the step's commit points.

A :class:`Session` opens (or resumes) a run: the run directory, the
training client, the spend ledger, the progress display and the interrupt
guard. The loops call its phases in order, so each shows in the loop itself:

* :meth:`Session.forward_backward` per micro-batch, merging the trainer's metrics;
* :meth:`Session.optim_step`, the step's one optimizer step (none when nothing trains);
  :meth:`Session.update` is both, every call submitted before the first result is
  awaited (:mod:`retool.training.pipelining`: one round trip per update on a
  remote service, not one per micro-batch);
* :meth:`Session.checkpoint_if_due`: state and sampler directories, each
  renamed into place when complete;
* :meth:`Session.commit`: the step's rollouts file and metrics line, the commit point;
* :meth:`Session.add_checkpoint`: the manifest line, the checkpoint's commit point;
* :meth:`Session.report`: the summary line, ``log.txt`` and the tracker.

From ``optim_step`` to the manifest line the weights and the run directory
disagree, so the loops run those four inside ``session.guard.critical()``:
an interrupt there is deferred to its end. A kill between the metrics line
and the manifest line leaves a complete step whose checkpoint does not exist
yet, never a checkpoint without its step. :func:`emergency_checkpoint` saves
the last completed step on any other exit when the weights are consistent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from retool.backends.cleanup import close_quietly
from retool.backends.vllm import check_installed, open_policy_sampler
from retool.config import RunConfig
from retool.errors import ConfigError
from retool.interrupts import InterruptGuard
from retool.tracking import Tracker, make_tracker
from retool.training.cost import SpendLedger, StepTokens
from retool.training.datum import TrainingDatum
from retool.training.display import Display, step_summary
from retool.training.faults import crash_point
from retool.training.metrics import merge_trainer_metrics
from retool.training.numerics import open_service, record_numerics, sampler_numerics
from retool.training.packing import pack_micro_batches, padded_area
from retool.training.pipelining import submit_update
from retool.training.provenance import RunInputs, recorded_init_from
from retool.training.run_dir import RunDirectory, resolve_checkpoint
from retool.training.updates import merge_update_metrics
from retool.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    SamplingClient,
    ServiceClient,
    TrainingClient,
)

Summary = Callable[[int, int, dict[str, float]], str]


@dataclass
class LoopState:
    """What the loop knows about the trainer's consistency, for emergency saves."""

    completed: int = 0  # last step whose metrics line is written
    checkpointed: int = -1  # step of the newest manifest line
    consistent: bool = True  # weights == those after ``completed`` updates


class Phases:
    """Wall time per phase of one step."""

    def __init__(self, on_phase: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.on_phase = on_phase

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.on_phase is not None:
            self.on_phase(name)
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    def metrics(self) -> dict[str, float]:
        out = {f"time/{name}_s": value for name, value in self.seconds.items()}
        out["time/step_s"] = sum(self.seconds.values())
        return out


def write_checkpoint(trainer: TrainingClient, step: int) -> tuple[str, str]:
    """State and sampler weights (each directory renamed into place when complete)."""
    name = f"step_{step:06d}"
    state_path = trainer.save_state(name).result().path
    crash_point("state", step)
    sampler_path = trainer.save_weights_for_sampler(name).result().path
    return state_path, sampler_path


def save_checkpoint(
    run: RunDirectory, trainer: TrainingClient, step: int, state: LoopState
) -> None:
    """Both directories, then the manifest line (the commit point)."""
    run.add_checkpoint(step, *write_checkpoint(trainer, step))
    state.checkpointed = step


def open_trainer(
    service: ServiceClient,
    config: RunConfig,
    run: RunDirectory,
    resume: bool,
    init_from: str | None,
) -> tuple[TrainingClient, int, LoopState]:
    """The training client and the step to start from (0 = a new run)."""
    state = LoopState()
    last = run.last_checkpoint() if resume else None
    if last is not None:
        trainer = service.create_training_client_from_state_with_optimizer(last.state_path)
        run.rewind(last.step)
        state.completed = state.checkpointed = last.step
        return trainer, last.step, state
    if resume:
        run.rewind(0)  # killed before the first checkpoint: start over, keep step 1's journal
        init_from = recorded_init_from(run.inputs_path)  # what the run started from
    return new_trainer(service, config, init_from), 0, state


def new_trainer(service: ServiceClient, config: RunConfig, init_from: str | None) -> TrainingClient:
    """Step 1's trainer: ``--init-from``'s weights, else a new LoRA adapter or the full model."""
    if init_from:
        return service.create_training_client_from_state(str(resolve_checkpoint(init_from)))
    if config.model.lora_rank > 0:
        return service.create_lora_training_client(
            config.model.base_model, rank=config.model.lora_rank, seed=config.train.seed
        )
    return service.create_training_client(config.model.base_model, seed=config.train.seed)


@contextlib.contextmanager
def emergency_checkpoint(
    run: RunDirectory, trainer: TrainingClient, state: LoopState
) -> Iterator[None]:
    """On any exit by exception, save the last completed step if it is consistent."""
    try:
        yield
    except BaseException:
        if state.consistent and state.completed > state.checkpointed and state.completed > 0:
            try:
                save_checkpoint(run, trainer, state.completed, state)
                run.log(f"saved a checkpoint of step {state.completed} before stopping")
            except Exception as exc:  # the original error matters more
                run.log(f"could not save an emergency checkpoint: {exc}")
        raise


def _datums(micro_batches: list[list[TrainingDatum]]) -> list[list[Datum]]:
    return [[d.datum for d in micro_batch] for micro_batch in micro_batches]


def _update_metrics(
    micro_batches: list[list[TrainingDatum]], outputs: Sequence[ForwardBackwardOutput]
) -> dict[str, float]:
    """An update's ``train/*`` metrics: its counts, and the trainer's merged over its calls."""
    metrics: dict[str, float] = {
        "train/datums": float(sum(len(b) for b in micro_batches)),
        "train/micro_batches": float(len(micro_batches)),
        "train/tokens": float(sum(d.num_tokens for b in micro_batches for d in b)),
        "train/padded_tokens": float(padded_area(micro_batches)),
        "train/update_skipped": float(not micro_batches),
    }
    merged = merge_trainer_metrics([out.metrics for out in outputs])
    metrics.update({f"train/{k}": v for k, v in merged.items()})
    return metrics


class Session:
    """One run of the RL loop or of SFT: run directory, trainer, spend, display, guard."""

    def __init__(
        self,
        config: RunConfig,
        *,
        run_dir: str | None,
        resume: bool,
        init_from: str | None,
        tracker: str | None,
        progress: bool,
        per_step: int,
        unit: str,
        inputs: RunInputs | None = None,
    ) -> None:
        cfg = self.cfg = config.train
        self.config = config
        if config.sampler.engine == "vllm":
            check_installed()  # before the run directory exists
        self.run = RunDirectory.open(
            run_dir or cfg.run_dir, config, resume, inputs=inputs, init_from=init_from
        )
        self.sink: Tracker | None = None
        if tracker:
            self.sink = make_tracker(tracker, self.run.path, self.run.path.name, config.to_dict())
        service = self.service = open_service(config, self.run, resume)  # training/numerics.py
        self.trainer, self.start, self.state = open_trainer(
            service, config, self.run, resume, init_from
        )
        # local backend: per-role dtypes; a vLLM sampler computes in sampler.dtype
        self.numerics = sampler_numerics(getattr(service, "numerics", None), config)
        record_numerics(
            self.run, service, resume, self.numerics, getattr(self.trainer, "compile", None)
        )
        self.policy_sampler: Any = None  # sampler.engine = "vllm": the run's engine + weight sync
        limit = self.trainer.max_context_tokens
        if limit is not None and 0 < limit < cfg.max_train_tokens:
            raise ConfigError(
                f"train.max_train_tokens ({cfg.max_train_tokens}) is more than the trainer "
                f"accepts ({limit} tokens for {config.model.base_model} on "
                f"{config.model.backend}); lower it (and rollout.max_trajectory_tokens)"
            )
        # After open_trainer's rewind: the totals are those of the steps the run keeps.
        self.spend = SpendLedger.from_metrics(
            config.cost, self.run.metrics(), str(self.run.metrics_path)
        )
        self.budget_stop: str | None = None  # the line printed when the budget stopped the run
        self.adam = AdamParams(
            learning_rate=cfg.learning_rate,
            beta1=cfg.beta1,
            beta2=cfg.beta2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            grad_clip_norm=cfg.grad_clip_norm,
        )
        self.run.announce_start(self.start, resume, config.rollout.group_size)
        self.display = Display(cfg.steps, self.start, per_step, progress, unit)
        self.guard = InterruptGuard()

    def sampler(self) -> SamplingClient:
        """The step's sampling client for the trainer's current weights.

        The local sampler's is a frozen copy; a vLLM engine's weights are synced
        first (``sampler.sync``) and its replies carry the version they came from.
        """
        if self.config.sampler.engine == "local":
            return self.trainer.save_weights_and_get_sampling_client()
        if self.policy_sampler is None:  # at the first rollout: SFT never starts an engine
            root = self.run.checkpoint_root
            self.policy_sampler = open_policy_sampler(self.config, self.trainer, root)
        return self.policy_sampler.snapshot()

    def steps(self) -> Iterator[int]:
        """The steps left to run; stops early (see :meth:`stop_for_budget`) over budget."""
        for step in range(self.start + 1, self.cfg.steps + 1):
            reason = self.spend.over_budget()
            if reason is not None:
                self.stop_for_budget(step - 1, reason)
                return
            yield step

    def stop_for_budget(self, completed: int, reason: str) -> None:
        """Checkpoint the last completed step (unless it has one) and say why the run stops."""
        state = self.state
        if completed > 0 and state.checkpointed < completed and state.consistent:
            with self.guard.critical():
                save_checkpoint(self.run, self.trainer, completed, state)
        self.budget_stop = (
            f"budget stop after step {completed}: {reason}; checkpoint of step {completed} "
            "saved; raise the limit in [cost] and --resume to continue"
        )
        self.run.log(self.budget_stop)
        self.display.end_step(self.budget_stop, advance=False)

    @contextlib.contextmanager
    def running(self) -> Iterator[Session]:
        """Signals become :class:`~retool.interrupts.Interrupted`; an exit saves what it can."""
        try:
            with self.guard.installed(), emergency_checkpoint(self.run, self.trainer, self.state):
                yield self
        finally:
            self.display.close()
            self.run.close()
            if self.sink is not None:
                self.sink.close()
            if self.policy_sampler is not None:
                close_quietly(self.policy_sampler, "vLLM sampler")
            # a remote session ends now, not at process exit; a failing close only warns
            close_quietly(self.service, "training service")

    def pack(self, datums: Sequence[TrainingDatum]) -> list[list[TrainingDatum]]:
        return pack_micro_batches(datums, self.cfg.micro_batch_items, self.cfg.micro_batch_tokens)

    def forward_backward(
        self,
        micro_batches: list[list[TrainingDatum]],
        loss: str,
        loss_config: dict[str, float] | None,
        phases: Phases,
    ) -> dict[str, float]:
        """``forward_backward`` per micro-batch (gradients accumulate); the update's metrics.

        Every call is submitted before the first is awaited
        (:mod:`retool.training.pipelining`); no ``optim_step`` is: the caller's
        :meth:`optim_step` follows. :meth:`update` submits that one too.
        """
        with phases("training"):
            done = submit_update(self.trainer, _datums(micro_batches), loss, loss_config).result()
        return _update_metrics(micro_batches, done.forward)

    def update(
        self,
        step: int,
        micro_batches: list[list[TrainingDatum]],
        loss: str,
        loss_config: dict[str, float] | None,
        phases: Phases,
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One whole update: ``forward_backward`` per micro-batch and the ``optim_step``
        (none when nothing trains), all submitted before the first result is awaited
        (:mod:`retool.training.pipelining`, which says what a failure then means).

        Returns what :meth:`forward_backward` and :meth:`optim_step` return, in
        that order. The ``optim_step`` may change the weights before any result
        is back, so the weights count as ahead of the run directory from its
        submission: call it inside ``self.guard.critical()``, kept open to the
        manifest line.
        """
        adam = self.adam if micro_batches else None
        with phases("training"):
            pending = submit_update(
                self.trainer, _datums(micro_batches), loss, loss_config, adam, self._weights_ahead
            )
            done = pending.result()
        trained = _update_metrics(micro_batches, done.forward)
        if done.optim is None:
            return trained, {}
        crash_point("optim", step)
        return trained, {f"optim/{k}": v for k, v in done.optim.metrics.items()}

    def _weights_ahead(self) -> None:
        """An ``optim_step`` is about to be submitted: no emergency checkpoint from here."""
        self.state.consistent = False

    def optim_step(
        self, step: int, metrics: Mapping[str, float], phases: Phases
    ) -> dict[str, float]:
        """One optimizer step, unless ``metrics`` (the update's) say nothing trained; its
        ``optim/*`` metrics.

        From here to :meth:`commit` the weights are ahead of the run directory:
        call it inside ``self.guard.critical()``.
        """
        if metrics["train/update_skipped"]:
            return {}
        self._weights_ahead()
        with phases("training"):
            optim = self.trainer.optim_step(self.adam).result()
        crash_point("optim", step)
        return {f"optim/{k}": v for k, v in optim.metrics.items()}

    def optimize(
        self,
        step: int,
        first: dict[str, float],
        more: list[list[list[TrainingDatum]]],
        loss: str,
        loss_config: dict[str, float] | None,
        phases: Phases,
    ) -> dict[str, float]:
        """The first update's ``optim_step`` (``first``: its :meth:`forward_backward`
        metrics), then each further :meth:`update` (``train.updates_per_step``,
        :mod:`retool.training.updates`); the step's metrics.

        From the first ``optim_step`` to :meth:`commit` the weights are ahead of
        the run directory: call it inside ``self.guard.critical()``, kept open to
        the manifest line. The first ``forward_backward`` changes no weights, so
        the caller runs it before that block and a signal there stops at once.
        """
        done, optims = [first], [self.optim_step(step, first, phases)]
        for micro_batches in more:
            trained, optim = self.update(step, micro_batches, loss, loss_config, phases)
            done.append(trained)
            optims.append(optim)
        return merge_update_metrics(done, optims)

    def checkpoint_if_due(self, step: int, phases: Phases) -> tuple[str, str] | None:
        """The state and sampler directories when ``step`` is due (the last, every save_every)."""
        cfg = self.cfg
        if not (step == cfg.steps or bool(cfg.save_every and step % cfg.save_every == 0)):
            return None
        with phases("checkpoint"):
            paths = write_checkpoint(self.trainer, step)
        crash_point("checkpoint", step)
        return paths

    def commit(
        self,
        step: int,
        metrics: dict[str, float],
        phases: Phases,
        records: Sequence[Any],
        tokens: StepTokens,
    ) -> None:
        """The step's rollouts file, then its metrics line (the step's commit point)."""
        metrics.update(phases.metrics())
        metrics.update(self.spend.metrics(tokens, step, self.cfg.steps))
        self.run.complete_step(step, metrics, records)
        self.spend.add(tokens)
        self.state.completed, self.state.consistent = step, True
        crash_point("committed", step)

    def add_checkpoint(self, step: int, paths: tuple[str, str] | None) -> None:
        """The manifest line of a checkpoint written this step (the checkpoint's commit point)."""
        if paths is not None:
            self.run.add_checkpoint(step, *paths)
            self.state.checkpointed = step

    def report(
        self,
        step: int,
        metrics: dict[str, float],
        tokens: StepTokens,
        note: str = "",
        summary: Summary | None = None,
    ) -> None:
        """The step's summary line (stdout and ``log.txt``) and its metrics to the tracker."""
        line = (summary or step_summary)(step, self.cfg.steps, metrics)
        line += self.spend.summary(tokens) + note
        self.run.log(line)
        self.display.end_step(line)
        if self.sink is not None:
            self.sink.log(metrics, step)
