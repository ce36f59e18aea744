"""``train.eval_every``: ``retool eval`` of the policy after a step, in the run directory.

Runs after the step is committed (an evaluation is not part of the step's
record), writes ``eval/step_NNNNNN.jsonl`` (resumable: a kill mid-evaluation
is finished on ``--resume``) and sends ``eval/*`` to the tracker and
``log.txt``. With ``train.eval_at_start`` the starting policy is evaluated
too, as step 0 (``eval/step_000000.jsonl``), before the first step: the
learning curve's first point (``retool report``'s ``learning.png``). The
sampling seeds are fixed (``seed_step=0``), so every evaluation of a run
samples the same way and differences between steps are the policy's. It
samples with the run's sampler (``session.sampler()``: ours, or the vLLM
engine synced to the step, whose header then records
``sampler``, as ``retool eval``'s does) and the run's own ``[rollout]`` settings
(temperature, top_p, budgets); a standalone ``retool eval`` defaults to
top_p 0.7, so pass the same settings to compare the two.
"""

from __future__ import annotations

from retool.backends.cleanup import close_quietly
from retool.config import RunConfig
from retool.data import MathExample
from retool.evaluation import evaluate, load_results, prepare_evaluation
from retool.evaluation.engine import engine_settings
from retool.reward import EquivalenceChecker, Scorer
from retool.rollout import ProgressEvent
from retool.training.faults import crash_point
from retool.training.session import Session
from retool.types import Sandbox


class PeriodicEval:
    """The evaluations one run asks for: which steps, which problems, and running one."""

    def __init__(
        self,
        config: RunConfig,
        session: Session,
        sandbox: Sandbox,
        examples: list[MathExample],
        scorer: Scorer | None,
        checker: EquivalenceChecker | None,
    ) -> None:
        """``examples``: the problems of ``train.eval_every`` (loaded once, by the caller)."""
        cfg = config.train
        self.config, self.session, self.sandbox = config, session, sandbox
        self.scorer, self.checker = scorer, checker
        self.every = cfg.eval_every
        self.at_start = cfg.eval_at_start
        self.dataset = cfg.eval_dataset or config.data.dev
        self.examples = examples

    def due(self, step: int) -> bool:
        if step == 0:  # the starting policy, before any step: train.eval_at_start
            return bool(self.every) and self.at_start
        return bool(self.every) and step > 0 and step % self.every == 0

    def pending(self, step: int) -> bool:
        """Due after ``step`` and not finished (a resume after a kill mid-evaluation)."""
        path = self.session.run.eval_path(step)
        return self.due(step) and (not path.exists() or load_results(path).summary is None)

    def run(self, step: int) -> None:
        session, cfg = self.session, self.config.train
        session.display.new_step(f"eval after step {step}")
        session.run.eval_dir.mkdir(exist_ok=True)
        crash_point("eval", step)  # the disk-full test fills the disk here
        sampler = session.sampler()  # the run's engine: ours, or vLLM synced to this step

        def on_result(event: ProgressEvent) -> None:
            session.display.advance(event.count)
            crash_point("eval", step)

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
                    **engine_settings(self.config.sampler.engine, self.config.sampler.dtype),
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
            close_quietly(sampler, "sampler")
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
