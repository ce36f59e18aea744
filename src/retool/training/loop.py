"""The RL step loop: one function a reader can follow top to bottom.

Per step ``s`` (1-based; seeds and batches derive from it):

1. snapshot the policy into a sampling client (the weights after ``s - 1`` updates);
2. roll out ``questions_per_batch x group_size`` trajectories (journaled as they end);
   with ``rollout.dynamic_sampling``, a group whose members all scored alike
   is dropped and replaced by a question of the step's reserve
   (:func:`retool.data.take_reserve`, up to ``rollout.max_oversample``);
3. build one datum per trajectory with a non-zero advantage, scale the
   advantages for the loss aggregation, pack micro-batches by padded area;
4. train: the step's groups split into ``train.updates_per_step = K`` updates
   (:mod:`retool.training.updates`; one by default), each ``forward_backward``
   per micro-batch then one ``optim_step``, all of an update's calls submitted
   before the first result is awaited (:meth:`Session.train`); nothing trains
   when no datum has an advantage (skipped and logged); a step whose every
   trajectory failed in the sampler or sandbox stops the run instead, see
   :mod:`retool.training.step_notes`;
5. when a checkpoint is due, write its state and sampler directories;
6. commit the step (rollouts file, then its metrics line), then the
   checkpoint's manifest line: a kill between the two leaves a complete step
   whose checkpoint does not exist yet, never a checkpoint without its step.

Each step also records its spend (``cost/*``: prefill, sampled and trained
tokens, money when ``[cost]`` sets prices; see :mod:`retool.training.cost`).
Before a step, when the mean step so far would take the run past
``cost.max_tokens`` or ``cost.max_money``, the loop checkpoints the last
completed step, says why in one line and returns normally.

The phases are calls in :func:`train`, in this order; the run's plumbing
(run directory, trainer, commit points) is :mod:`retool.training.session`,
the progress bars :mod:`retool.training.display`, the ``train.eval_every``
evaluations :mod:`retool.training.periodic_eval`, and the interrupts
:mod:`retool.interrupts`. The rollout itself is
:func:`retool.rollout.rollout_batch`, the datums
:func:`retool.training.datum.build_training_datums`.

Every phase is timed (``time/<phase>_s`` in the metrics) so an idle phase
shows. Interrupts (SIGINT, SIGTERM) are deferred while the weights and the
step record disagree (from the first ``optim_step`` to the metrics line); otherwise the
loop stops at once, writes a checkpoint of the last completed step if it has
none, and exits. Any other exception writes the same emergency checkpoint
when the state is consistent, then propagates.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from retool.backends.cleanup import close_quietly
from retool.config import RunConfig
from retool.data import MathExample, load_dataset, take_batch, take_reserve
from retool.errors import ServiceError, StalePolicyError
from retool.evaluation import load_eval_examples
from retool.reward import Scorer, default_checker, load_reward_function
from retool.rollout import ProgressEvent, rollout_batch, rollout_batch_async
from retool.rollout.types import Trajectory
from retool.sandbox import open_sandbox
from retool.training.aggregation import scale_advantages
from retool.training.cost import step_tokens
from retool.training.datum import build_training_datums
from retool.training.faults import crash_point
from retool.training.numerics import prepare_step
from retool.training.overlap import MissingPolicy, Rolled, RolloutPipeline, run_cancellable
from retool.training.periodic_eval import PeriodicEval
from retool.training.provenance import RunInputs, digest_records
from retool.training.run_dir import RunDirectory
from retool.training.session import Phases, Session
from retool.training.step_notes import (
    INFRASTRUCTURE_STOPS,
    AlikeNote,
    exclusion_note,
    infrastructure_stop,
)
from retool.training.updates import split_updates
from retool.types import SamplingClient


@dataclass(frozen=True)
class RLData:
    """What an RL run reads before its first step, loaded once.

    ``retool train`` loads it before the model (a bad file is refused before
    anything is written) and passes it to :func:`train`.
    """

    examples: list[MathExample]  # data.train, in file order
    scorer: Scorer | None  # reward.function; None: the built-in boxed-answer reward
    eval_examples: list[MathExample]  # train.eval_every's problems; [] without evaluations

    @classmethod
    def load(cls, config: RunConfig) -> RLData:
        cfg = config.train
        evaluated = cfg.eval_dataset or config.data.dev
        return cls(
            examples=load_dataset(config.data.train),
            scorer=load_reward_function(config.reward.function) if config.reward.function else None,
            eval_examples=(
                load_eval_examples(evaluated, limit=cfg.eval_limit or None)
                if cfg.eval_every
                else []
            ),
        )


def train(
    config: RunConfig,
    *,
    run_dir: str | None = None,
    resume: bool = False,
    init_from: str | None = None,
    tracker: str | None = None,
    progress: bool = True,
    data: RLData | None = None,
) -> RunDirectory:
    """Run (or resume) RL training as ``config`` says; returns the run directory.

    ``data``: the run's inputs when the caller has loaded them (:meth:`RLData.load`).
    """
    cfg = config.train
    data = data or RLData.load(config)
    examples, scorer = data.examples, data.scorer
    session = Session(
        config,
        run_dir=run_dir,
        resume=resume,
        init_from=init_from,
        tracker=tracker,
        progress=progress,
        per_step=cfg.questions_per_batch * config.rollout.group_size,
        unit="traj",
        inputs=RunInputs("rl", config.data.train, digest_records(examples)),
    )
    checker = None if scorer else default_checker(workers=config.reward.workers)
    trainer, run, display = session.trainer, session.run, session.display
    tokenizer = trainer.get_tokenizer()
    loss_config = {"clip_low_threshold": cfg.clip_low, "clip_high_threshold": cfg.clip_high}
    sandbox = open_sandbox(config.sandbox)
    alike_note = AlikeNote()
    lag = cfg.max_off_policy_steps
    pipeline: RolloutPipeline | None = None
    pending: list[tuple[int, tuple[str, str]]] = []  # checkpoints whose manifest line waits
    rollout_tokenizer = copy.deepcopy(tokenizer) if lag else tokenizer  # a thread of its own
    ended: dict[int, int] = {}  # per step, trajectories ended (the progress bar's count)

    def roll_out(
        step: int,
        sampler: SamplingClient | None,
        version: int,
        set_cancel: Callable[[Callable[[], None]], None] | None = None,
    ) -> Rolled:
        """Step ``step``'s rollout with the policy after ``version`` steps, journaled as
        its trajectories end; ``sampler`` None: that policy is not held (a resume with a
        lag), so every group must come from the journal."""
        started = time.monotonic()
        batch = take_batch(examples, cfg.questions_per_batch, step - 1, config.data.seed)
        reserve = []
        if config.rollout.dynamic_sampling:  # slots after the batch's, in this order
            reserve = take_reserve(
                examples,
                cfg.questions_per_batch,
                config.rollout.max_oversample,
                step - 1,
                config.data.seed,
            )
        journal = run.journal(step)
        reuse = journal.complete_groups([*batch, *reserve], config.rollout.group_size)
        # a journal of an older version may hold service failures: sample them again
        reuse = {
            slot: group
            for slot, group in reuse.items()
            if not any(t.stop_reason in INFRASTRUCTURE_STOPS for t in group)
        }
        if lag:
            check_versions(reuse, version, journal.path)
        client: SamplingClient = sampler or MissingPolicy(
            step, version, str(journal.path), rollout_tokenizer
        )
        if sampler is None and any(slot not in reuse for slot in range(len(batch))):
            raise StalePolicyError(cast(MissingPolicy, client).message())

        def on_trajectory(event: ProgressEvent) -> None:
            # a service failure is not journaled: a resume samples its group again
            trajectory = event.trajectory
            failed = trajectory is not None and trajectory.stop_reason in INFRASTRUCTURE_STOPS
            if trajectory is not None and not event.reused and not failed:
                journal.append(trajectory)
                crash_point("journal", step)
            ended[step] = ended.get(step, 0) + event.count
            if not lag or display.step == step:  # overlapped: only the step on screen
                display.advance(event.count, event.total)

        arguments = (client, rollout_tokenizer, sandbox, batch, config.rollout)
        options: dict[str, Any] = {
            "step": step,
            "progress": on_trajectory,
            "checker": checker,
            "scorer": scorer,
            "reward_timeout": config.reward.timeout,
            "context_limit": cfg.max_train_tokens,
            "reuse": reuse,
            "reserve": reserve,
            "policy_version": version,
        }
        if set_cancel is None:
            result = rollout_batch(*arguments, **options)
        else:
            result = run_cancellable(rollout_batch_async(*arguments, **options), set_cancel)
        return Rolled(result, len(reuse), time.monotonic() - started)

    def add_ready_checkpoints(last: bool = False) -> None:
        """Manifest lines of checkpoints whose later rollouts are journaled (overlap.py)."""
        assert pipeline is not None
        for item in list(pending):
            ckpt_step, paths = item
            if ckpt_step <= session.state.checkpointed:  # a later one is listed already
                pending.remove(item)
                continue
            if not last and not pipeline.finished_through(ckpt_step + lag):
                continue
            if last:
                pipeline.wait_through(ckpt_step + lag)
            with session.guard.critical():
                session.add_checkpoint(ckpt_step, paths)
            pending.remove(item)

    try:
        evaluation = PeriodicEval(config, session, sandbox, data.eval_examples, scorer, checker)
        with session.running():
            if evaluation.pending(session.start):
                evaluation.run(session.start)
            if lag:
                pipeline = RolloutPipeline(lag, cfg.steps, roll_out, session.sampler)
                session.state.ready = pipeline.finished_through
                session.state.settle = pipeline.wait_through
                session.state.lag = lag
                session.state.flush = add_ready_checkpoints
                pipeline.start(session.start)
            for step in session.steps():
                session.guard.check()
                display.new_step("sampling", step, ended.pop(step, 0) if lag else 0)
                phases = Phases(display.phase)
                # 1-2. the step's rollout: in series, a snapshot of the weights after
                # step - 1 steps, then questions_per_batch x group_size trajectories,
                # scored; overlapped, the pipeline's (sampled after step - 1 - k steps)
                if pipeline is None:
                    with phases("snapshot"):
                        sampler = session.sampler()  # local copy, or the vLLM engine synced
                    try:
                        with phases("rollout"):
                            rolled = roll_out(step, sampler, step - 1)
                    finally:
                        close_quietly(sampler, "sampler")
                else:
                    with phases("rollout"):
                        rolled = pipeline.result(step)
                    add_ready_checkpoints()
                result, reuse_count = rolled.result, rolled.reused_groups
                session.guard.check()
                stop = infrastructure_stop(
                    step,
                    result.trajectories,
                    sample_retries=config.rollout.sample_retries,
                    sandbox_retries=config.rollout.sandbox_retries,
                    completed=session.state.completed,
                )
                if stop is not None:
                    session.run.log(stop)
                    raise ServiceError(stop)
                # 3. datums (one per trajectory with a non-zero advantage), aggregate, split
                # into train.updates_per_step updates of whole groups, pack each
                with phases("datums"):
                    datums = build_training_datums(result.trajectories, cfg.max_train_tokens)
                    datums = scale_advantages(
                        datums, cfg.loss_aggregation, len(result.training_trajectories())
                    )
                    updates = split_updates(datums, cfg.updates_per_step, config.rollout.group_size)
                    packed = [session.pack(update) for update in updates]
                metrics = dict(result.metrics())
                metrics["train/reused_groups"] = float(reuse_count)
                metrics.update(staleness(result.trajectories, step, cfg.updates_per_step))
                if pipeline is not None:
                    metrics["time/rollout_overlapped_s"] = rolled.seconds
                # old logprobs (sampler, or recomputed for every update before the first)
                # and the rollout correction: numerics.py
                numerics = prepare_step(
                    trainer, packed, config, session.numerics, loss_config, phases
                )
                # 4-7. each update's forward_backward per micro-batch and its optim_step, the
                # checkpoint, the commit: from the first optim_step (hold) to the manifest line
                # the weights and the run directory disagree, so a signal there waits
                with session.guard.deferred_from() as hold:
                    trained = session.train(
                        step, numerics.updates, cfg.loss, numerics.loss_config, phases, hold
                    )
                    hold()  # the commit is critical even when nothing trained
                    metrics.update(trained.metrics)
                    metrics.update(
                        numerics.finish(trained.first)
                    )  # the mismatch: before any update
                    trained_tokens = int(metrics["train/tokens"])
                    tokens = step_tokens(result.trajectories, trained=trained_tokens)
                    checkpoint = session.checkpoint_if_due(step, phases)
                    session.commit(step, metrics, phases, result.trajectories, tokens)
                    if pipeline is None:
                        session.add_checkpoint(step, checkpoint)
                    elif checkpoint is not None:  # listed once the later rollouts are journaled
                        pending.append((step, checkpoint))
                    if pipeline is not None:  # the weights after this step sample step + 1 + k
                        pipeline.committed(step)
                excluded_all = all(t.excluded for t in result.trajectories)
                note = exclusion_note(result.trajectories)
                void_only = result.dropping_void and result.degenerate_groups() < len(
                    result.groups()
                )
                note += alike_note(bool(datums), excluded_all, void_only)
                session.report(step, metrics, tokens, note)
                if evaluation.due(step):
                    evaluation.run(step)
            if pipeline is not None:
                add_ready_checkpoints(last=True)
    finally:
        if pipeline is not None:
            pipeline.close()
        sandbox.close()
    return run


def check_versions(reuse: dict[int, list[Trajectory]], version: int, journal: Path) -> None:
    """Refuse journaled trajectories of another policy than the pipeline's for their step."""
    for group in reuse.values():
        for trajectory in group:
            if trajectory.policy_version != version:
                raise StalePolicyError(
                    f"{journal}: a journaled trajectory was sampled by the policy after step "
                    f"{trajectory.policy_version}, but its step samples with the policy after "
                    f"step {version} (train.max_off_policy_steps); delete that journal only "
                    "if the run can sample the step again, or start a new run"
                )


def staleness(trajectories: Sequence[Trajectory], step: int, updates: int) -> dict[str, float]:
    """``rollout/staleness_mean`` and ``_max``: optimizer steps between the policy that
    sampled each trajectory and the policy step ``step`` trains (``updates`` per step)."""
    lags = [(step - 1 - t.policy_version) * updates for t in trajectories] or [0]
    return {
        "rollout/staleness_mean": float(sum(lags)) / len(lags),
        "rollout/staleness_max": float(max(lags)),
    }
