"""The RL step loop: one function a reader can follow top to bottom.

Per step ``s`` (1-based; seeds and batches derive from it):

1. snapshot the policy into a sampling client (the weights after ``s - 1`` updates);
2. roll out ``questions_per_batch x group_size`` trajectories (journaled as they end);
3. build one datum per trajectory with a non-zero advantage, scale the
   advantages for the loss aggregation, pack micro-batches by padded area;
4. ``forward_backward`` per micro-batch, then ONE ``optim_step`` (skipped and
   logged when nothing trains);
5. when a checkpoint is due, write its state and sampler directories;
6. commit the step (rollouts file, then its metrics line), then the
   checkpoint's manifest line: a kill between the two leaves a complete step
   whose checkpoint does not exist yet, never a checkpoint without its step.

Each step also records its spend (``cost/*``: prefill, sampled and trained
tokens, money when ``[cost]`` sets prices; see :mod:`retool.training.cost`).
Before a step, when the mean step so far would take the run past
``cost.max_tokens`` or ``cost.max_money``, the loop checkpoints the last
completed step, says why in one line and returns normally.

Every phase is timed (``time/<phase>_s`` in the metrics) so an idle phase
shows. Interrupts (SIGINT, SIGTERM) are deferred while the weights and the
step record disagree (from ``optim_step`` to the metrics line); otherwise the
loop stops at once, writes a checkpoint of the last completed step if it has
none, and exits. Any other exception writes the same emergency checkpoint
when the state is consistent, then propagates.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.config import RunConfig
from retool.errors import ConfigError, RetoolError
from retool.training.cost import SpendLedger, StepTokens, step_tokens
from retool.training.faults import crash_point
from retool.training.run_dir import RunDirectory


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the run stopped after saving what it had.

    A ``KeyboardInterrupt`` (not an ``Exception``) on purpose: it can arrive
    anywhere, including inside the ``except Exception`` of a retry loop or a
    progress callback, and must never be swallowed or retried there; asyncio
    also propagates it out of the event loop as it does Ctrl-C.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}; continue with --resume")
        self.signum = signum


def _not_interrupted(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, Interrupted)


_QUIETED = False


def _quiet_leftover_interrupts() -> None:
    """Keep an interrupt from printing tracebacks after it has been handled.

    The interrupted rollout leaves asyncio tasks holding the exception; when
    they are collected (often after the run has returned) asyncio logs "Task
    exception was never retrieved" with a traceback, and a signal that lands in
    a finalizer is printed as "Exception ignored". The interrupt is reported
    once, by the CLI, so both are dropped for the rest of the process; every
    other record and unraisable exception passes through unchanged.
    """
    global _QUIETED
    if _QUIETED:
        return
    _QUIETED = True
    logging.getLogger("asyncio").addFilter(_not_interrupted)
    previous = sys.unraisablehook

    def hook(info: Any) -> None:
        if not isinstance(info.exc_value, Interrupted):
            previous(info)

    sys.unraisablehook = hook


class InterruptGuard:
    """Turns SIGINT/SIGTERM/SIGHUP into :class:`Interrupted`, deferred inside ``critical()``.

    SIGHUP (the terminal closed) is one more way to be asked to stop: without
    it here, the CLI's own handler would raise in the middle of a checkpoint.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self.fired: int | None = None  # the last signal, even if something swallowed it
        self._depth = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.fired = signum
        if self._depth:
            self.pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[InterruptGuard]:
        if threading.current_thread() is threading.main_thread():  # signals only work there
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._previous[signum] = signal.signal(signum, self._handle)
        _quiet_leftover_interrupts()
        try:
            yield self
        finally:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)

    def check(self) -> None:
        """Raise a signal that arrived but was lost (caught by third-party code)."""
        if self.fired is not None:
            raise Interrupted(self.fired)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise Interrupted(signum)


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


def write_checkpoint(trainer: Any, step: int) -> tuple[str, str]:
    """State and sampler weights (each directory renamed into place when complete)."""
    name = f"step_{step:06d}"
    state_path = trainer.save_state(name).result().path
    crash_point("state", step)
    sampler_path = trainer.save_weights_for_sampler(name).result().path
    return state_path, sampler_path


def save_checkpoint(run: RunDirectory, trainer: Any, step: int, state: LoopState) -> None:
    """Both directories, then the manifest line (the commit point)."""
    run.add_checkpoint(step, *write_checkpoint(trainer, step))
    state.checkpointed = step


def resolve_checkpoint(spec: str) -> Path:
    """``--init-from``: a state directory, or a run directory (its latest checkpoint)."""
    path = Path(spec)
    if (path / "retool_state.json").is_file():
        return path
    if (path / "checkpoints.jsonl").is_file():
        record = RunDirectory(path).last_checkpoint()
        if record is None:
            raise RetoolError(f"--init-from {spec}: the run has no complete checkpoint")
        return Path(record.state_path)
    raise RetoolError(
        f"--init-from {spec}: not a checkpoint (no retool_state.json) nor a run directory "
        "(no checkpoints.jsonl)"
    )


def open_trainer(
    service: Any, config: RunConfig, run: RunDirectory, resume: bool, init_from: str | None
) -> tuple[Any, int, LoopState]:
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
    if init_from:
        trainer = service.create_training_client_from_state(str(resolve_checkpoint(init_from)))
    elif config.model.lora_rank > 0:
        trainer = service.create_lora_training_client(
            config.model.base_model, rank=config.model.lora_rank, seed=config.train.seed
        )
    else:
        trainer = service.create_training_client(config.model.base_model, seed=config.train.seed)
    return trainer, 0, state


@contextlib.contextmanager
def emergency_checkpoint(run: RunDirectory, trainer: Any, state: LoopState) -> Iterator[None]:
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


class Display:
    """An outer bar over steps and an inner one over trajectories (tqdm; silent off a TTY).

    One summary line per step is printed either way.
    """

    def __init__(
        self, total_steps: int, first_step: int, per_step: int, enabled: bool, unit: str
    ) -> None:
        from tqdm import tqdm

        disable = None if enabled else True  # None: tqdm turns itself off when not a TTY
        self.steps = tqdm(
            total=total_steps,
            initial=first_step,
            desc="steps",
            unit="step",
            disable=disable,
            position=0,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.inner = tqdm(
            total=per_step,
            desc="step",
            unit=unit,
            disable=disable,
            position=1,
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self._tqdm = tqdm

    def phase(self, name: str) -> None:
        self.inner.set_description_str(name)

    def advance(self, count: int) -> None:
        self.inner.update(count)

    def new_step(self, phase: str) -> None:
        self.inner.reset()
        self.inner.set_description_str(phase)

    def end_step(self, line: str, advance: bool = True) -> None:
        if advance:
            self.steps.update(1)
        self._tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        self.inner.close()
        self.steps.close()


def step_summary(step: int, total: int, metrics: dict[str, float]) -> str:
    loss = metrics.get("train/loss:sum")
    # PPO's loss on freshly sampled tokens is ~0 by construction (ratio 1, advantages
    # centred per group), so it is printed to 3 significant digits, not as -0.0000,
    # with the gradient norm that shows the update is not.
    loss_text = "update skipped"
    if loss is not None:
        loss_text = f"loss {loss:+.3g}"
        if "optim/grad_norm" in metrics:
            loss_text += f"  grad norm {metrics['optim/grad_norm']:.3g}"
    return (
        f"step {step}/{total}  {metrics['time/step_s']:.1f}s  {loss_text}  "
        f"reward {metrics['reward/mean']:+.3f}  correct {metrics['reward/correct']:.3f}  "
        f"code calls {metrics['rollout/code_calls']:.2f}  "
        f"{metrics['rollout/tokens_per_s']:.0f} tok/s"
    )


class Session:
    """What the RL loop and SFT share: run directory, trainer, optimizer step, commits.

    ``update`` runs the step's micro-batches and its one optimizer step;
    ``commit`` writes the step (checkpoint directories when due, the metrics
    line, then the manifest line) with interrupts deferred, so the weights and
    the run directory never disagree at a kill.
    """

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
    ) -> None:
        from retool.backends import service_client
        from retool.types import AdamParams

        cfg = self.cfg = config.train
        self.config = config
        self.run = RunDirectory.open(run_dir or cfg.run_dir, config, resume)
        self.sink = None
        if tracker:
            from retool.tracking import make_tracker

            self.sink = make_tracker(tracker, self.run.path, self.run.path.name, config.to_dict())
        service = self.service = service_client(
            config.model, checkpoint_root=self.run.checkpoint_root
        )
        self.trainer, self.start, self.state = open_trainer(
            service, config, self.run, resume, init_from
        )
        limit = getattr(self.trainer, "max_context_tokens", None)
        if isinstance(limit, int) and 0 < limit < cfg.max_train_tokens:
            raise ConfigError(
                f"train.max_train_tokens ({cfg.max_train_tokens}) is more than the trainer "
                f"accepts ({limit} tokens for {config.model.base_model} on "
                f"{config.model.backend}); lower it (and rollout.max_trajectory_tokens)"
            )
        # After open_trainer's rewind: the totals are those of the steps the run keeps.
        self.spend = SpendLedger.from_metrics(config.cost, self.run.metrics())
        self.budget_stop: str | None = None  # the line printed when the budget stopped the run
        self.adam = AdamParams(
            learning_rate=cfg.learning_rate,
            beta1=cfg.beta1,
            beta2=cfg.beta2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            grad_clip_norm=cfg.grad_clip_norm,
        )
        self.run.log(
            f"{'resuming after' if self.start else 'starting at'} step {self.start}; "
            f"{cfg.steps} steps"
        )
        self.display = Display(cfg.steps, self.start, per_step, progress, unit)
        self.guard = InterruptGuard()

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
        try:
            with self.guard.installed(), emergency_checkpoint(self.run, self.trainer, self.state):
                yield self
        finally:
            self.display.close()
            if self.sink is not None:
                self.sink.close()
            close = getattr(self.service, "close", None)
            if callable(close):  # a remote session ends now, not at process exit
                close()

    def pack(self, datums: list[Any]) -> list[list[Any]]:
        from retool.training.packing import pack_micro_batches

        return pack_micro_batches(datums, self.cfg.micro_batch_items, self.cfg.micro_batch_tokens)

    def update(
        self,
        step: int,
        micro_batches: list[list[Any]],
        loss: str,
        loss_config: dict[str, float] | None,
        phases: Phases,
    ) -> dict[str, float]:
        """``forward_backward`` per micro-batch, then one ``optim_step``; the step's metrics.

        Returns inside the deferred-interrupt section's caller: call :meth:`commit` next.
        """
        from retool.training.metrics import merge_trainer_metrics
        from retool.training.packing import padded_area

        outputs = []
        with phases("training"):
            for micro_batch in micro_batches:
                out = self.trainer.forward_backward(
                    [d.datum for d in micro_batch], loss, loss_config
                ).result()
                outputs.append(out.metrics)
        metrics: dict[str, float] = {
            "train/datums": float(sum(len(b) for b in micro_batches)),
            "train/micro_batches": float(len(micro_batches)),
            "train/tokens": float(sum(d.num_tokens for b in micro_batches for d in b)),
            "train/padded_tokens": float(padded_area(micro_batches)),
            "train/update_skipped": float(not micro_batches),
        }
        metrics.update({f"train/{k}": v for k, v in merge_trainer_metrics(outputs).items()})
        return metrics

    def commit(
        self,
        step: int,
        metrics: dict[str, float],
        phases: Phases,
        records: Any,
        note: str = "",
        summary: Callable[[int, int, dict[str, float]], str] | None = None,
        tokens: StepTokens | None = None,
    ) -> None:
        """Optimizer step (if anything trained), checkpoint when due, metrics line, manifest.

        ``tokens``: the step's spend; by default only its trained tokens
        (``train/tokens``), which is all an SFT step has.
        """
        cfg, state = self.cfg, self.state
        tokens = tokens or StepTokens(trained=int(metrics["train/tokens"]))
        with self.guard.critical():
            if not metrics["train/update_skipped"]:
                state.consistent = False
                with phases("training"):
                    optim = self.trainer.optim_step(self.adam).result()
                crash_point("optim", step)
                metrics.update({f"optim/{k}": v for k, v in optim.metrics.items()})
            due = step == cfg.steps or bool(cfg.save_every and step % cfg.save_every == 0)
            paths = None
            if due:
                with phases("checkpoint"):
                    paths = write_checkpoint(self.trainer, step)
                crash_point("checkpoint", step)
            metrics.update(phases.metrics())
            metrics.update(self.spend.metrics(tokens, step, cfg.steps))
            # The metrics line commits the step; the manifest line, the checkpoint.
            self.run.complete_step(step, metrics, records)
            self.spend.add(tokens)
            state.completed, state.consistent = step, True
            crash_point("committed", step)
            if paths is not None:
                self.run.add_checkpoint(step, *paths)
                state.checkpointed = step
        line = (summary or step_summary)(step, cfg.steps, metrics) + self.spend.summary(tokens)
        line += note
        self.run.log(line)
        self.display.end_step(line)
        if self.sink is not None:
            self.sink.log(metrics, step)


def train(
    config: RunConfig,
    *,
    run_dir: str | None = None,
    resume: bool = False,
    init_from: str | None = None,
    tracker: str | None = None,
    progress: bool = True,
) -> RunDirectory:
    """Run (or resume) RL training as ``config`` says; returns the run directory."""
    from retool.backends import open_sandbox
    from retool.data import load_dataset, take_batch
    from retool.reward import default_checker, load_reward_function
    from retool.rollout import rollout_batch
    from retool.training.aggregation import scale_advantages
    from retool.training.datum import build_training_datums

    cfg = config.train
    examples = load_dataset(config.data.train)
    scorer = load_reward_function(config.reward.function) if config.reward.function else None
    session = Session(
        config,
        run_dir=run_dir,
        resume=resume,
        init_from=init_from,
        tracker=tracker,
        progress=progress,
        per_step=cfg.questions_per_batch * config.rollout.group_size,
        unit="traj",
    )
    checker = None if scorer else default_checker(workers=config.reward.workers)
    trainer, run, display = session.trainer, session.run, session.display
    tokenizer = trainer.get_tokenizer()
    loss_config = {"clip_low_threshold": cfg.clip_low, "clip_high_threshold": cfg.clip_high}
    sandbox = open_sandbox(config.sandbox)
    try:
        evaluation = PeriodicEval(config, session, sandbox, scorer)
        with session.running():
            if evaluation.pending(session.start):
                evaluation.run(session.start)
            for step in session.steps():
                session.guard.check()
                display.new_step("sampling")
                phases = Phases(display.phase)
                batch = take_batch(examples, cfg.questions_per_batch, step - 1, config.data.seed)
                journal = run.journal(step)
                reuse = journal.complete_groups(batch, config.rollout.group_size)

                def on_trajectory(event: Any, journal: Any = journal, step: int = step) -> None:
                    if event.trajectory is not None and not event.reused:
                        journal.append(event.trajectory)
                        crash_point("journal", step)
                    display.advance(event.count)

                with phases("snapshot"):
                    sampler = trainer.save_weights_and_get_sampling_client()
                try:
                    with phases("rollout"):
                        result = rollout_batch(
                            sampler,
                            tokenizer,
                            sandbox,
                            batch,
                            config.rollout,
                            step=step,
                            progress=on_trajectory,
                            checker=checker,
                            scorer=scorer,
                            reward_timeout=config.reward.timeout,
                            context_limit=cfg.max_train_tokens,
                            reuse=reuse,
                        )
                finally:
                    close = getattr(sampler, "close", None)
                    if close is not None:
                        close()
                session.guard.check()
                with phases("datums"):
                    datums = build_training_datums(result.trajectories, cfg.max_train_tokens)
                    datums = scale_advantages(
                        datums, cfg.loss_aggregation, len(result.trajectories)
                    )
                    micro_batches = session.pack(datums)
                metrics = dict(result.metrics())
                metrics["train/reused_groups"] = float(len(reuse))
                metrics.update(session.update(step, micro_batches, cfg.loss, loss_config, phases))
                note = "" if micro_batches else "  (every group scored alike: nothing to train)"
                tokens = step_tokens(result.trajectories, trained=int(metrics["train/tokens"]))
                session.commit(step, metrics, phases, result.trajectories, note, tokens=tokens)
                if evaluation.due(step):
                    evaluation.run(step)
    finally:
        sandbox.close()
    return run


class PeriodicEval:
    """``train.eval_every``: ``retool eval`` of the policy after a step, in the run directory.

    Runs after the step is committed (an evaluation is not part of the
    step's record), writes ``eval/step_NNNNNN.jsonl`` (resumable: a kill
    mid-evaluation is finished on ``--resume``) and sends ``eval/*`` to the
    tracker and ``log.txt``. The sampling seeds are fixed (``seed_step=0``),
    so every evaluation of a run samples the same way and differences between
    steps are the policy's. It samples with the run's own ``[rollout]``
    settings (temperature, top_p, budgets); a standalone ``retool eval``
    defaults to top_p 0.7, so pass the same settings to compare the two.
    """

    def __init__(self, config: RunConfig, session: Session, sandbox: Any, scorer: Any) -> None:
        from retool.evaluation import load_eval_examples

        cfg = config.train
        from retool.reward import default_checker

        self.config, self.session, self.sandbox, self.scorer = config, session, sandbox, scorer
        self.checker = None if scorer else default_checker(workers=config.reward.workers)
        self.every = cfg.eval_every
        self.dataset = cfg.eval_dataset or config.data.dev
        self.examples = (
            load_eval_examples(self.dataset, limit=cfg.eval_limit or None) if self.every else []
        )

    def due(self, step: int) -> bool:
        return bool(self.every) and step > 0 and step % self.every == 0

    def pending(self, step: int) -> bool:
        """Due after ``step`` and not finished (a resume after a kill mid-evaluation)."""
        from retool.evaluation import load_results

        path = self.session.run.eval_path(step)
        return self.due(step) and (not path.exists() or load_results(path).summary is None)

    def run(self, step: int) -> None:
        from retool.evaluation import evaluate, prepare_evaluation

        session, cfg = self.session, self.config.train
        session.display.new_step(f"eval after step {step}")
        session.run.eval_dir.mkdir(exist_ok=True)
        sampler = session.trainer.save_weights_and_get_sampling_client()
        try:
            evaluation = prepare_evaluation(
                self.examples,
                self.config.rollout,
                n=cfg.eval_n,
                output=session.run.eval_path(step),
                settings={
                    "model": f"{session.run.path}@{step}",
                    "checkpoint_step": step,
                    "dataset": self.dataset,
                },
                tools=self.sandbox is not None,
            )
            summary = evaluate(
                sampler,
                session.trainer.get_tokenizer(),
                self.sandbox,
                evaluation,
                progress=lambda event: session.display.advance(event.count),
                reward_timeout=self.config.reward.timeout,
                scorer=self.scorer,
                checker=self.checker,
            )
        finally:
            close = getattr(sampler, "close", None)
            if close is not None:
                close()
        low, high = summary.average_at_n_ci
        line = (
            f"eval after step {step}: average@{cfg.eval_n} {summary.average_at_n:.3f} "
            f"[{low:.3f}, {high:.3f}], pass@{cfg.eval_n} {summary.pass_at_n:.3f}, "
            f"format {summary.format_rate:.3f} on {len(self.examples)} problems"
        )
        session.run.log(line)
        session.display.end_step(line, advance=False)
        if session.sink is not None:
            session.sink.log(summary.metrics(), step)
