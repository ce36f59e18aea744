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
a sampler call that raises or replies malformed, and a sandbox call that
raises or reports a sandbox failure, are retried with exponential backoff;
a trajectory that still fails ends as ``sampler_error`` / ``sandbox_error``
and is excluded. A traceback or timeout of the model's own code is an
observation like any other output.

Model text is data. Whatever the model writes (its turns, and what its code
prints into observations) may make handling it raise: a parse, the chat
template's render of the next prompt, fitting or formatting the observation.
Such a failure ends that trajectory only, as ``text_error``: reward -1 without
scoring (the trajectory's own failure: trained, never excluded), the exception
in ``Trajectory.error``. Whether the template can continue a conversation at
all is probed once per batch on text that is not the model's (the first
question and an empty observation, when the tool reserve is measured): a
template that rewrites history still stops the batch there, with one line. The
built-in reward never raises on an answer either: a check that cannot be made
(its worker died at its memory limit, or scoring raised) scores -1 and counts
in ``rollout/reward_failures``. A custom ``scorer`` is configuration, not model
text: an exception from it (a reward service that went away) stops the batch,
so a function that cannot score some text must return -1 itself.

Exclusion is a reward channel (an excluded -1 becomes 0), so a sandbox failure
excludes only on evidence the code cannot produce: the sandbox saw that the
code never ran (``ExecResult.delivered`` is False: not delivered, or the call's
set-up failed before any code, as its init observed). When any attempt's code
was delivered and may have run (a handler or server that died mid-call, which
the code could have caused), every attempt failing is that trajectory's
failure: it ends as ``sandbox_unreported``, is scored (no answer: -1) and
trains like any other, and ``rollout/sandbox_unreported`` counts it.

Dynamic sampling (``rollout.dynamic_sampling``, DAPO's filter): the caller
passes ``reserve``, extra questions in a fixed order. Each time a group ends
uninformative (every included member scored alike, or fewer than two
included), the next reserve question starts at once, in the next slot, while
the other groups run on: no round barrier here either. Which extras run does
not depend on timing: with ``Q`` batch questions, every uninformative group
found starts one extra, so at the end ``Q + uninformative = slots`` and the
last slot is informative; the slots are therefore the shortest prefix of
``batch + reserve`` that holds ``Q`` informative groups (or all of it), a
function of the groups' outcomes, which their seeds decide. Uninformative
groups get advantage 0 and do not train (``RolloutResult.filtering``). A
resumed step reuses journaled groups of reserve slots like any other, and the
same rule gives the same slots.

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
from retool.errors import ConfigError, RetoolError, StalePolicyError
from retool.protocol import ParseKind, get_protocol
from retool.reward import WRONG_REWARD, EquivalenceChecker, RewardResult, Scorer, score_answer
from retool.reward.arguments import check_timeout
from retool.rollout.advantages import assign_group_advantages
from retool.rollout.budget import TurnPlan, fit_observation, plan_turn, wrapper_tokens
from retool.rollout.result import RolloutCounters, RolloutResult, informative
from retool.rollout.seeds import FIRST_TURN_GROUP, sample_seed
from retool.rollout.sync import synchronous
from retool.rollout.types import (
    AssistantTurn,
    Observation,
    ProgressCallback,
    ProgressEvent,
    StopReason,
    Trajectory,
)
from retool.sandbox.result import ErrorKind, ExecResult, format_tool_content
from retool.types import (
    ModelInput,
    SampledSequence,
    SamplerStop,
    SamplingClient,
    SamplingParams,
    Sandbox,
)

log = logging.getLogger(__name__)


class _WeightedSemaphore:
    """An asyncio semaphore whose holders take several units at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._changed = asyncio.Condition()

    async def acquire(self, units: int) -> int:
        units = min(units, self.capacity)  # a request larger than the cap runs alone
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= units)
            self._free -= units
        return units

    async def release(self, units: int) -> None:
        async with self._changed:
            self._free += units
            self._changed.notify_all()


@dataclass(frozen=True)
class _Sampled:
    """A sampler reply read and checked: the tokens win over the text."""

    tokens: list[int]
    logprobs: list[float]
    text: str
    stop: str


def check_context_limit(config: RolloutConfig, limit: int | None, source: str) -> None:
    """Refuse a budget the backend cannot hold, before anything is sampled."""
    if limit is not None and config.max_trajectory_tokens > limit:
        raise ConfigError(
            f"rollout.max_trajectory_tokens ({config.max_trajectory_tokens}) exceeds the "
            f"context limit of {source} ({limit} tokens); lower rollout.max_trajectory_tokens"
        )


class _Batch:
    """State shared by the tasks of one batch."""

    def __init__(
        self,
        sampling_client: SamplingClient,
        tokenizer: Any,
        sandbox: Sandbox | None,
        examples: Sequence[MathExample],
        config: RolloutConfig,
        step: int,
        progress: ProgressCallback | None,
        checker: EquivalenceChecker | None,
        reward_timeout: float,
        reuse: Mapping[int, Sequence[Trajectory]],
        scorer: Scorer | None,
        reserve: Sequence[MathExample],
    ) -> None:
        self.reuse = reuse
        self.filtering = config.dynamic_sampling
        self.reserve = list(reserve) if config.dynamic_sampling else []
        self.wanted = len(examples)  # informative groups the caller asked for
        self.ended: dict[int, int] = {}  # trajectories ended (scored) per question slot
        self.questions: list[asyncio.Task[None]] = []
        self.scorer = scorer
        self.client = sampling_client
        # the weights the step must sample with (a vLLM sampler says; None: not checked)
        self.policy_version: str | None = getattr(sampling_client, "policy_version", None)
        self.tokenizer = tokenizer
        self.sandbox = sandbox
        self.examples = list(examples)
        self.config = config
        self.step = step
        self.progress = progress
        self.checker = checker
        self.reward_timeout = reward_timeout
        self.dialect = get_protocol(config.protocol)
        self.stop = self.dialect.stop_sequences(tokenizer)
        self.group_size = config.group_size
        self.total = len(self.examples) * self.group_size
        self.trajectories: list[Trajectory | None] = [None] * self.total
        self.finished = 0
        self.counters = RolloutCounters()
        self.sample_slots = _WeightedSemaphore(config.max_in_flight_samples)
        self.tool_slots = asyncio.Semaphore(config.max_in_flight_tools)
        self.shared_code: dict[tuple[int, str], asyncio.Task[tuple[ExecResult | None, int]]] = {}
        self.tool_timeout = sandbox.timeout if sandbox is not None else None
        self.reserved_tokens: int | None = None  # wrapper + minimum observation, measured once
        self.started = time.monotonic()
        self.scoring: list[asyncio.Task[None]] = []

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

    # -- sampling ----------------------------------------------------------------
    def params(self, max_tokens: int, seed: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=seed,
            stop=self.stop,
        )

    def read(self, sequence: SampledSequence) -> _Sampled:
        produced = getattr(sequence, "policy_version", None)
        if self.policy_version is not None and produced != self.policy_version:
            raise StalePolicyError(
                f"step {self.step}: a sample came from weights {produced!r}, the step's policy "
                f"is {self.policy_version!r}: the sampler's weight sync did not apply; "
                "nothing of this step was trained (check the [sampler] settings and the log)"
            )
        tokens = [int(t) for t in sequence.tokens]
        logprobs = [float(v) for v in sequence.logprobs]
        if len(tokens) != len(logprobs):
            raise ValueError(f"sampler returned {len(tokens)} tokens but {len(logprobs)} logprobs")
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if sequence.text is None:
            self.counters.text_missing += 1
        elif sequence.text != text:
            self.counters.text_mismatches += 1
        stop = str(getattr(sequence, "stop_reason", "") or "")
        return _Sampled(tokens, logprobs, text, stop)

    async def sample(
        self, trajectory: Trajectory | None, prompt: list[int], num_samples: int, seed: int, n: int
    ) -> tuple[list[_Sampled] | None, str | None, float]:
        """Sample with retries; ``(None, error, seconds)`` when every attempt failed."""
        attempts = 1 + self.config.sample_retries
        error: str | None = None
        started = time.monotonic()
        for attempt in range(attempts):
            if attempt:
                self.counters.sample_retries += 1
                if trajectory is not None:
                    trajectory.sample_retries += 1
                await asyncio.sleep(self.config.retry_backoff * 2 ** (attempt - 1))
            units = await self.sample_slots.acquire(num_samples)
            try:
                self.counters.sample_requests += 1
                response = await self.client.sample_async(
                    ModelInput.from_ints(prompt), num_samples, self.params(n, seed)
                )
                sequences = list(response.sequences)
                if len(sequences) != num_samples:
                    raise ValueError(
                        f"asked for {num_samples} samples, the sampler returned {len(sequences)}"
                    )
                read = [self.read(s) for s in sequences]
                return read, None, time.monotonic() - started
            except (asyncio.CancelledError, StalePolicyError):
                raise  # a stale sampler stays stale: retrying would train on the wrong policy
            except Exception as exc:  # infrastructure: retry, then fail this trajectory only
                error = f"{type(exc).__name__}: {exc}"
                log.warning("sampler call failed (attempt %d/%d): %s", attempt + 1, attempts, error)
            finally:
                await self.sample_slots.release(units)
        self.counters.sampler_failures += 1
        return None, error, time.monotonic() - started

    # -- tools -------------------------------------------------------------------
    async def _run_code(self, code: str, trajectory: Trajectory) -> tuple[ExecResult | None, int]:
        """The result and the attempts made. ``None``: every attempt failed and the
        sandbox saw the code never run (exclude); a ``SANDBOX`` result: every
        attempt failed and one may have run (the trajectory's failure)."""
        sandbox = self.sandbox
        assert sandbox is not None, "code runs only in tool mode, which has a sandbox"
        attempts = 1 + self.config.sandbox_retries
        may_have_run: ExecResult | None = None
        for attempt in range(attempts):
            if attempt:
                self.counters.sandbox_retries += 1
                trajectory.sandbox_retries += 1
                await asyncio.sleep(self.config.retry_backoff * 2 ** (attempt - 1))
            try:
                async with self.tool_slots:
                    self.counters.tool_executions += 1
                    result = await sandbox.arun(code)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                trajectory.error = f"{type(exc).__name__}: {exc}"
            else:
                if result.error_kind != ErrorKind.SANDBOX:
                    return result, attempt + 1
                trajectory.error = f"sandbox failure: {result.stderr.strip()[:200]}"
                if result.delivered:
                    may_have_run = result
            log.warning(
                "sandbox call failed (attempt %d/%d): %s", attempt + 1, attempts, trajectory.error
            )
        if may_have_run is not None:
            self.counters.sandbox_unreported += 1
            return may_have_run, attempts
        self.counters.sandbox_failures += 1
        return None, attempts

    async def execute(
        self, trajectory: Trajectory, code: str
    ) -> tuple[ExecResult | None, int, bool]:
        """Run ``code`` (or reuse identical code of the same group): result, attempts, shared."""
        if not self.config.share_identical_code:
            result, attempts = await self._run_code(code, trajectory)
            return result, attempts, False
        key = (trajectory.question_index, code)
        task = self.shared_code.get(key)
        if task is None:
            task = asyncio.ensure_future(self._run_code(code, trajectory))
            self.shared_code[key] = task
            result, attempts = await asyncio.shield(task)
            return result, attempts, False
        result, _ = await asyncio.shield(task)
        if result is None or result.error_kind == ErrorKind.SANDBOX:  # never share a failure
            result, attempts = await self._run_code(code, trajectory)
            return result, attempts, False
        self.counters.shared_code_hits += 1
        return result, 0, True

    # -- ending ------------------------------------------------------------------
    def end(self, trajectory: Trajectory, reason: StopReason) -> None:
        """Mark it ended; score it (unless excluded), then report it to ``progress``."""
        trajectory.stop_reason = reason
        trajectory.ended_s = time.monotonic() - self.started
        self.scoring.append(asyncio.ensure_future(self.finish(trajectory)))

    def end_on_text_error(self, trajectory: Trajectory, stage: str, exc: Exception) -> None:
        """End ``trajectory`` as ``text_error``: handling its own text raised at ``stage``."""
        trajectory.error = f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"
        log.warning(
            "question %d, member %d: %s; the trajectory ends as %s",
            trajectory.question_index,
            trajectory.group_index,
            trajectory.error,
            StopReason.TEXT_ERROR,
        )
        self.end(trajectory, StopReason.TEXT_ERROR)

    async def finish(self, trajectory: Trajectory) -> None:
        if trajectory.stop_reason == StopReason.TEXT_ERROR:
            self.assign(
                trajectory,
                RewardResult(WRONG_REWARD, correct=False, valid_format=False, answer=None),
            )
        elif not trajectory.excluded:
            await self.score(trajectory)
        assert trajectory.stop_reason is not None
        self.notify(trajectory, trajectory.stop_reason, 1)
        slot = trajectory.question_index
        self.ended[slot] = self.ended.get(slot, 0) + 1
        if self.ended[slot] == self.group_size:
            self.group_ended(slot)

    # -- dynamic sampling ----------------------------------------------------------
    def start_question(self, slot: int, example: MathExample) -> None:
        self.questions.append(asyncio.ensure_future(self.run_question(slot, example)))

    def group_ended(self, slot: int) -> None:
        """Every member of ``slot`` ended and is scored: an uninformative group, with
        dynamic sampling, starts the next reserve question (see the module docstring)."""
        if not self.filtering:
            return
        group = self.trajectories[slot * self.group_size : (slot + 1) * self.group_size]
        members = [t for t in group if t is not None]
        assert len(members) == self.group_size, "a whole group has ended"
        drawn = len(self.examples) - self.wanted
        if informative(members) or drawn >= len(self.reserve):
            return
        example = self.reserve[drawn]
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

    async def score(self, trajectory: Trajectory) -> None:
        """The reward of the final text. A custom scorer's exception stops the batch (it
        is configuration); the built-in reward's scores -1 (see the module docstring)."""
        if self.scorer is not None:
            result = await asyncio.to_thread(
                self.scorer, trajectory.final_text, trajectory.example.answer
            )
            return self.assign(trajectory, result)
        try:
            result = await asyncio.to_thread(
                score_answer,
                trajectory.final_text,
                trajectory.example.answer,
                self.reward_timeout,
                self.checker,
            )
        except RetoolError:
            raise  # a setting or a reference answer, not the model's text
        except Exception as exc:
            trajectory.error = f"reward: {type(exc).__name__}: {str(exc)[:300]}"
            log.warning(
                "question %d, member %d: %s; scored %+.0f",
                trajectory.question_index,
                trajectory.group_index,
                trajectory.error,
                WRONG_REWARD,
            )
            result = RewardResult(
                WRONG_REWARD, correct=False, valid_format=False, answer=None, failed=True
            )
        self.assign(trajectory, result)

    def assign(self, trajectory: Trajectory, result: RewardResult) -> None:
        trajectory.reward = result.reward
        trajectory.correct = result.correct
        trajectory.valid_format = result.valid_format
        trajectory.answer = result.answer
        self.counters.reward_timeouts += result.timed_out
        self.counters.reward_failures += result.failed

    # -- the state machine -------------------------------------------------------
    def record(
        self,
        trajectory: Trajectory,
        prompt: list[int],
        sampled: _Sampled,
        plan: TurnPlan,
        seed: int,
        seconds: float,
    ) -> AssistantTurn:
        turn = AssistantTurn(
            prompt_tokens=prompt,
            completion_tokens=sampled.tokens,
            logprobs=sampled.logprobs,
            text=sampled.text,
            sampler_stop=sampled.stop,
            max_tokens=plan.max_tokens,
            seed=seed,
            sample_seconds=seconds,
        )
        trajectory.turns.append(turn)  # recorded before parsing: invalid actions too
        self.counters.sampled_tokens += len(sampled.tokens)
        return turn

    async def run_question(self, question_index: int, example: MathExample) -> None:
        group = self.group_size
        if question_index in self.reuse:  # finished before a resume: not sampled again
            for g, trajectory in enumerate(self.reuse[question_index]):
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
            policy_version=self.step,
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
        seed = sample_seed(self.config.seed, self.step, question_index, FIRST_TURN_GROUP, 0)
        sampled, error, seconds = await self.sample(None, prompt, group, seed, plan.max_tokens)
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
        sampled: _Sampled,
        plan: TurnPlan,
        seed: int,
        seconds: float,
    ) -> None:
        config = self.config
        while True:
            turn = self.record(trajectory, prompt, sampled, plan, seed, seconds)
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
            if self.sandbox is None or trajectory.code_calls >= config.max_code_calls:
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
            result, attempts, shared = await self.execute(trajectory, parsed.code)
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
                self.step,
                trajectory.question_index,
                trajectory.group_index,
                len(trajectory.turns),
            )
            replies, error, seconds = await self.sample(
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
        function that raised) re-raises here instead of being dropped as "never
        retrieved" and its step trained without it. On the first failure the rest
        are cancelled, so nothing keeps sampling for a batch that is abandoned.
        """
        awaited = 0
        while awaited < len(self.questions) + len(self.scoring):
            tasks = [*self.questions, *self.scoring]
            awaited = len(tasks)
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                started = (*self.questions, *self.scoring, *self.shared_code.values())
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
        trajectories = [t for t in self.trajectories if t is not None]
        assert len(trajectories) == self.total, "every slot gets a trajectory"
        assign_group_advantages(trajectories, self.config.advantage)
        if self.filtering:  # exactly 0: equal rewards can centre to a rounding residue
            for slot in range(len(self.examples)):
                members = trajectories[slot * self.group_size : (slot + 1) * self.group_size]
                if not informative(members):
                    for trajectory in members:
                        trajectory.advantage = 0.0
        window = self.sandbox.stats.snapshot_and_reset() if self.sandbox is not None else {}
        return RolloutResult(
            trajectories=trajectories,
            group_size=self.group_size,
            num_questions=len(self.examples),
            wall_seconds=time.monotonic() - self.started,
            counters=self.counters,
            sandbox=dict(window),
            filtering=self.filtering,
            extra_questions=len(self.examples) - self.wanted,
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
) -> RolloutResult:
    """Roll out ``group_size`` trajectories per example; for callers inside an event loop.

    ``sandbox=None`` disables tools (the text-only baseline): the system prompt
    does not mention the interpreter, and a tool call ends the trajectory
    (``max_code_calls``). ``context_limit`` is the trainer's longest input, if
    the caller knows it; the sampler's own limit is read from
    ``sampling_client.max_context_tokens`` when it reports one.

    ``progress`` is called once per ended trajectory, after it is scored (so a
    journal sees its reward), and once per skipped question. ``reuse`` maps
    question slots to a complete group of trajectories that ended before (a
    resumed step): those slots are not sampled again, and their advantages are
    recomputed with the rest of the batch. ``scorer(final_text, reference)``
    replaces the boxed-answer reward (see :func:`retool.reward.load_reward_function`).

    ``reserve`` are the extra questions of dynamic sampling, used in order and
    only with ``config.dynamic_sampling``; reserve question ``k`` takes slot
    ``len(examples) + k`` (a slot ``reuse`` may name). The result then holds
    ``len(examples) + result.extra_questions`` groups.
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
        sampling_client,
        tokenizer,
        sandbox,
        examples,
        config,
        step,
        progress,
        checker,
        reward_timeout,
        reuse,
        scorer,
        reserve,
    )
    return await batch.run()


# The same for synchronous callers (the training loop, `retool rollout`).
rollout_batch = synchronous(rollout_batch_async)
