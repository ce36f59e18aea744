"""``retool preflight``: a go/no-go look at a config before paying for a run.

It rolls out a few questions of ``data.train`` with the policy step 1 would
sample from (the base model, or ``--init-from``'s weights), through the same
rollout engine, sandbox and reward as ``retool train``, builds the datums
the step would train on, and reports what decides whether a run is worth
starting:

* does the model call the tool at all, and validly? A model that never calls
  it learns nothing about the tool from RL (ReTool starts from a cold-start
  SFT for this reason);
* how many groups score alike (all right or all wrong): they have zero
  advantage and train nothing;
* how tool calls go (success, timeouts, sandbox failures), how often turns and
  observations are cut and trajectories hit a budget;
* tokens per trajectory and the spend per step and per run, projected from
  the sample (:mod:`retool.training.cost`), in money when ``[cost]`` has
  prices, and how many steps ``cost.max_*`` allows.

The projection scales the sample to the run: the questions' first requests
(one per question) by ``questions_per_batch / questions``, everything else by
the number of trajectories. It is an estimate from a few questions; the run
records the real numbers per step.

The verdict is one line: ``GO: ...``, ``NO-GO: ...`` or ``SFT recommended:
...``; only ``GO`` is a success. :func:`assess` is pure (a rollout result in,
a report out); :func:`run_preflight` opens the backend, sandbox and data.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from retool.backends import open_sampling_client, service_client
from retool.config import RunConfig
from retool.data import load_dataset, take_batch
from retool.errors import ConfigError
from retool.reward import default_checker, load_reward_function
from retool.rollout import RolloutResult, StopReason, rollout_batch
from retool.sandbox import open_sandbox
from retool.training.cost import StepTokens, prefill_split, sampled_tokens, trained_tokens
from retool.training.datum import build_datum, build_training_datums, datum_loss_tokens
from retool.training.numerics import check_supported
from retool.training.run_dir import resolve_checkpoint
from retool.training.session import new_trainer, service_options
from retool.types import SamplingClient, ServiceClient

if TYPE_CHECKING:
    from retool.backends.local.service import LocalServiceClient
    from retool.rollout import ProgressCallback, Trajectory

BUDGET_STOPS = (
    StopReason.BUDGET_EXHAUSTED,
    StopReason.OBSERVATION_TOO_LONG,
    StopReason.PROMPT_TOO_LONG,
    StopReason.MAX_TURNS,
    StopReason.MAX_CODE_CALLS,
)


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


@dataclass(frozen=True)
class PreflightReport:
    """What a preflight rollout showed, and the verdict."""

    model: str  # the policy sampled (base model or --init-from)
    questions: int  # questions rolled out
    group_size: int  # trajectories per question in the sample
    trajectories: int  # questions x group_size
    excluded: int  # never sampled or failed by infrastructure (no reward)
    tool_attempts: int  # trajectories with at least one tool call, valid or malformed
    tool_users: int  # trajectories with at least one executed tool call
    valid_tool_call_rate: float  # executed calls / call attempts (valid + malformed)
    groups_all_correct: int  # groups whose included rewards are all +1: they train nothing
    groups_all_wrong: int  # groups whose included rewards are all equal and not correct
    groups_degenerate: int  # groups with no learning signal (also: < 2 included)
    sandbox_calls: int  # tool calls that ran (shared results included)
    sandbox_ok: int  # of those, exited 0 within limits
    sandbox_timeouts: int  # of those, killed at the time limit
    sandbox_failures: int  # trajectories ended by sandbox infrastructure failures
    turns: int  # assistant turns sampled
    truncated_turns: int  # turns cut by their max_tokens (sampler stop "length")
    truncated_observations: int  # observations cut to fit a budget
    stops: dict[str, int]  # trajectories per stop reason
    mean_trajectory_tokens: float  # prompt + everything generated, included trajectories
    max_trajectory_tokens: int  # longest trajectory
    mean_sampled_tokens: float  # sampled tokens per trajectory
    sample: StepTokens  # spend of this preflight rollout itself
    per_step: StepTokens  # projected spend of one training step
    steps: int  # train.steps
    currency: str  # cost.currency
    step_money: float | None  # projected money per step (None without prices)
    affordable_steps: int | None  # steps cost.max_* allows (None without a limit)
    warnings: list[str] = field(default_factory=list)  # things worth fixing, not blocking
    verdict: str = ""  # GO: ... | NO-GO: ... | SFT recommended: ...
    numerics: str = ""  # the sampler/trainer numerics and their measured mismatch, if known

    @property
    def go(self) -> bool:
        return self.verdict.startswith("GO")

    @property
    def per_run(self) -> StepTokens:
        return self.per_step.scaled(self.steps)

    def lines(self) -> list[str]:
        """The human report, verdict last."""
        n = self.trajectories
        calls = self.sandbox_calls
        stops = ", ".join(f"{k} {v}" for k, v in sorted(self.stops.items(), key=lambda kv: -kv[1]))
        budget = sum(self.stops.get(str(s), 0) for s in BUDGET_STOPS)
        out = [
            f"policy {self.model}: {self.questions} questions x {self.group_size} = {n} "
            "trajectories",
            f"tool use          {self.tool_attempts} of {n} trajectories tried a call, "
            f"{self.tool_users} ran one; valid tool-call rate {self.valid_tool_call_rate:.2f}",
            f"groups that train {self.questions - self.groups_degenerate} of {self.questions} "
            f"({self.groups_all_correct} all right, {self.groups_all_wrong} all wrong)",
            f"sandbox           {calls} calls: {_share(self.sandbox_ok, calls):.0%} ok, "
            f"{_share(self.sandbox_timeouts, calls):.0%} timeouts; "
            f"{self.sandbox_failures} infrastructure failures",
            f"truncation        {self.truncated_turns} of {self.turns} turns cut at max tokens, "
            f"{self.truncated_observations} observations cut",
            f"stops             {stops or 'none'}; budget stops {budget} of {n}",
            f"tokens            {self.mean_trajectory_tokens:.0f} per trajectory (max "
            f"{self.max_trajectory_tokens}), {self.mean_sampled_tokens:.0f} sampled",
            f"this preflight    {_tokens_text(self.sample)}",
            f"per step (proj.)  {_tokens_text(self.per_step)}{self._money(self.step_money)}",
            f"per run  (proj.)  {_tokens_text(self.per_run)}"
            f"{self._money(None if self.step_money is None else self.step_money * self.steps)}"
            f"  ({self.steps} steps)",
        ]
        if self.affordable_steps is not None:
            n_steps = self.affordable_steps
            plural = "s" if n_steps != 1 else ""
            out.append(f"budget            cost.max_* allow about {n_steps} step{plural}")
        if self.numerics:
            out.append(f"numerics          {self.numerics}")
        out += [f"warning: {w}" for w in self.warnings]
        out.append(self.verdict)
        return out

    def _money(self, value: float | None) -> str:
        return "" if value is None else f", {self.currency} {value:,.4f}"


def _tokens_text(tokens: StepTokens) -> str:
    return (
        f"{tokens.total:,} tokens (prefill {tokens.prefill:,}, sampled {tokens.sampled:,}, "
        f"trained {tokens.trained:,})"
    )


def project_step(
    result: RolloutResult, trained: int, questions_per_batch: int, group_size: int
) -> StepTokens:
    """One training step's spend, scaled from the sample (see the module docstring)."""
    first, later = prefill_split(result.trajectories)
    per_question = _share(questions_per_batch, result.num_questions)
    per_trajectory = _share(questions_per_batch * group_size, len(result.trajectories))
    return StepTokens(
        prefill=round(first * per_question + later * per_trajectory),
        sampled=round(sampled_tokens(result.trajectories) * per_trajectory),
        trained=round(trained * per_trajectory),
    )


def affordable_steps(per_step: StepTokens, config: RunConfig) -> int | None:
    """Steps ``cost.max_tokens`` / ``cost.max_money`` allow at the projected rate."""
    cost = config.cost
    limits = []
    if cost.max_tokens and per_step.total:
        limits.append(cost.max_tokens / per_step.total)
    if cost.max_money and per_step.money(cost):
        limits.append(cost.max_money / per_step.money(cost))
    return math.floor(min(limits)) if limits else None


def assess(
    result: RolloutResult,
    config: RunConfig,
    *,
    trained: int,
    model: str = "",
) -> PreflightReport:
    """The report of a preflight rollout; ``trained`` = input tokens of its datums.

    ``config`` is the run's: the projection scales to its ``questions_per_batch``
    and ``rollout.group_size`` whatever the sample's sizes were.
    """
    trajectories = result.trajectories
    included = result.included
    n = len(trajectories)
    turns = [turn for t in trajectories for turn in t.turns]
    observations = [o for t in trajectories for o in t.observations]
    attempts = sum(
        any(turn.parse_kind in ("tool", "invalid") for turn in t.turns) for t in included
    )
    users = sum(t.code_calls > 0 for t in included)
    call_attempts = sum(
        turn.parse_kind in ("tool", "invalid") for t in included for turn in t.turns
    )
    all_correct = all_wrong = 0
    for members in result.groups():
        kept = [t for t in members if not t.excluded]
        if len(kept) >= 2 and len({t.reward for t in kept}) == 1:
            if all(t.correct for t in kept):
                all_correct += 1
            else:
                all_wrong += 1
    stops = Counter(str(t.stop_reason) for t in trajectories)
    per_step = project_step(
        result, trained, config.train.questions_per_batch, config.rollout.group_size
    )
    sample = StepTokens(sum(prefill_split(trajectories)), sampled_tokens(trajectories), trained)
    report = PreflightReport(
        model=model,
        questions=result.num_questions,
        group_size=result.group_size,
        trajectories=n,
        excluded=n - len(included),
        tool_attempts=attempts,
        tool_users=users,
        valid_tool_call_rate=_share(sum(t.code_calls for t in included), call_attempts),
        groups_all_correct=all_correct,
        groups_all_wrong=all_wrong,
        groups_degenerate=result.degenerate_groups(),
        sandbox_calls=len(observations),
        sandbox_ok=sum(o.ok for o in observations),
        sandbox_timeouts=sum(o.error_kind == "timeout" for o in observations),
        sandbox_failures=stops.get(str(StopReason.SANDBOX_ERROR), 0),
        turns=len(turns),
        truncated_turns=sum(turn.sampler_stop == "length" for turn in turns),
        truncated_observations=sum(o.truncated for o in observations),
        stops=dict(stops),
        mean_trajectory_tokens=_share(sum(t.total_tokens for t in included), len(included)),
        max_trajectory_tokens=max((t.total_tokens for t in trajectories), default=0),
        mean_sampled_tokens=_share(sampled_tokens(included), len(included)),
        sample=sample,
        per_step=per_step,
        steps=config.train.steps,
        currency=config.cost.currency,
        step_money=per_step.money(config.cost) if config.cost.priced else None,
        affordable_steps=affordable_steps(per_step, config),
    )
    return replace(report, warnings=_warnings(report, config), verdict=_verdict(report))


def _warnings(r: PreflightReport, config: RunConfig) -> list[str]:
    out = []
    n = r.trajectories
    budget = sum(r.stops.get(str(s), 0) for s in BUDGET_STOPS)
    if n and budget / n > 0.25:
        out.append(
            f"{budget} of {n} trajectories ended on a budget (max_turns, max_code_calls, "
            "token budgets): consider raising the [rollout] limits"
        )
    if r.turns and r.truncated_turns / r.turns > 0.25:
        out.append(
            f"{r.truncated_turns} of {r.turns} turns were cut at rollout.max_assistant_tokens "
            f"({config.rollout.max_assistant_tokens})"
        )
    if r.sandbox_calls and r.sandbox_timeouts / r.sandbox_calls > 0.25:
        out.append(
            f"{r.sandbox_timeouts} of {r.sandbox_calls} tool calls timed out at "
            f"sandbox.timeout = {config.sandbox.timeout:g} s"
        )
    if r.excluded:
        out.append(f"{r.excluded} of {n} trajectories were excluded (sampler, sandbox, prompt)")
    if r.affordable_steps is not None and r.affordable_steps < r.steps:
        out.append(
            f"the budget in [cost] stops the run after about {r.affordable_steps} of "
            f"{r.steps} steps"
        )
    return out


def _verdict(r: PreflightReport) -> str:
    n, included = r.trajectories, r.trajectories - r.excluded
    if included == 0:
        return f"NO-GO: none of {n} trajectories could be scored (stops: {r.stops})"
    if r.sandbox_failures * 2 > n:
        return f"NO-GO: the sandbox failed {r.sandbox_failures} of {n} trajectories"
    if r.tool_attempts == 0:
        return f"SFT recommended: 0 of {n} trajectories called the tool"
    if r.tool_users == 0:
        return (
            f"SFT recommended: {r.tool_attempts} of {n} trajectories tried to call the tool "
            "but no call was valid"
        )
    if r.groups_degenerate == r.questions:
        return (
            f"NO-GO: every group scored alike ({r.groups_all_correct} all right, "
            f"{r.groups_all_wrong} all wrong): no step would train; choose questions of the "
            "right difficulty or a larger rollout.group_size"
        )
    money = "" if r.step_money is None else f", {r.currency} {r.step_money * r.steps:,.2f}"
    return (
        f"GO: {r.tool_users} of {n} trajectories ran the tool, "
        f"{r.questions - r.groups_degenerate} of {r.questions} groups train; about "
        f"{r.per_run.total:,} tokens{money} for {r.steps} steps"
    )


def open_policy(
    service: ServiceClient, config: RunConfig, init_from: str | None
) -> tuple[SamplingClient, str]:
    """The sampling client step 1 would use, and its name.

    Without ``--init-from`` it is the base model (a new LoRA adapter starts
    as the identity); with it, the checkpoint's weights, loaded as
    ``retool train --init-from`` loads them.
    """
    if not init_from:
        return open_sampling_client(service, config.model.base_model), config.model.base_model

    state = resolve_checkpoint(init_from)
    trainer = service.create_training_client_from_state(str(state))
    return trainer.save_weights_and_get_sampling_client(), str(state)


def run_preflight(
    config: RunConfig,
    *,
    questions: int = 4,
    group_size: int | None = None,
    init_from: str | None = None,
    progress: ProgressCallback | None = None,
) -> PreflightReport:
    """Roll out ``questions`` x ``group_size`` (default ``rollout.group_size``) and assess."""
    check_supported(config)
    if questions < 1:
        raise ConfigError(f"--questions must be >= 1, got {questions}")
    rollout_config = config.rollout
    if group_size is not None:
        if group_size < 2:
            raise ConfigError(
                f"--group-size must be >= 2 (a group of 1 never trains), got {group_size}"
            )
        rollout_config = replace(rollout_config, group_size=group_size)
    examples = load_dataset(config.data.train)
    batch = take_batch(examples, min(questions, len(examples)), 0, config.data.seed)
    scorer = load_reward_function(config.reward.function) if config.reward.function else None
    checker = None if scorer else default_checker(workers=config.reward.workers)
    with tempfile.TemporaryDirectory(prefix="retool-preflight-") as scratch:
        service = service_client(config.model, checkpoint_root=scratch, **service_options(config))
        sampler, model = open_policy(service, config, init_from)
        sandbox = None
        try:
            sandbox = open_sandbox(config.sandbox)
            result = rollout_batch(
                sampler,
                sampler.get_tokenizer(),
                sandbox,
                batch,
                rollout_config,
                step=1,
                progress=progress,
                checker=checker,
                scorer=scorer,
                reward_timeout=config.reward.timeout,
                context_limit=config.train.max_train_tokens,
            )
        finally:
            if sandbox is not None:
                sandbox.close()
            sampler.close()
        numerics = measure_mismatch(service, config, init_from, result.trajectories)
    datums = build_training_datums(result.trajectories, config.train.max_train_tokens)
    trained = trained_tokens(datums)
    return replace(assess(result, config, trained=trained, model=model), numerics=numerics)


def measure_mismatch(
    service: ServiceClient,
    config: RunConfig,
    init_from: str | None,
    trajectories: Sequence[Trajectory],
) -> str:
    """The chosen numerics and ``sampler_kl`` of the sample, from one trainer forward.

    Local backend only: the trainer step 1 would train (a new LoRA adapter is
    the base model; ``--init-from`` its weights) scores every sampled token.
    A remote service's forward would be a paid training client: the run
    records the mismatch instead (``train/sampler_kl``).
    """
    if config.model.backend != "local":
        return f"chosen by {config.model.backend}; the run logs train/sampler_kl per step"
    trainer = new_trainer(service, config, init_from)
    datums = []
    for index, trajectory in enumerate(trajectories):  # every sampled one, advantage or not
        if trajectory.excluded or not any(t.completion_tokens for t in trajectory.turns):
            continue
        item = build_datum(replace(trajectory, advantage=1.0), config.train.max_train_tokens, index)
        if datum_loss_tokens(item.datum):
            datums.append(item.datum)
    numerics = cast("LocalServiceClient", service).numerics  # backend = "local" here
    summary = numerics.summary() if numerics is not None else "?"
    if not datums:
        return f"{summary}; no sampled tokens to measure the mismatch on"
    total = clipped = tokens = 0.0
    train = config.train
    clip = {"clip_low_threshold": train.clip_low, "clip_high_threshold": train.clip_high}
    for start in range(0, len(datums), train.micro_batch_items):
        out = trainer.forward(datums[start : start + train.micro_batch_items], "ppo", clip).result()
        n = out.metrics["loss_tokens"]
        total += out.metrics["sampler_kl"] * n
        clipped += out.metrics["sampler_clip_fraction"] * n
        tokens += n
    return (
        f"{summary}; sampler_kl {total / tokens:+.2e} over {int(tokens)} sampled tokens, "
        f"{clipped / tokens:.1%} of them outside the clip range"
    )
