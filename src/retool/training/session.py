"""What the RL loop and SFT share: the run directory, the trainer and the step's commit points.

A :class:`Session` opens (or resumes) a run: the run directory, the
training client, the spend ledger, the progress display and the interrupt
guard. The loops call its phases in order, so each shows in the loop itself:

* :meth:`Session.train`: the step's updates, each an :meth:`Session.update`
  (``forward_backward`` per micro-batch, then the ``optim_step``; none when
  nothing trains), every call of an update submitted before the first result is
  awaited (:mod:`retool.training.pipelining`: one round trip per update on a
  remote service, not one per micro-batch);
* :meth:`Session.checkpoint_if_due`: state and sampler directories, each
  renamed into place when complete;
* :meth:`Session.commit`: the step's rollouts file and metrics line, the commit point;
* :meth:`Session.add_checkpoint`: the manifest line, the checkpoint's commit point;
* :meth:`Session.report`: the summary line, ``log.txt`` and the tracker.

From the first ``optim_step``'s submission to the manifest line the weights
and the run directory disagree, so the loops run the updates inside
``session.guard.deferred_from()`` and pass its ``hold`` down: the
``forward_backward`` calls before that stay interruptible, and from ``hold()``
an interrupt is deferred to the block's end. A kill between the metrics line
and the manifest line leaves a complete step whose checkpoint does not exist
yet, never a checkpoint without its step. :func:`emergency_checkpoint` saves
the last completed step on any other exit when the weights are consistent.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from retool.backends import service_client, tunes_numerics
from retool.backends.cleanup import close_quietly
from retool.backends.vllm import check_installed, open_policy_sampler
from retool.backends.vllm.choice import resolve_engine
from retool.config import RunConfig
from retool.errors import ConfigError
from retool.interrupts import InterruptGuard
from retool.tracking import Tracker, make_tracker
from retool.training.cost import SpendLedger, StepTokens
from retool.training.datum import TrainingDatum
from retool.training.display import Display, step_summary
from retool.training.faults import crash_point
from retool.training.metrics import merge_trainer_metrics
from retool.training.numerics import (
    check_supported,
    read_numerics,
    record_numerics,
    sampler_numerics,
)
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

if TYPE_CHECKING:
    from retool.backends.vllm import VllmPolicySampler
    from retool.backends.vllm.server_policy import ServerPolicySampler
    from retool.rollout.types import Trajectory

Summary = Callable[[int, int, dict[str, float]], str]


@dataclass(frozen=True)
class StepTraining:
    """What :meth:`Session.train` returns for one RL step."""

    metrics: dict[str, float]  # the step's train/* and optim/* metrics, merged over updates
    first: dict[str, float]  # the first update's train/* metrics (before any weight changed)


@dataclass
class LoopState:
    """What the loop knows about the trainer's consistency, for emergency saves."""

    completed: int = 0  # last step whose metrics line is written
    checkpointed: int = -1  # step of the newest manifest line
    consistent: bool = True  # weights == those after ``completed`` updates
    # overlapped steps (retool.training.overlap): whether the rollouts a resume from a
    # checkpoint of step c needs are journaled (those of steps up to c + k), and a wait
    # for them; without a lag a checkpoint needs none
    ready: Callable[[int], bool] = lambda step: True
    settle: Callable[[int], None] = lambda step: None
    flush: Callable[[], None] = lambda: None  # list the checkpoints that waited for them
    lag: int = 0


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


def memory_metrics() -> dict[str, float]:
    """This process's resident memory after the step and its peak so far, in GB.

    A leak shows as ``memory/rss_gb`` rising step after step (as the sampler's
    batch buffers once did, ``backends/local/kv.py``); on a remote backend the
    figures are the driver's own.
    """
    out: dict[str, float] = {}
    try:  # first, so that the peak read after it is never below it
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    out["memory/rss_gb"] = int(line.split()[1]) * 1024 / 1e9  # kB (KiB)
    except OSError:  # no /proc (macOS): the peak only
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out["memory/peak_rss_gb"] = peak * (1 if sys.platform == "darwin" else 1024) / 1e9
    return out


def service_options(config: RunConfig) -> dict[str, Any]:
    """What :func:`~retool.backends.service_client` passes to a backend that picks its
    dtypes on this host: the run's workload, which ``model.dtype = "auto"`` measures."""
    if not tunes_numerics(config.model):
        return {}
    from retool.backends.local.dtype import Workload  # imports torch: only when used

    return {"workload": Workload.from_config(config)}


def open_service(config: RunConfig, run: RunDirectory, resume: bool) -> ServiceClient:
    """The run's service client; one that picks its dtypes gets the workload and, on
    resume, the numerics the run recorded (an ``auto`` run keeps its choice)."""
    check_supported(config)
    options = service_options(config)
    if options and resume:
        options["numerics"] = read_numerics(run.path)
    return service_client(config.model, checkpoint_root=run.checkpoint_root, **options)


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
            if not state.ready(state.completed + state.lag):
                run.log(
                    f"no checkpoint of step {state.completed} saved before stopping: the "
                    "rollouts sampled before it for the steps after it are not all journaled "
                    "(train.max_off_policy_steps); --resume starts from the last checkpoint"
                )
                raise
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
        config, self.engine_choice = resolve_engine(config)  # "auto": ours or vLLM, here
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
        service = self.service = open_service(config, self.run, resume)
        self.trainer, self.start, self.state = open_trainer(
            service, config, self.run, resume, init_from
        )
        # local backend: per-role dtypes; a vLLM sampler computes in sampler.dtype
        self.numerics = sampler_numerics(getattr(service, "numerics", None), config)
        record_numerics(
            self.run,
            service,
            resume,
            self.numerics,
            getattr(self.trainer, "compile", None),
            self.engine_choice,
        )
        # sampler.engine = "vllm": the run's engine (or servers) + weight sync
        self.policy_sampler: VllmPolicySampler | ServerPolicySampler | None = None
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
        assert self.policy_sampler is not None  # sampler.engine = "vllm" opens one
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
        state.settle(completed + state.lag)  # overlapped: the later rollouts journaled,
        state.flush()  # and the checkpoints waiting for them listed
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

    def update(
        self,
        step: int,
        micro_batches: list[list[TrainingDatum]],
        loss: str,
        loss_config: dict[str, float] | None,
        phases: Phases,
        hold: Callable[[], None],
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One update: ``forward_backward`` per micro-batch and the ``optim_step``
        (none when nothing trains), all submitted before the first result is awaited
        (:mod:`retool.training.pipelining`, which says what a failure then means).

        Returns the update's ``train/*`` metrics and its ``optim/*`` metrics. The
        ``optim_step`` may change the weights before any result is back, so
        ``hold`` (the ``hold`` of :meth:`~retool.interrupts.InterruptGuard.deferred_from`)
        is called just before it is submitted: from then to the manifest line the
        weights are ahead of the run directory and a stop signal waits.
        """
        adam = self.adam if micro_batches else None

        def weights_ahead() -> None:
            hold()
            self.state.consistent = False  # no emergency checkpoint of these weights

        with phases("training"):
            pending = submit_update(
                self.trainer, _datums(micro_batches), loss, loss_config, adam, weights_ahead
            )
            done = pending.result()
        trained = _update_metrics(micro_batches, done.forward)
        if done.optim is None:
            return trained, {}
        crash_point("optim", step)
        return trained, {f"optim/{k}": v for k, v in done.optim.metrics.items()}

    def train(
        self,
        step: int,
        updates: Sequence[list[list[TrainingDatum]]],
        loss: str,
        loss_config: dict[str, float] | None,
        phases: Phases,
        hold: Callable[[], None],
    ) -> StepTraining:
        """The step's updates (``train.updates_per_step``, :mod:`retool.training.updates`),
        each an :meth:`update`, in order; the step's merged metrics and the first
        update's own (the sampler/trainer mismatch is measured before any update)."""
        done, optims = [], []
        for micro_batches in updates:
            trained, optim = self.update(step, micro_batches, loss, loss_config, phases, hold)
            done.append(trained)
            optims.append(optim)
        return StepTraining(merge_update_metrics(done, optims), done[0] if done else {})

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
        records: Sequence[Trajectory | dict[str, Any]],  # RL trajectories, SFT conversations
        tokens: StepTokens,
    ) -> None:
        """The step's rollouts file, then its metrics line (the step's commit point)."""
        metrics.update(phases.metrics())
        metrics.update(memory_metrics())
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
