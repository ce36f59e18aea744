"""One ReTool step with the real model: sample, call the tool, score, update.

This is the whole data flow of ARCHITECTURE.md at demo scale, wired from the
library's pieces: a LoRA training client on SmolLM2, a frozen sampling
snapshot, ``group_size`` samples per question, tool calls parsed and executed
in the sandbox, observations appended token-exactly, a second turn sampled,
answers scored, advantages centred per question, one datum per trajectory
(only sampled tokens carry the advantage), one ``forward_backward`` and one
``optim_step``. The rollout scheduler and the training loop proper will
replace the two helpers here; until then ``retool demo`` runs this.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from retool.config import RunConfig
from retool.data.demo import DemoProblem
from retool.demo_pipeline import write_call
from retool.protocol import ParseKind, get_protocol
from retool.reward import score_many
from retool.sandbox import LocalSandbox, format_tool_content
from retool.types import AdamParams, Datum, ModelInput, SamplingParams, TensorData


@dataclass
class DemoTrajectory:
    """One sampled trajectory (at most two assistant turns)."""

    question: int  # index of its question in the batch
    prompts: list[list[int]] = field(default_factory=list)  # P_i of each turn
    completions: list[list[int]] = field(default_factory=list)  # C_i (sampler tokens)
    logprobs: list[list[float]] = field(default_factory=list)  # L_i (sampler logprobs)
    final_text: str = ""  # text scored by the reward
    tool_calls: int = 0  # observations appended
    reward: float = -1.0
    advantage: float = 0.0


@dataclass(frozen=True)
class StepReport:
    """What one demo step did."""

    trajectories: int
    tool_calls: int
    correct: int
    loss_tokens: int
    seconds: float
    metrics: dict[str, float]


def build_datum(trajectory: DemoTrajectory) -> Datum:
    """``P1 + C1 + D1 + C2`` shifted by one; only sampled tokens carry the advantage."""
    tokens: list[int] = []
    old: list[float] = []
    advantages: list[float] = []
    for prompt, completion, logprobs in zip(
        trajectory.prompts, trajectory.completions, trajectory.logprobs, strict=True
    ):
        if prompt[: len(tokens)] != tokens:
            raise ValueError("a later prompt does not extend the earlier tokens")
        delta = prompt[len(tokens) :]
        tokens += delta + completion
        old += [0.0] * len(delta) + logprobs
        advantages += [0.0] * len(delta) + [trajectory.advantage] * len(completion)
    return Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "logprobs": TensorData.from_list(old[1:]),
            "advantages": TensorData.from_list(advantages[1:]),
        },
    )


def demonstration(dialect: Any, tokenizer: Any, problem: DemoProblem, output: str) -> Datum:
    """A cold-start example: the reference call, its real output, the boxed answer.

    Only the two assistant turns carry weight 1; the prompt and the observation
    are context. Built with the same continuation as a rollout, so what the
    model learns to write is exactly what the sampler will be asked to produce.
    """
    messages = dialect.initial_messages(problem.question, tokenizer)
    prompt = dialect.render_prompt(tokenizer, messages)
    call = tokenizer.encode(write_call(dialect.name, problem.solution), add_special_tokens=False)
    follow = dialect.continuation(
        tokenizer, messages, prompt, call, dialect.tool_message("demo", output)
    )
    text = f"The result is {output.strip()}.\n\\boxed{{{output.strip()}}}"
    answer = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    tokens = follow + answer
    observation = len(follow) - len(prompt) - len(call)
    weights = [0.0] * len(prompt) + [1.0] * len(call) + [0.0] * observation + [1.0] * len(answer)
    return Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "weights": TensorData.from_list(weights[1:]),
        },
    )


def cold_start(
    trainer: Any,
    config: RunConfig,
    problems: Sequence[DemoProblem],
    steps: int,
    log: Callable[[str], None],
) -> None:
    """A few supervised steps on reference demonstrations (ReTool's cold start)."""
    dialect = get_protocol(config.rollout.protocol)
    tokenizer = trainer.get_tokenizer()
    with LocalSandbox(timeout=config.sandbox.timeout, max_workers=2) as sandbox:
        datums = [
            demonstration(dialect, tokenizer, p, format_tool_content(sandbox.run(p.solution)))
            for p in problems
        ]
    for step in range(steps):
        out = trainer.forward_backward(datums, "cross_entropy").result()
        trainer.optim_step(AdamParams(learning_rate=2e-3, grad_clip_norm=1.0)).result()
        tokens = out.metrics["loss_tokens"]
        log(
            f"[cold-start] step {step + 1}/{steps}: {len(datums)} demonstrations, "
            f"mean NLL {out.metrics['loss:sum'] / tokens:.3f} over {tokens:.0f} assistant tokens"
        )


def model_step(
    config: RunConfig,
    problems: Sequence[DemoProblem],
    group_size: int = 4,
    demonstrations: Sequence[DemoProblem] = (),
    cold_start_steps: int = 0,
    log: Callable[[str], None] = print,
) -> StepReport:
    from retool.backends.local import LocalServiceClient

    started = time.monotonic()
    dialect = get_protocol(config.rollout.protocol)
    service = LocalServiceClient(checkpoint_root=f"{config.train.run_dir}/checkpoints")
    trainer = service.create_lora_training_client(
        config.model.base_model, rank=config.model.lora_rank or 8, seed=0
    )
    tokenizer = trainer.get_tokenizer()
    if demonstrations and cold_start_steps:
        cold_start(trainer, config, demonstrations, cold_start_steps, log)
    sampler = trainer.save_weights_and_get_sampling_client()
    stop = dialect.stop_sequences(tokenizer)
    log(
        f"[model] {config.model.base_model} with a rank-{config.model.lora_rank or 8} LoRA "
        f"adapter; sampling {len(problems)} questions x {group_size}"
    )
    trajectories: list[DemoTrajectory] = []
    messages_by_question = []
    futures = []
    for index, problem in enumerate(problems):
        messages = dialect.initial_messages(problem.question, tokenizer)
        messages_by_question.append(messages)
        prompt = dialect.render_prompt(tokenizer, messages)
        params = SamplingParams(
            max_tokens=96,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            seed=config.rollout.seed + index,
            stop=stop,
        )
        futures.append(
            (index, prompt, sampler.sample(ModelInput.from_ints(prompt), group_size, params))
        )
    with LocalSandbox(
        timeout=config.sandbox.timeout,
        memory_mb=config.sandbox.memory_mb,
        max_workers=2,
        isolation=config.sandbox.isolation,
    ) as sandbox:
        second = []
        for index, prompt, future in futures:
            for sequence in future.result().sequences:
                trajectory = DemoTrajectory(
                    index, [prompt], [list(sequence.tokens)], [list(sequence.logprobs)]
                )
                trajectories.append(trajectory)
                parsed = dialect.parse(sequence.text or "")
                trajectory.final_text = sequence.text or ""
                if parsed.kind != ParseKind.TOOL or parsed.code is None:
                    continue
                result = sandbox.run(parsed.code)
                observation = format_tool_content(result, config.sandbox.timeout)
                follow = dialect.continuation(
                    tokenizer,
                    messages_by_question[index],
                    prompt,
                    list(sequence.tokens),
                    dialect.tool_message(f"code-{index}-{len(trajectories)}-1", observation[-800:]),
                )
                trajectory.tool_calls = 1
                params = SamplingParams(
                    max_tokens=64,
                    temperature=config.rollout.temperature,
                    seed=config.rollout.seed + 10_000 + len(trajectories),
                    stop=stop,
                )
                second.append(
                    (trajectory, follow, sampler.sample(ModelInput.from_ints(follow), 1, params))
                )
        for trajectory, follow, future in second:
            sequence = future.result().sequences[0]
            trajectory.prompts.append(follow)
            trajectory.completions.append(list(sequence.tokens))
            trajectory.logprobs.append(list(sequence.logprobs))
            trajectory.final_text = sequence.text or ""
        window = sandbox.stats.snapshot_and_reset()
    sampler.close()
    results = score_many(
        [t.final_text for t in trajectories],
        [str(problems[t.question].answer) for t in trajectories],
        timeout=config.reward.timeout,
    )
    for trajectory, result in zip(trajectories, results, strict=True):
        trajectory.reward = result.reward
    for index in range(len(problems)):
        group = [t for t in trajectories if t.question == index]
        mean = sum(t.reward for t in group) / len(group)
        for t in group:
            t.advantage = t.reward - mean
    calls = sum(t.tool_calls for t in trajectories)
    correct = sum(r.correct for r in results)
    log(
        f"[rollout] {len(trajectories)} trajectories, {calls} tool calls "
        f"(sandbox p50 {window['latency_p50_s'] * 1000:.0f} ms), {correct} correct; "
        f"prefix cache reused {sampler.prefix_stats().tokens_reused} prompt tokens"
    )
    sample = trajectories[0]
    log(f"[sample] {tokenizer.decode(sample.completions[0])[:160]!r}")
    useful = [t for t in trajectories if t.advantage != 0]
    metrics: dict[str, float] = {}
    loss_tokens = 0
    if useful:
        # Sum-reduced loss: scale by 1/N so the update is the mean over trajectories.
        datums = [build_datum(t) for t in useful]
        scale = 1.0 / len(trajectories)
        datums = [
            Datum(
                d.model_input,
                {
                    **d.loss_fn_inputs,
                    "advantages": TensorData.from_numpy(
                        d.loss_fn_inputs["advantages"].to_numpy() * scale
                    ),
                },
            )
            for d in datums
        ]
        out = trainer.forward_backward(datums, "ppo").result()
        step = trainer.optim_step(
            AdamParams(learning_rate=config.train.learning_rate, grad_clip_norm=1.0)
        ).result()
        metrics = {**out.metrics, **step.metrics}
        loss_tokens = int(out.metrics["loss_tokens"])
        log(
            f"[train] {len(datums)} datums with non-zero advantage, {loss_tokens} loss tokens; "
            f"ppo loss {out.metrics['loss:sum']:+.4f}, clip fraction "
            f"{out.metrics['clip_fraction']:.2f}, grad norm {step.metrics['grad_norm']:.4f}"
        )
    else:
        log("[train] every group scored the same: no advantage, update skipped")
    return StepReport(
        len(trajectories), calls, correct, loss_tokens, time.monotonic() - started, metrics
    )
