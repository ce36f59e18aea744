"""The rollout state machine and its scheduler: no round barrier.

One asyncio task per question samples the question's whole group with one
request (``num_samples = G``), forks ``G`` branches, and then each branch runs
as its own task::

    record turn (tokens, logprobs, text) -> parse
        answer / invalid / a limit         -> end, score
        tool call -> sandbox -> fit observation -> P + C + delta
                  -> plan the next turn -> sample (num_samples = 1) -> record turn ...

A branch whose tool result is back requests its next sample at once; nothing
waits for the slowest member of a "round" (the reference's ``gather`` per
round made every round as slow as its slowest tool call or completion).
Concurrency is bounded by two semaphores: sampled sequences in flight
(``max_in_flight_samples``; a group request counts ``G``) and sandbox calls in
flight (``max_in_flight_tools``).

Results do not depend on completion order: every request's seed comes from
its position (:mod:`retool.rollout.seeds`), every branch writes only its own
:class:`Trajectory`, and the result lists trajectories in (question, group)
order. Rewards are scored as each trajectory ends (in a thread, overlapping
the others' sampling); advantages only once every trajectory has ended.

Infrastructure failures are not the model's fault and do not abort the batch:
a sampler call that raises or replies malformed (:mod:`retool.rollout.sampling`),
and a sandbox call that raises or reports a sandbox failure
(:mod:`retool.rollout.tools`), are retried with exponential backoff; a
trajectory that still fails ends as ``sampler_error`` / ``sandbox_error`` and
is excluded, or as ``sandbox_unreported`` (scored, trained) when its code may
have run. A traceback or timeout of the model's own code is an observation
like any other output.

Model text is data, and one trajectory's text never stops the batch. Whatever
the model writes (its turns, and what its code prints into observations) may
make handling it raise: a parse, the chat template's render of the next
prompt, fitting or formatting the observation. Such a failure ends that
trajectory only, as ``text_error``: reward -1 without scoring (the
trajectory's own failure: trained, never excluded), the exception in
``Trajectory.error``. Whether the template can continue a conversation at all
is probed once per batch on text that is not the model's (the first question
and an empty observation, when the tool reserve is measured): a template that
rewrites history still stops the batch there, with one line. Scoring the final
text does not stop the batch either (:mod:`retool.rollout.scoring`): an answer
the reward cannot score, built-in or custom, scores -1, its error in
``Trajectory.error``, counted in ``rollout/reward_failures``. Only a custom
``scorer`` that failed on *every* trajectory the batch scored (a reward service
that went away, a function that is broken) stops the batch, with its error,
once every task has ended. Until then the trajectories it failed on are held
back from ``progress`` (so from the training journal): a batch that stops
journals none of those -1s, and a resumed step scores them again.

Dynamic sampling (``rollout.dynamic_sampling``) starts a reserve question each
time a group ends uninformative, in the next slot, while the others run on;
which extras run depends on the groups' outcomes only
(:mod:`retool.rollout.dynamic_sampling`).

Nothing here knows which backend it talks to: the sampler is anything with
``sample_async(ModelInput, num_samples, SamplingParams)``, the sandbox
anything with ``arun(code)`` returning an :class:`~retool.sandbox.ExecResult`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.errors import ConfigError
from retool.protocol import ParseKind, get_protocol
from retool.reward import WRONG_REWARD, EquivalenceChecker, RewardResult, Scorer
from retool.reward.arguments import check_timeout
from retool.rollout.advantages import assign_group_advantages
from retool.rollout.budget import TurnPlan, fit_observation, plan_turn, wrapper_tokens
from retool.rollout.dynamic_sampling import Refill, zero_uninformative
from retool.rollout.result import RolloutCounters, RolloutResult
from retool.rollout.sampling import Sampled, Sampler
from retool.rollout.scoring import Scoring
from retool.rollout.seeds import FIRST_TURN_GROUP, sample_seed
from retool.rollout.sync import synchronous
from retool.rollout.tools import CodeRunner
from retool.rollout.types import (
    Observation,
    ProgressCallback,
    ProgressEvent,
    StopReason,
    Trajectory,
)
from retool.rollout.void import drop_void
from retool.sandbox.result import ErrorKind, format_tool_content
from retool.types import SamplerStop, SamplingClient, Sandbox

log = logging.getLogger(__name__)

# A text_error trajectory's reward: -1 without scoring, not a reward failure (nor
# ``Trajectory.unscored``: the reward never saw the text; stop/text_error counts it).
_TEXT_ERROR_RESULT = RewardResult(WRONG_REWARD, correct=False, valid_format=False, answer=None)


def check_context_limit(config: RolloutConfig, limit: int | None, source: str) -> None:
    """Refuse a budget the backend cannot hold, before anything is sampled."""
    if limit is not None and config.max_trajectory_tokens > limit:
        raise ConfigError(
            f"rollout.max_trajectory_tokens ({config.max_trajectory_tokens}) exceeds the "
            f"context limit of {source} ({limit} tokens); lower rollout.max_trajectory_tokens"
        )


@dataclass(frozen=True)
class _Engines:
    """What a batch samples with and runs code in (``sandbox=None``: text only)."""

    client: SamplingClient
    tokenizer: Any
    sandbox: Sandbox | None


@dataclass(frozen=True)
class _Work:
    """What a batch rolls out: its questions, the reserve behind them (dynamic
    sampling), the slots a resumed step reuses, and the step the seeds derive from."""

    examples: tuple[MathExample, ...]
    reserve: tuple[MathExample, ...]
    reuse: Mapping[int, Sequence[Trajectory]]
    step: int
    policy_version: int  # training steps done by the policy that samples (Trajectory's)


class _Batch:
    """State shared by the tasks of one batch."""

    def __init__(
        self,
        engines: _Engines,
        work: _Work,
        config: RolloutConfig,
        scoring: Scoring,
        progress: ProgressCallback | None,
    ) -> None:
        self.work = work
        self.config = config
        self.scoring = scoring
        self.progress = progress
        self.tokenizer = engines.tokenizer
        self.dialect = get_protocol(config.protocol)
        self.counters = RolloutCounters()
        stop = self.dialect.stop_sequences(engines.tokenizer)
        self.sampler = Sampler(
            engines.client, engines.tokenizer, config, stop, work.step, self.counters
        )
        self.sandbox = engines.sandbox
        self.tools = (
            CodeRunner(self.sandbox, config, self.counters) if self.sandbox is not None else None
        )
        self.tool_timeout = self.sandbox.timeout if self.sandbox is not None else None
        self.refill = Refill(config.dynamic_sampling, work.reserve)
        self.examples = list(work.examples)  # grows by the reserve questions drawn
        self.group_size = config.group_size
        self.total = len(self.examples) * self.group_size
        self.trajectories: list[Trajectory | None] = [None] * self.total
        self.finished = 0
        self.ended: dict[int, int] = {}  # trajectories ended (scored) per question slot
        self.questions: list[asyncio.Task[None]] = []
        self.scoring_tasks: list[asyncio.Task[None]] = []
        self.custom_scored = 0  # trajectories the custom scorer was asked to score
        self.held: list[tuple[Trajectory, Exception]] = []  # ... and those it failed on
        self.reserved_tokens: int | None = None  # wrapper + minimum observation, measured once
        self.started = time.monotonic()

    # -- budgets -----------------------------------------------------------------
    def _reserve(self, messages: list[dict[str, Any]]) -> int:
        if self.reserved_tokens is None:
            self.reserved_tokens = (
                wrapper_tokens(self.dialect, self.tokenizer, messages)
                + self.config.min_observation_tokens
            )
        return self.reserved_tokens

    def plan(self, trajectory: Trajectory, prompt_len: int) -> TurnPlan | None:
        """The budget of the trajectory's next turn (``None``: no room left)."""
        config = self.config
        turn_number = len(trajectory.turns) + 1
        call_possible = (
            self.sandbox is not None
            and trajectory.code_calls < config.max_code_calls
            and turn_number < config.max_assistant_turns
        )
        return plan_turn(
            prompt_len,
            max_trajectory_tokens=config.max_trajectory_tokens,
            max_assistant_tokens=config.max_assistant_tokens,
            call_possible=call_possible,
            reserve=self._reserve(trajectory.messages) if call_possible else 0,
        )

    # -- ending ------------------------------------------------------------------
    def end(self, trajectory: Trajectory, reason: StopReason) -> None:
        """Mark it ended; score it (unless excluded), then report it to ``progress``."""
        trajectory.stop_reason = reason
        trajectory.ended_s = time.monotonic() - self.started
        self.scoring_tasks.append(asyncio.ensure_future(self.finish(trajectory)))

    def end_on_text_error(self, trajectory: Trajectory, stage: str, exc: Exception) -> None:
        """End ``trajectory`` as ``text_error``: handling its own text raised at ``stage``."""
        self.record_error(trajectory, stage, exc, f"the trajectory ends as {StopReason.TEXT_ERROR}")
        self.end(trajectory, StopReason.TEXT_ERROR)

    def record_error(self, trajectory: Trajectory, stage: str, exc: Exception, then: str) -> None:
        trajectory.error = f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"
        log.warning(
            "question %d, member %d: %s; %s",
            trajectory.question_index,
            trajectory.group_index,
            trajectory.error,
            then,
        )

    async def finish(self, trajectory: Trajectory) -> None:
        held = False
        if trajectory.stop_reason == StopReason.TEXT_ERROR:
            self.assign(trajectory, _TEXT_ERROR_RESULT)
        elif not trajectory.excluded:
            held = await self.score(trajectory)
        assert trajectory.stop_reason is not None
        if not held:
            self.notify(trajectory, trajectory.stop_reason, 1)
        slot = trajectory.question_index
        self.ended[slot] = self.ended.get(slot, 0) + 1
        if self.ended[slot] == self.group_size:
            self.group_ended(slot)

    async def score(self, trajectory: Trajectory) -> bool:
        """Score the final text; an answer that cannot be scored is -1 (see
        :mod:`retool.rollout.scoring`). True: a custom scorer failed on it, so its
        report waits for the batch's verdict (:meth:`release_held`)."""
        result, error = await self.scoring.score(trajectory.final_text, trajectory.example.answer)
        if error is not None:
            self.record_error(trajectory, "reward", error, f"scored {WRONG_REWARD:+.0f}")
        self.assign(trajectory, result)
        if self.scoring.scorer is None:
            return False
        self.custom_scored += 1
        if error is not None:
            self.held.append((trajectory, error))
        return error is not None

    def assign(self, trajectory: Trajectory, result: RewardResult) -> None:
        trajectory.reward = result.reward
        trajectory.correct = result.correct
        trajectory.valid_format = result.valid_format
        trajectory.answer = result.answer
        trajectory.unscored = result.failed or result.timed_out
        self.counters.reward_timeouts += result.timed_out
        self.counters.reward_failures += result.failed

    def release_held(self) -> None:
        """Once every task has ended: a custom scorer that failed on every trajectory it
        scored stops the batch with its error (the first in slot order); otherwise the
        trajectories it failed on are reported now, scored -1."""
        held = sorted(self.held, key=lambda h: (h[0].question_index, h[0].group_index))
        if held and len(held) == self.custom_scored:
            raise held[0][1]
        for trajectory, _ in held:
            assert trajectory.stop_reason is not None
            self.notify(trajectory, trajectory.stop_reason, 1)

    def start_question(self, slot: int, example: MathExample) -> None:
        self.questions.append(asyncio.ensure_future(self.run_question(slot, example)))

    def group_ended(self, slot: int) -> None:
        """Every member of ``slot`` ended and is scored: with dynamic sampling, an
        uninformative group starts the next reserve question."""
        if not self.refill.enabled:
            return
        group = self.trajectories[slot * self.group_size : (slot + 1) * self.group_size]
        members = [t for t in group if t is not None]
        assert len(members) == self.group_size, "a whole group has ended"
        example = self.refill.replacement(members)
        if example is None:
            return
        self.examples.append(example)
        self.trajectories.extend([None] * self.group_size)
        self.total += self.group_size
        self.start_question(len(self.examples) - 1, example)

    def notify(
        self, trajectory: Trajectory | None, reason: StopReason, count: int, reused: bool = False
    ) -> None:
        self.finished += count
        if self.progress is None:
            return
        try:
            self.progress(
                ProgressEvent(self.finished, self.total, count, trajectory, reason, reused)
            )
        except Exception:  # a display or journal must never end a rollout
            log.exception("the rollout progress callback failed; progress reports stopped")
            self.progress = None

    # -- the state machine -------------------------------------------------------
    async def run_question(self, question_index: int, example: MathExample) -> None:
        group = self.group_size
        reuse = self.work.reuse
        if question_index in reuse:  # finished before a resume: not sampled again
            for g, trajectory in enumerate(reuse[question_index]):
                self.trajectories[question_index * group + g] = trajectory
                assert trajectory.stop_reason is not None
                self.notify(trajectory, trajectory.stop_reason, 1, reused=True)
            self.group_ended(question_index)
            return
        messages = self.dialect.initial_messages(
            example.question, self.tokenizer, tools=self.sandbox is not None
        )
        root = Trajectory(
            example=example,
            group_index=0,
            messages=messages,
            question_index=question_index,
            policy_version=self.work.policy_version,
        )
        prompt = self.dialect.render_prompt(self.tokenizer, messages)
        plan = self.plan(root, len(prompt))
        slots = range(question_index * group, (question_index + 1) * group)
        if plan is None:
            for g, slot in enumerate(slots):
                branch = copy.deepcopy(root)
                branch.group_index = g
                branch.stop_reason = StopReason.PROMPT_TOO_LONG
                branch.error = (
                    f"the first prompt has {len(prompt)} tokens; "
                    f"rollout.max_trajectory_tokens is {self.config.max_trajectory_tokens}"
                )
                self.trajectories[slot] = branch
            self.counters.skipped_questions += 1
            self.notify(None, StopReason.PROMPT_TOO_LONG, group)
            self.group_ended(question_index)
            return
        seed = sample_seed(self.config.seed, self.work.step, question_index, FIRST_TURN_GROUP, 0)
        sampled, error, seconds = await self.sampler.sample(
            None, prompt, group, seed, plan.max_tokens
        )
        branches = []
        for g, slot in enumerate(slots):
            branch = copy.deepcopy(root)
            branch.group_index = g
            branch.started_s = time.monotonic() - self.started
            self.trajectories[slot] = branch
            branches.append(branch)
        if sampled is None:
            for branch in branches:
                branch.error = error
                branch.sample_retries = self.config.sample_retries
                self.end(branch, StopReason.SAMPLER_ERROR)
            return
        await asyncio.gather(
            *(
                self.run_branch(branch, prompt, sequence, plan, seed, seconds)
                for branch, sequence in zip(branches, sampled, strict=True)
            )
        )

    async def run_branch(
        self,
        trajectory: Trajectory,
        prompt: list[int],
        sampled: Sampled,
        plan: TurnPlan,
        seed: int,
        seconds: float,
    ) -> None:
        config = self.config
        while True:
            turn = sampled.turn(prompt, plan.max_tokens, seed, seconds)
            trajectory.turns.append(turn)  # recorded before parsing: invalid actions too
            self.counters.sampled_tokens += len(sampled.tokens)
            trajectory.final_text = turn.text  # the last assistant text is what is scored
            try:
                parsed = self.dialect.parse(turn.text)
            except Exception as exc:  # a dialect bug: the text is still only data
                turn.parse_kind, turn.parse_error = str(ParseKind.INVALID), str(exc)[:300]
                trajectory.messages.append({"role": "assistant", "content": turn.text})
                return self.end_on_text_error(trajectory, "parse", exc)
            turn.parse_kind = str(parsed.kind)
            turn.parse_error = parsed.error
            if parsed.kind != ParseKind.TOOL or parsed.code is None:
                trajectory.messages.append({"role": "assistant", "content": turn.text})
                cut_by_budget = (
                    sampled.stop == SamplerStop.LENGTH
                    and plan.max_tokens < config.max_assistant_tokens
                )
                if cut_by_budget:
                    reason = StopReason.BUDGET_EXHAUSTED
                elif parsed.kind == ParseKind.ANSWER:
                    reason = StopReason.ANSWER
                else:
                    reason = StopReason.INVALID
                return self.end(trajectory, reason)
            stop = None
            if self.tools is None or trajectory.code_calls >= config.max_code_calls:
                stop = StopReason.MAX_CODE_CALLS
            elif len(trajectory.turns) >= config.max_assistant_turns:
                stop = StopReason.MAX_TURNS
            elif not plan.can_call:
                stop = StopReason.BUDGET_EXHAUSTED  # no room was left to answer a call
            if stop is not None:
                trajectory.messages.append({"role": "assistant", "content": turn.text})
                return self.end(trajectory, stop)

            messages_before = list(trajectory.messages)
            trajectory.messages.append({"role": "assistant", "content": turn.text})
            call_id = (
                f"code-{trajectory.question_index}-{trajectory.group_index}-"
                f"{trajectory.code_calls + 1}"
            )
            assert self.tools is not None, "a tool mode call (else max_code_calls ended it)"
            result, attempts, shared = await self.tools.execute(trajectory, parsed.code)
            if result is None:
                return self.end(trajectory, StopReason.SANDBOX_ERROR)
            if result.error_kind == ErrorKind.SANDBOX:  # it may have run: its own failure
                return self.end(trajectory, StopReason.SANDBOX_UNREPORTED)
            content = ""
            try:  # the code's output and the model's history, through the template
                content = format_tool_content(result, self.tool_timeout)
                fitted = await asyncio.to_thread(
                    fit_observation,
                    self.dialect,
                    self.tokenizer,
                    messages_before,
                    prompt,
                    turn.completion_tokens,
                    call_id,
                    content,
                    max_content_tokens=config.max_tool_response_tokens,
                    max_prompt_tokens=config.max_trajectory_tokens - 1,
                )
                message = self.dialect.tool_message(call_id, fitted.content) if fitted else None
            except Exception as exc:
                trajectory.observations.append(
                    Observation(
                        call_id=call_id,
                        code=parsed.code,
                        content=content,
                        ok=result.ok,
                        error_kind=str(result.error_kind) if result.error_kind else None,
                        latency_s=result.latency_s,
                        appended=False,
                        shared=shared,
                        attempts=attempts,
                    )
                )
                return self.end_on_text_error(trajectory, "observation", exc)
            observation = Observation(
                call_id=call_id,
                code=parsed.code,
                content=fitted.content if fitted else content,
                ok=result.ok,
                error_kind=str(result.error_kind) if result.error_kind else None,
                latency_s=result.latency_s,
                content_tokens=fitted.content_tokens if fitted else 0,
                template_tokens=fitted.template_tokens if fitted else 0,
                truncated=fitted.truncated if fitted else True,
                appended=fitted is not None,
                shared=shared,
                attempts=attempts,
            )
            trajectory.observations.append(observation)
            if fitted is None or message is None:
                return self.end(trajectory, StopReason.OBSERVATION_TOO_LONG)
            trajectory.messages.append(message)
            trajectory.next_prompt_tokens = fitted.next_prompt
            trajectory.code_calls += 1
            prompt = fitted.next_prompt

            next_plan = self.plan(trajectory, len(prompt))
            if next_plan is None:  # final_text stays the last assistant text
                return self.end(trajectory, StopReason.BUDGET_EXHAUSTED)
            plan = next_plan
            seed = sample_seed(
                config.seed,
                self.work.step,
                trajectory.question_index,
                trajectory.group_index,
                len(trajectory.turns),
            )
            replies, error, seconds = await self.sampler.sample(
                trajectory, prompt, 1, seed, plan.max_tokens
            )
            if replies is None:
                trajectory.error = error
                return self.end(trajectory, StopReason.SAMPLER_ERROR)
            sampled = replies[0]

    async def wait_for_every_task(self) -> None:
        """Await every question and scoring task, including those started meanwhile.

        A group that ends may start a reserve question, and every ended trajectory
        starts a scoring task, so the task lists grow while we wait. Each pass awaits
        *all* tasks started so far, done or not: a task that already failed (a reward
        setting that raised) re-raises here instead of being dropped as "never
        retrieved" and its step trained without it. On the first failure the rest
        are cancelled, so nothing keeps sampling for a batch that is abandoned.
        """
        awaited = 0
        while awaited < len(self.questions) + len(self.scoring_tasks):
            tasks = [*self.questions, *self.scoring_tasks]
            awaited = len(tasks)
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                shared = self.tools.shared.values() if self.tools is not None else ()
                started = (*self.questions, *self.scoring_tasks, *shared)
                for task in started:
                    task.cancel()
                await asyncio.gather(*started, return_exceptions=True)
                raise

    async def run(self) -> RolloutResult:
        if self.sandbox is not None:
            self.sandbox.stats.snapshot_and_reset()  # the window starts with this batch
        for q, example in enumerate(list(self.examples)):
            self.start_question(q, example)
        await self.wait_for_every_task()
        self.release_held()
        trajectories = [t for t in self.trajectories if t is not None]
        assert len(trajectories) == self.total, "every slot gets a trajectory"
        assign_group_advantages(trajectories, self.config.advantage)
        if self.refill.enabled:
            g = self.group_size
            zero_uninformative([trajectories[i : i + g] for i in range(0, len(trajectories), g)])
        if self.config.drop_void:  # after the means: void rewards stay in them
            drop_void(trajectories)
        window = self.sandbox.stats.snapshot_and_reset() if self.sandbox is not None else {}
        return RolloutResult(
            trajectories=trajectories,
            group_size=self.group_size,
            num_questions=len(self.examples),
            wall_seconds=time.monotonic() - self.started,
            counters=self.counters,
            sandbox=dict(window),
            filtering=self.refill.enabled,
            extra_questions=self.refill.drawn,
            dropping_void=self.config.drop_void,
        )


async def rollout_batch_async(
    sampling_client: SamplingClient,
    tokenizer: Any,
    sandbox: Sandbox | None,
    examples: Sequence[MathExample],
    config: RolloutConfig,
    *,
    step: int = 0,
    progress: ProgressCallback | None = None,
    checker: EquivalenceChecker | None = None,
    reward_timeout: float = 5.0,
    context_limit: int | None = None,
    reuse: Mapping[int, Sequence[Trajectory]] | None = None,
    scorer: Scorer | None = None,
    reserve: Sequence[MathExample] = (),
    policy_version: int | None = None,
) -> RolloutResult:
    """Roll out ``group_size`` trajectories per example; for callers inside an event loop.

    ``sandbox=None`` disables tools (the text-only baseline): the system prompt
    does not mention the interpreter, and a tool call ends the trajectory
    (``max_code_calls``). ``context_limit`` is the trainer's longest input, if
    the caller knows it; the sampler's own limit is read from
    ``sampling_client.max_context_tokens`` when it reports one.

    ``progress`` is called once per ended trajectory, after it is scored (so a
    journal sees its reward; one a custom ``scorer`` failed on, once the batch has
    ended and goes on), and once per skipped question. ``reuse`` maps
    question slots to a complete group of trajectories that ended before (a
    resumed step): those slots are not sampled again, and their advantages are
    recomputed with the rest of the batch. ``scorer(final_text, reference)``
    replaces the boxed-answer reward (see :func:`retool.reward.load_reward_function`);
    it raises out of here only when it failed on every trajectory it scored.

    ``reserve`` are the extra questions of dynamic sampling, used in order and
    only with ``config.dynamic_sampling``; reserve question ``k`` takes slot
    ``len(examples) + k`` (a slot ``reuse`` may name). The result then holds
    ``len(examples) + result.extra_questions`` groups.

    ``policy_version``: the training steps the sampling policy has taken, recorded in
    every trajectory (default ``max(0, step - 1)``: the RL loop's step ``s`` samples
    with the weights after ``s - 1`` steps; with ``train.max_off_policy_steps = k``
    after ``max(0, s - 1 - k)``, :mod:`retool.training.overlap`).
    """
    reuse = dict(reuse or {})
    slots = len(examples) + (len(reserve) if config.dynamic_sampling else 0)
    for slot, members in reuse.items():
        if not 0 <= slot < slots or len(members) != config.group_size:
            raise ValueError(
                f"reuse[{slot}] must be a complete group of {config.group_size} trajectories "
                f"for a slot below {slots}"
            )
    reward_timeout = check_timeout("rollout_batch reward_timeout (seconds)", reward_timeout)
    check_context_limit(config, sampling_client.max_context_tokens, "the sampler")
    check_context_limit(config, context_limit, "the trainer")
    batch = _Batch(
        _Engines(sampling_client, tokenizer, sandbox),
        _Work(
            tuple(examples),
            tuple(reserve),
            reuse,
            step,
            max(0, step - 1) if policy_version is None else policy_version,
        ),
        config,
        Scoring(scorer, checker, reward_timeout),
        progress,
    )
    return await batch.run()


# The same for synchronous callers (the training loop, `retool rollout`).
rollout_batch = synchronous(rollout_batch_async)
